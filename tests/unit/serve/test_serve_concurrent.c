/* The replica under concurrent reads and heavy updates (run under TSan by .ci/run): one thread
 * applies publications as fast as it can (every row of a publication holds its version in
 * every element, the dense parameters all hold version / 10000) while readers look rows up and
 * score. A reader must never see a torn row (elements of two versions), a row going back in
 * version, or a score whose dense parameters mix two versions; with DLRM, one-example scores
 * (prepared weights) stay bitwise those of one version while versions are swapped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "granary/serve.h"

#define DIM 8
#define KEYS 2000
#define VERSIONS 300
#define READERS 3

typedef struct shared {
    gr_serve *s;
    atomic_bool done;
    atomic_int torn, backwards, mixed, reads, scores;
} shared;

static void *writer(void *arg)
{
    shared *sh = arg;
    uint64_t *keys = malloc(KEYS * sizeof *keys);
    float *rows = malloc((size_t)KEYS * DIM * sizeof *rows);
    size_t np = gr_model_dense_size(gr_serve_model(sh->s));
    float *params = malloc(np * sizeof *params);
    for (int k = 0; k < KEYS; k++) keys[k] = (uint64_t)k * 7919u;
    for (uint64_t v = 1; v <= VERSIONS; v++) {
        for (size_t i = 0; i < (size_t)KEYS * DIM; i++) rows[i] = (float)v;
        gr_serve_put_rows(sh->s, 3, DIM, keys, KEYS, rows, v);
        for (size_t i = 0; i < np; i++) params[i] = (float)v / 10000.0f;
        gr_serve_set_dense(sh->s, params, np, v);
    }
    atomic_store(&sh->done, true);
    free(keys), free(rows), free(params);
    return NULL;
}

static void *reader(void *arg)
{
    shared *sh = arg;
    uint64_t keys[64];
    float out[64 * DIM], last[64] = {0};
    float dense[GR_CRITEO_DENSE];
    uint64_t ids[GR_CRITEO_SPARSE];
    for (int i = 0; i < GR_CRITEO_DENSE; i++) dense[i] = 1.0f;
    for (int i = 0; i < GR_CRITEO_SPARSE; i++) ids[i] = 1; /* no row: reads zeros */
    for (int i = 0; i < 64; i++) keys[i] = (uint64_t)(i * 31) * 7919u;
    while (!atomic_load(&sh->done)) {
        if (gr_serve_lookup(sh->s, 3, keys, 64, out, NULL) == GR_OK) {
            for (int i = 0; i < 64; i++) {
                for (int j = 1; j < DIM; j++)
                    if (out[i * DIM + j] != out[i * DIM]) atomic_fetch_add(&sh->torn, 1);
                if (out[i * DIM] < last[i]) atomic_fetch_add(&sh->backwards, 1);
                last[i] = out[i * DIM];
            }
            atomic_fetch_add(&sh->reads, 1);
        }
        float p;
        if (gr_serve_predict(sh->s, 1, dense, ids, &p, NULL) == GR_OK) {
            /* LR: logit = 13 w + b with every parameter v / 10000, so logit * 10000 / 14 is a
             * whole number; parameters of two versions would put it k/14 off one. */
            double x = log((double)p / (1.0 - (double)p)) * 10000.0 / 14.0;
            if (fabs(x - round(x)) > 0.02) atomic_fetch_add(&sh->mixed, 1);
            atomic_fetch_add(&sh->scores, 1);
        }
    }
    return NULL;
}

static void test_reads_during_updates(void **state)
{
    (void)state;
    gr_model_config mc;
    gr_model_config_default(&mc, GR_MODEL_LR);
    gr_serve_config cfg;
    gr_serve_config_default(&cfg);
    cfg.model = &mc;
    shared sh = {0};
    assert_int_equal(gr_serve_create(&cfg, &sh.s), GR_OK);
    pthread_t w, r[READERS];
    for (int i = 0; i < READERS; i++) pthread_create(&r[i], NULL, reader, &sh);
    pthread_create(&w, NULL, writer, &sh);
    pthread_join(w, NULL);
    for (int i = 0; i < READERS; i++) pthread_join(r[i], NULL);
    assert_int_equal(atomic_load(&sh.torn), 0);
    assert_int_equal(atomic_load(&sh.backwards), 0);
    assert_int_equal(atomic_load(&sh.mixed), 0);
    assert_true(atomic_load(&sh.reads) > 0);
    assert_true(atomic_load(&sh.scores) > 0);
    gr_serve_stats st;
    gr_serve_get_stats(sh.s, &st);
    assert_int_equal(st.model_version, VERSIONS);
    assert_int_equal(st.rows, KEYS);
    gr_serve_destroy(sh.s);
}

