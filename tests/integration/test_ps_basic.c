/* Integration: 1, 2 and 4 shards as real `granary server` processes on loopback, driven by
 * the client library; every pulled row and every row after a push is compared bitwise with
 * the in-process table engine fed the same spec, keys and (deduplicated, summed) gradients. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/client.h"
#include "granary/table.h"
#include "tests/support/ps_harness.h"

#define NT 3
static const char *const specs[NT] = {
    "{\"name\":\"user\",\"id\":1,\"dim\":16,\"seed\":7,"
    "\"init\":{\"kind\":\"uniform\",\"low\":-0.05,\"high\":0.05},"
    "\"optimizer\":{\"kind\":\"adagrad\",\"lr\":0.05,\"eps\":1e-8,\"initial_accumulator\":0.1}}",
    "{\"name\":\"item\",\"id\":2,\"dim\":5,\"seed\":9,"
    "\"init\":{\"kind\":\"trunc_normal\",\"mean\":0,\"stddev\":0.1},"
    "\"optimizer\":{\"kind\":\"adam\",\"lr\":0.01,\"beta1\":0.9,\"beta2\":0.999,\"eps\":1e-8}}",
    "{\"name\":\"cat\",\"id\":3,\"dim\":3,\"seed\":11,"
    "\"init\":{\"kind\":\"uniform\",\"low\":-0.1,\"high\":0.1},"
    "\"optimizer\":{\"kind\":\"ftrl\",\"lr\":0.1,\"l1\":0.01,\"l2\":0.1,\"beta\":1.0}}",
};
static const uint32_t dims[NT] = {16, 5, 3};

typedef struct fixture {
    ps_test_server srv[4];
    unsigned n;
    gr_client *c;
    gr_table *ref[NT];
} fixture;

static void fixture_up(fixture *f, unsigned shards, const char *const *extra)
{
    memset(f, 0, sizeof *f);
    f->n = shards;
    char list[512];
    assert_int_equal(ps_test_cluster_start(f->srv, shards, extra, list, sizeof list), 0);
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = list;
    cfg.request_timeout_ms = 20000;
    int rc = gr_client_create(&cfg, &f->c);
    if (rc) fprintf(stderr, "client: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    assert_int_equal(gr_client_shards(f->c), shards);
    for (int t = 0; t < NT; t++) {
        rc = gr_client_create_table(f->c, specs[t]);
        if (rc) fprintf(stderr, "create: %s\n", gr_errmsg());
        assert_int_equal(rc, 0);
        /* Creating again with the same spec is fine. */
        assert_int_equal(gr_client_create_table(f->c, specs[t]), 0);
        gr_table_spec spec;
        assert_int_equal(gr_table_spec_from_json(specs[t], &spec), 0);
        assert_int_equal(gr_table_create(&spec, &f->ref[t]), 0);
    }
}

static void fixture_down(fixture *f)
{
    gr_client_destroy(f->c);
    for (int t = 0; t < NT; t++) gr_table_destroy(f->ref[t]);
    for (unsigned i = 0; i < f->n; i++) assert_int_equal(ps_test_server_stop(&f->srv[i], 0), 0);
}

/* Heavily duplicated keys: Zipf(1.1) over `vocab` ranks, spread by a hash. */
static void zipf_keys(uint64_t *keys, size_t n, uint64_t vocab, uint64_t seed)
{
    gr_zipf z;
    gr_rng r;
    gr_zipf_init(&z, vocab, 1.1);
    gr_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) keys[i] = gr_hash_key(gr_zipf_draw(&z, &r), seed);
}

static void fill_grads(float *g, size_t n, uint64_t seed)
{
    gr_rng r;
    gr_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) g[i] = (float)(gr_rng_normal(&r) * 0.1);
}

