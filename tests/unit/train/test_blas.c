/* gr_blas_one_thread (src/train/blas.c): OpenBLAS's pool threads are gone after it, a later
 * call and an sgemm do not bring them back, and sgemm still computes. Where the pool was never
 * started (one CPU, or OPENBLAS_NUM_THREADS=1) there is nothing to stop: the thread count then
 * only must not grow. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "granary/train.h"

#include <cblas.h>
#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

static int threads_now(void)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static void test_pool_stopped_and_stays_stopped(void **state)
{
    (void)state;
    int before = threads_now();
    /* The library starts min(CPUs, its limit) - 1 pool threads when it loads, unless told
     * to use one. */
    const char *env = getenv("OPENBLAS_NUM_THREADS");
    bool pool = sysconf(_SC_NPROCESSORS_ONLN) > 1 && !(env && atoi(env) == 1);
    gr_blas_one_thread();
    int after = threads_now();
    assert_int_equal(openblas_get_num_threads(), 1);
    if (pool)
        assert_true(after < before);
    else
        assert_true(after <= before);
    /* (Not asserted equal to 1: ThreadSanitizer runs a thread of its own.) */
    gr_blas_one_thread();
    float a[4 * 3] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, b[3 * 2] = {1, 0, 0, 1, 1, 1};
    float c[4 * 2] = {0};
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 4, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2);
    const float want[8] = {4, 5, 10, 11, 16, 17, 22, 23};
    for (int i = 0; i < 8; i++) assert_true(c[i] == want[i]);
    assert_int_equal(threads_now(), after);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_stopped_and_stays_stopped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
