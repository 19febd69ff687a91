/* Optimizer tests: each optimizer runs several steps through gr_table_apply and is compared,
 * weights and state, with a plain double-precision reference written from the formulas, to
 * 1e-6 relative. Also covers state layout through gr_table_get and insert-restored state. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/table.h"

#define NK 3
#define STEPS 6
#define MAXD 16

/* The reference, written once from the formulas and instantiated in float (the table's
 * arithmetic: must agree to 1e-6 relative) and in double (guards against float-specific
 * mistakes: must agree to 1e-5 absolute on values of order 1). */
#define REF_STEP(NAME, T, SQRT, POW, FABS)                                                    \
    static void NAME(const gr_opt_spec *o, uint32_t dim, T *w, T *s, const T *g)              \
    {                                                                                         \
        T lr = o->lr, eps = o->eps;                                                           \
        switch (o->kind) {                                                                    \
        case GR_OPT_SGD:                                                                      \
            for (uint32_t i = 0; i < dim; i++) w[i] -= lr * g[i];                             \
            break;                                                                            \
        case GR_OPT_ADAGRAD:                                                                  \
            for (uint32_t i = 0; i < dim; i++) {                                              \
                s[i] += g[i] * g[i];                                                          \
                w[i] -= lr * g[i] / (SQRT(s[i]) + eps);                                       \
            }                                                                                 \
            break;                                                                            \
        case GR_OPT_ROWWISE_ADAGRAD: {                                                        \
            T m = 0;                                                                          \
            for (uint32_t i = 0; i < dim; i++) m += g[i] * g[i];                              \
            s[0] += m / (T)dim;                                                               \
            for (uint32_t i = 0; i < dim; i++) w[i] -= lr / (SQRT(s[0]) + eps) * g[i];        \
            break;                                                                            \
        }                                                                                     \
        case GR_OPT_ADAM: {                                                                   \
            T b1 = o->beta1, b2 = o->beta2;                                                   \
            T t = s[2 * dim] += 1;                                                            \
            T bc1 = 1 - POW(b1, t), bc2 = 1 - POW(b2, t);                                     \
            for (uint32_t i = 0; i < dim; i++) {                                              \
                T *m = &s[i], *v = &s[dim + i];                                               \
                *m = b1 * *m + (1 - b1) * g[i];                                               \
                *v = b2 * *v + (1 - b2) * g[i] * g[i];                                        \
                w[i] -= lr * (*m / bc1) / (SQRT(*v / bc2) + eps);                             \
            }                                                                                 \
            break;                                                                            \
        }                                                                                     \
        case GR_OPT_FTRL: {                                                                   \
            T alpha = lr, l1 = o->l1, l2 = o->l2, beta = o->beta;                             \
            for (uint32_t i = 0; i < dim; i++) {                                              \
                T *z = &s[i], *n = &s[dim + i];                                               \
                T sigma = (SQRT(*n + g[i] * g[i]) - SQRT(*n)) / alpha;                        \
                *z += g[i] - sigma * w[i];                                                    \
                *n += g[i] * g[i];                                                            \
                if (FABS(*z) <= l1) w[i] = 0;                                                 \
                else w[i] = -(*z - (*z < 0 ? -1 : 1) * l1) / ((beta + SQRT(*n)) / alpha + l2); \
            }                                                                                 \
            break;                                                                            \
        }                                                                                     \
        }                                                                                     \
    }
REF_STEP(ref_step_f, float, sqrtf, powf, fabsf)
REF_STEP(ref_step_d, double, sqrt, pow, fabs)

typedef struct ref_row {
    float wf[MAXD], sf[2 * MAXD + 1];
    double wd[MAXD], sd[2 * MAXD + 1];
} ref_row;

static void close_enough(const ref_row *r, int idx_is_state, uint32_t i, float got, int step)
{
    double rf = idx_is_state ? r->sf[i] : r->wf[i];
    double rd = idx_is_state ? r->sd[i] : r->wd[i];
    const char *what = idx_is_state ? "state" : "weight";
    double err = fabs((double)got - rf);
    if (err > 1e-6 * fabs(rf))
        fail_msg("%s step %d element %u: got %.9g, float reference %.9g (rel %.3g)", what, step,
                 i, (double)got, rf, err / fabs(rf));
    if (fabs((double)got - rd) > 1e-5 * (1 + fabs(rd)))
        fail_msg("%s step %d element %u: got %.9g, double reference %.12g", what, step, i,
                 (double)got, rd);
}

