/* Integration: training in every mode over the parameter server on generated data.
 *  - async and ssp converge to a test AUC well above 0.5 (embedded 2-shard cluster);
 *  - semisync with a 3x straggler finishes, drops the straggler's stale gradients, and every
 *    applied step carries K gradients (the global batch is fixed) but the tail's;
 *  - a worker that stops pushing in sync mode ends the run with a timeout naming the step
 *    and the missing gradients, within the sync timeout, not a hang;
 *  - a shard process killed mid-run ends it with an error naming the shard, within seconds;
 *  - `granary train` writes the metrics file (and refuses bad flag combinations), and against
 *    running servers holding another job refuses to start unless --sync-reset. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "granary/cluster.h"
#include "granary/client.h"
#include "granary/train.h"
#include "tests/support/ps_harness.h"
#include "tests/support/train_fixture.h"

static tr_fixture fx;

static int setup(void **state)
{
    (void)state;
    return tr_fixture_make(&fx, "trainmodes", 5);
}

static int teardown(void **state)
{
    (void)state;
    return tr_fixture_remove(&fx);
}

/* A small DLRM: fast enough for tests, big enough to learn the generated data. */
static void small_opts(gr_train_opts *o, gr_train_mode mode, unsigned workers)
{
    tr_fixture_small_dlrm(&fx, o, mode, workers);
}

typedef struct ps_run {
    gr_local_cluster *cl;
    gr_client *client;
    gr_train_backend be;
} ps_run;

static void ps_up(ps_run *p, const char *servers, gr_train_mode mode, unsigned workers,
                  uint32_t k, uint32_t staleness, uint32_t timeout_ms)
{
    memset(p, 0, sizeof *p);
    if (!servers) {
        assert_int_equal(gr_local_cluster_start(2, 2, &p->cl), 0);
        servers = gr_local_cluster_servers(p->cl);
    }
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = servers;
    cc.connect_timeout_ms = 1000;
    assert_int_equal(gr_client_create(&cc, &p->client), 0);
    gr_ps_backend_opts po;
    gr_ps_backend_opts_default(&po);
    po.client = p->client;
    po.mode = mode;
    po.workers = workers;
    po.aggregate = k;
    po.staleness = staleness;
    po.timeout_ms = timeout_ms;
    assert_int_equal(gr_ps_backend_create(&po, &p->be), 0);
}

static void ps_down(ps_run *p)
{
    gr_train_backend_destroy(&p->be);
    gr_client_destroy(p->client);
    gr_local_cluster_stop(p->cl);
}

static void test_async_and_ssp_converge(void **state)
{
    (void)state;
    gr_train_mode modes[2] = {GR_MODE_ASYNC, GR_MODE_SSP};
    for (int i = 0; i < 2; i++) {
        ps_run p;
        ps_up(&p, NULL, modes[i], 2, 0, 2, 20000);
        gr_train_opts o;
        small_opts(&o, modes[i], 2);
        gr_train_result r;
        int rc = gr_train_run(&o, &p.be, &r);
        if (rc) fprintf(stderr, "%s: %s\n", gr_train_mode_name(modes[i]), gr_errmsg());
        assert_int_equal(rc, 0);
        fprintf(stderr, "%s: AUC %.4f logloss %.4f, %.0f examples/s\n", gr_train_mode_name(modes[i]),
                r.test_auc, r.test_logloss, r.examples_per_sec);
        assert_int_equal(r.examples, 40000);
        assert_int_equal(r.test_examples, 5000);
        assert_true(r.test_auc > 0.66);
        /* Logloss lags AUC in a run this short (the output bias starts at p = 0.5). */
        assert_true(r.test_logloss < 0.6);
        gr_ps_backend_finish(&p.be);
        ps_down(&p);
    }
}

/* Reads a number from shard s's "sync" stats. */
static double sync_stat(gr_client *c, uint32_t s, const char *key)
{
    char *txt = NULL;
    assert_int_equal(gr_client_stats(c, s, &txt), 0);
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "sync"), key);
    assert_true(cJSON_IsNumber(v));
    double d = v->valuedouble;
    cJSON_Delete(root);
    return d;
}

