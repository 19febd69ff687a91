/* gr_thread_set_slice_us: range checks, and on a kernel with custom slices (Linux 6.12+) the
 * slice the kernel then reports for the thread (sched_getattr). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "granary/core.h"
#include "support/sched_probe.h"

static void test_out_of_range_is_refused(void **state)
{
    (void)state;
    uint64_t before = sched_probe_slice_ns();
    assert_int_equal(gr_thread_set_slice_us(99), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "100 to 100000 us"));
    assert_int_equal(gr_thread_set_slice_us(100001), GR_EINVAL);
    assert_true(sched_probe_slice_ns() == before); /* nothing changed */
}

static void test_slice_is_what_the_kernel_then_reports(void **state)
{
    (void)state;
    int rc = gr_thread_set_slice_us(100);
    if (rc != GR_OK) {
        /* An older kernel: the error names the call, and the thread runs as before. */
        assert_int_equal(rc, GR_EINVAL);
        assert_non_null(strstr(gr_errmsg(), "sched_setattr"));
        skip();
    }
    assert_true(sched_probe_slice_ns() == 100000u);
    assert_int_equal(gr_thread_set_slice_us(2700), GR_OK);
    assert_true(sched_probe_slice_ns() == 2700000u);
    assert_int_equal(gr_thread_set_slice_us(0), GR_OK); /* back to the default */
    uint64_t def = sched_probe_slice_ns();
    assert_true(def != 2700000u && def != 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_out_of_range_is_refused),
        cmocka_unit_test(test_slice_is_what_the_kernel_then_reports),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
