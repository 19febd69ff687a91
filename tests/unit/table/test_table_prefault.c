/* Unit tests for gr_table_prefault (src/table/prefault.c): a table prepared ahead and then
 * filled as a restore fills one (gr_table_reserve, then bulk inserts from several groups) is
 * bitwise the table an unprepared one becomes: the same partitions, index arrays, slots,
 * rows, live and dirty bits, counted bytes. Its memory is there before the fill (resident);
 * a fill past what was prepared carries on; only a new, empty table can be prepared.
 * gr_table_prefault_ahead: the row memory past a growing table's rows is resident after it,
 * asked again it does nothing, a table without rows is left alone, and rows created while it
 * runs on another thread give bitwise the table they give without it. gr_table_set_huge_rows:
 * which row memory is advised for huge pages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "granary/table.h"
#include "tests/support/vma_flags.h"
#include "table/table_internal.h"

#define DIM 16

static gr_table *make(const gr_table_spec *s)
{
    gr_table *t = NULL;
    if (gr_table_create(s, &t) != GR_OK) fail_msg("create: %s", gr_errmsg());
    return t;
}

static void spec_of(gr_table_spec *s, gr_dtype dtype)
{
    gr_table_spec_default(s, "warm", DIM);
    s->dtype = dtype;
    s->opt.kind = GR_OPT_ADAGRAD;
    s->partitions = 64;
}

typedef struct rows {
    size_t n;
    uint64_t *keys;
    float *w, *st;
    gr_row_meta *meta;
} rows;

static rows make_rows(size_t n, uint32_t sf, uint64_t seed)
{
    rows r = {n, malloc(n * 8), malloc(n * DIM * 4), malloc(n * sf * 4 + 4),
              malloc(n * sizeof(gr_row_meta))};
    for (size_t i = 0; i < n; i++) {
        r.keys[i] = i * 0x9e3779b97f4a7c15ull + seed;
        for (uint32_t d = 0; d < DIM; d++) r.w[i * DIM + d] = (float)(i % 977) * 0.25f - d;
        for (uint32_t d = 0; d < sf; d++) r.st[i * sf + d] = (float)(i % 31) + 0.5f * d;
        r.meta[i] = (gr_row_meta){(uint32_t)(i % 1000), (uint32_t)i};
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

/* A restore's fill: the index sized once, then the rows in batches by `groups` groups. */
static void fill(gr_table *t, const rows *r, uint64_t reserve, uint32_t groups)
{
    assert_int_equal(gr_table_reserve(t, reserve), GR_OK);
    const size_t B = 4096;
    for (size_t i = 0; i < r->n; i += B) {
        size_t n = r->n - i < B ? r->n - i : B;
        gr_table_rows b = {r->keys + i, n, r->w + i * DIM,
                           r->st + i * gr_table_state_floats(gr_table_get_spec(t)), r->meta + i,
                           NULL};
        for (uint32_t g = 0; g < groups; g++)
            assert_int_equal(gr_table_insert_bulk(t, &b, g, groups, 0), GR_OK);
    }
}

/* a and b hold the same bytes: every partition's index array, slots and counters, the rows
 * of every slot handed out, the live and dirty bits, the counted memory. */
static void assert_bitwise(gr_table *a, gr_table *b)
{
    assert_int_equal(a->nparts, b->nparts);
    assert_int_equal(a->carved, b->carved);
    assert_int_equal(atomic_load(&a->mem_used), atomic_load(&b->mem_used));
    assert_int_equal(atomic_load(&a->nrows), atomic_load(&b->nrows));
    for (uint32_t p = 0; p < a->nparts; p++) {
        const gr_part *x = &a->parts[p], *y = &b->parts[p];
        assert_int_equal(x->cap, y->cap);
        assert_int_equal(x->rows, y->rows);
        assert_int_equal(x->nchunks, y->nchunks);
        assert_int_equal(x->last_used, y->last_used);
        assert_int_equal(x->free_head, y->free_head);
        if (x->cap) assert_memory_equal(x->idx, y->idx, (size_t)x->cap * 8);
        if (x->nchunks) assert_memory_equal(x->chunk_ids, y->chunk_ids, x->nchunks * 4u);
        assert_memory_equal(x->dirty_n, y->dirty_n, sizeof x->dirty_n);
    }
    assert_memory_equal(a->rowmem, b->rowmem, (size_t)a->carved * a->stride);
    assert_memory_equal(a->live, b->live, a->carved / 8);
    assert_memory_equal(a->dirty, b->dirty, a->carved / 2);
    gr_table_stats x, y;
    gr_table_get_stats(a, &x);
    gr_table_get_stats(b, &y);
    assert_int_equal(x.rows, y.rows);
    assert_int_equal(x.bytes, y.bytes);
}

