/* gr_table_apply_checked: the server's push path, which checks a whole request's gradients
 * itself and so skips the table's second reading of them. It must apply exactly what
 * gr_table_apply applies (bit for bit, duplicates included), and a non-finite gradient that a
 * caller lets through anyway must still not make a row non-finite: the finite policy refuses
 * the row's result. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "granary/table.h"

#define DIM 16
#define N 300

static gr_table *make(void)
{
    gr_table_spec spec;
    gr_table_spec_default(&spec, "t", DIM);
    spec.opt.kind = GR_OPT_ADAGRAD;
    spec.opt.lr = 0.05f;
    gr_table *t = NULL;
    assert_int_equal(gr_table_create(&spec, &t), 0);
    return t;
}

static void same_rows(gr_table *a, gr_table *b, const uint64_t *keys, size_t n)
{
    size_t ns = gr_table_state_floats(gr_table_get_spec(a));
    float *wa = malloc(n * DIM * sizeof *wa), *wb = malloc(n * DIM * sizeof *wb);
    float *sa = malloc(n * ns * sizeof *sa), *sb = malloc(n * ns * sizeof *sb);
    bool *fa = malloc(n), *fb = malloc(n);
    assert_int_equal(gr_table_get(a, keys, n, wa, sa, NULL, fa), 0);
    assert_int_equal(gr_table_get(b, keys, n, wb, sb, NULL, fb), 0);
    for (size_t i = 0; i < n; i++) assert_true(fa[i] && fb[i]);
    assert_memory_equal(wa, wb, n * DIM * sizeof *wa);
    assert_memory_equal(sa, sb, n * ns * sizeof *sa);
    free(wa), free(wb), free(sa), free(sb), free(fa), free(fb);
}

static void test_same_bits_as_apply(void **state)
{
    (void)state;
    gr_table *a = make(), *b = make();
    uint64_t keys[N];
    float *g = malloc(N * DIM * sizeof *g);
    srand(7);
    for (int round = 0; round < 4; round++) {
        for (size_t i = 0; i < N; i++) keys[i] = 1 + (uint64_t)(rand() % 97); /* duplicates */
        for (size_t i = 0; i < N * DIM; i++) g[i] = (float)(rand() % 2001 - 1000) * 1e-3f;
        assert_int_equal(gr_table_apply(a, keys, N, g), 0);
        assert_int_equal(gr_table_apply_checked(b, keys, N, g), 0);
    }
    same_rows(a, b, keys, N);
    gr_table_stats sa, sb;
    gr_table_get_stats(a, &sa);
    gr_table_get_stats(b, &sb);
    assert_int_equal(sa.applies, sb.applies);
    assert_int_equal(sa.rows, sb.rows);
    free(g);
    gr_table_destroy(a);
    gr_table_destroy(b);
}

/* gr_table_apply refuses the batch before applying anything; the checked entry point does not
 * look, but the NaN row's result is refused by the finite policy and the other key applies. */
static void test_unchecked_nan_keeps_rows_finite(void **state)
{
    (void)state;
    gr_table *a = make(), *b = make();
    uint64_t keys[2] = {5, 6};
    float g[2 * DIM];
    for (size_t i = 0; i < 2 * DIM; i++) g[i] = 0.25f;
    assert_int_equal(gr_table_apply(a, keys, 2, g), 0);
    assert_int_equal(gr_table_apply(b, keys, 2, g), 0);
    g[3] = NAN;
    assert_int_equal(gr_table_apply(a, keys, 2, g), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "not finite; nothing was applied"));
    assert_int_equal(gr_table_apply_checked(b, keys, 2, g), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "would make its row non-finite"));
    gr_table_stats st;
    gr_table_get_stats(b, &st);
    assert_int_equal(st.nonfinite_rejected, 1);
    float w[DIM], wa[DIM];
    bool found;
    /* Key 5 (the NaN row) is as before in both tables; key 6 moved only in b. */
    assert_int_equal(gr_table_get(b, &keys[0], 1, w, NULL, NULL, &found), 0);
    assert_int_equal(gr_table_get(a, &keys[0], 1, wa, NULL, NULL, &found), 0);
    assert_memory_equal(w, wa, sizeof w);
    for (size_t i = 0; i < DIM; i++) assert_true(isfinite(w[i]));
    assert_int_equal(gr_table_get(b, &keys[1], 1, w, NULL, NULL, &found), 0);
    assert_int_equal(gr_table_get(a, &keys[1], 1, wa, NULL, NULL, &found), 0);
    assert_memory_not_equal(w, wa, sizeof w);
    gr_table_destroy(a);
    gr_table_destroy(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bits_as_apply),
        cmocka_unit_test(test_unchecked_nan_keeps_rows_finite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
