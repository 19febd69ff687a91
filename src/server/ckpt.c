/* The shard's checkpoint operations: CKPT_SAVE writes this shard's file of a checkpoint (its
 * sparse tables through the ckpt library's saver, which may write a delta) and a small
 * one-file checkpoint of the dense parameters it owns; CKPT_COMMIT (sent to one shard after
 * every shard saved) writes the caller's metadata, then the manifest, then applies retention;
 * CKPT_LOAD builds new tables from the rows this shard owns and swaps them in.
 *
 * These run on one checkpoint thread per shard, never on the worker pool or the connection
 * loop: a save that waits for the disk holds no thread that pulls and pushes need, and the
 * library's save never holds a table lock while it waits (docs/checkpoints.md). */
#include "server/server_int.h"
#include "granary/ckpt.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define QUEUE_MAX 64
#define PATH_MAX_LEN 4096
#define META_FILE "user.json"
#define DENSE_INDEX "dense.json"

typedef struct ck_job {
    struct ck_job *next;
    struct srv_conn *c;
    gr_proto_header h;
    uint8_t *body;
} ck_job;

struct srv_ckpt {
    gr_server *s;
    char *base;         /* the configured ckpt_root (copied), or NULL */
    char *base_real;    /* base with symlinks resolved, for the containment check */
    pthread_mutex_t mu; /* the queue, stopping and the counters below */
    pthread_cond_t cv;
    ck_job *head, *tail;
    size_t len;
    pthread_t thread;
    bool live, stopping, busy;
    /* Owned by the checkpoint thread. */
    gr_ckpt_saver *saver;
    char saver_root[PATH_MAX_LEN];
    bool saver_incremental;
    uint32_t saver_full_every;
    int saver_zstd;
    /* Counters (under mu). */
    uint64_t saves, save_errors, commits, commit_errors, loads, load_errors;
    char last_name[GR_CKPT_NAME_MAX];
    uint64_t last_step, last_rows, last_bytes;
    uint32_t last_kind;
    double last_seconds;
    /* A standby's tables made ready for its takeover (warm.c), adopted by the next load
     * whose checkpoint table has the same spec (under mu). */
    gr_table **warm;
    size_t nwarm;
    uint32_t warm_adopted; /* tables a load adopted */
};

/* ---- paths ---- */

static bool plain_name(const gr_proto_strv *v)
{
    if (v->n == 0 || v->n >= GR_CKPT_NAME_MAX) return false;
    if ((v->n == 1 && v->p[0] == '.') || (v->n == 2 && v->p[0] == '.' && v->p[1] == '.'))
        return false;
    for (uint32_t i = 0; i < v->n; i++) {
        char ch = v->p[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            return false;
    }
    return true;
}

static void copy_name(char *dst, const gr_proto_strv *v)
{
    memcpy(dst, v->p, v->n);
    dst[v->n] = '\0';
}

/* Checks a request's checkpoint name and optional parent and copies them out as C strings. */
static int take_names(const gr_proto_strv *n, const gr_proto_strv *parent, char *name_out,
                      char *parent_out)
{
    if (!plain_name(n))
        return gr_seterr(GR_EINVAL, "checkpoint name '%.*s' is not a plain name ([A-Za-z0-9._-])",
                         (int)n->n, n->p);
    if (parent->n && !plain_name(parent))
        return gr_seterr(GR_EINVAL, "parent '%.*s' is not a plain checkpoint name",
                         (int)parent->n, parent->p);
    copy_name(name_out, n);
    parent_out[0] = '\0';
    if (parent->n) copy_name(parent_out, parent);
    return GR_OK;
}

/* With a configured root, a path may not leave it through a symlink: the deepest part of the
 * path that exists, with its symlinks resolved, must lie inside the root's own resolved path.
 * What does not exist yet is created by this shard as plain directories, so it cannot point
 * anywhere else. Called on every root and checkpoint directory a request names. */
static int check_inside_root(const srv_ckpt *k, const char *path)
{
    if (!k->base_real) return GR_OK;
    char probe[PATH_MAX_LEN], real[PATH_MAX];
    snprintf(probe, sizeof probe, "%s", path);
    for (;;) {
        if (realpath(probe, real)) break;
        if (errno != ENOENT && errno != ENOTDIR)
            return gr_seterr(GR_EIO, "cannot resolve %s: %s", probe, strerror(errno));
        char *slash = strrchr(probe, '/');
        if (!slash || slash == probe) return gr_seterr(GR_EINVAL, "cannot resolve %s", path);
        *slash = '\0';
    }
    size_t bl = strlen(k->base_real);
    bool inside = !strncmp(real, k->base_real, bl) &&
                  (real[bl] == '\0' || real[bl] == '/' || !strcmp(k->base_real, "/"));
    if (!inside)
        return gr_seterr(GR_EINVAL,
                         "checkpoint path %s leaves this shard's checkpoint root %s (%s resolves "
                         "to %s)", path, k->base, probe, real);
    return GR_OK;
}

/* The checkpoint root a request names, as a path on this shard. With a configured ckpt_root
 * the request's root is relative to it and may not climb out of it. */
static int resolve_root(srv_ckpt *k, const gr_proto_strv *v, char *out)
{
    if (v->n == 0) return gr_seterr(GR_EINVAL, "empty checkpoint root");
    if (v->n >= PATH_MAX_LEN - 128) return gr_seterr(GR_EINVAL, "checkpoint root path is too long");
    char req[PATH_MAX_LEN];
    memcpy(req, v->p, v->n);
    req[v->n] = '\0';
    for (size_t l = v->n; l > 1 && req[l - 1] == '/'; l--) req[l - 1] = '\0';
    const char *base = k->base;
    if (!base) {
        snprintf(out, PATH_MAX_LEN, "%s", req);
        return GR_OK;
    }
    if (req[0] == '/')
        return gr_seterr(GR_EINVAL, "checkpoint root '%s' must be relative to this shard's "
                         "--ckpt-root %s", req, base);
    /* No ".." component anywhere. */
    for (const char *p = req; *p;) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return gr_seterr(GR_EINVAL, "checkpoint root '%s' may not contain '..'", req);
        p += n + (e ? 1 : 0);
    }
    if (strlen(base) + 1 + v->n >= PATH_MAX_LEN - 128)
        return gr_seterr(GR_EINVAL, "checkpoint root path is too long");
    int n = snprintf(out, PATH_MAX_LEN, "%s/%s", base, req);
    if (n <= 0 || n >= PATH_MAX_LEN) return gr_seterr(GR_EINVAL, "checkpoint root path is too long");
    return check_inside_root(k, out);
}