static void test_semisync_straggler(void **state)
{
    (void)state;
    const unsigned N = 3, K = 2;
    ps_run p;
    ps_up(&p, NULL, GR_MODE_SEMISYNC, N, K, 0, 20000);
    gr_train_opts o;
    small_opts(&o, GR_MODE_SEMISYNC, N);
    o.straggler = 2;
    o.straggler_factor = 3;
    gr_train_result r;
    int rc = gr_train_run(&o, &p.be, &r);
    if (rc) fprintf(stderr, "semisync: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    fprintf(stderr, "semisync K=2 of 3, worker 2 x3: AUC %.4f, %llu dropped, steps %llu/%llu/%llu\n",
            r.test_auc, (unsigned long long)r.dropped_gradients,
            (unsigned long long)r.worker_steps[0], (unsigned long long)r.worker_steps[1],
            (unsigned long long)r.worker_steps[2]);
    assert_int_equal(r.examples, 40000); /* shared chunks: everything was read and computed */
    assert_true(r.dropped_gradients > 0);
    /* Every worker, the straggler included, ran steps. How many each ran depends on the
     * scheduler (the straggler's sleep is scaled by its own compute time), so no order between
     * them is asserted: the counts below are exact whatever the machine's speed. */
    for (unsigned w = 0; w < N; w++) assert_true(r.worker_steps[w] > 0);
    assert_true(r.test_auc > 0.62);
    for (uint32_t s = 0; s < 2; s++) {
        double applied = sync_stat(p.client, s, "applied_steps");
        double admitted = sync_stat(p.client, s, "admitted");
        double shorts = sync_stat(p.client, s, "short_steps");
        double dropped = sync_stat(p.client, s, "dropped");
        /* Every step but the short ones at the very end (once fewer than K workers remained;
         * how many depends on when each worker ran out of data) applied exactly K gradients:
         * a fixed global batch of K x 256 examples. */
        assert_true(shorts < applied);
        assert_true(admitted >= K * (applied - shorts) + shorts);
        assert_true(admitted <= K * (applied - shorts) + shorts * (K - 1));
        assert_true(applied > 30);
        /* A full step leaves at most N - K pushes of its step to drop, a short one none. */
        assert_true(dropped > 0);
        assert_true(dropped <= (N - K) * (applied - shorts));
        /* Every push was admitted or dropped: N workers' steps in all. */
        double steps = (double)(r.worker_steps[0] + r.worker_steps[1] + r.worker_steps[2]);
        assert_true(admitted + dropped == steps);
    }
    gr_ps_backend_finish(&p.be);
    ps_down(&p);
}

/* A backend wrapper whose worker 1 stops pushing after 3 steps (it keeps acquiring). */
typedef struct stuck_ctx {
    gr_train_backend inner;
    atomic_int pushes1;
} stuck_ctx;

static int stuck_push_step(void *ctx, uint32_t worker, uint64_t token, uint32_t table,
                           const uint64_t *keys, size_t n, const float *grads, const char *dense,
                           const float *dgrad, size_t dn, bool *dropped)
{
    stuck_ctx *s = ctx;
    if (worker == 1 && atomic_fetch_add(&s->pushes1, 1) >= 3) {
        *dropped = false;
        return GR_OK; /* pretends: its gradient never reaches the shards */
    }
    return s->inner.steps->push(s->inner.ctx, worker, token, table, keys, n, grads, dense, dgrad,
                                dn, dropped);
}

#define FWD(name, sig, args)                                                                 \
    static int stuck_##name sig                                                              \
    {                                                                                        \
        stuck_ctx *s = ctx;                                                                  \
        return s->inner.name args;                                                           \
    }
/* The same for a step call. */
#define FWDS(name, sig, args)                                                                \
    static int stuck_##name sig                                                              \
    {                                                                                        \
        stuck_ctx *s = ctx;                                                                  \
        return s->inner.steps->name args;                                                    \
    }
FWD(table_init, (void *ctx, const gr_table_spec *spec), (s->inner.ctx, spec))
FWD(pull, (void *ctx, uint32_t t, const uint64_t *k, size_t n, float *r, unsigned f),
    (s->inner.ctx, t, k, n, r, f))
