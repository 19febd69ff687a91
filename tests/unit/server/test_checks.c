/* Unit tests for the checks every handler shares (src/server/checks.c): the first non-finite
 * gradient is found in every position of arrays of every length around the vector widths
 * (the compiler's SSE loop and its scalar tail), NaN and both infinities, and the first of several is
 * the one named; finite extremes (FLT_MAX, denormals, -0) pass. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "server/server_int.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

static void test_first_nonfinite_every_position(void **state)
{
    (void)state;
    float v[100];
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (size_t n = 1; n <= 100; n++) {
        for (size_t i = 0; i < n; i++) v[i] = (i % 3 == 0) ? FLT_MAX : (i % 3 == 1) ? -1e-40f : -0.0f;
        assert_int_equal(srv_first_nonfinite(v, n), n);
        for (size_t p = 0; p < n; p++) {
            float keep = v[p];
            v[p] = bad[(n + p) % 3];
            assert_int_equal(srv_first_nonfinite(v, n), p);
            if (p + 17 < n) { /* a later one does not hide the first */
                v[p + 17] = NAN;
                assert_int_equal(srv_first_nonfinite(v, n), p);
                v[p + 17] = (p + 17) % 3 == 0 ? FLT_MAX : (p + 17) % 3 == 1 ? -1e-40f : -0.0f;
            }
            v[p] = keep;
        }
    }
    assert_int_equal(srv_first_nonfinite(v, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_nonfinite_every_position),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