static int join(char *out, const char *a, const char *b)
{
    int n = snprintf(out, PATH_MAX_LEN, "%s/%s", a, b);
    if (n < 0 || n >= PATH_MAX_LEN) return gr_seterr(GR_EINVAL, "path %s/%s is too long", a, b);
    return GR_OK;
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* mkdir -p. */
static int make_dirs(const char *path)
{
    char tmp[PATH_MAX_LEN];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return gr_seterr(GR_EIO, "cannot create directory %s: %s", tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return gr_seterr(GR_EIO, "cannot create directory %s: %s", tmp, strerror(errno));
    return GR_OK;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static int remove_tree(const char *path)
{
    if (!exists(path)) return GR_OK;
    if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return gr_seterr(GR_EIO, "cannot remove %s: %s", path, strerror(errno));
    return GR_OK;
}

/* "dense-00001-of-00004": the one-file checkpoint of the dense parameters shard 1 owned. */
static void dense_dir_name(uint32_t shard, uint32_t shards, char *out)
{
    snprintf(out, GR_CKPT_NAME_MAX, "dense-%05u-of-%05u", shard, shards);
}

/* ---- registry snapshots ---- */

static int cmp_entry_name(const void *a, const void *b)
{
    const srv_entry *x = *(srv_entry *const *)a, *y = *(srv_entry *const *)b;
    return strcmp(x->name, y->name);
}

typedef struct snap {
    srv_entry **all;
    size_t n;
    gr_table **sparse, **dense;
    srv_entry **dense_ents;
    size_t nsparse, ndense;
} snap;

static void snap_fini(snap *x)
{
    if (x->all) srv_registry_release(x->all, x->n);
    free(x->sparse);
    free(x->dense);
    free(x->dense_ents);
    memset(x, 0, sizeof *x);
}

/* Every table and dense parameter, each list sorted by name: every shard must write the
 * same tables in the same order (the manifest requires it). */
static int snap_take(gr_server *s, snap *x)
{
    memset(x, 0, sizeof *x);
    int rc = srv_registry_snapshot(&s->reg, &x->all, &x->n);
    if (rc) return rc;
    if (x->n) qsort(x->all, x->n, sizeof *x->all, cmp_entry_name);
    size_t cap = x->n ? x->n : 1;
    x->sparse = calloc(cap, sizeof *x->sparse);
    x->dense = calloc(cap, sizeof *x->dense);
    x->dense_ents = calloc(cap, sizeof *x->dense_ents);
    if (!x->sparse || !x->dense || !x->dense_ents) {
        snap_fini(x);
        return gr_seterr(GR_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < x->n; i++) {
        if (x->all[i]->dense) {
            x->dense_ents[x->ndense] = x->all[i];
            x->dense[x->ndense++] = x->all[i]->table;
        } else {
            x->sparse[x->nsparse++] = x->all[i]->table;
        }
    }
    return GR_OK;
}

/* ---- CKPT_SAVE ---- */

static int ensure_saver(srv_ckpt *k, const char *root, bool incremental, uint32_t full_every,
                        int zstd)
{
    gr_server *s = k->s;
    if (k->saver && !strcmp(k->saver_root, root) && k->saver_incremental == incremental &&
        k->saver_full_every == full_every && k->saver_zstd == zstd)
        return GR_OK;
    /* Another root or policy: a new saver, whose first write is full. */
    gr_ckpt_saver_destroy(k->saver);
    k->saver = NULL;
    int rc = make_dirs(root);
    if (rc) return rc;
    gr_ckpt_saver_opts so = {s->cfg.shard, s->cfg.shards, incremental, full_every, zstd, 0};
    rc = gr_ckpt_saver_create(root, &so, &k->saver);
    if (rc) return rc;
    snprintf(k->saver_root, sizeof k->saver_root, "%s", root);
    k->saver_incremental = incremental;
    k->saver_full_every = full_every;
    k->saver_zstd = zstd;
    return GR_OK;
}

/* Writes DIR/dense-I-of-N: dense.json (each parameter's name and size, which its chunked table
 * spec does not carry), then a complete one-file checkpoint of their tables. Always written,
 * even empty, so a commit can check that every shard's part is there. */
static int save_dense(srv_ckpt *k, const char *dir, uint64_t step, int zstd, const snap *x,
                      uint64_t *bytes)
{
    gr_server *s = k->s;
    char sub[PATH_MAX_LEN], nm[GR_CKPT_NAME_MAX], idx[PATH_MAX_LEN];
    dense_dir_name(s->cfg.shard, s->cfg.shards, nm);
    int rc = join(sub, dir, nm);
    if (!rc) rc = join(idx, sub, DENSE_INDEX);
    /* A directory left by an earlier failed attempt at this checkpoint: start over. */
    if (!rc) rc = remove_tree(sub);
    if (!rc) rc = make_dirs(sub);
    if (rc) return rc;
    cJSON *root = cJSON_CreateObject();
    cJSON *arr = root ? cJSON_AddArrayToObject(root, "dense") : NULL;
    for (size_t i = 0; arr && i < x->ndense; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", x->dense_ents[i]->name);
        cJSON_AddNumberToObject(o, "size", (double)x->dense_ents[i]->dense_size);
        cJSON_AddItemToArray(arr, o);
    }
    char *txt = arr ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!txt) return gr_seterr(GR_ENOMEM, "out of memory");
    rc = gr_write_file_atomic(idx, txt, strlen(txt));
    free(txt);
    if (rc) return rc;
    gr_ckpt_write_opts wo;
    memset(&wo, 0, sizeof wo);
    wo.kind = GR_CKPT_FULL;
    wo.shard = 0;
    wo.shards = 1;
    wo.step = step;
    wo.zstd_level = zstd;
    gr_ckpt_file_info fi;
    rc = gr_ckpt_write_shard(sub, x->dense, x->ndense, &wo, &fi);
    if (rc) return rc;
    gr_ckpt_commit_opts co = {1, NULL, NULL};
    rc = gr_ckpt_commit(sub, &co);
    if (!rc) *bytes += fi.size;
    return rc;
}

static int do_save(srv_ckpt *k, const gr_proto_header *h, const uint8_t *body, gr_proto_buf *out,
                   bool *fatal)
{
    gr_server *s = k->s;
    gr_proto_ckpt_save req;
    int rc = gr_proto_decode_ckpt_save(body, h->body_len, &s->cfg.limits, &req);
    if (rc) {
        *fatal = rc == GR_EPROTO || rc == GR_ETOOBIG;
        return rc;
    }
    char root[PATH_MAX_LEN], name[GR_CKPT_NAME_MAX], parent[GR_CKPT_NAME_MAX] = "";
    char dir[PATH_MAX_LEN], mpath[PATH_MAX_LEN];
    if ((rc = take_names(&req.name, &req.parent, name, parent))) return rc;
    if ((rc = resolve_root(k, &req.root, root)) || (rc = join(dir, root, name)) ||
        (rc = check_inside_root(k, dir)) ||
        (rc = join(mpath, dir, "manifest.json")))
        return rc;
    if (exists(mpath))
        return gr_seterr(GR_EEXIST, "checkpoint %s is already complete: save under a new name",
                         dir);
    rc = ensure_saver(k, root, (req.flags & GR_PROTO_CKPT_INCREMENTAL) != 0, req.full_every,
                      req.zstd_level);
    if (!rc) rc = check_inside_root(k, dir);
    if (rc) return rc;
    uint64_t t0 = gr_now_ns();
    snap x;
    if ((rc = snap_take(s, &x))) return rc;
    gr_ckpt_file_info fi;
    rc = gr_ckpt_saver_write(k->saver, name, parent[0] ? parent : NULL, req.step, x.sparse,
                             x.nsparse, &fi);
    uint64_t bytes = rc ? 0 : fi.size;
    if (!rc) rc = save_dense(k, dir, req.step, req.zstd_level, &x, &bytes);
    size_t ndense = x.ndense;
    snap_fini(&x);
    if (rc) return rc;
    gr_proto_ckpt_saved rep;
    memset(&rep, 0, sizeof rep);
    rep.kind = fi.kind == GR_CKPT_DELTA ? 1 : 0;
    rep.ndense = (uint32_t)ndense;
    rep.rows = fi.rows;
    rep.bytes = bytes;
    rep.checksum = fi.checksum;
    rep.usec = (gr_now_ns() - t0) / 1000;
    rep.sync_job = srv_sync_step(s, &rep.sync_step) ? 1 : 0;
    if (!rep.sync_job) rep.sync_step = 0;
    GR_LOGI("shard %u: saved %s (%s, %llu rows, %u dense, %.3f s)", s->cfg.shard, dir,
            rep.kind ? "delta" : "full", (unsigned long long)fi.rows, rep.ndense,
            (double)rep.usec / 1e6);
    pthread_mutex_lock(&k->mu);
    snprintf(k->last_name, sizeof k->last_name, "%s", name);
    k->last_step = req.step;
    k->last_rows = fi.rows;
    k->last_bytes = bytes;
    k->last_kind = rep.kind;
    k->last_seconds = (double)rep.usec / 1e6;
    pthread_mutex_unlock(&k->mu);
    size_t start = out->len;
    rc = gr_proto_begin(out, GR_PROTO_RESPONSE, h->op, 0, 0, h->id);
    if (!rc) rc = gr_proto_put_ckpt_saved(out, &rep);
    if (!rc) rc = gr_proto_end(out, start);
    return rc;
}

/* ---- CKPT_COMMIT ---- */

static int do_commit(srv_ckpt *k, const gr_proto_header *h, const uint8_t *body,
                     gr_proto_buf *out, bool *fatal)
{
    gr_server *s = k->s;
    gr_proto_ckpt_commit req;
    int rc = gr_proto_decode_ckpt_commit(body, h->body_len, &s->cfg.limits, &req);
    if (rc) {
        *fatal = rc == GR_EPROTO || rc == GR_ETOOBIG;
        return rc;
    }
    char root[PATH_MAX_LEN], name[GR_CKPT_NAME_MAX], parent[GR_CKPT_NAME_MAX] = "";
    char dir[PATH_MAX_LEN], path[PATH_MAX_LEN];
    if ((rc = take_names(&req.name, &req.parent, name, parent))) return rc;
    if ((rc = resolve_root(k, &req.root, root)) || (rc = join(dir, root, name)) ||
        (rc = check_inside_root(k, dir)))
        return rc;
    /* Every shard's dense part must be complete before the manifest may exist. */
    for (uint32_t i = 0; i < req.shards; i++) {
        char nm[GR_CKPT_NAME_MAX], sub[PATH_MAX_LEN];
        dense_dir_name(i, req.shards, nm);
        if ((rc = join(sub, dir, nm)) || (rc = join(path, sub, "manifest.json"))) return rc;
        if (!exists(path))
            return gr_seterr(GR_ENOENT, "%s: shard %u has not finished its save (no %s)", dir, i,
                             path);
    }
    if (req.meta.n) {
        cJSON *j = cJSON_ParseWithLength(req.meta.p, req.meta.n);
        bool ok = j != NULL;
        cJSON_Delete(j);
        if (!ok) return gr_seterr(GR_EINVAL, "checkpoint metadata is not valid JSON");
        if ((rc = join(path, dir, META_FILE)) || (rc = gr_write_file_atomic(path, req.meta.p, req.meta.n)))
            return rc;
    }
    /* The dense parts are listed in the manifest, so that a load or a verify can tell a
     * checkpoint whose dense part was deleted from one written without any. */
    char (*pn)[GR_CKPT_NAME_MAX] = calloc(req.shards ? req.shards : 1, sizeof *pn);
    const char **parts = calloc(req.shards ? req.shards : 1, sizeof *parts);
    if (!pn || !parts) rc = gr_seterr(GR_ENOMEM, "out of memory");
    for (uint32_t i = 0; !rc && i < req.shards; i++) {
        dense_dir_name(i, req.shards, pn[i]);
        parts[i] = pn[i];
    }
    gr_ckpt_commit_opts co = {req.shards, NULL, parent[0] ? parent : NULL};
    if (!rc) rc = gr_ckpt_commit_parts(dir, &co, parts, req.shards);
    free(parts);
    free(pn);
    if (rc) return rc;
    gr_ckpt_manifest *m = NULL;
    if ((rc = gr_ckpt_manifest_read(dir, &m))) return rc;
    gr_proto_ckpt_committed rep = {m->step, m->kind == GR_CKPT_DELTA ? 1u : 0u, 0};
    gr_ckpt_manifest_destroy(m);
    if (req.keep) {
        /* The checkpoint is complete whatever retention does; a failure here is reported in
         * the log, not as a failed commit. */
        uint32_t deleted = 0;
        if (gr_ckpt_retain(root, req.keep, &deleted))
            GR_LOGW("shard %u: retention under %s: %s", s->cfg.shard, root, gr_errmsg());
        rep.deleted = deleted;
    }
    GR_LOGI("shard %u: committed %s (step %llu)", s->cfg.shard, dir, (unsigned long long)rep.step);
    size_t start = out->len;
    rc = gr_proto_begin(out, GR_PROTO_RESPONSE, h->op, 0, 0, h->id);
    if (!rc) rc = gr_proto_put_ckpt_committed(out, &rep);
    if (!rc) rc = gr_proto_end(out, start);
    return rc;
}

/* ---- CKPT_LOAD ---- */

typedef struct staged {
    gr_table *t;
    bool dense;
    uint64_t size;
} staged;

typedef struct loadset {
    staged *v;
    size_t n, cap;
} loadset;

static void loadset_fini(loadset *L)
{
    for (size_t i = 0; i < L->n; i++) gr_table_destroy(L->v[i].t);
    free(L->v);
    memset(L, 0, sizeof *L);
}

static int loadset_add(loadset *L, gr_table *t, bool dense, uint64_t size)
{
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 16;
        staged *v = realloc(L->v, cap * sizeof *v);
        if (!v) {
            gr_table_destroy(t);
            return gr_seterr(GR_ENOMEM, "out of memory");
        }
        L->v = v;
        L->cap = cap;
    }
    L->v[L->n++] = (staged){t, dense, size};
    return GR_OK;
}

/* A new, empty table for a checkpoint table: with the shard's own spec when it already holds
 * one of that name (so the restore's spec check reports any difference), else the
 * checkpoint's. */
static int new_target(gr_server *s, bool dense, const gr_table_spec *ckspec, gr_table **out,
                      uint64_t *have_size)
{
    srv_entry *e = srv_registry_get(&s->reg, dense, ckspec->name, 0);
    const gr_table_spec *spec = e ? gr_table_get_spec(e->table) : ckspec;
    if (have_size) *have_size = e ? e->dense_size : 0;
    int rc = GR_OK;
    *out = NULL;
    if (!dense) *out = srv_ckpt_warm_take(s, spec);
    if (!e && !dense) {
        /* A new sparse table must not take a wire id another table uses. */
        srv_entry *byid = srv_registry_get(&s->reg, false, NULL, ckspec->id);
        if (byid) {
            rc = gr_seterr(GR_EEXIST, "checkpoint table '%s' has id %u, which table '%s' uses on "
                           "shard %u", ckspec->name, ckspec->id, byid->name, s->cfg.shard);
            srv_entry_put(byid);
        }
    }
    if (!rc && !*out) {
        rc = gr_table_create(spec, out);
        if (!rc && !dense && s->reg.huge_rows) gr_table_set_huge_rows(*out, s->reg.huge_rows);
    }
    if (rc) {
        gr_table_destroy(*out);
        *out = NULL;
    }
    srv_entry_put(e);
    return rc;
}

/* Reads a dense directory's dense.json: names and sizes. */
static int read_dense_index(const char *sub, char (**names)[GR_TABLE_NAME_MAX], uint64_t **sizes,
                            size_t *n)
{
    char path[PATH_MAX_LEN], *txt = NULL;
    int rc = join(path, sub, DENSE_INDEX);
    if (!rc) rc = gr_ckpt_read_small(path, GR_CKPT_META_MAX, &txt, NULL);
    if (rc) return rc;
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "dense");
    if (!cJSON_IsArray(arr)) {
        cJSON_Delete(root);
        return gr_seterr(GR_ECORRUPT, "%s: not a dense index", path);
    }
    size_t cnt = (size_t)cJSON_GetArraySize(arr);
    *names = calloc(cnt ? cnt : 1, sizeof **names);
    *sizes = calloc(cnt ? cnt : 1, sizeof **sizes);
    *n = 0;
    if (!*names || !*sizes) rc = gr_seterr(GR_ENOMEM, "out of memory");
    cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        if (rc) break;
        cJSON *nm = cJSON_GetObjectItemCaseSensitive(it, "name");
        cJSON *sz = cJSON_GetObjectItemCaseSensitive(it, "size");
        if (!cJSON_IsString(nm) || strlen(nm->valuestring) >= GR_TABLE_NAME_MAX ||
            !cJSON_IsNumber(sz) || sz->valuedouble < 1 || sz->valuedouble > 9007199254740992.0) {
            rc = gr_seterr(GR_ECORRUPT, "%s: entry %zu is not {\"name\", \"size\"}", path, *n);
            break;
        }
        snprintf((*names)[*n], GR_TABLE_NAME_MAX, "%s", nm->valuestring);
        (*sizes)[(*n)++] = (uint64_t)sz->valuedouble;
    }
    cJSON_Delete(root);
    if (rc) {
        free(*names);
        free(*sizes);
        *names = NULL;
        *sizes = NULL;
    }
    return rc;
}

