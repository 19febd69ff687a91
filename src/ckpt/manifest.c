/* manifest.json: what makes a checkpoint exist. It is written last (atomically) by
 * gr_ckpt_commit from the shard files' own summaries, and parsed strictly: every field is
 * type- and range-checked, so a damaged manifest is refused with the field it got wrong. */
#include "ckpt/ckpt_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#define MANIFEST_MAX (64ull << 20)
#define JSON_INT_MAX 9007199254740992.0 /* 2^53: larger integers are not exact in JSON */

void gr_ckpt_manifest_destroy(gr_ckpt_manifest *m)
{
    if (!m) return;
    if (m->files)
        for (uint32_t i = 0; i < m->map.shards; i++) {
            free(m->files[i].rows);
            free(m->files[i].keys);
        }
    free(m->files);
    free(m->tables);
    free(m->parts);
    free(m);
}

long gr_ckpt_manifest_table(const gr_ckpt_manifest *m, const char *name)
{
    for (size_t i = 0; i < m->ntables; i++)
        if (!strcmp(m->tables[i].name, name)) return (long)i;
    return -1;
}

static int kind_from_name(const char *s, gr_ckpt_kind *k)
{
    if (!strcmp(s, "full")) *k = GR_CKPT_FULL;
    else if (!strcmp(s, "delta")) *k = GR_CKPT_DELTA;
    else if (!strcmp(s, "export")) *k = GR_CKPT_EXPORT;
    else return GR_EINVAL;
    return GR_OK;
}

static int get_u64(const cJSON *o, const char *name, uint64_t max, uint64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v) return gr_seterr(GR_ECORRUPT, "manifest: field '%s' is missing", name);
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || !(d >= 0) || d > JSON_INT_MAX || d > (double)max ||
        d != (double)(uint64_t)d)
        return gr_seterr(GR_ECORRUPT, "manifest: field '%s' is not an integer in 0..%llu", name,
                         (unsigned long long)max);
    *out = (uint64_t)d;
    return GR_OK;
}

static int get_str(const cJSON *o, const char *name, char *out, size_t cap, bool optional)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v)) {
        if (optional) {
            out[0] = '\0';
            return GR_OK;
        }
        return gr_seterr(GR_ECORRUPT, "manifest: field '%s' is missing", name);
    }
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap)
        return gr_seterr(GR_ECORRUPT, "manifest: field '%s' is not a string of under %zu bytes",
                         name, cap);
    snprintf(out, cap, "%s", v->valuestring);
    return GR_OK;
}

static bool safe_name(const char *s)
{
    /* Names are plain file names inside the root: no separators, no "." or "..". */
    if (!*s || !strcmp(s, ".") || !strcmp(s, "..")) return false;
    for (; *s; s++)
        if (*s == '/' || (unsigned char)*s < 0x20) return false;
    return true;
}

static int parse_u64_array(const cJSON *a, size_t n, const char *what, uint32_t shard,
                           uint64_t **out)
{
    if (!cJSON_IsArray(a) || (size_t)cJSON_GetArraySize(a) != n)
        return gr_seterr(GR_ECORRUPT, "manifest: file %u: '%s' must list %zu counts", shard, what,
                         n);
    uint64_t *v = calloc(n ? n : 1, sizeof *v);
    if (!v) return gr_seterr(GR_ENOMEM, "out of memory");
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, a)
    {
        double d = it->valuedouble;
        if (!cJSON_IsNumber(it) || !(d >= 0) || d > JSON_INT_MAX || d != (double)(uint64_t)d) {
            free(v);
            return gr_seterr(GR_ECORRUPT, "manifest: file %u: bad '%s' count", shard, what);
        }
        v[i++] = (uint64_t)d;
    }
    *out = v;
    return GR_OK;
}

static int parse_checksum(const char *s, uint64_t *out)
{
    if (strlen(s) != 16) return GR_ECORRUPT;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return GR_ECORRUPT;
        v = (v << 4) | (uint64_t)d;
    }
    *out = v;
    return GR_OK;
}

/* "parts": optional (absent in checkpoints written before it existed, and in those with none),
 * a list of distinct plain names of subdirectories. */
