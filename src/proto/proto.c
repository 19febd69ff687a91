/* The wire codec: frame headers, the output buffer, batches and the small fixed bodies.
 * Decoders treat every byte as hostile: each count is checked against the limits and against
 * the bytes actually present before anything is allocated or pointed at. */
#include "granary/proto.h"
#include "proto/proto_int.h"

#include <stdlib.h>
#include <string.h>

static const struct {
    unsigned num;
    const char *name, *summary;
} op_table[] = {
#define GR_PROTO_OP_ROW(name, num, lname, summary) {num, lname, summary},
    GR_PROTO_OPS(GR_PROTO_OP_ROW)
#undef GR_PROTO_OP_ROW
};

const char *gr_proto_op_name(unsigned op)
{
    for (size_t i = 0; i < sizeof op_table / sizeof op_table[0]; i++)
        if (op_table[i].num == op) return op_table[i].name;
    return NULL;
}

const char *gr_proto_op_summary(unsigned op)
{
    for (size_t i = 0; i < sizeof op_table / sizeof op_table[0]; i++)
        if (op_table[i].num == op) return op_table[i].summary;
    return NULL;
}

void gr_proto_limits_default(gr_proto_limits *lim)
{
    lim->max_body = 256u << 20;
    lim->max_keys = 4u << 20;
    lim->max_tables = 256;
    lim->max_string = 1u << 20;
}



int gr_proto_header_decode(const void *buf, size_t len, const gr_proto_limits *lim,
                           gr_proto_header *h, size_t *need)
{
    const uint8_t *p = buf;
    if (need) *need = GR_PROTO_HEADER_SIZE;
    /* Reject a bad magic as soon as its bytes arrive, so garbage is not waited on. */
    if (len >= 1 && p[0] != GR_PROTO_MAGIC0) return gr_seterr(GR_EPROTO, "bad frame magic");
    if (len >= 2 && p[1] != GR_PROTO_MAGIC1) return gr_seterr(GR_EPROTO, "bad frame magic");
    if (len < GR_PROTO_HEADER_SIZE) return GR_EAGAIN;
    gr_proto_header x;
    x.version = p[2];
    x.kind = p[3];
    x.op = rd16(p + 4);
    x.flags = rd16(p + 6);
    x.status = (int32_t)rd32(p + 8);
    x.body_len = rd32(p + 12);
    x.id = rd64(p + 16);
    *h = x;
    if (x.version != GR_PROTO_VERSION)
        return gr_seterr(GR_EVERSION, "protocol version %u is not supported (this build speaks %u)",
                         x.version, GR_PROTO_VERSION);
    if (x.kind != GR_PROTO_REQUEST && x.kind != GR_PROTO_RESPONSE)
        return gr_seterr(GR_EPROTO, "bad frame kind %u", x.kind);
    if (x.body_len > lim->max_body)
        return gr_seterr(GR_ETOOBIG, "frame body of %u bytes exceeds the limit of %u bytes",
                         x.body_len, lim->max_body);
    size_t total = (size_t)GR_PROTO_HEADER_SIZE + x.body_len;
    if (need) *need = total;
    return len >= total ? GR_OK : GR_EAGAIN;
}

void gr_proto_header_encode(void *buf, const gr_proto_header *h)
{
    uint8_t *p = buf;
    p[0] = GR_PROTO_MAGIC0;
    p[1] = GR_PROTO_MAGIC1;
    p[2] = h->version;
    p[3] = h->kind;
    memcpy(p + 4, &h->op, 2);
    memcpy(p + 6, &h->flags, 2);
    memcpy(p + 8, &h->status, 4);
    memcpy(p + 12, &h->body_len, 4);
    memcpy(p + 16, &h->id, 8);
}

void gr_proto_stamp_epoch(void *frame, uint32_t epoch)
{
    int32_t v = (int32_t)(epoch & GR_PROTO_EPOCH_MAX);
    memcpy((uint8_t *)frame + 8, &v, 4);
}

/* ---- output buffer ---- */

void gr_proto_buf_init(gr_proto_buf *b) { memset(b, 0, sizeof *b); }

void gr_proto_buf_fini(gr_proto_buf *b)
{
    if (!b) return;
    free(b->data);
    memset(b, 0, sizeof *b);
}

int gr_proto_buf_reserve(gr_proto_buf *b, size_t extra)
{
    if (extra > SIZE_MAX / 2 - b->len) return gr_seterr(GR_ETOOBIG, "frame too large");
    size_t want = b->len + extra;
    if (want <= b->cap) return GR_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < want) cap *= 2;
    uint8_t *d = realloc(b->data, cap);
    if (!d) return gr_seterr(GR_ENOMEM, "cannot allocate a %zu-byte frame buffer", cap);
    b->data = d;
    b->cap = cap;
    return GR_OK;
}

