/* Codec for the sync-job frames (SYNC_CONFIG, SYNC_ACQUIRE, PUSH_STEP, SYNC_LEAVE and their
 * 16-byte pair replies). Kept apart from proto.c so the step machinery's wire format reads in
 * one place; the same rules hold: no I/O, every count checked before anything is allocated. */
#include "granary/proto.h"
#include "proto/proto_int.h"

#include <stdlib.h>
#include <string.h>


int gr_proto_put_sync_config(gr_proto_buf *b, const gr_proto_sync_config *c)
{
    uint32_t w[6] = {c->mode, c->workers, c->aggregate, c->staleness, c->flags, c->dense_lag};
    int rc = gr_proto_put_bytes(b, w, sizeof w);
    if (rc || !c->owner) return rc;
    size_t n = strnlen(c->label, sizeof c->label);
    if (n > GR_PROTO_SYNC_LABEL_MAX)
        return gr_seterr(GR_EINVAL, "sync job label longer than %d bytes", GR_PROTO_SYNC_LABEL_MAX);
    uint32_t head[2] = {(uint32_t)n, 0};
    if (!rc) rc = gr_proto_put_u64(b, c->owner);
    if (!rc) rc = gr_proto_put_u64(b, c->started_ms);
    if (!rc) rc = gr_proto_put_bytes(b, head, sizeof head);
    /* put_bytes zero-pads to 8. */
    if (!rc && n) rc = gr_proto_put_bytes(b, c->label, n);
    return rc;
}

int gr_proto_decode_sync_config(const void *body, size_t len, gr_proto_sync_config *out)
{
    const uint8_t *p = body;
    memset(out, 0, sizeof *out);
    if (len != 24 && len < 48)
        return gr_seterr(GR_EPROTO, "sync_config body has %zu bytes, expected 24 (or 48 and more "
                         "with an owner)", len);
    out->mode = rd32(p);
    out->workers = rd32(p + 4);
    out->aggregate = rd32(p + 8);
    out->staleness = rd32(p + 12);
    out->flags = rd32(p + 16);
    /* Once reserved (0): older clients send 0, today's behaviour; older servers refuse a
     * nonzero lag with "reserved field is not 0". */
    out->dense_lag = rd32(p + 20);
    if (out->flags & ~(GR_PROTO_SYNC_RESET | GR_PROTO_SYNC_CLEAR))
        return gr_seterr(GR_EPROTO, "sync_config has unknown flags 0x%x", out->flags);
    if (len == 24) return GR_OK;
    uint32_t n = rd32(p + 40);
    if (n > GR_PROTO_SYNC_LABEL_MAX)
        return gr_seterr(GR_EPROTO, "sync_config owner label of %u bytes (at most %d)", n,
                         GR_PROTO_SYNC_LABEL_MAX);
    size_t want = 48 + (((size_t)n + 7) & ~(size_t)7);
    if (len != want)
        return gr_seterr(GR_EPROTO, "sync_config body has %zu bytes, its %u-byte label needs %zu",
                         len, n, want);
    if (rd32(p + 44) != 0) return gr_seterr(GR_EPROTO, "sync_config reserved field is not 0");
    for (size_t i = 48 + n; i < len; i++)
        if (p[i]) return gr_seterr(GR_EPROTO, "sync_config label padding is not 0");
    if (memchr(p + 48, 0, n)) return gr_seterr(GR_EPROTO, "sync_config label holds a NUL byte");
    out->owner = rd64(p + 24);
    if (!out->owner) return gr_seterr(GR_EPROTO, "sync_config owner section with owner 0");
    out->started_ms = rd64(p + 32);
    out->label_len = n;
    memcpy(out->label, p + 48, n);
    return GR_OK;
}

int gr_proto_put_sync_acquire(gr_proto_buf *b, const gr_proto_sync_acquire *a)
{
    int rc = gr_proto_put_u32(b, a->worker);
    if (!rc) rc = gr_proto_put_u32(b, a->timeout_ms);
    if (!rc) rc = gr_proto_put_u64(b, a->step);
    return rc;
}

int gr_proto_decode_sync_acquire(const void *body, size_t len, gr_proto_sync_acquire *out)
{
    const uint8_t *p = body;
    if (len != 16) return gr_seterr(GR_EPROTO, "sync_acquire body has %zu bytes, expected 16", len);
    out->worker = rd32(p);
    out->timeout_ms = rd32(p + 4);
    out->step = rd64(p + 8);
    return GR_OK;
}

int gr_proto_decode_sync_leave(const void *body, size_t len, uint32_t *worker)
{
    const uint8_t *p = body;
    if (len != 8) return gr_seterr(GR_EPROTO, "sync_leave body has %zu bytes, expected 8", len);
    if (rd32(p + 4) != 0) return gr_seterr(GR_EPROTO, "sync_leave reserved field is not 0");
    *worker = rd32(p);
    return GR_OK;
}

int gr_proto_put_pair(gr_proto_buf *b, uint64_t first, uint64_t second)
{
    int rc = gr_proto_put_u64(b, first);
    return rc ? rc : gr_proto_put_u64(b, second);
}

int gr_proto_decode_pair(const void *body, size_t len, uint64_t *a, uint64_t *b)
{
    const uint8_t *p = body;
    if (len != 16) return gr_seterr(GR_EPROTO, "reply has %zu bytes, expected 16", len);
    *a = rd64(p);
    *b = rd64(p + 8);
    return GR_OK;
}

