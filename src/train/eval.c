/* Scoring a file with the current parameters: W threads over byte ranges, then exact AUC. The
 * file is read with the model's schema; a file with no valid example (or too few) is an error,
 * not an AUC of nothing. */
#include "train/trainer_int.h"

#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct eval_part {
    const gr_model *m;
    gr_train_backend *be;
    uint32_t table;
    const char *path;
    size_t batch;
    uint64_t start, end, first_line;
    const tr_bags *bags;
    tr_badlog *log;
    float *probs, *labels;
    size_t n, cap;
    int rc;
    char errmsg[512];
} eval_part;

static int eval_range(eval_part *p)
{
    const gr_model *m = p->m;
    uint32_t d = gr_model_emb_dim(m);
    const gr_schema *schema = gr_model_schema(m);
    size_t np = gr_model_dense_size(m), occ = p->batch * gr_schema_max_ids(schema) + 1,
           slots = p->batch * gr_model_n_sparse(m) + 1;
    gr_criteo_opts ro;
    gr_criteo_opts_default(&ro);
    ro.batch = p->batch;
    ro.start = p->start;
    ro.end = p->end;
    ro.first_line = p->first_line;
    ro.schema = schema;
    ro.on_bad = tr_badlog_on_bad;
    ro.on_bad_ctx = p->log;
    gr_criteo_reader *r = NULL;
    gr_model_ws *ws = NULL;
    gr_dedup_scratch ds = {0};
    gr_batch b = {0};
    float *params = malloc(np * sizeof *params), *rows = malloc(occ * d * sizeof *rows),
          *emb = malloc(slots * d * sizeof *emb);
    uint64_t *uniq = malloc(occ * sizeof *uniq);
    uint32_t *inv = malloc(occ * sizeof *inv);
    int rc;
    if (!params || !rows || !emb || !uniq || !inv) {
        rc = gr_seterr(GR_ENOMEM, "evaluate: out of memory");
        goto out;
    }
    if ((rc = gr_batch_init_schema(&b, p->batch, schema)) || (rc = gr_model_ws_create(m, &ws)))
        goto out;
    if ((rc = p->be->dense_pull(p->be->ctx, gr_model_dense_name(m), params, np))) goto out;
    if ((rc = gr_criteo_open(p->path, &ro, &r))) goto out;
    for (;;) {
        if ((rc = gr_criteo_next(r, &b)) || b.n == 0) break;
        long nu = gr_dedup(b.ids, b.n_ids, uniq, inv, &ds);
        if (nu < 0) {
            rc = (int)nu;
            break;
        }
        rc = p->be->pull(p->be->ctx, p->table, uniq, (size_t)nu, rows, GR_PULL_READONLY);
        if (rc) break;
        tr_bags_gather(p->bags, &b, rows, inv, d, emb);
        if (p->n + b.n > p->cap) {
            size_t cap = p->cap ? p->cap * 2 : 65536;
            while (cap < p->n + b.n) cap *= 2;
            float *np1 = realloc(p->probs, cap * sizeof *np1);
            if (np1) p->probs = np1;
            float *nl = realloc(p->labels, cap * sizeof *nl);
            if (nl) p->labels = nl;
            if (!np1 || !nl) {
                rc = gr_seterr(GR_ENOMEM, "evaluate: out of memory");
                break;
            }
            p->cap = cap;
        }
        if ((rc = gr_model_predict(m, ws, params, b.n, b.dense, emb, p->probs + p->n))) break;
        memcpy(p->labels + p->n, b.labels, b.n * sizeof *p->labels);
        p->n += b.n;
    }
out:
    if (r) {
        gr_criteo_stats st;
        gr_criteo_get_stats(r, &st);
        tr_badlog_add(p->log, &st);
    }
    gr_criteo_close(r);
    gr_model_ws_destroy(ws);
    gr_dedup_scratch_fini(&ds);
    gr_batch_fini(&b);
    free(params);
    free(rows);
    free(emb);
    free(uniq);
    free(inv);
    return rc;
}

static void *eval_main(void *arg)
{
    eval_part *p = arg;
    p->rc = eval_range(p);
    if (p->rc) snprintf(p->errmsg, sizeof p->errmsg, "%s", gr_errmsg());
    return NULL;
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
    if (!threads) threads = 1;
    if (threads > 64) threads = 64;
    if (!batch) batch = 1024;
    uint64_t off[65], first[65];
    int rc = gr_criteo_split(path, threads, off, first);
    if (rc) return rc;
    tr_bags bags;
    if ((rc = tr_bags_init(&bags, gr_model_schema(m)))) return rc;
    tr_badlog log;
    tr_badlog_init(&log, path, "test");
    eval_part parts[64];
    pthread_t tids[64];
    unsigned started = 0;
    for (unsigned i = 0; i < threads; i++) {
        parts[i] = (eval_part){.m = m, .be = be, .table = table, .path = path, .batch = batch,
                               .start = off[i], .end = off[i + 1], .first_line = first[i],
                               .bags = &bags, .log = &log};
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
    }
    if (!rc && !(rc = tr_badlog_check(&log, min_valid)) && log.good + log.bad == 0)
        rc = gr_seterr(GR_ECORRUPT, "%s has no examples: it is empty", path);
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
        rc = gr_auc(probs, labels, n, auc);
        *logloss = gr_logloss(probs, labels, n);
        *examples = n;
    }
    for (unsigned i = 0; i < threads; i++) {
        free(parts[i].probs);
        free(parts[i].labels);
    }
    free(probs);
    free(labels);
    tr_bags_fini(&bags);
    tr_badlog_fini(&log);
    return rc;
}

