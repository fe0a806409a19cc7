// actpage_hooks._fastsaved: the saved-tensor hooks' pack and unpack (python/actpage_hooks/_saved.py)
// in C.
//
// Why: they run for every tensor autograd saves. In Python (a bound method's frame, a lambda's frame
// for the storage address, a ctypes call that converts its argument and drops and retakes the GIL)
// they cost the job's thread ~15 us a saved tensor on the H100 machine (docs/gpu-results.md: a chain
// of 4,000 small multiplies, 28.0 against 12.7 us an op), and they are meant to be on in every job.
// Here a pack is a few attribute lookups and method calls made from C, no Python frame, and a direct
// call of the library's function.
//
// Hooks(saved, unpacking, wait, current_stream, warn, storage="untyped_storage", keep=None, held=None)
// holds what SavedTensorHooks holds; its methods pack and unpack are the hooks torch is given:
//   pack(tensor)    -> (tensor.detach(), tensor._version, ours), where ours is, for a tensor whose
//                      is_cuda is true, bool(saved(tensor.<storage>().data_ptr())), else False.
//                      saved answers 0 (not the library's), 1 (the library's) or 2 (the library's,
//                      and its release point waits until no tensor but autograd's saved copies
//                      holds the storage: a pack outside any layer, e.g. the inputs non-reentrant
//                      checkpointing saves in the parent module). On 2 (exactly: the int, or the
//                      C function's value), held(tensor, detached, address) is called when held is
//                      not None, detached being the tensor of the returned tuple (_saved.py's
//                      UnreferencedWatch, which tells the library once the job dropped the rest);
//   unpack(packed)  -> the detached tensor, after checking its version (the RuntimeError autograd
//                      raises without hooks, same text as _saved.py's) and, when ours, calling
//                      unpacking(address) and, when that answers nonzero,
//                      wait(address, current_stream(tensor.device.index)).
// saved, unpacking and wait are either three integers, the addresses of the library's C functions
// (include/actpage/c_api.h: int(unsigned long long), int(unsigned long long),
// void(unsigned long long, unsigned long long)), or three Python callables (tests, any other sink).
// An Exception raised by the sink, the storage lookup, held or current_stream is given to
// warn(key, exception) ("saved-pack" / "saved-unpack": _saved.py prints it once) and the tensor
// goes through untouched (a pack whose held raised still returns its tuple); what warn raises is
// dropped. `keep` is held for the object's lifetime (the ctypes objects behind the addresses).
//
// The GIL: saved and unpacking are called holding it, as the library's interposed CUDA calls already
// are (torch calls cudaMalloc and the launches holding it): they take the engine's lock, and where
// they wait (a job turn, pages brought back for a pack in backward), they wait for the library's own
// threads, which never take the GIL. wait releases it: it blocks until a reload is issued, and other
// Python threads should run meanwhile (ctypes released it for every call; dropping and retaking it
// costs a thread switch whenever another thread wants it).
//
// Built against the stable ABI (abi3, Python >= 3.10), like _fastrange: one shared object for every
// Python the job may run.

#define PY_SSIZE_T_CLEAN
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030A0000
#endif
#include <Python.h>