/* Stages the dense parameters this shard owns (under its own layout) from every dense part of
 * the checkpoint. A checkpoint written without dense parts (by the library's tools) has none;
 * one with some parts missing is refused. */
static int stage_dense(gr_server *s, const char *dir, const gr_ckpt_manifest *top, loadset *L,
                       gr_ckpt_load_stats *tot)
{
    uint32_t ckshards = top->map.shards;
    uint32_t present = 0;
    for (uint32_t i = 0; i < ckshards; i++) {
        char nm[GR_CKPT_NAME_MAX], sub[PATH_MAX_LEN];
        dense_dir_name(i, ckshards, nm);
        int rc = join(sub, dir, nm);
        if (rc) return rc;
        present += exists(sub);
    }
    /* None present is a checkpoint written without dense parts (by the library's tools),
     * unless its manifest lists them: then they were deleted, and it is incomplete. */
    if (present == 0 && top->nparts == 0) return GR_OK;
    for (size_t p = 0; p < top->nparts; p++) {
        char sub[PATH_MAX_LEN];
        int rc = join(sub, dir, top->parts[p]);
        if (rc) return rc;
        if (!exists(sub))
            return gr_seterr(GR_ENOENT, "%s: incomplete checkpoint: its part %s is missing (the "
                             "shard was left unchanged)", dir, top->parts[p]);
    }
    for (uint32_t i = 0; i < ckshards; i++) {
        char nm[GR_CKPT_NAME_MAX], sub[PATH_MAX_LEN];
        dense_dir_name(i, ckshards, nm);
        int rc = join(sub, dir, nm);
        if (rc) return rc;
        if (!exists(sub))
            return gr_seterr(GR_ENOENT, "%s: the dense parameters of shard %u are missing", sub, i);
        char (*names)[GR_TABLE_NAME_MAX] = NULL;
        uint64_t *sizes = NULL;
        size_t n = 0;
        if ((rc = read_dense_index(sub, &names, &sizes, &n))) return rc;
        gr_ckpt_manifest *m = NULL;
        rc = gr_ckpt_manifest_read(sub, &m);
        for (size_t d = 0; !rc && d < n; d++) {
            if (!s->owns[gr_proto_dense_slot(names[d], strlen(names[d]))]) continue;
            long ti = gr_ckpt_manifest_table(m, names[d]);
            if (ti < 0) {
                rc = gr_seterr(GR_ECORRUPT, "%s: dense parameter '%s' is listed but not saved", sub,
                               names[d]);
                break;
            }
            uint64_t have = 0;
            gr_table *t = NULL;
            rc = new_target(s, true, &m->tables[ti], &t, &have);
            if (!rc && have && have != sizes[d])
                rc = gr_seterr(GR_EDIM, "dense parameter '%s' has %llu floats on shard %u, %llu in "
                               "the checkpoint", names[d], (unsigned long long)have, s->cfg.shard,
                               (unsigned long long)sizes[d]);
            if (rc) {
                gr_table_destroy(t);
                break;
            }
            if ((rc = loadset_add(L, t, true, sizes[d]))) break;
            gr_ckpt_load_stats st;
            memset(&st, 0, sizeof st);
            gr_ckpt_load_opts lo = {0, 1, NULL, 0};
            rc = gr_ckpt_load(sub, &t, 1, &lo, &st);
            tot->rows_loaded += st.rows_loaded;
            tot->rows_read += st.rows_read;
        }
        gr_ckpt_manifest_destroy(m);
        free(names);
        free(sizes);
        if (rc) return rc;
    }
    return GR_OK;
}