int gr_proto_put_push_step_head(gr_proto_buf *b, uint32_t worker, uint32_t ndense, uint64_t step,
                                uint64_t batch_len)
{
    int rc = gr_proto_put_u32(b, worker);
    if (!rc) rc = gr_proto_put_u32(b, ndense);
    if (!rc) rc = gr_proto_put_u64(b, step);
    if (!rc) rc = gr_proto_put_u64(b, batch_len);
    return rc;
}

int gr_proto_put_dense_part(gr_proto_buf *b, const char *name, const float *values, uint64_t size)
{
    int rc = gr_proto_put_str(b, name, strlen(name));
    if (!rc) rc = gr_proto_put_u64(b, size);
    if (!rc) rc = gr_proto_put_bytes(b, values, (size_t)size * sizeof(float));
    return rc;
}

/* One dense part at *off: str name, u64 size, f32 values[size], zero pad. */
static int get_dense_part(const uint8_t *p, size_t len, size_t *off, uint32_t max_string,
                          gr_proto_dense_part *d)
{
    if (len - *off < 4) return gr_seterr(GR_EPROTO, "dense part name is truncated");
    uint32_t n = rd32(p + *off);
    if (n > max_string)
        return gr_seterr(GR_ETOOBIG, "dense part name of %u bytes exceeds the limit of %u", n,
                         max_string);
    size_t padded = pad8(4 + (size_t)n);
    if (padded > len - *off) return gr_seterr(GR_EPROTO, "dense part name is truncated");
    for (size_t i = 4 + (size_t)n; i < padded; i++)
        if (p[*off + i] != 0) return gr_seterr(GR_EPROTO, "dense part name padding is not zero");
    d->name = (const char *)p + *off + 4;
    d->name_len = n;
    *off += padded;
    if (len - *off < 8) return gr_seterr(GR_EPROTO, "dense part size is truncated");
    uint64_t size = rd64(p + *off);
    *off += 8;
    /* Compare counts, not byte products, so a huge size cannot overflow. */
    if (size > (len - *off) / 4)
        return gr_seterr(GR_EPROTO, "dense part claims %llu floats but has %zu bytes",
                         (unsigned long long)size, len - *off);
    d->size = size;
    d->values = (const float *)(const void *)(p + *off);
    size_t bytes = pad8((size_t)size * 4);
    if (bytes > len - *off) return gr_seterr(GR_EPROTO, "dense part padding is truncated");
    *off += bytes;
    if (size % 2 && rd32(p + *off - 4) != 0)
        return gr_seterr(GR_EPROTO, "dense part padding is not zero");
    return GR_OK;
}

int gr_proto_decode_push_step(const void *body, size_t len, const gr_proto_limits *lim,
                              gr_proto_push_step *out)
{
    const uint8_t *p = body;
    memset(out, 0, sizeof *out);
    if (((uintptr_t)p & 7) != 0) return gr_seterr(GR_EINVAL, "frame body is not 8-byte aligned");
    if (len < 24) return gr_seterr(GR_EPROTO, "push_step body of %zu bytes is truncated", len);
    uint32_t worker = rd32(p), ndense = rd32(p + 4);
    uint64_t step = rd64(p + 8), blen = rd64(p + 16);
    if (blen > len - 24)
        return gr_seterr(GR_EPROTO, "push_step batch of %llu bytes exceeds the %zu bytes present",
                         (unsigned long long)blen, len - 24);
    if (blen % 8) return gr_seterr(GR_EPROTO, "push_step batch length %llu is not a multiple of 8",
                                   (unsigned long long)blen);
    if (ndense > lim->max_tables)
        return gr_seterr(GR_ETOOBIG, "push_step carries %u dense parts, the limit is %u", ndense,
                         lim->max_tables);
    /* Each dense part takes at least 16 bytes. */
    if ((uint64_t)ndense * 16 > len - 24 - blen)
        return gr_seterr(GR_EPROTO, "push_step claims %u dense parts but has %zu bytes", ndense,
                         (size_t)(len - 24 - blen));
    /* Validate the dense parts before allocating anything. */
    size_t off = 24 + (size_t)blen;
    gr_proto_dense_part tmp;
    for (uint32_t i = 0; i < ndense; i++) {
        int rc = get_dense_part(p, len, &off, lim->max_string, &tmp);
        if (rc) return rc;
    }
    if (off != len)
        return gr_seterr(GR_EPROTO, "push_step has %zu trailing bytes after its last part",
                         len - off);
    if (blen) {
        int rc = gr_proto_decode_batch(p + 24, (size_t)blen, GR_PROTO_KEYS_VALUES, lim, &out->batch);
        if (rc) return rc;
    }
    if (ndense) {
        out->dense = calloc(ndense, sizeof *out->dense);
        if (!out->dense) {
            gr_proto_batch_fini(&out->batch);
            return gr_seterr(GR_ENOMEM, "cannot allocate %u dense parts", ndense);
        }
        off = 24 + (size_t)blen;
        for (uint32_t i = 0; i < ndense; i++) (void)get_dense_part(p, len, &off, lim->max_string, &out->dense[i]);
    }
    out->worker = worker;
    out->step = step;
    out->ndense = ndense;
    return GR_OK;
}

void gr_proto_push_step_fini(gr_proto_push_step *p)
{
    if (!p) return;
    gr_proto_batch_fini(&p->batch);
    free(p->dense);
    p->dense = NULL;
    p->ndense = 0;
}
