/* Integration: direct shards (gr_client_direct, gr_local_cluster_direct,
 * gr_server_direct_pull/push). The same pulls, pushes (duplicate keys summed), push-pulls,
 * read-only pulls and unique batches run against two clusters, one over its sockets and one by
 * direct call, and read back the same bytes; the shards count direct calls in their stats;
 * bad tables, dims and gradients fail with the socket path's errors and change nothing; the
 * server's own checks (a key of another shard, a fence, a stopped shard) refuse; threads
 * pushing at once lose nothing; a trainer gives bitwise the same model either way. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/client.h"
#include "tests/support/transport_trace.h"
#include "granary/cluster.h"
#include "granary/server.h"
#include "granary/train.h"
#include "tests/support/train_fixture.h"

static const char *const specs[2] = {
    "{\"name\":\"user\",\"id\":1,\"dim\":16,\"seed\":7,"
    "\"init\":{\"kind\":\"uniform\",\"low\":-0.05,\"high\":0.05},"
    "\"optimizer\":{\"kind\":\"adagrad\",\"lr\":0.05,\"eps\":1e-8,\"initial_accumulator\":0.1}}",
    "{\"name\":\"item\",\"id\":2,\"dim\":5,\"seed\":9,"
    "\"init\":{\"kind\":\"trunc_normal\",\"mean\":0,\"stddev\":0.1},"
    "\"optimizer\":{\"kind\":\"adam\",\"lr\":0.01,\"beta1\":0.9,\"beta2\":0.999,\"eps\":1e-8}}",
};
static const uint32_t dims[2] = {16, 5};
#define NKEYS 600

static gr_client *client_for(const char *servers)
{
    gr_client *c = tt_client(servers);
    assert_non_null(c);
    return c;
}

/* A shard's per-opcode request counter ("requests" in STATS). */
static double op_count(gr_client *c, uint32_t shard, const char *op, const char *what)
{
    char *txt = NULL;
    assert_int_equal(gr_client_stats(c, shard, &txt), 0);
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    assert_non_null(root);
    cJSON *v = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "requests"), op),
        what);
    assert_true(cJSON_IsNumber(v));
    double d = v->valuedouble;
    cJSON_Delete(root);
    return d;
}

/* Pulls, pushes, push-pulls, read-only pulls and a two-table unique batch; what it reads goes
 * to t. */
static void run_rows(gr_client *c, tt_trace *t)
{
    for (int i = 0; i < 2; i++) assert_int_equal(gr_client_create_table(c, specs[i]), 0);
    uint64_t keys[NKEYS];
    static float rows[NKEYS * 16], grads[NKEYS * 16];
    for (int round = 0; round < 4; round++) {
        for (int ti = 0; ti < 2; ti++) {
            tt_fill_keys(keys, NKEYS, 100 + round * 2 + ti);
            tt_fill_grads(grads, NKEYS * dims[ti], 200 + round * 2 + ti);
            assert_int_equal(gr_client_pull(c, ti + 1, dims[ti], keys, NKEYS, rows), 0);
            tt_trace_add(t, rows, sizeof(float) * NKEYS * dims[ti]);
            assert_int_equal(gr_client_push(c, ti + 1, dims[ti], keys, NKEYS, grads), 0);
            gr_client_batch b = {.table = ti + 1, .dim = dims[ti], .n = NKEYS, .keys = keys,
                                 .rows = rows, .grads = grads};
            assert_int_equal(gr_client_push_pull_many(c, &b, 1), 0);
            tt_trace_add(t, rows, sizeof(float) * NKEYS * dims[ti]);
        }
    }
    /* Keys never seen, read-only: the default rows, and nothing is created. */
    uint64_t fresh[64];
    for (int i = 0; i < 64; i++) fresh[i] = 1000000 + (uint64_t)i * 7919;
    gr_client_batch ro = {.table = 1, .dim = 16, .n = 64, .keys = fresh, .rows = rows};
    assert_int_equal(gr_client_pull_many(c, &ro, 1, GR_CLIENT_READONLY), 0);
    tt_trace_add(t, rows, sizeof(float) * 64 * 16);
    char *js = NULL;
    assert_int_equal(gr_client_describe_table(c, "user", &js), 0);
    tt_trace_add(t, js, strlen(js));
    free(js);
    /* Unique keys over both tables in one batch, started and waited for. */
    uint64_t uk[200];
    for (int i = 0; i < 200; i++) uk[i] = 5000 + (uint64_t)i;
    static float r1[200 * 16], r2[200 * 5], g1[200 * 16], g2[200 * 5];
    tt_fill_grads(g1, 200 * 16, 31);
    tt_fill_grads(g2, 200 * 5, 32);
    gr_client_batch two[2] = {
        {.table = 1, .dim = 16, .n = 200, .keys = uk, .rows = r1, .grads = g1,
         .flags = GR_CLIENT_BATCH_UNIQUE},
        {.table = 2, .dim = 5, .n = 200, .keys = uk, .rows = r2, .grads = g2,
         .flags = GR_CLIENT_BATCH_UNIQUE},
    };
    gr_client_op *op = NULL;
    assert_int_equal(gr_client_push_pull_start(c, two, 2, &op), 0);
    assert_int_equal(gr_client_wait(op, -1), 0);
    tt_trace_add(t, r1, sizeof r1);
    tt_trace_add(t, r2, sizeof r2);
}

