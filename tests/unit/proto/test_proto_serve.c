/* Unit tests for the serving frames: SUBSCRIBE, publications (f32 and f16 rows, dense parts,
 * empty), PREDICT and its reply; and hostile bodies: truncation, trailing bytes, bad kinds,
 * flags and reserved fields, dims and counts over the limits. */
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

static void test_subscribe_round_trip(void **state)
{
    (void)state;
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    gr_proto_subscribe s = {123, 45, 1000, GR_PROTO_SUB_F16, 4096}, d;
    assert_int_equal(gr_proto_put_subscribe(&b, &s), GR_OK);
    assert_int_equal(b.len, 32);
    assert_int_equal(gr_proto_decode_subscribe(b.data, b.len, &d), GR_OK);
    assert_true(d.epoch == 123 && d.since == 45 && d.wait_ms == 1000 && d.flags == GR_PROTO_SUB_F16);
    assert_int_equal(d.from_slot, 4096);
    assert_int_equal(gr_proto_decode_subscribe(b.data, 24, &d), GR_EPROTO);
    uint32_t big = GR_SLOTS;
    memcpy(b.data + 24, &big, 4); /* a slot that does not exist */
    assert_int_equal(gr_proto_decode_subscribe(b.data, b.len, &d), GR_EPROTO);
    big = 0;
    memcpy(b.data + 24, &big, 4);
    b.data[28] = 1; /* reserved */
    assert_int_equal(gr_proto_decode_subscribe(b.data, b.len, &d), GR_EPROTO);
    b.data[28] = 0;
    b.data[20] = 0x7; /* unknown flag bits */
    assert_int_equal(gr_proto_decode_subscribe(b.data, b.len, &d), GR_EPROTO);
    gr_proto_buf_fini(&b);
}

/* A publication of two tables (one with 0 rows skipped by the writer) and one dense part. */
static void build_pub(gr_proto_buf *b, bool f16)
{
    gr_proto_publication h = {.epoch = 9, .seq = 3, .version = 777, .kind = GR_PROTO_PUB_DELTA,
                              .shard = 1, .f16 = f16, .nsparse = 2, .ndense = 1};
    assert_int_equal(gr_proto_put_pub_head(b, &h), GR_OK);
    uint64_t *k;
    void *v;
    assert_int_equal(gr_proto_put_pub_section(b, 5, 3, 2, f16, &k, &v), GR_OK);
    k[0] = 10, k[1] = 1ull << 60;
    for (int i = 0; i < 6; i++) {
        if (f16) ((uint16_t *)v)[i] = gr_f32_to_f16(0.5f * (float)i);
        else ((float *)v)[i] = 0.5f * (float)i;
    }
    assert_int_equal(gr_proto_put_pub_section(b, 6, 1, 1, f16, &k, &v), GR_OK);
    k[0] = 42;
    if (f16) ((uint16_t *)v)[0] = gr_f32_to_f16(-2.0f);
    else ((float *)v)[0] = -2.0f;
    float dense[3] = {1, 2, 3};
    assert_int_equal(gr_proto_put_dense_part(b, "lr.dense", dense, 3), GR_OK);
}

static void check_pub(const gr_proto_publication *p, bool f16)
{
    assert_true(p->epoch == 9 && p->seq == 3 && p->version == 777);
    assert_int_equal(p->kind, GR_PROTO_PUB_DELTA);
    assert_int_equal(p->shard, 1);
    assert_int_equal(p->nsparse, 2);
    assert_int_equal(p->sparse[0].table, 5);
    assert_int_equal(p->sparse[0].dim, 3);
    assert_int_equal(p->sparse[0].n, 2);
    assert_true(p->sparse[0].keys[1] == 1ull << 60);
    float x = f16 ? gr_f16_to_f32(((const uint16_t *)p->sparse[0].values)[5])
                  : ((const float *)p->sparse[0].values)[5];
    assert_true(x == 2.5f);
    assert_int_equal(p->sparse[1].keys[0], 42);
    assert_int_equal(p->ndense, 1);
    assert_int_equal(p->dense[0].name_len, 8);
    assert_memory_equal(p->dense[0].name, "lr.dense", 8);
    assert_true(p->dense[0].size == 3 && p->dense[0].values[2] == 3.0f);
}

