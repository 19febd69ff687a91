/* A thread's time slice as the kernel reports it (sched_getattr's sched_runtime, ns), for
 * tests of gr_thread_set_slice_us; 0 when the call fails. */
#ifndef GRANARY_TESTS_SCHED_PROBE_H
#define GRANARY_TESTS_SCHED_PROBE_H

#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

/* The same for thread tid of this process (0: the calling thread). */
static inline uint64_t sched_probe_slice_ns_of(pid_t tid)
{
    struct {
        uint32_t size, policy;
        uint64_t flags;
        int32_t nice;
        uint32_t prio;
        uint64_t runtime, deadline, period;
    } a;
    memset(&a, 0, sizeof a);
    if (syscall(SYS_sched_getattr, tid, &a, sizeof a, 0) != 0) return 0;
    return a.runtime;
}

static inline uint64_t sched_probe_slice_ns(void)
{
    return sched_probe_slice_ns_of(0);
}

#endif
