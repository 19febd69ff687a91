/* Unit tests for the table engine: lookup/insert/get/delete against a shadow model, growth,
 * initializers, f16 storage, scans and dirty tracking, TTL and capacity eviction, admission,
 * the memory cap, stats and the argument checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/table.h"
#include "table/table_internal.h"

static gr_table *make(const gr_table_spec *s)
{
    gr_table *t = NULL;
    if (gr_table_create(s, &t) != GR_OK) fail_msg("create: %s", gr_errmsg());
    return t;
}

static void test_create_destroy(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "basic", 4);
    s.partitions = 0;
    gr_table *t = make(&s);
    assert_int_equal(gr_table_get_spec(t)->partitions, 256);
    assert_string_equal(gr_table_get_spec(t)->name, "basic");
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    assert_true(st.rows == 0 && st.hits == 0);
    assert_int_equal(st.row_bytes, 16 + 16); /* header + 4 f32 weights, SGD has no state */
    assert_int_equal(st.payload_bytes, 16);
    gr_table_destroy(t);
    gr_table_destroy(NULL);
    s.dim = 0;
    assert_int_equal(gr_table_create(&s, &t), GR_EINVAL);
    assert_null(t);
    assert_int_equal(gr_table_create(NULL, &t), GR_EINVAL);
}

static void test_lookup_creates_and_readonly(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "lk", 3);
    s.init.kind = GR_INIT_CONSTANT;
    s.init.value = 0.5f;
    gr_table *t = make(&s);
    uint64_t keys[] = {0, 7, UINT64_MAX, 7};
    float out[12];
    /* Read-only: nothing is created, zeros come back. */
    assert_int_equal(gr_table_lookup(t, keys, 4, out, GR_LOOKUP_READONLY), GR_OK);
    for (int i = 0; i < 12; i++) assert_true(out[i] == 0.0f);
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    assert_true(st.rows == 0 && st.misses == 4 && st.admits == 0);
    /* Creating lookup: three distinct keys, the repeated one is a hit. */
    assert_int_equal(gr_table_lookup(t, keys, 4, out, 0), GR_OK);
    for (int i = 0; i < 12; i++) assert_true(out[i] == 0.5f);
    gr_table_get_stats(t, &st);
    assert_true(st.rows == 3);
    assert_true(st.misses == 7 && st.hits == 1 && st.admits == 3);
    /* Hits are counted in the row metadata. */
    gr_row_meta meta[4];
    bool found[4];
    assert_int_equal(gr_table_get(t, keys, 4, NULL, NULL, meta, found), GR_OK);
    assert_true(found[0] && found[1] && found[2]);
    assert_int_equal(meta[1].hits, 2);
    assert_int_equal(meta[0].hits, 1);
    assert_int_equal(gr_table_lookup(t, NULL, 0, NULL, 0), GR_OK);
    assert_int_equal(gr_table_lookup(t, NULL, 1, out, 0), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "keys is NULL"));
    assert_int_equal(gr_table_lookup(t, keys, 1, NULL, 0), GR_EINVAL);
    assert_int_equal(gr_table_lookup(t, keys, 1, out, 8), GR_EINVAL);
    assert_int_equal(gr_table_lookup(NULL, keys, 1, out, 0), GR_EINVAL);
    gr_table_destroy(t);
}

static void test_init_deterministic(void **state)
{
    (void)state;
    const uint32_t dim = 33;
    const size_t n = 2000;
    uint64_t *keys = malloc(n * sizeof *keys);
    for (size_t i = 0; i < n; i++) keys[i] = i * 0x9e3779b97f4a7c15ull;
    float *a = malloc(n * dim * 4), *b = malloc(n * dim * 4);
    for (int kind = GR_INIT_UNIFORM; kind <= GR_INIT_TRUNC_NORMAL; kind++) {
        gr_table_spec s;
        gr_table_spec_default(&s, "init", dim);
        s.seed = 1234;
        s.init.kind = (gr_init_kind)kind;
        s.init.low = -0.25f;
        s.init.high = 0.75f;
        s.init.mean = 1.0f;
        s.init.stddev = 0.5f;
        s.partitions = 1;
        gr_table *t1 = make(&s);
        s.partitions = 1024; /* a different layout ("another shard") gives the same rows */
        gr_table *t2 = make(&s);
        assert_int_equal(gr_table_lookup(t1, keys, n, a, 0), GR_OK);
        /* Reverse order in the second table. */
        for (size_t i = 0; i < n; i++)
            assert_int_equal(gr_table_lookup(t2, &keys[n - 1 - i], 1, b + (n - 1 - i) * dim, 0),
                             GR_OK);
        assert_memory_equal(a, b, n * dim * 4);
        double sum = 0, sq = 0;
        for (size_t i = 0; i < n * dim; i++) {
            if (kind == GR_INIT_UNIFORM) {
                assert_true(a[i] >= -0.25f && a[i] < 0.75f);
            } else {
                assert_true(a[i] >= 0.0f && a[i] <= 2.0f);
            }
            sum += a[i];
            sq += (double)a[i] * a[i];
        }
        double mean = sum / (double)(n * dim), var = sq / (double)(n * dim) - mean * mean;
        if (kind == GR_INIT_UNIFORM) {
            assert_true(fabs(mean - 0.25) < 0.01);
            assert_true(fabs(var - 1.0 / 12.0) < 0.005);
        } else {
            /* Normal truncated at 2 sigma has variance 0.774 sigma^2. */
            assert_true(fabs(mean - 1.0) < 0.01);
            assert_true(fabs(var - 0.774 * 0.25) < 0.01);
        }
        /* Rows are distinct across keys and elements. */
        assert_true(memcmp(a, a + dim, dim * 4) != 0);
        /* A different seed gives different rows. */
        s.seed = 1235;
        gr_table *t3 = make(&s);
        assert_int_equal(gr_table_lookup(t3, keys, 1, b, 0), GR_OK);
        assert_true(memcmp(a, b, dim * 4) != 0);
        gr_table_destroy(t1);
        gr_table_destroy(t2);
        gr_table_destroy(t3);
    }
    free(keys);
    free(a);
    free(b);
}

