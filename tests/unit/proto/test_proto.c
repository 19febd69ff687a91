/* Unit tests for proto: header framing ("need more bytes" vs invalid), batch round trips in
 * every layout, rejection of every truncation and of counts over the limits, the small
 * bodies, the auth MAC and the routing functions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/proto.h"

static gr_proto_limits lim_default(void)
{
    gr_proto_limits l;
    gr_proto_limits_default(&l);
    return l;
}

static void test_op_table(void **state)
{
    (void)state;
    assert_string_equal(gr_proto_op_name(GR_OP_PULL), "pull");
    assert_string_equal(gr_proto_op_name(GR_OP_SHUTDOWN), "shutdown");
    assert_int_equal(GR_OP_HELLO, 1);
    assert_int_equal(GR_OP_PUSH_PULL, 8);
    assert_null(gr_proto_op_name(0));
    assert_string_equal(gr_proto_op_name(GR_OP_PUSH_STEP), "push_step");
    assert_int_equal(GR_OP_SYNC_CONFIG, 16);
    assert_null(gr_proto_op_name(63));
    assert_non_null(gr_proto_op_summary(GR_OP_AUTH));
    /* Every op number is below the counter limit and unique. */
    unsigned seen[GR_PROTO_OP_LIMIT] = {0};
    for (unsigned op = 0; op < 1000; op++)
        if (gr_proto_op_name(op)) {
            assert_true(op < GR_PROTO_OP_LIMIT);
            seen[op]++;
        }
    for (unsigned op = 0; op < GR_PROTO_OP_LIMIT; op++) assert_true(seen[op] <= 1);
}

static void test_header_roundtrip_and_partial(void **state)
{
    (void)state;
    gr_proto_limits lim = lim_default();
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    assert_int_equal(gr_proto_begin(&b, GR_PROTO_REQUEST, GR_OP_PULL, GR_PROTO_F_READONLY, 0,
                                    0x1122334455667788ull),
                     0);
    assert_int_equal(gr_proto_put_u64(&b, 42), 0);
    assert_int_equal(gr_proto_end(&b, 0), 0);
    assert_int_equal(b.len, 32);
    /* Exact bytes of the header. */
    const uint8_t want[24] = {'G', 'R', 1, 0, 6, 0, 1, 0, 0, 0, 0, 0, 8, 0, 0, 0,
                              0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11};
    assert_memory_equal(b.data, want, 24);
    gr_proto_header h;
    size_t need = 0;
    /* Every prefix shorter than the frame is "need more bytes", never an error. */
    for (size_t len = 0; len < b.len; len++) {
        assert_int_equal(gr_proto_header_decode(b.data, len, &lim, &h, &need), GR_EAGAIN);
        assert_int_equal(need, len < 24 ? 24 : 32);
    }
    assert_int_equal(gr_proto_header_decode(b.data, b.len, &lim, &h, &need), GR_OK);
    assert_int_equal(need, 32);
    assert_int_equal(h.version, GR_PROTO_VERSION);
    assert_int_equal(h.kind, GR_PROTO_REQUEST);
    assert_int_equal(h.op, GR_OP_PULL);
    assert_int_equal(h.flags, GR_PROTO_F_READONLY);
    assert_int_equal(h.status, 0);
    assert_int_equal(h.body_len, 8);
    assert_true(h.id == 0x1122334455667788ull);
    gr_proto_buf_fini(&b);
}

/* A request's status field carries the layout epoch: stamped in place on an encoded frame (so
 * a frame can be sent again under a newer layout), little-endian at offset 8, read back by
 * gr_proto_request_epoch; a negative status is no epoch. */
