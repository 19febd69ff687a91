/* Integration: the sync-job protocol end to end (client -> shards -> step state machine ->
 * tables), with in-process shards on loopback: job configuration (idempotent, refused when
 * different, reset, clear), sync steps over sparse and dense parameters, empty pushes, drops
 * and duplicates in semisync, acquire timeouts that name what they wait for, parked acquires
 * that hold no server thread, shutdown and a killed shard process giving errors, not hangs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/client.h"
#include "granary/server.h"
#include "tests/support/ps_harness.h"

#define TABLE "{\"name\":\"t\",\"id\":1,\"dim\":2,\"optimizer\":{\"kind\":\"sgd\",\"lr\":1.0}}"
#define DENSE "{\"name\":\"mlp\",\"size\":3,\"optimizer\":{\"kind\":\"sgd\",\"lr\":1.0}}"

typedef struct cluster {
    gr_server *s[4];
    unsigned n;
    gr_client *c;
} cluster;

static void up(cluster *k, unsigned shards, unsigned threads)
{
    memset(k, 0, sizeof *k);
    k->n = shards;
    char list[256] = "";
    for (unsigned i = 0; i < shards; i++) {
        gr_server_config cfg;
        gr_server_config_default(&cfg);
        cfg.shard = i;
        cfg.shards = shards;
        cfg.threads = threads;
        assert_int_equal(gr_server_create(&cfg, &k->s[i]), 0);
        assert_int_equal(gr_server_start(k->s[i]), 0);
        char a[32];
        snprintf(a, sizeof a, "%s127.0.0.1:%u", i ? "," : "", gr_server_port(k->s[i]));
        strcat(list, a);
    }
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = list;
    cc.request_timeout_ms = 10000;
    assert_int_equal(gr_client_create(&cc, &k->c), 0);
    assert_int_equal(gr_client_create_table(k->c, TABLE), 0);
    assert_int_equal(gr_client_dense_create(k->c, DENSE), 0);
}

static void down(cluster *k)
{
    gr_client_destroy(k->c);
    for (unsigned i = 0; i < k->n; i++) gr_server_destroy(k->s[i]);
}

/* A key owned by shard `want` of n. */
static uint64_t key_on(unsigned want, unsigned n, uint64_t from)
{
    for (uint64_t k = from;; k++)
        if (gr_proto_default_shard(gr_slot_of(k), n) == want) return k;
}

static void test_config_rules(void **state)
{
    (void)state;
    cluster k;
    up(&k, 2, 2);
    gr_client_sync_config sc = {GR_CLIENT_SYNC_SYNC, 2, 0, 0, 0};
    uint64_t step = 9;
    assert_int_equal(gr_client_sync_configure(k.c, &sc, 0, &step), 0);
    assert_true(step == 0);
    /* The same job again: fine (every process of a job may configure it). */
    assert_int_equal(gr_client_sync_configure(k.c, &sc, 0, NULL), 0);
    gr_client_sync_config other = {GR_CLIENT_SYNC_SSP, 2, 0, 2, 0};
    assert_int_equal(gr_client_sync_configure(k.c, &other, 0, NULL), GR_EBUSY);
    assert_non_null(strstr(gr_errmsg(), "mode sync, 2 workers"));
    assert_non_null(strstr(gr_errmsg(), "reset"));
    /* Bad values are refused with the reason. */
    gr_client_sync_config bad = {GR_CLIENT_SYNC_SEMISYNC, 2, 3, 0, 0};
    assert_int_equal(gr_client_sync_configure(k.c, &bad, GR_CLIENT_SYNC_RESET, NULL), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "K <= N"));
    /* Reset replaces, clear removes; without a job acquires say so. */
    assert_int_equal(gr_client_sync_configure(k.c, &other, GR_CLIENT_SYNC_RESET, NULL), 0);
    assert_int_equal(gr_client_sync_configure(k.c, NULL, GR_CLIENT_SYNC_CLEAR, NULL), 0);
    uint64_t want[2] = {0, 0}, tags[2];
    assert_int_equal(gr_client_sync_acquire(k.c, 0, want, 100, tags, NULL), GR_ENOENT);
    assert_non_null(strstr(gr_errmsg(), "sync_config"));
    down(&k);
}

/* Two workers in sync mode: a step applies the mean of both gradients, sparse and dense, on
 * every shard; the first push is staged; the shard without a worker's keys gets an empty push. */
