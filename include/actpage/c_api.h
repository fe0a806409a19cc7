/* The C API of libactpage.so, for the Python hook package (ctypes) and tests.
   All functions are safe to call at any time; before the library has initialised they initialise it. */
#ifndef ACTPAGE_C_API_H
#define ACTPAGE_C_API_H

#ifdef __cplusplus
extern "C" {
#endif

/* Version of this C API (1). */
int actpage_api_version(void);
/* 1 when the library is loaded, initialised and enabled; 0 when it is inert (disabled, bad policy,
   no libcuda). */
int actpage_is_active(void);
/* The python_hooks option: 0 auto, 1 on, 2 off. */
int actpage_python_hooks_mode(void);
/* The python_hooks_scope option: 0 blocks, 1 all. */
int actpage_python_hooks_scope(void);
/* 1 when a module rule of the policy (offload or exclusion) matches the range name `name`, else 0:
   the Python hooks name such modules in every scope. */
int actpage_module_rule_matches(const char* name);
/* Flushes the trace file (if any) to disk. */
void actpage_flush_trace(void);

#ifdef __cplusplus
}
#endif
#endif
