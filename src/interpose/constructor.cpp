// The constructor of libactpage.so, alone in an archive of its own that CMake links after every
// other part of the library.
//
// Why: a shared library's initialisers run in link order, object by object, and a constructor
// function runs where its object file sits. The policy loader (and whatever else step 1 touches) may
// use namespace-scope objects with dynamic initialisation; linked first, this constructor would run
// before them and see them empty (seen: the policy's "did you mean" list for rule keys). Linked last,
// every static object of the library is initialised before it runs. The anchor below is what the
// link pulls this object out of its archive by (-Wl,--undefined=actpage_constructor_anchor).
#include "interpose/runtime.hpp"

extern "C" __attribute__((visibility("hidden"))) const int actpage_constructor_anchor = 1;

namespace {

__attribute__((constructor)) void run_library_constructor() { actpage::interpose::on_library_load(); }

}  // namespace
