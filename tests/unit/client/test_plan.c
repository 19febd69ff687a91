/* Unit tests for the client's batch planner (src/client/plan.c), without sockets: dedup,
 * routing to shards, splitting under limits, frame contents, summed duplicate gradients,
 * scatter back to every occurrence, keys given unique, and the edge cases (empty batch, all
 * keys on one shard, one row too big for a frame, replies that do not match). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "client/plan.h"

static gr_proto_limits lims2[2];

static int setup(void **state)
{
    (void)state;
    gr_proto_limits_default(&lims2[0]);
    lims2[1] = lims2[0];
    return 0;
}

static uint32_t owner(uint64_t key, uint32_t nshards) { return gr_slot_shard(gr_slot_of(key), nshards); }

/* The first key from `from` on shard s of n. */
static uint64_t key_on(uint32_t s, uint32_t n, uint64_t from)
{
    while (owner(from, n) != s) from++;
    return from;
}

/* The keys of request ri's body, decoded as the server would. */
static void decode_keys(cl_plan *p, size_t ri, gr_proto_layout layout, gr_proto_buf *buf,
                        gr_proto_batch *out)
{
    gr_proto_buf_init(buf);
    assert_int_equal(gr_proto_buf_reserve(buf, cl_plan_body_size(p, ri, layout)), GR_OK);
    assert_int_equal(cl_plan_put_sections(p, ri, layout, buf), GR_OK);
    assert_int_equal(buf->len, cl_plan_body_size(p, ri, layout));
    assert_int_equal(gr_proto_decode_batch(buf->data, buf->len, layout, &lims2[0], out), GR_OK);
}

static void test_dedup_and_routing(void **state)
{
    (void)state;
    uint64_t a = key_on(0, 2, 1), b = key_on(1, 2, 1), c = key_on(0, 2, a + 1);
    uint64_t keys[] = {a, b, a, c, b, a};
    float rows[6 * 4];
    gr_client_batch bt = {7, 4, 6, keys, rows, NULL, 0};
    cl_plan p;
    assert_int_equal(cl_plan_tables(&p, 2, &bt, 1, true, false), GR_OK);
    assert_int_equal(p.keys_in, 6);
    assert_int_equal(p.keys_sent, 3);
    const cl_tbl *t = &p.tb[0];
    assert_int_equal(t->nuniq, 3);
    /* Unique keys in first-seen order, grouped by shard, first-seen order kept inside one. */
    assert_int_equal(t->shard_start[0], 0);
    assert_int_equal(t->shard_start[1], 2);
    assert_int_equal(t->shard_start[2], 3);
    assert_true(t->uniq[t->order[0]] == a);
    assert_true(t->uniq[t->order[1]] == c);
    assert_true(t->uniq[t->order[2]] == b);
    /* Every occurrence is linked from its key's first one. */
    uint32_t ua = t->order[0], seen = 0;
    for (int32_t i = t->first[ua]; i >= 0; i = t->next[i]) {
        assert_true(keys[i] == a);
        seen++;
    }
    assert_int_equal(seen, 3);
    assert_int_equal(cl_plan_split(&p, lims2, GR_PROTO_KEYS, true), GR_OK);
    assert_int_equal(p.nreqs, 2);
    assert_int_equal(p.reqs[0].shard, 0);
    assert_int_equal(p.reqs[1].shard, 1);
    gr_proto_buf buf;
    gr_proto_batch d;
    decode_keys(&p, 0, GR_PROTO_KEYS, &buf, &d);
    assert_int_equal(d.ntables, 1);
    assert_int_equal(d.sections[0].table, 7);
    assert_int_equal(d.sections[0].dim, 4);
    assert_int_equal(d.sections[0].n, 2);
    assert_true(d.sections[0].keys[0] == a && d.sections[0].keys[1] == c);
    gr_proto_batch_fini(&d);
    gr_proto_buf_fini(&buf);
    decode_keys(&p, 1, GR_PROTO_KEYS, &buf, &d);
    assert_int_equal(d.sections[0].n, 1);
    assert_true(d.sections[0].keys[0] == b);
    gr_proto_batch_fini(&d);
    gr_proto_buf_fini(&buf);
    cl_plan_fini(&p);
}