static void test_sync_step_sparse_and_dense(void **state)
{
    (void)state;
    cluster k;
    up(&k, 2, 2);
    gr_client_sync_config sc = {GR_CLIENT_SYNC_SYNC, 2, 0, 0, 0};
    assert_int_equal(gr_client_sync_configure(k.c, &sc, 0, NULL), 0);
    uint64_t k0 = key_on(0, 2, 1), k1 = key_on(1, 2, 1);
    uint64_t want[2] = {0, 0}, t0[2], t1[2], step = 9;
    assert_int_equal(gr_client_sync_acquire(k.c, 0, want, 1000, t0, &step), 0);
    assert_true(step == 0 && t0[0] == 0 && t0[1] == 0);
    assert_int_equal(gr_client_sync_acquire(k.c, 1, want, 1000, t1, NULL), 0);
    /* Worker 0 touches only shard 0's key (shard 1 gets an empty push), twice (summed). */
    uint64_t keys0[2] = {k0, k0};
    float g0[4] = {1, 2, 3, 4};
    gr_client_batch b0 = {1, 2, 2, keys0, NULL, g0, 0};
    float d0[3] = {1, 1, 1}, d1[3] = {3, 5, 7};
    gr_client_dense_grad dg0 = {"mlp", d0, 3}, dg1 = {"mlp", d1, 3};
    uint32_t out[2] = {9, 9};
    assert_int_equal(gr_client_push_step(k.c, 0, t0, &b0, 1, &dg0, 1, out), 0);
    assert_int_equal(out[0], GR_CLIENT_PUSH_STAGED);
    assert_int_equal(out[1], GR_CLIENT_PUSH_STAGED);
    /* Nothing applied yet. */
    float rows[4];
    uint64_t both[2] = {k0, k1};
    assert_int_equal(gr_client_pull(k.c, 1, 2, both, 2, rows), 0);
    for (int i = 0; i < 4; i++) assert_true(rows[i] == 0.0f);
    /* Worker 0's next acquire waits (parked on the shards) until worker 1 pushes. */
    uint64_t want1[2] = {t0[0] + 1, t0[1] + 1}, t0b[2];
    gr_client_op *acq;
    assert_int_equal(gr_client_sync_acquire_start(k.c, 0, want1, 5000, t0b, NULL, &acq), 0);
    assert_int_equal(gr_client_wait(acq, 100), GR_EAGAIN);
    uint64_t keys1[2] = {k0, k1};
    float g1[4] = {10, 20, 30, 40};
    gr_client_batch b1 = {1, 2, 2, keys1, NULL, g1, 0};
    assert_int_equal(gr_client_push_step(k.c, 1, t1, &b1, 1, &dg1, 1, out), 0);
    assert_int_equal(out[0], GR_CLIENT_PUSH_APPLIED);
    assert_int_equal(out[1], GR_CLIENT_PUSH_APPLIED);
    assert_int_equal(gr_client_wait(acq, 2000), 0);
    assert_true(t0b[0] == 1 && t0b[1] == 1);
    /* SGD lr 1 from zeros: row = -(sum of both workers' gradients) / 2. */
    assert_int_equal(gr_client_pull(k.c, 1, 2, both, 2, rows), 0);
    assert_true(rows[0] == -(1 + 3 + 10) / 2.0f && rows[1] == -(2 + 4 + 20) / 2.0f);
    assert_true(rows[2] == -30 / 2.0f && rows[3] == -40 / 2.0f);
    float dense[3];
    assert_int_equal(gr_client_dense_pull(k.c, "mlp", dense, 3), 0);
    assert_true(dense[0] == -2.0f && dense[1] == -3.0f && dense[2] == -4.0f);
    /* A repeated push of step 0 is a duplicate, applied nowhere. */
    assert_int_equal(gr_client_push_step(k.c, 1, t1, &b1, 1, NULL, 0, out), 0);
    assert_int_equal(out[0], GR_CLIENT_PUSH_DUPLICATE);
    /* DENSE_SET overwrites the values. */
    float init[3] = {0.5f, -0.25f, 4};
    assert_int_equal(gr_client_dense_set(k.c, "mlp", init, 3), 0);
    gr_client_op *dp;
    assert_int_equal(gr_client_dense_pull_start(k.c, "mlp", dense, 3, &dp), 0);
    assert_int_equal(gr_client_wait(dp, -1), 0);
    assert_memory_equal(dense, init, sizeof init);
    assert_int_equal(gr_client_dense_set(k.c, "mlp", init, 2), GR_EDIM);
    /* Stats carry the sync counters. */
    char *js = NULL;
    assert_int_equal(gr_client_stats(k.c, 0, &js), 0);
    assert_non_null(strstr(js, "\"sync\":{\"job\":true"));
    assert_non_null(strstr(js, "\"applied_steps\":1"));
    assert_non_null(strstr(js, "\"duplicates\":1"));
    assert_non_null(strstr(js, "\"waits\":1"));
    free(js);
    down(&k);
}