static int read_meta(const char *dir, uint32_t max, char **meta, size_t *len)
{
    char path[PATH_MAX_LEN];
    *meta = NULL;
    *len = 0;
    int rc = join(path, dir, META_FILE);
    if (rc || !exists(path)) return rc;
    /* Sized (and checked to be a regular file) before it is read. */
    return gr_ckpt_read_small(path, max < GR_CKPT_META_MAX ? max : GR_CKPT_META_MAX, meta, len);
}

static int do_load(srv_ckpt *k, const gr_proto_header *h, const uint8_t *body, gr_proto_buf *out,
                   bool *fatal)
{
    gr_server *s = k->s;
    gr_proto_ckpt_load req;
    int rc = gr_proto_decode_ckpt_load(body, h->body_len, &s->cfg.limits, &req);
    if (rc) {
        *fatal = rc == GR_EPROTO || rc == GR_ETOOBIG;
        return rc;
    }
    char root[PATH_MAX_LEN], dir[PATH_MAX_LEN], path[PATH_MAX_LEN], name[GR_CKPT_NAME_MAX];
    if (req.name.n && !plain_name(&req.name))
        return gr_seterr(GR_EINVAL, "checkpoint name '%.*s' is not a plain name",
                         (int)req.name.n, req.name.p);
    if ((rc = resolve_root(k, &req.root, root))) return rc;
    if (req.name.n) {
        copy_name(name, &req.name);
        if ((rc = join(dir, root, name))) return rc;
    } else if (!(rc = join(path, root, "manifest.json")) && exists(path)) {
        /* The root is itself a checkpoint. */
        snprintf(dir, sizeof dir, "%s", root);
        const char *b = strrchr(root, '/');
        int n = snprintf(name, sizeof name, "%s", b && b[1] ? b + 1 : root);
        if (n < 0 || n >= (int)sizeof name)
            return gr_seterr(GR_EINVAL, "checkpoint directory name '%s' is too long", root);
    } else if (!rc) {
        uint64_t step;
        if ((rc = gr_ckpt_latest(root, name, &step))) return rc;
        if ((rc = join(dir, root, name))) return rc;
    }
    if (rc) return rc;
    uint64_t t0 = gr_now_ns();
    gr_ckpt_manifest *m = NULL;
    if ((rc = gr_ckpt_manifest_read(dir, &m))) return rc;
    char *meta = NULL;
    size_t mlen = 0;
    gr_ckpt_load_stats tot;
    memset(&tot, 0, sizeof tot);
    loadset L = {0};
    rc = read_meta(dir, s->cfg.limits.max_string, &meta, &mlen);
    if (!rc && !(req.flags & GR_PROTO_CKPT_RESOLVE)) {
        /* Build every table first; swap them in only when all loaded, so a refused or damaged
         * checkpoint leaves the shard as it was. */
        for (size_t t = 0; !rc && t < m->ntables; t++) {
            gr_table *nt = NULL;
            rc = new_target(s, false, &m->tables[t], &nt, NULL);
            if (!rc) rc = loadset_add(&L, nt, false, 0);
        }
        if (!rc && L.n) {
            gr_table **ts = calloc(L.n, sizeof *ts);
            if (!ts) rc = gr_seterr(GR_ENOMEM, "out of memory");
            for (size_t i = 0; ts && i < L.n; i++) ts[i] = L.v[i].t;
            gr_ckpt_load_opts lo = {s->cfg.shard, s->cfg.shards, NULL, 0};
            if (!rc) rc = gr_ckpt_load(dir, ts, L.n, &lo, &tot);
            free(ts);
        }
        if (!rc) rc = stage_dense(s, dir, m, &L, &tot);
        for (size_t i = 0; !rc && i < L.n; i++) {
            rc = srv_registry_replace(&s->reg, gr_table_get_spec(L.v[i].t), L.v[i].t, L.v[i].dense,
                                      L.v[i].size);
            if (!rc) L.v[i].t = NULL; /* the registry owns it now */
        }
        if (!rc && k->saver) gr_ckpt_saver_force_full(k->saver);
        if (!rc)
            GR_LOGI("shard %u: loaded %s (step %llu, %llu rows, %zu tables)", s->cfg.shard, dir,
                    (unsigned long long)m->step, (unsigned long long)tot.rows_loaded, L.n);
    }
    gr_proto_ckpt_loaded rep;
    memset(&rep, 0, sizeof rep);
    rep.step = m->step;
    rep.rows_loaded = tot.rows_loaded;
    rep.rows_read = tot.rows_read;
    rep.usec = (gr_now_ns() - t0) / 1000;
    rep.shards = m->map.shards;
    rep.tables = (uint32_t)((req.flags & GR_PROTO_CKPT_RESOLVE) ? m->ntables : L.n);
    rep.name = (gr_proto_strv){name, (uint32_t)strlen(name)};
    rep.meta = (gr_proto_strv){meta, (uint32_t)mlen};
    if (!rc) {
        size_t start = out->len;
        rc = gr_proto_begin(out, GR_PROTO_RESPONSE, h->op, 0, 0, h->id);
        if (!rc) rc = gr_proto_put_ckpt_loaded(out, &rep);
        if (!rc) rc = gr_proto_end(out, start);
    }
    loadset_fini(&L);
    free(meta);
    gr_ckpt_manifest_destroy(m);
    return rc;
}

