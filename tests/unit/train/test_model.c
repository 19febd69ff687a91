/* Unit tests for the models: every gradient (dense parameters of each layer and each
 * embedding occurrence) checked against central finite differences for DLRM and LR, layout
 * sizes, deterministic init, predict vs train step, batch-mean semantics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/train.h"
#include "train/model_prep.h"

#define NS GR_CRITEO_SPARSE
#define ND GR_CRITEO_DENSE

typedef struct fixture {
    gr_model *m;
    gr_model_ws *ws;
    size_t n, np, ne;
    float *params, *dense, *emb, *labels, *gp, *ge;
} fixture;

static void fixture_init(fixture *f, const gr_model_config *c, size_t n, uint64_t seed)
{
    memset(f, 0, sizeof *f);
    assert_int_equal(gr_model_create(c, &f->m), GR_OK);
    assert_int_equal(gr_model_ws_create(f->m, &f->ws), GR_OK);
    f->n = n;
    f->np = gr_model_dense_size(f->m);
    f->ne = n * NS * gr_model_emb_dim(f->m);
    f->params = malloc(f->np * sizeof(float));
    f->gp = malloc(f->np * sizeof(float));
    f->dense = malloc(n * ND * sizeof(float));
    f->emb = malloc(f->ne * sizeof(float));
    f->ge = malloc(f->ne * sizeof(float));
    f->labels = malloc(n * sizeof(float));
    gr_model_init_dense(f->m, f->params);
    gr_rng r;
    gr_rng_seed(&r, seed);
    if (c->kind == GR_MODEL_LR)
        for (size_t i = 0; i < f->np; i++) f->params[i] = (float)(gr_rng_uniform(&r) - 0.5);
    for (size_t i = 0; i < n * ND; i++) f->dense[i] = (float)(3 * gr_rng_uniform(&r));
    for (size_t i = 0; i < f->ne; i++) f->emb[i] = (float)(gr_rng_uniform(&r) - 0.5);
    for (size_t i = 0; i < n; i++) f->labels[i] = (float)(i % 2);
}

static void fixture_fini(fixture *f)
{
    gr_model_ws_destroy(f->ws);
    gr_model_destroy(f->m);
    free(f->params);
    free(f->gp);
    free(f->dense);
    free(f->emb);
    free(f->ge);
    free(f->labels);
}

static double loss_at(fixture *f)
{
    double loss;
    float *gp = malloc(f->np * sizeof(float)), *ge = malloc(f->ne * sizeof(float));
    assert_int_equal(gr_model_train_step(f->m, f->ws, f->params, f->n, f->dense, f->emb,
                                         f->labels, &loss, NULL, gp, ge),
                     GR_OK);
    free(gp);
    free(ge);
    return loss;
}

/* Central differences on each float of v (len entries), compared with the analytic g. */
static void check_grad(fixture *f, float *v, const float *g, size_t len, const char *what)
{
    const float eps = 1e-3f;
    size_t bad = 0;
    double max_abs = 0;
    for (size_t i = 0; i < len; i++) {
        float keep = v[i];
        v[i] = keep + eps;
        double lp = loss_at(f);
        v[i] = keep - eps;
        double lm = loss_at(f);
        v[i] = keep;
        /* The step actually taken, as float rounding makes it. */
        double h = (double)(keep + eps) - (double)(keep - eps);
        double num = (lp - lm) / h;
        double err = fabs(num - g[i]);
        if (fabs(g[i]) > max_abs) max_abs = fabs(g[i]);
        if (err > 3e-4 + 2e-2 * fabs(g[i])) {
            if (bad++ < 5)
                print_error("%s[%zu]: analytic %.6g numeric %.6g\n", what, i, g[i], num);
        }
    }
    if (bad) fail_msg("%zu of %zu %s gradients differ", bad, len, what);
    /* The check means something only if gradients are not all zero. */
    assert_true(max_abs > 1e-4);
}