static void test_half_conversion(void **state)
{
    (void)state;
    /* Every half value survives half -> float -> half (NaNs stay NaNs). */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = gr_f16_to_f32((uint16_t)h);
        uint16_t back = gr_f32_to_f16(f);
        if (isnan(f)) assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff));
        else assert_int_equal(back, h);
    }
    assert_true(gr_f16_to_f32(0x3c00) == 1.0f);
    assert_true(gr_f16_to_f32(0xc000) == -2.0f);
    assert_true(gr_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(gr_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    /* Round to nearest even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10. */
    assert_int_equal(gr_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00);
    assert_int_equal(gr_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3c02);
    assert_int_equal(gr_f32_to_f16(1.0f + ldexpf(1.0f, -11) + ldexpf(1.0f, -20)), 0x3c01);
    assert_int_equal(gr_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(gr_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(gr_f32_to_f16(-1e9f), 0xfc00);
    assert_int_equal(gr_f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* tie to even zero */
    assert_int_equal(gr_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
    assert_int_equal(gr_f32_to_f16(ldexpf(3.0f, -25)), 0x0002); /* 1.5 ulp ties to even 2 */
    assert_int_equal(gr_f32_to_f16(-0.0f), 0x8000);
    /* Exhaustive against a double-precision reference over a float range. */
    for (uint32_t x = 0x33000000u; x < 0x47800000u; x += 997) {
        float f;
        memcpy(&f, &x, 4);
        uint16_t h = gr_f32_to_f16(f);
        double got = gr_f16_to_f32(h);
        double lo = gr_f16_to_f32((uint16_t)(h - 1)), hi = gr_f16_to_f32((uint16_t)(h + 1));
        if (h == 0x7c00) { /* overflow to infinity from 65520 up */
            assert_true(f >= 65520.0f);
            continue;
        }
        if (h > 0) assert_true(fabs(got - f) <= fabs(lo - f));
        if (h < 0x7bff) assert_true(fabs(got - f) <= fabs(hi - f));
    }
}

static void test_f16_table(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "half", 5);
    s.dtype = GR_DTYPE_F16;
    s.init.kind = GR_INIT_UNIFORM;
    s.init.low = -1;
    s.init.high = 1;
    s.opt.lr = 0.1f;
    gr_table *t = make(&s);
    gr_table_spec s32 = s;
    s32.dtype = GR_DTYPE_F32;
    gr_table *t32 = make(&s32);
    uint64_t keys[3] = {11, 22, 33};
    float w16[15], w32[15], g[15];
    assert_int_equal(gr_table_lookup(t, keys, 3, w16, 0), GR_OK);
    assert_int_equal(gr_table_lookup(t32, keys, 3, w32, 0), GR_OK);
    for (int i = 0; i < 15; i++) {
        assert_true(w16[i] == gr_f16_to_f32(gr_f32_to_f16(w32[i])));
        g[i] = 0.37f * (float)(i - 7);
    }
    float ref[15];
    memcpy(ref, w16, sizeof ref);
    for (int step = 0; step < 3; step++) {
        assert_int_equal(gr_table_apply(t, keys, 3, g), GR_OK);
        for (int i = 0; i < 15; i++) ref[i] = gr_f16_to_f32(gr_f32_to_f16(ref[i] - 0.1f * g[i]));
    }
    assert_int_equal(gr_table_lookup(t, keys, 3, w16, GR_LOOKUP_READONLY), GR_OK);
    assert_memory_equal(w16, ref, sizeof ref);
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    assert_int_equal(st.payload_bytes, 10);
    assert_int_equal(st.row_bytes, 32); /* 16 + 10 rounded up to 8 */
    /* Insert/get round trip through half storage. */
    float in[5] = {1.0f, -2.5f, 0.1f, 1000.0f, 0.0f}, outw[5];
    uint64_t k = 99;
    assert_int_equal(gr_table_insert(t, &k, 1, in, NULL, NULL), GR_OK);
    assert_int_equal(gr_table_get(t, &k, 1, outw, NULL, NULL, NULL), GR_OK);
    for (int i = 0; i < 5; i++) assert_true(outw[i] == gr_f16_to_f32(gr_f32_to_f16(in[i])));
    gr_table_destroy(t);
    gr_table_destroy(t32);

    /* Odd dim with optimizer state after half weights: the state stays aligned (UBSan checks)
     * and Adagrad matches a reference computed in f32 with rounding to half after each step. */
    gr_table_spec sa;
    gr_table_spec_default(&sa, "half_adagrad", 3);
    sa.dtype = GR_DTYPE_F16;
    sa.opt.kind = GR_OPT_ADAGRAD;
    sa.opt.lr = 0.5f;
    sa.opt.eps = 1e-8f;
    sa.opt.initial_accumulator = 0.1f;
    gr_table *ta = make(&sa);
    uint64_t ka[2] = {7, 8};
    float ga[6] = {0.5f, -1.0f, 2.0f, 0.25f, 0.0f, -0.75f}, wa[6], acc[6], wr[6], ar[6];
    for (int i = 0; i < 6; i++) {
        wr[i] = 0.0f;
        ar[i] = 0.1f;
    }
    for (int step = 0; step < 2; step++) {
        assert_int_equal(gr_table_apply(ta, ka, 2, ga), GR_OK);
        for (int i = 0; i < 6; i++) {
            ar[i] += ga[i] * ga[i];
            wr[i] = gr_f16_to_f32(gr_f32_to_f16(wr[i] - 0.5f * ga[i] / (sqrtf(ar[i]) + 1e-8f)));
        }
    }
    assert_int_equal(gr_table_get(ta, ka, 2, wa, acc, NULL, NULL), GR_OK);
    for (int i = 0; i < 6; i++) {
        assert_float_equal(acc[i], ar[i], 1e-6);
        assert_float_equal(wa[i], wr[i], 1e-3);
    }
    gr_table_destroy(ta);
}

static void test_insert_get_roundtrip(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "ckpt", 4);
    s.opt.kind = GR_OPT_ADAM;
    s.partitions = 8;
    gr_table *t = make(&s);
    gr_table_set_clock(t, 500);
    const uint32_t sf = gr_table_state_floats(&s);
    assert_int_equal(sf, 9);
    uint64_t keys[3] = {5, 6, 7};
    float w[12], st[27];
    gr_row_meta meta[3] = {{10, 1}, {20, 2}, {30, 3}};
    for (int i = 0; i < 12; i++) w[i] = (float)i * 0.25f;
    for (int i = 0; i < 27; i++) st[i] = (float)i;
    assert_int_equal(gr_table_insert(t, keys, 3, w, st, meta), GR_OK);
    float w2[12], st2[27];
    gr_row_meta m2[3];
    bool found[3];
    assert_int_equal(gr_table_get(t, keys, 3, w2, st2, m2, found), GR_OK);
    assert_memory_equal(w, w2, sizeof w);
    assert_memory_equal(st, st2, sizeof st);
    assert_memory_equal(meta, m2, sizeof meta);
    /* Insert replaces; NULL state is the initial state, NULL meta is "now, 0 hits". */
    for (int i = 0; i < 4; i++) w[i] = -1.0f;
    assert_int_equal(gr_table_insert(t, keys, 1, w, NULL, NULL), GR_OK);
    assert_int_equal(gr_table_get(t, keys, 1, w2, st2, m2, found), GR_OK);
    assert_true(w2[0] == -1.0f && st2[0] == 0.0f && st2[8] == 0.0f);
    assert_int_equal(m2[0].last_update, 500);
    assert_int_equal(m2[0].hits, 0);
    /* get of an absent key reads zeros and found=false; counts nothing. */
    uint64_t miss = 12345;
    w2[0] = 9;
    st2[0] = 9;
    assert_int_equal(gr_table_get(t, &miss, 1, w2, st2, m2, found), GR_OK);
    assert_false(found[0]);
    assert_true(w2[0] == 0.0f && st2[0] == 0.0f && m2[0].hits == 0);
    gr_table_stats sts;
    gr_table_get_stats(t, &sts);
    assert_true(sts.rows == 3 && sts.hits == 0 && sts.misses == 0);
    /* Non-finite weights are refused and nothing is inserted. */
    float bad[8] = {0, 0, 0, 0, 0, NAN, 0, 0};
    uint64_t nk[2] = {100, 101};
    assert_int_equal(gr_table_insert(t, nk, 2, bad, NULL, NULL), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "not finite"));
    gr_table_get(t, nk, 2, NULL, NULL, NULL, found);
    assert_false(found[0] || found[1]);
    gr_table_destroy(t);
}

/* Random inserts and deletes against a shadow array: exercises backward-shift deletion,
 * the free list, index growth and chunk growth on a single partition and on many. */
static void run_shadow(uint32_t partitions, size_t nkeys, size_t rounds)
{
    gr_table_spec s;
    gr_table_spec_default(&s, "shadow", 2);
    s.partitions = partitions;
    gr_table *t = make(&s);
    bool *present = calloc(nkeys, 1);
    gr_rng r;
    gr_rng_seed(&r, partitions);
    uint64_t batch[256];
    float w[512];
    bool found[256];
    size_t rows = 0;
    for (size_t round = 0; round < rounds; round++) {
        size_t n = 1 + gr_rng_next(&r) % 256;
        bool del = gr_rng_next(&r) % 3 == 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t k = gr_rng_next(&r) % nkeys;
            batch[i] = k * 0x100000001b3ull; /* spread keys, keep them distinct */
            w[2 * i] = (float)k;
            w[2 * i + 1] = (float)round;
        }
        if (del) {
            size_t d = 0, expect = 0;
            for (size_t i = 0; i < n; i++) {
                uint64_t k = batch[i] / 0x100000001b3ull;
                if (present[k]) expect++;
                present[k] = false;
            }
            assert_int_equal(gr_table_delete(t, batch, n, &d), GR_OK);
            assert_int_equal(d, expect);
            rows -= expect;
        } else {
            assert_int_equal(gr_table_insert(t, batch, n, w, NULL, NULL), GR_OK);
            for (size_t i = 0; i < n; i++) {
                uint64_t k = batch[i] / 0x100000001b3ull;
                if (!present[k]) rows++;
                present[k] = true;
            }
        }
        if (round % 64 == 63 || round == rounds - 1) {
            gr_table_stats st;
            gr_table_get_stats(t, &st);
            assert_int_equal(st.rows, rows);
            for (size_t base = 0; base < nkeys; base += 256) {
                size_t m = nkeys - base < 256 ? nkeys - base : 256;
                for (size_t i = 0; i < m; i++) batch[i] = (base + i) * 0x100000001b3ull;
                assert_int_equal(gr_table_get(t, batch, m, w, NULL, NULL, found), GR_OK);
                for (size_t i = 0; i < m; i++) {
                    assert_int_equal(found[i], present[base + i]);
                    if (found[i]) assert_true(w[2 * i] == (float)(base + i));
                }
            }
        }
    }
    free(present);
    gr_table_destroy(t);
}

static void test_shadow_one_partition(void **state)
{
    (void)state;
    run_shadow(1, 5000, 3000);
}

static void test_shadow_many_partitions(void **state)
{
    (void)state;
    run_shadow(64, 20000, 1500);
}

static void test_shadow_huge_partition_count(void **state)
{
    (void)state;
    run_shadow(65536, 3000, 300); /* more partitions than the counting sort handles */
}

static void test_growth_large(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "grow", 1);
    s.partitions = 1; /* every row in one partition: many rehashes and chunks */
    gr_table *t = make(&s);
    const size_t n = 300000;
    uint64_t *keys = malloc(n * 8);
    float *w = malloc(n * 4), *o = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        keys[i] = i;
        w[i] = (float)i;
    }
    for (size_t off = 0; off < n; off += 10000)
        assert_int_equal(gr_table_insert(t, keys + off, 10000, w + off, NULL, NULL), GR_OK);
    assert_int_equal(gr_table_lookup(t, keys, n, o, 0), GR_OK);
    for (size_t i = 0; i < n; i++) assert_true(o[i] == (float)i);
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    assert_true(st.rows == n && st.hits == n && st.misses == 0);
    /* Index load stays <= 0.8: index bytes + header + slack per row stay small. */
    assert_true(st.bytes_per_row - st.payload_bytes < 40); /* 20 of it is header + padding */
    free(keys);
    free(w);
    free(o);
    gr_table_destroy(t);
}

