/* Between a batch's ids and the model's one vector per sparse slot: the pulled rows of every
 * id are gathered into each slot's vector (a list column's bag pooled by sum or mean), and the
 * model's gradient per slot is spread back onto the rows (summed over duplicate ids). Without
 * list columns both are plain copies, exactly what the trainer always did for Criteo. */
#include "train/trainer_int.h"

#include <stdlib.h>
#include <string.h>

int tr_bags_init(tr_bags *g, const gr_schema *s)
{
    memset(g, 0, sizeof *g);
    g->ns = gr_schema_n_sparse(s);
    g->on = gr_schema_has_lists(s);
    if (!g->on) return GR_OK;
    g->mean = calloc(g->ns ? g->ns : 1, 1);
    if (!g->mean) return gr_seterr(GR_ENOMEM, "train: out of memory");
    for (uint32_t i = 0; i < gr_schema_n_columns(s); i++) {
        const gr_schema_column *c = gr_schema_column_at(s, i);
        if (c->type == GR_COL_LIST && c->pooling == GR_POOL_MEAN) g->mean[c->index] = 1;
    }
    return GR_OK;
}

void tr_bags_fini(tr_bags *g)
{
    free(g->mean);
    g->mean = NULL;
}

void tr_bags_gather(const tr_bags *g, const gr_batch *b, const float *rows, const uint32_t *inv,
                    uint32_t d, float *emb)
{
    if (!g->on) {
        for (size_t i = 0; i < b->n_ids; i++)
            memcpy(emb + i * d, rows + (size_t)inv[i] * d, d * sizeof(float));
        return;
    }
    const size_t nbags = b->n * g->ns;
    for (size_t t = 0; t < nbags; t++) {
        uint32_t o = b->bag_off[t], end = b->bag_off[t + 1];
        float *dst = emb + t * d;
        memcpy(dst, rows + (size_t)inv[o] * d, d * sizeof(float));
        for (o++; o < end; o++) {
            const float *src = rows + (size_t)inv[o] * d;
            for (uint32_t k = 0; k < d; k++) dst[k] += src[k];
        }
        uint32_t len = end - b->bag_off[t];
        if (len > 1 && g->mean[t % g->ns]) {
            float inv_len = 1.0f / (float)len;
            for (uint32_t k = 0; k < d; k++) dst[k] *= inv_len;
        }
    }
}

void tr_bags_scatter(const tr_bags *g, const gr_batch *b, const float *gemb, const uint32_t *inv,
                     size_t nuniq, uint32_t d, float *rows)
{
    memset(rows, 0, nuniq * d * sizeof(float));
    if (!g->on) {
        for (size_t i = 0; i < b->n_ids; i++) {
            float *dst = rows + (size_t)inv[i] * d;
            const float *src = gemb + i * d;
            for (uint32_t k = 0; k < d; k++) dst[k] += src[k];
        }
        return;
    }
    const size_t nbags = b->n * g->ns;
    for (size_t t = 0; t < nbags; t++) {
        uint32_t o = b->bag_off[t], end = b->bag_off[t + 1], len = end - o;
        const float *src = gemb + t * d;
        /* Mean pooling: each item had weight 1/len in the slot's vector. */
        float w = len > 1 && g->mean[t % g->ns] ? 1.0f / (float)len : 1.0f;
        for (; o < end; o++) {
            float *dst = rows + (size_t)inv[o] * d;
            for (uint32_t k = 0; k < d; k++) dst[k] += w * src[k];
        }
    }
}
