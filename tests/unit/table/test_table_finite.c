/* The finite policy (issue 9): finite gradients whose result would not be finite. For every
 * optimizer, "reject" (the default) leaves the row and its state bit for bit as they were,
 * counts it and names the key; "clip" applies the step clamped and counts it. The issue's own
 * cases: SGD lr 1 and two pushes of 3e38 (row went to -inf), one Adagrad push of 1e20 (the
 * accumulator overflowed and the row never moved again). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/table.h"

#define DIM 4

static gr_table *make(gr_opt_kind kind, float lr, gr_dtype dtype, gr_nonfinite policy)
{
    gr_table_spec spec;
    gr_table_spec_default(&spec, "t", DIM);
    spec.opt.kind = kind;
    spec.opt.lr = lr;
    spec.dtype = dtype;
    spec.nonfinite = policy;
    gr_table *t = NULL;
    assert_int_equal(gr_table_create(&spec, &t), 0);
    return t;
}

static int push(gr_table *t, uint64_t key, float g)
{
    float grad[DIM];
    for (int i = 0; i < DIM; i++) grad[i] = g;
    return gr_table_apply(t, &key, 1, grad);
}

/* Weights and state of one row. */
typedef struct row {
    float w[DIM];
    float s[2 * DIM + 1];
} row;

static row get(gr_table *t, uint64_t key)
{
    row r;
    memset(&r, 0, sizeof r);
    bool found = false;
    assert_int_equal(gr_table_get(t, &key, 1, r.w, r.s, NULL, &found), 0);
    assert_true(found);
    return r;
}

static void assert_all_finite(const row *r)
{
    for (size_t i = 0; i < DIM; i++) assert_true(isfinite(r->w[i]));
    for (size_t i = 0; i < 2 * DIM + 1; i++) assert_true(isfinite(r->s[i]));
}

static gr_table_stats stats(gr_table *t)
{
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    return st;
}

static void test_sgd_two_pushes_of_3e38(void **state)
{
    (void)state;
    gr_table *t = make(GR_OPT_SGD, 1.0f, GR_DTYPE_F32, GR_NONFINITE_REJECT);
    assert_int_equal(push(t, 9, 3e38f), 0);
    row before = get(t, 9);
    assert_true(before.w[0] == -3e38f);
    assert_int_equal(push(t, 9, 3e38f), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "key 9"));
    assert_non_null(strstr(gr_errmsg(), "non-finite"));
    row after = get(t, 9);
    assert_memory_equal(&before, &after, sizeof before);
    assert_int_equal(stats(t).nonfinite_rejected, 1);
    assert_int_equal(stats(t).applies, 1);
    /* It still takes ordinary updates. */
    assert_int_equal(push(t, 9, -1e38f), 0);
    float w = get(t, 9).w[0];
    assert_true(isfinite(w) && w > -3e38f);
    gr_table_destroy(t);

    t = make(GR_OPT_SGD, 1.0f, GR_DTYPE_F32, GR_NONFINITE_CLIP);
    assert_int_equal(push(t, 9, 3e38f), 0);
    assert_int_equal(push(t, 9, 3e38f), 0);
    row r = get(t, 9);
    for (int i = 0; i < DIM; i++) assert_true(r.w[i] == -FLT_MAX);
    assert_int_equal(stats(t).nonfinite_clipped, 1);
    assert_int_equal(stats(t).nonfinite_rejected, 0);
    gr_table_destroy(t);
}

static void test_adagrad_push_of_1e20(void **state)
{
    (void)state;
    gr_table *t = make(GR_OPT_ADAGRAD, 0.05f, GR_DTYPE_F32, GR_NONFINITE_REJECT);
    assert_int_equal(push(t, 3, 0.5f), 0);
    row before = get(t, 3);
    assert_int_equal(push(t, 3, 1e20f), GR_EINVAL);
    row after = get(t, 3);
    assert_memory_equal(&before, &after, sizeof before);
    assert_all_finite(&after);
    /* The row still moves. */
    assert_int_equal(push(t, 3, 0.5f), 0);
    assert_true(get(t, 3).w[0] < before.w[0]);
    assert_int_equal(stats(t).nonfinite_rejected, 1);
    gr_table_destroy(t);

    /* Clipped: the accumulator stops at FLT_MAX and the row still moves afterwards. */
    t = make(GR_OPT_ADAGRAD, 0.05f, GR_DTYPE_F32, GR_NONFINITE_CLIP);
    assert_int_equal(push(t, 3, 1e20f), 0);
    row c = get(t, 3);
    assert_all_finite(&c);
    assert_true(c.s[0] == FLT_MAX);
    assert_int_equal(push(t, 3, 0.5f), 0);
    assert_true(get(t, 3).w[0] < c.w[0]);
    assert_int_equal(stats(t).nonfinite_clipped, 1);
    gr_table_destroy(t);
}

/* Every optimizer, both policies: a gradient that overflows its state never leaves a
 * non-finite value behind. */