void *gr_proto_put_space(gr_proto_buf *b, size_t n)
{
    size_t padded = pad8(n);
    if (padded < n || gr_proto_buf_reserve(b, padded)) return NULL;
    uint8_t *p = b->data + b->len;
    if (padded > n) memset(p + n, 0, padded - n);
    b->len += padded;
    return p;
}

int gr_proto_begin(gr_proto_buf *b, uint8_t kind, uint16_t op, uint16_t flags, int32_t status,
                   uint64_t id)
{
    int rc = gr_proto_buf_reserve(b, GR_PROTO_HEADER_SIZE);
    if (rc) return rc;
    gr_proto_header h = {GR_PROTO_VERSION, kind, op, flags, status, 0, id};
    gr_proto_header_encode(b->data + b->len, &h);
    b->len += GR_PROTO_HEADER_SIZE;
    return GR_OK;
}

int gr_proto_end(gr_proto_buf *b, size_t start)
{
    size_t body = b->len - start - GR_PROTO_HEADER_SIZE;
    if (body > UINT32_MAX) return gr_seterr(GR_ETOOBIG, "frame body of %zu bytes is too large", body);
    uint32_t v = (uint32_t)body;
    memcpy(b->data + start + 12, &v, 4);
    return GR_OK;
}

int gr_proto_put_u32(gr_proto_buf *b, uint32_t v)
{
    int rc = gr_proto_buf_reserve(b, 4);
    if (rc) return rc;
    memcpy(b->data + b->len, &v, 4);
    b->len += 4;
    return GR_OK;
}

int gr_proto_put_u64(gr_proto_buf *b, uint64_t v)
{
    int rc = gr_proto_buf_reserve(b, 8);
    if (rc) return rc;
    memcpy(b->data + b->len, &v, 8);
    b->len += 8;
    return GR_OK;
}

int gr_proto_put_bytes(gr_proto_buf *b, const void *p, size_t n)
{
    void *dst = gr_proto_put_space(b, n);
    if (!dst) return gr_seterr(GR_ENOMEM, "cannot grow a frame buffer by %zu bytes", n);
    if (n) memcpy(dst, p, n);
    return GR_OK;
}

int gr_proto_put_str(gr_proto_buf *b, const char *s, size_t n)
{
    if (n > UINT32_MAX) return gr_seterr(GR_ETOOBIG, "string of %zu bytes is too long", n);
    int rc = gr_proto_put_u32(b, (uint32_t)n);
    if (rc) return rc;
    /* The u32 length leaves the cursor 4 bytes past an 8-byte boundary; the string's bytes
     * plus padding bring it back. */
    size_t padded = pad8(4 + n) - 4;
    rc = gr_proto_buf_reserve(b, padded);
    if (rc) return rc;
    if (n) memcpy(b->data + b->len, s, n);
    memset(b->data + b->len + n, 0, padded - n);
    b->len += padded;
    return GR_OK;
}

/* ---- batches ---- */

size_t gr_proto_section_size(gr_proto_layout layout, uint32_t n, uint32_t dim)
{
    size_t sz = 16;
    if (layout & GR_PROTO_KEYS) sz += (size_t)n * 8;
    if (layout & GR_PROTO_VALUES) sz += pad8((size_t)n * dim * 4);
    return sz;
}

void gr_proto_batch_head_bytes(uint32_t ntables, uint8_t out[8])
{
    uint32_t head[2] = {ntables, 0};
    memcpy(out, head, 8);
}

void gr_proto_section_head_bytes(uint32_t table, uint32_t dim, uint32_t n, uint8_t out[16])
{
    uint32_t head[4] = {table, dim, n, 0};
    memcpy(out, head, 16);
}

int gr_proto_put_batch_head(gr_proto_buf *b, uint32_t ntables)
{
    int rc = gr_proto_put_u32(b, ntables);
    return rc ? rc : gr_proto_put_u32(b, 0);
}