/* The reference push: dedup, sum duplicates in order of occurrence, one apply per key. */
static void ref_push(gr_table *t, const uint64_t *keys, size_t n, uint32_t dim, const float *g)
{
    uint64_t *uniq = malloc(n * sizeof *uniq);
    uint32_t *inv = malloc(n * sizeof *inv);
    float *sum = calloc(n * dim, sizeof *sum);
    bool *seen = calloc(n, sizeof *seen);
    long nu = gr_dedup(keys, n, uniq, inv, NULL);
    assert_true(nu >= 0);
    for (size_t i = 0; i < n; i++) {
        float *dst = sum + (size_t)inv[i] * dim;
        if (!seen[inv[i]]) {
            memcpy(dst, g + i * dim, dim * sizeof *dst);
            seen[inv[i]] = true;
        } else {
            for (uint32_t d = 0; d < dim; d++) dst[d] += g[i * dim + d];
        }
    }
    assert_int_equal(gr_table_apply(t, uniq, (size_t)nu, sum), 0);
    free(uniq);
    free(inv);
    free(sum);
    free(seen);
}

static void assert_rows_equal(gr_table *ref, const uint64_t *keys, size_t n, uint32_t dim,
                              const float *got)
{
    float *want = malloc(n * dim * sizeof *want);
    assert_int_equal(gr_table_lookup(ref, keys, n, want, 0), 0);
    for (size_t i = 0; i < n; i++)
        if (memcmp(want + i * dim, got + i * dim, dim * sizeof *want) != 0) {
            fprintf(stderr, "row %zu (key %llu) differs: got %.9g want %.9g\n", i,
                    (unsigned long long)keys[i], got[i * dim], want[i * dim]);
            fail();
        }
    free(want);
}

static void run_exactness(unsigned shards)
{
    fixture f;
    fixture_up(&f, shards, NULL);
    const size_t n = 3000;
    uint64_t *keys[NT];
    float *rows[NT], *grads[NT];
    for (int t = 0; t < NT; t++) {
        keys[t] = malloc(n * sizeof(uint64_t));
        rows[t] = malloc(n * dims[t] * sizeof(float));
        grads[t] = malloc(n * dims[t] * sizeof(float));
    }
    for (int step = 0; step < 3; step++) {
        gr_client_batch b[NT];
        for (int t = 0; t < NT; t++) {
            zipf_keys(keys[t], n, 400 + 100 * (uint64_t)t, 1000 * (uint64_t)step + (uint64_t)t);
            memset(rows[t], 0xff, n * dims[t] * sizeof(float));
            b[t] = (gr_client_batch){(uint32_t)t + 1, dims[t], n, keys[t], rows[t], NULL, 0};
        }
        /* Pull over three tables at once. */
        gr_client_op *op = NULL;
        assert_int_equal(gr_client_pull_start(f.c, b, NT, 0, &op), 0);
        assert_non_null(op);
        int rc = gr_client_wait(op, -1);
        if (rc) fprintf(stderr, "pull: %s\n", gr_errmsg());
        assert_int_equal(rc, 0);
        for (int t = 0; t < NT; t++) assert_rows_equal(f.ref[t], keys[t], n, dims[t], rows[t]);
        /* Push: duplicates are summed by the client; each key gets one step. */
        for (int t = 0; t < NT; t++) {
            fill_grads(grads[t], n * dims[t], 77 + (uint64_t)step * 10 + (uint64_t)t);
            b[t].grads = grads[t];
            b[t].rows = NULL;
        }
        assert_int_equal(gr_client_push_many(f.c, b, NT), 0);
        for (int t = 0; t < NT; t++) ref_push(f.ref[t], keys[t], n, dims[t], grads[t]);
        /* The fused push-then-pull returns the rows after its own update. */
        for (int t = 0; t < NT; t++) {
            fill_grads(grads[t], n * dims[t], 500 + (uint64_t)step * 10 + (uint64_t)t);
            b[t].rows = rows[t];
        }
        assert_int_equal(gr_client_push_pull_many(f.c, b, NT), 0);
        for (int t = 0; t < NT; t++) {
            ref_push(f.ref[t], keys[t], n, dims[t], grads[t]);
            assert_rows_equal(f.ref[t], keys[t], n, dims[t], rows[t]);
        }
    }
    /* Rows per table across shards = the reference's rows; each shard holds its slots. */
    for (int t = 0; t < NT; t++) {
        gr_table_stats st;
        gr_table_get_stats(f.ref[t], &st);
        char *json = NULL;
        const char *names[NT] = {"user", "item", "cat"};
        assert_int_equal(gr_client_describe_table(f.c, names[t], &json), 0);
        char want[64];
        snprintf(want, sizeof want, "\"rows\":%llu", (unsigned long long)st.rows);
        if (!strstr(json, want)) fprintf(stderr, "describe: %s (want %s)\n", json, want);
        assert_non_null(strstr(json, want));
        assert_non_null(strstr(json, names[t]));
        free(json);
    }
    gr_client_stats_t cs;
    gr_client_get_stats(f.c, &cs);
    assert_true(cs.keys_sent < cs.keys_in); /* dedup happened */
    assert_true(cs.requests >= 9 * shards);
    for (int t = 0; t < NT; t++) {
        free(keys[t]);
        free(rows[t]);
        free(grads[t]);
    }
    fixture_down(&f);
}

