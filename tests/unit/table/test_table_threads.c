/* Concurrency tests for the table, meant to run under TSan too (`make SANITIZER=thread`):
 * four threads applying SGD with known integer gradients must end at exact weights; growth,
 * deletes, capacity eviction, TTL passes, scans and stats racing with lookups must stay
 * consistent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/table.h"

#define NTHREADS 4
#define NKEYS 3000
#define DIM 8
#define ROUNDS 150
#define BATCH 400

typedef struct sgd_arg {
    gr_table *t;
    int id;
    int64_t *expect; /* NKEYS * DIM: sum of this thread's gradients */
    int rc;
} sgd_arg;

static uint64_t key_of(size_t i) { return i * 0x9e3779b97f4a7c15ull + 12345; }

static void *sgd_worker(void *p)
{
    sgd_arg *a = p;
    gr_rng r;
    gr_rng_seed(&r, 1000 + (uint64_t)a->id);
    uint64_t keys[BATCH];
    float g[BATCH * DIM], out[BATCH * DIM];
    size_t idx[BATCH];
    for (int round = 0; round < ROUNDS && !a->rc; round++) {
        size_t n = 1 + gr_rng_next(&r) % BATCH;
        for (size_t i = 0; i < n; i++) {
            idx[i] = gr_rng_next(&r) % NKEYS; /* duplicates within a batch are fine */
            keys[i] = key_of(idx[i]);
            for (int j = 0; j < DIM; j++) {
                int v = (int)(gr_rng_next(&r) % 7) - 3;
                g[i * DIM + j] = (float)v;
                a->expect[idx[i] * DIM + j] += v;
            }
        }
        if (round % 3 == 0 && gr_table_lookup(a->t, keys, n, out, 0) != GR_OK) a->rc = 1;
        if (gr_table_apply(a->t, keys, n, g) != GR_OK) a->rc = 2;
    }
    return NULL;
}

typedef struct reader_arg {
    gr_table *t;
    atomic_int *stop;
    uint64_t scans;
} reader_arg;

static int count_cb(void *ctx, uint64_t key, const float *w, const float *st,
                    const gr_row_meta *meta)
{
    (void)key;
    (void)w;
    (void)st;
    (void)meta;
    (*(uint64_t *)ctx)++;
    return 0;
}

static void *reader(void *p)
{
    reader_arg *a = p;
    while (!atomic_load(a->stop)) {
        uint64_t n = 0;
        gr_table_scan(a->t, count_cb, &n);
        gr_table_scan_dirty(a->t, 1, count_cb, &n);
        gr_table_stats st;
        gr_table_get_stats(a->t, &st);
        (void)gr_table_dirty_count(a->t, 2);
        a->scans++;
    }
    return NULL;
}

