/* Codec for the checkpoint frames (CKPT_SAVE, CKPT_COMMIT, CKPT_LOAD and their replies).
 * Same rules as the rest of proto: no I/O, every length checked against the limits before it
 * is used, zero padding and reserved fields enforced so a frame has exactly one encoding. */
#include "granary/proto.h"
#include "proto/proto_int.h"

#include <string.h>


/* A cursor over a body being decoded. */
typedef struct cur {
    const uint8_t *p;
    size_t len, off;
    const char *what; /* frame name for messages */
} cur;

static int need(cur *c, size_t n)
{
    if (c->len - c->off < n)
        return gr_seterr(GR_EPROTO, "%s body is truncated at byte %zu", c->what, c->off);
    return GR_OK;
}

static int get32(cur *c, uint32_t *v)
{
    int rc = need(c, 4);
    if (!rc) {
        *v = rd32(c->p + c->off);
        c->off += 4;
    }
    return rc;
}

static int get64(cur *c, uint64_t *v)
{
    int rc = need(c, 8);
    if (!rc) {
        *v = rd64(c->p + c->off);
        c->off += 8;
    }
    return rc;
}

/* u32 length, bytes (no NUL inside), zero padding to 8. */
static int get_str(cur *c, uint32_t max, const char *field, gr_proto_strv *out)
{
    uint32_t n;
    int rc = get32(c, &n);
    if (rc) return rc;
    if (n > max)
        return gr_seterr(GR_ETOOBIG, "%s: %s of %u bytes exceeds the limit of %u", c->what, field,
                         n, max);
    size_t padded = ((4 + (size_t)n + 7) & ~(size_t)7) - 4;
    if (c->len - c->off < padded)
        return gr_seterr(GR_EPROTO, "%s: %s of %u bytes is truncated", c->what, field, n);
    const uint8_t *s = c->p + c->off;
    if (memchr(s, '\0', n)) return gr_seterr(GR_EPROTO, "%s: %s contains a NUL byte", c->what, field);
    for (size_t i = n; i < padded; i++)
        if (s[i]) return gr_seterr(GR_EPROTO, "%s: %s padding is not zero", c->what, field);
    out->p = (const char *)s;
    out->n = n;
    c->off += padded;
    return GR_OK;
}

static int done(cur *c)
{
    if (c->off != c->len)
        return gr_seterr(GR_EPROTO, "%s body has %zu trailing bytes", c->what, c->len - c->off);
    return GR_OK;
}

static int put_strv(gr_proto_buf *b, gr_proto_strv s)
{
    return gr_proto_put_str(b, s.n ? s.p : "", s.n);
}

/* Paths and metadata may be longer than a name but are bounded by the string limit. */
static uint32_t str_max(const gr_proto_limits *lim) { return lim->max_string; }

int gr_proto_put_ckpt_save(gr_proto_buf *b, const gr_proto_ckpt_save *s)
{
    int rc = gr_proto_put_u64(b, s->step);
    if (!rc) rc = gr_proto_put_u32(b, s->flags);
    if (!rc) rc = gr_proto_put_u32(b, (uint32_t)s->zstd_level);
    if (!rc) rc = gr_proto_put_u32(b, s->full_every);
    if (!rc) rc = gr_proto_put_u32(b, 0);
    if (!rc) rc = put_strv(b, s->root);
    if (!rc) rc = put_strv(b, s->name);
    if (!rc) rc = put_strv(b, s->parent);
    return rc;
}

int gr_proto_decode_ckpt_save(const void *body, size_t len, const gr_proto_limits *lim,
                              gr_proto_ckpt_save *out)
{
    memset(out, 0, sizeof *out);
    cur c = {body, len, 0, "ckpt_save"};
    uint32_t zstd = 0, reserved = 0;
    int rc = get64(&c, &out->step);
    if (!rc) rc = get32(&c, &out->flags);
    if (!rc) rc = get32(&c, &zstd);
    if (!rc) rc = get32(&c, &out->full_every);
    if (!rc) rc = get32(&c, &reserved);
    if (rc) return rc;
    if (out->flags & ~GR_PROTO_CKPT_INCREMENTAL)
        return gr_seterr(GR_EPROTO, "ckpt_save has unknown flags 0x%x", out->flags);
    if (reserved) return gr_seterr(GR_EPROTO, "ckpt_save reserved field is not 0");
    out->zstd_level = (int32_t)zstd;
    if (out->zstd_level < 0 || out->zstd_level > 19)
        return gr_seterr(GR_EINVAL, "ckpt_save: zstd level %d is outside 0..19", out->zstd_level);
    if (!rc) rc = get_str(&c, str_max(lim), "root", &out->root);
    if (!rc) rc = get_str(&c, str_max(lim), "name", &out->name);
    if (!rc) rc = get_str(&c, str_max(lim), "parent", &out->parent);
    return rc ? rc : done(&c);
}

int gr_proto_put_ckpt_saved(gr_proto_buf *b, const gr_proto_ckpt_saved *s)
{
    int rc = gr_proto_put_u32(b, s->kind);
    if (!rc) rc = gr_proto_put_u32(b, s->ndense);
    const uint64_t v[6] = {s->rows, s->bytes, s->checksum, s->usec, s->sync_step, s->sync_job};
    for (int i = 0; i < 6 && !rc; i++) rc = gr_proto_put_u64(b, v[i]);
    return rc;
}

