/* Codec for the serving frames: SUBSCRIBE and the publications a training shard answers it
 * with (changed rows, weights only, and whole dense parameters), and the replicas' PREDICT.
 * Same rules as proto.c: no I/O, every count checked against the limits and the body before
 * anything is allocated. docs/protocol.md ("Serving") describes every byte. */
#include "granary/proto.h"
#include "proto/proto_int.h"

#include <stdlib.h>
#include <string.h>

#define PUB_HEAD 48u

int gr_proto_put_subscribe(gr_proto_buf *b, const gr_proto_subscribe *s)
{
    int rc = gr_proto_put_u64(b, s->epoch);
    if (!rc) rc = gr_proto_put_u64(b, s->since);
    if (!rc) rc = gr_proto_put_u32(b, s->wait_ms);
    if (!rc) rc = gr_proto_put_u32(b, s->flags);
    if (!rc) rc = gr_proto_put_u32(b, s->from_slot);
    if (!rc) rc = gr_proto_put_u32(b, 0);
    return rc;
}

int gr_proto_decode_subscribe(const void *body, size_t len, gr_proto_subscribe *out)
{
    const uint8_t *p = body;
    if (len != 32) return gr_seterr(GR_EPROTO, "subscribe body has %zu bytes, expected 32", len);
    out->epoch = rd64(p);
    out->since = rd64(p + 8);
    out->wait_ms = rd32(p + 16);
    out->flags = rd32(p + 20);
    out->from_slot = rd32(p + 24);
    if (out->flags & ~GR_PROTO_SUB_F16)
        return gr_seterr(GR_EPROTO, "subscribe has unknown flags 0x%x", out->flags);
    if (out->from_slot >= GR_SLOTS)
        return gr_seterr(GR_EPROTO, "subscribe from slot %u is not below %u", out->from_slot, GR_SLOTS);
    if (rd32(p + 28) != 0) return gr_seterr(GR_EPROTO, "subscribe reserved field is not 0");
    return GR_OK;
}

int gr_proto_put_pub_head(gr_proto_buf *b, const gr_proto_publication *p)
{
    int rc = gr_proto_put_u64(b, p->epoch);
    if (!rc) rc = gr_proto_put_u64(b, p->seq);
    if (!rc) rc = gr_proto_put_u64(b, p->version);
    uint32_t w[6] = {p->kind, p->shard, p->nsparse, p->ndense, p->f16, p->next_slot};
    if (!rc) rc = gr_proto_put_bytes(b, w, sizeof w);
    return rc;
}

static size_t pub_values_bytes(uint32_t n, uint32_t dim, bool f16)
{
    return pad8((size_t)n * dim * (f16 ? 2u : 4u));
}

int gr_proto_put_pub_section(gr_proto_buf *b, uint32_t table, uint32_t dim, uint32_t n, bool f16,
                             uint64_t **keys, void **values)
{
    size_t vb = pub_values_bytes(n, dim, f16);
    int rc = gr_proto_buf_reserve(b, 16 + (size_t)n * 8 + vb);
    if (rc) return rc;
    uint32_t w[4] = {table, dim, n, 0};
    if ((rc = gr_proto_put_bytes(b, w, sizeof w))) return rc;
    *keys = gr_proto_put_space(b, (size_t)n * 8);
    *values = gr_proto_put_space(b, (size_t)n * dim * (f16 ? 2u : 4u));
    /* Reserved above, so neither can fail; a zero-sized array still gets a valid pointer. */
    return (*keys && *values) ? GR_OK : gr_seterr(GR_ENOMEM, "publication buffer");
}

