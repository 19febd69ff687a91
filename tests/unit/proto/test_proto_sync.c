/* Unit tests for the sync-job frames: SYNC_CONFIG, SYNC_ACQUIRE, SYNC_LEAVE, the pair replies
 * and PUSH_STEP (round trips, empty pushes, and hostile bodies: truncation, trailing bytes,
 * nonzero padding and reserved fields, counts over the limits). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "granary/proto.h"

static gr_proto_limits lim_default(void)
{
    gr_proto_limits l;
    gr_proto_limits_default(&l);
    return l;
}

/* Copies a buffer into an 8-byte aligned heap block, as a frame body would be. */
static uint8_t *aligned_copy(const void *p, size_t n)
{
    uint8_t *b = malloc(n ? n : 8);
    memcpy(b, p, n);
    return b;
}

static void test_config_acquire_leave_pair(void **state)
{
    (void)state;
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    gr_proto_sync_config c = {.mode = GR_PROTO_SYNC_SEMISYNC, .workers = 4, .aggregate = 3,
                              .staleness = 1, .flags = GR_PROTO_SYNC_RESET}, d;
    assert_int_equal(gr_proto_put_sync_config(&b, &c), 0);
    assert_int_equal(b.len, 24);
    assert_int_equal(gr_proto_decode_sync_config(b.data, b.len, &d), 0);
    assert_memory_equal(&c, &d, sizeof c);
    /* Unknown flags, a wrong length. */
    b.data[16] = 0x10;
    assert_int_equal(gr_proto_decode_sync_config(b.data, b.len, &d), GR_EPROTO);
    b.data[16] = 1;
    assert_int_equal(gr_proto_decode_sync_config(b.data, 20, &d), GR_EPROTO);
    /* The word at 20, once reserved, is the dense lag: older clients' 0 is lock-step. */
    b.data[20] = 1;
    assert_int_equal(gr_proto_decode_sync_config(b.data, b.len, &d), 0);
    assert_int_equal(d.dense_lag, 1);
    gr_proto_buf l;
    gr_proto_buf_init(&l);
    gr_proto_sync_config lag = {.mode = GR_PROTO_SYNC_SYNC, .workers = 2, .dense_lag = 3};
    assert_int_equal(gr_proto_put_sync_config(&l, &lag), 0);
    assert_int_equal(gr_proto_decode_sync_config(l.data, l.len, &d), 0);
    assert_memory_equal(&lag, &d, sizeof lag);
    gr_proto_buf_fini(&l);

    /* With an owner: 24 + 24 + the label padded to 8; without one, the 24-byte form. */
    b.len = 0;
    b.data[20] = 0;
    gr_proto_sync_config o = {.mode = GR_PROTO_SYNC_SYNC, .workers = 2, .aggregate = 2,
                              .owner = 0x1234567890abcdefull, .started_ms = 1764600000123ull,
                              .label = "host-a:4242"};
    assert_int_equal(gr_proto_put_sync_config(&b, &o), 0);
    assert_int_equal(b.len, 48 + 16);
    assert_int_equal(gr_proto_decode_sync_config(b.data, b.len, &d), 0);
    o.label_len = 11;
    assert_memory_equal(&o, &d, sizeof o);
    /* Every truncation and a longer body are refused; so are a label length that does not
     * match, padding that is not zero and owner 0. */
    for (size_t n = 0; n < b.len; n++)
        if (n != 24) assert_int_equal(gr_proto_decode_sync_config(b.data, n, &d), GR_EPROTO);
    assert_int_equal(gr_proto_decode_sync_config(b.data, 24, &d), 0);
    assert_int_equal(d.owner, 0);
    b.data[40] = 12;
    assert_int_equal(gr_proto_decode_sync_config(b.data, b.len, &d), GR_EPROTO);
    b.data[40] = 200;
    assert_int_equal(gr_proto_decode_sync_config(b.data, b.len, &d), GR_EPROTO);
    b.data[40] = 11;
    b.data[63] = 1;
    assert_int_equal(gr_proto_decode_sync_config(b.data, b.len, &d), GR_EPROTO);
    b.data[63] = 0;
    memset(b.data + 24, 0, 8);
    assert_int_equal(gr_proto_decode_sync_config(b.data, b.len, &d), GR_EPROTO);
    o.owner = 0;
    b.len = 0;
    assert_int_equal(gr_proto_put_sync_config(&b, &o), 0);
    assert_int_equal(b.len, 24);

    b.len = 0;
    gr_proto_sync_acquire a = {7, 2500, 123456789012ull}, a2;
    assert_int_equal(gr_proto_put_sync_acquire(&b, &a), 0);
    assert_int_equal(b.len, 16);
    assert_int_equal(gr_proto_decode_sync_acquire(b.data, b.len, &a2), 0);
    assert_int_equal(a2.worker, 7);
    assert_int_equal(a2.timeout_ms, 2500);
    assert_true(a2.step == 123456789012ull);
    assert_int_equal(gr_proto_decode_sync_acquire(b.data, 15, &a2), GR_EPROTO);

    b.len = 0;
    gr_proto_put_u32(&b, 3);
    gr_proto_put_u32(&b, 0);
    uint32_t w = 0;
    assert_int_equal(gr_proto_decode_sync_leave(b.data, b.len, &w), 0);
    assert_int_equal(w, 3);
    b.data[4] = 9;
    assert_int_equal(gr_proto_decode_sync_leave(b.data, b.len, &w), GR_EPROTO);

    b.len = 0;
    uint64_t x = 0, y = 0;
    assert_int_equal(gr_proto_put_pair(&b, 2, UINT64_MAX), 0);
    assert_int_equal(gr_proto_decode_pair(b.data, b.len, &x, &y), 0);
    assert_true(x == 2 && y == UINT64_MAX);
    assert_int_equal(gr_proto_decode_pair(b.data, 8, &x, &y), GR_EPROTO);
    gr_proto_buf_fini(&b);
}