/* Pages of [p, p + len) that are resident. */
static size_t resident_pages(const void *p, size_t len)
{
    long psz = sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(psz - 1);
    size_t n = (len + ((uintptr_t)p - a) + (size_t)psz - 1) / (size_t)psz;
    unsigned char *v = malloc(n);
    assert_int_equal(mincore((void *)a, n * (size_t)psz, v), 0);
    size_t in = 0;
    for (size_t i = 0; i < n; i++) in += v[i] & 1;
    free(v);
    return in;
}

static void test_prefaulted_fill_is_bitwise_the_same(void **state)
{
    (void)state;
    for (int f16 = 0; f16 < 2; f16++)
        for (uint32_t groups = 1; groups <= 3; groups += 2) {
            gr_table_spec s;
            spec_of(&s, f16 ? GR_DTYPE_F16 : GR_DTYPE_F32);
            gr_table *a = make(&s), *b = make(&s);
            gr_table_set_clock(a, 5);
            gr_table_set_clock(b, 5);
            rows r = make_rows(60000, gr_table_state_floats(&s), 3 + groups);
            assert_int_equal(gr_table_prefault(b, r.n), GR_OK);
            /* Prepared for the rows: the arena and one index region, resident already. */
            uint64_t held = gr_table_prefault_bytes(b);
            assert_true(held >= (uint64_t)r.n * b->stride);
            assert_int_equal(b->nireg, 1);
            assert_int_equal(resident_pages(b->rowmem, (size_t)r.n * b->stride),
                             ((size_t)r.n * b->stride + 4095) / 4096);
            assert_int_equal(gr_table_prefault_bytes(a), 0);
            fill(a, &r, r.n, groups);
            fill(b, &r, r.n, groups);
            assert_bitwise(a, b);
            /* Every index array came from the prepared region. */
            assert_int_equal(b->nireg, 1);
            assert_int_equal(gr_table_prefault_bytes(b), held);
            free_rows(&r);
            gr_table_destroy(a);
            gr_table_destroy(b);
        }
}

static void test_fill_past_the_prepared_rows(void **state)
{
    (void)state;
    gr_table_spec s;
    spec_of(&s, GR_DTYPE_F32);
    gr_table *a = make(&s), *b = make(&s);
    rows r = make_rows(50000, gr_table_state_floats(&s), 9);
    /* Prepared for a tenth: the index outgrows its region, the rows the prepared arena. */
    assert_int_equal(gr_table_prefault(b, 5000), GR_OK);
    fill(a, &r, r.n, 2);
    fill(b, &r, r.n, 2);
    assert_bitwise(a, b);
    /* And keeps serving: lookups, applies and inserts as on the other table. */
    float g[DIM * 100], out_a[DIM * 100], out_b[DIM * 100];
    for (size_t i = 0; i < DIM * 100; i++) g[i] = 0.01f * (float)(i % 7);
    uint64_t more[100];
    for (int i = 0; i < 100; i++) more[i] = 0xabcdef00ull + (uint64_t)i;
    assert_int_equal(gr_table_apply(a, r.keys, 100, g), GR_OK);
    assert_int_equal(gr_table_apply(b, r.keys, 100, g), GR_OK);
    assert_int_equal(gr_table_lookup(a, more, 100, out_a, 0), GR_OK);
    assert_int_equal(gr_table_lookup(b, more, 100, out_b, 0), GR_OK);
    assert_memory_equal(out_a, out_b, sizeof out_a);
    assert_bitwise(a, b);
    free_rows(&r);
    gr_table_destroy(a);
    gr_table_destroy(b);
}

static void test_only_new_empty_tables(void **state)
{
    (void)state;
    gr_table_spec s;
    spec_of(&s, GR_DTYPE_F32);
    assert_int_equal(gr_table_prefault(NULL, 10), GR_EINVAL);
    assert_int_equal(gr_table_prefault_bytes(NULL), 0);
    gr_table *t = make(&s);
    assert_int_equal(gr_table_prefault(t, 0), GR_OK); /* nothing to prepare */
    assert_int_equal(gr_table_prefault_bytes(t), 0);
    assert_int_equal(gr_table_prefault(t, 1000), GR_OK);
    assert_true(gr_table_prefault_bytes(t) > 0);
    assert_int_equal(gr_table_prefault(t, 1000), GR_EINVAL); /* twice */
    assert_non_null(strstr(gr_errmsg(), "only a new, empty table"));
    gr_table_destroy(t);
    /* A table that holds rows, or has an index already. */
    t = make(&s);
    rows r = make_rows(10, gr_table_state_floats(&s), 1);
    assert_int_equal(gr_table_insert(t, r.keys, r.n, r.w, r.st, r.meta), GR_OK);
    assert_int_equal(gr_table_prefault(t, 1000), GR_EINVAL);
    gr_table_destroy(t);
    t = make(&s);
    assert_int_equal(gr_table_reserve(t, 1000), GR_OK);
    assert_int_equal(gr_table_prefault(t, 1000), GR_EINVAL);
    gr_table_destroy(t);
    free_rows(&r);
    /* A capacity table is prepared for its capacity at most. */
    s.capacity = 2000;
    t = make(&s);
    assert_int_equal(gr_table_prefault(t, 1000000), GR_OK);
    assert_true(gr_table_prefault_bytes(t) < 1000000ull * t->stride);
    gr_table_destroy(t);
}