static int parse_parts(const cJSON *root, gr_ckpt_manifest *m)
{
    const cJSON *parts = cJSON_GetObjectItemCaseSensitive(root, "parts");
    if (!parts) return GR_OK;
    if (!cJSON_IsArray(parts) || cJSON_GetArraySize(parts) > (int)GR_CKPT_SHARDS_MAX)
        return gr_seterr(GR_ECORRUPT, "manifest: 'parts' must be an array of at most %d names",
                         GR_CKPT_SHARDS_MAX);
    size_t n = (size_t)cJSON_GetArraySize(parts);
    m->parts = calloc(n ? n : 1, sizeof *m->parts);
    if (!m->parts) return gr_seterr(GR_ENOMEM, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, parts)
    {
        if (!cJSON_IsString(it) || strlen(it->valuestring) >= GR_CKPT_NAME_MAX ||
            !safe_name(it->valuestring))
            return gr_seterr(GR_ECORRUPT, "manifest: part %zu is not a plain name", m->nparts);
        for (size_t k = 0; k < m->nparts; k++)
            if (!strcmp(m->parts[k], it->valuestring))
                return gr_seterr(GR_ECORRUPT, "manifest: part '%s' listed twice", it->valuestring);
        snprintf(m->parts[m->nparts++], GR_CKPT_NAME_MAX, "%s", it->valuestring);
    }
    return GR_OK;
}

