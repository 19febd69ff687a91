/* The dispatcher: the one file that joins proto to table. Each opcode of GR_PROTO_OPS that
 * needs no connection state has a handler here; a handler decodes its body, checks every
 * section (table exists, dim matches, keys routed to this shard) before touching any table,
 * then runs and writes the whole response frame. Each handler is a row of the table of
 * operations (ops.c); the checks they share are in checks.c. */
#include "server/server_int.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef srv_req req; /* server_int.h: one request as every pool handler sees it */

static int begin_reply(req *r)
{
    r->start = r->out->len;
    return gr_proto_begin(r->out, GR_PROTO_RESPONSE, r->h->op, 0, 0, r->h->id);
}

static int end_reply(req *r) { return gr_proto_end(r->out, r->start); }

static int empty_reply(req *r)
{
    int rc = begin_reply(r);
    return rc ? rc : end_reply(r);
}

/* Decode failures mean the peer does not speak the protocol: reply, then close. */
static int decode_failed(req *r, int rc)
{
    *r->fatal = true;
    return rc;
}

/* A string body as a NUL-terminated name of at most GR_TABLE_NAME_MAX - 1 bytes. */
static int decode_name(req *r, char name[GR_TABLE_NAME_MAX], bool allow_empty)
{
    const char *s = NULL;
    uint32_t n = 0;
    int rc = gr_proto_decode_str(r->body, r->len, &r->s->cfg.limits, &s, &n);
    if (rc) return decode_failed(r, rc);
    if (n >= GR_TABLE_NAME_MAX)
        return gr_seterr(GR_EINVAL, "name of %u bytes is longer than %d", n, GR_TABLE_NAME_MAX - 1);
    if (memchr(s, '\0', n)) return gr_seterr(GR_EINVAL, "name contains a NUL byte");
    if (n == 0 && !allow_empty) return gr_seterr(GR_EINVAL, "empty name");
    memcpy(name, s, n);
    name[n] = '\0';
    return GR_OK;
}

/* ---- sparse batches ---- */

typedef struct resolved {
    gr_proto_batch b;
    srv_entry **ents;
} resolved;

static void resolved_fini(resolved *x)
{
    if (x->ents)
        for (uint32_t i = 0; i < x->b.ntables; i++) srv_entry_put(x->ents[i]);
    free(x->ents);
    gr_proto_batch_fini(&x->b);
}

/* Every value of every section is finite. Runs before anything is applied, so a request whose
 * later section is bad changes nothing (the table's own check covers one section only). */
static int validate_sections(const resolved *x, const char *opname)
{
    for (uint32_t i = 0; i < x->b.ntables; i++) {
        const gr_proto_section *sec = &x->b.sections[i];
        if (!sec->values) continue;
        const size_t total = (size_t)sec->n * sec->dim;
        size_t k = srv_first_nonfinite(sec->values, total);
        if (k < total)
            return gr_seterr(GR_EINVAL,
                             "table '%s': %s gradient for key %llu (section %u, element %zu) "
                             "is not finite; nothing in the request was applied",
                             x->ents[i]->name, opname,
                             (unsigned long long)sec->keys[k / sec->dim], i, k % sec->dim);
    }
    return GR_OK;
}

/* Decodes a batch and resolves and checks every section before anything runs. */
static int resolve_batch(req *r, gr_proto_layout layout, resolved *x)
{
    memset(x, 0, sizeof *x);
    const char *opname = gr_proto_op_name(r->h->op);
    int rc = gr_proto_decode_batch(r->body, r->len, layout, &r->s->cfg.limits, &x->b);
    if (rc) return decode_failed(r, rc);
    atomic_fetch_add(&r->s->ops[r->h->op].keys, x->b.total_keys);
    x->ents = calloc(x->b.ntables, sizeof *x->ents);
    if (!x->ents) {
        resolved_fini(x);
        return gr_seterr(GR_ENOMEM, "cannot allocate %u table references", x->b.ntables);
    }
    for (uint32_t i = 0; i < x->b.ntables; i++) {
        const gr_proto_section *sec = &x->b.sections[i];
        srv_entry *e = srv_registry_get(&r->s->reg, false, NULL, sec->table);
        if (!e) {
            rc = gr_seterr(GR_ENOENT, "no table with id %u on shard %u", sec->table,
                           r->s->cfg.shard);
            break;
        }
        x->ents[i] = e;
        uint32_t dim = gr_table_get_spec(e->table)->dim;
        if (dim != sec->dim) {
            rc = gr_seterr(GR_EDIM, "table '%s' has dim %u, %s carried dim %u", e->name, dim,
                           opname, sec->dim);
            break;
        }
        rc = srv_check_routing(r->s, sec);
        if (rc) break;
    }
    if (!rc && layout == GR_PROTO_KEYS_VALUES) rc = validate_sections(x, opname);
    if (rc) resolved_fini(x);
    return rc;
}