static bool stop_after(void *arg)
{
    int *left = arg;
    return (*left)-- <= 0;
}

/* A preparation asked to stop returns within one 32 MiB piece, partly prepared and usable: a
 * fill gives the same rows as into a table never prepared. */
static void test_preparation_stops_when_asked(void **state)
{
    (void)state;
    gr_table_spec s;
    spec_of(&s, GR_DTYPE_F32);
    gr_table *full = make(&s), *cut = make(&s), *plain = make(&s);
    bool stopped = true;
    int never = 1 << 30, one = 1;
    assert_int_equal(gr_table_prefault_until(full, 2000000, stop_after, &never, &stopped), GR_OK);
    assert_false(stopped);
    assert_int_equal(gr_table_prefault_until(cut, 2000000, stop_after, &one, &stopped), GR_OK);
    assert_true(stopped);
    assert_true(gr_table_prefault_bytes(cut) > 0);
    assert_true(gr_table_prefault_bytes(cut) <= ((uint64_t)32 << 20));
    assert_true(gr_table_prefault_bytes(cut) < gr_table_prefault_bytes(full));
    rows r = make_rows(5000, gr_table_state_floats(&s), 7);
    assert_int_equal(gr_table_insert(cut, r.keys, r.n, r.w, r.st, r.meta), GR_OK);
    assert_int_equal(gr_table_insert(plain, r.keys, r.n, r.w, r.st, r.meta), GR_OK);
    uint32_t dim = s.dim;
    float *a = malloc(r.n * dim * sizeof *a), *b = malloc(r.n * dim * sizeof *b);
    assert_int_equal(gr_table_lookup(cut, r.keys, r.n, a, GR_LOOKUP_READONLY), GR_OK);
    assert_int_equal(gr_table_lookup(plain, r.keys, r.n, b, GR_LOOKUP_READONLY), GR_OK);
    assert_memory_equal(a, b, r.n * dim * sizeof *a);
    free(a);
    free(b);
    free_rows(&r);
    gr_table_destroy(full);
    gr_table_destroy(cut);
    gr_table_destroy(plain);
}

/* Creates the rows of keys [from, to) by lookups of 1024, as a shard's pulls do. */
static void grow(gr_table *t, uint64_t from, uint64_t to)
{
    uint64_t keys[1024];
    float *out = malloc(sizeof keys / 8 * DIM * sizeof(float));
    for (uint64_t k = from; k < to;) {
        size_t n = 0;
        for (; n < 1024 && k < to; n++, k++) keys[n] = k * 0x9e3779b97f4a7c15ull + 11;
        assert_int_equal(gr_table_lookup(t, keys, n, out, 0), GR_OK);
    }
    free(out);
}

static void test_ahead_of_growing_rows(void **state)
{
    (void)state;
    gr_table_spec s;
    spec_of(&s, GR_DTYPE_F32);
    gr_table *a = make(&s), *b = make(&s);
    gr_table_set_clock(a, 5);
    gr_table_set_clock(b, 5);
    const size_t ahead = 3u << 20;
    uint64_t got = 1;
    /* No rows yet: nothing is handed out (a table that never grows keeps nothing extra). */
    assert_int_equal(gr_table_prefault_ahead(b, ahead, &got), GR_OK);
    assert_int_equal(got, 0);
    assert_int_equal(b->committed, 0);
    for (uint64_t step = 0; step < 6; step++) {
        grow(a, step * 20000, (step + 1) * 20000);
        grow(b, step * 20000, (step + 1) * 20000);
        size_t end = (size_t)b->carved * b->stride;
        assert_int_equal(gr_table_prefault_ahead(b, ahead, &got), GR_OK);
        assert_true(got > 0);
        /* The next `ahead` bytes past the carved rows are resident now (committed first). */
        assert_true((size_t)b->committed * b->stride >= end + ahead);
        size_t first = (end + 4095) & ~(size_t)4095, last = (end + ahead) & ~(size_t)4095;
        assert_int_equal(resident_pages(b->rowmem + first, last - first), (last - first) / 4096);
        /* Asked again with nothing grown: nothing more. */
        assert_int_equal(gr_table_prefault_ahead(b, ahead, &got), GR_OK);
        assert_int_equal(got, 0);
    }
    assert_true(gr_table_ahead_bytes(b) >= ahead);
    assert_int_equal(gr_table_ahead_bytes(a), 0);
    assert_bitwise(a, b);
    gr_table_destroy(a);
    gr_table_destroy(b);
}

