/* Unit tests of the checkpoint frames' codec (CKPT_SAVE, CKPT_COMMIT, CKPT_LOAD and replies):
 * round trips field by field, and every malformed body refused without reading past it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "granary/proto.h"

static gr_proto_strv sv(const char *s) { return (gr_proto_strv){s, (uint32_t)strlen(s)}; }

static void assert_strv(gr_proto_strv v, const char *s)
{
    assert_int_equal(v.n, strlen(s));
    assert_memory_equal(v.p, s, v.n);
}

static void test_save_roundtrip_and_errors(void **state)
{
    (void)state;
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    gr_proto_ckpt_save in = {1234567890123ull, GR_PROTO_CKPT_INCREMENTAL, 3, 5,
                             sv("/data/ckpt/job"), sv("step-000000000100"), sv("")};
    assert_int_equal(gr_proto_put_ckpt_save(&b, &in), 0);
    assert_int_equal(b.len % 8, 0);
    gr_proto_ckpt_save out;
    uint8_t *copy = malloc(b.len); /* exactly len bytes: ASan sees any over-read */
    memcpy(copy, b.data, b.len);
    assert_int_equal(gr_proto_decode_ckpt_save(copy, b.len, &lim, &out), 0);
    assert_int_equal(out.step, in.step);
    assert_int_equal(out.flags, GR_PROTO_CKPT_INCREMENTAL);
    assert_int_equal(out.zstd_level, 3);
    assert_int_equal(out.full_every, 5);
    assert_strv(out.root, "/data/ckpt/job");
    assert_strv(out.name, "step-000000000100");
    assert_int_equal(out.parent.n, 0);
    /* Every truncation is refused. */
    for (size_t n = 0; n < b.len; n++) {
        uint8_t *t = malloc(n ? n : 1);
        memcpy(t, b.data, n);
        int rc = gr_proto_decode_ckpt_save(t, n, &lim, &out);
        assert_true(rc == GR_EPROTO);
        free(t);
    }
    /* Trailing bytes. */
    uint8_t *longer = calloc(1, b.len + 8);
    memcpy(longer, b.data, b.len);
    assert_int_equal(gr_proto_decode_ckpt_save(longer, b.len + 8, &lim, &out), GR_EPROTO);
    free(longer);
    /* Unknown flags, reserved field, zstd level out of range. */
    memcpy(copy, b.data, b.len);
    copy[8] = 0x3;
    assert_int_equal(gr_proto_decode_ckpt_save(copy, b.len, &lim, &out), GR_EPROTO);
    memcpy(copy, b.data, b.len);
    copy[20] = 1;
    assert_int_equal(gr_proto_decode_ckpt_save(copy, b.len, &lim, &out), GR_EPROTO);
    memcpy(copy, b.data, b.len);
    copy[12] = 20;
    assert_int_equal(gr_proto_decode_ckpt_save(copy, b.len, &lim, &out), GR_EINVAL);
    /* A NUL inside the root, nonzero padding after it ("/data/ckpt/job" is 14 bytes: 2 pad). */
    memcpy(copy, b.data, b.len);
    copy[24 + 4 + 3] = 0;
    assert_int_equal(gr_proto_decode_ckpt_save(copy, b.len, &lim, &out), GR_EPROTO);
    memcpy(copy, b.data, b.len);
    copy[24 + 4 + 14] = 'x';
    assert_int_equal(gr_proto_decode_ckpt_save(copy, b.len, &lim, &out), GR_EPROTO);
    /* A string over the limit. */
    gr_proto_limits small = lim;
    small.max_string = 10;
    memcpy(copy, b.data, b.len);
    assert_int_equal(gr_proto_decode_ckpt_save(copy, b.len, &small, &out), GR_ETOOBIG);
    free(copy);
    gr_proto_buf_fini(&b);
}