static int parse_root(const cJSON *root, gr_ckpt_manifest *m)
{
    char buf[64];
    int rc;
    if (!cJSON_IsObject(root)) return gr_seterr(GR_ECORRUPT, "manifest: not a JSON object");
    if (get_str(root, "format", buf, sizeof buf, false) != GR_OK ||
        strcmp(buf, "granary-checkpoint") != 0)
        return gr_seterr(GR_ECORRUPT, "manifest: 'format' is not \"granary-checkpoint\"");
    uint64_t v = 0;
    if ((rc = get_u64(root, "version", UINT32_MAX, &v)) != GR_OK) return rc;
    if (v != GR_CKPT_VERSION)
        return gr_seterr(GR_EVERSION, "manifest: format version %llu, this build reads %d",
                         (unsigned long long)v, GR_CKPT_VERSION);
    m->version = (uint32_t)v;
    if ((rc = get_str(root, "kind", buf, sizeof buf, false)) != GR_OK) return rc;
    if (kind_from_name(buf, &m->kind) != GR_OK)
        return gr_seterr(GR_ECORRUPT, "manifest: unknown kind '%s'", buf);
    if ((rc = get_u64(root, "step", UINT64_MAX, &m->step)) != GR_OK) return rc;
    if ((rc = get_u64(root, "created", UINT64_MAX, &m->created)) != GR_OK) return rc;
    if ((rc = get_str(root, "parent", m->parent, sizeof m->parent, true)) != GR_OK) return rc;
    if (m->parent[0] && !safe_name(m->parent))
        return gr_seterr(GR_ECORRUPT, "manifest: parent '%s' is not a plain name", m->parent);
    if ((m->kind == GR_CKPT_DELTA) != (m->parent[0] != '\0'))
        return gr_seterr(GR_ECORRUPT, "manifest: a %s checkpoint %s a parent",
                         gr_ckpt_kind_name(m->kind), m->parent[0] ? "cannot have" : "needs");
    if ((rc = get_str(root, "compression", m->compression, sizeof m->compression, false)) != GR_OK)
        return rc;
    if (strcmp(m->compression, "none") && strcmp(m->compression, "zstd"))
        return gr_seterr(GR_ECORRUPT, "manifest: unknown compression '%s'", m->compression);
    if ((rc = get_str(root, "weights", buf, sizeof buf, false)) != GR_OK) return rc;
    if (!strcmp(buf, "f16")) m->weights_f16 = true;
    else if (strcmp(buf, "f32") && strcmp(buf, "table"))
        return gr_seterr(GR_ECORRUPT, "manifest: unknown weights '%s'", buf);
    if (m->weights_f16 && m->kind != GR_CKPT_EXPORT)
        return gr_seterr(GR_ECORRUPT, "manifest: f16 weights outside an export");

    uint64_t shards = 0;
    if ((rc = get_u64(root, "shards", GR_CKPT_SHARDS_MAX, &shards)) != GR_OK) return rc;
    if (shards == 0) return gr_seterr(GR_ECORRUPT, "manifest: 'shards' is 0");
    m->map.shards = (uint32_t)shards;

    /* slot_map: [[first, last, shard], ...] covering every slot exactly once, in order. */
    const cJSON *sm = cJSON_GetObjectItemCaseSensitive(root, "slot_map");
    if (!cJSON_IsArray(sm)) return gr_seterr(GR_ECORRUPT, "manifest: 'slot_map' is missing");
    uint32_t next = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, sm)
    {
        double r[3];
        if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 3)
            return gr_seterr(GR_ECORRUPT, "manifest: slot_map entries are [first, last, shard]");
        for (int k = 0; k < 3; k++) {
            const cJSON *x = cJSON_GetArrayItem(it, k);
            if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0) || x->valuedouble > 1e9 ||
                x->valuedouble != (double)(uint32_t)x->valuedouble)
                return gr_seterr(GR_ECORRUPT, "manifest: slot_map entry holds a non-integer");
            r[k] = x->valuedouble;
        }
        uint32_t first = (uint32_t)r[0], last = (uint32_t)r[1], sh = (uint32_t)r[2];
        if (first != next || last < first || last >= GR_SLOTS || sh >= shards)
            return gr_seterr(GR_ECORRUPT, "manifest: slot_map range [%u, %u] -> %u is out of "
                             "order or range", first, last, sh);
        for (uint32_t s = first; s <= last; s++) m->map.owner[s] = sh;
        next = last + 1;
    }
    if (next != GR_SLOTS)
        return gr_seterr(GR_ECORRUPT, "manifest: slot_map covers %u of %u slots", next, GR_SLOTS);
    if (gr_ckpt_slot_map_validate(&m->map) != GR_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", gr_errmsg());
        return gr_seterr(GR_ECORRUPT, "manifest: %s", msg);
    }

    const cJSON *tabs = cJSON_GetObjectItemCaseSensitive(root, "tables");
    if (!cJSON_IsArray(tabs) || cJSON_GetArraySize(tabs) > GR_CKPT_TABLES_MAX)
        return gr_seterr(GR_ECORRUPT, "manifest: 'tables' must be an array of at most %d specs",
                         GR_CKPT_TABLES_MAX);
    m->ntables = (size_t)cJSON_GetArraySize(tabs);
    m->tables = calloc(m->ntables ? m->ntables : 1, sizeof *m->tables);
    if (!m->tables) return gr_seterr(GR_ENOMEM, "out of memory");
    size_t ti = 0;
    cJSON_ArrayForEach(it, tabs)
    {
        char *sj = cJSON_IsObject(it) ? cJSON_PrintUnformatted(it) : NULL;
        rc = sj ? gr_table_spec_from_json(sj, &m->tables[ti]) : GR_ECORRUPT;
        free(sj);
        if (rc == GR_OK) rc = gr_table_spec_validate(&m->tables[ti]);
        if (rc != GR_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", gr_errmsg());
            return gr_seterr(GR_ECORRUPT, "manifest: table %zu: %s", ti, msg);
        }
        for (size_t k = 0; k < ti; k++)
            if (!strcmp(m->tables[k].name, m->tables[ti].name))
                return gr_seterr(GR_ECORRUPT, "manifest: table '%s' listed twice",
                                 m->tables[ti].name);
        ti++;
    }

    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    if (!cJSON_IsArray(files) || (uint64_t)cJSON_GetArraySize(files) != shards)
        return gr_seterr(GR_ECORRUPT, "manifest: 'files' must list %llu shard files",
                         (unsigned long long)shards);
    m->files = calloc(shards, sizeof *m->files);
    if (!m->files) return gr_seterr(GR_ENOMEM, "out of memory");
    uint32_t fi = 0;
    bool any_delta = false, all_export = true;
    cJSON_ArrayForEach(it, files)
    {
        gr_ckpt_manifest_file *f = &m->files[fi];
        uint64_t sh = 0;
        if (!cJSON_IsObject(it)) return gr_seterr(GR_ECORRUPT, "manifest: file %u is not an object", fi);
        if ((rc = get_u64(it, "shard", shards - 1, &sh)) != GR_OK) return rc;
        if (sh != fi) return gr_seterr(GR_ECORRUPT, "manifest: files out of order at %u", fi);
        f->shard = fi;
        if ((rc = get_str(it, "name", f->name, sizeof f->name, false)) != GR_OK) return rc;
        if (!safe_name(f->name))
            return gr_seterr(GR_ECORRUPT, "manifest: file name '%s' is not a plain name", f->name);
        if ((rc = get_str(it, "kind", buf, sizeof buf, false)) != GR_OK) return rc;
        if (kind_from_name(buf, &f->kind) != GR_OK)
            return gr_seterr(GR_ECORRUPT, "manifest: file %u: unknown kind '%s'", fi, buf);
        any_delta |= f->kind == GR_CKPT_DELTA;
        all_export &= f->kind == GR_CKPT_EXPORT;
        if ((f->kind == GR_CKPT_EXPORT) != (m->kind == GR_CKPT_EXPORT))
            return gr_seterr(GR_ECORRUPT, "manifest: file %u is %s in a %s checkpoint", fi,
                             buf, gr_ckpt_kind_name(m->kind));
        if ((rc = get_u64(it, "size", UINT64_MAX, &f->size)) != GR_OK) return rc;
        if ((rc = get_str(it, "checksum", buf, sizeof buf, false)) != GR_OK) return rc;
        if (parse_checksum(buf, &f->checksum) != GR_OK)
            return gr_seterr(GR_ECORRUPT, "manifest: file %u: checksum '%s' is not 16 hex digits",
                             fi, buf);
        if ((rc = parse_u64_array(cJSON_GetObjectItemCaseSensitive(it, "rows"), m->ntables,
                                  "rows", fi, &f->rows)) != GR_OK)
            return rc;
        if ((rc = parse_u64_array(cJSON_GetObjectItemCaseSensitive(it, "keys"), m->ntables,
                                  "keys", fi, &f->keys)) != GR_OK)
            return rc;
        for (uint32_t k = 0; k < fi; k++)
            if (!strcmp(m->files[k].name, f->name))
                return gr_seterr(GR_ECORRUPT, "manifest: file '%s' listed twice", f->name);
        fi++;
    }
    if (m->kind != GR_CKPT_EXPORT && (m->kind == GR_CKPT_DELTA) != any_delta)
        return gr_seterr(GR_ECORRUPT, "manifest: kind %s does not match its files",
                         gr_ckpt_kind_name(m->kind));
    (void)all_export;
    return parse_parts(root, m);
}