typedef struct grower {
    gr_table *t;
    atomic_bool done;
} grower;

static void *grow_main(void *arg)
{
    grower *g = arg;
    grow(g->t, 0, 150000);
    atomic_store(&g->done, true);
    return NULL;
}

static void test_ahead_while_rows_are_created(void **state)
{
    (void)state;
    gr_table_spec s;
    spec_of(&s, GR_DTYPE_F32);
    gr_table *a = make(&s), *b = make(&s);
    gr_table_set_clock(a, 5);
    gr_table_set_clock(b, 5);
    grow(a, 0, 150000);
    grower g = {b, false};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, grow_main, &g), 0);
    uint64_t total = 0, got;
    while (!atomic_load(&g.done)) {
        assert_int_equal(gr_table_prefault_ahead(b, 1u << 20, &got), GR_OK);
        total += got;
    }
    pthread_join(th, NULL);
    assert_int_equal(gr_table_ahead_bytes(b), total);
    assert_bitwise(a, b);
    float wa[DIM], wb[DIM];
    uint64_t key = 77777 * 0x9e3779b97f4a7c15ull + 11;
    assert_int_equal(gr_table_lookup(a, &key, 1, wa, GR_LOOKUP_READONLY), GR_OK);
    assert_int_equal(gr_table_lookup(b, &key, 1, wb, GR_LOOKUP_READONLY), GR_OK);
    assert_memory_equal(wa, wb, sizeof wa);
    gr_table_destroy(a);
    gr_table_destroy(b);
}

/* Whether the mapping holding p has VmFlags `flag` (fails the test when none holds it). */
static bool vma_flag(const void *p, const char *flag)
{
    bool found;
    bool has = vma_has_flag(p, flag, &found);
    if (!found) fail_msg("no mapping holds %p", p);
    return has;
}

/* gr_table_set_huge_rows: row memory before the limit (rounded up to 2 MiB) is advised for huge
 * pages, past it against them; 0 puts the pages committed from then on back on huge pages; the
 * rows are bitwise those of a table without a limit. */
static void test_huge_rows_limit(void **state)
{
    (void)state;
    gr_table_spec s;
    spec_of(&s, GR_DTYPE_F32);
    gr_table *a = make(&s), *b = make(&s);
    gr_table_set_clock(a, 5);
    gr_table_set_clock(b, 5);
    gr_table_set_huge_rows(b, 1); /* rounds up to one huge page */
    grow(a, 0, 100000);
    grow(b, 0, 100000);
    const size_t huge = 2u << 20, end = (size_t)b->committed * b->stride;
    assert_true(end > 4 * huge);
    assert_true(vma_flag(b->rowmem, "hg"));
    assert_true(vma_flag(b->rowmem + huge - 64, "hg"));
    assert_false(vma_flag(b->rowmem + huge, "hg"));
    assert_true(vma_flag(b->rowmem + huge, "nh"));
    assert_true(vma_flag(b->rowmem + end - 64, "nh"));
    /* Without a limit: huge pages all the way. */
    assert_true(vma_flag(a->rowmem + end - 64, "hg"));
    assert_false(vma_flag(a->rowmem + end - 64, "nh"));
    assert_bitwise(a, b);
    /* Back to no limit: what is committed from now on is advised for huge pages again. */
    gr_table_set_huge_rows(b, 0);
    const uint32_t before = b->committed;
    grow(a, 100000, 250000);
    grow(b, 100000, 250000);
    assert_true(b->committed > before);
    const size_t at = (size_t)before * b->stride;
    const size_t next = (at + huge - 1) & ~(huge - 1); /* the first page committed after */
    assert_true(next + 64 < (size_t)b->committed * b->stride);
    assert_true(vma_flag(b->rowmem + next + 64, "hg"));
    assert_true(vma_flag(b->rowmem + end - 64, "nh")); /* what was committed keeps its own */
    assert_bitwise(a, b);
    gr_table_destroy(a);
    gr_table_destroy(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefaulted_fill_is_bitwise_the_same),
        cmocka_unit_test(test_fill_past_the_prepared_rows),
        cmocka_unit_test(test_only_new_empty_tables),
        cmocka_unit_test(test_preparation_stops_when_asked),
        cmocka_unit_test(test_ahead_of_growing_rows),
        cmocka_unit_test(test_ahead_while_rows_are_created),
        cmocka_unit_test(test_huge_rows_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