typedef struct scan_acc {
    uint64_t n, key_sum;
    double w_sum;
    uint64_t stop_after;
    uint32_t dim, sf;
    float state0_sum;
} scan_acc;

static int scan_cb(void *ctx, uint64_t key, const float *w, const float *st,
                   const gr_row_meta *meta)
{
    scan_acc *a = ctx;
    (void)meta;
    a->n++;
    a->key_sum += key;
    for (uint32_t i = 0; i < a->dim; i++) a->w_sum += w[i];
    if (a->sf) a->state0_sum += st[0];
    if (a->stop_after && a->n >= a->stop_after) return 42;
    return 0;
}

static void test_scan(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "scan", 3);
    s.opt.kind = GR_OPT_ROWWISE_ADAGRAD;
    s.opt.initial_accumulator = 0.5f;
    s.partitions = 16;
    gr_table *t = make(&s);
    const size_t n = 5000;
    uint64_t *keys = malloc(n * 8);
    float *w = malloc(n * 3 * 4);
    uint64_t ksum = 0;
    double wsum = 0;
    for (size_t i = 0; i < n; i++) {
        keys[i] = i * 7919 + 1;
        ksum += keys[i];
        for (int j = 0; j < 3; j++) {
            w[i * 3 + j] = (float)(i % 10) + (float)j;
            wsum += w[i * 3 + j];
        }
    }
    assert_int_equal(gr_table_insert(t, keys, n, w, NULL, NULL), GR_OK);
    size_t d;
    assert_int_equal(gr_table_delete(t, keys, 10, &d), GR_OK); /* holes in the slot range */
    assert_int_equal(d, 10);
    for (size_t i = 0; i < 10; i++) {
        ksum -= keys[i];
        for (int j = 0; j < 3; j++) wsum -= w[i * 3 + j];
    }
    scan_acc a = {.dim = 3, .sf = 1};
    assert_int_equal(gr_table_scan(t, scan_cb, &a), 0);
    assert_int_equal(a.n, n - 10);
    assert_true(a.key_sum == ksum);
    assert_true(fabs(a.w_sum - wsum) < 1e-6 * wsum);
    assert_true(a.state0_sum == 0.5f * (float)(n - 10));
    scan_acc b = {.dim = 3, .sf = 1, .stop_after = 100};
    assert_int_equal(gr_table_scan(t, scan_cb, &b), 42);
    assert_int_equal(b.n, 100);
    assert_int_equal(gr_table_scan(t, NULL, NULL), GR_EINVAL);
    free(keys);
    free(w);
    gr_table_destroy(t);
}

