/* Unit tests for the bulk insert (src/table/bulk.c): a table filled by gr_table_insert_bulk,
 * with one group or with several threads each taking its own group, holds exactly what
 * gr_table_insert makes of the same rows (weights, state, metadata, dirty marks, row count),
 * including overwrites and repeated keys in order; f16 tables; hashes and checks done by the
 * caller; capacity tables (which take the
 * insert's path and evict); refusals that write nothing; argument errors; gr_table_reserve. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/table.h"
#include "table/table_internal.h"

#define DIM 8

static gr_table *make(const gr_table_spec *s)
{
    gr_table *t = NULL;
    if (gr_table_create(s, &t) != GR_OK) fail_msg("create: %s", gr_errmsg());
    return t;
}

/* gr_table_insert_bulk over columns, checking every row itself (no flags). */
static int bulk(gr_table *t, const uint64_t *keys, size_t n, const float *w, const float *st,
                const gr_row_meta *meta, uint32_t group, uint32_t groups)
{
    gr_table_rows r = {keys, n, w, st, meta, NULL};
    return gr_table_insert_bulk(t, &r, group, groups, 0);
}

static void spec_of(gr_table_spec *s, gr_dtype dtype)
{
    gr_table_spec_default(s, "bulk", DIM);
    s->dtype = dtype;
    s->opt.kind = GR_OPT_ADAGRAD;
    s->partitions = 64;
}

/* n rows of keys 1..n with recognisable values; every key is repeated `rep` times in a row
 * (the later copies differ), so order matters. */
typedef struct rows {
    size_t n;
    uint64_t *keys;
    float *w, *st;
    gr_row_meta *meta;
} rows;

static rows make_rows(size_t n, uint32_t sf, uint64_t seed, int rep)
{
    rows r = {n * rep, malloc(n * rep * 8), malloc(n * rep * DIM * 4), malloc(n * rep * sf * 4 + 4),
              malloc(n * rep * sizeof(gr_row_meta))};
    for (size_t i = 0; i < r.n; i++) {
        r.keys[i] = (i / rep) * 0x9e3779b97f4a7c15ull + seed;
        for (uint32_t d = 0; d < DIM; d++) r.w[i * DIM + d] = (float)(i % 977) * 0.25f + d + seed;
        for (uint32_t d = 0; d < sf; d++) r.st[i * sf + d] = (float)(i % 31) + 0.5f * d;
        r.meta[i] = (gr_row_meta){(uint32_t)(i % 1000), i == r.n - 1 ? UINT32_MAX : (uint32_t)i};
    }
    return r;
}

static void free_rows(rows *r)
{
    free(r->keys);
    free(r->w);
    free(r->st);
    free(r->meta);
}

/* Every key of r reads the same (bitwise) from a and b, and both hold the same rows. */
static void assert_same(gr_table *a, gr_table *b, const rows *r)
{
    uint32_t sf = gr_table_state_floats(gr_table_get_spec(a));
    float *wa = malloc(r->n * DIM * 4), *wb = malloc(r->n * DIM * 4);
    float *sa = malloc(r->n * sf * 4 + 4), *sb = malloc(r->n * sf * 4 + 4);
    gr_row_meta *ma = malloc(r->n * sizeof *ma), *mb = malloc(r->n * sizeof *mb);
    bool *fa = malloc(r->n), *fb = malloc(r->n);
    assert_int_equal(gr_table_get(a, r->keys, r->n, wa, sa, ma, fa), GR_OK);
    assert_int_equal(gr_table_get(b, r->keys, r->n, wb, sb, mb, fb), GR_OK);
    assert_memory_equal(wa, wb, r->n * DIM * 4);
    if (sf) assert_memory_equal(sa, sb, r->n * sf * 4);
    assert_memory_equal(ma, mb, r->n * sizeof *ma);
    assert_memory_equal(fa, fb, r->n);
    gr_table_stats x, y;
    gr_table_get_stats(a, &x);
    gr_table_get_stats(b, &y);
    assert_int_equal(x.rows, y.rows);
    for (unsigned k = 0; k < GR_TABLE_TRACKERS; k++)
        assert_int_equal(gr_table_dirty_count(a, k), gr_table_dirty_count(b, k));
    free(wa);
    free(wb);
    free(sa);
    free(sb);
    free(ma);
    free(mb);
    free(fa);
    free(fb);
}

