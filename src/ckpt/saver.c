/* A root of checkpoints: the saver's full/delta policy (a delta only on top of the checkpoint
 * this saver last wrote and saw committed; any failure makes the next save full), the newest
 * complete checkpoint, retention that never breaks a kept delta chain, exports for serving and
 * resharding. */
#include "ckpt/ckpt_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct gr_ckpt_saver {
    char root[4096];
    gr_ckpt_saver_opts o;
    bool have_last;               /* the last write succeeded and consumed the dirty marks */
    char last_name[GR_CKPT_NAME_MAX];
    uint64_t last_checksum;       /* of our file in it */
    uint32_t deltas_since_full;
    bool force_full;
    uint64_t fault_after;
};

int gr_ckpt_saver_create(const char *root, const gr_ckpt_saver_opts *opts, gr_ckpt_saver **out)
{
    gr_ckpt_saver_opts def = {0, 1, false, 0, 0, 0};
    const gr_ckpt_saver_opts *o = opts ? opts : &def;
    if (!root || !out) return gr_seterr(GR_EINVAL, "gr_ckpt_saver_create: NULL argument");
    if (o->shards == 0 || o->shards > GR_CKPT_SHARDS_MAX || o->shard >= o->shards)
        return gr_seterr(GR_EINVAL, "shard %u of %u is out of range", o->shard, o->shards);
    if (o->zstd_level < 0 || o->zstd_level > 19)
        return gr_seterr(GR_EINVAL, "zstd level %d is out of range 0..19", o->zstd_level);
    if (strlen(root) > 3000) return gr_seterr(GR_EINVAL, "checkpoint root path is too long");
    int rc = ck_mkdir(root);
    if (rc != GR_OK) return rc;
    gr_ckpt_saver *s = calloc(1, sizeof *s);
    if (!s) return gr_seterr(GR_ENOMEM, "out of memory");
    snprintf(s->root, sizeof s->root, "%s", root);
    s->o = *o;
    *out = s;
    return GR_OK;
}

void gr_ckpt_saver_destroy(gr_ckpt_saver *s) { free(s); }

void gr_ckpt_saver_force_full(gr_ckpt_saver *s) { s->force_full = true; }

void gr_ckpt_saver_set_fault(gr_ckpt_saver *s, uint64_t after_rows) { s->fault_after = after_rows; }

/* True when checkpoint `name` is committed and lists our file with the checksum we wrote. */
static bool parent_has_our_file(const gr_ckpt_saver *s, const char *name)
{
    char dir[4096];
    if (ck_path(dir, sizeof dir, s->root, name) != GR_OK) return false;
    gr_ckpt_manifest *m;
    if (gr_ckpt_manifest_read(dir, &m) != GR_OK) {
        gr_clearerr();
        return false;
    }
    bool ok = m->map.shards == s->o.shards && m->kind != GR_CKPT_EXPORT &&
              m->files[s->o.shard].checksum == s->last_checksum;
    gr_ckpt_manifest_destroy(m);
    return ok;
}

int gr_ckpt_saver_write(gr_ckpt_saver *s, const char *name, const char *parent, uint64_t step,
                        gr_table *const *tables, size_t ntables, gr_ckpt_file_info *info)
{
    if (!s || !name) return gr_seterr(GR_EINVAL, "gr_ckpt_saver_write: NULL argument");
    if (strlen(name) >= GR_CKPT_NAME_MAX || strchr(name, '/') || !strcmp(name, ".") ||
        !strcmp(name, ".."))
        return gr_seterr(GR_EINVAL, "checkpoint name '%s' is not a plain name", name);
    bool delta = s->o.incremental && !s->force_full && parent && s->have_last &&
                 !strcmp(parent, s->last_name) &&
                 (s->o.full_every == 0 || s->deltas_since_full + 1 < s->o.full_every) &&
                 parent_has_our_file(s, parent);
    char dir[4096], mpath[4096];
    int rc = ck_path(dir, sizeof dir, s->root, name);
    if (rc == GR_OK) rc = ck_path(mpath, sizeof mpath, dir, "manifest.json");
    if (rc != GR_OK) return rc;
    struct stat st;
    if (stat(mpath, &st) == 0)
        return gr_seterr(GR_EEXIST, "checkpoint %s already exists", dir);
    gr_ckpt_write_opts wo = {0};
    wo.kind = delta ? GR_CKPT_DELTA : GR_CKPT_FULL;
    wo.shard = s->o.shard;
    wo.shards = s->o.shards;
    wo.step = step;
    wo.zstd_level = s->o.zstd_level;
    wo.fault_after_rows = s->fault_after;
    s->fault_after = 0;
    gr_ckpt_file_info fi;
    /* From here the tables' dirty marks are being consumed: only a success keeps the chain. */
    s->have_last = false;
    rc = gr_ckpt_write_shard(dir, tables, ntables, &wo, &fi);
    if (rc != GR_OK) return rc;
    s->have_last = true;
    snprintf(s->last_name, sizeof s->last_name, "%s", name);
    s->last_checksum = fi.checksum;
    s->deltas_since_full = delta ? s->deltas_since_full + 1 : 0;
    s->force_full = false;
    if (info) *info = fi;
    return GR_OK;
}

