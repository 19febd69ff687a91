/* Unit tests for the metrics: AUC and logloss against values worked out by hand, ties,
 * one-class inputs (AUC NaN), clipping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "granary/train.h"

static double auc_of(const float *s, const float *y, size_t n)
{
    double a;
    assert_int_equal(gr_auc(s, y, n, &a), GR_OK);
    return a;
}

static void test_auc_known(void **state)
{
    (void)state;
    /* Perfect and reversed orderings. */
    float s1[] = {0.1f, 0.2f, 0.8f, 0.9f}, y1[] = {0, 0, 1, 1};
    assert_float_equal(auc_of(s1, y1, 4), 1.0, 1e-12);
    float y1r[] = {1, 1, 0, 0};
    assert_float_equal(auc_of(s1, y1r, 4), 0.0, 1e-12);
    /* y = 0 0 1 1, s = 0.1 0.4 0.35 0.8: of the 4 (+,-) pairs only (0.35, 0.4) is
     * misordered -> 0.75. */
    float s2[] = {0.1f, 0.4f, 0.35f, 0.8f}, y2[] = {0, 0, 1, 1};
    assert_float_equal(auc_of(s2, y2, 4), 0.75, 1e-12);
    /* Ties: all scores equal -> 0.5. */
    float s3[] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, y3[] = {1, 0, 0, 1, 0};
    assert_float_equal(auc_of(s3, y3, 5), 0.5, 1e-12);
    /* Partial tie: s = 1 2 2 3, y = 0 1 0 1. Pairs: (+2 vs -1) 1, (+2 vs -2) 0.5,
     * (+3 vs -1) 1, (+3 vs -2) 1 -> 3.5 / 4. */
    float s4[] = {1, 2, 2, 3}, y4[] = {0, 1, 0, 1};
    assert_float_equal(auc_of(s4, y4, 4), 0.875, 1e-12);
    /* Order of the input does not matter. */
    float s5[] = {3, 2, 1, 2}, y5[] = {1, 0, 0, 1};
    assert_float_equal(auc_of(s5, y5, 4), 0.875, 1e-12);
    /* One class only, or nothing: undefined -> NaN. */
    float y6[] = {1, 1, 1, 1};
    assert_true(isnan(auc_of(s1, y6, 4)));
    float y7[] = {0, 0, 0, 0};
    assert_true(isnan(auc_of(s1, y7, 4)));
    assert_true(isnan(auc_of(s1, y1, 0)));
}

static void test_auc_bruteforce(void **state)
{
    (void)state;
    /* Compare with the O(n^2) pair count on random data with many ties. */
    enum { N = 500 };
    float s[N], y[N];
    gr_rng r;
    gr_rng_seed(&r, 9);
    for (int i = 0; i < N; i++) {
        s[i] = (float)(gr_rng_next(&r) % 20);
        y[i] = gr_rng_uniform(&r) < 0.3 + s[i] / 40.0 ? 1.0f : 0.0f;
    }
    double num = 0, den = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            if (y[i] == 1 && y[j] == 0) {
                den++;
                num += s[i] > s[j] ? 1.0 : s[i] == s[j] ? 0.5 : 0.0;
            }
    assert_float_equal(auc_of(s, y, N), num / den, 1e-12);
}

static void test_logloss(void **state)
{
    (void)state;
    float p[] = {0.9f, 0.2f, 0.5f}, y[] = {1, 0, 1};
    double want = -(log(0.9f) + log(1 - 0.2f) + log(0.5)) / 3;
    assert_float_equal(gr_logloss(p, y, 3), want, 1e-9);
    /* Clipping at 1e-7: a confident wrong answer costs -log(1e-7). */
    float p2[] = {0.0f, 1.0f}, y2[] = {1, 0};
    assert_float_equal(gr_logloss(p2, y2, 2), -log(1e-7), 1e-6);
    float p3[] = {1.0f, 0.0f}, y3[] = {1, 0};
    assert_float_equal(gr_logloss(p3, y3, 2), -log(1 - 1e-7), 1e-9);
    assert_float_equal(gr_logloss(p, y, 0), 0.0, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auc_known),
        cmocka_unit_test(test_auc_bruteforce),
        cmocka_unit_test(test_logloss),
    };
    return cmocka_run_group_tests_name("train_metrics", tests, NULL, NULL);
}