static void test_bulk_equals_insert(void **state)
{
    (void)state;
    for (int f16 = 0; f16 < 2; f16++) {
        gr_table_spec s;
        spec_of(&s, f16 ? GR_DTYPE_F16 : GR_DTYPE_F32);
        gr_table *a = make(&s), *b = make(&s);
        gr_table_set_clock(a, 77);
        gr_table_set_clock(b, 77);
        uint32_t sf = gr_table_state_floats(&s);
        /* First a batch, then an overlapping one with repeated keys that overwrites. */
        rows r1 = make_rows(20000, sf, 1, 1), r2 = make_rows(5000, sf, 1, 3);
        assert_int_equal(gr_table_insert(a, r1.keys, r1.n, r1.w, r1.st, r1.meta), GR_OK);
        assert_int_equal(bulk(b, r1.keys, r1.n, r1.w, r1.st, r1.meta, 0, 1), GR_OK);
        assert_int_equal(gr_table_insert(a, r2.keys, r2.n, r2.w, NULL, NULL), GR_OK);
        assert_int_equal(bulk(b, r2.keys, r2.n, r2.w, NULL, NULL, 0, 1), GR_OK);
        assert_same(a, b, &r1);
        gr_table_stats st;
        gr_table_get_stats(b, &st);
        assert_int_equal(st.rows, 20000);
        /* The last copy of a repeated key won, the clamp of hits held. */
        float w[DIM];
        gr_row_meta m;
        bool found;
        assert_int_equal(gr_table_get(b, &r2.keys[4], 1, w, NULL, &m, &found), GR_OK);
        assert_true(found);
        assert_int_equal(m.last_update, 77);
        assert_int_equal(m.hits, 0);
        if (!f16) assert_memory_equal(w, &r2.w[5 * DIM], sizeof w);
        assert_int_equal(gr_table_get(b, &r1.keys[r1.n - 1], 1, w, NULL, &m, &found), GR_OK);
        assert_int_equal(m.hits, GR_HITS_MAX);
        free_rows(&r1);
        free_rows(&r2);
        gr_table_destroy(a);
        gr_table_destroy(b);
    }
}

typedef struct filler {
    gr_table *t;
    const rows *r;
    uint32_t group, groups;
    int rc;
} filler;

static void *fill_main(void *arg)
{
    filler *f = arg;
    /* Section by section, as the restore does, so each group sees every batch in order. */
    for (size_t at = 0; at < f->r->n && !f->rc; at += 3000) {
        size_t n = f->r->n - at < 3000 ? f->r->n - at : 3000;
        uint32_t sf = gr_table_state_floats(gr_table_get_spec(f->t));
        f->rc = bulk(f->t, f->r->keys + at, n, f->r->w + at * DIM,
                                     f->r->st + at * sf, f->r->meta + at, f->group, f->groups);
    }
    return NULL;
}

static void test_bulk_groups_in_threads(void **state)
{
    (void)state;
    gr_table_spec s;
    spec_of(&s, GR_DTYPE_F32);
    uint32_t sf = gr_table_state_floats(&s);
    rows r = make_rows(30000, sf, 5, 2);
    gr_table *ref = make(&s);
    gr_table_set_clock(ref, 9);
    assert_int_equal(gr_table_insert(ref, r.keys, r.n, r.w, r.st, r.meta), GR_OK);
    for (uint32_t groups = 1; groups <= 5; groups += 2) {
        gr_table *t = make(&s);
        gr_table_set_clock(t, 9);
        filler f[5];
        pthread_t th[5];
        for (uint32_t g = 0; g < groups; g++) {
            f[g] = (filler){t, &r, g, groups, 0};
            assert_int_equal(pthread_create(&th[g], NULL, fill_main, &f[g]), 0);
        }
        for (uint32_t g = 0; g < groups; g++) {
            pthread_join(th[g], NULL);
            assert_int_equal(f[g].rc, GR_OK);
        }
        assert_same(ref, t, &r);
        gr_table_destroy(t);
    }
    /* One group alone writes only its partitions. */
    gr_table *t = make(&s);
    assert_int_equal(bulk(t, r.keys, r.n, r.w, r.st, r.meta, 1, 4), GR_OK);
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    assert_true(st.rows > 6800 && st.rows < 8200); /* about a quarter of 30000 keys */
    for (size_t i = 0; i < r.n; i++) {
        bool found;
        float w[DIM];
        gr_table_get(t, &r.keys[i], 1, w, NULL, NULL, &found);
        assert_int_equal(found, gr_part_of(t, gr_table_hash(r.keys[i])) % 4 == 1);
    }
    gr_table_destroy(t);
    gr_table_destroy(ref);
    free_rows(&r);
}

/* Hashes given by the caller (gr_table_hash_keys) and rows it checked itself fill the table
 * as the plain call does. */
static void test_bulk_hashes_and_checked(void **state)
{
    (void)state;
    gr_table_spec s;
    spec_of(&s, GR_DTYPE_F32);
    uint32_t sf = gr_table_state_floats(&s);
    rows r = make_rows(20000, sf, 9, 2);
    gr_table *a = make(&s), *b = make(&s);
    gr_table_set_clock(a, 4);
    gr_table_set_clock(b, 4);
    uint64_t *h = malloc(r.n * sizeof *h);
    gr_table_hash_keys(b, r.keys, r.n, h);
    for (size_t i = 0; i < r.n; i++) assert_true(h[i] == gr_table_hash(r.keys[i]));
    assert_int_equal(gr_table_insert(a, r.keys, r.n, r.w, r.st, r.meta), GR_OK);
    gr_table_rows rr = {r.keys, r.n, r.w, r.st, r.meta, h};
    for (uint32_t g = 0; g < 3; g++)
        assert_int_equal(gr_table_insert_bulk(b, &rr, g, 3, GR_TABLE_BULK_CHECKED), GR_OK);
    assert_same(a, b, &r);
    free(h);
    gr_table_destroy(a);
    gr_table_destroy(b);
    free_rows(&r);
}