int gr_ckpt_saver_save(gr_ckpt_saver *s, uint64_t step, gr_table *const *tables, size_t ntables,
                       char *name_out, gr_ckpt_file_info *info)
{
    if (!s) return gr_seterr(GR_EINVAL, "gr_ckpt_saver_save: NULL saver");
    if (s->o.shards != 1)
        return gr_seterr(GR_EINVAL, "gr_ckpt_saver_save is for one-shard processes; this saver "
                         "is shard %u of %u (use gr_ckpt_saver_write and gr_ckpt_commit)",
                         s->o.shard, s->o.shards);
    char name[GR_CKPT_NAME_MAX], parent[GR_CKPT_NAME_MAX], dir[4096];
    gr_ckpt_name(step, name);
    snprintf(parent, sizeof parent, "%s", s->have_last ? s->last_name : "");
    int rc = ck_path(dir, sizeof dir, s->root, name);
    if (rc != GR_OK) return rc;
    /* A directory without a manifest is what a crashed save of this step left: start over. */
    gr_ckpt_manifest *m;
    rc = gr_ckpt_manifest_read(dir, &m);
    if (rc == GR_OK) {
        gr_ckpt_manifest_destroy(m);
        return gr_seterr(GR_EEXIST, "checkpoint %s already exists", dir);
    }
    gr_clearerr();
    if ((rc = ck_rmtree(dir)) != GR_OK) return rc;
    gr_ckpt_file_info fi;
    rc = gr_ckpt_saver_write(s, name, parent[0] ? parent : NULL, step, tables, ntables, &fi);
    if (rc != GR_OK) return rc;
    gr_ckpt_commit_opts co = {1, NULL, fi.kind == GR_CKPT_DELTA ? parent : NULL};
    rc = gr_ckpt_commit(dir, &co);
    if (rc != GR_OK) {
        s->have_last = false;
        return rc;
    }
    if (name_out) snprintf(name_out, GR_CKPT_NAME_MAX, "%s", name);
    if (info) *info = fi;
    if (s->o.keep) {
        char msg[1024];
        if (gr_ckpt_retain(s->root, s->o.keep, NULL) != GR_OK) {
            /* The new checkpoint is complete; failing to delete old ones is not a failed save. */
            snprintf(msg, sizeof msg, "%s", gr_errmsg());
            GR_LOGW("checkpoint retention in %s: %s", s->root, msg);
            gr_clearerr();
        }
    }
    return GR_OK;
}

/* ---- listing a root ---- */

typedef struct entry {
    char name[GR_CKPT_NAME_MAX];
    uint64_t step;
    gr_ckpt_manifest *m; /* NULL when incomplete (or unreadable) */
    bool keep;
} entry;

static int cmp_entry_desc(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    return x->step < y->step ? 1 : x->step > y->step ? -1 : 0;
}

static void free_entries(entry *e, size_t n)
{
    for (size_t i = 0; i < n; i++) gr_ckpt_manifest_destroy(e[i].m);
    free(e);
}

