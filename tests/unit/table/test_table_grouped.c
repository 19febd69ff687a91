/* Tests for lookups grouped by partition (the path gr_table_lookup takes for batches of at
 * least 8 keys per partition, src/table/table.c): one large call must give exactly what the
 * same keys give through the caller-order path in small calls (outputs bitwise, rows created,
 * hit/miss/admit counts, per-row hits), with repeated keys, misses, read-only lookups and
 * count-based admission; and concurrent grouped lookups beside applies stay consistent (run
 * under TSan by CI). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "granary/table.h"

#define N 6000
#define SMALL 40 /* below 8 keys per partition at 16 partitions: the caller-order path */

static gr_table *make(uint32_t partitions, uint32_t admit_min_count)
{
    gr_table_spec s;
    gr_table_spec_default(&s, "g", 8);
    s.partitions = partitions;
    s.init.kind = GR_INIT_UNIFORM;
    s.init.low = -1;
    s.init.high = 1;
    s.opt.kind = GR_OPT_ADAGRAD;
    s.admit_min_count = admit_min_count;
    gr_table *t = NULL;
    if (gr_table_create(&s, &t) != GR_OK) fail_msg("create: %s", gr_errmsg());
    return t;
}

/* Keys with many repeats: 1500 distinct ids, skewed to the small ones. */
static void fill_keys(uint64_t *k, size_t n, uint64_t seed)
{
    uint64_t x = seed;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t r = (x >> 33) % 1500;
        k[i] = (r * r) / 1500 * 0x9e3779b97f4a7c15ull + 3;
    }
}

static void lookup_small(gr_table *t, const uint64_t *k, size_t n, float *out, unsigned flags)
{
    for (size_t i = 0; i < n; i += SMALL) {
        size_t m = n - i < SMALL ? n - i : SMALL;
        assert_int_equal(gr_table_lookup(t, k + i, m, out + i * 8, flags), GR_OK);
    }
}

static void expect_same_tables(gr_table *a, gr_table *b, const uint64_t *k, size_t n)
{
    gr_table_stats sa, sb;
    gr_table_get_stats(a, &sa);
    gr_table_get_stats(b, &sb);
    assert_int_equal(sa.rows, sb.rows);
    assert_int_equal(sa.hits, sb.hits);
    assert_int_equal(sa.misses, sb.misses);
    assert_int_equal(sa.admits, sb.admits);
    assert_int_equal(sa.rejects, sb.rejects);
    float *wa = malloc(n * 8 * sizeof(float)), *wb = malloc(n * 8 * sizeof(float));
    gr_row_meta *ma = malloc(n * sizeof *ma), *mb = malloc(n * sizeof *mb);
    bool *fa = malloc(n), *fb = malloc(n);
    assert_int_equal(gr_table_get(a, k, n, wa, NULL, ma, fa), GR_OK);
    assert_int_equal(gr_table_get(b, k, n, wb, NULL, mb, fb), GR_OK);
    assert_memory_equal(fa, fb, n);
    assert_memory_equal(wa, wb, n * 8 * sizeof(float));
    for (size_t i = 0; i < n; i++) assert_int_equal(ma[i].hits, mb[i].hits);
    free(wa);
    free(wb);
    free(ma);
    free(mb);
    free(fa);
    free(fb);
}

static void test_grouped_equals_caller_order(void **state)
{
    (void)state;
    static uint64_t k[N];
    static float oa[N * 8], ob[N * 8];
    fill_keys(k, N, 1);
    gr_table *a = make(16, 0), *b = make(16, 0);
    /* Read-only first: nothing is created, zeros come back, misses are counted. */
    assert_int_equal(gr_table_lookup(a, k, N, oa, GR_LOOKUP_READONLY), GR_OK);
    lookup_small(b, k, N, ob, GR_LOOKUP_READONLY);
    for (size_t i = 0; i < N * 8; i++) assert_true(oa[i] == 0.0f);
    expect_same_tables(a, b, k, N);
    /* Creating lookups, then lookups that hit. */
    for (int round = 0; round < 2; round++) {
        assert_int_equal(gr_table_lookup(a, k, N, oa, 0), GR_OK);
        lookup_small(b, k, N, ob, 0);
        assert_memory_equal(oa, ob, sizeof oa);
        expect_same_tables(a, b, k, N);
    }
    gr_table_destroy(a);
    gr_table_destroy(b);
}

