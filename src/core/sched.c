/* Scheduling: the time slice a latency-sensitive thread asks the kernel for. */
#include "granary/core.h"

#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Linux's EEVDF scheduler (6.6 and later) gives each SCHED_OTHER thread a deadline one slice
 * after it becomes eligible, and since 6.12 a thread may ask for its own slice
 * (sched_attr.sched_runtime, 0.1 to 100 ms; no privilege needed). A thread that wakes with a
 * short slice has an early deadline, so it runs ahead of threads on the default slice (0.7 ms
 * times 1 + log2 of the CPU count: 1.4 ms on 2 cores) and preempts them (the PREEMPT_SHORT
 * feature) instead of waiting for one to finish its slice. That is what a thread answering
 * requests wants: its work is a few microseconds, and waiting behind another thread's slice
 * is what its callers' latency tail is made of. Its share of the CPU does not change (same
 * weight). Kernels without custom slices refuse the call: GR_EINVAL then, and the thread runs
 * as before. 0 goes back to the default slice. */
/* The kernel's struct sched_attr, first version (48 bytes); <linux/sched/types.h> has it but
 * cannot be included beside <sched.h>. */
typedef struct sched_attr_v0 {
    uint32_t size, sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime, sched_deadline, sched_period;
} sched_attr_v0;

int gr_thread_set_slice_us(unsigned us)
{
    if (us && (us < 100 || us > 100000))
        return gr_seterr(GR_EINVAL, "a time slice must be 100 to 100000 us (0: the default), "
                         "not %u", us);
#ifdef SYS_sched_setattr
    sched_attr_v0 a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.sched_policy = SCHED_OTHER;
    a.sched_runtime = (uint64_t)us * 1000u;
    if (syscall(SYS_sched_setattr, 0, &a, 0) != 0)
        return gr_seterr(GR_EINVAL, "sched_setattr (slice %u us): %s", us, strerror(errno));
    if (!us) return GR_OK;
    /* Kernels before 6.12 accept the call and ignore the field: ask what it now is. */
    sched_attr_v0 got;
    memset(&got, 0, sizeof got);
    if (syscall(SYS_sched_getattr, 0, &got, sizeof got, 0) != 0 ||
        got.sched_runtime != a.sched_runtime)
        return gr_seterr(GR_EINVAL, "sched_setattr (slice %u us): this kernel keeps its own "
                         "slice (custom slices need Linux 6.12 or later)", us);
    return GR_OK;
#else
    return gr_seterr(GR_EINVAL, "this system has no sched_setattr");
#endif
}

void gr_thread_want_slice_us(unsigned us, const char *who)
{
    if (us && gr_thread_set_slice_us(us)) {
        GR_LOGD("%s keeps the kernel's slice: %s", who, gr_errmsg());
        gr_clearerr();
    }
}