static void test_replies_roundtrip(void **state)
{
    (void)state;
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    gr_proto_ckpt_saved s = {1, 2, 300, 4000, 0x0123456789abcdefull, 55555, 77, 1};
    assert_int_equal(gr_proto_put_ckpt_saved(&b, &s), 0);
    assert_int_equal(b.len, 56);
    gr_proto_ckpt_saved s2;
    assert_int_equal(gr_proto_decode_ckpt_saved(b.data, b.len, &s2), 0);
    assert_memory_equal(&s, &s2, sizeof s);
    assert_int_equal(gr_proto_decode_ckpt_saved(b.data, 48, &s2), GR_EPROTO);
    b.data[0] = 7; /* kind */
    assert_int_equal(gr_proto_decode_ckpt_saved(b.data, b.len, &s2), GR_EPROTO);

    b.len = 0;
    gr_proto_ckpt_committed c = {99, 1, 3};
    assert_int_equal(gr_proto_put_ckpt_committed(&b, &c), 0);
    gr_proto_ckpt_committed c2;
    assert_int_equal(gr_proto_decode_ckpt_committed(b.data, b.len, &c2), 0);
    assert_int_equal(c2.step, 99);
    assert_int_equal(c2.kind, 1);
    assert_int_equal(c2.deleted, 3);
    assert_int_equal(gr_proto_decode_ckpt_committed(b.data, 15, &c2), GR_EPROTO);

    b.len = 0;
    gr_proto_ckpt_loaded l = {42, 1000, 2000, 33, 4, 3, sv("step-000000000042"),
                              sv("{\"workers\":[3,3]}")};
    assert_int_equal(gr_proto_put_ckpt_loaded(&b, &l), 0);
    gr_proto_ckpt_loaded l2;
    assert_int_equal(gr_proto_decode_ckpt_loaded(b.data, b.len, &lim, &l2), 0);
    assert_int_equal(l2.step, 42);
    assert_int_equal(l2.rows_loaded, 1000);
    assert_int_equal(l2.rows_read, 2000);
    assert_int_equal(l2.usec, 33);
    assert_int_equal(l2.shards, 4);
    assert_int_equal(l2.tables, 3);
    assert_strv(l2.name, "step-000000000042");
    assert_strv(l2.meta, "{\"workers\":[3,3]}");
    for (size_t n = 0; n < b.len; n++)
        assert_int_equal(gr_proto_decode_ckpt_loaded(b.data, n, &lim, &l2), GR_EPROTO);
    gr_proto_buf_fini(&b);
}

static void test_commit_and_load_requests(void **state)
{
    (void)state;
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    gr_proto_ckpt_commit c = {3, 2, sv("/ck"), sv("step-000000000007"), sv("step-000000000006"),
                              sv("{\"step\":7}")};
    assert_int_equal(gr_proto_put_ckpt_commit(&b, &c), 0);
    gr_proto_ckpt_commit c2;
    assert_int_equal(gr_proto_decode_ckpt_commit(b.data, b.len, &lim, &c2), 0);
    assert_int_equal(c2.shards, 3);
    assert_int_equal(c2.keep, 2);
    assert_strv(c2.root, "/ck");
    assert_strv(c2.name, "step-000000000007");
    assert_strv(c2.parent, "step-000000000006");
    assert_strv(c2.meta, "{\"step\":7}");
    for (size_t n = 0; n < b.len; n++) {
        int rc = gr_proto_decode_ckpt_commit(b.data, n, &lim, &c2);
        assert_true(rc == GR_EPROTO);
    }
    b.data[0] = 0; /* 0 shards */
    assert_int_equal(gr_proto_decode_ckpt_commit(b.data, b.len, &lim, &c2), GR_EINVAL);

    b.len = 0;
    gr_proto_ckpt_load l = {GR_PROTO_CKPT_RESOLVE, sv("/ck"), sv("")};
    assert_int_equal(gr_proto_put_ckpt_load(&b, &l), 0);
    gr_proto_ckpt_load l2;
    assert_int_equal(gr_proto_decode_ckpt_load(b.data, b.len, &lim, &l2), 0);
    assert_int_equal(l2.flags, GR_PROTO_CKPT_RESOLVE);
    assert_strv(l2.root, "/ck");
    assert_int_equal(l2.name.n, 0);
    b.data[0] = 2;
    assert_int_equal(gr_proto_decode_ckpt_load(b.data, b.len, &lim, &l2), GR_EPROTO);
    b.data[0] = 0;
    b.data[4] = 1;
    assert_int_equal(gr_proto_decode_ckpt_load(b.data, b.len, &lim, &l2), GR_EPROTO);
    gr_proto_buf_fini(&b);
}

static void test_opcodes_declared(void **state)
{
    (void)state;
    assert_string_equal(gr_proto_op_name(GR_OP_CKPT_SAVE), "ckpt_save");
    assert_string_equal(gr_proto_op_name(GR_OP_CKPT_COMMIT), "ckpt_commit");
    assert_string_equal(gr_proto_op_name(GR_OP_CKPT_LOAD), "ckpt_load");
    assert_int_equal(GR_OP_CKPT_SAVE, 40);
    assert_int_equal(GR_OP_CKPT_LOAD, 42);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_save_roundtrip_and_errors),
        cmocka_unit_test(test_replies_roundtrip),
        cmocka_unit_test(test_commit_and_load_requests),
        cmocka_unit_test(test_opcodes_declared),
    };
    return cmocka_run_group_tests_name("proto_ckpt", tests, NULL, NULL);
}