int gr_ckpt_manifest_parse(const char *json, size_t len, gr_ckpt_manifest **out)
{
    *out = NULL;
    if (len > MANIFEST_MAX)
        return gr_seterr(GR_ECORRUPT, "manifest: %zu bytes exceed the limit", len);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return gr_seterr(GR_ECORRUPT, "manifest: not valid JSON");
    gr_ckpt_manifest *m = calloc(1, sizeof *m);
    if (!m) {
        cJSON_Delete(root);
        return gr_seterr(GR_ENOMEM, "out of memory");
    }
    int rc = parse_root(root, m);
    cJSON_Delete(root);
    if (rc != GR_OK) {
        gr_ckpt_manifest_destroy(m);
        return rc;
    }
    *out = m;
    return GR_OK;
}

int gr_ckpt_manifest_read(const char *dir, gr_ckpt_manifest **out)
{
    char path[4096];
    *out = NULL;
    int rc = ck_path(path, sizeof path, dir, "manifest.json");
    if (rc != GR_OK) return rc;
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return gr_seterr(GR_ENOENT, "%s: no such checkpoint directory", dir);
    char *buf;
    size_t len;
    rc = gr_ckpt_read_small(path, GR_CKPT_MANIFEST_MAX, &buf, &len);
    if (rc == GR_ENOENT)
        return gr_seterr(GR_ENOENT, "%s: incomplete checkpoint (no manifest.json)", dir);
    if (rc != GR_OK) return rc;
    rc = gr_ckpt_manifest_parse(buf, len, out);
    free(buf);
    if (rc != GR_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", gr_errmsg());
        return gr_seterr(rc, "%s: %s", path, msg);
    }
    return GR_OK;
}

static cJSON *u64_array(const uint64_t *v, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
    return a;
}