static void test_exact_1_shard(void **state)
{
    (void)state;
    run_exactness(1);
}

static void test_exact_2_shards(void **state)
{
    (void)state;
    run_exactness(2);
}

static void test_exact_4_shards(void **state)
{
    (void)state;
    run_exactness(4);
}

/* One key repeated thousands of times among a few others: scatter and summing. */
static void test_heavy_duplication(void **state)
{
    (void)state;
    fixture f;
    fixture_up(&f, 2, NULL);
    const size_t n = 5000;
    uint64_t *keys = malloc(n * sizeof *keys);
    for (size_t i = 0; i < n; i++) keys[i] = (i % 5 == 4) ? 1000 + i % 7 : 42;
    float *rows = malloc(n * 16 * sizeof *rows), *g = malloc(n * 16 * sizeof *g);
    assert_int_equal(gr_client_pull(f.c, 1, 16, keys, n, rows), 0);
    assert_rows_equal(f.ref[0], keys, n, 16, rows);
    for (size_t i = 1; i < n; i++)
        if (keys[i] == 42) assert_memory_equal(rows + i * 16, rows, 16 * sizeof(float));
    fill_grads(g, n * 16, 5);
    assert_int_equal(gr_client_push(f.c, 1, 16, keys, n, g), 0);
    ref_push(f.ref[0], keys, n, 16, g);
    assert_int_equal(gr_client_pull(f.c, 1, 16, keys, n, rows), 0);
    assert_rows_equal(f.ref[0], keys, n, 16, rows);
    gr_client_stats_t cs;
    gr_client_get_stats(f.c, &cs);
    assert_int_equal(cs.keys_in, 3 * n);
    assert_int_equal(cs.keys_sent, 3 * 8); /* 8 distinct keys per call */
    /* Read-only pull of unseen keys: zeros, and nothing is created. */
    uint64_t fresh[3] = {9001, 9002, 9001};
    float out[3 * 16];
    gr_client_batch b = {1, 16, 3, fresh, out, NULL, 0};
    assert_int_equal(gr_client_pull_many(f.c, &b, 1, GR_CLIENT_READONLY), 0);
    for (int i = 0; i < 3 * 16; i++) assert_true(out[i] == 0.0f);
    char *json;
    assert_int_equal(gr_client_describe_table(f.c, "user", &json), 0);
    assert_non_null(strstr(json, "\"rows\":8,"));
    free(json);
    /* Delete: counts rows that were present. */
    uint64_t del[4] = {42, 42, 9001, 1004};
    uint64_t deleted = 0;
    assert_int_equal(gr_client_delete(f.c, 1, 16, del, 4, &deleted), 0);
    assert_int_equal(deleted, 2);
    assert_int_equal(gr_client_describe_table(f.c, "user", &json), 0);
    assert_non_null(strstr(json, "\"rows\":6,"));
    free(json);
    uint64_t evicted = 99;
    assert_int_equal(gr_client_evict(f.c, NULL, &evicted), 0);
    assert_int_equal(evicted, 0); /* no TTL set */
    free(keys);
    free(rows);
    free(g);
    fixture_down(&f);
}

