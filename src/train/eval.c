/* Scoring a file with given parameters: W threads over byte ranges, each scoring its batches
 * through gr_model_score_batch, then exact AUC and logloss over the whole file. The trainer's
 * final evaluation and saved models (`granary eval`) both run this. The file is read with the
 * model's schema; a file with no valid example (or too few) is an error, not an AUC of
 * nothing. */
#include "train/trainer_int.h"

#include <cblas.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct eval_part {
    const gr_model *m;
    const float *params;
    gr_rows_fn rows;
    void *ctx;
    const char *path;
    size_t batch;
    uint64_t start, end, first_line;
    tr_badlog *log;
    float *probs, *labels;
    size_t n, cap;
    uint64_t bad_lines;
    int rc;
    char errmsg[512];
} eval_part;

static int grow(eval_part *p, size_t more)
{
    if (p->n + more <= p->cap) return GR_OK;
    size_t cap = p->cap ? p->cap * 2 : 65536;
    while (cap < p->n + more) cap *= 2;
    float *np1 = realloc(p->probs, cap * sizeof *np1);
    if (np1) p->probs = np1;
    float *nl = realloc(p->labels, cap * sizeof *nl);
    if (nl) p->labels = nl;
    if (!np1 || !nl) return gr_seterr(GR_ENOMEM, "evaluate: out of memory");
    p->cap = cap;
    return GR_OK;
}

static int eval_range(eval_part *p)
{
    gr_criteo_opts ro;
    gr_criteo_opts_default(&ro);
    ro.batch = p->batch;
    ro.start = p->start;
    ro.end = p->end;
    ro.first_line = p->first_line;
    ro.schema = gr_model_schema(p->m);
    ro.on_bad = tr_badlog_on_bad;
    ro.on_bad_ctx = p->log;
    gr_criteo_reader *r = NULL;
    gr_score_ws *ws = NULL;
    gr_batch b = {0};
    int rc;
    if ((rc = gr_batch_init_schema(&b, p->batch, ro.schema)) ||
        (rc = gr_score_ws_create(p->m, &ws)))
        goto out;
    if ((rc = gr_criteo_open(p->path, &ro, &r))) goto out;
    for (;;) {
        if ((rc = gr_criteo_next(r, &b)) || b.n == 0) break;
        if ((rc = grow(p, b.n))) break;
        rc = gr_model_score_batch(p->m, ws, p->params, p->rows, p->ctx, &b, p->probs + p->n);
        if (rc) break;
        memcpy(p->labels + p->n, b.labels, b.n * sizeof *p->labels);
        p->n += b.n;
    }
out:
    if (r) {
        gr_criteo_stats st;
        gr_criteo_get_stats(r, &st);
        p->bad_lines = st.bad_lines;
        tr_badlog_add(p->log, &st);
    }
    gr_criteo_close(r);
    gr_score_ws_destroy(ws);
    gr_batch_fini(&b);
    return rc;
}

static void *eval_main(void *arg)
{
    eval_part *p = arg;
    p->rc = eval_range(p);
    if (p->rc) snprintf(p->errmsg, sizeof p->errmsg, "%s", gr_errmsg());
    return NULL;
}