static void test_request_epoch_stamp(void **state)
{
    (void)state;
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    assert_int_equal(gr_proto_begin(&b, GR_PROTO_REQUEST, GR_OP_PUSH, 0, 0, 9), 0);
    assert_int_equal(gr_proto_end(&b, 0), 0);
    gr_proto_stamp_epoch(b.data, 0x01020304u);
    const uint8_t want[4] = {0x04, 0x03, 0x02, 0x01};
    assert_memory_equal(b.data + 8, want, 4);
    gr_proto_header h;
    assert_int_equal(gr_proto_header_decode(b.data, b.len, &lim, &h, NULL), GR_OK);
    assert_int_equal(gr_proto_request_epoch(&h), 0x01020304u);
    assert_int_equal(h.op, GR_OP_PUSH); /* nothing else moved */
    assert_true(h.id == 9);
    gr_proto_stamp_epoch(b.data, GR_PROTO_EPOCH_MAX);
    assert_int_equal(gr_proto_header_decode(b.data, b.len, &lim, &h, NULL), GR_OK);
    assert_int_equal(gr_proto_request_epoch(&h), GR_PROTO_EPOCH_MAX);
    gr_proto_stamp_epoch(b.data, 0);
    assert_int_equal(gr_proto_header_decode(b.data, b.len, &lim, &h, NULL), GR_OK);
    assert_int_equal(h.status, 0);
    h.status = -3;
    assert_int_equal(gr_proto_request_epoch(&h), 0);
    gr_proto_buf_fini(&b);
}

static void test_header_invalid(void **state)
{
    (void)state;
    gr_proto_limits lim = lim_default();
    uint8_t hb[24];
    gr_proto_header h = {GR_PROTO_VERSION, GR_PROTO_REQUEST, GR_OP_PUSH, 0, 0, 100, 7};
    gr_proto_header_encode(hb, &h);
    gr_proto_header out;
    /* Bad magic is reported from the first byte on, not after waiting for 24. */
    uint8_t bad[24];
    memcpy(bad, hb, 24);
    bad[0] = 'X';
    assert_int_equal(gr_proto_header_decode(bad, 1, &lim, &out, NULL), GR_EPROTO);
    memcpy(bad, hb, 24);
    bad[1] = 'X';
    assert_int_equal(gr_proto_header_decode(bad, 2, &lim, &out, NULL), GR_EPROTO);
    /* Another version: GR_EVERSION, with the id still readable for the error reply. */
    memcpy(bad, hb, 24);
    bad[2] = 2;
    assert_int_equal(gr_proto_header_decode(bad, 24, &lim, &out, NULL), GR_EVERSION);
    assert_true(out.id == 7);
    assert_non_null(strstr(gr_errmsg(), "version 2"));
    memcpy(bad, hb, 24);
    bad[3] = 9;
    assert_int_equal(gr_proto_header_decode(bad, 24, &lim, &out, NULL), GR_EPROTO);
    /* Oversized body: refused from the header alone. */
    lim.max_body = 99;
    assert_int_equal(gr_proto_header_decode(hb, 24, &lim, &out, NULL), GR_ETOOBIG);
    assert_int_equal(out.op, GR_OP_PUSH);
    lim.max_body = 100;
    assert_int_equal(gr_proto_header_decode(hb, 24, &lim, &out, NULL), GR_EAGAIN);
}

/* Builds a batch with the given layout: tables t[i] with n[i] keys at dim[i]. */
static void build_batch(gr_proto_buf *b, gr_proto_layout layout, uint32_t nt, const uint32_t *n,
                        const uint32_t *dim)
{
    gr_proto_buf_init(b);
    assert_int_equal(gr_proto_put_batch_head(b, nt), 0);
    uint64_t k = 1000;
    float v = 0.5f;
    for (uint32_t i = 0; i < nt; i++) {
        size_t before = b->len;
        assert_int_equal(gr_proto_buf_reserve(b, gr_proto_section_size(layout, n[i], dim[i])), 0);
        uint64_t *keys;
        float *vals;
        assert_int_equal(gr_proto_put_section(b, layout, 10 + i, dim[i], n[i], &keys, &vals), 0);
        assert_int_equal(b->len - before, gr_proto_section_size(layout, n[i], dim[i]));
        assert_int_equal(b->len % 8, 0);
        if (layout & GR_PROTO_KEYS)
            for (uint32_t j = 0; j < n[i]; j++) keys[j] = k++;
        else
            assert_null(keys);
        if (layout & GR_PROTO_VALUES)
            for (uint32_t j = 0; j < n[i] * dim[i]; j++) vals[j] = v += 0.25f;
        else
            assert_null(vals);
    }
}

