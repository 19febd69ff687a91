/* A complete export for serving: the embedding tables weights only, every dense parameter
 * (f32, weights only) as the part dense-00000-of-00001, and the trainer's metadata (the
 * model's kind, shapes and settings), committed last. Before this, `granary ckpt export`
 * wrote the embeddings alone and a served model lost its dense MLP. */
#include "ckpt/ckpt_internal.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define EXPORT_DENSE_PART "dense-00000-of-00001"

static void destroy_tables(gr_table **t, size_t n)
{
    for (size_t i = 0; i < n; i++) gr_table_destroy(t[i]);
    free(t);
}

/* dense.json of the export's one dense part: each parameter's name and size. */
static int write_index(const char *sub, const gr_ckpt_dense_info *v, size_t n)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *arr = root ? cJSON_AddArrayToObject(root, "dense") : NULL;
    for (size_t i = 0; arr && i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", v[i].name);
        cJSON_AddNumberToObject(o, "size", (double)v[i].size);
        cJSON_AddItemToArray(arr, o);
    }
    char *txt = arr ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!txt) return gr_seterr(GR_ENOMEM, "out of memory");
    char path[4096];
    int rc = ck_path(path, sizeof path, sub, "dense.json");
    if (rc == GR_OK) rc = gr_write_file_atomic(path, txt, strlen(txt));
    free(txt);
    return rc;
}

/* Gathers every dense parameter's table from the source's parts and writes them as one
 * committed export part under dst. */
static int export_dense(const char *src, const char *dst, int zstd, const gr_ckpt_dense_info *v,
                        size_t n, gr_ckpt_export_info *info)
{
    gr_table **keep = calloc(n, sizeof *keep);
    if (!keep) return gr_seterr(GR_ENOMEM, "out of memory");
    int rc = GR_OK;
    /* One load per source part, keeping the tables the index names. */
    for (size_t i = 0; i < n && rc == GR_OK; i++) {
        if (keep[i]) continue;
        char sub[4096];
        gr_table **t = NULL;
        size_t nt = 0;
        rc = ck_path(sub, sizeof sub, src, v[i].part);
        if (rc == GR_OK) rc = gr_ckpt_load_new(sub, NULL, &t, &nt, NULL);
        for (size_t k = 0; rc == GR_OK && k < nt; k++) {
            for (size_t j = 0; j < n && t[k]; j++)
                if (!keep[j] && !strcmp(v[j].part, v[i].part) &&
                    !strcmp(v[j].name, gr_table_get_spec(t[k])->name)) {
                    keep[j] = t[k];
                    t[k] = NULL;
                }
        }
        if (rc == GR_OK && !keep[i])
            rc = gr_seterr(GR_ECORRUPT, "%s: dense parameter '%s' is listed but not saved", sub,
                           v[i].name);
        destroy_tables(t, nt);
    }
    char sub[4096];
    if (rc == GR_OK) rc = ck_path(sub, sizeof sub, dst, EXPORT_DENSE_PART);
    /* A part left by an earlier failed export into dst: start over. */
    if (rc == GR_OK) rc = ck_rmtree(sub);
    if (rc == GR_OK) rc = ck_mkdir(sub);
    if (rc == GR_OK) rc = write_index(sub, v, n);
    gr_ckpt_write_opts wo = {0};
    wo.kind = GR_CKPT_EXPORT;
    wo.shards = 1;
    wo.step = info->step;
    wo.zstd_level = zstd;
    gr_ckpt_file_info fi;
    if (rc == GR_OK) rc = gr_ckpt_write_shard(sub, keep, n, &wo, &fi);
    gr_ckpt_commit_opts co = {1, NULL, NULL};
    if (rc == GR_OK) rc = gr_ckpt_commit(sub, &co);
    if (rc == GR_OK) {
        info->bytes += fi.size;
        info->dense = (uint32_t)n;
        for (size_t i = 0; i < n; i++) info->dense_floats += v[i].size;
    }
    for (size_t i = 0; i < n; i++) gr_table_destroy(keep[i]);
    free(keep);
    return rc;
}

int gr_ckpt_export_dir(const char *src_path, const char *dst, bool f16, int zstd_level,
                       gr_ckpt_export_info *info)
{
    gr_ckpt_export_info local;
    gr_ckpt_export_info *in = info ? info : &local;
    memset(in, 0, sizeof *in);
    if (!src_path || !dst) return gr_seterr(GR_EINVAL, "gr_ckpt_export_dir: NULL argument");
    char src[4096], mp[4096];
    int rc = gr_ckpt_resolve(src_path, src, sizeof src);
    if (rc != GR_OK) return rc;
    struct stat st;
    if (ck_path(mp, sizeof mp, dst, "manifest.json") == GR_OK && stat(mp, &st) == 0)
        return gr_seterr(GR_EEXIST, "%s already holds a checkpoint or export", dst);
    gr_ckpt_manifest *m;
    if ((rc = gr_ckpt_manifest_read(src, &m)) != GR_OK) return rc;
    in->step = m->step;
    gr_ckpt_manifest_destroy(m);
    gr_ckpt_dense_info *dv = NULL;
    size_t nd = 0;
    char *user = NULL;
    gr_table **t = NULL;
    size_t nt = 0;
    /* Everything that can be refused is read before anything is written. */
    if ((rc = gr_ckpt_dense_list(src, &dv, &nd)) != GR_OK) return rc;
    if ((rc = gr_ckpt_read_user(src, &user)) != GR_OK) goto out;
    if ((rc = gr_ckpt_load_new(src, NULL, &t, &nt, NULL)) != GR_OK) goto out;
    /* The embeddings first, uncommitted: the manifest comes last, after every part. */
    gr_ckpt_write_opts wo = {0};
    wo.kind = GR_CKPT_EXPORT;
    wo.shards = 1;
    wo.step = in->step;
    wo.zstd_level = zstd_level;
    wo.export_f16 = f16;
    gr_ckpt_file_info fi;
    if ((rc = gr_ckpt_write_shard(dst, t, nt, &wo, &fi)) != GR_OK) goto out;
    in->rows = fi.rows;
    in->bytes = fi.size;
    if (nd && (rc = export_dense(src, dst, zstd_level, dv, nd, in)) != GR_OK) goto out;
    if (user) {
        char up[4096];
        if ((rc = ck_path(up, sizeof up, dst, "user.json")) != GR_OK) goto out;
        if ((rc = gr_write_file_atomic(up, user, strlen(user))) != GR_OK) goto out;
        in->has_meta = true;
    }
    const char *parts[1] = {EXPORT_DENSE_PART};
    gr_ckpt_commit_opts co = {1, NULL, NULL};
    rc = gr_ckpt_commit_parts(dst, &co, parts, nd ? 1 : 0);
out:
    destroy_tables(t, nt);
    free(user);
    free(dv);
    return rc;
}