static void test_dirty_tracking(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "dirty", 2);
    s.partitions = 4;
    gr_table *t = make(&s);
    uint64_t keys[100];
    float g[200], out[200];
    for (int i = 0; i < 100; i++) keys[i] = (uint64_t)i + 1000;
    for (int i = 0; i < 200; i++) g[i] = 1.0f;
    /* Rows created by a lookup are not dirty: the initializer can recreate them. */
    assert_int_equal(gr_table_lookup(t, keys, 100, out, 0), GR_OK);
    for (unsigned k = 0; k < GR_TABLE_TRACKERS; k++) assert_int_equal(gr_table_dirty_count(t, k), 0);
    assert_int_equal(gr_table_apply(t, keys, 40, g), GR_OK);
    for (unsigned k = 0; k < GR_TABLE_TRACKERS; k++) assert_int_equal(gr_table_dirty_count(t, k), 40);
    scan_acc a = {.dim = 2};
    assert_int_equal(gr_table_scan_dirty(t, 0, scan_cb, &a), 0);
    assert_int_equal(a.n, 40);
    uint64_t ks = 0;
    for (int i = 0; i < 40; i++) ks += keys[i];
    assert_true(a.key_sum == ks);
    assert_int_equal(gr_table_dirty_count(t, 0), 0);
    assert_int_equal(gr_table_dirty_count(t, 1), 40);
    memset(&a, 0, sizeof a);
    a.dim = 2;
    assert_int_equal(gr_table_scan_dirty(t, 0, scan_cb, &a), 0);
    assert_int_equal(a.n, 0);
    /* Apply again to some, insert a new one, delete a dirty one. */
    assert_int_equal(gr_table_apply(t, keys + 30, 20, g), GR_OK);
    uint64_t nk = 5;
    assert_int_equal(gr_table_insert(t, &nk, 1, g, NULL, NULL), GR_OK);
    assert_int_equal(gr_table_delete(t, keys + 30, 1, NULL), GR_OK);
    assert_int_equal(gr_table_dirty_count(t, 0), 20);
    assert_int_equal(gr_table_dirty_count(t, 1), 40 + 10 + 1 - 1);
    /* A callback that stops leaves the refused row marked. */
    scan_acc c = {.dim = 2, .stop_after = 5};
    assert_int_equal(gr_table_scan_dirty(t, 0, scan_cb, &c), 42);
    assert_int_equal(gr_table_dirty_count(t, 0), 16);
    memset(&a, 0, sizeof a);
    a.dim = 2;
    assert_int_equal(gr_table_scan_dirty(t, 0, scan_cb, &a), 0);
    assert_int_equal(a.n, 16);
    /* Bad tracker. */
    assert_int_equal(gr_table_scan_dirty(t, GR_TABLE_TRACKERS, scan_cb, &a), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "tracker 4"));
    assert_int_equal(gr_table_dirty_count(t, 9), 0);
    gr_table_destroy(t);
}