/* DLRM: readers score one example (the prepared weights of the version they hold) while a
 * writer installs new dense versions, each prepared as it arrives. Every score must be,
 * bit for bit, the plain forward pass's score under one of the versions. */
#define DLRM_VERSIONS 40

typedef struct dlrm_shared {
    gr_serve *s;
    float **params; /* per version */
    float expected[DLRM_VERSIONS + 1];
    atomic_bool done;
    atomic_int unknown, scores;
} dlrm_shared;

static void *dlrm_writer(void *arg)
{
    dlrm_shared *sh = arg;
    size_t np = gr_model_dense_size(gr_serve_model(sh->s));
    for (int v = 1; v <= DLRM_VERSIONS; v++) gr_serve_set_dense(sh->s, sh->params[v], np, (uint64_t)v);
    atomic_store(&sh->done, true);
    return NULL;
}

static void *dlrm_reader(void *arg)
{
    dlrm_shared *sh = arg;
    float dense[GR_CRITEO_DENSE];
    uint64_t ids[GR_CRITEO_SPARSE];
    for (int i = 0; i < GR_CRITEO_DENSE; i++) dense[i] = (float)i * 0.5f;
    for (int i = 0; i < GR_CRITEO_SPARSE; i++) ids[i] = 1; /* no row: reads zeros */
    while (!atomic_load(&sh->done)) {
        float p;
        if (gr_serve_predict(sh->s, 1, dense, ids, &p, NULL) != GR_OK) continue;
        bool known = false;
        for (int v = 1; v <= DLRM_VERSIONS && !known; v++) known = !memcmp(&p, &sh->expected[v], sizeof p);
        if (!known) atomic_fetch_add(&sh->unknown, 1);
        atomic_fetch_add(&sh->scores, 1);
    }
    return NULL;
}

static void test_dlrm_scores_during_dense_swaps(void **state)
{
    (void)state;
    gr_model_config mc;
    gr_model_config_default(&mc, GR_MODEL_DLRM);
    gr_serve_config cfg;
    gr_serve_config_default(&cfg);
    cfg.model = &mc;
    dlrm_shared sh = {0};
    assert_int_equal(gr_serve_create(&cfg, &sh.s), GR_OK);
    const gr_model *m = gr_serve_model(sh.s);
    size_t np = gr_model_dense_size(m);
    gr_model_ws *ws;
    assert_int_equal(gr_model_ws_create(m, &ws), GR_OK);
    float dense[GR_CRITEO_DENSE], emb[GR_CRITEO_SPARSE * 16] = {0};
    for (int i = 0; i < GR_CRITEO_DENSE; i++) dense[i] = (float)i * 0.5f;
    sh.params = calloc(DLRM_VERSIONS + 1, sizeof *sh.params);
    for (int v = 1; v <= DLRM_VERSIONS; v++) {
        sh.params[v] = malloc(np * sizeof(float));
        gr_model_init_dense(m, sh.params[v]);
        for (size_t i = 0; i < np; i++) sh.params[v][i] *= 1.0f + (float)v / 64.0f;
        assert_int_equal(gr_model_predict(m, ws, sh.params[v], 1, dense, emb, &sh.expected[v]), GR_OK);
    }
    gr_serve_set_dense(sh.s, sh.params[1], np, 1);
    pthread_t w, r[READERS];
    for (int i = 0; i < READERS; i++) pthread_create(&r[i], NULL, dlrm_reader, &sh);
    pthread_create(&w, NULL, dlrm_writer, &sh);
    pthread_join(w, NULL);
    for (int i = 0; i < READERS; i++) pthread_join(r[i], NULL);
    assert_int_equal(atomic_load(&sh.unknown), 0);
    assert_true(atomic_load(&sh.scores) > 0);
    for (int v = 1; v <= DLRM_VERSIONS; v++) free(sh.params[v]);
    free(sh.params);
    gr_model_ws_destroy(ws);
    gr_serve_destroy(sh.s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_reads_during_updates),
                                       cmocka_unit_test(test_dlrm_scores_during_dense_swaps)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