static void check_batch(const gr_proto_batch *x, gr_proto_layout layout, uint32_t nt,
                        const uint32_t *n, const uint32_t *dim)
{
    assert_int_equal(x->ntables, nt);
    uint64_t k = 1000, total = 0;
    float v = 0.5f;
    for (uint32_t i = 0; i < nt; i++) {
        const gr_proto_section *s = &x->sections[i];
        assert_int_equal(s->table, 10 + i);
        assert_int_equal(s->dim, dim[i]);
        assert_int_equal(s->n, n[i]);
        total += n[i];
        if (layout & GR_PROTO_KEYS)
            for (uint32_t j = 0; j < n[i]; j++) assert_true(s->keys[j] == k++);
        else
            assert_null(s->keys);
        if (layout & GR_PROTO_VALUES)
            for (uint32_t j = 0; j < n[i] * dim[i]; j++) assert_true(s->values[j] == (v += 0.25f));
        else
            assert_null(s->values);
    }
    assert_true(x->total_keys == total);
}

static void test_batch_roundtrip_all_layouts(void **state)
{
    (void)state;
    gr_proto_limits lim = lim_default();
    const uint32_t n[] = {3, 0, 5}, dim[] = {3, 8, 1}; /* odd sizes exercise the padding */
    const gr_proto_layout layouts[] = {GR_PROTO_KEYS, GR_PROTO_KEYS_VALUES, GR_PROTO_VALUES};
    for (int l = 0; l < 3; l++) {
        gr_proto_buf b;
        build_batch(&b, layouts[l], 3, n, dim);
        gr_proto_batch x;
        assert_int_equal(gr_proto_decode_batch(b.data, b.len, layouts[l], &lim, &x), 0);
        check_batch(&x, layouts[l], 3, n, dim);
        gr_proto_batch_fini(&x);
        /* Any truncation is invalid (a whole frame was promised), and trailing bytes too. */
        for (size_t len = 0; len < b.len; len++) {
            int rc = gr_proto_decode_batch(b.data, len, layouts[l], &lim, &x);
            assert_true(rc == GR_EPROTO);
            assert_null(x.sections);
        }
        assert_int_equal(gr_proto_buf_reserve(&b, 8), 0);
        memset(b.data + b.len, 0, 8);
        assert_int_equal(gr_proto_decode_batch(b.data, b.len + 8, layouts[l], &lim, &x), GR_EPROTO);
        /* Nonzero padding is refused: every frame has exactly one encoding. The last
         * section (5 x dim 1 values) ends with 4 bytes of padding. */
        if (layouts[l] & GR_PROTO_VALUES) {
            b.data[b.len - 1] = 1;
            assert_int_equal(gr_proto_decode_batch(b.data, b.len, layouts[l], &lim, &x), GR_EPROTO);
            b.data[b.len - 1] = 0;
        }
        /* The wrong layout for these bytes is refused too (sizes disagree). */
        int other = (l + 1) % 3;
        assert_int_not_equal(gr_proto_decode_batch(b.data, b.len, layouts[other], &lim, &x), 0);
        gr_proto_buf_fini(&b);
    }
}

