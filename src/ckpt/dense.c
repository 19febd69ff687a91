/* The dense parameters of a checkpoint: the servers write each shard's dense parameters as a
 * part of the checkpoint ("dense-I-of-N/", a one-file checkpoint of chunk-row tables plus
 * dense.json with each parameter's name and size). Listing and reading them here lets tools,
 * exports and the saved-model loader see a checkpoint's dense parameters without a server. */
#include "ckpt/ckpt_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define DENSE_INDEX "dense.json"

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Appends the entries of one part's dense.json to *v. */
static int read_index(const char *dir, const char *part, gr_ckpt_dense_info **v, size_t *n,
                      size_t *cap)
{
    char sub[4096], path[4096], *txt = NULL;
    int rc = ck_path(sub, sizeof sub, dir, part);
    if (rc == GR_OK) rc = ck_path(path, sizeof path, sub, DENSE_INDEX);
    if (rc == GR_OK) rc = gr_ckpt_read_small(path, GR_CKPT_META_MAX, &txt, NULL);
    if (rc != GR_OK) return rc;
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "dense");
    if (!cJSON_IsArray(arr)) {
        cJSON_Delete(root);
        return gr_seterr(GR_ECORRUPT, "%s: not a dense index (no \"dense\" array)", path);
    }
    size_t i = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        cJSON *nm = cJSON_GetObjectItemCaseSensitive(it, "name");
        cJSON *sz = cJSON_GetObjectItemCaseSensitive(it, "size");
        if (!cJSON_IsString(nm) || !nm->valuestring[0] ||
            strlen(nm->valuestring) >= GR_TABLE_NAME_MAX || !cJSON_IsNumber(sz) ||
            sz->valuedouble < 1 || sz->valuedouble > 9007199254740992.0) {
            rc = gr_seterr(GR_ECORRUPT, "%s: entry %zu is not {\"name\", \"size\"}", path, i);
            break;
        }
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 8;
            gr_ckpt_dense_info *nv = realloc(*v, nc * sizeof *nv);
            if (!nv) {
                rc = gr_seterr(GR_ENOMEM, "out of memory");
                break;
            }
            *v = nv;
            *cap = nc;
        }
        gr_ckpt_dense_info *d = &(*v)[(*n)++];
        memset(d, 0, sizeof *d);
        snprintf(d->name, sizeof d->name, "%s", nm->valuestring);
        d->size = (uint64_t)sz->valuedouble;
        snprintf(d->part, sizeof d->part, "%s", part);
        i++;
    }
    cJSON_Delete(root);
    return rc;
}

int gr_ckpt_dense_list(const char *dir, gr_ckpt_dense_info **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    gr_ckpt_manifest *m;
    int rc = gr_ckpt_manifest_read(dir, &m);
    if (rc != GR_OK) return rc;
    gr_ckpt_dense_info *v = NULL;
    size_t n = 0, cap = 0;
    if (m->nparts) {
        for (size_t p = 0; p < m->nparts && rc == GR_OK; p++) {
            if (strncmp(m->parts[p], "dense-", 6)) continue;
            char sub[4096];
            rc = ck_path(sub, sizeof sub, dir, m->parts[p]);
            if (rc == GR_OK && !is_dir(sub))
                rc = gr_seterr(GR_ENOENT, "%s: incomplete checkpoint: its part %s is missing", dir,
                               m->parts[p]);
            if (rc == GR_OK) rc = read_index(dir, m->parts[p], &v, &n, &cap);
        }
    } else {
        /* Written before manifests listed their parts: the parts present are the dense ones. */
        for (uint32_t i = 0; i < m->map.shards && rc == GR_OK; i++) {
            char part[GR_CKPT_NAME_MAX], sub[4096];
            snprintf(part, sizeof part, "dense-%05u-of-%05u", i, m->map.shards);
            rc = ck_path(sub, sizeof sub, dir, part);
            if (rc == GR_OK && is_dir(sub)) rc = read_index(dir, part, &v, &n, &cap);
        }
    }
    gr_ckpt_manifest_destroy(m);
    if (rc != GR_OK) {
        free(v);
        return rc;
    }
    *out = v;
    *n_out = n;
    return GR_OK;
}