static void test_grouped_one_partition_and_admission(void **state)
{
    (void)state;
    static uint64_t k[N];
    static float oa[N * 8], ob[N * 8];
    fill_keys(k, N, 7);
    /* One partition (pbits 0) and count-based admission: a key gets its row at its third
     * sighting, in batch order, on both paths. */
    gr_table *a = make(1, 3), *b = make(1, 3);
    assert_int_equal(gr_table_lookup(a, k, N, oa, 0), GR_OK);
    for (size_t i = 0; i < N; i += 4) /* 4 keys per call: below 8 per partition */
        assert_int_equal(gr_table_lookup(b, k + i, N - i < 4 ? N - i : 4, ob + i * 8, 0), GR_OK);
    assert_memory_equal(oa, ob, sizeof oa);
    expect_same_tables(a, b, k, N);
    gr_table_stats st;
    gr_table_get_stats(a, &st);
    assert_true(st.rejects > 0 && st.admits > 0);
    gr_table_destroy(a);
    gr_table_destroy(b);
}

/* A batch larger than one grouped piece (2^18 keys) is grouped piece by piece, in order. */
static void test_grouped_in_pieces(void **state)
{
    (void)state;
    const size_t n = 300000;
    uint64_t *k = malloc(n * sizeof *k);
    float *oa = malloc(n * 8 * sizeof(float)), *ob = malloc(n * 8 * sizeof(float));
    fill_keys(k, n, 11);
    gr_table *a = make(16, 3), *b = make(16, 3);
    assert_int_equal(gr_table_lookup(a, k, n, oa, 0), GR_OK);
    lookup_small(b, k, n, ob, 0);
    assert_memory_equal(oa, ob, n * 8 * sizeof(float));
    expect_same_tables(a, b, k, 2000);
    gr_table_destroy(a);
    gr_table_destroy(b);
    free(k);
    free(oa);
    free(ob);
}

typedef struct reader_arg {
    gr_table *t;
    uint64_t seed;
    int rc;
} reader_arg;

static void *reader(void *p)
{
    reader_arg *r = p;
    uint64_t *k = malloc(N * sizeof *k);
    float *out = malloc(N * 8 * sizeof(float));
    for (int it = 0; it < 20 && !r->rc; it++) {
        fill_keys(k, N, r->seed + (uint64_t)it);
        r->rc = gr_table_lookup(r->t, k, N, out, it % 2 ? GR_LOOKUP_READONLY : 0);
    }
    free(k);
    free(out);
    return NULL;
}

static void *writer(void *p)
{
    reader_arg *r = p;
    uint64_t k[64];
    float g[64 * 8];
    for (int i = 0; i < 64 * 8; i++) g[i] = 0.01f;
    for (int it = 0; it < 200 && !r->rc; it++) {
        fill_keys(k, 64, r->seed + (uint64_t)it);
        r->rc = gr_table_apply(r->t, k, 64, g);
    }
    return NULL;
}

static void test_grouped_concurrent(void **state)
{
    (void)state;
    gr_table *t = make(16, 0);
    reader_arg ra[3] = {{t, 100, 0}, {t, 200, 0}, {t, 300, 0}};
    pthread_t th[3];
    pthread_create(&th[0], NULL, reader, &ra[0]);
    pthread_create(&th[1], NULL, reader, &ra[1]);
    pthread_create(&th[2], NULL, writer, &ra[2]);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 3; i++) assert_int_equal(ra[i].rc, GR_OK);
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    /* Every looked-up key was counted once, as a hit or a miss. */
    assert_int_equal(st.hits + st.misses, 2ull * 20 * N);
    assert_int_equal(st.applies, 200ull * 64);
    gr_table_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grouped_equals_caller_order),
        cmocka_unit_test(test_grouped_one_partition_and_admission),
        cmocka_unit_test(test_grouped_in_pieces),
        cmocka_unit_test(test_grouped_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