#define DENSE_N 300

/* Dense pulls and pushes (blocking and started), then sync steps with rows and a dense part;
 * what it reads goes to t. */
static void run_steps(gr_client *c, tt_trace *t)
{
    assert_int_equal(gr_client_create_table(c, specs[0]), 0);
    assert_int_equal(gr_client_dense_create(c, "{\"name\":\"mlp\",\"size\":300,\"seed\":3,"
                                               "\"optimizer\":{\"kind\":\"adam\",\"lr\":0.01}}"),
                     0);
    uint64_t keys[NKEYS];
    static float rows[NKEYS * 16], grads[NKEYS * 16];
    float dense[DENSE_N], dgrad[DENSE_N];
    for (int round = 0; round < 3; round++) {
        tt_fill_grads(dgrad, DENSE_N, 300 + round);
        assert_int_equal(gr_client_dense_push(c, "mlp", dgrad, DENSE_N), 0);
        assert_int_equal(gr_client_dense_pull(c, "mlp", dense, DENSE_N), 0);
        tt_trace_add(t, dense, sizeof dense);
        gr_client_op *op = NULL;
        assert_int_equal(gr_client_dense_push_start(c, "mlp", dgrad, DENSE_N, &op), 0);
        assert_int_equal(gr_client_wait(op, -1), 0);
        assert_int_equal(gr_client_dense_pull_start(c, "mlp", dense, DENSE_N, &op), 0);
        assert_int_equal(gr_client_wait(op, -1), 0);
        tt_trace_add(t, dense, sizeof dense);
    }
    /* A dense pull of the wrong size, and an unknown one, fail and say why. */
    assert_int_equal(gr_client_dense_pull(c, "mlp", dense, DENSE_N - 1), GR_EDIM);
    assert_int_equal(gr_client_dense_pull(c, "nope", dense, DENSE_N), GR_ENOENT);
    gr_client_sync_config sc = {GR_CLIENT_SYNC_SYNC, 1, 0, 0, 0};
    assert_int_equal(gr_client_sync_configure(c, &sc, 0, NULL), 0);
    uint32_t ns = gr_client_shards(c);
    uint64_t want[4] = {0}, tags[4] = {0};
    uint32_t outcomes[4];
    for (int step = 0; step < 4; step++) {
        assert_int_equal(gr_client_sync_acquire(c, 0, want, 5000, tags, NULL), 0);
        tt_trace_add(t, tags, sizeof(uint64_t) * ns);
        tt_fill_keys(keys, NKEYS, 400 + step);
        tt_fill_grads(grads, NKEYS * 16, 500 + step);
        tt_fill_grads(dgrad, DENSE_N, 600 + step);
        gr_client_batch b = {.table = 1, .dim = 16, .n = NKEYS, .keys = keys, .grads = grads};
        gr_client_dense_grad d = {.name = "mlp", .grad = dgrad, .n = DENSE_N};
        /* The last step carries only the dense part, as hybrid's do. */
        int rc = gr_client_push_step(c, 0, tags, &b, step == 3 ? 0 : 1, &d, 1, outcomes);
        if (rc) fprintf(stderr, "push_step: %s\n", gr_errmsg());
        assert_int_equal(rc, 0);
        for (uint32_t s = 0; s < ns; s++) {
            assert_int_equal(outcomes[s], GR_CLIENT_PUSH_APPLIED);
            want[s] = tags[s] + 1;
        }
        assert_int_equal(gr_client_pull(c, 1, 16, keys, NKEYS, rows), 0);
        tt_trace_add(t, rows, sizeof(float) * NKEYS * 16);
        assert_int_equal(gr_client_dense_pull(c, "mlp", dense, DENSE_N), 0);
        tt_trace_add(t, dense, sizeof dense);
    }
    /* A step that is not ready, with no time to wait: refused at once, naming what it waits
     * for. */
    uint64_t ahead[4];
    for (uint32_t s = 0; s < ns; s++) ahead[s] = want[s] + 5;
    int rc = gr_client_sync_acquire(c, 0, ahead, 0, tags, NULL);
    assert_int_equal(rc, GR_ETIMEDOUT);
    assert_non_null(strstr(gr_errmsg(), "cannot start yet"));
    assert_int_equal(gr_client_sync_leave(c, 0), 0);
    assert_int_equal(gr_client_sync_configure(c, NULL, GR_CLIENT_SYNC_CLEAR, NULL), 0);
}