int gr_proto_put_section(gr_proto_buf *b, gr_proto_layout layout, uint32_t table, uint32_t dim,
                         uint32_t n, uint64_t **keys, float **values)
{
    size_t sz = gr_proto_section_size(layout, n, dim);
    int rc = gr_proto_buf_reserve(b, sz);
    if (rc) return rc;
    uint8_t *p = b->data + b->len;
    gr_proto_section_head_bytes(table, dim, n, p);
    p += 16;
    if (keys) *keys = NULL;
    if (values) *values = NULL;
    if (layout & GR_PROTO_KEYS) {
        if (keys) *keys = (uint64_t *)(void *)p;
        p += (size_t)n * 8;
    }
    if (layout & GR_PROTO_VALUES) {
        size_t vb = (size_t)n * dim * 4;
        if (values) *values = (float *)(void *)p;
        if (pad8(vb) > vb) memset(p + vb, 0, pad8(vb) - vb);
    }
    b->len += sz;
    return GR_OK;
}

int gr_proto_decode_batch(const void *body, size_t len, gr_proto_layout layout,
                          const gr_proto_limits *lim, gr_proto_batch *out)
{
    const uint8_t *p = body;
    memset(out, 0, sizeof *out);
    if (((uintptr_t)p & 7) != 0) return gr_seterr(GR_EINVAL, "frame body is not 8-byte aligned");
    if (len < 8) return gr_seterr(GR_EPROTO, "batch body of %zu bytes is truncated", len);
    uint32_t nt = rd32(p), rsv = rd32(p + 4);
    if (rsv != 0) return gr_seterr(GR_EPROTO, "batch reserved field is %u, must be 0", rsv);
    if (nt == 0) return gr_seterr(GR_EPROTO, "batch carries no tables");
    if (nt > lim->max_tables)
        return gr_seterr(GR_ETOOBIG, "batch carries %u tables, the limit is %u", nt,
                         lim->max_tables);
    /* Each section takes at least 16 bytes: a count the body cannot hold is rejected before
     * the section array is allocated. */
    if ((uint64_t)nt * 16 > len - 8)
        return gr_seterr(GR_EPROTO, "batch claims %u tables but has only %zu bytes", nt, len);
    size_t off = 8;
    uint64_t total = 0;
    /* First pass: validate without allocating. */
    for (uint32_t i = 0; i < nt; i++) {
        if (len - off < 16) return gr_seterr(GR_EPROTO, "table section %u is truncated", i);
        uint32_t dim = rd32(p + off + 4), n = rd32(p + off + 8), r = rd32(p + off + 12);
        if (r != 0) return gr_seterr(GR_EPROTO, "section %u reserved field is %u, must be 0", i, r);
        if (dim == 0 || dim > GR_PROTO_DIM_MAX)
            return gr_seterr(GR_EINVAL, "section %u has dim %u (must be 1..%u)", i, dim,
                             GR_PROTO_DIM_MAX);
        total += n;
        if (total > lim->max_keys)
            return gr_seterr(GR_ETOOBIG, "batch carries more than %u keys (the limit)",
                             lim->max_keys);
        size_t sz = gr_proto_section_size(layout, n, dim);
        if (sz > len - off)
            return gr_seterr(GR_EPROTO, "section %u (%u keys, dim %u) needs %zu bytes, %zu left", i,
                             n, dim, sz, len - off);
        off += sz;
        /* Padding must be zero: a frame has exactly one valid encoding. */
        if ((layout & GR_PROTO_VALUES) && ((size_t)n * dim) % 2 && rd32(p + off - 4) != 0)
            return gr_seterr(GR_EPROTO, "section %u has nonzero padding", i);
    }
    if (off != len)
        return gr_seterr(GR_EPROTO, "batch has %zu trailing bytes after its last section", len - off);
    out->sections = calloc(nt, sizeof *out->sections);
    if (!out->sections) return gr_seterr(GR_ENOMEM, "cannot allocate %u batch sections", nt);
    out->ntables = nt;
    out->total_keys = total;
    off = 8;
    for (uint32_t i = 0; i < nt; i++) {
        gr_proto_section *s = &out->sections[i];
        s->table = rd32(p + off);
        s->dim = rd32(p + off + 4);
        s->n = rd32(p + off + 8);
        size_t q = off + 16;
        if (layout & GR_PROTO_KEYS) {
            s->keys = (const uint64_t *)(const void *)(p + q);
            q += (size_t)s->n * 8;
        }
        if (layout & GR_PROTO_VALUES) s->values = (const float *)(const void *)(p + q);
        off += gr_proto_section_size(layout, s->n, s->dim);
    }
    return GR_OK;
}

void gr_proto_batch_fini(gr_proto_batch *b)
{
    if (!b) return;
    free(b->sections);
    memset(b, 0, sizeof *b);
}

/* ---- simple bodies ---- */