static void test_all_keys_on_one_shard(void **state)
{
    (void)state;
    uint64_t keys[5];
    uint64_t k = 0;
    for (int i = 0; i < 5; i++) keys[i] = k = key_on(1, 2, k + 1);
    float rows[5 * 2];
    gr_client_batch bt[2] = {{1, 2, 5, keys, rows, NULL, 0}, {2, 2, 0, NULL, NULL, NULL, 0}};
    cl_plan p;
    assert_int_equal(cl_plan_tables(&p, 2, bt, 2, true, false), GR_OK);
    assert_int_equal(cl_plan_split(&p, lims2, GR_PROTO_KEYS, true), GR_OK);
    /* Shard 0 has nothing and gets no request; the empty table adds no section. */
    assert_int_equal(p.nreqs, 1);
    assert_int_equal(p.reqs[0].shard, 1);
    assert_int_equal(p.reqs[0].npieces, 1);
    assert_int_equal(p.reqs[0].pieces[0].count, 5);
    cl_plan_fini(&p);
    /* A step push still gets one request per shard, the empty one without pieces. */
    assert_int_equal(cl_plan_tables(&p, 2, bt, 2, false, false), GR_OK);
    assert_int_equal(cl_plan_per_shard(&p), GR_OK);
    assert_int_equal(p.nreqs, 2);
    assert_int_equal(p.reqs[0].npieces, 0);
    assert_int_equal(p.reqs[1].npieces, 1);
    cl_plan_fini(&p);
}

static void test_split_over_limits(void **state)
{
    (void)state;
    enum { N = 7 };
    uint64_t keys[N];
    for (int i = 0; i < N; i++) keys[i] = 100 + (uint64_t)i;
    gr_client_batch bt[2] = {{1, 4, N, keys, NULL, NULL, 0}, {2, 4, N, keys, NULL, NULL, 0}};
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    lim.max_keys = 3;
    cl_plan p;
    assert_int_equal(cl_plan_tables(&p, 1, bt, 2, false, false), GR_OK);
    assert_int_equal(cl_plan_split(&p, &lim, GR_PROTO_KEYS, false), GR_OK);
    /* 14 keys, at most 3 per request: 5 requests (3, 3, 1+2, 3, 2), every key exactly once. */
    assert_int_equal(p.nreqs, 5);
    uint32_t per_table[2] = {0, 0};
    for (size_t r = 0; r < p.nreqs; r++) {
        uint32_t sum = 0;
        for (uint32_t k = 0; k < p.reqs[r].npieces; k++) {
            sum += p.reqs[r].pieces[k].count;
            per_table[p.reqs[r].pieces[k].bi] += p.reqs[r].pieces[k].count;
        }
        assert_in_range(sum, 1, 3);
    }
    assert_int_equal(per_table[0], N);
    assert_int_equal(per_table[1], N);
    cl_plan_fini(&p);

    /* One table per request. */
    gr_proto_limits_default(&lim);
    lim.max_tables = 1;
    assert_int_equal(cl_plan_tables(&p, 1, bt, 2, false, false), GR_OK);
    assert_int_equal(cl_plan_split(&p, &lim, GR_PROTO_KEYS, false), GR_OK);
    assert_int_equal(p.nreqs, 2);
    cl_plan_fini(&p);

    /* Bytes: a 4096-byte body holds (4096 - 64 - 8 - 24) / (8 + 16) = 166 pushed rows of dim 4,
     * and a reply of rows bounds a pull the same way. */
    enum { M = 400 };
    uint64_t *many = malloc(M * sizeof *many);
    float *g = calloc(M * 4, sizeof *g);
    for (int i = 0; i < M; i++) many[i] = 1000 + (uint64_t)i;
    gr_client_batch big = {1, 4, M, many, NULL, g, 0};
    gr_proto_limits_default(&lim);
    lim.max_body = 4096;
    assert_int_equal(cl_plan_tables(&p, 1, &big, 1, false, true), GR_OK);
    assert_int_equal(cl_plan_split(&p, &lim, GR_PROTO_KEYS_VALUES, false), GR_OK);
    assert_int_equal(p.nreqs, 3);
    assert_int_equal(p.reqs[0].pieces[0].count, 166);
    for (size_t r = 0; r < p.nreqs; r++)
        assert_true(cl_plan_body_size(&p, r, GR_PROTO_KEYS_VALUES) <= lim.max_body);
    cl_plan_fini(&p);

    /* A row that cannot fit any frame: GR_ETOOBIG naming the shard. */
    gr_client_batch wide = {1, 1024, 1, many, NULL, g, 0};
    lim.max_body = 4096;
    gr_proto_limits two[2] = {lim, lim};
    assert_int_equal(cl_plan_tables(&p, 2, &wide, 1, false, true), GR_OK);
    uint32_t s = owner(many[0], 2);
    assert_int_equal(cl_plan_split(&p, two, GR_PROTO_KEYS_VALUES, false), GR_ETOOBIG);
    assert_int_equal(p.fail_shard, s);
    assert_non_null(strstr(gr_errmsg(), "does not fit"));
    cl_plan_fini(&p);
    free(many);
    free(g);
}