static void test_ttl(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "ttl", 2);
    s.ttl_s = 100;
    s.partitions = 8;
    gr_table *t = make(&s);
    gr_table_set_clock(t, 1000);
    assert_int_equal(gr_table_clock(t), 1000);
    const size_t n = 3000;
    uint64_t *keys = malloc(n * 8);
    float *g = calloc(n * 2, 4);
    for (size_t i = 0; i < n; i++) keys[i] = i + 1;
    assert_int_equal(gr_table_lookup(t, keys, n, g, 0), GR_OK); /* last_update = 1000 */
    gr_table_set_clock(t, 1050);
    assert_int_equal(gr_table_apply(t, keys, 1000, g), GR_OK); /* first 1000 updated at 1050 */
    uint64_t ev = 99;
    gr_table_set_clock(t, 1100); /* 1100 - 1000 = 100: not more than ttl yet */
    assert_int_equal(gr_table_evict_expired(t, &ev), GR_OK);
    assert_int_equal(ev, 0);
    gr_table_set_clock(t, 1101);
    assert_int_equal(gr_table_evict_expired(t, &ev), GR_OK);
    assert_int_equal(ev, n - 1000);
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    assert_int_equal(st.rows, 1000);
    assert_int_equal(st.expirations, n - 1000);
    bool *found = malloc(n);
    assert_int_equal(gr_table_get(t, keys, n, NULL, NULL, NULL, found), GR_OK);
    for (size_t i = 0; i < n; i++) assert_int_equal(found[i], i < 1000);
    gr_table_set_clock(t, 5000);
    assert_int_equal(gr_table_evict_expired(t, &ev), GR_OK);
    assert_int_equal(ev, 1000);
    gr_table_set_clock(t, 0); /* unpinned: seconds since creation */
    assert_true(gr_table_clock(t) < 100);
    free(found);
    free(keys);
    free(g);
    gr_table_destroy(t);
    /* ttl 0: no-op. */
    gr_table_spec_default(&s, "nottl", 2);
    t = make(&s);
    assert_int_equal(gr_table_evict_expired(t, &ev), GR_OK);
    assert_int_equal(ev, 0);
    gr_table_destroy(t);
}

