/* Scoring a batch: dedup the ids, fetch the unique rows from a row source, gather them into
 * each sparse slot's vector (list columns' bags pooled as in training) and run the model
 * forward. The trainer's evaluation, saved models and serving share this one path, so a model
 * scores bitwise the same wherever it runs. */
#include "train/trainer_int.h"

#include <stdlib.h>
#include <string.h>

struct gr_score_ws {
    const gr_model *m;
    gr_model_ws *mws;
    tr_bags bags;
    gr_dedup_scratch ds;
    size_t cap; /* examples the buffers hold */
    uint64_t *uniq;
    uint32_t *inv;
    float *rows, *emb;
    const gr_model_prepared *prep; /* gr_score_ws_set_prepared */
    bool each;                     /* gr_score_ws_set_each */
};

void gr_score_ws_set_prepared(gr_score_ws *ws, const gr_model_prepared *prep) { ws->prep = prep; }
void gr_score_ws_set_each(gr_score_ws *ws, bool each) { ws->each = each; }

int gr_score_ws_create(const gr_model *m, gr_score_ws **out)
{
    *out = NULL;
    gr_score_ws *ws = calloc(1, sizeof *ws);
    if (!ws) return gr_seterr(GR_ENOMEM, "cannot allocate a scoring workspace");
    ws->m = m;
    int rc = gr_model_ws_create(m, &ws->mws);
    if (!rc) rc = tr_bags_init(&ws->bags, gr_model_schema(m) ? gr_model_schema(m) : gr_schema_criteo());
    if (rc) {
        gr_model_ws_destroy(ws->mws);
        free(ws);
        return rc;
    }
    /* A model of bare shapes (no schema) has one id per sparse input. */
    ws->bags.ns = gr_model_n_sparse(m);
    *out = ws;
    return GR_OK;
}

void gr_score_ws_destroy(gr_score_ws *ws)
{
    if (!ws) return;
    gr_model_ws_destroy(ws->mws);
    tr_bags_fini(&ws->bags);
    gr_dedup_scratch_fini(&ws->ds);
    free(ws->uniq);
    free(ws->inv);
    free(ws->rows);
    free(ws->emb);
    free(ws);
}

static int reserve(gr_score_ws *ws, size_t n)
{
    if (n <= ws->cap) return GR_OK;
    const gr_schema *s = gr_model_schema(ws->m);
    size_t per = s ? gr_schema_max_ids(s) : gr_model_n_sparse(ws->m);
    size_t occ = n * per + 1, slots = n * gr_model_n_sparse(ws->m) + 1, d = gr_model_emb_dim(ws->m);
    uint64_t *u = realloc(ws->uniq, occ * sizeof *u);
    if (u) ws->uniq = u;
    uint32_t *iv = realloc(ws->inv, occ * sizeof *iv);
    if (iv) ws->inv = iv;
    float *r = realloc(ws->rows, occ * d * sizeof *r);
    if (r) ws->rows = r;
    float *e = realloc(ws->emb, slots * d * sizeof *e);
    if (e) ws->emb = e;
    if (!u || !iv || !r || !e) return gr_seterr(GR_ENOMEM, "scoring: out of memory for %zu examples", n);
    ws->cap = n;
    return GR_OK;
}

int gr_model_score_batch(const gr_model *m, gr_score_ws *ws, const float *params,
                         gr_rows_fn rows, void *ctx, const gr_batch *b, float *probs)
{
    if (!ws || ws->m != m) return gr_seterr(GR_EINVAL, "scoring: the workspace is another model's");
    if (b->n_dense != gr_model_n_dense(m) || b->n_sparse != gr_model_n_sparse(m) ||
        (ws->bags.on && !b->bag_off))
        return gr_seterr(GR_EINVAL, "scoring: a batch of %u dense and %u sparse inputs%s, the "
                         "model takes %u and %u%s", b->n_dense, b->n_sparse,
                         b->bag_off ? " with bags" : "", gr_model_n_dense(m), gr_model_n_sparse(m),
                         ws->bags.on ? " with bags" : "");
    if (b->n == 0) return GR_OK;
    int rc = reserve(ws, b->n);
    if (rc) return rc;
    long nu = gr_dedup(b->ids, b->n_ids, ws->uniq, ws->inv, &ws->ds);
    if (nu < 0) return (int)nu;
    if ((rc = rows(ctx, ws->uniq, (size_t)nu, ws->rows))) return rc;
    tr_bags_gather(&ws->bags, b, ws->rows, ws->inv, gr_model_emb_dim(m), ws->emb);
    if (ws->each && ws->prep)
        return gr_model_predict_each(m, ws->mws, params, ws->prep, b->n, b->dense, ws->emb, probs);
    return gr_model_predict_prepared(m, ws->mws, params, ws->prep, b->n, b->dense, ws->emb,
                                     probs);
}

int gr_model_score(const gr_model *m, gr_score_ws *ws, const float *params, gr_rows_fn rows,
                   void *ctx, size_t n, const float *dense, const uint64_t *ids, float *probs)
{
    if (ws && ws->bags.on)
        return gr_seterr(GR_EINVAL, "scoring: the model's schema has list columns: score a "
                         "gr_batch with its bags (gr_model_score_batch)");
    /* A view of the arrays as a batch without bags: one id per sparse input. */
    gr_batch b = {.n = n, .cap = n, .dense = (float *)dense, .ids = (uint64_t *)ids,
                  .n_dense = gr_model_n_dense(m), .n_sparse = gr_model_n_sparse(m),
                  .n_ids = n * gr_model_n_sparse(m)};
    return gr_model_score_batch(m, ws, params, rows, ctx, &b, probs);
}