/* Every "step-N" directory under root, newest first, with its manifest when it has one. */
static int list_root(const char *root, entry **out, size_t *n_out)
{
    DIR *d = opendir(root);
    if (!d) {
        if (errno == ENOENT) return gr_seterr(GR_ENOENT, "%s: no such checkpoint root", root);
        return gr_seterr(GR_EIO, "cannot open %s: %s", root, strerror(errno));
    }
    entry *e = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    int rc = GR_OK;
    while ((de = readdir(d)) != NULL) {
        uint64_t step;
        if (strlen(de->d_name) >= GR_CKPT_NAME_MAX || !ck_parse_name(de->d_name, &step)) continue;
        char path[4096];
        struct stat st;
        if (ck_path(path, sizeof path, root, de->d_name) != GR_OK) continue;
        if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            entry *ne = realloc(e, nc * sizeof *ne);
            if (!ne) {
                rc = gr_seterr(GR_ENOMEM, "out of memory");
                break;
            }
            e = ne;
            cap = nc;
        }
        memset(&e[n], 0, sizeof e[n]);
        snprintf(e[n].name, sizeof e[n].name, "%s", de->d_name);
        e[n].step = step;
        if (gr_ckpt_manifest_read(path, &e[n].m) != GR_OK) {
            e[n].m = NULL;
            gr_clearerr();
        }
        n++;
    }
    closedir(d);
    if (rc != GR_OK) {
        free_entries(e, n);
        return rc;
    }
    if (n) qsort(e, n, sizeof *e, cmp_entry_desc);
    *out = e;
    *n_out = n;
    return GR_OK;
}

static entry *find_entry(entry *e, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(e[i].name, name)) return &e[i];
    return NULL;
}

/* True when every ancestor of e is present and complete. */
static bool chain_complete(entry *all, size_t n, const entry *e)
{
    for (size_t depth = 0; e && e->m; depth++) {
        if (e->m->kind != GR_CKPT_DELTA) return true;
        if (depth > GR_CKPT_CHAIN_MAX) return false;
        const entry *p = find_entry(all, n, e->m->parent);
        if (!p || !p->m || p->m->step >= e->m->step) return false;
        e = p;
    }
    return false;
}

int gr_ckpt_latest(const char *root, char *name_out, uint64_t *step_out)
{
    entry *e;
    size_t n;
    int rc = list_root(root, &e, &n);
    if (rc != GR_OK) return rc;
    rc = gr_seterr(GR_ENOENT, "%s: no complete checkpoint", root);
    for (size_t i = 0; i < n; i++) {
        if (!e[i].m || e[i].m->kind == GR_CKPT_EXPORT || !chain_complete(e, n, &e[i])) continue;
        if (name_out) snprintf(name_out, GR_CKPT_NAME_MAX, "%s", e[i].name);
        if (step_out) *step_out = e[i].m->step;
        gr_clearerr();
        rc = GR_OK;
        break;
    }
    free_entries(e, n);
    return rc;
}

int gr_ckpt_resolve(const char *path, char *dir_out, size_t cap)
{
    if (!path || !dir_out) return gr_seterr(GR_EINVAL, "gr_ckpt_resolve: NULL argument");
    char mp[4096];
    struct stat st;
    if (stat(path, &st) != 0)
        return gr_seterr(GR_ENOENT, "%s: no such checkpoint directory or checkpoint root", path);
    if (!S_ISDIR(st.st_mode))
        return gr_seterr(GR_EINVAL, "%s is not a directory (want a checkpoint or a root of them)",
                         path);
    int rc = ck_path(mp, sizeof mp, path, "manifest.json");
    if (rc != GR_OK) return rc;
    if (stat(mp, &st) == 0) {
        if ((size_t)snprintf(dir_out, cap, "%s", path) >= cap)
            return gr_seterr(GR_EINVAL, "checkpoint path is too long");
        return GR_OK;
    }
    char name[GR_CKPT_NAME_MAX];
    if ((rc = gr_ckpt_latest(path, name, NULL)) != GR_OK)
        return gr_seterr(rc, "%s: neither a checkpoint (no manifest.json) nor a root holding a "
                         "complete one", path);
    return ck_path(dir_out, cap, path, name);
}