FWD(push, (void *ctx, uint32_t t, const uint64_t *k, size_t n, const float *g), (s->inner.ctx, t, k, n, g))
FWD(dense_init, (void *ctx, const char *nm, const float *v, size_t n), (s->inner.ctx, nm, v, n))
FWD(dense_pull, (void *ctx, const char *nm, float *v, size_t n), (s->inner.ctx, nm, v, n))
FWD(dense_push, (void *ctx, const char *nm, const float *v, size_t n), (s->inner.ctx, nm, v, n))
FWD(dense_pull_start, (void *ctx, const char *nm, float *v, size_t n, void **op),
    (s->inner.ctx, nm, v, n, op))
FWD(dense_push_start, (void *ctx, const char *nm, const float *v, size_t n, void **op),
    (s->inner.ctx, nm, v, n, op))
FWD(op_wait, (void *ctx, void *op), (s->inner.ctx, op))
FWD(ckpt_save, (void *ctx, gr_train_ckpt *k), (s->inner.ctx, k))
FWD(ckpt_load, (void *ctx, const char *r, const char *nm, gr_train_ckpt *k), (s->inner.ctx, r, nm, k))
FWDS(begin, (void *ctx, uint32_t w, uint64_t *t), (s->inner.ctx, w, t))
FWDS(fetch, (void *ctx, uint32_t t, const uint64_t *k, size_t n, float *r, const char *d, float *p, size_t np),
    (s->inner.ctx, t, k, n, r, d, p, np))
FWDS(leave, (void *ctx, uint32_t w), (s->inner.ctx, w))
static void stuck_cancel(void *ctx)
{
    stuck_ctx *s = ctx;
    s->inner.steps->cancel(s->inner.ctx);
}
static void stuck_destroy(void *ctx) { (void)ctx; }

static void test_stuck_worker_times_out(void **state)
{
    (void)state;
    ps_run p;
    ps_up(&p, NULL, GR_MODE_SYNC, 2, 0, 0, 1500);
    stuck_ctx sc = {.inner = p.be};
    static const gr_train_steps steps = {stuck_begin, stuck_fetch, stuck_push_step, stuck_leave,
                                         stuck_cancel};
    gr_train_backend be = {.ctx = &sc, .table_init = stuck_table_init, .pull = stuck_pull,
                           .push = stuck_push, .dense_init = stuck_dense_init,
                           .dense_pull = stuck_dense_pull, .dense_push = stuck_dense_push,
                           .dense_pull_start = stuck_dense_pull_start,
                           .dense_push_start = stuck_dense_push_start, .op_wait = stuck_op_wait,
                           .ckpt_save = stuck_ckpt_save, .ckpt_load = stuck_ckpt_load,
                           .destroy = stuck_destroy, .checkpoints = true, .steps = &steps};
    gr_train_opts o;
    small_opts(&o, GR_MODE_SYNC, 2);
    gr_train_result r;
    uint64_t t0 = gr_now_ns();
    int rc = gr_train_run(&o, &be, &r);
    double secs = (double)(gr_now_ns() - t0) / 1e9;
    fprintf(stderr, "stuck worker: rc %d after %.1f s: %s\n", rc, secs, gr_errmsg());
    assert_int_equal(rc, GR_ETIMEDOUT);
    assert_non_null(strstr(gr_errmsg(), "timed out after 1500 ms waiting for step 4"));
    assert_non_null(strstr(gr_errmsg(), "1 of 2 gradients"));
    /* The 1.5 s step timeout ended it, not the 30 s request timeout (loose: load). */
    assert_true(secs < 18);
    ps_down(&p);
}

typedef struct bg_train {
    gr_train_opts o;
    gr_train_backend *be;
    gr_train_result r;
    int rc;
    char msg[600];
} bg_train;

static void *bg_main(void *arg)
{
    bg_train *b = arg;
    b->rc = gr_train_run(&b->o, b->be, &b->r);
    snprintf(b->msg, sizeof b->msg, "%s", gr_errmsg());
    return NULL;
}