static void test_push_sums_duplicates(void **state)
{
    (void)state;
    uint64_t keys[] = {5, 9, 5, 5, 9, 11};
    /* Values chosen so that the order of the sum shows in the bits: (0.1 + 1e8) - 1e8 != 0.1. */
    float g[6 * 2] = {0.1f, 1, 2, 2, 1e8f, 10, -1e8f, 100, 3, 3, 7, 7};
    gr_client_batch bt = {3, 2, 6, keys, NULL, g, 0};
    cl_plan p;
    assert_int_equal(cl_plan_tables(&p, 1, &bt, 1, false, true), GR_OK);
    assert_int_equal(cl_plan_split(&p, lims2, GR_PROTO_KEYS_VALUES, false), GR_OK);
    assert_int_equal(p.nreqs, 1);
    gr_proto_buf buf;
    gr_proto_buf_init(&buf);
    assert_int_equal(gr_proto_buf_reserve(&buf, cl_plan_body_size(&p, 0, GR_PROTO_KEYS_VALUES)), 0);
    assert_int_equal(cl_plan_put_sections(&p, 0, GR_PROTO_KEYS_VALUES, &buf), GR_OK);
    assert_int_equal(cl_plan_sum_grads(&p, &bt), GR_OK);
    gr_proto_batch d;
    assert_int_equal(gr_proto_decode_batch(buf.data, buf.len, GR_PROTO_KEYS_VALUES, &lims2[0], &d), 0);
    assert_int_equal(d.sections[0].n, 3);
    const uint64_t *k = d.sections[0].keys;
    const float *v = d.sections[0].values;
    assert_true(k[0] == 5 && k[1] == 9 && k[2] == 11);
    float want5a = (0.1f + 1e8f) + -1e8f, want5b = (1.0f + 10.0f) + 100.0f;
    assert_memory_equal(&v[0], &want5a, sizeof(float));
    assert_memory_equal(&v[1], &want5b, sizeof(float));
    assert_true(v[2] == 5.0f && v[3] == 5.0f);
    assert_true(v[4] == 7.0f && v[5] == 7.0f);
    gr_proto_batch_fini(&d);
    gr_proto_buf_fini(&buf);
    cl_plan_fini(&p);

    /* A non-finite gradient is refused with the caller's table, key, row and element (the
     * first one, in the caller's order). */
    g[7] = __builtin_inff();
    g[9] = -__builtin_inff();
    assert_int_equal(cl_plan_tables(&p, 1, &bt, 1, false, true), GR_OK);
    assert_int_equal(cl_plan_split(&p, lims2, GR_PROTO_KEYS_VALUES, false), GR_OK);
    gr_proto_buf_init(&buf);
    assert_int_equal(gr_proto_buf_reserve(&buf, cl_plan_body_size(&p, 0, GR_PROTO_KEYS_VALUES)), 0);
    assert_int_equal(cl_plan_put_sections(&p, 0, GR_PROTO_KEYS_VALUES, &buf), GR_OK);
    assert_int_equal(cl_plan_sum_grads(&p, &bt), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "table 3, key 5 (row 3, element 1) is not finite"));
    gr_proto_buf_fini(&buf);
    cl_plan_fini(&p);
}

/* The same at a dim the wide loop takes (a multiple of 16), many keys and repeats: every
 * key's slot holds its gradients summed in occurrence order, bit for bit; a NaN inside the
 * vector part of a repeat is refused and named. */