/* Many operations in flight at once, from several threads, on their own tables. */
typedef struct worker_arg {
    gr_client *c;
    int t;
    gr_table *ref;
    int failures;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *a = p;
    const size_t n = 800;
    uint32_t dim = dims[a->t];
    uint64_t *keys = malloc(n * sizeof *keys);
    float *g = malloc(n * dim * sizeof *g);
    for (int step = 0; step < 5; step++) {
        zipf_keys(keys, n, 300, 31 * (uint64_t)step + (uint64_t)a->t);
        fill_grads(g, n * dim, 7 * (uint64_t)step + (uint64_t)a->t);
        gr_client_op *op;
        gr_client_batch b = {(uint32_t)a->t + 1, dim, n, keys, NULL, g, 0};
        if (gr_client_push_start(a->c, &b, 1, &op) != 0) {
            a->failures++;
            continue;
        }
        /* grads may be reused once start returns: scribble on them. */
        float *copy = malloc(n * dim * sizeof *copy);
        memcpy(copy, g, n * dim * sizeof *copy);
        memset(g, 0x7f, n * dim * sizeof *g);
        int rc;
        while ((rc = gr_client_wait(op, 1)) == GR_EAGAIN) {
        }
        if (rc) a->failures++;
        ref_push(a->ref, keys, n, dim, copy);
        free(copy);
    }
    free(keys);
    free(g);
    return NULL;
}

static void test_concurrent_clients_threads(void **state)
{
    (void)state;
    fixture f;
    fixture_up(&f, 3, NULL);
    pthread_t th[NT];
    worker_arg args[NT];
    for (int t = 0; t < NT; t++) {
        args[t] = (worker_arg){f.c, t, f.ref[t], 0};
        pthread_create(&th[t], NULL, worker, &args[t]);
    }
    for (int t = 0; t < NT; t++) {
        pthread_join(th[t], NULL);
        assert_int_equal(args[t].failures, 0);
    }
    /* Several pulls in flight at once, waited in reverse order. */
    const size_t n = 1000;
    uint64_t *keys[NT];
    float *rows[NT];
    gr_client_op *ops[NT];
    for (int t = 0; t < NT; t++) {
        keys[t] = malloc(n * sizeof(uint64_t));
        rows[t] = malloc(n * dims[t] * sizeof(float));
        zipf_keys(keys[t], n, 300, 31 * 4 + (uint64_t)t);
        gr_client_batch b = {(uint32_t)t + 1, dims[t], n, keys[t], rows[t], NULL, 0};
        assert_int_equal(gr_client_pull_start(f.c, &b, 1, 0, &ops[t]), 0);
    }
    for (int t = NT - 1; t >= 0; t--) {
        assert_int_equal(gr_client_wait(ops[t], 10000), 0);
        assert_rows_equal(f.ref[t], keys[t], n, dims[t], rows[t]);
        free(keys[t]);
        free(rows[t]);
    }
    fixture_down(&f);
}

/* Server limits far below the batch: the client splits each shard's keys over several
 * requests and the result is still exact. */
static void test_client_splits_to_limits(void **state)
{
    (void)state;
    fixture f;
    const char *extra[] = {"--max-keys", "100", "--max-body", "8k", NULL};
    fixture_up(&f, 2, extra);
    const size_t n = 2500;
    uint64_t *keys = malloc(n * sizeof *keys);
    for (size_t i = 0; i < n; i++) keys[i] = i * 7919 + 1;
    float *rows = malloc(n * 16 * sizeof *rows), *g = malloc(n * 16 * sizeof *g);
    gr_client_stats_t before, after;
    gr_client_get_stats(f.c, &before);
    assert_int_equal(gr_client_pull(f.c, 1, 16, keys, n, rows), 0);
    gr_client_get_stats(f.c, &after);
    /* 2500 keys, at most 100 per request and 8 KiB per frame (~120 rows of dim 16). */
    assert_true(after.requests - before.requests >= 25);
    assert_rows_equal(f.ref[0], keys, n, 16, rows);
    fill_grads(g, n * 16, 3);
    assert_int_equal(gr_client_push(f.c, 1, 16, keys, n, g), 0);
    ref_push(f.ref[0], keys, n, 16, g);
    assert_int_equal(gr_client_pull(f.c, 1, 16, keys, n, rows), 0);
    assert_rows_equal(f.ref[0], keys, n, 16, rows);
    free(keys);
    free(rows);
    free(g);
    fixture_down(&f);
}