/* ---- the checkpoint thread ---- */

static void run_job(srv_ckpt *k, ck_job *j, gr_proto_buf *out)
{
    gr_server *s = k->s;
    bool fatal = false;
    out->len = 0;
    int rc;
    switch (j->h.op) {
    case GR_OP_CKPT_SAVE: rc = do_save(k, &j->h, j->body, out, &fatal); break;
    case GR_OP_CKPT_COMMIT: rc = do_commit(k, &j->h, j->body, out, &fatal); break;
    default: rc = do_load(k, &j->h, j->body, out, &fatal); break;
    }
    pthread_mutex_lock(&k->mu);
    switch (j->h.op) {
    case GR_OP_CKPT_SAVE: rc ? k->save_errors++ : k->saves++; break;
    case GR_OP_CKPT_COMMIT: rc ? k->commit_errors++ : k->commits++; break;
    default: rc ? k->load_errors++ : k->loads++; break;
    }
    pthread_mutex_unlock(&k->mu);
    if (rc) {
        atomic_fetch_add(&s->ops[j->h.op].errors, 1);
        if (fatal) atomic_fetch_add(&s->bad_frames, 1);
        GR_LOGW("shard %u: %s failed: %s", s->cfg.shard, gr_proto_op_name(j->h.op), gr_errmsg());
        srv_conn_send_error(j->c, j->h.op, j->h.id, rc, gr_errmsg());
    } else {
        srv_conn_send(j->c, out->data, out->len, j->h.op);
    }
}