/* Writes the rows of every section (after an optional push) as a VALUES batch. */
static int reply_rows(req *r, resolved *x, unsigned lookup_flags)
{
    size_t size = GR_PROTO_HEADER_SIZE + 8;
    for (uint32_t i = 0; i < x->b.ntables; i++)
        size += gr_proto_section_size(GR_PROTO_VALUES, x->b.sections[i].n, x->b.sections[i].dim);
    if (size - GR_PROTO_HEADER_SIZE > r->s->cfg.limits.max_body)
        return gr_seterr(GR_ETOOBIG,
                         "the reply would be %zu bytes, over the %u-byte frame limit: send fewer "
                         "keys per request",
                         size, r->s->cfg.limits.max_body);
    int rc = gr_proto_buf_reserve(r->out, size);
    if (!rc) rc = begin_reply(r);
    if (!rc) rc = gr_proto_put_batch_head(r->out, x->b.ntables);
    for (uint32_t i = 0; !rc && i < x->b.ntables; i++) {
        const gr_proto_section *sec = &x->b.sections[i];
        float *vals;
        rc = gr_proto_put_section(r->out, GR_PROTO_VALUES, sec->table, sec->dim, sec->n, NULL,
                                  &vals);
        if (!rc && sec->n) rc = gr_table_lookup(x->ents[i]->table, sec->keys, sec->n, vals, lookup_flags);
    }
    if (!rc) rc = end_reply(r);
    return rc;
}

/* resolve_batch has checked every gradient (validate_sections), so the table does not read
 * them again for its own check (0.3 ms per shard per bench ps push batch). */
static int apply_all(resolved *x)
{
    for (uint32_t i = 0; i < x->b.ntables; i++) {
        const gr_proto_section *sec = &x->b.sections[i];
        if (!sec->n) continue;
        int rc = gr_table_apply_checked(x->ents[i]->table, sec->keys, sec->n, sec->values);
        if (rc) return rc;
    }
    return GR_OK;
}

int srv_op_pull(req *r)
{
    resolved x;
    int rc = resolve_batch(r, GR_PROTO_KEYS, &x);
    if (rc) return rc;
    rc = reply_rows(r, &x, (r->h->flags & GR_PROTO_F_READONLY) ? GR_LOOKUP_READONLY : 0);
    resolved_fini(&x);
    return rc;
}

int srv_op_push(req *r)
{
    resolved x;
    int rc = resolve_batch(r, GR_PROTO_KEYS_VALUES, &x);
    if (rc) return rc;
    rc = apply_all(&x);
    if (!rc) rc = empty_reply(r);
    resolved_fini(&x);
    return rc;
}

int srv_op_push_pull(req *r)
{
    resolved x;
    int rc = resolve_batch(r, GR_PROTO_KEYS_VALUES, &x);
    if (rc) return rc;
    rc = apply_all(&x);
    if (!rc) rc = reply_rows(r, &x, 0);
    resolved_fini(&x);
    return rc;
}

static int put_u64s(req *r, const uint64_t *v, uint32_t n)
{
    int rc = begin_reply(r);
    if (!rc) rc = gr_proto_put_u32(r->out, n);
    if (!rc) rc = gr_proto_put_u32(r->out, 0);
    for (uint32_t i = 0; !rc && i < n; i++) rc = gr_proto_put_u64(r->out, v[i]);
    if (!rc) rc = end_reply(r);
    return rc;
}

int srv_op_delete(req *r)
{
    resolved x;
    int rc = resolve_batch(r, GR_PROTO_KEYS, &x);
    if (rc) return rc;
    uint64_t *counts = calloc(x.b.ntables, sizeof *counts);
    if (!counts) rc = gr_seterr(GR_ENOMEM, "cannot allocate delete counts");
    for (uint32_t i = 0; !rc && i < x.b.ntables; i++) {
        size_t d = 0;
        const gr_proto_section *sec = &x.b.sections[i];
        if (sec->n) rc = gr_table_delete(x.ents[i]->table, sec->keys, sec->n, &d);
        counts[i] = d;
    }
    if (!rc) rc = put_u64s(r, counts, x.b.ntables);
    free(counts);
    resolved_fini(&x);
    return rc;
}