static void test_bulk_capacity_evicts(void **state)
{
    (void)state;
    gr_table_spec s;
    spec_of(&s, GR_DTYPE_F32);
    s.capacity = 1000;
    uint32_t sf = gr_table_state_floats(&s);
    rows r = make_rows(5000, sf, 3, 1);
    gr_table *a = make(&s), *b = make(&s);
    assert_int_equal(gr_table_insert(a, r.keys, r.n, r.w, r.st, r.meta), GR_OK);
    for (uint32_t g = 0; g < 2; g++)
        assert_int_equal(bulk(b, r.keys, r.n, r.w, r.st, r.meta, g, 2), GR_OK);
    gr_table_stats x, y;
    gr_table_get_stats(a, &x);
    gr_table_get_stats(b, &y);
    assert_true(y.rows <= 1000 && y.rows > 900);
    assert_int_equal(x.rows, y.rows);
    assert_int_equal(x.evictions, y.evictions);
    gr_table_destroy(a);
    gr_table_destroy(b);
    free_rows(&r);
}

static void test_bulk_refusals_write_nothing(void **state)
{
    (void)state;
    gr_table_spec s;
    spec_of(&s, GR_DTYPE_F32);
    uint32_t sf = gr_table_state_floats(&s);
    rows r = make_rows(1000, sf, 7, 1);
    gr_table *t = make(&s);
    r.w[500 * DIM + 2] = INFINITY;
    assert_int_equal(bulk(t, r.keys, r.n, r.w, r.st, r.meta, 0, 1), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "not finite"));
    r.w[500 * DIM + 2] = 1;
    r.st[10 * sf] = NAN;
    assert_int_equal(bulk(t, r.keys, r.n, r.w, r.st, r.meta, 0, 1), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "optimizer state"));
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    assert_int_equal(st.rows, 0);
    gr_table_destroy(t);

    /* f16 range: 70000 cannot be stored in half precision. */
    spec_of(&s, GR_DTYPE_F16);
    t = make(&s);
    r.st[10 * sf] = 0;
    r.w[7 * DIM] = 70000.0f;
    assert_int_equal(bulk(t, r.keys, r.n, r.w, r.st, r.meta, 0, 1), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "f16"));
    gr_table_get_stats(t, &st);
    assert_int_equal(st.rows, 0);

    /* Arguments. */
    assert_int_equal(bulk(NULL, r.keys, 1, r.w, NULL, NULL, 0, 1), GR_EINVAL);
    assert_int_equal(bulk(t, NULL, 1, r.w, NULL, NULL, 0, 1), GR_EINVAL);
    assert_int_equal(bulk(t, r.keys, 1, NULL, NULL, NULL, 0, 1), GR_EINVAL);
    assert_int_equal(bulk(t, r.keys, 1, r.w, NULL, NULL, 2, 2), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "group 2 of 2"));
    assert_int_equal(bulk(t, r.keys, 1, r.w, NULL, NULL, 0, 0), GR_EINVAL);
    assert_int_equal(bulk(t, r.keys, 0, r.w, NULL, NULL, 0, 1), GR_OK);
    assert_int_equal(gr_table_insert_bulk(t, NULL, 0, 1, 0), GR_EINVAL);
    gr_table_rows rr = {r.keys, 1, r.w, NULL, NULL, NULL};
    assert_int_equal(gr_table_insert_bulk(t, &rr, 0, 1, 2), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "unknown flags"));
    gr_table_destroy(t);
    free_rows(&r);
}

static void test_reserve(void **state)
{
    (void)state;
    gr_table_spec s;
    spec_of(&s, GR_DTYPE_F32);
    gr_table *t = make(&s);
    assert_int_equal(gr_table_reserve(t, 0), GR_OK);
    assert_int_equal(gr_table_reserve(t, 100000), GR_OK);
    /* Each partition's index holds its share with room to spare, before any row exists. */
    for (uint32_t p = 0; p < t->nparts; p++)
        assert_true((uint64_t)t->parts[p].cap * GR_IDX_LOAD_NUM >= 100000ull / t->nparts * GR_IDX_LOAD_DEN);
    uint32_t cap0 = t->parts[0].cap;
    uint32_t sf = gr_table_state_floats(&s);
    rows r = make_rows(50000, sf, 11, 1);
    assert_int_equal(bulk(t, r.keys, r.n, r.w, r.st, r.meta, 0, 1), GR_OK);
    assert_int_equal(t->parts[0].cap, cap0); /* no growth while filling */
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    assert_int_equal(st.rows, 50000);
    assert_int_equal(gr_table_reserve(NULL, 1), GR_EINVAL);
    gr_table_destroy(t);
    free_rows(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bulk_equals_insert),
        cmocka_unit_test(test_bulk_groups_in_threads),
        cmocka_unit_test(test_bulk_hashes_and_checked),
        cmocka_unit_test(test_bulk_capacity_evicts),
        cmocka_unit_test(test_bulk_refusals_write_nothing),
        cmocka_unit_test(test_reserve),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
