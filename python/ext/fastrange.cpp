// actpage_hooks._fastrange: a hooked module's forward entered without a Python frame.
//
// Why: on the H100 machine (a 2.1 GHz VM, Python 3.12) every Python frame added to a module call
// cost ~10 us amid torch's own work, so the forward wrappers of _hooks.py cost about half of what
// they did even when they did nothing (docs/findings.md, section 6). This module holds the one
// C function that _hooks.py binds to a hooked module as its forward (types.MethodType(forward,
// module)): it pushes the module's NVTX range, calls the class's forward and pops the range, all in C.
//
// Contract of forward(module, *args, **kwargs):
//   - while enabled (set_enabled(True)), and the module's __dict__ holds its range name (a str
//     under the name key given to configure()) and does not mark its backward (the mark key is not
//     True): nvtxRangePushA(name), type(module).forward(module, *args, **kwargs), nvtxRangePop(),
//     the pop happening whether the forward returned or raised;
//   - otherwise: the fallback given to configure(), called with the same arguments (the Python
//     wrapper, which decides, marks backward passes and handles custom range functions).
// It holds the GIL throughout; the enabled flag and the fallback are process-wide (one installed
// ModuleHooks per process uses them).
//
// The ranges go through NVTX, like torch.cuda.nvtx.range_push: the injection library (libactpage.so
// under `actpage run`, or a profiler) receives them. This shared object carries NVTX's header-only
// loader; it finds the injection from NVTX_INJECTION64_PATH, whose InitializeInjectionNvtx2 is
// idempotent.
//
// torch.compile cannot trace into a C function; _hooks.py registers a Python stand-in for it with
// torch.compiler.substitute_in_graph, which calls the class's forward without a range (what the
// Python wrapper does while compiling).
//
// Built against the stable ABI (abi3, Python >= 3.10): one shared object serves every Python the
// job may run.

#define PY_SSIZE_T_CLEAN
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030A0000
#endif
#include <Python.h>

#include <nvtx3/nvToolsExt.h>

namespace {

struct State {
  bool enabled = false;
  PyObject* fallback = nullptr;   // callable(module, *args, **kwargs)
  PyObject* name_key = nullptr;   // str: the key of the module's range name in its __dict__
  PyObject* mark_key = nullptr;   // str: the key of its marks-backward flag
  PyObject* forward_name = nullptr;  // "forward"
  unsigned long long fast_calls = 0;
  unsigned long long fallback_calls = 0;
};

State g_state;

PyObject* call_fallback(PyObject* args, PyObject* kwargs) {
  ++g_state.fallback_calls;
  if (g_state.fallback == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "actpage_hooks._fastrange.forward called before configure()");
    return nullptr;
  }
  return PyObject_Call(g_state.fallback, args, kwargs);
}

// The module's range name when the fast path applies to it (borrowed from its __dict__, which the
// caller keeps alive), else nullptr with no error set.
PyObject* fast_name(PyObject* attributes) {
  PyObject* name = PyDict_GetItemWithError(attributes, g_state.name_key);
  if (name == nullptr || !PyUnicode_Check(name)) return nullptr;
  PyObject* marks = PyDict_GetItemWithError(attributes, g_state.mark_key);
  if (marks == Py_True) return nullptr;
  return PyErr_Occurred() != nullptr ? nullptr : name;
}

PyObject* forward(PyObject* /*self*/, PyObject* args, PyObject* kwargs) {
  if (!g_state.enabled || PyTuple_Size(args) < 1) return call_fallback(args, kwargs);
  PyObject* module = PyTuple_GetItem(args, 0);  // borrowed
  if (module == nullptr) return nullptr;
  PyObject* attributes = PyObject_GenericGetDict(module, nullptr);
  if (attributes == nullptr) {
    PyErr_Clear();  // no __dict__: not a module the hooks named
    return call_fallback(args, kwargs);
  }
  PyObject* name = PyDict_Check(attributes) ? fast_name(attributes) : nullptr;
  const char* text = name != nullptr ? PyUnicode_AsUTF8AndSize(name, nullptr) : nullptr;
  PyObject* original = text != nullptr
      ? PyObject_GetAttr(reinterpret_cast<PyObject*>(Py_TYPE(module)), g_state.forward_name) : nullptr;
  if (original == nullptr) {
    Py_DECREF(attributes);
    PyErr_Clear();  // anything unusual: the Python wrapper knows what to do
    return call_fallback(args, kwargs);
  }
  ++g_state.fast_calls;
  nvtxRangePushA(text);  // `text` lives as long as `name`, which `attributes` holds
  PyObject* output = PyObject_Call(original, args, kwargs);
  nvtxRangePop();
  Py_DECREF(original);
  Py_DECREF(attributes);
  return output;
}