static void test_push_sums_wide_dim(void **state)
{
    (void)state;
    enum { N = 300, DIM = 48 };
    uint64_t keys[N];
    static float g[N * DIM], want[N * DIM];
    for (int i = 0; i < N; i++) keys[i] = (uint64_t)((i * 7) % 61); /* 61 keys, ~5 each */
    for (int i = 0; i < N * DIM; i++) g[i] = (float)((i * 2654435761u) % 1000003u) * 1e-3f - 500.0f;
    /* The reference: per unique key in first-seen order, its occurrences added in order. */
    uint64_t uniq[N];
    int nu = 0;
    for (int i = 0; i < N; i++) {
        int u = 0;
        while (u < nu && uniq[u] != keys[i]) u++;
        if (u == nu) {
            uniq[nu++] = keys[i];
            memcpy(want + (size_t)u * DIM, g + (size_t)i * DIM, DIM * sizeof(float));
        } else {
            for (int d = 0; d < DIM; d++) want[(size_t)u * DIM + d] += g[(size_t)i * DIM + d];
        }
    }
    gr_client_batch bt = {4, DIM, N, keys, NULL, g, 0};
    cl_plan p;
    assert_int_equal(cl_plan_tables(&p, 1, &bt, 1, false, true), GR_OK);
    assert_int_equal(cl_plan_split(&p, lims2, GR_PROTO_KEYS_VALUES, false), GR_OK);
    gr_proto_buf buf;
    gr_proto_buf_init(&buf);
    assert_int_equal(gr_proto_buf_reserve(&buf, cl_plan_body_size(&p, 0, GR_PROTO_KEYS_VALUES)), 0);
    assert_int_equal(cl_plan_put_sections(&p, 0, GR_PROTO_KEYS_VALUES, &buf), GR_OK);
    assert_int_equal(cl_plan_sum_grads(&p, &bt), GR_OK);
    gr_proto_batch d;
    assert_int_equal(gr_proto_decode_batch(buf.data, buf.len, GR_PROTO_KEYS_VALUES, &lims2[0], &d), 0);
    assert_int_equal(d.sections[0].n, nu);
    for (int u = 0; u < nu; u++) {
        assert_true(d.sections[0].keys[u] == uniq[u]);
        assert_memory_equal(d.sections[0].values + (size_t)u * DIM, want + (size_t)u * DIM,
                            DIM * sizeof(float));
    }
    gr_proto_batch_fini(&d);
    gr_proto_buf_fini(&buf);
    cl_plan_fini(&p);

    g[200 * DIM + 21] = __builtin_nanf(""); /* row 200 repeats key (200 * 7) % 61 */
    assert_int_equal(cl_plan_tables(&p, 1, &bt, 1, false, true), GR_OK);
    assert_int_equal(cl_plan_split(&p, lims2, GR_PROTO_KEYS_VALUES, false), GR_OK);
    gr_proto_buf_init(&buf);
    assert_int_equal(gr_proto_buf_reserve(&buf, cl_plan_body_size(&p, 0, GR_PROTO_KEYS_VALUES)), 0);
    assert_int_equal(cl_plan_put_sections(&p, 0, GR_PROTO_KEYS_VALUES, &buf), GR_OK);
    assert_int_equal(cl_plan_sum_grads(&p, &bt), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "(row 200, element 21) is not finite"));
    gr_proto_buf_fini(&buf);
    cl_plan_fini(&p);
}

/* A reply for request ri whose row j of section k is filled with base + 1000 k + j. */
static void make_reply(const cl_plan *p, size_t ri, float base, gr_proto_buf *buf, gr_proto_batch *out)
{
    const cl_plan_req *r = &p->reqs[ri];
    gr_proto_buf_init(buf);
    assert_int_equal(gr_proto_buf_reserve(buf, cl_plan_body_size(p, ri, GR_PROTO_VALUES)), 0);
    assert_int_equal(gr_proto_put_batch_head(buf, r->npieces), 0);
    for (uint32_t k = 0; k < r->npieces; k++) {
        const cl_tbl *t = &p->tb[r->pieces[k].bi];
        float *vals;
        assert_int_equal(gr_proto_put_section(buf, GR_PROTO_VALUES, t->table, t->dim,
                                              r->pieces[k].count, NULL, &vals), 0);
        for (uint32_t j = 0; j < r->pieces[k].count; j++)
            for (uint32_t d = 0; d < t->dim; d++) vals[j * t->dim + d] = base + 1000.0f * k + (float)j;
    }
    assert_int_equal(gr_proto_decode_batch(buf->data, buf->len, GR_PROTO_VALUES, &lims2[0], out), 0);
}