static void test_semisync_drop_and_timeout(void **state)
{
    (void)state;
    cluster k;
    up(&k, 1, 2);
    gr_client_sync_config sc = {GR_CLIENT_SYNC_SEMISYNC, 3, 2, 0, 0};
    assert_int_equal(gr_client_sync_configure(k.c, &sc, 0, NULL), 0);
    uint64_t want[1] = {0}, t[3][1];
    for (int w = 0; w < 3; w++) assert_int_equal(gr_client_sync_acquire(k.c, w, want, 1000, t[w], NULL), 0);
    uint64_t key = 5;
    float g[2] = {2, 4};
    gr_client_batch b = {1, 2, 1, &key, NULL, g, 0};
    uint32_t out[1];
    assert_int_equal(gr_client_push_step(k.c, 0, t[0], &b, 1, NULL, 0, out), 0);
    assert_int_equal(out[0], GR_CLIENT_PUSH_STAGED);
    assert_int_equal(gr_client_push_step(k.c, 2, t[2], &b, 1, NULL, 0, out), 0);
    assert_int_equal(out[0], GR_CLIENT_PUSH_APPLIED); /* K = 2 of 3 */
    /* The backup's gradient for step 0 is now stale: dropped. */
    assert_int_equal(gr_client_push_step(k.c, 1, t[1], &b, 1, NULL, 0, out), 0);
    assert_int_equal(out[0], GR_CLIENT_PUSH_DROPPED);
    /* The backup asks for step 1 (its tag + 1) and is told to tag with G = 1. */
    uint64_t w1[1] = {1}, t1[1];
    assert_int_equal(gr_client_sync_acquire(k.c, 1, w1, 1000, t1, NULL), 0);
    assert_true(t1[0] == 1);
    /* Worker 0 asks for step 1 and gets it; step 2 needs two more gradients: timeout names
     * what it waits for. */
    uint64_t w2[1] = {2}, t2[1];
    assert_int_equal(gr_client_push_step(k.c, 1, t1, &b, 1, NULL, 0, out), 0);
    uint64_t start = gr_now_ns();
    assert_int_equal(gr_client_sync_acquire(k.c, 0, w2, 300, t2, NULL), GR_ETIMEDOUT);
    double secs = (double)(gr_now_ns() - start) / 1e9;
    /* Upper bound: the 300 ms acquire timeout was honoured (loose: load delays wakeups). */
    assert_true(secs >= 0.25 && secs < 10.0);
    assert_non_null(strstr(gr_errmsg(), "1 of 2 gradients"));
    assert_non_null(strstr(gr_errmsg(), "shard 0"));
    float row[2];
    assert_int_equal(gr_client_pull(k.c, 1, 2, &key, 1, row), 0);
    assert_true(row[0] == -2.0f && row[1] == -4.0f); /* one step: mean of two equal pushes */
    char *js = NULL;
    assert_int_equal(gr_client_stats(k.c, 0, &js), 0);
    assert_non_null(strstr(js, "\"dropped\":1"));
    free(js);
    down(&k);
}

/* One server thread, three workers parked in acquires: pushes still run (waits hold no pool
 * thread), and the step they complete releases all three. Stopping the server answers parked
 * acquires at once. */
static void test_parked_acquires_hold_no_thread(void **state)
{
    (void)state;
    cluster k;
    up(&k, 1, 1);
    gr_client_sync_config sc = {GR_CLIENT_SYNC_SYNC, 4, 0, 0, 0};
    assert_int_equal(gr_client_sync_configure(k.c, &sc, 0, NULL), 0);
    uint64_t want0[1] = {0}, want1[1] = {1}, tags[4][1];
    uint64_t key = 77;
    float g[2] = {1, 1};
    gr_client_batch b = {1, 2, 1, &key, NULL, g, 0};
    for (int w = 0; w < 4; w++) assert_int_equal(gr_client_sync_acquire(k.c, w, want0, 1000, tags[w], NULL), 0);
    gr_client_op *ops[3];
    uint64_t next[3][1];
    for (int w = 0; w < 3; w++) {
        assert_int_equal(gr_client_push_step(k.c, w, tags[w], &b, 1, NULL, 0, NULL), 0);
        assert_int_equal(gr_client_sync_acquire_start(k.c, w, want1, 5000, next[w], NULL, &ops[w]), 0);
    }
    for (int w = 0; w < 3; w++) assert_int_equal(gr_client_wait(ops[w], 30), GR_EAGAIN);
    /* The single pool thread is free: a pull and the fourth push run. */
    float row[2];
    assert_int_equal(gr_client_pull(k.c, 1, 2, &key, 1, row), 0);
    assert_int_equal(gr_client_push_step(k.c, 3, tags[3], &b, 1, NULL, 0, NULL), 0);
    for (int w = 0; w < 3; w++) {
        assert_int_equal(gr_client_wait(ops[w], 2000), 0);
        assert_true(next[w][0] == 1);
    }
    /* Park one more, then stop the server: the acquire fails promptly, it does not hang. */
    uint64_t want2[1] = {2};
    gr_client_op *last;
    assert_int_equal(gr_client_sync_acquire_start(k.c, 0, want2, 60000, next[0], NULL, &last), 0);
    assert_int_equal(gr_client_wait(last, 30), GR_EAGAIN);
    uint64_t start = gr_now_ns();
    assert_int_equal(gr_server_stop(k.s[0]), 0);
    int rc = gr_client_wait(last, -1);
    assert_true(rc == GR_ESHUTDOWN || rc == GR_ECONN);
    /* Not the acquire's 60 s (loose: a stop under load and sanitizers takes a while). */
    assert_true((double)(gr_now_ns() - start) / 1e9 < 30.0);
    down(&k);
}