static void run_opt(gr_opt_kind kind, uint32_t dim)
{
    gr_table_spec s;
    gr_table_spec_default(&s, "opt", dim);
    s.init.kind = GR_INIT_UNIFORM;
    s.init.low = -0.5f;
    s.init.high = 0.5f;
    s.seed = 5;
    s.opt.kind = kind;
    s.opt.lr = kind == GR_OPT_FTRL ? 0.5f : 0.05f;
    s.opt.eps = 1e-6f;
    s.opt.initial_accumulator = 0.1f;
    s.opt.beta1 = 0.9f;
    s.opt.beta2 = 0.99f;
    s.opt.l1 = 0.02f;
    s.opt.l2 = 0.1f;
    s.opt.beta = 1.0f;
    s.partitions = 2;
    gr_table *t = NULL;
    assert_int_equal(gr_table_create(&s, &t), GR_OK);
    uint32_t sf = gr_table_state_floats(&s);
    uint64_t keys[NK] = {3, 1ull << 40, 17};
    float w[NK * MAXD], st[NK * (2 * MAXD + 1)], g[NK * MAXD];
    ref_row ref[NK];
    /* Create the rows, then start the reference from what the table holds. */
    assert_int_equal(gr_table_lookup(t, keys, NK, w, 0), GR_OK);
    assert_int_equal(gr_table_get(t, keys, NK, w, st, NULL, NULL), GR_OK);
    for (int k = 0; k < NK; k++) {
        for (uint32_t i = 0; i < dim; i++) ref[k].wd[i] = ref[k].wf[i] = w[k * dim + i];
        for (uint32_t i = 0; i < sf; i++) ref[k].sd[i] = ref[k].sf[i] = st[k * sf + i];
    }
    if (kind == GR_OPT_ADAGRAD || kind == GR_OPT_ROWWISE_ADAGRAD)
        assert_true(st[0] == 0.1f);
    gr_rng r;
    gr_rng_seed(&r, kind * 100 + dim);
    for (int step = 0; step < STEPS; step++) {
        for (uint32_t i = 0; i < NK * dim; i++) g[i] = (float)(gr_rng_uniform(&r) * 2 - 1);
        assert_int_equal(gr_table_apply(t, keys, NK, g), GR_OK);
        for (int k = 0; k < NK; k++) {
            double gd[MAXD];
            for (uint32_t i = 0; i < dim; i++) gd[i] = g[k * dim + i];
            ref_step_f(&s.opt, dim, ref[k].wf, ref[k].sf, g + k * dim);
            ref_step_d(&s.opt, dim, ref[k].wd, ref[k].sd, gd);
        }
        assert_int_equal(gr_table_get(t, keys, NK, w, st, NULL, NULL), GR_OK);
        for (int k = 0; k < NK; k++) {
            for (uint32_t i = 0; i < dim; i++) close_enough(&ref[k], 0, i, w[k * dim + i], step);
            for (uint32_t i = 0; i < sf; i++) close_enough(&ref[k], 1, i, st[k * sf + i], step);
        }
    }
    if (kind == GR_OPT_ADAM) assert_true(st[2 * dim] == (float)STEPS); /* per-row step count */
    /* Restoring a row with insert (weights + state) and applying again matches a table that
     * never stopped: checkpoints carry everything the optimizer needs. */
    gr_table *t2 = NULL;
    assert_int_equal(gr_table_create(&s, &t2), GR_OK);
    assert_int_equal(gr_table_insert(t2, keys, NK, w, st, NULL), GR_OK);
    for (uint32_t i = 0; i < NK * dim; i++) g[i] = (float)(gr_rng_uniform(&r) * 2 - 1);
    assert_int_equal(gr_table_apply(t, keys, NK, g), GR_OK);
    assert_int_equal(gr_table_apply(t2, keys, NK, g), GR_OK);
    float w2[NK * MAXD], st2[NK * (2 * MAXD + 1)];
    assert_int_equal(gr_table_get(t, keys, NK, w, st, NULL, NULL), GR_OK);
    assert_int_equal(gr_table_get(t2, keys, NK, w2, st2, NULL, NULL), GR_OK);
    assert_memory_equal(w, w2, NK * dim * sizeof(float));
    assert_memory_equal(st, st2, NK * sf * sizeof(float));
    gr_table_destroy(t);
    gr_table_destroy(t2);
}

static void test_sgd(void **state)
{
    (void)state;
    run_opt(GR_OPT_SGD, 7);
    run_opt(GR_OPT_SGD, 16);
}

static void test_adagrad(void **state)
{
    (void)state;
    run_opt(GR_OPT_ADAGRAD, 7);
    run_opt(GR_OPT_ADAGRAD, 16);
}

static void test_rowwise_adagrad(void **state)
{
    (void)state;
    run_opt(GR_OPT_ROWWISE_ADAGRAD, 7);
    run_opt(GR_OPT_ROWWISE_ADAGRAD, 16);
}

static void test_adam(void **state)
{
    (void)state;
    run_opt(GR_OPT_ADAM, 7);
    run_opt(GR_OPT_ADAM, 16);
}

static void test_ftrl(void **state)
{
    (void)state;
    run_opt(GR_OPT_FTRL, 7);
    run_opt(GR_OPT_FTRL, 16);
}

/* FTRL with a large l1 keeps every weight at exactly zero. */
static void test_ftrl_sparsity(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "ftrl", 4);
    s.opt.kind = GR_OPT_FTRL;
    s.opt.lr = 0.1f;
    s.opt.l1 = 100.0f;
    gr_table *t = NULL;
    assert_int_equal(gr_table_create(&s, &t), GR_OK);
    uint64_t k = 1;
    float g[4] = {1, -2, 3, -4}, w[4];
    for (int i = 0; i < 10; i++) assert_int_equal(gr_table_apply(t, &k, 1, g), GR_OK);
    assert_int_equal(gr_table_get(t, &k, 1, w, NULL, NULL, NULL), GR_OK);
    for (int i = 0; i < 4; i++) assert_true(w[i] == 0.0f);
    gr_table_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd),     cmocka_unit_test(test_adagrad),
        cmocka_unit_test(test_rowwise_adagrad), cmocka_unit_test(test_adam),
        cmocka_unit_test(test_ftrl),    cmocka_unit_test(test_ftrl_sparsity),
    };
    return cmocka_run_group_tests_name("table_opt", tests, NULL, NULL);
}
