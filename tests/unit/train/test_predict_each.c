/* gr_model_predict_each: n examples scored together, each bitwise what it gets scored alone
 * (gr_model_predict_prepared and gr_model_predict with n = 1), for every n from 1 to 20 and
 * every position of an example in the batch, for the default DLRM, one of odd shapes (a top
 * input OpenBLAS cuts into two K blocks, widths off every 16 and 64) and LR; the same through
 * gr_model_score with gr_score_ws_set_each; and its refusal without weights prepared from the
 * parameters it is given. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "granary/train.h"

#define NS GR_CRITEO_SPARSE
#define ND GR_CRITEO_DENSE
#define MAXN 20

typedef struct fixture {
    gr_model *m;
    gr_model_ws *ws;
    gr_model_prepared *prep;
    size_t np, d;
    float *params, *dense, *emb;
} fixture;

static void fixture_init(fixture *f, const gr_model_config *c, uint64_t seed)
{
    memset(f, 0, sizeof *f);
    assert_int_equal(gr_model_create(c, &f->m), GR_OK);
    assert_int_equal(gr_model_ws_create(f->m, &f->ws), GR_OK);
    f->np = gr_model_dense_size(f->m);
    f->d = gr_model_emb_dim(f->m);
    f->params = malloc(f->np * sizeof(float));
    f->dense = malloc(MAXN * ND * sizeof(float));
    f->emb = malloc(MAXN * NS * f->d * sizeof(float));
    gr_model_init_dense(f->m, f->params);
    gr_rng r;
    gr_rng_seed(&r, seed);
    for (size_t i = 0; i < f->np; i++) f->params[i] += (float)(gr_rng_uniform(&r) - 0.5) * 0.1f;
    /* Dense features with zeros (a ReLU's and Criteo's), embeddings of mixed signs. */
    for (size_t i = 0; i < MAXN * ND; i++)
        f->dense[i] = i % 7 == 3 ? 0.0f : (float)(3 * gr_rng_uniform(&r));
    for (size_t i = 0; i < MAXN * NS * f->d; i++) f->emb[i] = (float)(gr_rng_uniform(&r) - 0.5);
    assert_int_equal(gr_model_prepare(f->m, f->params, &f->prep), GR_OK);
}

static void fixture_fini(fixture *f)
{
    gr_model_prepared_destroy(f->prep);
    gr_model_ws_destroy(f->ws);
    gr_model_destroy(f->m);
    free(f->params), free(f->dense), free(f->emb);
}

static void check_each(const gr_model_config *c, uint64_t seed)
{
    fixture f;
    fixture_init(&f, c, seed);
#if defined(__x86_64__)
    /* The multi-example kernel is really taken on a CPU with FMA. */
    if (c->kind == GR_MODEL_DLRM && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        assert_int_equal(gr_model_prepared_layers(f.prep), (int)(c->n_bottom + 1 + c->n_top + 1));
#endif
    /* Each example alone, both ways. */
    float alone[MAXN], plain[MAXN], got[MAXN];
    for (size_t i = 0; i < MAXN; i++) {
        const float *dense = f.dense + i * ND, *emb = f.emb + i * NS * f.d;
        assert_int_equal(gr_model_predict_prepared(f.m, f.ws, f.params, f.prep, 1, dense, emb,
                                                   &alone[i]), GR_OK);
        assert_int_equal(gr_model_predict(f.m, f.ws, f.params, 1, dense, emb, &plain[i]), GR_OK);
    }
    assert_memory_equal(alone, plain, sizeof alone);
    /* Every n from the first example, and every n ending at the last (each example in
     * every position of a batch); the workspace reused across sizes as a replica does. */
    size_t differ = 0;
    for (size_t n = 1; n <= MAXN; n++) {
        for (int from_end = 0; from_end < 2; from_end++) {
            const size_t at = from_end ? MAXN - n : 0;
            memset(got, 0x7f, sizeof got);
            assert_int_equal(gr_model_predict_each(f.m, f.ws, f.params, f.prep, n,
                                                   f.dense + at * ND, f.emb + at * NS * f.d, got),
                             GR_OK);
            differ += memcmp(got, alone + at, n * sizeof *got) != 0;
        }
    }
    assert_int_equal(differ, 0);
    fixture_fini(&f);
}

static void test_each_dlrm_default(void **state)
{
    (void)state;
    gr_model_config c;
    gr_model_config_default(&c, GR_MODEL_DLRM);
    check_each(&c, 31);
}

static void test_each_dlrm_odd(void **state)
{
    (void)state;
    gr_model_config c;
    gr_model_config_default(&c, GR_MODEL_DLRM);
    c.dim = 32; /* top input 32 + 27 * 26 / 2 = 383: two K blocks in OpenBLAS */
    c.bottom[0] = 24;
    c.bottom[1] = 70;
    c.n_bottom = 2;
    c.top[0] = 200;
    c.top[1] = 37;
    c.top[2] = 65;
    c.n_top = 3;
    check_each(&c, 32);
}

static void test_each_lr(void **state)
{
    (void)state;
    gr_model_config c;
    gr_model_config_default(&c, GR_MODEL_LR);
    check_each(&c, 33);
}

/* No prepared weights, or weights prepared from other parameters: a clear refusal that
 * writes nothing. */
static void test_each_refuses_without_prep(void **state)
{
    (void)state;
    gr_model_config c;
    gr_model_config_default(&c, GR_MODEL_DLRM);
    fixture f;
    fixture_init(&f, &c, 34);
    float got[2] = {-1.0f, -1.0f};
    assert_int_equal(gr_model_predict_each(f.m, f.ws, f.params, NULL, 2, f.dense, f.emb, got),
                     GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "no prepared weights"));
    float *other = malloc(f.np * sizeof *other);
    memcpy(other, f.params, f.np * sizeof *other);
    assert_int_equal(gr_model_predict_each(f.m, f.ws, other, f.prep, 2, f.dense, f.emb, got),
                     GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "other parameters"));
    assert_true(got[0] == -1.0f && got[1] == -1.0f);
    free(other);
    fixture_fini(&f);
}