/* The dense and sync calls read back the same bytes by direct call as over the sockets. */
static void test_direct_steps_match_socket(void **state)
{
    (void)state;
    gr_local_cluster *ca, *cb;
    assert_int_equal(gr_local_cluster_start(2, 2, &ca), 0);
    assert_int_equal(gr_local_cluster_start(2, 2, &cb), 0);
    gr_client *sock = client_for(gr_local_cluster_local_servers(ca));
    gr_client *direct = client_for(gr_local_cluster_local_servers(cb));
    assert_int_equal(gr_local_cluster_direct(cb, direct), 0);
    tt_trace a = {0}, b = {0};
    run_steps(sock, &a);
    run_steps(direct, &b);
    assert_true(a.len > 100000);
    assert_int_equal(a.len, b.len);
    assert_true(memcmp(a.data, b.data, a.len) == 0);
    gr_client_stats_t sb;
    gr_client_get_stats(direct, &sb);
    assert_true(sb.direct_calls > 30);
    for (uint32_t s = 0; s < 2; s++) {
        /* Successful acquires match; the refused one stops at the first shard that refuses
         * by direct call (one after the other), at every shard over the sockets (all at once). */
        assert_true(op_count(direct, s, "sync_acquire", "count") -
                        op_count(direct, s, "sync_acquire", "errors") ==
                    op_count(sock, s, "sync_acquire", "count") -
                        op_count(sock, s, "sync_acquire", "errors"));
        assert_true(op_count(direct, s, "push_step", "count") ==
                    op_count(sock, s, "push_step", "count"));
        assert_true(op_count(direct, s, "push_step", "keys") ==
                    op_count(sock, s, "push_step", "keys"));
    }
    double dp = 0, sp = 0;
    for (uint32_t s = 0; s < 2; s++) {
        dp += op_count(direct, s, "dense_pull", "count");
        sp += op_count(sock, s, "dense_pull", "count");
    }
    assert_true(dp == sp);
    free(a.data);
    free(b.data);
    gr_client_destroy(sock);
    gr_client_destroy(direct);
    gr_local_cluster_stop(ca);
    gr_local_cluster_stop(cb);
}

