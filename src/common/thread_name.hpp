// Names the calling thread (what `ps -L`, /proc/PID/task/*/comm, gdb and perf show), so that a
// look at a job's threads tells actpage's workers from the job's own.
#pragma once

#include <pthread.h>

namespace actpage {

// `name`: at most 15 characters (the kernel's limit); a longer one is left unset, not cut.
inline void name_this_thread(const char* name) noexcept { (void)pthread_setname_np(pthread_self(), name); }

}  // namespace actpage