/* Reads parameter d (size floats) from table t of its part: chunk rows keyed 0, 1, ... */
static int read_chunks(const char *sub, gr_table *t, const gr_ckpt_dense_info *d, float *out)
{
    uint32_t chunk = gr_table_get_spec(t)->dim;
    uint64_t chunks = (d->size + chunk - 1) / chunk;
    uint64_t *keys = malloc(chunks * sizeof *keys);
    float *buf = malloc(chunks * chunk * sizeof *buf);
    bool *found = malloc(chunks * sizeof *found);
    int rc = keys && buf && found ? GR_OK : gr_seterr(GR_ENOMEM, "out of memory reading '%s'", d->name);
    for (uint64_t i = 0; rc == GR_OK && i < chunks; i++) keys[i] = i;
    if (rc == GR_OK) rc = gr_table_get(t, keys, chunks, buf, NULL, NULL, found);
    for (uint64_t i = 0; rc == GR_OK && i < chunks; i++)
        if (!found[i])
            rc = gr_seterr(GR_ECORRUPT, "%s: dense parameter '%s' lacks chunk %llu of %llu", sub,
                           d->name, (unsigned long long)i, (unsigned long long)chunks);
    if (rc == GR_OK) memcpy(out, buf, d->size * sizeof *out);
    free(keys);
    free(buf);
    free(found);
    return rc;
}

int gr_ckpt_dense_read(const char *dir, const char *name, float **values, uint64_t *n)
{
    *values = NULL;
    *n = 0;
    gr_ckpt_dense_info *v;
    size_t nv;
    int rc = gr_ckpt_dense_list(dir, &v, &nv);
    if (rc != GR_OK) return rc;
    const gr_ckpt_dense_info *d = NULL;
    for (size_t i = 0; i < nv && !d; i++)
        if (!strcmp(v[i].name, name)) d = &v[i];
    if (!d) {
        free(v);
        return gr_seterr(GR_ENOENT, "%s: no dense parameter '%s' (the checkpoint has %zu)", dir,
                         name, nv);
    }
    char sub[4096];
    gr_table **t = NULL;
    size_t nt = 0;
    rc = ck_path(sub, sizeof sub, dir, d->part);
    if (rc == GR_OK) rc = gr_ckpt_load_new(sub, NULL, &t, &nt, NULL);
    gr_table *mine = NULL;
    for (size_t i = 0; rc == GR_OK && i < nt; i++)
        if (!strcmp(gr_table_get_spec(t[i])->name, name)) mine = t[i];
    if (rc == GR_OK && !mine)
        rc = gr_seterr(GR_ECORRUPT, "%s: dense parameter '%s' is listed but not saved", sub, name);
    float *out = NULL;
    if (rc == GR_OK && !(out = malloc(d->size * sizeof *out)))
        rc = gr_seterr(GR_ENOMEM, "out of memory for dense parameter '%s'", name);
    if (rc == GR_OK) rc = read_chunks(sub, mine, d, out);
    if (rc == GR_OK) {
        *values = out;
        *n = d->size;
    } else {
        free(out);
    }
    for (size_t i = 0; i < nt; i++) gr_table_destroy(t[i]);
    free(t);
    free(v);
    return rc;
}

int gr_ckpt_read_user(const char *dir, char **out)
{
    *out = NULL;
    char path[4096];
    int rc = ck_path(path, sizeof path, dir, "user.json");
    if (rc != GR_OK) return rc;
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT) return GR_OK;
    return gr_ckpt_read_small(path, GR_CKPT_META_MAX, out, NULL);
}