/* A direct acquire blocks its caller until the step may start: worker 0 of two waits for
 * worker 1's push; one with a timeout fails after it naming the step; one parked when the job
 * is dropped, or when the shard stops, fails instead of hanging. */
typedef struct acq_arg {
    gr_client *c;
    uint64_t want[2], tags[2];
    uint32_t timeout_ms;
    int rc;
    char msg[512];
    atomic_bool done;
} acq_arg;

static void *acquire_thread(void *p)
{
    acq_arg *a = p;
    a->rc = gr_client_sync_acquire(a->c, 0, a->want, a->timeout_ms, a->tags, NULL);
    snprintf(a->msg, sizeof a->msg, "%s", a->rc ? gr_errmsg() : "");
    atomic_store(&a->done, true);
    return NULL;
}

static void test_direct_acquire_waits(void **state)
{
    (void)state;
    gr_local_cluster *cl;
    assert_int_equal(gr_local_cluster_start(2, 1, &cl), 0);
    gr_client *c = client_for(gr_local_cluster_local_servers(cl));
    assert_int_equal(gr_local_cluster_direct(cl, c), 0);
    assert_int_equal(gr_client_create_table(c, specs[0]), 0);
    gr_client_sync_config sc = {GR_CLIENT_SYNC_SYNC, 2, 0, 0, 0};
    assert_int_equal(gr_client_sync_configure(c, &sc, 0, NULL), 0);
    uint64_t want[2] = {0, 0}, t0[2], t1[2];
    uint32_t oc[2];
    assert_int_equal(gr_client_sync_acquire(c, 0, want, 5000, t0, NULL), 0);
    assert_int_equal(gr_client_sync_acquire(c, 1, want, 5000, t1, NULL), 0);
    assert_int_equal(gr_client_push_step(c, 0, t0, NULL, 0, NULL, 0, oc), 0);
    /* Step 1 for worker 0 waits for worker 1's push of step 0. */
    acq_arg a = {.c = c, .want = {t0[0] + 1, t0[1] + 1}, .timeout_ms = 20000};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, acquire_thread, &a), 0);
    gr_sleep_ms(300);
    assert_false(atomic_load(&a.done));
    assert_int_equal(gr_client_push_step(c, 1, t1, NULL, 0, NULL, 0, oc), 0);
    pthread_join(th, NULL);
    assert_int_equal(a.rc, 0);
    assert_true(a.tags[0] == t0[0] + 1);
    /* Worker 0 cannot have step 2 before worker 1 pushes step 1: a short timeout says so. */
    acq_arg b = {.c = c, .want = {a.tags[0] + 1, a.tags[1] + 1}, .timeout_ms = 200};
    assert_int_equal(pthread_create(&th, NULL, acquire_thread, &b), 0);
    pthread_join(th, NULL);
    assert_int_equal(b.rc, GR_ETIMEDOUT);
    assert_non_null(strstr(b.msg, "timed out after 200 ms"));
    /* Parked when the job is dropped: fails at once. */
    acq_arg d = {.c = c, .want = {a.tags[0] + 1, a.tags[1] + 1}, .timeout_ms = 60000};
    assert_int_equal(pthread_create(&th, NULL, acquire_thread, &d), 0);
    gr_sleep_ms(200);
    assert_false(atomic_load(&d.done));
    assert_int_equal(gr_client_sync_configure(c, NULL, GR_CLIENT_SYNC_CLEAR, NULL), 0);
    pthread_join(th, NULL);
    assert_int_not_equal(d.rc, 0);
    fprintf(stderr, "dropped job: %s\n", d.msg);
    /* Parked when the shards stop: fails, nothing hangs. */
    assert_int_equal(gr_client_sync_configure(c, &sc, 0, NULL), 0);
    acq_arg e = {.c = c, .want = {3, 3}, .timeout_ms = 60000};
    assert_int_equal(pthread_create(&th, NULL, acquire_thread, &e), 0);
    gr_sleep_ms(200);
    assert_false(atomic_load(&e.done));
    /* The shard's stop answers it (the sync module fails what is parked before the server
     * goes away); the thread touches nothing of the shard after that answer. */
    gr_local_cluster_stop(cl);
    cl = NULL;
    pthread_join(th, NULL);
    assert_int_not_equal(e.rc, 0);
    fprintf(stderr, "stopped shard: %s\n", e.msg);
    assert_non_null(strstr(e.msg, "shutting down"));
    gr_client_destroy(c);
    gr_local_cluster_stop(cl);
}