static void test_every_optimizer(void **state)
{
    (void)state;
    const gr_opt_kind kinds[] = {GR_OPT_SGD, GR_OPT_ADAGRAD, GR_OPT_ROWWISE_ADAGRAD, GR_OPT_ADAM,
                                 GR_OPT_FTRL};
    for (size_t k = 0; k < 5; k++)
        for (int pol = 0; pol < 2; pol++) {
            gr_table *t = make(kinds[k], kinds[k] == GR_OPT_SGD ? 1.0f : 0.1f, GR_DTYPE_F32,
                               (gr_nonfinite)pol);
            assert_int_equal(push(t, 1, 0.25f), 0);
            row before = get(t, 1);
            int rc = push(t, 1, 3e38f);
            if (kinds[k] == GR_OPT_SGD) rc = rc ? rc : push(t, 1, 3e38f);
            row after = get(t, 1);
            assert_all_finite(&after);
            gr_table_stats st = stats(t);
            if (pol == GR_NONFINITE_REJECT) {
                assert_int_equal(rc, GR_EINVAL);
                if (kinds[k] != GR_OPT_SGD) assert_memory_equal(&before, &after, sizeof before);
                assert_int_equal(st.nonfinite_rejected, 1);
            } else {
                assert_int_equal(rc, 0);
                assert_int_equal(st.nonfinite_clipped, 1);
            }
            gr_table_destroy(t);
        }
}

/* f16 storage overflows at 65520: a weight of -70000 would be stored as -inf. */
static void test_f16_range(void **state)
{
    (void)state;
    gr_table *t = make(GR_OPT_SGD, 1.0f, GR_DTYPE_F16, GR_NONFINITE_REJECT);
    assert_int_equal(push(t, 4, 60000.0f), 0);
    assert_int_equal(push(t, 4, 10000.0f), GR_EINVAL);
    assert_true(get(t, 4).w[0] == -60000.0f);
    gr_table_destroy(t);
    t = make(GR_OPT_SGD, 1.0f, GR_DTYPE_F16, GR_NONFINITE_CLIP);
    assert_int_equal(push(t, 4, 70000.0f), 0);
    assert_true(get(t, 4).w[0] == -65504.0f);
    gr_table_destroy(t);
}

/* One bad row in a batch: refused alone, the others applied, the error names it. */
static void test_batch_refuses_only_the_bad_row(void **state)
{
    (void)state;
    gr_table *t = make(GR_OPT_SGD, 1.0f, GR_DTYPE_F32, GR_NONFINITE_REJECT);
    assert_int_equal(push(t, 11, 3e38f), 0);
    uint64_t keys[3] = {10, 11, 12};
    float g[3 * DIM];
    for (int i = 0; i < 3 * DIM; i++) g[i] = i < DIM || i >= 2 * DIM ? 1.0f : 3e38f;
    assert_int_equal(gr_table_apply(t, keys, 3, g), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "key 11"));
    assert_non_null(strstr(gr_errmsg(), "1 of 3 rows"));
    assert_true(get(t, 10).w[0] == -1.0f);
    assert_true(get(t, 11).w[0] == -3e38f);
    assert_true(get(t, 12).w[0] == -1.0f);
    gr_table_destroy(t);
}

/* The counted form (the sync job's steps): refused rows are counted, not an error. */
static void test_apply_counted(void **state)
{
    (void)state;
    gr_table *t = make(GR_OPT_SGD, 1.0f, GR_DTYPE_F32, GR_NONFINITE_REJECT);
    assert_int_equal(push(t, 11, 3e38f), 0);
    uint64_t keys[2] = {10, 11};
    float g[2 * DIM];
    for (int i = 0; i < 2 * DIM; i++) g[i] = i < DIM ? 1.0f : 3e38f;
    size_t refused = 99;
    assert_int_equal(gr_table_apply_counted(t, keys, 2, g, &refused), 0);
    assert_int_equal(refused, 1);
    assert_true(get(t, 10).w[0] == -1.0f);
    assert_true(get(t, 11).w[0] == -3e38f);
    g[0] = NAN; /* a bad gradient is still an error, nothing applied */
    assert_int_equal(gr_table_apply_counted(t, keys, 2, g, &refused), GR_EINVAL);
    assert_int_equal(refused, 0);
    assert_true(get(t, 10).w[0] == -1.0f);
    assert_int_equal(stats(t).nonfinite_rejected, 1);
    gr_table_destroy(t);
}

static void test_spec_json(void **state)
{
    (void)state;
    gr_table_spec spec;
    assert_int_equal(gr_table_spec_from_json("{\"name\":\"a\",\"dim\":2,\"nonfinite\":\"clip\"}",
                                             &spec),
                     0);
    assert_int_equal(spec.nonfinite, GR_NONFINITE_CLIP);
    char *js = gr_table_spec_to_json(&spec);
    assert_non_null(strstr(js, "\"nonfinite\":\"clip\""));
    gr_table_spec back;
    assert_int_equal(gr_table_spec_from_json(js, &back), 0);
    assert_true(gr_table_spec_equal(&spec, &back));
    free(js);
    assert_int_equal(gr_table_spec_from_json("{\"name\":\"a\",\"dim\":2,\"nonfinite\":\"wrap\"}",
                                             &spec),
                     GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "reject, clip"));
    /* The default is not written, so older specs read back byte for byte. */
    assert_int_equal(gr_table_spec_from_json("{\"name\":\"a\",\"dim\":2}", &spec), 0);
    assert_int_equal(spec.nonfinite, GR_NONFINITE_REJECT);
    js = gr_table_spec_to_json(&spec);
    assert_null(strstr(js, "nonfinite"));
    free(js);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_two_pushes_of_3e38),
        cmocka_unit_test(test_adagrad_push_of_1e20),
        cmocka_unit_test(test_every_optimizer),
        cmocka_unit_test(test_f16_range),
        cmocka_unit_test(test_batch_refuses_only_the_bad_row),
        cmocka_unit_test(test_apply_counted),
        cmocka_unit_test(test_spec_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