/* A PUSH_STEP body with one table section of n keys (dim 2) and one dense part of m floats. */
static void build_push_step(gr_proto_buf *b, uint32_t n, uint32_t m, bool with_batch)
{
    size_t blen = with_batch ? 8 + gr_proto_section_size(GR_PROTO_KEYS_VALUES, n, 2) : 0;
    gr_proto_buf_reserve(b, 4096);
    assert_int_equal(gr_proto_put_push_step_head(b, 5, m ? 1 : 0, 42, blen), 0);
    if (with_batch) {
        assert_int_equal(gr_proto_put_batch_head(b, 1), 0);
        uint64_t *k;
        float *v;
        assert_int_equal(gr_proto_put_section(b, GR_PROTO_KEYS_VALUES, 9, 2, n, &k, &v), 0);
        for (uint32_t i = 0; i < n; i++) {
            k[i] = 100 + i;
            v[2 * i] = (float)i;
            v[2 * i + 1] = -(float)i;
        }
    }
    if (m) {
        float g[16];
        for (uint32_t i = 0; i < m; i++) g[i] = 0.5f * (float)i;
        assert_int_equal(gr_proto_put_dense_part(b, "mlp", g, m), 0);
    }
}

static void test_push_step_roundtrip(void **state)
{
    (void)state;
    gr_proto_limits lim = lim_default();
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    build_push_step(&b, 3, 5, true);
    uint8_t *body = aligned_copy(b.data, b.len);
    gr_proto_push_step ps;
    assert_int_equal(gr_proto_decode_push_step(body, b.len, &lim, &ps), 0);
    assert_int_equal(ps.worker, 5);
    assert_true(ps.step == 42);
    assert_int_equal(ps.batch.ntables, 1);
    assert_int_equal(ps.batch.sections[0].table, 9);
    assert_int_equal(ps.batch.sections[0].n, 3);
    assert_true(ps.batch.sections[0].keys[2] == 102);
    assert_true(ps.batch.sections[0].values[5] == -2.0f);
    assert_int_equal(ps.ndense, 1);
    assert_int_equal(ps.dense[0].name_len, 3);
    assert_memory_equal(ps.dense[0].name, "mlp", 3);
    assert_true(ps.dense[0].size == 5);
    assert_true(ps.dense[0].values[4] == 2.0f);
    gr_proto_push_step_fini(&ps);
    free(body);

    /* An empty push: no batch, no dense parts. */
    b.len = 0;
    build_push_step(&b, 0, 0, false);
    assert_int_equal(b.len, 24);
    body = aligned_copy(b.data, b.len);
    assert_int_equal(gr_proto_decode_push_step(body, b.len, &lim, &ps), 0);
    assert_int_equal(ps.batch.ntables, 0);
    assert_int_equal(ps.ndense, 0);
    gr_proto_push_step_fini(&ps);
    free(body);
    gr_proto_buf_fini(&b);
}