/* Decodes the dense parts that end a publication (the same layout PUSH_STEP uses). */
static int decode_dense_parts(const uint8_t *p, size_t len, size_t *off, uint32_t nd,
                              const gr_proto_limits *lim, gr_proto_dense_part *out)
{
    for (uint32_t i = 0; i < nd; i++) {
        if (len - *off < 4) return gr_seterr(GR_EPROTO, "publication truncated in dense part %u", i);
        uint32_t sl = rd32(p + *off);
        if (sl == 0 || sl > 63 || sl > lim->max_string)
            return gr_seterr(GR_EPROTO, "publication dense part %u: bad name length %u", i, sl);
        size_t need = pad8((size_t)4 + sl) + 8;
        if (len - *off < need) return gr_seterr(GR_EPROTO, "publication truncated in dense part %u", i);
        out[i].name = (const char *)p + *off + 4;
        out[i].name_len = sl;
        *off += pad8((size_t)4 + sl);
        uint64_t size = rd64(p + *off);
        *off += 8;
        if (size == 0 || size > (len - *off) / 4)
            return gr_seterr(GR_EPROTO, "publication dense part %u: size %llu does not fit", i,
                             (unsigned long long)size);
        out[i].size = size;
        out[i].values = (const float *)(p + *off);
        *off += pad8((size_t)size * 4);
        if (*off > len) return gr_seterr(GR_EPROTO, "publication truncated in dense part %u", i);
    }
    return GR_OK;
}

int gr_proto_decode_publication(const void *body, size_t len, const gr_proto_limits *lim,
                                gr_proto_publication *out)
{
    const uint8_t *p = body;
    memset(out, 0, sizeof *out);
    if (len < PUB_HEAD) return gr_seterr(GR_EPROTO, "publication of %zu bytes is shorter than its head", len);
    out->epoch = rd64(p);
    out->seq = rd64(p + 8);
    out->version = rd64(p + 16);
    out->kind = rd32(p + 24);
    out->shard = rd32(p + 28);
    out->nsparse = rd32(p + 32);
    out->ndense = rd32(p + 36);
    out->f16 = rd32(p + 40);
    out->next_slot = rd32(p + 44);
    if (out->next_slot >= GR_SLOTS || (out->next_slot && out->kind != GR_PROTO_PUB_SNAPSHOT))
        return gr_seterr(GR_EPROTO, "publication next slot %u is not a snapshot page's", out->next_slot);
    if (out->kind > GR_PROTO_PUB_SNAPSHOT)
        return gr_seterr(GR_EPROTO, "publication kind %u is not none, delta or snapshot", out->kind);
    if (out->f16 > 1) return gr_seterr(GR_EPROTO, "publication f16 flag is %u", out->f16);
    if (out->nsparse > lim->max_tables || out->ndense > lim->max_tables)
        return gr_seterr(GR_ETOOBIG, "publication has %u tables and %u dense parts, limit %u",
                         out->nsparse, out->ndense, lim->max_tables);
    /* Walk the sections once to check them before allocating. */
    size_t off = PUB_HEAD;
    uint64_t keys = 0;
    for (uint32_t i = 0; i < out->nsparse; i++) {
        if (len - off < 16) return gr_seterr(GR_EPROTO, "publication truncated in section %u", i);
        uint32_t dim = rd32(p + off + 4), n = rd32(p + off + 8);
        if (rd32(p + off + 12) != 0) return gr_seterr(GR_EPROTO, "publication section %u: reserved field is not 0", i);
        if (dim == 0 || dim > GR_PROTO_DIM_MAX)
            return gr_seterr(GR_EINVAL, "publication section %u: dim %u is not 1..%u", i, dim, GR_PROTO_DIM_MAX);
        keys += n;
        if (keys > lim->max_keys)
            return gr_seterr(GR_ETOOBIG, "publication carries over %u keys", lim->max_keys);
        size_t need = (size_t)n * 8 + pub_values_bytes(n, dim, out->f16);
        off += 16;
        if (len - off < need) return gr_seterr(GR_EPROTO, "publication truncated in section %u", i);
        off += need;
    }
    size_t dense_off = off;
    out->sparse = calloc(out->nsparse ? out->nsparse : 1, sizeof *out->sparse);
    out->dense = calloc(out->ndense ? out->ndense : 1, sizeof *out->dense);
    if (!out->sparse || !out->dense) {
        gr_proto_publication_fini(out);
        return gr_seterr(GR_ENOMEM, "publication of %u sections", out->nsparse);
    }
    off = PUB_HEAD;
    for (uint32_t i = 0; i < out->nsparse; i++) {
        gr_proto_pub_section *s = &out->sparse[i];
        s->table = rd32(p + off);
        s->dim = rd32(p + off + 4);
        s->n = rd32(p + off + 8);
        off += 16;
        s->keys = (const uint64_t *)(p + off);
        off += (size_t)s->n * 8;
        s->values = p + off;
        off += pub_values_bytes(s->n, s->dim, out->f16);
    }
    off = dense_off;
    int rc = decode_dense_parts(p, len, &off, out->ndense, lim, out->dense);
    if (!rc && off != len) rc = gr_seterr(GR_EPROTO, "publication has %zu trailing bytes", len - off);
    if (rc) gr_proto_publication_fini(out);
    return rc;
}