/* ---- table management ---- */

int srv_op_create_table(req *r)
{
    const char *s = NULL;
    uint32_t n = 0;
    int rc = gr_proto_decode_str(r->body, r->len, &r->s->cfg.limits, &s, &n);
    if (rc) return decode_failed(r, rc);
    char *json = strndup(s, n);
    if (!json) return gr_seterr(GR_ENOMEM, "cannot copy a %u-byte spec", n);
    gr_table_spec spec;
    rc = gr_table_spec_from_json(json, &spec);
    free(json);
    bool created = false;
    if (!rc) rc = srv_registry_add(&r->s->reg, &spec, false, 0, &created);
    if (rc) return rc;
    GR_LOGI("shard %u: table '%s' (id %u, dim %u) %s", r->s->cfg.shard, spec.name, spec.id,
            spec.dim, created ? "created" : "already exists");
    rc = begin_reply(r);
    if (!rc) rc = gr_proto_put_u32(r->out, created ? 1 : 0);
    if (!rc) rc = gr_proto_put_u32(r->out, 0);
    if (!rc) rc = end_reply(r);
    return rc;
}

int srv_op_drop_table(req *r)
{
    char name[GR_TABLE_NAME_MAX];
    int rc = decode_name(r, name, false);
    if (!rc) rc = srv_registry_drop(&r->s->reg, false, name);
    if (!rc) GR_LOGI("shard %u: table '%s' dropped", r->s->cfg.shard, name);
    return rc ? rc : empty_reply(r);
}

static cJSON *describe_entry(srv_entry *e)
{
    char *spec = gr_table_spec_to_json(gr_table_get_spec(e->table));
    cJSON *o = cJSON_CreateObject();
    cJSON *sj = spec ? cJSON_Parse(spec) : NULL;
    free(spec);
    if (!o || !sj) {
        cJSON_Delete(o);
        cJSON_Delete(sj);
        return NULL;
    }
    gr_table_stats st;
    gr_table_get_stats(e->table, &st);
    cJSON_AddItemToObject(o, "spec", sj);
    if (e->dense) cJSON_AddNumberToObject(o, "size", (double)e->dense_size);
    cJSON_AddNumberToObject(o, "rows", (double)st.rows);
    cJSON_AddNumberToObject(o, "bytes", (double)st.bytes);
    return o;
}

static int reply_json(req *r, cJSON *root)
{
    char *txt = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!txt) return gr_seterr(GR_ENOMEM, "cannot format a JSON reply");
    int rc = begin_reply(r);
    if (!rc) rc = gr_proto_put_str(r->out, txt, strlen(txt));
    if (!rc) rc = end_reply(r);
    free(txt);
    return rc;
}

int srv_op_describe(req *r)
{
    char name[GR_TABLE_NAME_MAX];
    int rc = decode_name(r, name, true);
    if (rc) return rc;
    srv_entry **items;
    size_t n;
    rc = srv_registry_snapshot(&r->s->reg, &items, &n);
    if (rc) return rc;
    cJSON *root = cJSON_CreateObject();
    cJSON *tables = cJSON_AddArrayToObject(root, "tables");
    cJSON *dense = cJSON_AddArrayToObject(root, "dense");
    size_t found = 0;
    for (size_t i = 0; i < n; i++) {
        if (name[0] && strcmp(items[i]->name, name)) continue;
        cJSON *o = describe_entry(items[i]);
        if (!o) continue;
        cJSON_AddItemToArray(items[i]->dense ? dense : tables, o);
        found++;
    }
    srv_registry_release(items, n);
    if (name[0] && !found) {
        cJSON_Delete(root);
        return gr_seterr(GR_ENOENT, "no table or dense parameter named '%s' on shard %u", name,
                         r->s->cfg.shard);
    }
    return reply_json(r, root);
}

