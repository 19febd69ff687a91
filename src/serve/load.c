/* Bootstrap of a replica from a saved model (a checkpoint root, one checkpoint or an export)
 * through the train part's saved-model loader: the model's recorded shapes, its dense
 * parameters and every embedding row (weights only), at version 1, so that any publication
 * from a training shard (versions are wall-clock nanoseconds) is newer. */
#include "serve/serve_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct load_ctx {
    gr_serve *s;
    uint32_t table, dim;
    uint64_t *keys;
    float *rows;
    size_t n;
    int rc;
} load_ctx;

#define LOAD_CHUNK 4096

static int flush(load_ctx *c)
{
    if (c->n && !c->rc)
        c->rc = gr_serve_put_rows(c->s, c->table, c->dim, c->keys, c->n, c->rows, 1);
    c->n = 0;
    return c->rc;
}

static int row_cb(void *ctx, uint64_t key, const float *w, const float *state, const gr_row_meta *m)
{
    (void)state;
    (void)m;
    load_ctx *c = ctx;
    c->keys[c->n] = key;
    memcpy(c->rows + c->n * c->dim, w, c->dim * sizeof *w);
    if (++c->n == LOAD_CHUNK) return flush(c) ? 1 : 0;
    return 0;
}

int sv_load_model_dir(gr_serve *s, const char *dir)
{
    gr_saved_model *sm = NULL;
    int rc = gr_saved_model_open(dir, &sm);
    if (rc) return rc;
    const gr_saved_model_info *info = gr_saved_model_get_info(sm);
    rc = gr_model_create(&info->model, &s->model);
    if (!rc) {
        s->emb_table = info->table_id;
        rc = sv_add_table(s, info->table_id, info->table, gr_model_emb_dim(s->model));
    }
    if (!rc) rc = gr_serve_set_dense(s, gr_saved_model_dense(sm), info->dense_size, 1);
    load_ctx c = {.s = s, .table = info->table_id, .dim = gr_model_emb_dim(s->model)};
    c.keys = malloc(LOAD_CHUNK * sizeof *c.keys);
    c.rows = malloc((size_t)LOAD_CHUNK * c.dim * sizeof *c.rows);
    if (!rc && (!c.keys || !c.rows)) rc = gr_seterr(GR_ENOMEM, "out of memory loading %s", dir);
    if (!rc) {
        int src = gr_table_scan(gr_saved_model_table(sm), row_cb, &c);
        rc = c.rc ? c.rc : src;
        if (!rc) rc = flush(&c);
    }
    if (!rc)
        GR_LOGI("replica: loaded %s (%s, step %llu): %s, %llu rows", info->dir, info->kind,
                (unsigned long long)info->step, info->model.kind == GR_MODEL_LR ? "lr" : "dlrm",
                (unsigned long long)info->rows);
    free(c.keys);
    free(c.rows);
    gr_saved_model_close(sm);
    return rc;
}
