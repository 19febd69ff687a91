/* The wide (AVX-512 / AVX) kernels of opt.c give the narrow loops' results bit for bit:
 * Adagrad through gr_table_apply is compared with memcmp against a scalar float reference in
 * the same operation order, for dims that exercise every vector width and every tail; and the
 * finite check refuses a row whose only non-finite value sits in any position (vector body or
 * tail, weights or state). On a CPU without AVX these test the SSE and scalar loops alone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "granary/table.h"

#define NK 5
#define MAXD 130
#define STEPS 4

static gr_table *make(uint32_t dim, gr_opt_kind kind, float lr)
{
    gr_table_spec s;
    gr_table_spec_default(&s, "wide", dim);
    s.init.kind = GR_INIT_UNIFORM;
    s.init.low = -0.5f;
    s.init.high = 0.5f;
    s.seed = 11;
    s.opt.kind = kind;
    s.opt.lr = lr;
    s.opt.eps = 1e-7f;
    s.opt.initial_accumulator = 0.1f;
    gr_table *t = NULL;
    assert_int_equal(gr_table_create(&s, &t), GR_OK);
    return t;
}

static void test_adagrad_bitwise(void **state)
{
    (void)state;
    static const uint32_t dims[] = {1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 128, 130};
    static float w[NK * MAXD], a[NK * MAXD], g[NK * MAXD], rw[NK * MAXD], ra[NK * MAXD];
    uint64_t keys[NK] = {1, 2, 99, 1ull << 50, 12345};
    gr_rng r;
    gr_rng_seed(&r, 77);
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        uint32_t dim = dims[di];
        const float lr = 0.05f, eps = 1e-7f;
        gr_table *t = make(dim, GR_OPT_ADAGRAD, lr);
        assert_int_equal(gr_table_lookup(t, keys, NK, w, 0), GR_OK);
        assert_int_equal(gr_table_get(t, keys, NK, rw, ra, NULL, NULL), GR_OK);
        for (int step = 0; step < STEPS; step++) {
            /* Gradients over many magnitudes, so rounding differences would show. */
            for (uint32_t i = 0; i < NK * dim; i++)
                g[i] = (float)((gr_rng_uniform(&r) * 2 - 1) * pow(10.0, (double)(i % 9) - 4));
            assert_int_equal(gr_table_apply(t, keys, NK, g), GR_OK);
            for (uint32_t i = 0; i < NK * dim; i++) {
                float gi = g[i];
                float ai = ra[i] + gi * gi;
                ra[i] = ai;
                rw[i] -= lr * gi / (sqrtf(ai) + eps);
            }
            assert_int_equal(gr_table_get(t, keys, NK, w, a, NULL, NULL), GR_OK);
            if (memcmp(w, rw, NK * dim * sizeof *w) || memcmp(a, ra, NK * dim * sizeof *a))
                fail_msg("dim %u step %d: Adagrad differs from the scalar reference", dim, step);
        }
        gr_table_destroy(t);
    }
}

/* SGD with lr 1: two gradients of -+3e38 on one element overflow only that weight to +-inf. */
static void test_finite_check_every_position(void **state)
{
    (void)state;
    static float g[MAXD], before[MAXD], after[MAXD];
    const uint32_t dim = 37; /* 2 x 16 + 5: body and tail of every width */
    gr_table *t = make(dim, GR_OPT_SGD, 1.0f);
    uint64_t key = 5;
    assert_int_equal(gr_table_lookup(t, &key, 1, before, 0), GR_OK);
    for (uint32_t pos = 0; pos < dim; pos++) {
        const float sign = pos % 2 ? 1.0f : -1.0f;
        memset(g, 0, sizeof g);
        g[pos] = -sign * 3e38f;
        assert_int_equal(gr_table_apply(t, &key, 1, g), GR_OK); /* w[pos] = +-3e38: finite */
        assert_int_equal(gr_table_apply(t, &key, 1, g), GR_EINVAL); /* would be +-inf */
        assert_int_equal(gr_table_get(t, &key, 1, after, NULL, NULL, NULL), GR_OK);
        assert_true(fabsf(after[pos]) > 2e38f && isfinite(after[pos]));
        g[pos] = sign * 3e38f; /* back near where it was */
        assert_int_equal(gr_table_apply(t, &key, 1, g), GR_OK);
    }
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    assert_int_equal(st.nonfinite_rejected, dim);
    gr_table_destroy(t);

    /* State: an Adagrad accumulator that would overflow, in each position. */
    t = make(dim, GR_OPT_ADAGRAD, 0.01f);
    assert_int_equal(gr_table_lookup(t, &key, 1, before, 0), GR_OK);
    for (uint32_t pos = 0; pos < dim; pos++) {
        memset(g, 0, sizeof g);
        g[pos] = 1e20f; /* g * g = inf */
        assert_int_equal(gr_table_apply(t, &key, 1, g), GR_EINVAL);
    }
    gr_table_get_stats(t, &st);
    assert_int_equal(st.nonfinite_rejected, dim);
    assert_int_equal(st.applies, 0);
    gr_table_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adagrad_bitwise),
        cmocka_unit_test(test_finite_check_every_position),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
