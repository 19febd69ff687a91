/* Unit tests of the replica's apply rules: a row or dense version is written only when newer
 * than the replica's copy, so replaying a publication or delivering two out of order ends in
 * the same state as delivering them once in order; f16 rows; dense parameters of the wrong
 * size or not finite are refused; predict reads missing rows as zeros and reports the version;
 * one-example DLRM scores keep the trainer's forward pass's bits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "granary/serve.h"

static gr_serve *lr_replica(void)
{
    gr_model_config mc;
    gr_model_config_default(&mc, GR_MODEL_LR);
    gr_serve_config cfg;
    gr_serve_config_default(&cfg);
    cfg.model = &mc;
    gr_serve *s = NULL;
    assert_int_equal(gr_serve_create(&cfg, &s), GR_OK);
    return s;
}

/* A publication of table 3 (dim 2): rows key k = {val, val} for the given keys. */
static void pub(gr_proto_buf *b, uint64_t seq, uint64_t version, const uint64_t *keys, size_t n,
                float val, bool f16)
{
    gr_proto_buf_init(b);
    gr_proto_publication h = {.epoch = 1, .seq = seq, .version = version,
                              .kind = GR_PROTO_PUB_DELTA, .f16 = f16, .nsparse = 1};
    assert_int_equal(gr_proto_put_pub_head(b, &h), GR_OK);
    uint64_t *k;
    void *v;
    assert_int_equal(gr_proto_put_pub_section(b, 3, 2, (uint32_t)n, f16, &k, &v), GR_OK);
    memcpy(k, keys, n * 8);
    for (size_t i = 0; i < 2 * n; i++) {
        if (f16) ((uint16_t *)v)[i] = gr_f32_to_f16(val);
        else ((float *)v)[i] = val;
    }
}

static void apply(gr_serve *s, const gr_proto_buf *b)
{
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    gr_proto_publication p;
    assert_int_equal(gr_proto_decode_publication(b->data, b->len, &lim, &p), GR_OK);
    assert_int_equal(gr_serve_apply(s, &p), GR_OK);
    gr_proto_publication_fini(&p);
}

static void rows_of(gr_serve *s, const uint64_t *keys, size_t n, float *out)
{
    bool found[8];
    assert_int_equal(gr_serve_lookup(s, 3, keys, n, out, found), GR_OK);
}

static void test_replay_and_reorder(void **state)
{
    (void)state;
    uint64_t k1[] = {1, 2}, k2[] = {2, 3}, all[] = {1, 2, 3};
    gr_proto_buf a, b;
    pub(&a, 1, 100, k1, 2, 1.0f, false);
    pub(&b, 2, 200, k2, 2, 2.0f, false);
    float want[6] = {1, 1, 2, 2, 2, 2}, got[6];

    gr_serve *in_order = lr_replica();
    apply(in_order, &a);
    apply(in_order, &b);
    rows_of(in_order, all, 3, got);
    assert_memory_equal(got, want, sizeof want);

    /* Reversed, and each delivered twice: the same rows. */
    gr_serve *rev = lr_replica();
    apply(rev, &b);
    apply(rev, &a);
    apply(rev, &b);
    apply(rev, &a);
    rows_of(rev, all, 3, got);
    assert_memory_equal(got, want, sizeof want);
    gr_serve_stats st;
    gr_serve_get_stats(rev, &st);
    /* b: 2 written; a: key 1 written, key 2 older; b again: both equal; a again: both. */
    assert_int_equal(st.rows_applied, 3);
    assert_int_equal(st.rows_ignored, 5);
    assert_int_equal(st.model_version, 200);
    gr_serve_destroy(in_order);
    gr_serve_destroy(rev);
    gr_proto_buf_fini(&a);
    gr_proto_buf_fini(&b);
}

static void test_f16_rows(void **state)
{
    (void)state;
    gr_serve *s = lr_replica();
    uint64_t k[] = {9};
    gr_proto_buf a;
    pub(&a, 1, 5, k, 1, 0.333f, true);
    apply(s, &a);
    float got[2];
    rows_of(s, k, 1, got);
    assert_true(got[0] == gr_f16_to_f32(gr_f32_to_f16(0.333f)) && got[0] != 0.333f);
    gr_proto_buf_fini(&a);
    gr_serve_destroy(s);
}