static void test_dlrm_gradcheck(void **state)
{
    (void)state;
    gr_model_config c;
    gr_model_config_default(&c, GR_MODEL_DLRM);
    c.dim = 3;
    c.n_bottom = 2;
    c.bottom[0] = 6;
    c.bottom[1] = 5;
    c.n_top = 2;
    c.top[0] = 7;
    c.top[1] = 4;
    c.seed = 11;
    fixture f;
    fixture_init(&f, &c, 3, 5);
    double loss;
    float probs[3];
    assert_int_equal(gr_model_train_step(f.m, f.ws, f.params, f.n, f.dense, f.emb, f.labels,
                                         &loss, probs, f.gp, f.ge),
                     GR_OK);
    double manual = 0;
    for (int i = 0; i < 3; i++)
        manual -= f.labels[i] ? log(probs[i]) : log(1 - probs[i]);
    assert_float_equal(loss, manual / 3, 1e-5);
    /* Sizes: bottom 13-6-5-3, top (3+351)-7-4-1. */
    size_t want = (13 * 6 + 6) + (6 * 5 + 5) + (5 * 3 + 3) + (354 * 7 + 7) + (7 * 4 + 4) + (4 + 1);
    assert_int_equal(f.np, want);
    float *gp = malloc(f.np * sizeof(float)), *ge = malloc(f.ne * sizeof(float));
    memcpy(gp, f.gp, f.np * sizeof(float));
    memcpy(ge, f.ge, f.ne * sizeof(float));
    /* Parameter groups, checked separately so a failure names its layer. */
    size_t at = 0;
    const size_t groups[][2] = {{13 * 6, 6}, {6 * 5, 5}, {5 * 3, 3},
                                {354 * 7, 7}, {7 * 4, 4}, {4, 1}};
    const char *names[] = {"bottom0", "bottom1", "bottom2", "top0", "top1", "top2"};
    for (int l = 0; l < 6; l++) {
        char what[32];
        snprintf(what, sizeof what, "%s.w", names[l]);
        check_grad(&f, f.params + at, gp + at, groups[l][0], what);
        at += groups[l][0];
        snprintf(what, sizeof what, "%s.b", names[l]);
        check_grad(&f, f.params + at, gp + at, groups[l][1], what);
        at += groups[l][1];
    }
    assert_int_equal(at, f.np);
    check_grad(&f, f.emb, ge, f.ne, "embedding");
    free(gp);
    free(ge);
    fixture_fini(&f);
}

static void test_lr_gradcheck(void **state)
{
    (void)state;
    gr_model_config c;
    gr_model_config_default(&c, GR_MODEL_LR);
    fixture f;
    fixture_init(&f, &c, 4, 9);
    assert_int_equal(f.np, 14);
    assert_int_equal(gr_model_emb_dim(f.m), 1);
    double loss;
    assert_int_equal(gr_model_train_step(f.m, f.ws, f.params, f.n, f.dense, f.emb, f.labels,
                                         &loss, NULL, f.gp, f.ge),
                     GR_OK);
    float gp[14], *ge = malloc(f.ne * sizeof(float));
    memcpy(gp, f.gp, sizeof gp);
    memcpy(ge, f.ge, f.ne * sizeof(float));
    check_grad(&f, f.params, gp, 13, "lr.w");
    check_grad(&f, f.params + 13, gp + 13, 1, "lr.bias");
    check_grad(&f, f.emb, ge, f.ne, "lr.embedding");
    /* Every slot of one example shares the logit's gradient. */
    for (int s = 1; s < NS; s++) assert_true(ge[s] == ge[0]);
    free(ge);
    fixture_fini(&f);
}

static void test_batch_mean_and_predict(void **state)
{
    (void)state;
    gr_model_config c;
    gr_model_config_default(&c, GR_MODEL_DLRM);
    c.dim = 4;
    fixture f;
    fixture_init(&f, &c, 5, 21);
    double loss;
    float probs[5], pred[5];
    assert_int_equal(gr_model_train_step(f.m, f.ws, f.params, 5, f.dense, f.emb, f.labels,
                                         &loss, probs, f.gp, f.ge),
                     GR_OK);
    assert_int_equal(gr_model_predict(f.m, f.ws, f.params, 5, f.dense, f.emb, pred), GR_OK);
    for (int i = 0; i < 5; i++) assert_float_equal(pred[i], probs[i], 1e-6);
    /* The batch gradient is the mean of the one-example gradients. */
    double *mean = calloc(f.np, sizeof(double));
    float *g1 = malloc(f.np * sizeof(float)), *ge1 = malloc(NS * 4 * sizeof(float));
    double lsum = 0;
    for (int i = 0; i < 5; i++) {
        double l1;
        assert_int_equal(gr_model_train_step(f.m, f.ws, f.params, 1, f.dense + i * ND,
                                             f.emb + i * NS * 4, f.labels + i, &l1, NULL, g1,
                                             ge1),
                         GR_OK);
        lsum += l1;
        for (size_t k = 0; k < f.np; k++) mean[k] += g1[k] / 5.0;
        /* Embedding gradients are per occurrence: 1/5 of the single-example ones. */
        for (int k = 0; k < NS * 4; k++)
            assert_float_equal(f.ge[i * NS * 4 + k], ge1[k] / 5, 1e-6);
    }
    assert_float_equal(loss, lsum / 5, 1e-6);
    for (size_t k = 0; k < f.np; k++) assert_float_equal(f.gp[k], mean[k], 1e-5);
    free(mean);
    free(g1);
    free(ge1);
    fixture_fini(&f);
}