/* Socket and direct read back the same bytes; the shards count the direct calls as requests,
 * and the direct client sent no row frames. */
static void test_direct_matches_socket_bitwise(void **state)
{
    (void)state;
    gr_local_cluster *ca, *cb;
    assert_int_equal(gr_local_cluster_start(2, 2, &ca), 0);
    assert_int_equal(gr_local_cluster_start(2, 2, &cb), 0);
    gr_client *sock = client_for(gr_local_cluster_local_servers(ca));
    gr_client *direct = client_for(gr_local_cluster_local_servers(cb));
    assert_int_equal(gr_local_cluster_direct(cb, direct), 0);
    tt_trace a = {0}, b = {0};
    run_rows(sock, &a);
    gr_client_stats_t before;
    gr_client_get_stats(direct, &before);
    run_rows(direct, &b);
    assert_true(a.len > 100000);
    assert_int_equal(a.len, b.len);
    assert_true(memcmp(a.data, b.data, a.len) == 0);
    gr_client_stats_t sa, sb;
    gr_client_get_stats(sock, &sa);
    gr_client_get_stats(direct, &sb);
    assert_int_equal(sa.direct_calls, 0);
    assert_true(sb.direct_calls > 20);
    assert_int_equal(sa.keys_sent, sb.keys_sent);
    /* Only the table creations and describe went out as frames: no row bytes. */
    assert_true(sb.bytes_sent - before.bytes_sent < 4096);
    assert_true(sa.bytes_sent > 100000);
    for (uint32_t s = 0; s < 2; s++) {
        /* A push_pull by direct call is counted as the push and the pull it is. */
        double pp = op_count(sock, s, "push_pull", "count"), ppk = op_count(sock, s, "push_pull", "keys");
        assert_true(pp > 0);
        assert_true(op_count(direct, s, "push_pull", "count") == 0);
        /* Counts are per table and shard by direct call, per frame (all its tables) on the
         * socket: the one two-table batch is one push_pull frame per shard there, two calls
         * of each kind here. */
        assert_true(op_count(direct, s, "pull", "count") == op_count(sock, s, "pull", "count") + pp + 1);
        assert_true(op_count(direct, s, "pull", "keys") == op_count(sock, s, "pull", "keys") + ppk);
        assert_true(op_count(direct, s, "push", "count") == op_count(sock, s, "push", "count") + pp + 1);
        assert_true(op_count(direct, s, "push", "keys") == op_count(sock, s, "push", "keys") + ppk);
    }
    free(a.data);
    free(b.data);
    /* Removed hooks: the same client goes back to its sockets. */
    assert_int_equal(gr_client_set_direct(direct, NULL), 0);
    uint64_t key = 5;
    float row[16];
    assert_int_equal(gr_client_pull(direct, 1, 16, &key, 1, row), 0);
    gr_client_get_stats(direct, &sb);
    uint64_t calls = sb.direct_calls;
    assert_int_equal(gr_client_pull(direct, 1, 16, &key, 1, row), 0);
    gr_client_get_stats(direct, &sb);
    assert_int_equal(sb.direct_calls, calls);
    gr_client_destroy(sock);
    gr_client_destroy(direct);
    gr_local_cluster_stop(ca);
    gr_local_cluster_stop(cb);
}