int srv_op_evict(req *r)
{
    char name[GR_TABLE_NAME_MAX];
    int rc = decode_name(r, name, true);
    if (rc) return rc;
    srv_entry **items;
    size_t n;
    rc = srv_registry_snapshot(&r->s->reg, &items, &n);
    if (rc) return rc;
    uint64_t total = 0;
    size_t found = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        if (items[i]->dense || (name[0] && strcmp(items[i]->name, name))) continue;
        uint64_t ev = 0;
        rc = gr_table_evict_expired(items[i]->table, &ev);
        total += ev;
        found++;
    }
    srv_registry_release(items, n);
    if (!rc && name[0] && !found)
        rc = gr_seterr(GR_ENOENT, "no table named '%s' on shard %u", name, r->s->cfg.shard);
    return rc ? rc : put_u64s(r, &total, 1);
}

/* ---- dense parameters ---- */

int srv_dense_create_json(gr_server *s, const char *json, size_t len, bool *created)
{
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return gr_seterr(GR_EINVAL, "dense spec is not a JSON object");
    }
    int rc = GR_OK;
    cJSON *size = cJSON_GetObjectItemCaseSensitive(root, "size");
    cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "name");
    uint64_t max = (s->cfg.limits.max_body - 64) / 4;
    if (!cJSON_IsString(name))
        rc = gr_seterr(GR_EINVAL, "dense spec needs a \"name\" string");
    else if (!cJSON_IsNumber(size) || size->valuedouble < 1 || size->valuedouble > (double)max ||
             size->valuedouble != floor(size->valuedouble))
        rc = gr_seterr(GR_EINVAL, "dense parameter '%s' needs a \"size\" of 1..%llu floats",
                       name->valuestring, (unsigned long long)max);
    else if (cJSON_GetObjectItemCaseSensitive(root, "dim"))
        rc = gr_seterr(GR_EINVAL, "dense parameter '%s': give \"size\", not \"dim\"",
                       name->valuestring);
    else if (!s->owns[gr_proto_dense_slot(name->valuestring, strlen(name->valuestring))])
        rc = gr_seterr(GR_ESTALE, "dense parameter '%s' belongs to shard %u, not shard %u",
                       name->valuestring,
                       gr_proto_default_shard(
                           gr_proto_dense_slot(name->valuestring, strlen(name->valuestring)),
                           s->cfg.shards),
                       s->cfg.shard);
    if (rc) {
        cJSON_Delete(root);
        return rc;
    }
    uint64_t n = (uint64_t)size->valuedouble;
    /* Stored as a table of chunk rows keyed by chunk index, so the table's optimizers and
     * initializers are reused unchanged. */
    uint32_t chunk = n < GR_TABLE_DIM_MAX ? (uint32_t)n : GR_TABLE_DIM_MAX;
    cJSON_DeleteItemFromObjectCaseSensitive(root, "size");
    cJSON_AddNumberToObject(root, "dim", chunk);
    if (!cJSON_GetObjectItemCaseSensitive(root, "id")) cJSON_AddNumberToObject(root, "id", 0);
    /* One partition unless asked: a partition takes the arena in chunks of 64 rows, and a
     * chunk row here is up to 1024 floats with their optimizer state (12 KiB with Adam), so
     * each partition a chunk row hashed to pinned 768 KiB of its own, on 2 MiB pages: 40 MB
     * of the process touched for DLRM's 59 k parameters (58 rows) with 256 partitions, one
     * 2 MiB page with one. A row's step holds the lock alone, as before. */
    if (!cJSON_GetObjectItemCaseSensitive(root, "partitions"))
        cJSON_AddNumberToObject(root, "partitions", 1);
    char *txt = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!txt) return gr_seterr(GR_ENOMEM, "cannot format a dense spec");
    gr_table_spec spec;
    rc = gr_table_spec_from_json(txt, &spec);
    free(txt);
    if (!rc) rc = srv_registry_add(&s->reg, &spec, true, n, created);
    return rc;
}

int srv_op_dense_create(req *r)
{
    const char *s = NULL;
    uint32_t n = 0;
    int rc = gr_proto_decode_str(r->body, r->len, &r->s->cfg.limits, &s, &n);
    if (rc) return decode_failed(r, rc);
    bool created = false;
    rc = srv_dense_create_json(r->s, s, n, &created);
    if (rc) return rc;
    rc = begin_reply(r);
    if (!rc) rc = gr_proto_put_u32(r->out, created ? 1 : 0);
    if (!rc) rc = gr_proto_put_u32(r->out, 0);
    if (!rc) rc = end_reply(r);
    return rc;
}