static void test_push_step_hostile(void **state)
{
    (void)state;
    gr_proto_limits lim = lim_default();
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    build_push_step(&b, 2, 3, true);
    size_t len = b.len;
    gr_proto_push_step ps;
    /* Every truncation fails cleanly. */
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *body = aligned_copy(b.data, cut);
        assert_true(gr_proto_decode_push_step(body, cut, &lim, &ps) < 0);
        free(body);
    }
    uint8_t *body = aligned_copy(b.data, len);
    /* Trailing bytes. */
    uint8_t *big = malloc(len + 8);
    memcpy(big, b.data, len);
    memset(big + len, 0, 8);
    assert_int_equal(gr_proto_decode_push_step(big, len + 8, &lim, &ps), GR_EPROTO);
    free(big);
    /* batch_len pointing past the body, or not a multiple of 8. */
    uint64_t bl;
    memcpy(&bl, body + 16, 8);
    uint64_t bad = len;
    memcpy(body + 16, &bad, 8);
    assert_int_equal(gr_proto_decode_push_step(body, len, &lim, &ps), GR_EPROTO);
    bad = bl - 4;
    memcpy(body + 16, &bad, 8);
    assert_int_equal(gr_proto_decode_push_step(body, len, &lim, &ps), GR_EPROTO);
    memcpy(body + 16, &bl, 8);
    /* Too many dense parts for the limit, and more than the bytes could hold. */
    uint32_t nd = lim.max_tables + 1;
    memcpy(body + 4, &nd, 4);
    assert_int_equal(gr_proto_decode_push_step(body, len, &lim, &ps), GR_ETOOBIG);
    nd = 200;
    memcpy(body + 4, &nd, 4);
    assert_int_equal(gr_proto_decode_push_step(body, len, &lim, &ps), GR_EPROTO);
    nd = 1;
    memcpy(body + 4, &nd, 4);
    /* The dense part's padding (3 floats: 4 bytes of pad at the end) must be zero. */
    body[len - 1] = 1;
    assert_int_equal(gr_proto_decode_push_step(body, len, &lim, &ps), GR_EPROTO);
    body[len - 1] = 0;
    /* A dense size claiming more floats than present. */
    size_t size_off = 24 + bl + 8; /* after the name "mlp" (4 + 3 -> 8 bytes) */
    uint64_t huge = UINT64_MAX / 2;
    memcpy(body + size_off, &huge, 8);
    assert_int_equal(gr_proto_decode_push_step(body, len, &lim, &ps), GR_EPROTO);
    huge = 3;
    memcpy(body + size_off, &huge, 8);
    assert_int_equal(gr_proto_decode_push_step(body, len, &lim, &ps), 0);
    gr_proto_push_step_fini(&ps);
    /* A bad section inside the batch is the batch decoder's error. */
    uint32_t zero_dim = 0;
    memcpy(body + 24 + 8 + 4, &zero_dim, 4);
    assert_int_equal(gr_proto_decode_push_step(body, len, &lim, &ps), GR_EINVAL);
    /* Misaligned bodies are refused rather than read unaligned. */
    assert_int_equal(gr_proto_decode_push_step(body + 1, len - 1, &lim, &ps), GR_EINVAL);
    free(body);
    gr_proto_buf_fini(&b);
}

static void test_sync_op_names(void **state)
{
    (void)state;
    assert_string_equal(gr_proto_op_name(GR_OP_SYNC_CONFIG), "sync_config");
    assert_string_equal(gr_proto_op_name(GR_OP_SYNC_ACQUIRE), "sync_acquire");
    assert_string_equal(gr_proto_op_name(GR_OP_PUSH_STEP), "push_step");
    assert_string_equal(gr_proto_op_name(GR_OP_SYNC_LEAVE), "sync_leave");
    assert_string_equal(gr_proto_op_name(GR_OP_DENSE_SET), "dense_set");
    assert_int_equal(GR_OP_DENSE_SET, 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_acquire_leave_pair),
        cmocka_unit_test(test_push_step_roundtrip),
        cmocka_unit_test(test_push_step_hostile),
        cmocka_unit_test(test_sync_op_names),
    };
    return cmocka_run_group_tests_name("proto_sync", tests, NULL, NULL);
}
