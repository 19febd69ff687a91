/* Scoring a batch: dedup the ids, fetch the unique rows from a row source, scatter them to
 * the occurrences and run the model forward. The trainer's evaluation, saved models and
 * serving share this one path, so a model scores bitwise the same wherever it runs. */
#include "granary/train.h"

#include <stdlib.h>
#include <string.h>

struct gr_score_ws {
    const gr_model *m;
    gr_model_ws *mws;
    gr_dedup_scratch ds;
    size_t cap; /* examples the buffers hold */
    uint64_t *uniq;
    uint32_t *inv;
    float *rows, *emb;
};

int gr_score_ws_create(const gr_model *m, gr_score_ws **out)
{
    *out = NULL;
    gr_score_ws *ws = calloc(1, sizeof *ws);
    if (!ws) return gr_seterr(GR_ENOMEM, "cannot allocate a scoring workspace");
    ws->m = m;
    int rc = gr_model_ws_create(m, &ws->mws);
    if (rc) {
        free(ws);
        return rc;
    }
    *out = ws;
    return GR_OK;
}

void gr_score_ws_destroy(gr_score_ws *ws)
{
    if (!ws) return;
    gr_model_ws_destroy(ws->mws);
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
    size_t occ = n * GR_CRITEO_SPARSE, d = gr_model_emb_dim(ws->m);
    uint64_t *u = realloc(ws->uniq, occ * sizeof *u);
    if (u) ws->uniq = u;
    uint32_t *iv = realloc(ws->inv, occ * sizeof *iv);
    if (iv) ws->inv = iv;
    float *r = realloc(ws->rows, occ * d * sizeof *r);
    if (r) ws->rows = r;
    float *e = realloc(ws->emb, occ * d * sizeof *e);
    if (e) ws->emb = e;
    if (!u || !iv || !r || !e) return gr_seterr(GR_ENOMEM, "scoring: out of memory for %zu examples", n);
    ws->cap = n;
    return GR_OK;
}

int gr_model_score(const gr_model *m, gr_score_ws *ws, const float *params, gr_rows_fn rows,
                   void *ctx, size_t n, const float *dense, const uint64_t *ids, float *probs)
{
    if (!ws || ws->m != m) return gr_seterr(GR_EINVAL, "scoring: the workspace is another model's");
    if (n == 0) return GR_OK;
    int rc = reserve(ws, n);
    if (rc) return rc;
    size_t occ = n * GR_CRITEO_SPARSE, d = gr_model_emb_dim(m);
    long nu = gr_dedup(ids, occ, ws->uniq, ws->inv, &ws->ds);
    if (nu < 0) return (int)nu;
    if ((rc = rows(ctx, ws->uniq, (size_t)nu, ws->rows))) return rc;
    for (size_t i = 0; i < occ; i++)
        memcpy(ws->emb + i * d, ws->rows + (size_t)ws->inv[i] * d, d * sizeof *ws->emb);
    return gr_model_predict(m, ws->mws, params, n, dense, ws->emb, probs);
}