/* gr_model_predict_prepared gives gr_model_predict's bits, one example at a time, for the
 * default DLRM and for one whose top input (dim 32: 383 floats) is cut into two K blocks by
 * OpenBLAS; and the fast path is really taken on a CPU with FMA. */
static void check_prepared(const gr_model_config *c, size_t n, uint64_t seed)
{
    fixture f;
    fixture_init(&f, c, n, seed);
    gr_rng r;
    gr_rng_seed(&r, seed + 1);
    for (size_t i = 0; i < f.np; i++) f.params[i] += (float)(gr_rng_uniform(&r) - 0.5) * 0.1f;
    gr_model_prepared *prep = NULL;
    assert_int_equal(gr_model_prepare(f.m, f.params, &prep), GR_OK);
    int fast = gr_model_prepared_layers(prep);
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        assert_int_equal(fast, (int)(c->n_bottom + 1 + c->n_top + 1));
#endif
    const size_t d = gr_model_emb_dim(f.m);
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) {
        float want, got;
        const float *dense = f.dense + i * ND, *emb = f.emb + i * NS * d;
        assert_int_equal(gr_model_predict(f.m, f.ws, f.params, 1, dense, emb, &want), GR_OK);
        assert_int_equal(gr_model_predict_prepared(f.m, f.ws, f.params, prep, 1, dense, emb, &got),
                         GR_OK);
        differ += memcmp(&want, &got, sizeof got) != 0;
    }
    assert_int_equal(differ, 0);
    /* A batch, and parameters other than the prepared ones, take the plain path. */
    float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
    assert_int_equal(gr_model_predict(f.m, f.ws, f.params, n, f.dense, f.emb, want), GR_OK);
    assert_int_equal(gr_model_predict_prepared(f.m, f.ws, f.params, prep, n, f.dense, f.emb, got),
                     GR_OK);
    assert_memory_equal(want, got, n * sizeof *got);
    float *other = malloc(f.np * sizeof *other);
    memcpy(other, f.params, f.np * sizeof *other);
    other[0] += 1.0f; /* a bottom weight: changes every score */
    assert_int_equal(gr_model_predict(f.m, f.ws, other, 1, f.dense, f.emb, want), GR_OK);
    assert_int_equal(gr_model_predict_prepared(f.m, f.ws, other, prep, 1, f.dense, f.emb, got),
                     GR_OK);
    assert_memory_equal(want, got, sizeof *got);
    free(other), free(want), free(got);
    gr_model_prepared_destroy(prep);
    fixture_fini(&f);
}

/* The blocking search on layers of 17..40 inputs, starting with no hint: every pair it tries
 * stays inside the layer (ASan: the arrays are exactly the layer's size), and a pair is
 * found on a CPU with FMA. */
static void test_gemv_search_bounds(void **state)
{
    (void)state;
    gr_rng r;
    gr_rng_seed(&r, 5);
    for (uint32_t in = 17; in <= 40; in++) {
        const uint32_t out = 9;
        float *w = malloc(in * out * sizeof *w), *wt = malloc(in * out * sizeof *wt);
        float *b = malloc(out * sizeof *b);
        for (uint32_t i = 0; i < in * out; i++) w[i] = (float)(gr_rng_uniform(&r) - 0.5);
        for (uint32_t j = 0; j < out; j++) {
            b[j] = (float)gr_rng_uniform(&r);
            for (uint32_t k = 0; k < in; k++) wt[k * out + j] = w[j * in + k];
        }
        uint32_t q, u, hq = 0, hu = 0;
        int found = tr_gemv_find_split(in, out, w, wt, b, &q, &u, &hq, &hu);
        if (tr_gemv_supported()) assert_int_equal(found, 1);
        free(w), free(wt), free(b);
    }
}