/* Bytes of the regular files in dir and its subdirectories (one level: the parts). */
static uint64_t dir_bytes(const char *dir, int depth)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t sum = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char p[4096];
        struct stat st;
        if (ck_path(p, sizeof p, dir, de->d_name) != GR_OK || lstat(p, &st) != 0) continue;
        if (S_ISREG(st.st_mode)) sum += (uint64_t)st.st_size;
        else if (S_ISDIR(st.st_mode) && depth < 2) sum += dir_bytes(p, depth + 1);
    }
    closedir(d);
    return sum;
}

int gr_ckpt_list(const char *root, gr_ckpt_entry **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    entry *e;
    size_t n;
    int rc = list_root(root, &e, &n);
    if (rc != GR_OK) return rc;
    gr_ckpt_entry *v = calloc(n ? n : 1, sizeof *v);
    if (!v) {
        free_entries(e, n);
        return gr_seterr(GR_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        gr_ckpt_entry *x = &v[i];
        snprintf(x->name, sizeof x->name, "%s", e[i].name);
        x->step = e[i].step;
        x->has_manifest = e[i].m != NULL;
        x->complete = e[i].m && chain_complete(e, n, &e[i]);
        x->kind = e[i].m ? e[i].m->kind : GR_CKPT_FULL;
        x->created = e[i].m ? e[i].m->created : 0;
        if (e[i].m) snprintf(x->parent, sizeof x->parent, "%s", e[i].m->parent);
        char p[4096];
        if (ck_path(p, sizeof p, root, e[i].name) == GR_OK) x->bytes = dir_bytes(p, 0);
    }
    free_entries(e, n);
    *out = v;
    *n_out = n;
    return GR_OK;
}

/* Deletes a complete checkpoint so that no reader can ever see it half-deleted: the manifest
 * goes first (and is made durable), then the files. */
static int delete_checkpoint(const char *root, const char *name)
{
    char dir[4096], mp[4096];
    int rc = ck_path(dir, sizeof dir, root, name);
    if (rc == GR_OK) rc = ck_path(mp, sizeof mp, dir, "manifest.json");
    if (rc != GR_OK) return rc;
    if (unlink(mp) != 0 && errno != ENOENT)
        return gr_seterr(GR_EIO, "cannot remove %s: %s", mp, strerror(errno));
    rc = gr_fsync_dir(dir);
    if (rc != GR_OK) return rc;
    rc = ck_rmtree(dir);
    if (rc == GR_OK) rc = gr_fsync_dir(root);
    return rc;
}

/* Removes "*.tmp.*" files a crashed write left in a checkpoint directory. */
static int clean_temporaries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return GR_OK;
    struct dirent *de;
    int rc = GR_OK;
    while ((de = readdir(d)) != NULL) {
        if (!strstr(de->d_name, ".tmp.")) continue;
        char p[4096];
        if (ck_path(p, sizeof p, dir, de->d_name) != GR_OK) continue;
        if (unlink(p) != 0 && errno != ENOENT)
            rc = gr_seterr(GR_EIO, "cannot remove %s: %s", p, strerror(errno));
    }
    closedir(d);
    return rc;
}

int gr_ckpt_retain(const char *root, uint32_t keep, uint32_t *deleted)
{
    entry *e;
    size_t n;
    if (deleted) *deleted = 0;
    int rc = list_root(root, &e, &n);
    if (rc != GR_OK) return rc;
    /* Keep the newest `keep` complete checkpoints and, transitively, every parent they need. */
    uint32_t kept = 0;
    uint64_t newest_complete = 0;
    bool any_complete = false;
    for (size_t i = 0; i < n; i++) {
        if (!e[i].m) continue;
        if (!any_complete) newest_complete = e[i].step;
        any_complete = true;
        if (keep == 0 || kept < keep) {
            kept++;
            for (entry *x = &e[i]; x && x->m && !x->keep;) {
                x->keep = true;
                x = x->m->kind == GR_CKPT_DELTA ? find_entry(e, n, x->m->parent) : NULL;
            }
        }
    }
    uint32_t del = 0;
    for (size_t i = 0; i < n && rc == GR_OK; i++) {
        char dir[4096];
        if (ck_path(dir, sizeof dir, root, e[i].name) != GR_OK) continue;
        if (e[i].keep) {
            rc = clean_temporaries(dir);
        } else if (e[i].m) {
            rc = delete_checkpoint(root, e[i].name);
            if (rc == GR_OK) del++;
        } else if (any_complete && e[i].step < newest_complete) {
            /* Incomplete and older than a complete checkpoint: a crashed or abandoned save
             * that nothing will finish. Newer incomplete ones may be a save in progress. */
            rc = ck_rmtree(dir);
        }
    }
    free_entries(e, n);
    if (deleted) *deleted = del;
    return rc;
}