// Points `slot` at `value` (a new reference), releasing what it held (Py_XSETREF is not in the
// stable ABI).
void replace(PyObject*& slot, PyObject* value) {
  Py_INCREF(value);
  PyObject* old = slot;
  slot = value;
  Py_XDECREF(old);
}

PyObject* configure(PyObject* /*self*/, PyObject* args) {
  PyObject* fallback = nullptr;
  PyObject* name_key = nullptr;
  PyObject* mark_key = nullptr;
  if (!PyArg_ParseTuple(args, "OUU:configure", &fallback, &name_key, &mark_key)) return nullptr;
  if (!PyCallable_Check(fallback)) {
    PyErr_SetString(PyExc_TypeError, "configure(): the fallback must be callable");
    return nullptr;
  }
  replace(g_state.fallback, fallback);
  replace(g_state.name_key, name_key);
  replace(g_state.mark_key, mark_key);
  Py_RETURN_NONE;
}

PyObject* set_enabled(PyObject* /*self*/, PyObject* value) {
  const int truth = PyObject_IsTrue(value);
  if (truth < 0) return nullptr;
  if (truth != 0 && g_state.fallback == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "set_enabled(True) before configure()");
    return nullptr;
  }
  g_state.enabled = truth != 0;
  Py_RETURN_NONE;
}

PyObject* enabled(PyObject* /*self*/, PyObject* /*unused*/) {
  return PyBool_FromLong(g_state.enabled ? 1 : 0);
}

PyObject* counters(PyObject* /*self*/, PyObject* /*unused*/) {
  return Py_BuildValue("(KK)", g_state.fast_calls, g_state.fallback_calls);
}

// The NVTX calls on their own, for tests and benchmarks of the path into the injection library.
PyObject* push(PyObject* /*self*/, PyObject* name) {
  const char* text = PyUnicode_AsUTF8AndSize(name, nullptr);
  if (text == nullptr) return nullptr;
  return PyLong_FromLong(nvtxRangePushA(text));
}

PyObject* pop(PyObject* /*self*/, PyObject* /*unused*/) {
  return PyLong_FromLong(nvtxRangePop());
}

// METH_VARARGS | METH_KEYWORDS functions are PyCFunctionWithKeywords: the cast is the API's own.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wcast-function-type"
PyMethodDef g_methods[] = {
    {"forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(forward)),
     METH_VARARGS | METH_KEYWORDS,
     "forward(module, *args, **kwargs): the module's forward inside its NVTX range (see the module doc)"},
    {"configure", configure, METH_VARARGS, "configure(fallback, name_key, mark_key)"},
    {"set_enabled", set_enabled, METH_O, "set_enabled(flag): whether forward takes the fast path"},
    {"enabled", enabled, METH_NOARGS, "enabled() -> bool"},
    {"counters", counters, METH_NOARGS, "counters() -> (fast calls, fallback calls)"},
    {"push", push, METH_O, "push(name) -> nvtxRangePushA's answer"},
    {"pop", pop, METH_NOARGS, "pop() -> nvtxRangePop's answer"},
    {nullptr, nullptr, 0, nullptr},
};
#pragma GCC diagnostic pop

PyModuleDef g_module = {
    PyModuleDef_HEAD_INIT,
    "actpage_hooks._fastrange",
    "A hooked module's forward inside its NVTX range, entered without a Python frame.",
    -1,
    g_methods,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) PyObject* PyInit__fastrange() {
  g_state.forward_name = PyUnicode_InternFromString("forward");
  if (g_state.forward_name == nullptr) return nullptr;
  return PyModule_Create(&g_module);
}
