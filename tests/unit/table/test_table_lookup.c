/* The lookup pipeline (src/table/lookup.c) has a copy per common f32 dim (fixed row copies
 * and prefetches), a generic one for other dims and f16, a prologue and an epilogue around
 * its steady loop, and three ways to serve a row (lock-free for hot rows, a lock-free read
 * counted under the lock for cold rows, the locked path for the rest). Every one of them must
 * return exactly what gr_table_get returns, for every batch length. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "granary/table.h"
#include "table/table_internal.h"

#define NROWS 300

static uint64_t key_of(uint32_t i) { return 0x9e3779b97f4a7c15ull * (i + 1); }

/* Hit counts the rows start with: cold (exact, counted under the lock), at the edge, hot. */
static uint32_t hits0_of(uint32_t i)
{
    static const uint32_t h[] = {0, 1, 62, 63, 64, 65, 1000};
    return h[i % 7];
}

static gr_table *make_table(uint32_t dim, gr_dtype dt, float *w)
{
    gr_table_spec s;
    gr_table_spec_default(&s, "lk", dim);
    s.dtype = dt;
    s.partitions = 8;
    gr_table *t = NULL;
    assert_int_equal(gr_table_create(&s, &t), GR_OK);
    uint64_t keys[NROWS];
    gr_row_meta meta[NROWS];
    for (uint32_t i = 0; i < NROWS; i++) {
        keys[i] = key_of(i);
        meta[i] = (gr_row_meta){.last_update = 1, .hits = hits0_of(i)};
        /* Distinct values in every element (f16-exact: small integers over 64). */
        for (uint32_t j = 0; j < dim; j++)
            w[(size_t)i * dim + j] = (float)((i * 31 + j * 7) % 2000) / 64.0f - 15.0f;
    }
    assert_int_equal(gr_table_insert(t, keys, NROWS, w, NULL, meta), GR_OK);
    return t;
}

/* Every specialised dim, dims beside them, and f16; batches shorter than one pipeline
 * distance, between one and two, and longer; repeated keys and missing keys. */
static void test_lookup_matches_get(void **state)
{
    (void)state;
    static const uint32_t dims[] = {1, 4, 15, 16, 17, 32, 33, 64, 65, 100, 128, 129, 1024};
    static const size_t lens[] = {1, 5, 6, 7, 12, 13, 40, 3 * NROWS};
    for (unsigned di = 0; di < sizeof dims / sizeof *dims; di++) {
        for (int dt = 0; dt < 2; dt++) {
            const uint32_t dim = dims[di];
            float *w = malloc((size_t)NROWS * dim * sizeof *w);
            float *out = malloc((size_t)3 * NROWS * dim * sizeof *out);
            float *want = malloc((size_t)3 * NROWS * dim * sizeof *want);
            uint64_t *keys = malloc(3 * NROWS * sizeof *keys);
            bool *found = malloc(3 * NROWS * sizeof *found);
            gr_table *t = make_table(dim, (gr_dtype)dt, w);
            for (unsigned li = 0; li < sizeof lens / sizeof *lens; li++) {
                const size_t n = lens[li];
                /* Keys in a scrambled order, each row several times, one key in 11 missing. */
                for (size_t k = 0; k < n; k++) {
                    uint32_t i = (uint32_t)((k * 7919 + li) % NROWS);
                    keys[k] = k % 11 == 5 ? 0xdead0000ull + k : key_of(i);
                }
                assert_int_equal(gr_table_get(t, keys, n, want, NULL, NULL, found), GR_OK);
                memset(out, 0xa5, n * dim * sizeof *out);
                assert_int_equal(gr_table_lookup(t, keys, n, out, GR_LOOKUP_READONLY), GR_OK);
                for (size_t k = 0; k < n; k++) {
                    if (!found[k])
                        for (uint32_t j = 0; j < dim; j++) assert_true(want[k * dim + j] == 0.0f);
                    if (memcmp(out + k * dim, want + k * dim, dim * sizeof *out) != 0)
                        fail_msg("dim %u dtype %d batch %zu: row %zu differs from get", dim, dt,
                                 n, k);
                }
            }
            gr_table_destroy(t);
            free(w);
            free(out);
            free(want);
            free(keys);
            free(found);
        }
    }
}

/* Cold rows count every lookup exactly (the lock-free read, then the count under the lock);
 * hot rows go lock-free and are counted in the stats exactly, in the row approximately. */
static void test_lookup_counts(void **state)
{
    (void)state;
    const uint32_t dim = 64;
    float *w = malloc((size_t)NROWS * dim * sizeof *w);
    float *out = malloc((size_t)4 * NROWS * dim * sizeof *out);
    gr_table *t = make_table(dim, GR_DTYPE_F32, w);
    uint64_t keys[4 * NROWS];
    for (size_t k = 0; k < 4 * NROWS; k++) keys[k] = key_of((uint32_t)(k % NROWS));
    gr_table_stats st0, st1;
    gr_table_get_stats(t, &st0);
    uint64_t fast0 = atomic_load(&t->lookup_hits);
    assert_int_equal(gr_table_lookup(t, keys, 4 * NROWS, out, 0), GR_OK);
    gr_table_get_stats(t, &st1);
    assert_int_equal(st1.hits - st0.hits, 4 * NROWS);
    assert_int_equal(st1.misses, st0.misses);
    uint64_t hot = 0;
    for (uint32_t i = 0; i < NROWS; i++) {
        gr_row_meta m;
        bool found = false;
        uint64_t key = key_of(i);
        float row[64];
        assert_int_equal(gr_table_get(t, &key, 1, row, NULL, &m, &found), GR_OK);
        assert_true(found);
        assert_memory_equal(row, w + (size_t)i * dim, sizeof row);
        assert_memory_equal(out + (size_t)i * dim, row, sizeof row);
        const uint32_t h0 = hits0_of(i);
        if (h0 + 4 <= GR_HITS_EXACT) assert_int_equal(m.hits, h0 + 4); /* exact */
        else assert_true(m.hits >= h0);
        if (h0 >= GR_HITS_EXACT) hot += 4;
    }
    /* Rows at 60..63 hits turn hot within the batch; all others are as they started. */
    assert_true(atomic_load(&t->lookup_hits) - fast0 >= hot);
    gr_table_destroy(t);
    free(w);
    free(out);
}

/* The written-out hash the lookup vectorises is XXH3's (partitions, and so checkpoint order,
 * come from it): equal on edge keys and a million others. */
static void test_hash_inline_is_xxh3(void **state)
{
    (void)state;
    static const uint64_t edge[] = {0, 1, 0xffffffffull, 0x100000000ull, UINT64_MAX,
                                    0x8000000000000000ull, 42};
    for (unsigned i = 0; i < sizeof edge / sizeof *edge; i++)
        assert_true(gr_table_hash_inline(edge[i]) == gr_table_hash(edge[i]));
    uint64_t x = 0x243f6a8885a308d3ull;
    for (int i = 0; i < 1000000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        if (gr_table_hash_inline(x) != gr_table_hash(x))
            fail_msg("key %llu", (unsigned long long)x);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash_inline_is_xxh3),
        cmocka_unit_test(test_lookup_matches_get),
        cmocka_unit_test(test_lookup_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
