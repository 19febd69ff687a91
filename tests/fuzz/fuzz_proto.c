/* libFuzzer target for the wire decoder: the input is a byte stream read the way a server
 * connection reads it (header, then body), and every complete frame's body goes through each
 * body decoder. A batch that decodes must re-encode to the same bytes. */
#include "granary/proto.h"

#include <stdlib.h>
#include <string.h>

static void decode_body(const gr_proto_header *h, const uint8_t *body, size_t len,
                        const gr_proto_limits *lim)
{
    static const gr_proto_layout layouts[] = {GR_PROTO_KEYS, GR_PROTO_KEYS_VALUES, GR_PROTO_VALUES};
    for (int l = 0; l < 3; l++) {
        gr_proto_batch b;
        if (gr_proto_decode_batch(body, len, layouts[l], lim, &b) != GR_OK) continue;
        /* Touch every key and value, then re-encode and compare. */
        gr_proto_buf out;
        gr_proto_buf_init(&out);
        if (gr_proto_put_batch_head(&out, b.ntables)) abort();
        volatile uint64_t sink = 0;
        for (uint32_t i = 0; i < b.ntables; i++) {
            const gr_proto_section *s = &b.sections[i];
            uint64_t *keys;
            float *vals;
            if (gr_proto_put_section(&out, layouts[l], s->table, s->dim, s->n, &keys, &vals)) abort();
            if (s->keys) {
                memcpy(keys, s->keys, (size_t)s->n * 8);
                for (uint32_t k = 0; k < s->n; k++) sink += s->keys[k];
            }
            if (s->values) memcpy(vals, s->values, (size_t)s->n * s->dim * 4);
        }
        (void)sink;
        if (out.len != len || memcmp(out.data, body, len) != 0) abort();
        gr_proto_buf_fini(&out);
        gr_proto_batch_fini(&b);
    }
    const char *s;
    uint32_t n;
    gr_proto_decode_str(body, len, lim, &s, &n);
    gr_proto_hello hello;
    if (gr_proto_decode_hello(body, len, &hello) == GR_OK) {
        if (hello.shard >= hello.shards) abort();
        if (strlen(hello.server_version) >= sizeof hello.server_version) abort();
    }
    uint8_t nonce[GR_PROTO_NONCE_SIZE], mac[GR_PROTO_MAC_SIZE];
    gr_proto_decode_auth(body, len, nonce, mac);
    uint64_t size;
    const float *vals;
    if (gr_proto_decode_dense_push(body, len, lim, &s, &n, &size, &vals) == GR_OK) {
        volatile float f = 0;
        for (uint64_t i = 0; i < size; i++) f += vals[i];
        (void)f;
    }
    if (gr_proto_decode_dense_values(body, len, &size, &vals) == GR_OK && size * 4 > len) abort();
    uint64_t v[8];
    uint32_t cnt;
    gr_proto_decode_u64s(body, len, 8, v, &cnt);
    /* The sync-job bodies. A PUSH_STEP that decodes must lie inside the body. */
    gr_proto_sync_config sc;
    if (gr_proto_decode_sync_config(body, len, &sc) == GR_OK) {
        /* With or without its owner section, a config re-encodes to the same bytes. */
        gr_proto_buf out;
        gr_proto_buf_init(&out);
        if (gr_proto_put_sync_config(&out, &sc)) abort();
        if (out.len != len || memcmp(out.data, body, len) != 0) abort();
        gr_proto_buf_fini(&out);
    }
    gr_proto_sync_acquire sa;
    gr_proto_decode_sync_acquire(body, len, &sa);
    uint32_t worker;
    gr_proto_decode_sync_leave(body, len, &worker);
    uint64_t pa, pb;
    gr_proto_decode_pair(body, len, &pa, &pb);
    gr_proto_push_step ps;
    if (gr_proto_decode_push_step(body, len, lim, &ps) == GR_OK) {
        volatile float f = 0;
        for (uint32_t i = 0; i < ps.ndense; i++) {
            const gr_proto_dense_part *d = &ps.dense[i];
            if ((const uint8_t *)d->name < body || (const uint8_t *)d->name + d->name_len > body + len) abort();
            if ((const uint8_t *)(d->values + d->size) > body + len) abort();
            for (uint64_t k = 0; k < d->size; k++) f += d->values[k];
        }
        for (uint32_t i = 0; i < ps.batch.ntables; i++)
            if (ps.batch.sections[i].n) f += ps.batch.sections[i].values[0];
        (void)f;
        gr_proto_push_step_fini(&ps);
    }
    (void)h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    lim.max_body = 1u << 20;
    lim.max_keys = 1u << 16;
    lim.max_tables = 64;
    lim.max_string = 1u << 16;
    size_t off = 0;
    while (off < size) {
        gr_proto_header h;
        size_t need = 0;
        int rc = gr_proto_header_decode(data + off, size - off, &lim, &h, &need);
        if (rc == GR_EAGAIN) {
            /* Needs more bytes: never more than a header plus the body limit. */
            if (need > GR_PROTO_HEADER_SIZE + (size_t)lim.max_body || need <= size - off) abort();
            break;
        }
        if (rc != GR_OK) break;
        if (need != GR_PROTO_HEADER_SIZE + (size_t)h.body_len || need > size - off) abort();
        /* Bodies are decoded from an aligned copy, as the server's malloc'd bodies are. */
        uint8_t *body = malloc(h.body_len ? h.body_len : 1);
        if (!body) return 0;
        memcpy(body, data + off + GR_PROTO_HEADER_SIZE, h.body_len);
        decode_body(&h, body, h.body_len, &lim);
        free(body);
        off += need;
    }
    return 0;
}