static void test_scatter_to_every_occurrence(void **state)
{
    (void)state;
    uint64_t keys[] = {42, 7, 42, 42, 8, 7};
    float rows[6 * 3];
    memset(rows, 0xff, sizeof rows);
    gr_client_batch bt = {1, 3, 6, keys, rows, NULL, 0};
    cl_plan p;
    assert_int_equal(cl_plan_tables(&p, 1, &bt, 1, true, false), GR_OK);
    assert_int_equal(cl_plan_split(&p, lims2, GR_PROTO_KEYS, true), GR_OK);
    gr_proto_buf buf;
    gr_proto_batch rep;
    make_reply(&p, 0, 1.0f, &buf, &rep);
    assert_int_equal(cl_plan_scatter(&p, 0, &rep), GR_OK);
    /* Sent order: 42, 7, 8 -> rows 1, 2, 3. */
    const float want[6] = {1, 2, 1, 1, 3, 2};
    for (int i = 0; i < 6; i++)
        for (int d = 0; d < 3; d++) assert_true(rows[i * 3 + d] == want[i]);
    /* A reply that does not match the request is refused. */
    rep.sections[0].n--;
    assert_int_equal(cl_plan_scatter(&p, 0, &rep), GR_EPROTO);
    rep.sections[0].n++;
    rep.sections[0].table = 2;
    assert_int_equal(cl_plan_scatter(&p, 0, &rep), GR_EPROTO);
    rep.sections[0].table = 1;
    rep.ntables = 2;
    assert_int_equal(cl_plan_scatter(&p, 0, &rep), GR_EPROTO);
    rep.ntables = 1;
    gr_proto_batch_fini(&rep);
    gr_proto_buf_fini(&buf);
    cl_plan_fini(&p);
}

static void test_scatter_streaming(void **state)
{
    (void)state;
    /* Output over CL_STREAM_ROWS_BYTES takes the streaming-store path: same result. */
    enum { DIM = 64, N = (CL_STREAM_ROWS_BYTES / (DIM * 4)) + 16 };
    uint64_t *keys = malloc(N * sizeof *keys);
    float *rows = aligned_alloc(64, (size_t)N * DIM * sizeof(float));
    for (int i = 0; i < N; i++) keys[i] = (uint64_t)(i % (N / 2)); /* every key twice */
    gr_client_batch bt = {1, DIM, N, keys, rows, NULL, 0};
    cl_plan p;
    assert_int_equal(cl_plan_tables(&p, 1, &bt, 1, true, false), GR_OK);
    assert_true(p.stream_rows);
    assert_int_equal(cl_plan_split(&p, lims2, GR_PROTO_KEYS, true), GR_OK);
    assert_int_equal(p.nreqs, 1);
    gr_proto_buf buf;
    gr_proto_batch rep;
    make_reply(&p, 0, 0.0f, &buf, &rep);
    assert_int_equal(cl_plan_scatter(&p, 0, &rep), GR_OK);
    for (int i = 0; i < N; i++) {
        float w = (float)(i % (N / 2)); /* first-seen order = key order */
        assert_true(rows[(size_t)i * DIM] == w && rows[(size_t)i * DIM + DIM - 1] == w);
    }
    gr_proto_batch_fini(&rep);
    gr_proto_buf_fini(&buf);
    cl_plan_fini(&p);
    free(keys);
    free(rows);
}