/* A TTL pass holds a partition lock for bounded slices: one partition of 20000 expired rows
 * takes many holds of at most 1024 slots each (and at most ~200 us each), so lookups racing
 * with it never wait for the whole pass. */
static void test_ttl_bounded_slices(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "ttlslice", 4);
    s.ttl_s = 10;
    s.partitions = 1;
    gr_table *t = make(&s);
    gr_table_set_clock(t, 5);
    const size_t n = 20000;
    uint64_t *keys = malloc(n * 8);
    float *w = calloc(n * 4, 4);
    for (size_t i = 0; i < n; i++) keys[i] = i * 7 + 3;
    assert_int_equal(gr_table_insert(t, keys, n, w, NULL, NULL), GR_OK);
    gr_table_set_clock(t, 100);
    uint64_t ev = 0;
    assert_int_equal(gr_table_evict_expired(t, &ev), GR_OK);
    assert_int_equal(ev, n);
    uint64_t holds = atomic_load(&t->expire_holds);
    unsigned max_slice = atomic_load(&t->expire_max_slice);
    assert_true(holds >= n / 1024);
    assert_true(max_slice >= 1 && max_slice <= 1024);
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    assert_int_equal(st.rows, 0);
    free(keys);
    free(w);
    gr_table_destroy(t);
}

static void test_capacity_lru_exact(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "cap", 1);
    s.capacity = 4;
    s.partitions = 1;
    gr_table *t = make(&s);
    float w[1] = {0}, o[4];
    /* Rows 1..4 at times 10, 20, 30, 30; row 4 gets an extra hit. */
    uint32_t times[4] = {10, 20, 30, 30};
    for (uint64_t k = 1; k <= 4; k++) {
        gr_table_set_clock(t, times[k - 1]);
        assert_int_equal(gr_table_lookup(t, &k, 1, o, 0), GR_OK);
    }
    uint64_t k4 = 4;
    assert_int_equal(gr_table_lookup(t, &k4, 1, o, 0), GR_OK);
    gr_table_set_clock(t, 40);
    uint64_t k5 = 5, k6 = 6, k7 = 7;
    assert_int_equal(gr_table_insert(t, &k5, 1, w, NULL, NULL), GR_OK); /* evicts 1 (oldest) */
    assert_int_equal(gr_table_insert(t, &k6, 1, w, NULL, NULL), GR_OK); /* evicts 2 */
    assert_int_equal(gr_table_insert(t, &k7, 1, w, NULL, NULL), GR_OK); /* 3: fewer hits than 4 */
    uint64_t all[7] = {1, 2, 3, 4, 5, 6, 7};
    bool found[7];
    assert_int_equal(gr_table_get(t, all, 7, NULL, NULL, NULL, found), GR_OK);
    bool want[7] = {false, false, false, true, true, true, true};
    assert_memory_equal(found, want, sizeof want);
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    assert_int_equal(st.rows, 4);
    assert_int_equal(st.evictions, 3);
    gr_table_destroy(t);
}

static void test_capacity_sampled(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "caps", 4);
    s.capacity = 2000;
    s.partitions = 16; /* 125 rows per partition */
    gr_table *t = make(&s);
    const size_t n = 2000;
    uint64_t *keys = malloc(n * 8);
    float *o = malloc(n * 4 * 4);
    for (size_t i = 0; i < n; i++) keys[i] = i;
    gr_table_set_clock(t, 1);
    assert_int_equal(gr_table_lookup(t, keys, n, o, 0), GR_OK);
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    assert_true(st.rows <= 2000 && st.rows > 1900); /* hashing spreads keys unevenly */
    /* Keep 200 rows warm, then stream 1000 new keys through. */
    gr_table_set_clock(t, 50);
    assert_int_equal(gr_table_apply(t, keys, 200, o), GR_OK);
    for (size_t i = 0; i < 1000; i++) keys[i + 200] = 1000000 + i;
    gr_table_set_clock(t, 60);
    assert_int_equal(gr_table_lookup(t, keys + 200, 1000, o, 0), GR_OK);
    gr_table_get_stats(t, &st);
    assert_true(st.rows <= 2000);
    assert_true(st.evictions >= 1000 - (2000 - 1900));
    bool *found = malloc(n);
    assert_int_equal(gr_table_get(t, keys, 200, NULL, NULL, NULL, found), GR_OK);
    int warm = 0;
    for (int i = 0; i < 200; i++) warm += found[i];
    assert_true(warm >= 190); /* sampled LRU keeps nearly all recently updated rows */
    free(found);
    free(keys);
    free(o);
    gr_table_destroy(t);
    /* A capacity below the partition count still gives every key a chance. */
    gr_table_spec_default(&s, "tiny", 1);
    s.capacity = 3;
    t = make(&s);
    float w = 1;
    for (uint64_t k = 0; k < 10; k++) assert_int_equal(gr_table_insert(t, &k, 1, &w, NULL, NULL), GR_OK);
    gr_table_get_stats(t, &st);
    assert_true(st.rows >= 1 && st.rows <= 3);
    gr_table_destroy(t);
}

