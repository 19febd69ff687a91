/* Saved models: a checkpoint root, one checkpoint or an export opened for inference. The
 * embedding table is loaded into a local gr_table, the dense parameters into memory, and the
 * model is rebuilt from the metadata the trainer records (user.json "model"); scoring goes
 * through gr_model_score, the trainer's own evaluation path. */
#include "train/trainer_int.h"
#include "granary/ckpt.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gr_saved_model {
    gr_saved_model_info info;
    gr_schema *schema; /* the files' layout, from the metadata */
    gr_model *m;
    float *dense;
    gr_table *table;
};

/* The metadata's model (and its schema into *schema when not NULL), and the training batch and
 * worker count. */
static int parse_meta(const char *json, size_t len, const char *where, gr_saved_model_info *info,
                      gr_schema **schema)
{
    cJSON *j = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return gr_seterr(GR_ECORRUPT, "%s/user.json: not a JSON object", where);
    }
    int rc;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    if (!model)
        rc = gr_seterr(GR_ENOENT, "%s/user.json: no \"model\": the checkpoint was written by a "
                       "granary that did not record the model's shapes; it can be resumed but "
                       "not opened as a model", where);
    else rc = tr_model_meta_parse(model, where, info, schema);
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "batch");
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(j, "workers");
    if (cJSON_IsNumber(b) && b->valuedouble >= 1 && b->valuedouble <= (1u << 20))
        info->batch = (uint64_t)b->valuedouble;
    if (cJSON_IsNumber(w) && w->valuedouble >= 1 && w->valuedouble <= 256)
        info->workers = (uint32_t)w->valuedouble;
    cJSON_Delete(j);
    return rc;
}

int gr_saved_model_parse_meta(const char *json, size_t len, const char *where,
                              gr_saved_model_info *info)
{
    return parse_meta(json, len, where, info, NULL);
}

/* Reads the checkpoint's metadata: the model, and the training batch and worker count. */
static int read_meta(const char *dir, gr_saved_model_info *info, gr_schema **schema)
{
    char *txt = NULL;
    int rc = gr_ckpt_read_user(dir, &txt);
    if (rc) return rc;
    if (!txt)
        return gr_seterr(GR_ENOENT, "%s: no model metadata (no user.json): not written by "
                         "`granary train` or `granary ckpt export`", dir);
    rc = parse_meta(txt, strlen(txt), dir, info, schema);
    free(txt);
    return rc;
}

/* The embedding table of the checkpoint (its chain applied); the other tables are dropped. */
static int load_table(const char *dir, gr_saved_model *sm)
{
    gr_table **t = NULL;
    size_t n = 0;
    gr_ckpt_load_stats st;
    int rc = gr_ckpt_load_new(dir, NULL, &t, &n, &st);
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) {
        if (!sm->table && !strcmp(gr_table_get_spec(t[i])->name, sm->info.table)) {
            sm->table = t[i];
            continue;
        }
        gr_table_destroy(t[i]);
    }
    free(t);
    if (!sm->table)
        return gr_seterr(GR_ENOENT, "%s: the model's embedding table '%s' is not in the checkpoint",
                         dir, sm->info.table);
    uint32_t want = gr_model_emb_dim(sm->m);
    if (gr_table_get_spec(sm->table)->dim != want)
        return gr_seterr(GR_EDIM, "%s: embedding table '%s' has dim %u, the model needs %u", dir,
                         sm->info.table, gr_table_get_spec(sm->table)->dim, want);
    gr_table_stats ts;
    gr_table_get_stats(sm->table, &ts);
    sm->info.rows = ts.rows;
    return GR_OK;
}

static int read_info(const char *path, gr_saved_model_info *in, gr_schema **schema)
{
    memset(in, 0, sizeof *in);
    gr_ckpt_manifest *man = NULL;
    int rc = gr_ckpt_resolve(path, in->dir, sizeof in->dir);
    if (!rc) rc = gr_ckpt_manifest_read(in->dir, &man);
    if (rc) return rc;
    in->step = man->step;
    snprintf(in->kind, sizeof in->kind, "%s", gr_ckpt_kind_name(man->kind));
    gr_ckpt_manifest_destroy(man);
    return read_meta(in->dir, in, schema);
}