/* Errors say what the socket path says and change nothing. */
static void test_direct_errors(void **state)
{
    (void)state;
    gr_local_cluster *cl, *one;
    assert_int_equal(gr_local_cluster_start(2, 2, &cl), 0);
    assert_int_equal(gr_local_cluster_start(1, 1, &one), 0);
    gr_client *c = client_for(gr_local_cluster_local_servers(cl));
    assert_int_equal(gr_client_create_table(c, specs[0]), 0);
    /* Hooks for another shard count, or missing ones. */
    assert_int_equal(gr_local_cluster_direct(one, c), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "1 shards, the client has 2"));
    gr_client_direct half = {.ctx = NULL, .shards = 2};
    assert_int_equal(gr_client_set_direct(c, &half), GR_EINVAL);
    assert_int_equal(gr_local_cluster_direct(cl, c), 0);

    uint64_t keys[64];
    for (int i = 0; i < 64; i++) keys[i] = (uint64_t)i * 31 + 1;
    static float rows[64 * 16], before[64 * 16], grads[64 * 16];
    assert_int_equal(gr_client_pull(c, 1, 16, keys, 64, before), 0);
    int rc = gr_client_pull(c, 9, 16, keys, 64, rows);
    assert_int_equal(rc, GR_ENOENT);
    assert_non_null(strstr(gr_errmsg(), "no table with id 9"));
    assert_non_null(strstr(gr_errmsg(), "unix:@"));
    rc = gr_client_pull(c, 1, 8, keys, 64, rows);
    assert_int_equal(rc, GR_EDIM);
    assert_non_null(strstr(gr_errmsg(), "has dim 16"));
    /* One non-finite value anywhere: refused before any shard applies anything. */
    tt_fill_grads(grads, 64 * 16, 3);
    grads[63 * 16 + 2] = NAN;
    rc = gr_client_push(c, 1, 16, keys, 64, grads);
    assert_int_equal(rc, GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "not finite"));
    assert_int_equal(gr_client_pull(c, 1, 16, keys, 64, rows), 0);
    assert_true(memcmp(rows, before, sizeof rows) == 0);
    /* The client keeps working afterwards. */
    grads[63 * 16 + 2] = 0.5f;
    assert_int_equal(gr_client_push(c, 1, 16, keys, 64, grads), 0);
    assert_int_equal(gr_client_pull(c, 1, 16, keys, 64, rows), 0);
    assert_true(memcmp(rows, before, sizeof rows) != 0);
    assert_true(op_count(c, 0, "pull", "errors") + op_count(c, 1, "pull", "errors") >= 2);
    gr_client_destroy(c);
    gr_local_cluster_stop(cl);
    gr_local_cluster_stop(one);
}