/* ---- exports and resharding ---- */

int gr_ckpt_export(const char *dir, gr_table *const *tables, size_t ntables, uint64_t step,
                   bool f16, int zstd_level, gr_ckpt_file_info *info)
{
    gr_ckpt_write_opts wo = {0};
    wo.step = step;
    wo.kind = GR_CKPT_EXPORT;
    wo.shard = 0;
    wo.shards = 1;
    wo.zstd_level = zstd_level;
    wo.export_f16 = f16;
    int rc = gr_ckpt_write_shard(dir, tables, ntables, &wo, info);
    if (rc != GR_OK) return rc;
    gr_ckpt_commit_opts co = {1, NULL, NULL};
    return gr_ckpt_commit(dir, &co);
}

int gr_ckpt_reshard(const char *src, const char *dst, uint32_t shards, int zstd_level)
{
    if (!src || !dst) return gr_seterr(GR_EINVAL, "gr_ckpt_reshard: NULL argument");
    if (shards == 0 || shards > GR_CKPT_SHARDS_MAX)
        return gr_seterr(GR_EINVAL, "shard count %u is out of range 1..%u", shards,
                         GR_CKPT_SHARDS_MAX);
    gr_ckpt_manifest *m;
    int rc = gr_ckpt_manifest_read(src, &m);
    if (rc != GR_OK) return rc;
    char mp[4096];
    struct stat st;
    if (ck_path(mp, sizeof mp, dst, "manifest.json") == GR_OK && stat(mp, &st) == 0) {
        gr_ckpt_manifest_destroy(m);
        return gr_seterr(GR_EEXIST, "%s already holds a checkpoint", dst);
    }
    gr_table **t = calloc(m->ntables ? m->ntables : 1, sizeof *t);
    if (!t) {
        gr_ckpt_manifest_destroy(m);
        return gr_seterr(GR_ENOMEM, "out of memory");
    }
    gr_ckpt_write_opts wo = {0};
    wo.kind = m->kind == GR_CKPT_EXPORT ? GR_CKPT_EXPORT : GR_CKPT_FULL;
    wo.export_f16 = m->weights_f16;
    wo.shards = shards;
    wo.step = m->step;
    wo.zstd_level = zstd_level;
    gr_ckpt_load_opts lo = {0, shards, NULL, 0};
    for (uint32_t j = 0; j < shards && rc == GR_OK; j++) {
        /* Staging tables without capacity or memory caps, so merging shards never evicts;
         * the files carry the checkpoint's own specs. */
        size_t made = 0;
        for (; made < m->ntables; made++) {
            gr_table_spec sp = m->tables[made];
            sp.capacity = 0;
            sp.mem_limit = 0;
            if ((rc = gr_table_create(&sp, &t[made])) != GR_OK) break;
        }
        if (rc == GR_OK) {
            lo.shard = j;
            /* The staging tables differ from the checkpoint only in their caps: compare the
             * checkpoint against its own specs. */
            rc = ck_load(src, t, m->tables, m->ntables, &lo, NULL);
        }
        if (rc == GR_OK) {
            wo.shard = j;
            rc = ck_write_shard(dst, t, m->tables, m->ntables, &wo, NULL);
        }
        for (size_t i = 0; i < made; i++) gr_table_destroy(t[i]);
    }
    if (rc == GR_OK) {
        gr_ckpt_commit_opts co = {shards, NULL, NULL};
        rc = gr_ckpt_commit(dst, &co);
    }
    free(t);
    gr_ckpt_manifest_destroy(m);
    return rc;
}