int gr_proto_decode_ckpt_saved(const void *body, size_t len, gr_proto_ckpt_saved *out)
{
    const uint8_t *p = body;
    if (len != 56) return gr_seterr(GR_EPROTO, "ckpt_save reply has %zu bytes, expected 56", len);
    out->kind = rd32(p);
    out->ndense = rd32(p + 4);
    out->rows = rd64(p + 8);
    out->bytes = rd64(p + 16);
    out->checksum = rd64(p + 24);
    out->usec = rd64(p + 32);
    out->sync_step = rd64(p + 40);
    out->sync_job = rd64(p + 48);
    if (out->kind > 1 || out->sync_job > 1)
        return gr_seterr(GR_EPROTO, "ckpt_save reply has kind %u, sync_job %llu", out->kind,
                         (unsigned long long)out->sync_job);
    return GR_OK;
}

int gr_proto_put_ckpt_commit(gr_proto_buf *b, const gr_proto_ckpt_commit *c)
{
    int rc = gr_proto_put_u32(b, c->shards);
    if (!rc) rc = gr_proto_put_u32(b, c->keep);
    if (!rc) rc = put_strv(b, c->root);
    if (!rc) rc = put_strv(b, c->name);
    if (!rc) rc = put_strv(b, c->parent);
    if (!rc) rc = put_strv(b, c->meta);
    return rc;
}

int gr_proto_decode_ckpt_commit(const void *body, size_t len, const gr_proto_limits *lim,
                                gr_proto_ckpt_commit *out)
{
    memset(out, 0, sizeof *out);
    cur c = {body, len, 0, "ckpt_commit"};
    int rc = get32(&c, &out->shards);
    if (!rc) rc = get32(&c, &out->keep);
    if (!rc && (out->shards == 0 || out->shards > GR_SLOTS))
        rc = gr_seterr(GR_EINVAL, "ckpt_commit: shard count %u is outside 1..%u", out->shards,
                       GR_SLOTS);
    if (!rc) rc = get_str(&c, str_max(lim), "root", &out->root);
    if (!rc) rc = get_str(&c, str_max(lim), "name", &out->name);
    if (!rc) rc = get_str(&c, str_max(lim), "parent", &out->parent);
    if (!rc) rc = get_str(&c, str_max(lim), "meta", &out->meta);
    return rc ? rc : done(&c);
}

int gr_proto_put_ckpt_committed(gr_proto_buf *b, const gr_proto_ckpt_committed *c)
{
    int rc = gr_proto_put_u64(b, c->step);
    if (!rc) rc = gr_proto_put_u32(b, c->kind);
    if (!rc) rc = gr_proto_put_u32(b, c->deleted);
    return rc;
}

int gr_proto_decode_ckpt_committed(const void *body, size_t len, gr_proto_ckpt_committed *out)
{
    const uint8_t *p = body;
    if (len != 16)
        return gr_seterr(GR_EPROTO, "ckpt_commit reply has %zu bytes, expected 16", len);
    out->step = rd64(p);
    out->kind = rd32(p + 8);
    out->deleted = rd32(p + 12);
    if (out->kind > 1) return gr_seterr(GR_EPROTO, "ckpt_commit reply has kind %u", out->kind);
    return GR_OK;
}

int gr_proto_put_ckpt_load(gr_proto_buf *b, const gr_proto_ckpt_load *l)
{
    int rc = gr_proto_put_u32(b, l->flags);
    if (!rc) rc = gr_proto_put_u32(b, 0);
    if (!rc) rc = put_strv(b, l->root);
    if (!rc) rc = put_strv(b, l->name);
    return rc;
}

int gr_proto_decode_ckpt_load(const void *body, size_t len, const gr_proto_limits *lim,
                              gr_proto_ckpt_load *out)
{
    memset(out, 0, sizeof *out);
    cur c = {body, len, 0, "ckpt_load"};
    uint32_t reserved = 0;
    int rc = get32(&c, &out->flags);
    if (!rc) rc = get32(&c, &reserved);
    if (rc) return rc;
    if (out->flags & ~GR_PROTO_CKPT_RESOLVE)
        return gr_seterr(GR_EPROTO, "ckpt_load has unknown flags 0x%x", out->flags);
    if (reserved) return gr_seterr(GR_EPROTO, "ckpt_load reserved field is not 0");
    rc = get_str(&c, str_max(lim), "root", &out->root);
    if (!rc) rc = get_str(&c, str_max(lim), "name", &out->name);
    return rc ? rc : done(&c);
}

int gr_proto_put_ckpt_loaded(gr_proto_buf *b, const gr_proto_ckpt_loaded *l)
{
    const uint64_t v[4] = {l->step, l->rows_loaded, l->rows_read, l->usec};
    int rc = GR_OK;
    for (int i = 0; i < 4 && !rc; i++) rc = gr_proto_put_u64(b, v[i]);
    if (!rc) rc = gr_proto_put_u32(b, l->shards);
    if (!rc) rc = gr_proto_put_u32(b, l->tables);
    if (!rc) rc = put_strv(b, l->name);
    if (!rc) rc = put_strv(b, l->meta);
    return rc;
}

int gr_proto_decode_ckpt_loaded(const void *body, size_t len, const gr_proto_limits *lim,
                                gr_proto_ckpt_loaded *out)
{
    memset(out, 0, sizeof *out);
    cur c = {body, len, 0, "ckpt_load reply"};
    int rc = get64(&c, &out->step);
    if (!rc) rc = get64(&c, &out->rows_loaded);
    if (!rc) rc = get64(&c, &out->rows_read);
    if (!rc) rc = get64(&c, &out->usec);
    if (!rc) rc = get32(&c, &out->shards);
    if (!rc) rc = get32(&c, &out->tables);
    if (!rc) rc = get_str(&c, str_max(lim), "name", &out->name);
    if (!rc) rc = get_str(&c, str_max(lim), "meta", &out->meta);
    return rc ? rc : done(&c);
}