/* The shard's own checks on a direct call: a key it does not own, its fence, its stop. */
static void test_server_direct_checks(void **state)
{
    (void)state;
    gr_server_config cfg;
    gr_server_config_default(&cfg);
    cfg.host = "127.0.0.1";
    cfg.shard = 0;
    cfg.shards = 2;
    cfg.threads = 1;
    gr_server *s = NULL;
    assert_int_equal(gr_server_create(&cfg, &s), 0);
    uint64_t key = 0;
    float row[16], g[16];
    for (int i = 0; i < 16; i++) g[i] = 0.25f;
    /* Not started yet. */
    assert_int_equal(gr_server_direct_pull(s, 1, 16, &key, 1, row, false), GR_ESHUTDOWN);
    assert_int_equal(gr_server_start(s), 0);
    gr_table_spec spec;
    assert_int_equal(gr_table_spec_from_json(specs[0], &spec), 0);
    assert_int_equal(gr_server_create_table(s, &spec, NULL), 0);
    /* One key of each shard. */
    uint64_t mine = UINT64_MAX, other = UINT64_MAX;
    for (uint64_t k = 1; mine == UINT64_MAX || other == UINT64_MAX; k++) {
        uint32_t slot;
        gr_slots_of(&k, 1, &slot);
        if (gr_server_owns_slot(s, slot)) mine = k;
        else other = k;
    }
    assert_int_equal(gr_server_direct_pull(s, 1, 16, &mine, 1, row, false), 0);
    assert_int_equal(gr_server_direct_pull(s, 1, 16, &other, 1, row, false), GR_ESTALE);
    assert_non_null(strstr(gr_errmsg(), "belongs to shard 1"));
    assert_int_equal(gr_server_direct_push(s, 1, 16, &mine, 1, g), 0);
    gr_server_set_fence(s, GR_SERVER_FENCE_WRITES);
    assert_int_equal(gr_server_direct_pull(s, 1, 16, &mine, 1, row, false), 0);
    assert_int_equal(gr_server_direct_push(s, 1, 16, &mine, 1, g), GR_ESTALE);
    assert_non_null(strstr(gr_errmsg(), "fenced"));
    gr_server_set_fence(s, GR_SERVER_FENCE_ALL);
    assert_int_equal(gr_server_direct_pull(s, 1, 16, &mine, 1, row, false), GR_ESTALE);
    gr_server_set_fence(s, GR_SERVER_OPEN);
    assert_int_equal(gr_server_direct_push(s, 1, 16, &mine, 1, g), 0);
    assert_int_equal(gr_server_direct_pull(s, 2, 16, &mine, 1, row, false), GR_ENOENT);
    assert_int_equal(gr_server_direct_push(s, 1, 4, &mine, 1, g), GR_EDIM);
    assert_int_equal(gr_server_stop(s), 0);
    assert_int_equal(gr_server_direct_pull(s, 1, 16, &mine, 1, row, false), GR_ESHUTDOWN);
    gr_server_destroy(s);
}

/* Threads pushing the same keys at once through the hooks lose no update: with SGD lr 1 and
 * gradients of 1 every row ends at its initial value minus the number of pushes, exactly as
 * the same pushes over the sockets leave it. */
#define THREADS 4
#define PUSHES 50
typedef struct pusher {
    gr_client *c;
    int rc;
} pusher;

static const char *sgd_spec = "{\"name\":\"count\",\"id\":3,\"dim\":4,\"seed\":5,"
                              "\"init\":{\"kind\":\"uniform\",\"low\":-0.5,\"high\":0.5},"
                              "\"optimizer\":{\"kind\":\"sgd\",\"lr\":1}}";

static void *push_loop(void *arg)
{
    pusher *p = arg;
    uint64_t keys[100];
    float g[100 * 4];
    for (int i = 0; i < 100; i++) keys[i] = (uint64_t)i;
    for (int i = 0; i < 400; i++) g[i] = 1.0f;
    for (int k = 0; k < PUSHES && !p->rc; k++) p->rc = gr_client_push(p->c, 3, 4, keys, 100, g);
    return NULL;
}