namespace {

using SavedFunction = int (*)(unsigned long long);
using UnpackingFunction = int (*)(unsigned long long);
using WaitFunction = void (*)(unsigned long long, unsigned long long);

// saved's answers: not the library's, the library's, the library's with a release point that waits
// for the storage to be unreferenced (held is told).
constexpr int kNotOurs = 0;
constexpr int kOurs = 1;
constexpr int kOursHeld = 2;

// Interned attribute names, made once at import.
struct Names {
  PyObject* is_cuda = nullptr;
  PyObject* detach = nullptr;
  PyObject* version = nullptr;  // "_version"
  PyObject* data_ptr = nullptr;
  PyObject* device = nullptr;
  PyObject* index = nullptr;
  PyObject* type = nullptr;
  PyObject* shape = nullptr;
  PyObject* pack_key = nullptr;    // "saved-pack"
  PyObject* unpack_key = nullptr;  // "saved-unpack"
};

Names g_names;

struct Hooks {
  PyObject_HEAD
  // Native: the library's functions, called directly. Else the Python callables below.
  SavedFunction saved_function;
  UnpackingFunction unpacking_function;
  WaitFunction wait_function;
  PyObject* saved;
  PyObject* unpacking;
  PyObject* wait;
  PyObject* current_stream;  // callable(device index) -> raw stream handle
  PyObject* warn;            // callable(key, exception)
  PyObject* storage;         // str: "untyped_storage" (torch >= 2.0) or "storage"
  PyObject* keep;
  PyObject* held;  // callable(tensor, detached, address) for the packs answered kOursHeld, or nullptr
  unsigned long long saved_count;
  unsigned long long waits;
};

// An Exception pending: handed to warn() and cleared (true). Anything else (KeyboardInterrupt,
// SystemExit) stays pending for the caller to raise (false), as `except Exception` would leave it.
bool report(Hooks* self, PyObject* key) {
  if (!PyErr_ExceptionMatches(PyExc_Exception)) return false;
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  PyObject* result = value != nullptr ? PyObject_CallFunctionObjArgs(self->warn, key, value, nullptr) : nullptr;
  Py_XDECREF(result);
  PyErr_Clear();  // a failing warn() must not reach the job either
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
  return true;
}

// tensor.<storage>().data_ptr() into *address; false with an exception set on failure.
bool storage_address(Hooks* self, PyObject* tensor, unsigned long long* address) {
  PyObject* storage = PyObject_CallMethodObjArgs(tensor, self->storage, nullptr);
  if (storage == nullptr) return false;
  PyObject* pointer = PyObject_CallMethodObjArgs(storage, g_names.data_ptr, nullptr);
  Py_DECREF(storage);
  if (pointer == nullptr) return false;
  *address = PyLong_AsUnsignedLongLong(pointer);
  Py_DECREF(pointer);
  return !(*address == static_cast<unsigned long long>(-1) && PyErr_Occurred() != nullptr);
}

// saved's answer as one of kNotOurs, kOurs, kOursHeld: 2 exactly is kOursHeld, any other value
// counts by its truth (as before the third answer existed).
int saved_answer(int value) { return value == kOursHeld ? kOursHeld : (value != 0 ? kOurs : kNotOurs); }

// The answer of a sink's Python function given an address: kOursHeld for an int equal to 2 (saved's
// third answer; True is an int too, but 1), else its truth (1 or 0), or -1 with an exception set.
int ask(PyObject* function, unsigned long long address) {
  PyObject* argument = PyLong_FromUnsignedLongLong(address);
  if (argument == nullptr) return -1;
  PyObject* answer = PyObject_CallFunctionObjArgs(function, argument, nullptr);
  Py_DECREF(argument);
  if (answer == nullptr) return -1;
  int overflow = 0;
  const long value = PyLong_Check(answer) ? PyLong_AsLongAndOverflow(answer, &overflow) : 0;
  const int truth = overflow == 0 && value == kOursHeld ? kOursHeld : PyObject_IsTrue(answer);
  Py_DECREF(answer);
  return truth;
}

// The library's answer for a saved CUDA tensor (kNotOurs, kOurs or kOursHeld, its storage's address
// in *address), kNotOurs for a host tensor, or -1 with an exception set.
int tell_saved(Hooks* self, PyObject* tensor, unsigned long long* address) {
  PyObject* is_cuda = PyObject_GetAttr(tensor, g_names.is_cuda);
  if (is_cuda == nullptr) return -1;
  const int cuda = PyObject_IsTrue(is_cuda);
  Py_DECREF(is_cuda);
  if (cuda <= 0) return cuda;  // a host tensor: nothing to tell
  if (!storage_address(self, tensor, address)) return -1;
  const int ours = self->saved_function != nullptr ? saved_answer(self->saved_function(*address))
                                                   : ask(self->saved, *address);
  if (ours >= 0) ++self->saved_count;
  return ours;
}

// held(tensor, detached, address). false when it raised something that is not an Exception (left
// pending for the caller to raise); an Exception goes to warn().
bool tell_held(Hooks* self, PyObject* tensor, PyObject* detached, unsigned long long address) {
  PyObject* argument = PyLong_FromUnsignedLongLong(address);
  PyObject* result =
      argument != nullptr ? PyObject_CallFunctionObjArgs(self->held, tensor, detached, argument, nullptr) : nullptr;
  Py_XDECREF(argument);
  if (result != nullptr) {
    Py_DECREF(result);
    return true;
  }
  return report(self, g_names.pack_key);
}

PyObject* pack(PyObject* object, PyObject* tensor) {
  auto* self = reinterpret_cast<Hooks*>(object);
  unsigned long long address = 0;
  int ours = tell_saved(self, tensor, &address);
  if (ours < 0) {
    if (!report(self, g_names.pack_key)) return nullptr;
    ours = kNotOurs;
  }
  // Never the tensor itself (see _saved.py: an output saved by its own grad_fn would hold itself).
  PyObject* detached = PyObject_CallMethodObjArgs(tensor, g_names.detach, nullptr);
  if (detached == nullptr) return nullptr;
  PyObject* version = PyObject_GetAttr(tensor, g_names.version);
  if (version == nullptr) {
    Py_DECREF(detached);
    return nullptr;
  }
  PyObject* packed = PyTuple_Pack(3, detached, version, ours != kNotOurs ? Py_True : Py_False);
  Py_DECREF(version);
  // Told once the tuple exists: held may keep a weak reference to `detached`, the saved copy.
  if (packed != nullptr && ours == kOursHeld && self->held != nullptr && !tell_held(self, tensor, detached, address)) {
    Py_CLEAR(packed);  // an interrupt: raised, as `except Exception` would leave it
  }
  Py_DECREF(detached);
  return packed;
}

// The RuntimeError autograd raises without hooks, in _saved.py's words.
void raise_modified(PyObject* tensor, PyObject* current, PyObject* expected) {
  PyObject* type_name = PyObject_CallMethodObjArgs(tensor, g_names.type, nullptr);
  PyObject* shape = type_name != nullptr ? PyObject_GetAttr(tensor, g_names.shape) : nullptr;
  PyObject* dimensions = shape != nullptr ? PySequence_List(shape) : nullptr;
  if (dimensions != nullptr) {
    PyErr_Format(PyExc_RuntimeError,
                 "one of the variables needed for gradient computation has been modified by an inplace "
                 "operation: [%S %S] is at version %S; expected version %S instead (checked by actpage's "
                 "saved-tensor hooks, as autograd checks it without hooks)",
                 type_name, dimensions, current, expected);
  }
  Py_XDECREF(dimensions);
  Py_XDECREF(shape);
  Py_XDECREF(type_name);
}

// For a tensor the library serves: whether backward must wait for it, and the wait. false with an
// exception set on failure.
bool before_read(Hooks* self, PyObject* tensor) {
  unsigned long long address = 0;
  if (!storage_address(self, tensor, &address)) return false;
  const int not_back = self->unpacking_function != nullptr ? (self->unpacking_function(address) != 0 ? 1 : 0)
                                                           : ask(self->unpacking, address);
  if (not_back <= 0) return not_back == 0;
  PyObject* device = PyObject_GetAttr(tensor, g_names.device);
  PyObject* index = device != nullptr ? PyObject_GetAttr(device, g_names.index) : nullptr;
  Py_XDECREF(device);
  PyObject* stream = index != nullptr ? PyObject_CallFunctionObjArgs(self->current_stream, index, nullptr) : nullptr;
  Py_XDECREF(index);
  if (stream == nullptr) return false;
  if (self->wait_function != nullptr) {
    const unsigned long long handle = PyLong_AsUnsignedLongLong(stream);
    Py_DECREF(stream);
    if (handle == static_cast<unsigned long long>(-1) && PyErr_Occurred() != nullptr) return false;
    PyThreadState* state = PyEval_SaveThread();  // it blocks until the reload is issued: see the top
    self->wait_function(address, handle);
    PyEval_RestoreThread(state);
  } else {
    PyObject* argument = PyLong_FromUnsignedLongLong(address);
    PyObject* result = argument != nullptr ? PyObject_CallFunctionObjArgs(self->wait, argument, stream, nullptr)
                                           : nullptr;
    Py_XDECREF(argument);
    Py_DECREF(stream);
    if (result == nullptr) return false;
    Py_DECREF(result);
  }
  ++self->waits;
  return true;
}

PyObject* unpack(PyObject* object, PyObject* packed) {
  auto* self = reinterpret_cast<Hooks*>(object);
  if (!PyTuple_Check(packed) || PyTuple_Size(packed) != 3) {
    PyErr_SetString(PyExc_ValueError, "actpage saved-tensor unpack: expected (tensor, version, ours)");
    return nullptr;
  }
  PyObject* tensor = PyTuple_GetItem(packed, 0);  // borrowed: `packed` holds them
  PyObject* expected = PyTuple_GetItem(packed, 1);
  PyObject* ours = PyTuple_GetItem(packed, 2);
  PyObject* current = PyObject_GetAttr(tensor, g_names.version);
  if (current == nullptr) return nullptr;
  const int changed = PyObject_RichCompareBool(current, expected, Py_NE);
  if (changed != 0) {
    if (changed > 0) raise_modified(tensor, current, expected);
    Py_DECREF(current);
    return nullptr;
  }
  Py_DECREF(current);
  // A tensor the library does not serve is none of its business: no call.
  const int serve = PyObject_IsTrue(ours);
  if ((serve < 0 || (serve > 0 && !before_read(self, tensor))) && !report(self, g_names.unpack_key)) return nullptr;
  Py_INCREF(tensor);
  return tensor;
}

PyObject* counters(PyObject* object, PyObject* /*unused*/) {
  auto* self = reinterpret_cast<Hooks*>(object);
  return Py_BuildValue("(KK)", self->saved_count, self->waits);
}

PyObject* native(PyObject* object, PyObject* /*unused*/) {
  return PyBool_FromLong(reinterpret_cast<Hooks*>(object)->saved_function != nullptr ? 1 : 0);
}

// A C function address from an int argument; false with an exception set when it is not one.
bool function_address(PyObject* value, void** address) {
  *address = PyLong_AsVoidPtr(value);
  if (*address == nullptr && PyErr_Occurred() == nullptr) {
    PyErr_SetString(PyExc_ValueError, "Hooks(): a function address is 0");
  }
  return *address != nullptr;
}

int traverse(PyObject* object, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<Hooks*>(object);
  Py_VISIT(self->saved);
  Py_VISIT(self->unpacking);
  Py_VISIT(self->wait);
  Py_VISIT(self->current_stream);
  Py_VISIT(self->warn);
  Py_VISIT(self->storage);
  Py_VISIT(self->keep);
  Py_VISIT(self->held);
  // A heap type's instances hold their type (3.9+ expects traverse to say so).
  Py_VISIT(reinterpret_cast<PyObject*>(Py_TYPE(object)));
  return 0;
}

int clear(PyObject* object) {
  auto* self = reinterpret_cast<Hooks*>(object);
  Py_CLEAR(self->saved);
  Py_CLEAR(self->unpacking);
  Py_CLEAR(self->wait);
  Py_CLEAR(self->current_stream);
  Py_CLEAR(self->warn);
  Py_CLEAR(self->storage);
  Py_CLEAR(self->keep);
  Py_CLEAR(self->held);
  return 0;
}

void dealloc(PyObject* object) {
  PyTypeObject* type = Py_TYPE(object);
  PyObject_GC_UnTrack(object);
  clear(object);
  reinterpret_cast<freefunc>(PyType_GetSlot(type, Py_tp_free))(object);
  Py_DECREF(reinterpret_cast<PyObject*>(type));
}

PyObject* create(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* keywords[] = {"saved", "unpacking", "wait", "current_stream", "warn", "storage", "keep", "held",
                                   nullptr};
  PyObject* saved = nullptr;
  PyObject* unpacking = nullptr;
  PyObject* wait = nullptr;
  PyObject* current_stream = nullptr;
  PyObject* warn = nullptr;
  PyObject* storage = nullptr;
  PyObject* keep = Py_None;
  PyObject* held = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO|UOO:Hooks", const_cast<char**>(keywords), &saved, &unpacking,
                                   &wait, &current_stream, &warn, &storage, &keep, &held)) {
    return nullptr;
  }
  if (!PyCallable_Check(current_stream) || !PyCallable_Check(warn)) {
    PyErr_SetString(PyExc_TypeError, "Hooks(): current_stream and warn must be callable");
    return nullptr;
  }
  if (held != Py_None && !PyCallable_Check(held)) {
    PyErr_SetString(PyExc_TypeError, "Hooks(): held must be callable or None");
    return nullptr;
  }
  const bool native = PyLong_Check(saved) && PyLong_Check(unpacking) && PyLong_Check(wait);
  if (!native && !(PyCallable_Check(saved) && PyCallable_Check(unpacking) && PyCallable_Check(wait))) {
    PyErr_SetString(PyExc_TypeError, "Hooks(): saved, unpacking and wait must be three function addresses or three callables");
    return nullptr;
  }
  void* addresses[3] = {nullptr, nullptr, nullptr};
  if (native && !(function_address(saved, &addresses[0]) && function_address(unpacking, &addresses[1]) &&
                  function_address(wait, &addresses[2]))) {
    return nullptr;
  }
  PyObject* object = reinterpret_cast<allocfunc>(PyType_GetSlot(type, Py_tp_alloc))(type, 0);  // zeroed
  if (object == nullptr) return nullptr;
  auto* self = reinterpret_cast<Hooks*>(object);
  if (native) {
    // Object pointers to function pointers: what dlsym's callers do; POSIX guarantees it.
    self->saved_function = reinterpret_cast<SavedFunction>(addresses[0]);
    self->unpacking_function = reinterpret_cast<UnpackingFunction>(addresses[1]);
    self->wait_function = reinterpret_cast<WaitFunction>(addresses[2]);
  } else {
    Py_INCREF(saved);
    self->saved = saved;
    Py_INCREF(unpacking);
    self->unpacking = unpacking;
    Py_INCREF(wait);
    self->wait = wait;
  }
  Py_INCREF(current_stream);
  self->current_stream = current_stream;
  Py_INCREF(warn);
  self->warn = warn;
  self->storage = storage != nullptr ? storage : PyUnicode_InternFromString("untyped_storage");
  if (storage != nullptr) Py_INCREF(storage);
  Py_INCREF(keep);
  self->keep = keep;
  if (held != Py_None) {
    Py_INCREF(held);
    self->held = held;
  }
  if (self->storage == nullptr) {
    Py_DECREF(object);
    return nullptr;
  }
  return object;
}

