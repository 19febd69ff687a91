/* The model's metadata as the trainer records it beside every checkpoint (user.json, member
 * "model") and an export carries on: explicit shapes (features per example, embedding dim,
 * layer sizes), the embedding table's spec and the dense parameter's name and size, so a
 * saved model can be rebuilt without knowing the command line that trained it. */
#include "train/trainer_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *kind_name(gr_model_kind k) { return k == GR_MODEL_LR ? "lr" : "dlrm"; }

static cJSON *sizes(const uint32_t *v, uint32_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (uint32_t i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

cJSON *tr_model_meta(const gr_model *m, const gr_table_spec *emb)
{
    const gr_model_config *c = gr_model_get_config(m);
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON_AddStringToObject(j, "kind", kind_name(c->kind));
    cJSON_AddNumberToObject(j, "n_dense", gr_model_n_dense(m));
    cJSON_AddNumberToObject(j, "n_sparse", gr_model_n_sparse(m));
    cJSON_AddNumberToObject(j, "dim", gr_model_emb_dim(m));
    cJSON_AddItemToObject(j, "bottom", sizes(c->bottom, c->kind == GR_MODEL_LR ? 0 : c->n_bottom));
    cJSON_AddItemToObject(j, "top", sizes(c->top, c->kind == GR_MODEL_LR ? 0 : c->n_top));
    cJSON_AddNumberToObject(j, "seed", (double)c->seed);
    cJSON *d = cJSON_AddObjectToObject(j, "dense");
    cJSON_AddStringToObject(d, "name", gr_model_dense_name(m));
    cJSON_AddNumberToObject(d, "size", (double)gr_model_dense_size(m));
    char *spec = gr_table_spec_to_json(emb);
    cJSON *t = spec ? cJSON_Parse(spec) : NULL;
    free(spec);
    cJSON_AddItemToObject(j, "table", t ? t : cJSON_CreateNull());
    /* How a file's fields become features and feature ids: Criteo's (gr_criteo_feature_id) or
     * a schema's (docs/data.md), given whole so a reader of the model needs nothing else. */
    const gr_schema *s = gr_model_schema(m);
    cJSON_AddStringToObject(j, "features", !s ? "none" : gr_schema_is_criteo(s) ? "criteo" : "schema");
    if (s) {
        char *txt = gr_schema_to_json(s);
        cJSON *sj = txt ? cJSON_Parse(txt) : NULL;
        free(txt);
        if (!sj) {
            cJSON_Delete(j);
            return NULL;
        }
        cJSON_AddItemToObject(j, "schema", sj);
    }
    return j;
}

static int get_u32(const cJSON *j, const char *key, const char *where, uint32_t max, uint32_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > max ||
        v->valuedouble != (double)(uint32_t)v->valuedouble)
        return gr_seterr(GR_ECORRUPT, "%s: model.%s: want a whole number in 0..%u", where, key, max);
    *out = (uint32_t)v->valuedouble;
    return GR_OK;
}

static int get_layers(const cJSON *j, const char *key, const char *where, uint32_t *v, uint32_t *n)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > GR_MODEL_MAX_LAYERS)
        return gr_seterr(GR_ECORRUPT, "%s: model.%s: want a list of at most %d layer sizes", where,
                         key, GR_MODEL_MAX_LAYERS);
    uint32_t k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, a)
    {
        if (!cJSON_IsNumber(it) || it->valuedouble < 1 || it->valuedouble > 65536 ||
            it->valuedouble != (double)(uint32_t)it->valuedouble)
            return gr_seterr(GR_ECORRUPT, "%s: model.%s[%u]: want a layer size in 1..65536", where,
                             key, k);
        v[k++] = (uint32_t)it->valuedouble;
    }
    *n = k;
    return GR_OK;
}

int tr_model_meta_parse(const cJSON *j, const char *where, gr_saved_model_info *info,
                        gr_schema **schema)
{
    if (schema) *schema = NULL;
    if (!cJSON_IsObject(j))
        return gr_seterr(GR_ECORRUPT, "%s: \"model\" is not an object", where);
    gr_model_config *c = &info->model;
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(j, "kind");
    if (!cJSON_IsString(kind) || (strcmp(kind->valuestring, "lr") && strcmp(kind->valuestring, "dlrm")))
        return gr_seterr(GR_ECORRUPT, "%s: model.kind: want \"lr\" or \"dlrm\"", where);
    gr_model_config_default(c, strcmp(kind->valuestring, "lr") ? GR_MODEL_DLRM : GR_MODEL_LR);
    int rc;
    if ((rc = get_u32(j, "n_dense", where, 1u << 20, &info->n_dense)) ||
        (rc = get_u32(j, "n_sparse", where, 1u << 20, &info->n_sparse)) ||
        (rc = get_u32(j, "dim", where, GR_TABLE_DIM_MAX, &c->dim)) ||
        (rc = get_layers(j, "bottom", where, c->bottom, &c->n_bottom)) ||
        (rc = get_layers(j, "top", where, c->top, &c->n_top)))
        return rc;
    /* The files' layout: a model recorded before schemas read Criteo. */
    const cJSON *sj = cJSON_GetObjectItemCaseSensitive(j, "schema");
    gr_schema *s = (gr_schema *)gr_schema_criteo();
    if (sj) {
        char *txt = cJSON_PrintUnformatted(sj);
        rc = txt ? gr_schema_parse(txt, strlen(txt), &s) : gr_seterr(GR_ENOMEM, "out of memory");
        free(txt);
        if (rc) return gr_seterr(rc, "%s: model.schema: %s", where, gr_errmsg());
    }
    if (info->n_dense != gr_schema_n_dense(s) || info->n_sparse != gr_schema_n_sparse(s)) {
        rc = gr_seterr(GR_ECORRUPT, "%s: the model takes %u dense and %u sparse features, its "
                       "schema gives %u and %u", where, info->n_dense, info->n_sparse,
                       gr_schema_n_dense(s), gr_schema_n_sparse(s));
        gr_schema_destroy(s);
        return rc;
    }
    c->n_dense = info->n_dense;
    c->n_sparse = info->n_sparse;
    if (schema) *schema = s;
    else gr_schema_destroy(s);
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(j, "seed");
    if (cJSON_IsNumber(seed) && seed->valuedouble >= 0) c->seed = (uint64_t)seed->valuedouble;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "dense");
    const cJSON *dn = cJSON_GetObjectItemCaseSensitive(d, "name");
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(d, "size");
    if (!cJSON_IsString(dn) || !dn->valuestring[0] || strlen(dn->valuestring) >= GR_TABLE_NAME_MAX ||
        !cJSON_IsNumber(ds) ||
        ds->valuedouble < 1 || ds->valuedouble > 9007199254740992.0)
        return gr_seterr(GR_ECORRUPT, "%s: model.dense: want {\"name\", \"size\"}", where);
    snprintf(info->dense_name, sizeof info->dense_name, "%s", dn->valuestring);
    info->dense_size = (uint64_t)ds->valuedouble;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "table");
    char *txt = cJSON_IsObject(t) ? cJSON_PrintUnformatted(t) : NULL;
    gr_table_spec spec;
    rc = txt ? gr_table_spec_from_json(txt, &spec)
             : gr_seterr(GR_ECORRUPT, "%s: model.table: want the embedding table's spec", where);
    free(txt);
    if (rc) return gr_seterr(rc, "%s: model.table: %s", where, gr_errmsg());
    snprintf(info->table, sizeof info->table, "%s", spec.name);
    info->table_id = spec.id;
    return GR_OK;
}