static void test_unique_keys(void **state)
{
    (void)state;
    uint64_t a = key_on(0, 2, 1), b = key_on(1, 2, 1), c = key_on(0, 2, a + 1);
    uint64_t keys[] = {b, a, c};
    float rows[3 * 2] = {0};
    float g[3 * 2] = {1, 1, 2, 2, 3, 3};
    gr_client_batch bt = {1, 2, 3, keys, rows, g, GR_CLIENT_BATCH_UNIQUE};
    cl_plan p;
    assert_int_equal(cl_plan_tables(&p, 2, &bt, 1, true, true), GR_OK);
    const cl_tbl *t = &p.tb[0];
    assert_true(t->unique && t->first == NULL && t->inv == NULL);
    assert_int_equal(p.keys_sent, 3);
    assert_int_equal(cl_plan_split(&p, lims2, GR_PROTO_KEYS_VALUES, true), GR_OK);
    assert_int_equal(p.nreqs, 2);
    /* Frames: the keys as given, grouped by shard; gradients copied once. */
    gr_proto_buf bufs[2];
    for (int r = 0; r < 2; r++) {
        gr_proto_buf_init(&bufs[r]);
        assert_int_equal(gr_proto_buf_reserve(&bufs[r], cl_plan_body_size(&p, r, GR_PROTO_KEYS_VALUES)), 0);
        assert_int_equal(cl_plan_put_sections(&p, r, GR_PROTO_KEYS_VALUES, &bufs[r]), GR_OK);
    }
    assert_int_equal(cl_plan_sum_grads(&p, &bt), GR_OK);
    gr_proto_batch d;
    assert_int_equal(gr_proto_decode_batch(bufs[0].data, bufs[0].len, GR_PROTO_KEYS_VALUES, &lims2[0], &d), 0);
    assert_int_equal(d.sections[0].n, 2);
    assert_true(d.sections[0].keys[0] == a && d.sections[0].keys[1] == c);
    assert_true(d.sections[0].values[0] == 2 && d.sections[0].values[2] == 3);
    gr_proto_batch_fini(&d);
    /* Replies land at the caller's positions. */
    for (int r = 0; r < 2; r++) {
        gr_proto_buf rb;
        gr_proto_batch rep;
        make_reply(&p, r, 10.0f * (float)(r + 1), &rb, &rep);
        assert_int_equal(cl_plan_scatter(&p, r, &rep), GR_OK);
        gr_proto_batch_fini(&rep);
        gr_proto_buf_fini(&rb);
        gr_proto_buf_fini(&bufs[r]);
    }
    assert_true(rows[0] == 20.0f); /* b: shard 1's first row */
    assert_true(rows[2] == 10.0f); /* a: shard 0's first row */
    assert_true(rows[4] == 11.0f); /* c: shard 0's second row */
    cl_plan_fini(&p);
}

static void test_bad_batches(void **state)
{
    (void)state;
    uint64_t keys[2] = {1, 2};
    float rows[2 * 4];
    cl_plan p;
    assert_int_equal(cl_plan_tables(&p, 1, NULL, 0, true, false), GR_EINVAL);
    cl_plan_fini(&p);
    gr_client_batch dim0 = {1, 0, 2, keys, rows, NULL, 0};
    assert_int_equal(cl_plan_tables(&p, 1, &dim0, 1, true, false), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "dim 0"));
    cl_plan_fini(&p);
    gr_client_batch wide = {1, GR_PROTO_DIM_MAX + 1, 2, keys, rows, NULL, 0};
    assert_int_equal(cl_plan_tables(&p, 1, &wide, 1, true, false), GR_EINVAL);
    cl_plan_fini(&p);
    gr_client_batch norows = {1, 4, 2, keys, NULL, NULL, 0};
    assert_int_equal(cl_plan_tables(&p, 1, &norows, 1, true, false), GR_EINVAL);
    cl_plan_fini(&p);
    gr_client_batch nograds = {1, 4, 2, keys, NULL, NULL, 0};
    assert_int_equal(cl_plan_tables(&p, 1, &nograds, 1, false, true), GR_EINVAL);
    cl_plan_fini(&p);
    gr_client_batch toomany = {1, 4, (size_t)INT32_MAX, keys, rows, NULL, 0};
    assert_int_equal(cl_plan_tables(&p, 1, &toomany, 1, true, false), GR_ETOOBIG);
    cl_plan_fini(&p);
    gr_client_batch flags = {1, 4, 2, keys, rows, NULL, 0x80};
    assert_int_equal(cl_plan_tables(&p, 1, &flags, 1, true, false), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "flags"));
    cl_plan_fini(&p);
    /* An empty table is fine and sends nothing. */
    gr_client_batch empty = {1, 4, 0, NULL, NULL, NULL, 0};
    assert_int_equal(cl_plan_tables(&p, 2, &empty, 1, true, false), GR_OK);
    assert_int_equal(cl_plan_split(&p, lims2, GR_PROTO_KEYS, true), GR_OK);
    assert_int_equal(p.nreqs, 0);
    cl_plan_fini(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dedup_and_routing),
        cmocka_unit_test(test_all_keys_on_one_shard),
        cmocka_unit_test(test_split_over_limits),
        cmocka_unit_test(test_push_sums_duplicates),
        cmocka_unit_test(test_push_sums_wide_dim),
        cmocka_unit_test(test_scatter_to_every_occurrence),
        cmocka_unit_test(test_scatter_streaming),
        cmocka_unit_test(test_unique_keys),
        cmocka_unit_test(test_bad_batches),
    };
    return cmocka_run_group_tests_name("client_plan", tests, setup, NULL);
}
