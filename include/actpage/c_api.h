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
/* The python_hooks_backward option, auto resolved by the mode: 0 layers, 1 hooked, 2 none. */
int actpage_python_hooks_backward(void);
/* The python_hooks_call option: 0 hooks, 1 wrap. */
int actpage_python_hooks_call(void);
/* 1 when a module rule of the policy (offload or exclusion) matches the range name `name`, else 0:
   the Python hooks name such modules in every scope. */
int actpage_module_rule_matches(const char* name);
/* Flushes the trace file (if any) to disk. */
void actpage_flush_trace(void);
/* An outermost module forward call begins on the calling thread (one micro-batch through the model
   or a pipeline stage's chunk): returns its id, never 0. Activations allocated on this thread until
   the next call belong to it. */
unsigned long long actpage_begin_forward_pass(void);
/* The next backward marker ("<path>.backward") pushed on the calling thread belongs to the forward
   call `id` (from actpage_begin_forward_pass): only that call's activations of the module are
   brought back. 0 or never called: all of them. */
void actpage_set_backward_pass(unsigned long long id);
/* on = 0 pauses the trace's allocation and VMM records for the whole process, 1 resumes them; returns
   the previous setting. Routing is unchanged (owned memory still goes to the engine). A measurement
   switch: examples/common.py --alternate-actpage pauses and resumes it, with the Python hooks,
   between training steps. */
int actpage_set_recording(int on);

/* Saved-tensor hooks (python/actpage_hooks/_saved.py, torch's default pack/unpack hooks). Addresses
   are those of a tensor's storage; one the library did not serve is ignored, as is every call while
   the library is inert. docs/engine.md ("Saved tensors") has the rules. */
/* The Python side installs the hooks in this process (called once, before it pushes them): from
   now on only the allocations autograd saves are offloaded. Returns 1 when the library uses what
   the hooks tell (an offload engine runs and the policy selects a module, or auto mode runs) or
   records it (a trace is being written: each pack becomes a SAVED record, observe mode included),
   0 when they would only cost time (no trace and no module selected, inert): then the caller
   leaves them out. */
int actpage_saved_tensor_hooks_installed(void);
/* A forward begins on the calling thread (the Python side asks at each outermost module call, on
   the thread that installed the hooks): 1 when its packs are wanted, 0 when nothing in it can be
   served and no trace records them (auto mode's cap serves nothing: its governor's unpaged passes,
   or paging ended). On 0 the Python side takes the hooks off until a forward answers 1, where
   torch lets it tell that no hooks of the job's are pushed above them; each saved tensor's pack
   and unpack would only cost time. */
int actpage_saved_tensor_hooks_wanted(void);
/* Pack: autograd saves the tensor at `address`; called on the thread running forward, inside the
   ranges of the module saving it. A module that saves it after its release point keeps it on the
   device until that module's layer ends. While a trace is written it is recorded. Returns 1 when the library serves that address (then the
   unpack must ask about it), 0 when it is none of the library's (the unpack may skip the call), and
   2 when it serves it and the pack came outside any layer (a job's own checkpointing saves each
   layer's input in the parent module): it then stays on the device until a range with no layer
   ends, unless actpage_tensor_unreferenced says earlier that forward holds it no more. */
int actpage_tensor_saved(unsigned long long address);
/* On the thread running forward, for an address actpage_tensor_saved answered 2: no tensor (nor
   storage) but autograd's saved ones holds its storage any more, so no op of forward can read it:
   it may leave now. Ignored in backward and when nothing waits for it. */
void actpage_tensor_unreferenced(unsigned long long address);
/* Unpack, on autograd's thread: 1 when the tensor at `address` is not back for sure and the stream
   reading it must wait for it (then call actpage_tensor_wait), else 0. */
int actpage_tensor_unpacking(unsigned long long address);
/* Makes `stream` (the raw CUDA stream that reads the tensor, as an integer) wait until the tensor at
   `address` is back; the calling thread blocks only until its reload is issued. */
void actpage_tensor_wait(unsigned long long address, unsigned long long stream);

#ifdef __cplusplus
}
#endif
#endif