static void job_free(ck_job *j)
{
    srv_conn_put(j->c);
    free(j->body);
    free(j);
}

static void *ckpt_main(void *arg)
{
    srv_ckpt *k = arg;
    gr_proto_buf out;
    gr_proto_buf_init(&out);
    pthread_mutex_lock(&k->mu);
    for (;;) {
        while (!k->head && !k->stopping) pthread_cond_wait(&k->cv, &k->mu);
        if (!k->head) break;
        ck_job *j = k->head;
        k->head = j->next;
        if (!k->head) k->tail = NULL;
        k->len--;
        if (k->stopping) {
            /* Only the job already running finishes at stop; queued ones are refused. */
            pthread_mutex_unlock(&k->mu);
            atomic_fetch_add(&k->s->ops[j->h.op].errors, 1);
            srv_conn_send_error(j->c, j->h.op, j->h.id, GR_ESHUTDOWN, "shard is shutting down");
            job_free(j);
            pthread_mutex_lock(&k->mu);
            continue;
        }
        k->busy = true;
        pthread_mutex_unlock(&k->mu);
        run_job(k, j, &out);
        job_free(j);
        gr_proto_buf_fini(&out);
        pthread_mutex_lock(&k->mu);
        k->busy = false;
    }
    pthread_mutex_unlock(&k->mu);
    gr_proto_buf_fini(&out);
    return NULL;
}