/* Dense parameters: stored whole on their owner shard as chunk rows of a table. */
static void test_dense(void **state)
{
    (void)state;
    fixture f;
    fixture_up(&f, 3, NULL);
    const char *spec = "{\"name\":\"mlp\",\"size\":2500,\"seed\":3,"
                       "\"init\":{\"kind\":\"uniform\",\"low\":-0.2,\"high\":0.2},"
                       "\"optimizer\":{\"kind\":\"adagrad\",\"lr\":0.1,\"eps\":1e-8,"
                       "\"initial_accumulator\":0.1}}";
    assert_int_equal(gr_client_dense_create(f.c, spec), 0);
    assert_int_equal(gr_client_dense_create(f.c, spec), 0); /* idempotent */
    /* The reference: the same spec as a table of 1024-float chunks keyed 0, 1, 2. */
    const char *ref_spec = "{\"name\":\"mlp\",\"id\":0,\"dim\":1024,\"seed\":3,"
                           "\"init\":{\"kind\":\"uniform\",\"low\":-0.2,\"high\":0.2},"
                           "\"optimizer\":{\"kind\":\"adagrad\",\"lr\":0.1,\"eps\":1e-8,"
                           "\"initial_accumulator\":0.1}}";
    gr_table_spec rs;
    gr_table *ref;
    assert_int_equal(gr_table_spec_from_json(ref_spec, &rs), 0);
    assert_int_equal(gr_table_create(&rs, &ref), 0);
    uint64_t chunk_keys[3] = {0, 1, 2};
    float *want = calloc(3 * 1024, sizeof *want), *got = malloc(2500 * sizeof *got);
    float *g = calloc(3 * 1024, sizeof *g);
    for (int step = 0; step < 3; step++) {
        assert_int_equal(gr_client_dense_pull(f.c, "mlp", got, 2500), 0);
        assert_int_equal(gr_table_lookup(ref, chunk_keys, 3, want, 0), 0);
        assert_memory_equal(got, want, 2500 * sizeof(float));
        fill_grads(g, 2500, 40 + (uint64_t)step);
        assert_int_equal(gr_client_dense_push(f.c, "mlp", g, 2500), 0);
        assert_int_equal(gr_table_apply(ref, chunk_keys, 3, g), 0); /* padding stays 0 */
    }
    assert_int_equal(gr_client_dense_pull(f.c, "mlp", got, 2500), 0);
    assert_int_equal(gr_table_lookup(ref, chunk_keys, 3, want, 0), 0);
    assert_memory_equal(got, want, 2500 * sizeof(float));
    /* Wrong sizes and unknown names are specific errors. */
    assert_int_equal(gr_client_dense_push(f.c, "mlp", g, 2499), GR_EDIM);
    assert_non_null(strstr(gr_errmsg(), "has 2500 floats, push carried 2499"));
    assert_int_equal(gr_client_dense_pull(f.c, "mlp", got, 100), GR_EDIM);
    assert_int_equal(gr_client_dense_pull(f.c, "nope", got, 100), GR_ENOENT);
    assert_non_null(strstr(gr_errmsg(), "no dense parameter named 'nope'"));
    char *json;
    assert_int_equal(gr_client_describe_table(f.c, "mlp", &json), 0);
    assert_non_null(strstr(json, "\"size\":2500"));
    /* One partition unless the spec asks: each partition takes the arena 64 chunk rows at a
     * time, and chunk rows are wide: 3 rows of 1024 floats with their state in one chunk
     * (528 KB counted; with 256 partitions each row could take a chunk of its own). */
    assert_non_null(strstr(json, "\"partitions\":1}"));
    free(json);
    const char *parted = "{\"name\":\"mlp4\",\"size\":5000,\"partitions\":4}";
    assert_int_equal(gr_client_dense_create(f.c, parted), 0);
    assert_int_equal(gr_client_describe_table(f.c, "mlp4", &json), 0);
    assert_non_null(strstr(json, "\"partitions\":4}"));
    free(json);
    gr_table_destroy(ref);
    free(want);
    free(got);
    free(g);
    fixture_down(&f);
}