static void test_dense_versions_and_predict(void **state)
{
    (void)state;
    gr_serve *s = lr_replica();
    const gr_model *m = gr_serve_model(s);
    size_t np = gr_model_dense_size(m);
    float dense[GR_CRITEO_DENSE] = {0};
    uint64_t ids[GR_CRITEO_SPARSE];
    for (int i = 0; i < GR_CRITEO_SPARSE; i++) ids[i] = 1000 + (uint64_t)i;
    float prob;
    /* No dense parameters yet: refused, not a crash. */
    assert_int_equal(gr_serve_predict(s, 1, dense, ids, &prob, NULL), GR_ENOENT);
    float *params = calloc(np, sizeof *params);
    assert_int_equal(gr_serve_set_dense(s, params, np - 1, 10), GR_EDIM);
    params[0] = NAN;
    assert_int_equal(gr_serve_set_dense(s, params, np, 10), GR_EINVAL);
    params[0] = 0;
    assert_int_equal(gr_serve_set_dense(s, params, np, 10), GR_OK);
    uint64_t ver = 0;
    assert_int_equal(gr_serve_predict(s, 1, dense, ids, &prob, &ver), GR_OK);
    assert_true(prob == 0.5f); /* all zeros: sigmoid(0) */
    assert_int_equal(ver, 10);
    /* An LR row of +1 for each of the 26 ids (rows missing read 0): sigmoid(26 + bias). */
    float ones[GR_CRITEO_SPARSE];
    for (int i = 0; i < GR_CRITEO_SPARSE; i++) ones[i] = 0.1f;
    assert_int_equal(gr_serve_put_rows(s, GR_TRAIN_EMB_TABLE, 1, ids, GR_CRITEO_SPARSE, ones, 20), GR_OK);
    assert_int_equal(gr_serve_predict(s, 1, dense, ids, &prob, &ver), GR_OK);
    assert_true(fabsf(prob - 1.0f / (1.0f + expf(-2.6f))) < 1e-5f);
    assert_int_equal(ver, 20);
    /* An older dense version is ignored. */
    for (size_t i = 0; i < np; i++) params[i] = 5;
    assert_int_equal(gr_serve_set_dense(s, params, np, 5), GR_OK);
    float again;
    assert_int_equal(gr_serve_predict(s, 1, dense, ids, &again, NULL), GR_OK);
    assert_true(again == prob);
    /* A row of another dim for the model's table is refused. */
    float wide[4] = {0};
    assert_int_equal(gr_serve_put_rows(s, GR_TRAIN_EMB_TABLE, 4, ids, 1, wide, 30), GR_EDIM);
    free(params);
    gr_serve_destroy(s);
}

/* A DLRM replica scoring one example per call (the prepared weights of its dense version)
 * gives bitwise what the trainer's forward pass gives for that example, before and after a
 * new dense version replaces the old one. */
static int replica_rows(void *ctx, const uint64_t *keys, size_t n, float *rows)
{
    gr_serve *s = ctx;
    bool found[64];
    for (size_t off = 0; off < n; off += 64) {
        size_t m = n - off < 64 ? n - off : 64;
        assert_int_equal(gr_serve_lookup(s, GR_TRAIN_EMB_TABLE, keys + off, m, rows + off * 16,
                                         found), GR_OK);
    }
    return GR_OK;
}

static void test_dlrm_one_example_bits(void **state)
{
    (void)state;
    gr_model_config mc;
    gr_model_config_default(&mc, GR_MODEL_DLRM);
    gr_serve_config cfg;
    gr_serve_config_default(&cfg);
    cfg.model = &mc;
    gr_serve *s = NULL;
    assert_int_equal(gr_serve_create(&cfg, &s), GR_OK);
    const gr_model *m = gr_serve_model(s);
    size_t np = gr_model_dense_size(m);
    float *params = malloc(np * sizeof *params);
    gr_model_init_dense(m, params);
    gr_rng r;
    gr_rng_seed(&r, 77);
    enum { N = 64, KEYS = 500 };
    uint64_t keys[KEYS];
    float rows[KEYS * 16];
    for (size_t i = 0; i < KEYS; i++) keys[i] = 1000 + i * 7919;
    for (size_t i = 0; i < KEYS * 16; i++) rows[i] = (float)(gr_rng_uniform(&r) - 0.5);
    assert_int_equal(gr_serve_put_rows(s, GR_TRAIN_EMB_TABLE, 16, keys, KEYS, rows, 1), GR_OK);
    float dense[N * GR_CRITEO_DENSE];
    uint64_t ids[N * GR_CRITEO_SPARSE];
    for (size_t i = 0; i < N * GR_CRITEO_DENSE; i++) dense[i] = (float)(4 * gr_rng_uniform(&r));
    for (size_t i = 0; i < N * GR_CRITEO_SPARSE; i++)
        ids[i] = i % 9 == 8 ? 99 : keys[gr_rng_next(&r) % KEYS]; /* 99: absent, reads zeros */
    gr_score_ws *ws;
    assert_int_equal(gr_score_ws_create(m, &ws), GR_OK);
    for (int version = 1; version <= 2; version++) {
        for (size_t i = 0; i < np; i++) params[i] += (float)(gr_rng_uniform(&r) - 0.5) * 0.05f;
        assert_int_equal(gr_serve_set_dense(s, params, np, (uint64_t)version), GR_OK);
        for (size_t i = 0; i < N; i++) {
            float got, want;
            uint64_t v;
            assert_int_equal(gr_serve_predict(s, 1, dense + i * GR_CRITEO_DENSE,
                                              ids + i * GR_CRITEO_SPARSE, &got, &v), GR_OK);
            assert_int_equal(gr_model_score(m, ws, params, replica_rows, s, 1,
                                            dense + i * GR_CRITEO_DENSE,
                                            ids + i * GR_CRITEO_SPARSE, &want), GR_OK);
            assert_memory_equal(&got, &want, sizeof got);
        }
    }
    gr_score_ws_destroy(ws);
    free(params);
    gr_serve_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_and_reorder),
        cmocka_unit_test(test_f16_rows),
        cmocka_unit_test(test_dense_versions_and_predict),
        cmocka_unit_test(test_dlrm_one_example_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