// Do-nothing library functions (saved answers 1: every unpack asks; unpacking answers 0: no wait),
// so that a benchmark times the hooks themselves, both paths calling the same C functions.
int stub_saved(unsigned long long /*address*/) { return 1; }
int stub_unpacking(unsigned long long /*address*/) { return 0; }
void stub_wait(unsigned long long /*address*/, unsigned long long /*stream*/) {}

PyObject* stub_functions(PyObject* /*module*/, PyObject* /*unused*/) {
  return Py_BuildValue("(NNN)", PyLong_FromVoidPtr(reinterpret_cast<void*>(stub_saved)),
                       PyLong_FromVoidPtr(reinterpret_cast<void*>(stub_unpacking)),
                       PyLong_FromVoidPtr(reinterpret_cast<void*>(stub_wait)));
}

PyMethodDef g_hooks_methods[] = {
    {"pack", pack, METH_O, "pack(tensor) -> (tensor.detach(), tensor._version, ours)"},
    {"unpack", unpack, METH_O, "unpack((tensor, version, ours)) -> tensor, after the version check and the wait"},
    {"counters", counters, METH_NOARGS, "counters() -> (CUDA tensors told to the sink, waits)"},
    {"native", native, METH_NOARGS, "native() -> whether the sink is C functions"},
    {nullptr, nullptr, 0, nullptr},
};