static void test_killed_shard_fails_the_run(void **state)
{
    (void)state;
    ps_test_server srv[2];
    char list[256];
    assert_int_equal(ps_test_cluster_start(srv, 2, NULL, list, sizeof list), 0);
    ps_run p;
    ps_up(&p, list, GR_MODE_SYNC, 2, 0, 0, 30000);
    bg_train b;
    memset(&b, 0, sizeof b);
    small_opts(&b.o, GR_MODE_SYNC, 2);
    b.o.batch = 64;
    b.o.epochs = 5; /* far longer than the test waits */
    b.be = &p.be;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, bg_main, &b), 0);
    /* Wait until steps are being applied, then kill shard 1. */
    uint64_t deadline = gr_now_ns() + 20000000000ull;
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = list;
    gr_client *watch;
    assert_int_equal(gr_client_create(&cc, &watch), 0);
    char *txt = NULL;
    while (gr_now_ns() < deadline) {
        if (gr_client_stats(watch, 0, &txt) == 0 && strstr(txt, "\"applied_steps\":") &&
            !strstr(txt, "\"applied_steps\":0,") && !strstr(txt, "\"applied_steps\":1,")) {
            free(txt);
            break;
        }
        free(txt);
        txt = NULL;
        gr_sleep_ms(20);
    }
    gr_client_destroy(watch);
    uint64_t t0 = gr_now_ns();
    assert_true(ps_test_server_stop(&srv[1], SIGKILL) == 128 + SIGKILL);
    pthread_join(th, NULL);
    double secs = (double)(gr_now_ns() - t0) / 1e9;
    fprintf(stderr, "killed shard: rc %d after %.1f s: %s\n", b.rc, secs, b.msg);
    assert_true(b.rc == GR_ECONN || b.rc == GR_ESHUTDOWN);
    assert_non_null(strstr(b.msg, "shard 1"));
    /* The kill was noticed, not the 30 s timeout waited out (loose: load). */
    assert_true(secs < 25);
    ps_down(&p);
    ps_test_server_stop(&srv[0], 0);
}

static void test_cli_metrics(void **state)
{
    (void)state;
    char metrics[160], out[8192];
    snprintf(metrics, sizeof metrics, "%s/m.json", fx.dir);
    const char *args[] = {"train", "--train", fx.train, "--test", fx.test, "--mode", "semisync",
                          "--workers", "3", "--backup", "1", "--batch", "512", "--dim", "8",
                          "--bottom", "16", "--top", "32", "--progress", "0", "--metrics-out",
                          metrics, NULL};
    int rc = ps_test_run_granary(args, out, sizeof out);
    if (rc) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    char *txt = NULL;
    assert_int_equal(gr_read_file(metrics, &txt, NULL), 0);
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    assert_non_null(j);
    const char *keys[] = {"auc", "logloss", "examples_per_sec", "examples", "mode",
                          "dropped_gradients", "aggregate", "staleness", "shards", "sync"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        assert_non_null(cJSON_GetObjectItemCaseSensitive(j, keys[i]));
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "mode")->valuestring, "semisync");
    assert_int_equal((int)cJSON_GetObjectItemCaseSensitive(j, "aggregate")->valuedouble, 2);
    assert_int_equal((int)cJSON_GetObjectItemCaseSensitive(j, "examples")->valuedouble, 40000);
    /* The embedded cluster's default: one shard, reached by direct call. */
    assert_int_equal((int)cJSON_GetObjectItemCaseSensitive(j, "shards")->valuedouble, 1);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "direct")));
    /* With direct calls the pipeline is on only for fewer workers than CPUs. */
    cpu_set_t set;
    assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
    long cpus = CPU_COUNT(&set); /* the CPUs this process may run on */
    assert_int_equal(gr_train_default_pipeline(3, true), cpus > 3);
    assert_int_equal(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "pipeline")), cpus > 3);
    assert_true(cJSON_GetObjectItemCaseSensitive(j, "auc")->valuedouble > 0.6);
    cJSON_Delete(j);
    /* --pipeline asks for it whatever the rule says; --no-pipeline with it is refused. */
    const char *piped[] = {"train", "--train", fx.train, "--workers", "3", "--batch", "512",
                           "--dim", "8", "--bottom", "16", "--top", "32", "--progress", "0",
                           "--pipeline", "--metrics-out", metrics, NULL};
    rc = ps_test_run_granary(piped, out, sizeof out);
    if (rc) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    assert_int_equal(gr_read_file(metrics, &txt, NULL), 0);
    j = cJSON_Parse(txt);
    free(txt);
    assert_non_null(j);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "pipeline")));
    cJSON_Delete(j);
    const char *both[] = {"train", "--train", fx.train, "--pipeline", "--no-pipeline", NULL};
    assert_int_equal(ps_test_run_granary(both, out, sizeof out), 2);
    assert_non_null(strstr(out, "--pipeline and --no-pipeline contradict each other"));
    /* Without direct calls (remote shards, --no-direct) it is always on. */
    assert_true(gr_train_default_pipeline(256, false));
    assert_false(gr_train_default_pipeline(256, true));
    assert_true(gr_train_default_pipeline(1, true) == (cpus > 1));
    /* Bad combinations are refused before anything runs. */
    const char *bad1[] = {"train", "--train", fx.train, "--mode", "sync", "--local", NULL};
    assert_int_equal(ps_test_run_granary(bad1, out, sizeof out), 2);
    assert_non_null(strstr(out, "step tokens"));
    const char *bad2[] = {"train", "--train", fx.train, "--straggler", "5:3", NULL};
    assert_int_equal(ps_test_run_granary(bad2, out, sizeof out), 2);
    const char *bad3[] = {"train", "--train", fx.train, "--mode", "semisync", "--aggregate",
                          "2", "--backup", "1", NULL};
    assert_int_equal(ps_test_run_granary(bad3, out, sizeof out), 2);
}