static void test_batch_limits(void **state)
{
    (void)state;
    gr_proto_limits lim = lim_default();
    const uint32_t n[] = {4, 4}, dim[] = {2, 2};
    gr_proto_buf b;
    build_batch(&b, GR_PROTO_KEYS, 2, n, dim);
    gr_proto_batch x;
    lim.max_keys = 7;
    assert_int_equal(gr_proto_decode_batch(b.data, b.len, GR_PROTO_KEYS, &lim, &x), GR_ETOOBIG);
    lim.max_keys = 8;
    lim.max_tables = 1;
    assert_int_equal(gr_proto_decode_batch(b.data, b.len, GR_PROTO_KEYS, &lim, &x), GR_ETOOBIG);
    lim = lim_default();
    /* A huge table count with a small body is refused before any allocation. */
    uint32_t nt = 200;
    memcpy(b.data, &nt, 4);
    assert_int_equal(gr_proto_decode_batch(b.data, b.len, GR_PROTO_KEYS, &lim, &x), GR_EPROTO);
    nt = 0;
    memcpy(b.data, &nt, 4);
    assert_int_equal(gr_proto_decode_batch(b.data, b.len, GR_PROTO_KEYS, &lim, &x), GR_EPROTO);
    nt = 2;
    memcpy(b.data, &nt, 4);
    /* A huge key count in a section: invalid (no overflow, no allocation). */
    uint32_t big = 0xffffffffu;
    memcpy(b.data + 8 + 8, &big, 4);
    assert_int_not_equal(gr_proto_decode_batch(b.data, b.len, GR_PROTO_KEYS, &lim, &x), 0);
    uint32_t four = 4;
    memcpy(b.data + 8 + 8, &four, 4);
    /* dim 0 and dim over the maximum. */
    uint32_t d = 0;
    memcpy(b.data + 8 + 4, &d, 4);
    assert_int_equal(gr_proto_decode_batch(b.data, b.len, GR_PROTO_KEYS, &lim, &x), GR_EINVAL);
    d = GR_PROTO_DIM_MAX + 1;
    memcpy(b.data + 8 + 4, &d, 4);
    assert_int_equal(gr_proto_decode_batch(b.data, b.len, GR_PROTO_KEYS, &lim, &x), GR_EINVAL);
    d = 2;
    memcpy(b.data + 8 + 4, &d, 4);
    /* Nonzero reserved fields. */
    uint32_t one = 1;
    memcpy(b.data + 4, &one, 4);
    assert_int_equal(gr_proto_decode_batch(b.data, b.len, GR_PROTO_KEYS, &lim, &x), GR_EPROTO);
    memset(b.data + 4, 0, 4);
    memcpy(b.data + 8 + 12, &one, 4);
    assert_int_equal(gr_proto_decode_batch(b.data, b.len, GR_PROTO_KEYS, &lim, &x), GR_EPROTO);
    memset(b.data + 8 + 12, 0, 4);
    assert_int_equal(gr_proto_decode_batch(b.data, b.len, GR_PROTO_KEYS, &lim, &x), 0);
    gr_proto_batch_fini(&x);
    /* A misaligned body pointer is refused rather than read unaligned. */
    uint8_t *mis = malloc(b.len + 1);
    memcpy(mis + 1, b.data, b.len);
    assert_int_equal(gr_proto_decode_batch(mis + 1, b.len, GR_PROTO_KEYS, &lim, &x), GR_EINVAL);
    free(mis);
    gr_proto_buf_fini(&b);
}