/* Reads a string at *off; advances *off past its padding. */
static int get_str(const uint8_t *p, size_t len, size_t *off, uint32_t max, const char **s,
                   uint32_t *slen)
{
    if (len - *off < 4) return gr_seterr(GR_EPROTO, "string length is truncated");
    uint32_t n = rd32(p + *off);
    if (n > max) return gr_seterr(GR_ETOOBIG, "string of %u bytes exceeds the limit of %u", n, max);
    size_t padded = pad8(4 + (size_t)n);
    if (padded > len - *off)
        return gr_seterr(GR_EPROTO, "string of %u bytes is truncated (%zu bytes left)", n,
                         len - *off - 4);
    for (size_t i = 4 + (size_t)n; i < padded; i++)
        if (p[*off + i] != 0) return gr_seterr(GR_EPROTO, "string padding is not zero");
    *s = (const char *)p + *off + 4;
    *slen = n;
    *off += padded;
    return GR_OK;
}

int gr_proto_decode_str(const void *body, size_t len, const gr_proto_limits *lim, const char **s,
                        uint32_t *slen)
{
    size_t off = 0;
    int rc = get_str(body, len, &off, lim->max_string, s, slen);
    if (rc) return rc;
    if (off != len) return gr_seterr(GR_EPROTO, "%zu trailing bytes after a string", len - off);
    return GR_OK;
}

int gr_proto_put_hello(gr_proto_buf *b, const gr_proto_hello *h)
{
    uint32_t w[8] = {h->shard,          h->shards,          h->auth_required,     0,
                     h->limits.max_body, h->limits.max_keys, h->limits.max_tables, h->limits.max_string};
    int rc = gr_proto_put_bytes(b, w, sizeof w);
    if (!rc) rc = gr_proto_put_bytes(b, h->nonce, GR_PROTO_NONCE_SIZE);
    if (!rc) rc = gr_proto_put_str(b, h->server_version, strlen(h->server_version));
    return rc;
}

int gr_proto_decode_hello(const void *body, size_t len, gr_proto_hello *out)
{
    const uint8_t *p = body;
    memset(out, 0, sizeof *out);
    if (len < 32 + GR_PROTO_NONCE_SIZE) return gr_seterr(GR_EPROTO, "hello reply is truncated");
    out->shard = rd32(p);
    out->shards = rd32(p + 4);
    out->auth_required = rd32(p + 8);
    out->limits.max_body = rd32(p + 16);
    out->limits.max_keys = rd32(p + 20);
    out->limits.max_tables = rd32(p + 24);
    out->limits.max_string = rd32(p + 28);
    memcpy(out->nonce, p + 32, GR_PROTO_NONCE_SIZE);
    if (out->shards == 0 || out->shard >= out->shards)
        return gr_seterr(GR_EPROTO, "hello reply names shard %u of %u", out->shard, out->shards);
    if (out->auth_required > 1) return gr_seterr(GR_EPROTO, "hello reply has a bad auth flag");
    size_t off = 32 + GR_PROTO_NONCE_SIZE;
    const char *s = NULL;
    uint32_t n = 0;
    int rc = get_str(p, len, &off, sizeof out->server_version - 1, &s, &n);
    if (rc) return rc;
    if (off != len) return gr_seterr(GR_EPROTO, "hello reply has trailing bytes");
    memcpy(out->server_version, s, n);
    out->server_version[n] = '\0';
    return GR_OK;
}

int gr_proto_decode_auth(const void *body, size_t len, uint8_t nonce[GR_PROTO_NONCE_SIZE],
                         uint8_t mac[GR_PROTO_MAC_SIZE])
{
    if (len != GR_PROTO_NONCE_SIZE + GR_PROTO_MAC_SIZE)
        return gr_seterr(GR_EPROTO, "auth body has %zu bytes, expected %d", len,
                         GR_PROTO_NONCE_SIZE + GR_PROTO_MAC_SIZE);
    memcpy(nonce, body, GR_PROTO_NONCE_SIZE);
    memcpy(mac, (const uint8_t *)body + GR_PROTO_NONCE_SIZE, GR_PROTO_MAC_SIZE);
    return GR_OK;
}