/* Keys 0 .. chunks - 1 of a dense parameter's chunk rows (malloc'd; NULL when out of memory). */
static uint64_t *chunk_keys(const srv_entry *e, uint64_t *chunks)
{
    *chunks = (e->dense_size + e->chunk - 1) / e->chunk;
    uint64_t *keys = malloc((*chunks ? *chunks : 1) * sizeof *keys);
    for (uint64_t i = 0; keys && i < *chunks; i++) keys[i] = i;
    return keys;
}

int srv_dense_lookup(srv_entry *e, float *room)
{
    uint64_t chunks;
    uint64_t *keys = chunk_keys(e, &chunks);
    int rc = keys ? gr_table_lookup(e->table, keys, chunks, room, 0)
                  : gr_seterr(GR_ENOMEM, "cannot allocate dense chunk keys");
    free(keys);
    return rc;
}

int srv_dense_apply(srv_entry *e, const float *grad)
{
    uint64_t chunks, size = e->dense_size;
    uint64_t *keys = chunk_keys(e, &chunks);
    float *padded = NULL;
    const float *g = grad;
    if (size % e->chunk) {
        /* Pad the last chunk's gradient with zeros. */
        padded = calloc(chunks * e->chunk, sizeof *padded);
        if (padded) memcpy(padded, grad, size * sizeof *padded);
        g = padded;
    }
    int rc = keys && g ? gr_table_apply(e->table, keys, chunks, g)
                       : gr_seterr(GR_ENOMEM, "cannot allocate a dense push of %llu floats",
                                   (unsigned long long)size);
    free(keys);
    free(padded);
    return rc;
}

int srv_op_dense_pull(req *r)
{
    char name[GR_TABLE_NAME_MAX];
    int rc = decode_name(r, name, false);
    if (rc) return rc;
    srv_entry *e = srv_get_dense(r->s, name, &rc);
    if (!e) return rc;
    uint64_t chunks = (e->dense_size + e->chunk - 1) / e->chunk;
    size_t room = (size_t)chunks * e->chunk * 4;
    rc = gr_proto_buf_reserve(r->out, GR_PROTO_HEADER_SIZE + 8 + room + 8);
    if (!rc) rc = begin_reply(r);
    if (!rc) rc = gr_proto_put_u64(r->out, e->dense_size);
    if (!rc) {
        /* The last chunk may be longer than the array: look up into the reserved room, then
         * trim the frame to the array's size and zero its padding. */
        float *vals = (float *)(void *)(r->out->data + r->out->len);
        rc = srv_dense_lookup(e, vals);
        if (!rc) {
            size_t used = (size_t)e->dense_size * 4, padded = (used + 7) & ~(size_t)7;
            memset((uint8_t *)vals + used, 0, padded - used);
            r->out->len += padded;
            rc = end_reply(r);
        }
    }
    srv_entry_put(e);
    return rc;
}

int srv_op_dense_push(req *r)
{
    const char *nm;
    uint32_t nlen;
    uint64_t size;
    const float *grad;
    int rc = gr_proto_decode_dense_push(r->body, r->len, &r->s->cfg.limits, &nm, &nlen, &size, &grad);
    if (rc) return decode_failed(r, rc);
    if (nlen == 0 || nlen >= GR_TABLE_NAME_MAX || memchr(nm, '\0', nlen))
        return gr_seterr(GR_EINVAL, "bad dense parameter name");
    char name[GR_TABLE_NAME_MAX];
    memcpy(name, nm, nlen);
    name[nlen] = '\0';
    srv_entry *e = srv_get_dense(r->s, name, &rc);
    if (!e) return rc;
    atomic_fetch_add(&r->s->ops[r->h->op].keys, size);
    if (size != e->dense_size) {
        rc = gr_seterr(GR_EDIM, "dense parameter '%s' has %llu floats, push carried %llu", name,
                       (unsigned long long)e->dense_size, (unsigned long long)size);
        srv_entry_put(e);
        return rc;
    }
    rc = srv_dense_apply(e, grad);
    srv_entry_put(e);
    return rc ? rc : empty_reply(r);
}

/* ---- shutdown ---- */

int srv_op_shutdown(req *r)
{
    if (r->len != 0)
        return decode_failed(r, gr_seterr(GR_EPROTO, "shutdown request carries a body"));
    *r->stop = true;
    GR_LOGI("shard %u: shutdown requested by a client", r->s->cfg.shard);
    return empty_reply(r);
}