static void test_admission_min_count(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "admit", 2);
    s.admit_min_count = 3;
    s.init.kind = GR_INIT_CONSTANT;
    s.init.value = 2.0f;
    gr_table *t = make(&s);
    uint64_t k = 77;
    float o[2], g[2] = {1, 1};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(gr_table_lookup(t, &k, 1, o, 0), GR_OK);
        assert_true(o[0] == 0.0f && o[1] == 0.0f); /* default row, no storage */
        assert_int_equal(gr_table_apply(t, &k, 1, g), GR_OK); /* dropped */
    }
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    assert_int_equal(st.rows, 0);
    assert_int_equal(st.rejects, 4);
    assert_int_equal(st.applies, 0);
    assert_int_equal(gr_table_lookup(t, &k, 1, o, 0), GR_OK); /* third sighting */
    assert_true(o[0] == 2.0f);
    assert_int_equal(gr_table_apply(t, &k, 1, g), GR_OK);
    gr_table_get_stats(t, &st);
    assert_int_equal(st.rows, 1);
    assert_int_equal(st.admits, 1);
    assert_int_equal(st.applies, 1);
    /* Read-only lookups do not count towards admission. */
    uint64_t k2 = 78;
    for (int i = 0; i < 5; i++) assert_int_equal(gr_table_lookup(t, &k2, 1, o, GR_LOOKUP_READONLY), GR_OK);
    assert_int_equal(gr_table_lookup(t, &k2, 1, o, 0), GR_OK);
    assert_true(o[0] == 0.0f);
    /* Repeats inside one batch count. */
    uint64_t rep[3] = {79, 79, 79};
    float o3[6];
    assert_int_equal(gr_table_lookup(t, rep, 3, o3, 0), GR_OK);
    assert_true(o3[0] == 0.0f && o3[2] == 0.0f && o3[4] == 2.0f);
    /* Insert bypasses admission. */
    uint64_t k3 = 80;
    assert_int_equal(gr_table_insert(t, &k3, 1, g, NULL, NULL), GR_OK);
    gr_table_get_stats(t, &st);
    assert_int_equal(st.rows, 3);
    gr_table_destroy(t);
}

static void test_admission_probability(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "prob", 1);
    s.admit_probability = 0.25f;
    s.seed = 99;
    gr_table *t1 = make(&s);
    s.partitions = 2;
    gr_table *t2 = make(&s);
    const size_t n = 20000;
    uint64_t *keys = malloc(n * 8);
    float *o = malloc(n * 4);
    bool *f1 = malloc(n), *f2 = malloc(n);
    for (size_t i = 0; i < n; i++) keys[i] = i * 31 + 5;
    assert_int_equal(gr_table_lookup(t1, keys, n, o, 0), GR_OK);
    assert_int_equal(gr_table_lookup(t2, keys, n, o, 0), GR_OK);
    assert_int_equal(gr_table_lookup(t2, keys, n, o, 0), GR_OK); /* a retry changes nothing */
    gr_table_get(t1, keys, n, NULL, NULL, NULL, f1);
    gr_table_get(t2, keys, n, NULL, NULL, NULL, f2);
    assert_memory_equal(f1, f2, n); /* deterministic per key */
    gr_table_stats st;
    gr_table_get_stats(t1, &st);
    assert_true(st.rows > n / 4 - 400 && st.rows < n / 4 + 400);
    assert_int_equal(st.admits + st.rejects, n);
    free(keys);
    free(o);
    free(f1);
    free(f2);
    gr_table_destroy(t1);
    gr_table_destroy(t2);
    gr_table_spec_default(&s, "never", 1);
    s.admit_probability = 0.0f;
    t1 = make(&s);
    uint64_t k = 1;
    float w;
    assert_int_equal(gr_table_lookup(t1, &k, 1, &w, 0), GR_OK);
    gr_table_get_stats(t1, &st);
    assert_int_equal(st.rows, 0);
    gr_table_destroy(t1);
}