static void run_pushers(gr_client *c, float *out)
{
    assert_int_equal(gr_client_create_table(c, sgd_spec), 0);
    pthread_t th[THREADS];
    pusher ps[THREADS];
    for (int i = 0; i < THREADS; i++) {
        ps[i] = (pusher){c, 0};
        assert_int_equal(pthread_create(&th[i], NULL, push_loop, &ps[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(ps[i].rc, 0);
    }
    uint64_t keys[100];
    for (int i = 0; i < 100; i++) keys[i] = (uint64_t)i;
    assert_int_equal(gr_client_pull(c, 3, 4, keys, 100, out), 0);
}

static void test_direct_threads(void **state)
{
    (void)state;
    gr_local_cluster *ca, *cb;
    assert_int_equal(gr_local_cluster_start(2, 2, &ca), 0);
    assert_int_equal(gr_local_cluster_start(2, 2, &cb), 0);
    gr_client *sock = client_for(gr_local_cluster_local_servers(ca));
    gr_client *direct = client_for(gr_local_cluster_local_servers(cb));
    assert_int_equal(gr_local_cluster_direct(cb, direct), 0);
    static float a[400], b[400];
    run_pushers(sock, a);
    run_pushers(direct, b);
    assert_true(memcmp(a, b, sizeof a) == 0);
    for (int i = 0; i < 400; i++) assert_true(a[i] < -0.5f * THREADS * PUSHES);
    gr_client_destroy(sock);
    gr_client_destroy(direct);
    gr_local_cluster_stop(ca);
    gr_local_cluster_stop(cb);
}

/* A trainer (one worker, no pipeline, async: deterministic) gives bitwise the same test AUC,
 * loss and parameters with its rows by direct call as over the sockets. */
static tr_fixture fx;

static void train_one(bool direct, gr_train_mode mode, gr_train_result *r, tr_params *params)
{
    gr_local_cluster *cl;
    assert_int_equal(gr_local_cluster_start(2, 2, &cl), 0);
    gr_client *c = client_for(gr_local_cluster_local_servers(cl));
    if (direct) assert_int_equal(gr_local_cluster_direct(cl, c), 0);
    gr_ps_backend_opts po;
    gr_ps_backend_opts_default(&po);
    po.client = c;
    po.mode = mode;
    po.workers = 1;
    po.timeout_ms = 20000;
    gr_train_backend be;
    assert_int_equal(gr_ps_backend_create(&po, &be), 0);
    gr_train_opts o;
    tr_fixture_small_dlrm(&fx, &o, mode, 1);
    o.pipeline = false;
    int rc = gr_train_run(&o, &be, r);
    if (rc) fprintf(stderr, "train: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    uint64_t *ids = NULL;
    size_t nids = tr_file_ids(fx.train, &ids);
    assert_true(nids > 100);
    if (nids > 2000) nids = 2000;
    assert_int_equal(tr_params_read(c, &o.model, ids, nids, o.emb.dim, params), 0);
    free(ids);
    gr_client_stats_t st;
    gr_client_get_stats(c, &st);
    assert_true(direct ? st.direct_calls > 0 : st.direct_calls == 0);
    gr_ps_backend_finish(&be);
    gr_train_backend_destroy(&be);
    gr_client_destroy(c);
    gr_local_cluster_stop(cl);
}

static void trainer_bitwise(gr_train_mode mode)
{
    assert_int_equal(tr_fixture_make(&fx, "direct", 5), 0);
    gr_train_result rs, rd;
    tr_params ps, pd;
    train_one(false, mode, &rs, &ps);
    train_one(true, mode, &rd, &pd);
    fprintf(stderr, "socket AUC %.6f, direct AUC %.6f\n", rs.test_auc, rd.test_auc);
    assert_true(rs.test_auc > 0.6);
    assert_true(rs.test_auc == rd.test_auc);
    assert_true(rs.test_logloss == rd.test_logloss);
    assert_int_equal(rs.steps, rd.steps);
    assert_int_equal(ps.nd, pd.nd);
    assert_int_equal(ps.nrows, pd.nrows);
    assert_true(memcmp(ps.dense, pd.dense, ps.nd * sizeof(float)) == 0);
    assert_true(memcmp(ps.rows, pd.rows, ps.nrows * sizeof(float)) == 0);
    tr_params_fini(&ps);
    tr_params_fini(&pd);
    tr_fixture_remove(&fx);
}

static void test_trainer_bitwise_async(void **state)
{
    (void)state;
    trainer_bitwise(GR_MODE_ASYNC);
}

/* Hybrid: its step tokens, dense step pushes and dense pulls go direct too. */
static void test_trainer_bitwise_hybrid(void **state)
{
    (void)state;
    trainer_bitwise(GR_MODE_HYBRID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_direct_matches_socket_bitwise),
        cmocka_unit_test(test_direct_errors),
        cmocka_unit_test(test_server_direct_checks),
        cmocka_unit_test(test_direct_threads),
        cmocka_unit_test(test_direct_steps_match_socket),
        cmocka_unit_test(test_direct_acquire_waits),
        cmocka_unit_test(test_trainer_bitwise_async),
        cmocka_unit_test(test_trainer_bitwise_hybrid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