int tr_eval_file(const gr_model *m, const float *params, gr_rows_fn rows, void *ctx,
                 const char *path, size_t batch, unsigned threads, double min_valid,
                 bool want_probs, gr_eval_result *res)
{
    memset(res, 0, sizeof *res);
    res->auc = res->logloss = NAN;
    if (!gr_model_schema(m))
        return gr_seterr(GR_EINVAL, "evaluate: the model has no schema to read %s with", path);
    /* One BLAS thread, as in training: the ranges are the parallelism, and a multi-threaded
     * sgemm may sum in another order, so `granary eval` (a process that never trained) would
     * score a few probabilities an ulp away from the trainer's own evaluation. */
    gr_blas_one_thread();
    if (!threads) threads = 1;
    if (threads > 64) threads = 64;
    if (!batch) batch = 1024;
    uint64_t off[65], first[65];
    int rc = gr_criteo_split(path, threads, off, first);
    if (rc) return rc;
    tr_badlog log;
    tr_badlog_init(&log, path, "test");
    eval_part parts[64];
    pthread_t tids[64];
    unsigned started = 0;
    for (unsigned i = 0; i < threads; i++) {
        parts[i] = (eval_part){.m = m, .params = params, .rows = rows, .ctx = ctx, .path = path,
                               .batch = batch, .start = off[i], .end = off[i + 1],
                               .first_line = first[i], .log = &log};
    }
    for (unsigned i = 1; i < threads; i++, started++)
        if (pthread_create(&tids[i], NULL, eval_main, &parts[i]) != 0) {
            parts[i].rc = gr_seterr(GR_ENOMEM, "evaluate: cannot start a thread");
            snprintf(parts[i].errmsg, sizeof parts[i].errmsg, "%s", gr_errmsg());
            break;
        }
    eval_main(&parts[0]);
    for (unsigned i = 1; i <= started; i++) pthread_join(tids[i], NULL);
    size_t n = 0;
    for (unsigned i = 0; i < threads; i++) {
        if (parts[i].rc && !rc) rc = gr_seterr(parts[i].rc, "%s", parts[i].errmsg);
        n += parts[i].n;
        res->bad_lines += parts[i].bad_lines;
    }
    if (!rc && !(rc = tr_badlog_check(&log, min_valid)) && log.good + log.bad == 0)
        rc = gr_seterr(GR_ECORRUPT, "%s has no examples: it is empty", path);
    tr_badlog_fini(&log);
    float *probs = NULL, *labels = NULL;
    if (!rc && n) {
        probs = malloc(n * sizeof *probs);
        labels = malloc(n * sizeof *labels);
        if (!probs || !labels) rc = gr_seterr(GR_ENOMEM, "evaluate: out of memory");
    }
    if (!rc && n) {
        size_t at = 0;
        for (unsigned i = 0; i < threads; i++) {
            memcpy(probs + at, parts[i].probs, parts[i].n * sizeof *probs);
            memcpy(labels + at, parts[i].labels, parts[i].n * sizeof *labels);
            at += parts[i].n;
        }
        rc = gr_auc(probs, labels, n, &res->auc);
        res->logloss = gr_logloss(probs, labels, n);
        res->examples = n;
    }
    for (unsigned i = 0; i < threads; i++) {
        free(parts[i].probs);
        free(parts[i].labels);
    }
    if (!rc && want_probs) {
        res->probs = probs;
        probs = NULL;
    }
    free(probs);
    free(labels);
    return rc;
}

typedef struct be_rows {
    gr_train_backend *be;
    uint32_t table;
} be_rows;

/* Evaluation reads rows without creating any: unknown ids read zeros. */
static int backend_rows(void *ctx, const uint64_t *keys, size_t n, float *rows)
{
    be_rows *b = ctx;
    return b->be->pull(b->be->ctx, b->table, keys, n, rows, GR_PULL_READONLY);
}

int gr_train_evaluate(const gr_model *m, gr_train_backend *be, uint32_t table, const char *path,
                      size_t batch, unsigned threads, double *auc, double *logloss,
                      uint64_t *examples)
{
    return tr_evaluate(m, be, table, path, batch, threads, GR_TRAIN_MIN_VALID_DEFAULT, auc,
                       logloss, examples);
}

int tr_evaluate(const gr_model *m, gr_train_backend *be, uint32_t table, const char *path,
                size_t batch, unsigned threads, double min_valid, double *auc, double *logloss,
                uint64_t *examples)
{
    *auc = *logloss = NAN;
    *examples = 0;
    size_t np = gr_model_dense_size(m);
    float *params = malloc(np * sizeof *params);
    if (!params) return gr_seterr(GR_ENOMEM, "evaluate: out of memory");
    int rc = be->dense_pull(be->ctx, gr_model_dense_name(m), params, np);
    be_rows br = {be, table};
    gr_eval_result r;
    if (!rc)
        rc = tr_eval_file(m, params, backend_rows, &br, path, batch, threads, min_valid, false, &r);
    free(params);
    if (rc) return rc;
    *auc = r.auc;
    *logloss = r.logloss;
    *examples = r.examples;
    return GR_OK;
}