char *gr_ckpt_manifest_to_json(const gr_ckpt_manifest *m)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddStringToObject(root, "format", "granary-checkpoint");
    cJSON_AddNumberToObject(root, "version", m->version);
    cJSON_AddStringToObject(root, "kind", gr_ckpt_kind_name(m->kind));
    cJSON_AddNumberToObject(root, "step", (double)m->step);
    cJSON_AddNumberToObject(root, "created", (double)m->created);
    if (m->parent[0]) cJSON_AddStringToObject(root, "parent", m->parent);
    else cJSON_AddNullToObject(root, "parent");
    cJSON_AddStringToObject(root, "compression", m->compression);
    cJSON_AddStringToObject(root, "weights", m->weights_f16 ? "f16" : m->kind == GR_CKPT_EXPORT ? "f32" : "table");
    cJSON_AddNumberToObject(root, "shards", m->map.shards);
    cJSON *sm = cJSON_AddArrayToObject(root, "slot_map");
    for (uint32_t s = 0; sm && s < GR_SLOTS;) {
        uint32_t e = s;
        while (e + 1 < GR_SLOTS && m->map.owner[e + 1] == m->map.owner[s]) e++;
        cJSON *r = cJSON_CreateArray();
        cJSON_AddItemToArray(r, cJSON_CreateNumber(s));
        cJSON_AddItemToArray(r, cJSON_CreateNumber(e));
        cJSON_AddItemToArray(r, cJSON_CreateNumber(m->map.owner[s]));
        cJSON_AddItemToArray(sm, r);
        s = e + 1;
    }
    cJSON *tabs = cJSON_AddArrayToObject(root, "tables");
    for (size_t i = 0; tabs && i < m->ntables; i++) {
        char *sj = gr_table_spec_to_json(&m->tables[i]);
        cJSON *t = sj ? cJSON_Parse(sj) : NULL;
        free(sj);
        if (!t) {
            cJSON_Delete(root);
            return NULL;
        }
        cJSON_AddItemToArray(tabs, t);
    }
    cJSON *files = cJSON_AddArrayToObject(root, "files");
    for (uint32_t i = 0; files && i < m->map.shards; i++) {
        const gr_ckpt_manifest_file *f = &m->files[i];
        cJSON *o = cJSON_CreateObject();
        char sum[17];
        snprintf(sum, sizeof sum, "%016" PRIx64, f->checksum);
        cJSON_AddNumberToObject(o, "shard", f->shard);
        cJSON_AddStringToObject(o, "name", f->name);
        cJSON_AddStringToObject(o, "kind", gr_ckpt_kind_name(f->kind));
        cJSON_AddNumberToObject(o, "size", (double)f->size);
        cJSON_AddStringToObject(o, "checksum", sum);
        cJSON_AddItemToObject(o, "rows", u64_array(f->rows, m->ntables));
        cJSON_AddItemToObject(o, "keys", u64_array(f->keys, m->ntables));
        cJSON_AddItemToArray(files, o);
    }
    /* Only when there are parts: manifests without any read and print as before. */
    if (m->nparts) {
        cJSON *parts = cJSON_AddArrayToObject(root, "parts");
        for (size_t i = 0; parts && i < m->nparts; i++)
            cJSON_AddItemToArray(parts, cJSON_CreateString(m->parts[i]));
    }
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

/* ---- commit ---- */

/* Each part must be a plain name, listed once, and a committed checkpoint itself. */
static int commit_parts(const char *dir, const char *const *parts, size_t nparts,
                        gr_ckpt_manifest *m)
{
    if (!parts || nparts > GR_CKPT_SHARDS_MAX)
        return gr_seterr(GR_EINVAL, "%s: %zu parts (at most %d, and a list of names)", dir,
                         nparts, GR_CKPT_SHARDS_MAX);
    m->parts = calloc(nparts, sizeof *m->parts);
    if (!m->parts) return gr_seterr(GR_ENOMEM, "out of memory");
    for (size_t i = 0; i < nparts; i++) {
        const char *p = parts[i];
        if (!p || strlen(p) >= GR_CKPT_NAME_MAX || !safe_name(p))
            return gr_seterr(GR_EINVAL, "part '%s' is not a plain name", p ? p : "(null)");
        for (size_t k = 0; k < i; k++)
            if (!strcmp(parts[k], p))
                return gr_seterr(GR_EINVAL, "part '%s' is given twice", p);
        char sub[4096];
        int rc = ck_path(sub, sizeof sub, dir, p);
        gr_ckpt_manifest *pm = NULL;
        if (rc == GR_OK) rc = gr_ckpt_manifest_read(sub, &pm);
        gr_ckpt_manifest_destroy(pm);
        if (rc != GR_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", gr_errmsg());
            return gr_seterr(rc, "%s: part '%s' is not complete: %s", dir, p, msg);
        }
        snprintf(m->parts[m->nparts++], GR_CKPT_NAME_MAX, "%s", p);
    }
    return GR_OK;
}