static void test_prepared_bitwise(void **state)
{
    (void)state;
    gr_model_config c;
    gr_model_config_default(&c, GR_MODEL_DLRM);
    check_prepared(&c, 300, 21);
    c.dim = 32;
    c.top[0] = 256;
    check_prepared(&c, 200, 22);
    /* A layer of 24 inputs: the blocking search tries pairs whose half-block would run past
     * the end (ASan caught it in a replica). */
    gr_model_config_default(&c, GR_MODEL_DLRM);
    c.bottom[0] = 24;
    c.n_bottom = 1;
    check_prepared(&c, 50, 23);
}

static void test_config_and_init(void **state)
{
    (void)state;
    gr_model_config c;
    gr_model_config_default(&c, GR_MODEL_DLRM);
    gr_model *m;
    assert_int_equal(gr_model_create(&c, &m), GR_OK);
    /* 13-64-32-16 bottom, (16+351)-128-64-1 top. */
    size_t want = (13 * 64 + 64) + (64 * 32 + 32) + (32 * 16 + 16) + (367 * 128 + 128) +
                  (128 * 64 + 64) + (64 + 1);
    assert_int_equal(gr_model_dense_size(m), want);
    assert_string_equal(gr_model_dense_name(m), "dlrm.dense");
    char desc[1024];
    gr_model_describe(m, desc, sizeof desc);
    assert_non_null(strstr(desc, "bottom0.w 64x13 @0"));
    assert_non_null(strstr(desc, "top2.b 1 @"));
    float *a = malloc(want * sizeof(float)), *b = malloc(want * sizeof(float));
    gr_model_init_dense(m, a);
    gr_model_init_dense(m, b);
    assert_memory_equal(a, b, want * sizeof(float));
    gr_model_destroy(m);
    c.seed = 2;
    assert_int_equal(gr_model_create(&c, &m), GR_OK);
    gr_model_init_dense(m, b);
    assert_true(memcmp(a, b, want * sizeof(float)) != 0);
    gr_model_destroy(m);
    free(a);
    free(b);

    uint32_t sizes[GR_MODEL_MAX_LAYERS], n;
    assert_int_equal(gr_model_parse_layers("512,256,64", sizes, &n), GR_OK);
    assert_int_equal(n, 3);
    assert_int_equal(sizes[2], 64);
    assert_int_equal(gr_model_parse_layers("", sizes, &n), GR_OK);
    assert_int_equal(n, 0);
    assert_int_equal(gr_model_parse_layers("12,x", sizes, &n), GR_EINVAL);
    assert_int_equal(gr_model_parse_layers("0", sizes, &n), GR_EINVAL);
    assert_int_equal(gr_model_parse_layers("1,2,3,4,5,6,7,8,9", sizes, &n), GR_EINVAL);
    c.dim = 0;
    assert_int_equal(gr_model_create(&c, &m), GR_EINVAL);
    gr_model_destroy(NULL);
    gr_model_ws_destroy(NULL);

    /* No hidden layers at all still works (13-d bottom, (d+351)-1 top). */
    gr_model_config_default(&c, GR_MODEL_DLRM);
    c.n_bottom = c.n_top = 0;
    c.dim = 2;
    fixture f;
    fixture_init(&f, &c, 2, 3);
    assert_int_equal(f.np, (13 * 2 + 2) + (353 + 1));
    double loss;
    assert_int_equal(gr_model_train_step(f.m, f.ws, f.params, 2, f.dense, f.emb, f.labels,
                                         &loss, NULL, f.gp, f.ge),
                     GR_OK);
    float *gp = malloc(f.np * sizeof(float));
    memcpy(gp, f.gp, f.np * sizeof(float));
    check_grad(&f, f.params, gp, f.np, "flat");
    free(gp);
    fixture_fini(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dlrm_gradcheck),
        cmocka_unit_test(test_lr_gradcheck),
        cmocka_unit_test(test_batch_mean_and_predict),
        cmocka_unit_test(test_config_and_init),
        cmocka_unit_test(test_prepared_bitwise),
        cmocka_unit_test(test_gemv_search_bounds),
    };
    return cmocka_run_group_tests_name("train_model", tests, NULL, NULL);
}