int gr_saved_model_read_info(const char *path, gr_saved_model_info *in)
{
    return read_info(path, in, NULL);
}

int gr_saved_model_open(const char *path, gr_saved_model **out)
{
    *out = NULL;
    /* As gr_train_run: the scoring threads are the parallelism, and the trainer evaluated with
     * single-threaded BLAS; a threaded sgemm splits the work differently and changes the last
     * bits of the scores (measured: `granary eval` differed from the trainer's AUC by 1.5e-7
     * until this). */
    gr_blas_one_thread();
    gr_saved_model *sm = calloc(1, sizeof *sm);
    if (!sm) return gr_seterr(GR_ENOMEM, "out of memory");
    gr_saved_model_info *in = &sm->info;
    int rc = read_info(path, in, &sm->schema);
    in->model.schema = sm->schema;
    if (!rc) rc = gr_model_create(&in->model, &sm->m);
    /* The model holds its own copy: point at it, valid as long as the model. */
    if (!rc) in->model.schema = gr_model_schema(sm->m);
    if (!rc && gr_model_dense_size(sm->m) != in->dense_size)
        rc = gr_seterr(GR_EDIM, "%s: the recorded shapes make %zu dense floats, the metadata says "
                       "%llu", in->dir, gr_model_dense_size(sm->m),
                       (unsigned long long)in->dense_size);
    uint64_t nd = 0;
    if (!rc) rc = gr_ckpt_dense_read(in->dir, in->dense_name, &sm->dense, &nd);
    if (!rc && nd != in->dense_size)
        rc = gr_seterr(GR_EDIM, "%s: dense parameter '%s' has %llu floats, the model needs %llu",
                       in->dir, in->dense_name, (unsigned long long)nd,
                       (unsigned long long)in->dense_size);
    if (!rc) rc = load_table(in->dir, sm);
    if (rc) {
        gr_saved_model_close(sm);
        return rc;
    }
    *out = sm;
    return GR_OK;
}

void gr_saved_model_close(gr_saved_model *sm)
{
    if (!sm) return;
    gr_model_destroy(sm->m);
    gr_schema_destroy(sm->schema);
    gr_table_destroy(sm->table);
    free(sm->dense);
    free(sm);
}

const gr_saved_model_info *gr_saved_model_get_info(const gr_saved_model *sm) { return &sm->info; }
const gr_model *gr_saved_model_model(const gr_saved_model *sm) { return sm->m; }
const float *gr_saved_model_dense(const gr_saved_model *sm) { return sm->dense; }
gr_table *gr_saved_model_table(gr_saved_model *sm) { return sm->table; }

/* Rows as the trainer's evaluation reads them from the shards: unknown ids read zeros. */
static int table_rows(void *ctx, const uint64_t *keys, size_t n, float *rows)
{
    return gr_table_lookup(ctx, keys, n, rows, GR_LOOKUP_READONLY);
}

int gr_saved_model_predict(gr_saved_model *sm, gr_score_ws *ws, size_t n, const float *dense,
                           const uint64_t *ids, float *probs)
{
    return gr_model_score(sm->m, ws, sm->dense, table_rows, sm->table, n, dense, ids, probs);
}

int gr_saved_model_predict_batch(gr_saved_model *sm, gr_score_ws *ws, const gr_batch *b,
                                 float *probs)
{
    return gr_model_score_batch(sm->m, ws, sm->dense, table_rows, sm->table, b, probs);
}

int gr_saved_model_evaluate(gr_saved_model *sm, const char *path, size_t batch, unsigned threads,
                            bool want_probs, gr_eval_result *res)
{
    if (!batch) batch = sm->info.batch ? sm->info.batch : 1024;
    if (!threads) threads = sm->info.workers ? sm->info.workers : 1;
    return tr_eval_file(sm->m, sm->dense, table_rows, sm->table, path, batch, threads,
                        GR_TRAIN_MIN_VALID_DEFAULT, want_probs, res);
}