/* Table management: drop, unknown table, conflicting spec; stats over the CLI. */
static void test_tables_and_stats_cli(void **state)
{
    (void)state;
    fixture f;
    fixture_up(&f, 2, NULL);
    const char *conflict = "{\"name\":\"user\",\"id\":1,\"dim\":32}";
    assert_int_equal(gr_client_create_table(f.c, conflict), GR_EEXIST);
    assert_non_null(strstr(gr_errmsg(), "'user' already exists with a different spec"));
    const char *id_clash = "{\"name\":\"other\",\"id\":1,\"dim\":4}";
    assert_int_equal(gr_client_create_table(f.c, id_clash), GR_EEXIST);
    assert_non_null(strstr(gr_errmsg(), "table id 1 is already used by table 'user'"));
    assert_int_equal(gr_client_create_table(f.c, "{\"name\":\"bad\",\"dim\":0}"), GR_EINVAL);
    uint64_t k[2] = {1, 2};
    float rows[2 * 16];
    assert_int_equal(gr_client_pull(f.c, 1, 16, k, 2, rows), 0);
    char *json;
    assert_int_equal(gr_client_stats(f.c, 1, &json), 0);
    assert_non_null(strstr(json, "\"shard\":1"));
    assert_non_null(strstr(json, "\"pull\":{\"count\":"));
    free(json);
    char out[8192];
    const char *args[] = {"stats", "--server", f.srv[0].addr, NULL};
    assert_int_equal(ps_test_run_granary(args, out, sizeof out), 0);
    assert_non_null(strstr(out, "shard 0 of 2"));
    assert_non_null(strstr(out, "user"));
    assert_non_null(strstr(out, "pull"));
    const char *jargs[] = {"stats", "--server", f.srv[1].addr, "--json", NULL};
    assert_int_equal(ps_test_run_granary(jargs, out, sizeof out), 0);
    assert_non_null(strstr(out, "\"shards\":2"));
    assert_non_null(strstr(out, "\"memory_bytes\":"));
    assert_int_equal(gr_client_drop_table(f.c, "user"), 0);
    assert_int_equal(gr_client_drop_table(f.c, "user"), GR_ENOENT);
    assert_int_equal(gr_client_pull(f.c, 1, 16, k, 2, rows), GR_ENOENT);
    assert_non_null(strstr(gr_errmsg(), "no table with id 1 on shard"));
    assert_int_equal(gr_client_describe_table(f.c, "user", &json), GR_ENOENT);
    fixture_down(&f);
}

/* --config creates tables (and dense parameters on their owner) at start. */
static void test_config_file(void **state)
{
    (void)state;
    char dir[128], path[256];
    assert_int_equal(ps_test_tmpdir(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/ps.json", dir);
    FILE *fp = fopen(path, "w");
    fprintf(fp, "{\"server\":{\"threads\":2},\"tables\":[%s,%s],"
                "\"dense\":[{\"name\":\"w\",\"size\":10}]}",
            specs[0], specs[1]);
    fclose(fp);
    const char *extra[] = {"--config", path, NULL};
    ps_test_server s[2];
    char list[256];
    assert_int_equal(ps_test_cluster_start(s, 2, extra, list, sizeof list), 0);
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = list;
    gr_client *c;
    assert_int_equal(gr_client_create(&cfg, &c), 0);
    char *json;
    assert_int_equal(gr_client_describe_table(c, "item", &json), 0);
    free(json);
    float w[10];
    assert_int_equal(gr_client_dense_pull(c, "w", w, 10), 0);
    for (int i = 0; i < 10; i++) assert_true(w[i] == 0.0f); /* default init: zeros */
    gr_client_destroy(c);
    ps_test_cluster_stop(s, 2);
    /* A bad config stops the server at start with a message. */
    fp = fopen(path, "w");
    fprintf(fp, "{\"tables\":[{\"name\":\"x\",\"dim\":4,\"bogus\":1}]}");
    fclose(fp);
    char out[4096];
    const char *args[] = {"server", "--listen", "127.0.0.1:0", "--config", path, NULL};
    assert_int_equal(ps_test_run_granary(args, out, sizeof out), 1);
    assert_non_null(strstr(out, "bogus"));
    ps_test_rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_1_shard),
        cmocka_unit_test(test_exact_2_shards),
        cmocka_unit_test(test_exact_4_shards),
        cmocka_unit_test(test_heavy_duplication),
        cmocka_unit_test(test_concurrent_clients_threads),
        cmocka_unit_test(test_client_splits_to_limits),
        cmocka_unit_test(test_dense),
        cmocka_unit_test(test_tables_and_stats_cli),
        cmocka_unit_test(test_config_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
