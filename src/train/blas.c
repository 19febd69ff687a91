/* OpenBLAS on one thread for the whole process. Our threads (workers, scoring ranges, request
 * threads) are the parallelism, and a multi-threaded sgemm splits the work differently and
 * changes the last bits of a score. The pthreads build Debian ships also starts its pool when
 * the library loads, and an idle pool thread spins on sched_yield for about 2^28 cycles
 * (0.1 s of a core, measured) before it sleeps: in a 0.7 s training run on 2 cores that was
 * 5 % of the process's CPU (perf). openblas_set_num_threads restarts a stopped pool, so it is
 * called here once, and the pool is then stopped (blas_thread_shutdown_, which the library
 * exports for its fork handling; absent elsewhere, the pool is left as it is). */
#include "granary/train.h"

#include <cblas.h>
#include <pthread.h>

extern int blas_thread_shutdown_(void) __attribute__((weak));

static void one_thread(void)
{
    openblas_set_num_threads(1);
    if (blas_thread_shutdown_) blas_thread_shutdown_();
}

void gr_blas_one_thread(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, one_thread);
}