static void test_sgd_exact_four_threads(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "sgd4", DIM);
    s.opt.lr = 1.0f; /* integer gradients, integer weights: every order gives exact sums */
    s.partitions = 16;
    gr_table *t = NULL;
    assert_int_equal(gr_table_create(&s, &t), GR_OK);
    pthread_t th[NTHREADS], rt;
    sgd_arg args[NTHREADS];
    atomic_int stop = 0;
    reader_arg ra = {.t = t, .stop = &stop};
    assert_int_equal(pthread_create(&rt, NULL, reader, &ra), 0);
    for (int i = 0; i < NTHREADS; i++) {
        args[i] = (sgd_arg){.t = t, .id = i, .expect = calloc(NKEYS * DIM, sizeof(int64_t))};
        assert_int_equal(pthread_create(&th[i], NULL, sgd_worker, &args[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(rt, NULL);
    uint64_t *keys = malloc(NKEYS * 8);
    float *w = malloc(NKEYS * DIM * 4);
    bool *found = malloc(NKEYS);
    for (size_t i = 0; i < NKEYS; i++) keys[i] = key_of(i);
    assert_int_equal(gr_table_get(t, keys, NKEYS, w, NULL, NULL, found), GR_OK);
    uint64_t applies = 0;
    for (int i = 0; i < NTHREADS; i++) assert_int_equal(args[i].rc, 0);
    for (size_t k = 0; k < NKEYS; k++) {
        for (int j = 0; j < DIM; j++) {
            int64_t sum = 0;
            for (int i = 0; i < NTHREADS; i++) sum += args[i].expect[k * DIM + j];
            if (w[k * DIM + j] != (float)-sum)
                fail_msg("key %zu elem %d: %g != %lld", k, j, (double)w[k * DIM + j],
                         (long long)-sum);
        }
    }
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    for (size_t k = 0; k < NKEYS; k++) applies += found[k];
    assert_int_equal(st.rows, applies);
    assert_true(st.applies > 0);
    for (int i = 0; i < NTHREADS; i++) free(args[i].expect);
    free(keys);
    free(w);
    free(found);
    gr_table_destroy(t);
}

/* Writers insert disjoint key ranges (forcing every partition index to grow while others
 * probe it), readers look up continuously, a deleter removes a fixed subset. */
typedef struct grow_arg {
    gr_table *t;
    int id;
    int rc;
} grow_arg;

#define GROW_PER 20000

static void *grow_writer(void *p)
{
    grow_arg *a = p;
    uint64_t keys[500];
    float w[500 * 2];
    for (size_t base = 0; base < GROW_PER && !a->rc; base += 500) {
        for (size_t i = 0; i < 500; i++) {
            uint64_t k = (uint64_t)a->id * GROW_PER + base + i;
            keys[i] = k;
            w[2 * i] = (float)k;
            w[2 * i + 1] = (float)a->id;
        }
        if (gr_table_insert(a->t, keys, 500, w, NULL, NULL) != GR_OK) a->rc = 1;
        float out[500 * 2];
        if (gr_table_lookup(a->t, keys, 500, out, GR_LOOKUP_READONLY) != GR_OK) a->rc = 2;
        for (size_t i = 0; i < 500 && !a->rc; i++)
            if (out[2 * i] != (float)keys[i]) a->rc = 3;
    }
    return NULL;
}

static void test_concurrent_growth(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "grow", 2);
    s.partitions = 4;
    gr_table *t = NULL;
    assert_int_equal(gr_table_create(&s, &t), GR_OK);
    pthread_t th[3], rt;
    grow_arg ga[3];
    atomic_int stop = 0;
    reader_arg ra = {.t = t, .stop = &stop};
    assert_int_equal(pthread_create(&rt, NULL, reader, &ra), 0);
    for (int i = 0; i < 3; i++) {
        ga[i] = (grow_arg){.t = t, .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, grow_writer, &ga[i]), 0);
    }
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(rt, NULL);
    for (int i = 0; i < 3; i++) assert_int_equal(ga[i].rc, 0);
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    assert_int_equal(st.rows, 3 * GROW_PER);
    uint64_t n = 0;
    assert_int_equal(gr_table_scan(t, count_cb, &n), 0);
    assert_int_equal(n, 3 * GROW_PER);
    assert_int_equal(gr_table_dirty_count(t, 0), 3 * GROW_PER);
    gr_table_destroy(t);
}

/* Capacity eviction, TTL passes and deletes racing with lookups and applies. */
typedef struct churn_arg {
    gr_table *t;
    int id;
    atomic_int *stop;
    int rc;
} churn_arg;

static void *churn_worker(void *p)
{
    churn_arg *a = p;
    gr_rng r;
    gr_rng_seed(&r, 77 + (uint64_t)a->id);
    uint64_t keys[256];
    float buf[256 * 4];
    for (int round = 0; round < 300 && !a->rc; round++) {
        size_t n = 1 + gr_rng_next(&r) % 256;
        for (size_t i = 0; i < n; i++) keys[i] = gr_rng_next(&r) % 20000;
        for (size_t i = 0; i < n * 4; i++) buf[i] = 0.125f;
        int op = (int)(gr_rng_next(&r) % 4);
        int rc = op == 0   ? gr_table_lookup(a->t, keys, n, buf, 0)
                 : op == 1 ? gr_table_apply(a->t, keys, n, buf)
                 : op == 2 ? gr_table_delete(a->t, keys, n / 4, NULL)
                           : gr_table_insert(a->t, keys, n, buf, NULL, NULL);
        if (rc != GR_OK) a->rc = rc;
    }
    return NULL;
}

static void *expirer(void *p)
{
    churn_arg *a = p;
    uint32_t clock = 10;
    while (!atomic_load(a->stop)) {
        gr_table_set_clock(a->t, clock++);
        uint64_t ev;
        if (gr_table_evict_expired(a->t, &ev) != GR_OK) a->rc = 1;
    }
    return NULL;
}

static void test_churn(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "churn", 4);
    s.opt.kind = GR_OPT_ADAGRAD;
    s.capacity = 3000;
    s.ttl_s = 5;
    s.partitions = 8;
    s.admit_min_count = 2;
    gr_table *t = NULL;
    assert_int_equal(gr_table_create(&s, &t), GR_OK);
    gr_table_set_clock(t, 10);
    atomic_int stop = 0;
    pthread_t th[3], et;
    churn_arg ca[3], ea = {.t = t, .stop = &stop};
    assert_int_equal(pthread_create(&et, NULL, expirer, &ea), 0);
    for (int i = 0; i < 3; i++) {
        ca[i] = (churn_arg){.t = t, .id = i, .stop = &stop};
        assert_int_equal(pthread_create(&th[i], NULL, churn_worker, &ca[i]), 0);
    }
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(et, NULL);
    for (int i = 0; i < 3; i++) assert_int_equal(ca[i].rc, 0);
    assert_int_equal(ea.rc, 0);
    gr_table_stats st;
    gr_table_get_stats(t, &st);
    assert_true(st.rows <= 3000);
    uint64_t n = 0;
    assert_int_equal(gr_table_scan(t, count_cb, &n), 0);
    assert_int_equal(n, st.rows);
    gr_table_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_exact_four_threads),
        cmocka_unit_test(test_concurrent_growth),
        cmocka_unit_test(test_churn),
    };
    return cmocka_run_group_tests_name("table_threads", tests, NULL, NULL);
}
