// The C API of include/actpage/c_api.h, for the Python hook package (ctypes) and tests.
#include "actpage/c_api.h"

#include "engine/forward_pass.hpp"
#include "interpose/runtime.hpp"
#include "trace/writer.hpp"

#define ACTPAGE_EXPORT extern "C" __attribute__((visibility("default")))

ACTPAGE_EXPORT int actpage_api_version(void) { return 1; }
ACTPAGE_EXPORT int actpage_is_active(void) { return actpage::interpose::ensure_active() ? 1 : 0; }
ACTPAGE_EXPORT int actpage_python_hooks_mode(void) { return actpage::interpose::python_hooks_mode(); }
ACTPAGE_EXPORT int actpage_python_hooks_scope(void) { return actpage::interpose::python_hooks_scope(); }
ACTPAGE_EXPORT int actpage_python_hooks_backward(void) { return actpage::interpose::python_hooks_backward(); }
ACTPAGE_EXPORT int actpage_python_hooks_call(void) { return actpage::interpose::python_hooks_call(); }
ACTPAGE_EXPORT int actpage_module_rule_matches(const char* name) { return actpage::interpose::module_rule_matches(name); }
ACTPAGE_EXPORT void actpage_flush_trace(void) { actpage::interpose::flush_trace(); }
ACTPAGE_EXPORT unsigned long long actpage_begin_forward_pass(void) { return actpage::engine::forward_pass::begin(); }
ACTPAGE_EXPORT void actpage_set_backward_pass(unsigned long long id) { actpage::engine::forward_pass::set_backward(id); }
ACTPAGE_EXPORT int actpage_set_recording(int on) { return actpage::trace::set_recording(on != 0) ? 1 : 0; }
ACTPAGE_EXPORT int actpage_saved_tensor_hooks_installed(void) { return actpage::interpose::saved_tensor_hooks_installed(); }
ACTPAGE_EXPORT int actpage_saved_tensor_hooks_wanted(void) { return actpage::interpose::saved_tensor_hooks_wanted(); }
ACTPAGE_EXPORT int actpage_tensor_saved(unsigned long long address) { return actpage::interpose::tensor_saved(address); }
ACTPAGE_EXPORT void actpage_tensor_unreferenced(unsigned long long address) { actpage::interpose::tensor_unreferenced(address); }
ACTPAGE_EXPORT int actpage_tensor_unpacking(unsigned long long address) { return actpage::interpose::tensor_unpacking(address); }
ACTPAGE_EXPORT void actpage_tensor_wait(unsigned long long address, unsigned long long stream) { actpage::interpose::tensor_wait(address, stream); }