PyType_Slot g_hooks_slots[] = {
    {Py_tp_doc, const_cast<char*>("The saved-tensor hooks in C (see the module doc).")},
    {Py_tp_new, reinterpret_cast<void*>(create)},
    {Py_tp_dealloc, reinterpret_cast<void*>(dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(clear)},
    {Py_tp_methods, g_hooks_methods},
    {0, nullptr},
};

PyType_Spec g_hooks_spec = {
    "actpage_hooks._fastsaved.Hooks",
    static_cast<int>(sizeof(Hooks)),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    g_hooks_slots,
};

PyMethodDef g_methods[] = {
    {"stub_functions", stub_functions, METH_NOARGS,
     "stub_functions() -> addresses of do-nothing saved, unpacking and wait (benchmarks)"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef g_module = {
    PyModuleDef_HEAD_INIT,
    "actpage_hooks._fastsaved",
    "The saved-tensor hooks' pack and unpack in C (python/ext/fastsaved.cpp).",
    -1,
    g_methods,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};

bool intern(PyObject*& slot, const char* text) {
  slot = PyUnicode_InternFromString(text);
  return slot != nullptr;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) PyObject* PyInit__fastsaved() {
  if (!(intern(g_names.is_cuda, "is_cuda") && intern(g_names.detach, "detach") && intern(g_names.version, "_version") &&
        intern(g_names.data_ptr, "data_ptr") && intern(g_names.device, "device") && intern(g_names.index, "index") &&
        intern(g_names.type, "type") && intern(g_names.shape, "shape") && intern(g_names.pack_key, "saved-pack") &&
        intern(g_names.unpack_key, "saved-unpack"))) {
    return nullptr;
  }
  PyObject* module = PyModule_Create(&g_module);
  if (module == nullptr) return nullptr;
  PyObject* type = PyType_FromSpec(&g_hooks_spec);
  if (type == nullptr || PyModule_AddObject(module, "Hooks", type) < 0) {
    Py_XDECREF(type);
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