static void test_strings_and_small_bodies(void **state)
{
    (void)state;
    gr_proto_limits lim = lim_default();
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    assert_int_equal(gr_proto_put_str(&b, "user_id", 7), 0);
    assert_int_equal(b.len, 16); /* 4 + 7 -> 16 */
    const char *s;
    uint32_t n;
    assert_int_equal(gr_proto_decode_str(b.data, b.len, &lim, &s, &n), 0);
    assert_int_equal(n, 7);
    assert_memory_equal(s, "user_id", 7);
    for (size_t len = 0; len < b.len; len++)
        assert_int_equal(gr_proto_decode_str(b.data, len, &lim, &s, &n), GR_EPROTO);
    lim.max_string = 6;
    assert_int_equal(gr_proto_decode_str(b.data, b.len, &lim, &s, &n), GR_ETOOBIG);
    lim = lim_default();
    b.data[15] = 'x'; /* padding byte */
    assert_int_equal(gr_proto_decode_str(b.data, b.len, &lim, &s, &n), GR_EPROTO);
    lim = lim_default();
    gr_proto_buf_fini(&b);

    /* hello */
    gr_proto_hello h, o;
    memset(&h, 0, sizeof h);
    h.shard = 2;
    h.shards = 4;
    h.auth_required = 1;
    h.limits = lim;
    for (int i = 0; i < GR_PROTO_NONCE_SIZE; i++) h.nonce[i] = (uint8_t)(i * 7);
    snprintf(h.server_version, sizeof h.server_version, "granary 0.1.0");
    gr_proto_buf_init(&b);
    assert_int_equal(gr_proto_put_hello(&b, &h), 0);
    assert_int_equal(gr_proto_decode_hello(b.data, b.len, &o), 0);
    assert_int_equal(o.shard, 2);
    assert_int_equal(o.shards, 4);
    assert_int_equal(o.auth_required, 1);
    assert_int_equal(o.limits.max_body, lim.max_body);
    assert_int_equal(o.limits.max_keys, lim.max_keys);
    assert_memory_equal(o.nonce, h.nonce, GR_PROTO_NONCE_SIZE);
    assert_string_equal(o.server_version, "granary 0.1.0");
    for (size_t len = 0; len < b.len; len++)
        assert_int_not_equal(gr_proto_decode_hello(b.data, len, &o), 0);
    uint32_t bad_shard = 4;
    memcpy(b.data, &bad_shard, 4);
    assert_int_equal(gr_proto_decode_hello(b.data, b.len, &o), GR_EPROTO);
    gr_proto_buf_fini(&b);

    /* dense push / values */
    gr_proto_buf_init(&b);
    const float g[3] = {1.5f, -2.0f, 0.25f};
    assert_int_equal(gr_proto_put_str(&b, "mlp", 3), 0);
    assert_int_equal(gr_proto_put_u64(&b, 3), 0);
    assert_int_equal(gr_proto_put_bytes(&b, g, sizeof g), 0);
    const char *nm;
    uint32_t nl;
    uint64_t size;
    const float *vals;
    assert_int_equal(gr_proto_decode_dense_push(b.data, b.len, &lim, &nm, &nl, &size, &vals), 0);
    assert_int_equal(nl, 3);
    assert_int_equal(size, 3);
    assert_memory_equal(vals, g, sizeof g);
    for (size_t len = 0; len < b.len; len++)
        assert_int_not_equal(gr_proto_decode_dense_push(b.data, len, &lim, &nm, &nl, &size, &vals), 0);
    uint64_t huge = UINT64_MAX / 2;
    memcpy(b.data + 8, &huge, 8);
    assert_int_equal(gr_proto_decode_dense_push(b.data, b.len, &lim, &nm, &nl, &size, &vals), GR_EPROTO);
    assert_int_equal(gr_proto_decode_dense_values(b.data + 8, b.len - 8, &size, &vals), GR_EPROTO);
    memcpy(b.data + 8, &(uint64_t){3}, 8);
    assert_int_equal(gr_proto_decode_dense_values(b.data + 8, b.len - 8, &size, &vals), 0);
    assert_int_equal(size, 3);
    gr_proto_buf_fini(&b);

    /* u64 lists */
    gr_proto_buf_init(&b);
    gr_proto_put_u32(&b, 2);
    gr_proto_put_u32(&b, 0);
    gr_proto_put_u64(&b, 11);
    gr_proto_put_u64(&b, 12);
    uint64_t v[2];
    uint32_t cnt;
    assert_int_equal(gr_proto_decode_u64s(b.data, b.len, 2, v, &cnt), 0);
    assert_int_equal(cnt, 2);
    assert_true(v[0] == 11 && v[1] == 12);
    assert_int_equal(gr_proto_decode_u64s(b.data, b.len, 1, v, &cnt), GR_ETOOBIG);
    assert_int_equal(gr_proto_decode_u64s(b.data, b.len - 1, 2, v, &cnt), GR_EPROTO);
    gr_proto_buf_fini(&b);

    /* auth body */
    uint8_t body[64], cn[32], mac[32];
    for (int i = 0; i < 64; i++) body[i] = (uint8_t)i;
    assert_int_equal(gr_proto_decode_auth(body, 64, cn, mac), 0);
    assert_int_equal(cn[31], 31);
    assert_int_equal(mac[0], 32);
    assert_int_equal(gr_proto_decode_auth(body, 63, cn, mac), GR_EPROTO);
}

static void test_error_frame(void **state)
{
    (void)state;
    gr_proto_limits lim = lim_default();
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    assert_int_equal(gr_proto_put_error(&b, GR_OP_PULL, 99, GR_EDIM, "table 'user' has dim 64"), 0);
    gr_proto_header h;
    assert_int_equal(gr_proto_header_decode(b.data, b.len, &lim, &h, NULL), 0);
    assert_int_equal(h.kind, GR_PROTO_RESPONSE);
    assert_int_equal(h.status, GR_EDIM);
    assert_true(h.id == 99);
    const char *s;
    uint32_t n;
    assert_int_equal(gr_proto_decode_str(b.data + 24, h.body_len, &lim, &s, &n), 0);
    assert_int_equal(n, strlen("table 'user' has dim 64"));
    gr_proto_buf_fini(&b);
}