/* A row source: key k's row is a function of k alone. */
static int rows_of_keys(void *ctx, const uint64_t *keys, size_t n, float *rows)
{
    const size_t d = *(const size_t *)ctx;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < d; j++)
            rows[i * d + j] = (float)((keys[i] * 2654435761u + j * 40503u) % 1000) / 1000.0f - 0.5f;
    return GR_OK;
}

/* gr_model_score with set_each over n examples (ids shared between them: the dedup runs over
 * the whole batch) gives what n single calls give. */
static void check_score_each(const gr_model_config *c, uint64_t seed)
{
    fixture f;
    fixture_init(&f, c, seed);
    uint64_t ids[MAXN * NS];
    gr_rng r;
    gr_rng_seed(&r, seed + 1);
    for (size_t i = 0; i < MAXN * NS; i++) ids[i] = gr_rng_next(&r) % 97; /* many repeats */
    gr_score_ws *one, *each;
    assert_int_equal(gr_score_ws_create(f.m, &one), GR_OK);
    assert_int_equal(gr_score_ws_create(f.m, &each), GR_OK);
    gr_score_ws_set_prepared(one, f.prep);
    gr_score_ws_set_prepared(each, f.prep);
    gr_score_ws_set_each(each, true);
    float alone[MAXN], got[MAXN];
    for (size_t i = 0; i < MAXN; i++)
        assert_int_equal(gr_model_score(f.m, one, f.params, rows_of_keys, &f.d, 1, f.dense + i * ND,
                                        ids + i * NS, &alone[i]), GR_OK);
    for (size_t n = 1; n <= MAXN; n++) {
        memset(got, 0x7f, sizeof got);
        assert_int_equal(gr_model_score(f.m, each, f.params, rows_of_keys, &f.d, n, f.dense, ids,
                                        got), GR_OK);
        assert_memory_equal(got, alone, n * sizeof *got);
    }
    /* Scoring with other parameters than the prepared ones is refused, not silently mixed. */
    float *other = malloc(f.np * sizeof *other);
    memcpy(other, f.params, f.np * sizeof *other);
    assert_int_equal(gr_model_score(f.m, each, other, rows_of_keys, &f.d, 2, f.dense, ids, got),
                     GR_EINVAL);
    /* Cleared, the workspace scores as before (the batch path). */
    gr_score_ws_set_each(each, false);
    assert_int_equal(gr_model_score(f.m, each, other, rows_of_keys, &f.d, 2, f.dense, ids, got),
                     GR_OK);
    free(other);
    gr_score_ws_destroy(one);
    gr_score_ws_destroy(each);
    fixture_fini(&f);
}

static void test_score_each(void **state)
{
    (void)state;
    gr_model_config c;
    gr_model_config_default(&c, GR_MODEL_DLRM);
    check_score_each(&c, 41);
    gr_model_config_default(&c, GR_MODEL_LR);
    check_score_each(&c, 42);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_dlrm_default),
        cmocka_unit_test(test_each_dlrm_odd),
        cmocka_unit_test(test_each_lr),
        cmocka_unit_test(test_each_refuses_without_prep),
        cmocka_unit_test(test_score_each),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