/* A reset wakes the old job's waiters with an error. */
static void test_reset_wakes_waiters(void **state)
{
    (void)state;
    cluster k;
    up(&k, 2, 2);
    gr_client_sync_config sc = {GR_CLIENT_SYNC_SYNC, 2, 0, 0, 0};
    assert_int_equal(gr_client_sync_configure(k.c, &sc, 0, NULL), 0);
    uint64_t want[2] = {1, 1}, tags[2];
    gr_client_op *op;
    assert_int_equal(gr_client_sync_acquire_start(k.c, 0, want, 60000, tags, NULL, &op), 0);
    assert_int_equal(gr_client_wait(op, 30), GR_EAGAIN);
    assert_int_equal(gr_client_sync_configure(k.c, NULL, GR_CLIENT_SYNC_CLEAR, NULL), 0);
    assert_int_equal(gr_client_wait(op, 3000), GR_ESHUTDOWN);
    assert_non_null(strstr(gr_errmsg(), "cleared"));
    down(&k);
}

/* A shard process killed while a worker waits on it: the wait ends with an error naming it. */
static void test_killed_shard_is_an_error(void **state)
{
    (void)state;
    ps_test_server srv[2];
    char list[256];
    assert_int_equal(ps_test_cluster_start(srv, 2, NULL, list, sizeof list), 0);
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = list;
    cc.request_timeout_ms = 10000;
    cc.connect_timeout_ms = 500;
    gr_client *c;
    assert_int_equal(gr_client_create(&cc, &c), 0);
    assert_int_equal(gr_client_create_table(c, TABLE), 0);
    gr_client_sync_config sc = {GR_CLIENT_SYNC_SYNC, 2, 0, 0, 0};
    assert_int_equal(gr_client_sync_configure(c, &sc, 0, NULL), 0);
    uint64_t want[2] = {1, 1}, tags[2];
    gr_client_op *op;
    assert_int_equal(gr_client_sync_acquire_start(c, 0, want, 60000, tags, NULL, &op), 0);
    assert_int_equal(gr_client_wait(op, 50), GR_EAGAIN);
    uint64_t start = gr_now_ns();
    assert_true(ps_test_server_stop(&srv[1], SIGKILL) == 128 + SIGKILL);
    int rc = gr_client_wait(op, -1);
    assert_true(rc == GR_ECONN || rc == GR_ESHUTDOWN);
    assert_non_null(strstr(gr_errmsg(), "shard"));
    /* Not the acquire's 60 s nor the 10 s request timeout: the kill was noticed. */
    assert_true((double)(gr_now_ns() - start) / 1e9 < 9.0);
    /* The next call on the dead shard fails too (after the short connect timeout). */
    uint64_t want0[2] = {0, 0};
    assert_true(gr_client_sync_acquire(c, 1, want0, 1000, tags, NULL) < 0);
    gr_client_destroy(c);
    ps_test_server_stop(&srv[0], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_rules),
        cmocka_unit_test(test_sync_step_sparse_and_dense),
        cmocka_unit_test(test_semisync_drop_and_timeout),
        cmocka_unit_test(test_parked_acquires_hold_no_thread),
        cmocka_unit_test(test_reset_wakes_waiters),
        cmocka_unit_test(test_killed_shard_is_an_error),
    };
    return cmocka_run_group_tests_name("train_ps_sync", tests, NULL, NULL);
}