static void test_auth_mac_and_routing(void **state)
{
    (void)state;
    uint8_t a[32], b[32], mac[32];
    for (int i = 0; i < 32; i++) {
        a[i] = (uint8_t)i;
        b[i] = (uint8_t)(32 + i);
    }
    /* HMAC-SHA256("secret", a || b), computed independently with Python's hmac module. */
    const uint8_t want[32] = {0x5f, 0x5d, 0x48, 0x5f, 0x22, 0x28, 0x77, 0x6a, 0xd7, 0x71, 0x0a,
                              0xa4, 0x7d, 0x15, 0xa4, 0xd6, 0x17, 0x44, 0xdb, 0xb9, 0xa2, 0xa3,
                              0xe5, 0x64, 0x7f, 0x5a, 0x1b, 0xbf, 0xcf, 0x80, 0x15, 0xe1};
    assert_int_equal(gr_proto_auth_mac((const uint8_t *)"secret", 6, a, b, mac), 0);
    assert_memory_equal(mac, want, 32);
    uint8_t r1[32], r2[32];
    assert_int_equal(gr_proto_random(r1, 32), 0);
    assert_int_equal(gr_proto_random(r2, 32), 0);
    assert_memory_not_equal(r1, r2, 32);
    /* Default slot map: contiguous ranges. */
    assert_int_equal(gr_proto_default_shard(0, 4), 0);
    assert_int_equal(gr_proto_default_shard(4095, 4), 0);
    assert_int_equal(gr_proto_default_shard(4096, 4), 1);
    assert_int_equal(gr_proto_default_shard(16383, 4), 3);
    assert_int_equal(gr_proto_default_shard(16383, 1), 0);
    assert_int_equal(gr_proto_default_shard(5461, 3), 0);
    assert_int_equal(gr_proto_default_shard(5462, 3), 1);
    unsigned counts[3] = {0};
    for (uint32_t s = 0; s < GR_SLOTS; s++) counts[gr_proto_default_shard(s, 3)]++;
    assert_int_equal(counts[0] + counts[1] + counts[2], GR_SLOTS);
    assert_true(counts[0] >= 5461 && counts[2] <= 5462);
    assert_int_equal(gr_proto_dense_slot("mlp", 3), gr_proto_dense_slot("mlp", 3));
    assert_true(gr_proto_dense_slot("mlp", 3) < GR_SLOTS);
}

/* docs/protocol.md lists every opcode exactly as GR_PROTO_OPS declares it. */
static void test_docs_list_every_opcode(void **state)
{
    (void)state;
    char *doc = NULL;
    size_t len = 0;
    if (gr_read_file("docs/protocol.md", &doc, &len) != GR_OK) {
        skip(); /* not run from the repository root */
        return;
    }
    /* Markdown escapes '|' inside table cells as "\\|". */
    size_t w = 0;
    for (size_t r = 0; r < len; r++)
        if (!(doc[r] == '\\' && doc[r + 1] == '|')) doc[w++] = doc[r];
    doc[w] = '\0';
    unsigned listed = 0;
    for (unsigned op = 1; op < GR_PROTO_OP_LIMIT; op++) {
        if (!gr_proto_op_name(op)) continue;
        char row[256];
        snprintf(row, sizeof row, "| %u | `%s` | %s |", op, gr_proto_op_name(op),
                 gr_proto_op_summary(op));
        if (!strstr(doc, row)) fprintf(stderr, "docs/protocol.md lacks: %s\n", row);
        assert_non_null(strstr(doc, row));
        listed++;
    }
    unsigned declared = 0;
    for (unsigned op = 1; op < GR_PROTO_OP_LIMIT; op++) declared += gr_proto_op_name(op) != NULL;
    assert_int_equal(listed, declared);
    assert_true(listed >= 20); /* 1..15 and the sync ops 16..20 at least */
    free(doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_table),
        cmocka_unit_test(test_header_roundtrip_and_partial),
        cmocka_unit_test(test_header_invalid),
        cmocka_unit_test(test_request_epoch_stamp),
        cmocka_unit_test(test_batch_roundtrip_all_layouts),
        cmocka_unit_test(test_batch_limits),
        cmocka_unit_test(test_strings_and_small_bodies),
        cmocka_unit_test(test_error_frame),
        cmocka_unit_test(test_auth_mac_and_routing),
        cmocka_unit_test(test_docs_list_every_opcode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