static int srv_ckpt_create(gr_server *s)
{
    srv_ckpt *k = calloc(1, sizeof *k);
    if (!k) return gr_seterr(GR_ENOMEM, "cannot allocate the checkpoint state");
    k->s = s;
    if (s->cfg.ckpt_root && *s->cfg.ckpt_root) {
        k->base = strdup(s->cfg.ckpt_root);
        if (!k->base) {
            free(k);
            return gr_seterr(GR_ENOMEM, "cannot copy the checkpoint root");
        }
        s->cfg.ckpt_root = k->base;
        /* The root must exist to be resolved; create it as a save would. */
        int rc = make_dirs(k->base);
        if (!rc && !(k->base_real = realpath(k->base, NULL)))
            rc = gr_seterr(GR_EIO, "cannot resolve the checkpoint root %s: %s", k->base,
                           strerror(errno));
        if (rc) {
            free(k->base);
            free(k);
            s->cfg.ckpt_root = NULL;
            return rc;
        }
    }
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    s->ckpt = k;
    return GR_OK;
}

/* Checks that a body decodes, so a peer that does not speak the protocol is cut off by the
 * loop at once, as for every other opcode. */
static int check_body(gr_server *s, const gr_proto_header *h, const uint8_t *body)
{
    if (h->op == GR_OP_CKPT_SAVE) {
        gr_proto_ckpt_save x;
        return gr_proto_decode_ckpt_save(body, h->body_len, &s->cfg.limits, &x);
    }
    if (h->op == GR_OP_CKPT_COMMIT) {
        gr_proto_ckpt_commit x;
        return gr_proto_decode_ckpt_commit(body, h->body_len, &s->cfg.limits, &x);
    }
    gr_proto_ckpt_load x;
    return gr_proto_decode_ckpt_load(body, h->body_len, &s->cfg.limits, &x);
}

static int submit(gr_server *s, srv_conn *c, const gr_proto_header *h, uint8_t *body)
{
    srv_ckpt *k = s->ckpt;
    const char *why = NULL;
    int rc = check_body(s, h, body);
    if (rc == GR_EPROTO || rc == GR_ETOOBIG) {
        free(body);
        return rc;
    }
    if (rc) {
        /* Well-formed but invalid (e.g. a zstd level out of range): answer, keep the peer. */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", gr_errmsg());
        free(body);
        atomic_fetch_add(&s->ops[h->op].errors, 1);
        srv_conn_send_error(c, h->op, h->id, rc, msg);
        return GR_OK;
    }
    ck_job *j = calloc(1, sizeof *j);
    pthread_mutex_lock(&k->mu);
    if (!j) {
        rc = GR_ENOMEM;
        why = "server out of memory for a checkpoint request";
    } else if (k->stopping) {
        rc = GR_ESHUTDOWN;
        why = "shard is shutting down";
    } else if (k->len >= QUEUE_MAX) {
        rc = GR_EBUSY;
        why = "too many checkpoint requests queued on this shard";
    } else if (!k->live) {
        /* Started on first use: most shards never checkpoint. */
        if (pthread_create(&k->thread, NULL, ckpt_main, k) == 0) {
            k->live = true;
        } else {
            rc = GR_EINTERNAL;
            why = "cannot start the checkpoint thread";
        }
    }
    if (!rc) {
        j->c = c;
        srv_conn_get(c);
        j->h = *h;
        j->body = body;
        if (k->tail) k->tail->next = j;
        else k->head = j;
        k->tail = j;
        k->len++;
        pthread_cond_signal(&k->cv);
    }
    pthread_mutex_unlock(&k->mu);
    if (rc) {
        free(j);
        free(body);
        atomic_fetch_add(&s->ops[h->op].errors, 1);
        srv_conn_send_error(c, h->op, h->id, rc, why);
    }
    return GR_OK;
}

static void srv_ckpt_stop(gr_server *s)
{
    srv_ckpt *k = s ? s->ckpt : NULL;
    if (!k) return;
    pthread_mutex_lock(&k->mu);
    k->stopping = true;
    bool live = k->live;
    k->live = false;
    pthread_cond_broadcast(&k->cv);
    pthread_mutex_unlock(&k->mu);
    if (live) pthread_join(k->thread, NULL);
}

static void srv_ckpt_destroy(gr_server *s)
{
    srv_ckpt *k = s ? s->ckpt : NULL;
    if (!k) return;
    srv_ckpt_stop(s);
    srv_ckpt_warm_set(s, NULL, 0);
    gr_ckpt_saver_destroy(k->saver);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->cv);
    free(k->base);
    free(k->base_real);
    s->cfg.ckpt_root = NULL;
    free(k);
    s->ckpt = NULL;
}