static int get_floats(const uint8_t *p, size_t len, size_t *off, uint64_t *size,
                      const float **vals)
{
    if (len - *off < 8) return gr_seterr(GR_EPROTO, "dense size is truncated");
    uint64_t n = rd64(p + *off);
    *off += 8;
    /* Compare counts, not products, so a huge n cannot overflow the byte size. */
    if (n > (len - *off) / 4)
        return gr_seterr(GR_EPROTO, "dense array claims %llu floats but has %zu bytes",
                         (unsigned long long)n, len - *off);
    *size = n;
    *vals = (const float *)(const void *)(p + *off);
    *off += pad8((size_t)n * 4);
    if (*off > len) return gr_seterr(GR_EPROTO, "dense array padding is truncated");
    if (n % 2 && rd32(p + *off - 4) != 0) return gr_seterr(GR_EPROTO, "dense array padding is not zero");
    return GR_OK;
}

int gr_proto_decode_dense_push(const void *body, size_t len, const gr_proto_limits *lim,
                               const char **name, uint32_t *name_len, uint64_t *size,
                               const float **grad)
{
    const uint8_t *p = body;
    if (((uintptr_t)p & 7) != 0) return gr_seterr(GR_EINVAL, "frame body is not 8-byte aligned");
    size_t off = 0;
    int rc = get_str(p, len, &off, lim->max_string, name, name_len);
    if (!rc) rc = get_floats(p, len, &off, size, grad);
    if (!rc && off != len) rc = gr_seterr(GR_EPROTO, "dense push has trailing bytes");
    return rc;
}

int gr_proto_decode_dense_values(const void *body, size_t len, uint64_t *size,
                                 const float **values)
{
    const uint8_t *p = body;
    if (((uintptr_t)p & 7) != 0) return gr_seterr(GR_EINVAL, "frame body is not 8-byte aligned");
    size_t off = 0;
    int rc = get_floats(p, len, &off, size, values);
    if (!rc && off != len) rc = gr_seterr(GR_EPROTO, "dense values have trailing bytes");
    return rc;
}

int gr_proto_decode_u64s(const void *body, size_t len, uint32_t max, uint64_t *vals, uint32_t *n)
{
    const uint8_t *p = body;
    if (len < 8) return gr_seterr(GR_EPROTO, "count list is truncated");
    uint32_t c = rd32(p);
    if (c > max) return gr_seterr(GR_ETOOBIG, "count list has %u entries, expected at most %u", c, max);
    if (len != 8 + (size_t)c * 8) return gr_seterr(GR_EPROTO, "count list length mismatch");
    for (uint32_t i = 0; i < c; i++) vals[i] = rd64(p + 8 + (size_t)i * 8);
    *n = c;
    return GR_OK;
}

int gr_proto_put_error(gr_proto_buf *b, uint16_t op, uint64_t id, int status, const char *msg)
{
    size_t start = b->len;
    int rc = gr_proto_begin(b, GR_PROTO_RESPONSE, op, 0, status < 0 ? status : GR_EINTERNAL, id);
    size_t n = strlen(msg);
    if (n > 4000) n = 4000; /* messages are short; bound them anyway */
    if (!rc) rc = gr_proto_put_str(b, msg, n);
    if (!rc) rc = gr_proto_end(b, start);
    return rc;
}

/* ---- auth and routing ---- */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

int gr_proto_auth_mac(const uint8_t *secret, size_t secret_len,
                      const uint8_t a[GR_PROTO_NONCE_SIZE], const uint8_t b[GR_PROTO_NONCE_SIZE],
                      uint8_t out[GR_PROTO_MAC_SIZE])
{
    uint8_t msg[2 * GR_PROTO_NONCE_SIZE];
    memcpy(msg, a, GR_PROTO_NONCE_SIZE);
    memcpy(msg + GR_PROTO_NONCE_SIZE, b, GR_PROTO_NONCE_SIZE);
    unsigned int outlen = 0;
    if (secret_len > INT32_MAX ||
        !HMAC(EVP_sha256(), secret, (int)secret_len, msg, sizeof msg, out, &outlen) ||
        outlen != GR_PROTO_MAC_SIZE)
        return gr_seterr(GR_EINTERNAL, "HMAC-SHA256 failed");
    return GR_OK;
}

int gr_proto_random(uint8_t *buf, size_t n)
{
    if (n > INT32_MAX || RAND_bytes(buf, (int)n) != 1)
        return gr_seterr(GR_EINTERNAL, "cannot draw %zu random bytes", n);
    return GR_OK;
}

uint32_t gr_proto_default_shard(uint32_t slot, uint32_t shards)
{
    return gr_slot_shard(slot, shards);
}

uint32_t gr_proto_dense_slot(const char *name, size_t len)
{
    /* Seed fixed once ("dens"); part of the routing contract like gr_slot_of. */
    return (uint32_t)(gr_hash64(name, len, 0x64656e73u) & (GR_SLOTS - 1));
}