int gr_ckpt_commit(const char *dir, const gr_ckpt_commit_opts *o)
{
    return gr_ckpt_commit_parts(dir, o, NULL, 0);
}

int gr_ckpt_commit_parts(const char *dir, const gr_ckpt_commit_opts *o, const char *const *parts,
                         size_t nparts)
{
    if (!dir || !o) return gr_seterr(GR_EINVAL, "gr_ckpt_commit: NULL argument");
    if (o->shards == 0 || o->shards > GR_CKPT_SHARDS_MAX)
        return gr_seterr(GR_EINVAL, "shard count %u is out of range", o->shards);
    char path[4096];
    int rc = ck_path(path, sizeof path, dir, "manifest.json");
    if (rc != GR_OK) return rc;
    struct stat st;
    if (stat(path, &st) == 0)
        return gr_seterr(GR_EEXIST, "%s: checkpoint is already committed", dir);

    gr_ckpt_manifest *m = calloc(1, sizeof *m);
    if (!m) return gr_seterr(GR_ENOMEM, "out of memory");
    m->version = GR_CKPT_VERSION;
    m->created = gr_wall_s();
    if (o->map) {
        if (o->map->shards != o->shards) {
            gr_ckpt_manifest_destroy(m);
            return gr_seterr(GR_EINVAL, "slot map has %u shards, commit says %u", o->map->shards,
                             o->shards);
        }
        if ((rc = gr_ckpt_slot_map_validate(o->map)) != GR_OK) {
            gr_ckpt_manifest_destroy(m);
            return rc;
        }
        m->map = *o->map;
    } else {
        gr_ckpt_slot_map_default(&m->map, o->shards);
    }
    m->map.shards = 0; /* counts files filled so far, for destroy on error */
    m->files = calloc(o->shards, sizeof *m->files);
    if (!m->files) {
        gr_ckpt_manifest_destroy(m);
        return gr_seterr(GR_ENOMEM, "out of memory");
    }
    bool any_delta = false, any_export = false, zstd = false;
    for (uint32_t i = 0; i < o->shards && rc == GR_OK; i++) {
        gr_ckpt_manifest_file *f = &m->files[i];
        m->map.shards = i + 1;
        gr_ckpt_shard_file_name(i, o->shards, f->name);
        char fp[4096];
        if ((rc = ck_path(fp, sizeof fp, dir, f->name)) != GR_OK) break;
        ck_reader r;
        rc = ck_reader_open(&r, fp, 0);
        if (rc != GR_OK) break;
        char *ej = NULL;
        ck_end_table *et = NULL;
        rc = ck_reader_end_json(&r, &ej);
        if (rc == GR_OK) {
            rc = ck_end_parse(ej, r.hdr.ntables, &et);
            if (rc != GR_OK) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s", gr_errmsg());
                rc = gr_seterr(rc, "%s: %s", fp, msg);
            }
        }
        if (rc == GR_OK) {
            cJSON *ejs = cJSON_Parse(ej);
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(ejs, "compression");
            if (cJSON_IsString(c) && !strcmp(c->valuestring, "zstd")) zstd = true;
            cJSON_Delete(ejs);
        }
        if (rc == GR_OK && (r.hdr.shard != i || r.hdr.shards != o->shards))
            rc = gr_seterr(GR_ECORRUPT, "%s: holds shard %u of %u, expected %u of %u", fp,
                           r.hdr.shard, r.hdr.shards, i, o->shards);
        if (rc == GR_OK && i > 0 && r.hdr.step != m->step)
            rc = gr_seterr(GR_EINVAL, "%s: step %llu, shard 0 has step %llu", fp,
                           (unsigned long long)r.hdr.step, (unsigned long long)m->step);
        if (rc == GR_OK && i > 0 && r.hdr.ntables != m->ntables)
            rc = gr_seterr(GR_EINVAL, "%s: %u tables, shard 0 has %zu", fp, r.hdr.ntables,
                           m->ntables);
        if (rc == GR_OK && i == 0) {
            m->step = r.hdr.step;
            m->ntables = r.hdr.ntables;
            m->weights_f16 = (r.hdr.flags & CK_FLAG_F16) != 0;
            m->tables = calloc(m->ntables ? m->ntables : 1, sizeof *m->tables);
            if (!m->tables) rc = gr_seterr(GR_ENOMEM, "out of memory");
            for (size_t t = 0; rc == GR_OK && t < m->ntables; t++) m->tables[t] = et[t].spec;
        }
        for (size_t t = 0; rc == GR_OK && i > 0 && t < m->ntables; t++)
            if (!gr_table_spec_equal(&m->tables[t], &et[t].spec)) {
                char d[512];
                ck_spec_diff(&m->tables[t], &et[t].spec, d, sizeof d);
                rc = gr_seterr(GR_EINVAL, "%s: table %zu ('%s') differs from shard 0's: %s", fp,
                               t, et[t].spec.name, d);
            }
        if (rc == GR_OK) {
            f->shard = i;
            f->kind = (gr_ckpt_kind)r.hdr.kind;
            f->size = r.size;
            f->checksum = r.tail.content_checksum;
            f->rows = calloc(m->ntables ? m->ntables : 1, sizeof *f->rows);
            f->keys = calloc(m->ntables ? m->ntables : 1, sizeof *f->keys);
            if (!f->rows || !f->keys) rc = gr_seterr(GR_ENOMEM, "out of memory");
            for (size_t t = 0; rc == GR_OK && t < m->ntables; t++) {
                f->rows[t] = et[t].rows;
                f->keys[t] = et[t].keys;
            }
            any_delta |= f->kind == GR_CKPT_DELTA;
            any_export |= f->kind == GR_CKPT_EXPORT;
            if (any_export && f->kind != GR_CKPT_EXPORT)
                rc = gr_seterr(GR_EINVAL, "%s: a %s file beside export files", fp,
                               gr_ckpt_kind_name(f->kind));
            if (i > 0 && f->kind == GR_CKPT_EXPORT && m->files[0].kind != GR_CKPT_EXPORT)
                rc = gr_seterr(GR_EINVAL, "%s: an export file beside checkpoint files", fp);
        }
        free(ej);
        free(et);
        ck_reader_close(&r);
    }
    if (rc == GR_OK) {
        m->kind = any_export ? GR_CKPT_EXPORT : any_delta ? GR_CKPT_DELTA : GR_CKPT_FULL;
        snprintf(m->compression, sizeof m->compression, "%s", zstd ? "zstd" : "none");
        if (any_delta) {
            if (!o->parent || !o->parent[0]) {
                rc = gr_seterr(GR_EINVAL, "%s: holds delta files but no parent was given", dir);
            } else if (!safe_name(o->parent) || strlen(o->parent) >= sizeof m->parent) {
                rc = gr_seterr(GR_EINVAL, "parent '%s' is not a plain checkpoint name", o->parent);
            } else {
                char root[4096], pdir[4096];
                ck_dirname(dir, root, sizeof root);
                gr_ckpt_manifest *pm = NULL;
                rc = ck_path(pdir, sizeof pdir, root, o->parent);
                if (rc == GR_OK) rc = gr_ckpt_manifest_read(pdir, &pm);
                if (rc == GR_OK && pm->step >= m->step)
                    rc = gr_seterr(GR_EINVAL, "parent %s has step %llu, not before %llu",
                                   o->parent, (unsigned long long)pm->step,
                                   (unsigned long long)m->step);
                if (rc == GR_OK && pm->kind == GR_CKPT_EXPORT)
                    rc = gr_seterr(GR_EINVAL, "parent %s is an export", o->parent);
                gr_ckpt_manifest_destroy(pm);
                snprintf(m->parent, sizeof m->parent, "%s", o->parent);
            }
        }
    }
    if (rc == GR_OK && nparts) rc = commit_parts(dir, parts, nparts, m);
    char *json = NULL;
    if (rc == GR_OK) {
        json = gr_ckpt_manifest_to_json(m);
        if (!json) rc = gr_seterr(GR_ENOMEM, "out of memory writing the manifest");
    }
    if (rc == GR_OK) rc = gr_write_file_atomic(path, json, strlen(json));
    free(json);
    gr_ckpt_manifest_destroy(m);
    return rc;
}