static void srv_ckpt_stats_json(gr_server *s, void *rootp)
{
    srv_ckpt *k = s->ckpt;
    cJSON *root = rootp;
    if (!k || !root) return;
    cJSON *o = cJSON_AddObjectToObject(root, "ckpt");
    if (!o) return;
    pthread_mutex_lock(&k->mu);
    cJSON_AddNumberToObject(o, "saves", (double)k->saves);
    cJSON_AddNumberToObject(o, "save_errors", (double)k->save_errors);
    cJSON_AddNumberToObject(o, "commits", (double)k->commits);
    cJSON_AddNumberToObject(o, "commit_errors", (double)k->commit_errors);
    cJSON_AddNumberToObject(o, "loads", (double)k->loads);
    cJSON_AddNumberToObject(o, "load_errors", (double)k->load_errors);
    cJSON_AddBoolToObject(o, "running", k->busy);
    cJSON_AddNumberToObject(o, "queued", (double)k->len);
    if (k->last_name[0]) {
        cJSON *l = cJSON_AddObjectToObject(o, "last_save");
        cJSON_AddStringToObject(l, "name", k->last_name);
        cJSON_AddNumberToObject(l, "step", (double)k->last_step);
        cJSON_AddStringToObject(l, "kind", k->last_kind ? "delta" : "full");
        cJSON_AddNumberToObject(l, "rows", (double)k->last_rows);
        cJSON_AddNumberToObject(l, "bytes", (double)k->last_bytes);
        cJSON_AddNumberToObject(l, "seconds", k->last_seconds);
    }
    pthread_mutex_unlock(&k->mu);
}

/* The checkpoint opcodes' row in the table of operations (runs on the connection loop). */
void srv_ckpt_take(gr_server *s, srv_conn *c, const gr_proto_header *h, uint8_t *body)
{
    int rc = submit(s, c, h, body);
    if (rc) { /* the body does not decode */
        atomic_fetch_add(&s->ops[h->op].errors, 1);
        atomic_fetch_add(&s->bad_frames, 1);
        srv_conn_write_error(c, h->op, h->id, rc, gr_errmsg(), true);
    }
}

const srv_module srv_ckpt_module = {
    .name = "ckpt",
    .create = srv_ckpt_create,
    .start = NULL,
    .stop = srv_ckpt_stop,
    .destroy = srv_ckpt_destroy,
    .stats_json = srv_ckpt_stats_json,
    .conn_closed = NULL,
};

/* A standby restoring a lost shard: the same load as CKPT_LOAD, run on the caller's thread
 * while the shard is fenced (no checkpoint request can be admitted meanwhile), so the rows
 * come back through exactly the code a remote load uses. */
int gr_server_ckpt_load(gr_server *s, const char *root, const char *name,
                        gr_server_ckpt_loaded *out)
{
    if (out) memset(out, 0, sizeof *out);
    srv_ckpt *k = s ? s->ckpt : NULL;
    if (!k || !root) return gr_seterr(GR_EINVAL, "gr_server_ckpt_load: no server or no root");
    gr_proto_buf req, rep;
    gr_proto_buf_init(&req);
    gr_proto_buf_init(&rep);
    gr_proto_ckpt_load l = {0, {root, (uint32_t)strlen(root)},
                            {name ? name : "", name ? (uint32_t)strlen(name) : 0}};
    int rc = gr_proto_put_ckpt_load(&req, &l);
    bool fatal = false;
    gr_proto_header h = {GR_PROTO_VERSION, GR_PROTO_REQUEST, GR_OP_CKPT_LOAD, 0, 0,
                         (uint32_t)req.len, 0};
    if (!rc) rc = do_load(k, &h, req.data, &rep, &fatal);
    pthread_mutex_lock(&k->mu);
    rc ? k->load_errors++ : k->loads++;
    pthread_mutex_unlock(&k->mu);
    gr_proto_ckpt_loaded got;
    if (!rc)
        rc = gr_proto_decode_ckpt_loaded(rep.data + GR_PROTO_HEADER_SIZE,
                                         rep.len - GR_PROTO_HEADER_SIZE, &s->cfg.limits, &got);
    if (!rc && out) {
        snprintf(out->name, sizeof out->name, "%.*s", (int)got.name.n, got.name.p);
        out->step = got.step;
        out->rows_loaded = got.rows_loaded;
        out->rows_read = got.rows_read;
        out->usec = got.usec;
    }
    gr_proto_buf_fini(&req);
    gr_proto_buf_fini(&rep);
    return rc;
}

/* ---- a standby's tables made ready ahead (warm.c prepares them) ---- */

int srv_ckpt_resolve(gr_server *s, const char *root, char *out, size_t cap)
{
    srv_ckpt *k = s ? s->ckpt : NULL;
    if (!k || !root || cap < PATH_MAX_LEN) return gr_seterr(GR_EINVAL, "srv_ckpt_resolve");
    gr_proto_strv v = {root, (uint32_t)strlen(root)};
    return resolve_root(k, &v, out);
}

void srv_ckpt_warm_set(gr_server *s, gr_table **tables, size_t n)
{
    srv_ckpt *k = s->ckpt;
    if (!k) { /* no checkpoint module: nothing could adopt them */
        for (size_t i = 0; i < n; i++) gr_table_destroy(tables[i]);
        free(tables);
        return;
    }
    pthread_mutex_lock(&k->mu);
    gr_table **old = k->warm;
    size_t nold = k->nwarm;
    k->warm = tables;
    k->nwarm = n;
    pthread_mutex_unlock(&k->mu);
    for (size_t i = 0; i < nold; i++) gr_table_destroy(old[i]);
    free(old);
}

gr_table *srv_ckpt_warm_take(gr_server *s, const gr_table_spec *spec)
{
    srv_ckpt *k = s->ckpt;
    gr_table *t = NULL;
    if (!k) return NULL;
    pthread_mutex_lock(&k->mu);
    for (size_t i = 0; i < k->nwarm && !t; i++)
        if (k->warm[i] && gr_table_spec_equal(gr_table_get_spec(k->warm[i]), spec)) {
            t = k->warm[i];
            k->warm[i] = NULL;
            k->warm_adopted++;
        }
    pthread_mutex_unlock(&k->mu);
    return t;
}

uint32_t srv_ckpt_warm_adopted(gr_server *s)
{
    srv_ckpt *k = s->ckpt;
    if (!k) return 0;
    pthread_mutex_lock(&k->mu);
    uint32_t n = k->warm_adopted;
    pthread_mutex_unlock(&k->mu);
    return n;
}