static void test_mem_cap(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "capped", 16);
    s.opt.kind = GR_OPT_ADAGRAD;
    s.mem_limit = 256 * 1024;
    s.partitions = 4;
    gr_table *t = make(&s);
    const size_t n = 4096;
    uint64_t *keys = malloc(n * 8);
    float *o = malloc(n * 16 * 4);
    for (size_t i = 0; i < n; i++) keys[i] = i;
    int rc = gr_table_lookup(t, keys, n, o, 0);
    assert_int_equal(rc, GR_ENOMEM);
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    char want[200];
    snprintf(want, sizeof want,
             "table 'capped' reached its memory cap of 262144 bytes at %llu rows; raise mem_limit "
             "or set a capacity",
             (unsigned long long)st.rows);
    assert_string_equal(gr_errmsg(), want);
    assert_true(st.rows > 1000 && st.rows < n);
    assert_true(st.bytes - sizeof(gr_table) - 4 * sizeof(gr_part) <= s.mem_limit);
    /* The rows that exist are intact and readable; apply to them still works. */
    bool *found = malloc(n);
    assert_int_equal(gr_table_get(t, keys, n, o, NULL, NULL, found), GR_OK);
    size_t have = 0;
    for (size_t i = 0; i < n; i++) have += found[i];
    assert_int_equal(have, st.rows);
    for (size_t i = 0; i < 16; i++) o[i] = 0.5f;
    for (size_t i = 0; i < n; i++)
        if (found[i]) {
            assert_int_equal(gr_table_apply(t, &keys[i], 1, o), GR_OK);
            break;
        }
    /* Apply to missing keys reports the cap too. */
    uint64_t nk = 1u << 30;
    assert_int_equal(gr_table_apply(t, &nk, 1, o), GR_ENOMEM);
    /* Deleting rows makes room again: a partition reuses its freed slots. */
    assert_int_equal(gr_table_delete(t, keys, n, NULL), GR_OK);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (found[i]) keys[m++] = keys[i];
    assert_int_equal(gr_table_lookup(t, keys, m, o, 0), GR_OK);
    gr_table_get_stats(t, &st);
    assert_int_equal(st.rows, m);
    free(found);
    free(keys);
    free(o);
    gr_table_destroy(t);
}

static void test_stats_overhead(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "over", 64);
    s.opt.kind = GR_OPT_ADAGRAD;
    s.partitions = 4; /* few partitions: the last, partly filled chunk of each is small here */
    gr_table *t = make(&s);
    const size_t n = 200000;
    uint64_t *keys = malloc(n * 8);
    float *o = malloc(n * 64 * 4);
    for (size_t i = 0; i < n; i++) keys[i] = i * 2654435761u;
    assert_int_equal(gr_table_lookup(t, keys, n, o, 0), GR_OK);
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    assert_int_equal(st.rows, n);
    assert_int_equal(st.payload_bytes, 512);
    assert_int_equal(st.row_bytes, 528);
    double over = st.bytes_per_row - (double)st.payload_bytes;
    assert_true(over > 16.0 && over <= 32.0);
    assert_true(st.bytes >= n * 528);
    free(keys);
    free(o);
    gr_table_destroy(t);
}

static void test_apply_errors(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "errs", 2);
    gr_table *t = make(&s);
    uint64_t keys[2] = {1, 2};
    float g[4] = {1, 2, INFINITY, 3}, o[4];
    assert_int_equal(gr_table_apply(t, keys, 2, g), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "key 2 (row 1, element 0) is not finite"));
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    assert_int_equal(st.rows, 0); /* nothing applied, nothing created */
    assert_int_equal(st.applies, 0);
    g[2] = NAN;
    assert_int_equal(gr_table_apply(t, keys, 2, g), GR_EINVAL);
    assert_int_equal(gr_table_apply(t, NULL, 2, g), GR_EINVAL);
    assert_int_equal(gr_table_apply(t, keys, 2, NULL), GR_EINVAL);
    assert_int_equal(gr_table_apply(t, NULL, 0, NULL), GR_OK);
    assert_int_equal(gr_table_insert(t, keys, 2, NULL, NULL, NULL), GR_EINVAL);
    assert_int_equal(gr_table_delete(t, NULL, 2, NULL), GR_EINVAL);
    assert_int_equal(gr_table_get(t, NULL, 2, o, NULL, NULL, NULL), GR_EINVAL);
    /* Duplicates in one apply: one step per occurrence. */
    uint64_t dup[3] = {9, 9, 9};
    float gd[6] = {1, 1, 1, 1, 1, 1};
    assert_int_equal(gr_table_apply(t, dup, 3, gd), GR_OK);
    assert_int_equal(gr_table_get(t, dup, 1, o, NULL, NULL, NULL), GR_OK);
    assert_true(o[0] == 0.0f - 0.01f - 0.01f - 0.01f);
    gr_table_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_destroy),
        cmocka_unit_test(test_lookup_creates_and_readonly),
        cmocka_unit_test(test_init_deterministic),
        cmocka_unit_test(test_half_conversion),
        cmocka_unit_test(test_f16_table),
        cmocka_unit_test(test_insert_get_roundtrip),
        cmocka_unit_test(test_shadow_one_partition),
        cmocka_unit_test(test_shadow_many_partitions),
        cmocka_unit_test(test_shadow_huge_partition_count),
        cmocka_unit_test(test_growth_large),
        cmocka_unit_test(test_scan),
        cmocka_unit_test(test_dirty_tracking),
        cmocka_unit_test(test_ttl),
        cmocka_unit_test(test_ttl_bounded_slices),
        cmocka_unit_test(test_capacity_lru_exact),
        cmocka_unit_test(test_capacity_sampled),
        cmocka_unit_test(test_admission_min_count),
        cmocka_unit_test(test_admission_probability),
        cmocka_unit_test(test_mem_cap),
        cmocka_unit_test(test_stats_overhead),
        cmocka_unit_test(test_apply_errors),
    };
    return cmocka_run_group_tests_name("table", tests, NULL, NULL);
}