/* `granary train --servers`: against running shards that hold another job it refuses to
 * start (naming both jobs) unless --sync-reset; after a run the job is cleared. */
static void test_cli_servers_and_reset(void **state)
{
    (void)state;
    ps_test_server srv[2];
    char list[256], out[8192], metrics[160];
    assert_int_equal(ps_test_cluster_start(srv, 2, NULL, list, sizeof list), 0);
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = list;
    gr_client *c;
    assert_int_equal(gr_client_create(&cc, &c), 0);
    gr_client_sync_config other = {GR_CLIENT_SYNC_SSP, 5, 0, 3, 0};
    assert_int_equal(gr_client_sync_configure(c, &other, 0, NULL), 0);
    snprintf(metrics, sizeof metrics, "%s/servers.json", fx.dir);
    const char *args[] = {"train", "--train", fx.train, "--test", fx.test, "--servers", list,
                          "--mode", "sync", "--batch", "1024", "--dim", "8", "--bottom", "16",
                          "--top", "32", "--progress", "0", "--metrics-out", metrics, NULL, NULL};
    assert_int_equal(ps_test_run_granary(args, out, sizeof out), 1);
    assert_non_null(strstr(out, "runs another sync job (mode ssp, 5 workers"));
    assert_non_null(strstr(out, "--sync-reset"));
    args[sizeof args / sizeof args[0] - 2] = "--sync-reset";
    int rc = ps_test_run_granary(args, out, sizeof out);
    if (rc) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    char *txt = NULL;
    assert_int_equal(gr_read_file(metrics, &txt, NULL), 0);
    assert_non_null(strstr(txt, "\"backend\":\t\"servers\""));
    assert_non_null(strstr(txt, "\"mode\":\t\"sync\""));
    free(txt);
    /* The run cleared its job: the shards are free for the next one. */
    for (uint32_t s = 0; s < 2; s++) {
        assert_int_equal(gr_client_stats(c, s, &txt), 0);
        assert_non_null(strstr(txt, "\"sync\":{\"job\":false"));
        free(txt);
    }
    gr_client_destroy(c);
    ps_test_cluster_stop(srv, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_async_and_ssp_converge),
        cmocka_unit_test(test_semisync_straggler),
        cmocka_unit_test(test_stuck_worker_times_out),
        cmocka_unit_test(test_killed_shard_fails_the_run),
        cmocka_unit_test(test_cli_metrics),
        cmocka_unit_test(test_cli_servers_and_reset),
    };
    return cmocka_run_group_tests_name("train_modes", tests, setup, teardown);
}