void gr_proto_publication_fini(gr_proto_publication *p)
{
    if (!p) return;
    free(p->sparse);
    free(p->dense);
    p->sparse = NULL;
    p->dense = NULL;
}

int gr_proto_put_predict(gr_proto_buf *b, const gr_proto_predict *q)
{
    size_t nd = (size_t)q->n * q->ndense, ns = (size_t)q->n * q->nsparse;
    int rc = gr_proto_buf_reserve(b, 16 + pad8(nd * 4) + ns * 8);
    uint32_t w[4] = {q->n, q->ndense, q->nsparse, 0};
    if (!rc) rc = gr_proto_put_bytes(b, w, sizeof w);
    if (!rc) rc = gr_proto_put_bytes(b, q->dense, nd * 4);
    if (!rc) rc = gr_proto_put_bytes(b, q->ids, ns * 8);
    return rc;
}

int gr_proto_decode_predict(const void *body, size_t len, const gr_proto_limits *lim,
                            gr_proto_predict *out)
{
    const uint8_t *p = body;
    if (len < 16) return gr_seterr(GR_EPROTO, "predict body has %zu bytes, expected at least 16", len);
    out->n = rd32(p);
    out->ndense = rd32(p + 4);
    out->nsparse = rd32(p + 8);
    if (rd32(p + 12) != 0) return gr_seterr(GR_EPROTO, "predict reserved field is not 0");
    if (out->n == 0) return gr_seterr(GR_EINVAL, "predict carries no examples");
    uint64_t per = (uint64_t)out->ndense + out->nsparse;
    if (per == 0 || per > lim->max_keys || out->n > lim->max_keys / per)
        return gr_seterr(GR_ETOOBIG, "predict of %u examples x %llu features is over the limit of %u",
                         out->n, (unsigned long long)per, lim->max_keys);
    size_t nd = (size_t)out->n * out->ndense, ns = (size_t)out->n * out->nsparse;
    size_t need = 16 + pad8(nd * 4) + ns * 8;
    if (len != need)
        return gr_seterr(GR_EPROTO, "predict body has %zu bytes, %u examples need %zu", len, out->n, need);
    out->dense = (const float *)(p + 16);
    out->ids = (const uint64_t *)(p + 16 + pad8(nd * 4));
    return GR_OK;
}

int gr_proto_put_predict_reply(gr_proto_buf *b, uint64_t version, const float *probs, uint32_t n)
{
    int rc = gr_proto_put_u64(b, version);
    if (!rc) rc = gr_proto_put_u32(b, n);
    if (!rc) rc = gr_proto_put_u32(b, 0);
    if (!rc) rc = gr_proto_put_bytes(b, probs, (size_t)n * 4);
    return rc;
}

int gr_proto_decode_predict_reply(const void *body, size_t len, uint64_t *version,
                                  const float **probs, uint32_t *n)
{
    const uint8_t *p = body;
    if (len < 16) return gr_seterr(GR_EPROTO, "predict reply has %zu bytes", len);
    *version = rd64(p);
    *n = rd32(p + 8);
    if (rd32(p + 12) != 0) return gr_seterr(GR_EPROTO, "predict reply reserved field is not 0");
    if (len != 16 + pad8((size_t)*n * 4))
        return gr_seterr(GR_EPROTO, "predict reply of %u scores has %zu bytes", *n, len);
    *probs = (const float *)(p + 16);
    return GR_OK;
}