static void test_publication_round_trip(void **state)
{
    (void)state;
    gr_proto_limits lim = lim_default();
    for (int f16 = 0; f16 <= 1; f16++) {
        gr_proto_buf b;
        gr_proto_buf_init(&b);
        build_pub(&b, f16);
        gr_proto_publication p;
        assert_int_equal(gr_proto_decode_publication(b.data, b.len, &lim, &p), GR_OK);
        check_pub(&p, f16);
        gr_proto_publication_fini(&p);
        /* Every truncation is refused, and so is a trailing byte. */
        for (size_t cut = 0; cut < b.len; cut += 4)
            assert_int_not_equal(gr_proto_decode_publication(b.data, cut, &lim, &p), GR_OK);
        gr_proto_buf_reserve(&b, 8);
        memset(b.data + b.len, 0, 8);
        assert_int_equal(gr_proto_decode_publication(b.data, b.len + 8, &lim, &p), GR_EPROTO);
        gr_proto_buf_fini(&b);
    }
}

static void test_publication_hostile(void **state)
{
    (void)state;
    gr_proto_limits lim = lim_default();
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    build_pub(&b, false);
    gr_proto_publication p;
    uint8_t *c = malloc(b.len);
    uint32_t v;
#define PATCH(off, val, want)                                                                      \
    do {                                                                                           \
        memcpy(c, b.data, b.len);                                                                  \
        v = (val);                                                                                 \
        memcpy(c + (off), &v, 4);                                                                  \
        assert_int_equal(gr_proto_decode_publication(c, b.len, &lim, &p), (want));                 \
    } while (0)
    PATCH(24, 3, GR_EPROTO);          /* kind beyond snapshot */
    PATCH(40, 2, GR_EPROTO);          /* f16 flag not 0/1 */
    PATCH(44, 1, GR_EPROTO);          /* next slot of a delta */
    PATCH(32, 1000, GR_ETOOBIG);      /* sections over max_tables (256) */
    PATCH(48 + 4, 0, GR_EINVAL);      /* dim 0 */
    PATCH(48 + 4, 4096, GR_EINVAL);   /* dim over the limit */
    PATCH(48 + 8, 1u << 30, GR_ETOOBIG); /* keys over max_keys */
    PATCH(48 + 8, 100, GR_EPROTO);    /* more rows than the body holds */
    PATCH(48 + 12, 1, GR_EPROTO);     /* section reserved */
#undef PATCH
    lim.max_keys = 2;
    assert_int_equal(gr_proto_decode_publication(b.data, b.len, &lim, &p), GR_ETOOBIG);
    free(c);
    gr_proto_buf_fini(&b);
}

static void test_predict_round_trip(void **state)
{
    (void)state;
    gr_proto_limits lim = lim_default();
    float dense[2 * 3] = {1, 2, 3, 4, 5, 6};
    uint64_t ids[2 * 2] = {7, 8, 9, 1ull << 63};
    gr_proto_predict q = {.n = 2, .ndense = 3, .nsparse = 2, .dense = dense, .ids = ids}, d;
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    assert_int_equal(gr_proto_put_predict(&b, &q), GR_OK);
    assert_int_equal(gr_proto_decode_predict(b.data, b.len, &lim, &d), GR_OK);
    assert_true(d.n == 2 && d.ndense == 3 && d.nsparse == 2);
    assert_true(d.dense[5] == 6.0f && d.ids[3] == 1ull << 63);
    assert_int_equal(gr_proto_decode_predict(b.data, b.len - 8, &lim, &d), GR_EPROTO);
    lim.max_keys = 9; /* 2 x 5 features */
    assert_int_equal(gr_proto_decode_predict(b.data, b.len, &lim, &d), GR_ETOOBIG);
    uint32_t zero = 0;
    memcpy(b.data, &zero, 4);
    lim = lim_default();
    assert_int_equal(gr_proto_decode_predict(b.data, b.len, &lim, &d), GR_EINVAL);
    b.len = 0;
    float probs[3] = {0.25f, 0.5f, 0.75f};
    assert_int_equal(gr_proto_put_predict_reply(&b, 99, probs, 3), GR_OK);
    uint64_t ver;
    const float *pp;
    uint32_t n;
    assert_int_equal(gr_proto_decode_predict_reply(b.data, b.len, &ver, &pp, &n), GR_OK);
    assert_true(ver == 99 && n == 3 && pp[2] == 0.75f);
    assert_int_equal(gr_proto_decode_predict_reply(b.data, b.len + 8, &ver, &pp, &n), GR_EPROTO);
    gr_proto_buf_fini(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_subscribe_round_trip),
        cmocka_unit_test(test_publication_round_trip),
        cmocka_unit_test(test_publication_hostile),
        cmocka_unit_test(test_predict_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
