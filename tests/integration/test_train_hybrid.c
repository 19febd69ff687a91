/* Integration: hybrid mode (dense parameters synchronous, embedding rows asynchronous with a
 * bounded staleness) over an embedded 2-shard cluster on generated data.
 *  - one worker, sequential: hybrid gives bitwise the AUC and logloss of sync (the same
 *    updates, the rows merely travel outside the step);
 *  - one worker, pipelined with bound 0 (rows its previous batch did not touch pulled while
 *    that batch computes, the rest after its push): bitwise the result without the pipeline;
 *  - two pipelined workers: every global step averaged both workers' dense gradients (each
 *    shard applied exactly as many steps as a worker took), nothing dropped, staleness 0 with
 *    the default bound, and the model learns;
 *  - the staleness bound holds: with a deep pipeline the prefetching fetch stage would run
 *    several batches ahead; bound B caps it at B, and B is reached;
 *  - with a dense lag of 1 (the default for 2 workers in granary train): two workers still
 *    average both workers' dense gradient in every step, each step alone; one worker gives
 *    bitwise the result of lag 0 (its own push completes each step);
 *  - `granary train` with 2 workers and no --mode trains hybrid with dense lag 1 and reports
 *    the per-stage times and the staleness in its metrics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/client.h"
#include "granary/cluster.h"
#include "granary/train.h"
#include "tests/support/ps_harness.h"
#include "tests/support/train_fixture.h"

static tr_fixture fx;

static int setup(void **state)
{
    (void)state;
    return tr_fixture_make(&fx, "trainhybrid", 11);
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

/* The dense lag of the backends ps_up makes (the library default, 0, unless a test says). */
static uint32_t dense_lag;

static void ps_up(ps_run *p, gr_train_mode mode, unsigned workers)
{
    memset(p, 0, sizeof *p);
    assert_int_equal(gr_local_cluster_start(2, 2, &p->cl), 0);
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = gr_local_cluster_servers(p->cl);
    assert_int_equal(gr_client_create(&cc, &p->client), 0);
    gr_ps_backend_opts po;
    gr_ps_backend_opts_default(&po);
    po.client = p->client;
    po.mode = mode;
    po.workers = workers;
    po.timeout_ms = 20000;
    po.dense_lag = dense_lag;
    assert_int_equal(gr_ps_backend_create(&po, &p->be), 0);
}

static void ps_down(ps_run *p)
{
    gr_ps_backend_finish(&p->be);
    gr_train_backend_destroy(&p->be);
    gr_client_destroy(p->client);
    gr_local_cluster_stop(p->cl);
}

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

static void run_one(gr_train_mode mode, unsigned workers, bool pipeline, uint32_t bound,
                    unsigned depth, gr_train_result *r, double *applied)
{
    ps_run p;
    ps_up(&p, mode, workers);
    gr_train_opts o;
    small_opts(&o, mode, workers);
    o.pipeline = pipeline;
    o.emb_staleness = bound;
    o.queue_depth = depth;
    int rc = gr_train_run(&o, &p.be, r);
    if (rc) fprintf(stderr, "%s: %s\n", gr_train_mode_name(mode), gr_errmsg());
    assert_int_equal(rc, 0);
    fprintf(stderr, "%s x%u%s bound %u: AUC %.5f logloss %.5f, staleness max %llu mean %.2f\n",
            gr_train_mode_name(mode), workers, pipeline ? " pipelined" : "", bound, r->test_auc,
            r->test_logloss, (unsigned long long)r->emb_staleness_max, r->emb_staleness_mean);
    if (applied)
        for (uint32_t s = 0; s < 2; s++) applied[s] = sync_stat(p.client, s, "applied_steps");
    ps_down(&p);
}

static void test_one_worker_matches_sync(void **state)
{
    (void)state;
    gr_train_result rs, rh;
    run_one(GR_MODE_SYNC, 1, false, 0, 1, &rs, NULL);
    run_one(GR_MODE_HYBRID, 1, false, 0, 1, &rh, NULL);
    assert_true(rs.test_auc == rh.test_auc);
    assert_true(rs.test_logloss == rh.test_logloss);
    assert_int_equal(rh.steps, rs.steps);
    assert_int_equal(rh.emb_staleness_max, 0);
}

/* With bound 0 a pipelined worker pulls the rows its previous batch did not touch while that
 * batch computes, and the others (with the dense parameters) only after its push. One worker
 * then reads exactly what it reads without the pipeline: a row pulled too early (before the
 * push that changes it) would change the result. */
static void test_one_worker_pipelined_matches_sequential(void **state)
{
    (void)state;
    gr_train_result rs, rp;
    run_one(GR_MODE_HYBRID, 1, false, 0, 1, &rs, NULL);
    run_one(GR_MODE_HYBRID, 1, true, 0, 1, &rp, NULL);
    assert_int_equal(rp.steps, rs.steps);
    assert_true(rs.test_auc == rp.test_auc);
    assert_true(rs.test_logloss == rp.test_logloss);
    assert_int_equal(rp.emb_staleness_max, 0);
}

static void test_two_workers_dense_sync(void **state)
{
    (void)state;
    gr_train_result r;
    double applied[2];
    run_one(GR_MODE_HYBRID, 2, true, 0, 1, &r, applied);
    /* Static ranges: 20000 rows each, 79 batches of 256 (the last short). */
    assert_int_equal(r.examples, 40000);
    assert_int_equal(r.worker_steps[0], 79);
    assert_int_equal(r.worker_steps[1], 79);
    /* Every step of the sync job took both workers' dense gradient: 79 applied steps on
     * each shard (the dense-only step pushes reach every shard), none dropped. */
    assert_true(applied[0] == 79 && applied[1] == 79);
    assert_int_equal(r.dropped_gradients, 0);
    assert_int_equal(r.emb_staleness_bound, 0);
    assert_int_equal(r.emb_staleness_max, 0);
    assert_true(r.test_auc > 0.66);
    /* Every stage was timed. */
    assert_true(r.read_seconds > 0 && r.pull_seconds > 0 && r.compute_seconds > 0 &&
                r.push_seconds > 0);
}

static void test_dense_lag(void **state)
{
    (void)state;
    gr_train_result r0, r1;
    run_one(GR_MODE_HYBRID, 1, true, 0, 1, &r0, NULL);
    dense_lag = 1;
    run_one(GR_MODE_HYBRID, 1, true, 0, 1, &r1, NULL);
    assert_int_equal(r1.steps, r0.steps);
    assert_true(r0.test_auc == r1.test_auc);
    assert_true(r0.test_logloss == r1.test_logloss);
    gr_train_result r;
    double applied[2];
    run_one(GR_MODE_HYBRID, 2, true, 0, 1, &r, applied);
    dense_lag = 0;
    assert_int_equal(r.examples, 40000);
    assert_int_equal(r.worker_steps[0], 79);
    assert_int_equal(r.worker_steps[1], 79);
    /* Every step still took both workers' gradient (79 steps, none short or dropped). */
    assert_true(applied[0] == 79 && applied[1] == 79);
    assert_int_equal(r.dropped_gradients, 0);
    assert_int_equal(r.emb_staleness_max, 0);
    assert_true(r.test_auc > 0.66);
}

static void test_staleness_bound(void **state)
{
    (void)state;
    for (uint32_t bound = 1; bound <= 3; bound += 2) {
        gr_train_result r;
        run_one(GR_MODE_HYBRID, 2, true, bound, 4, &r, NULL);
        /* Depth 4 lets the fetch stage run up to 3 * 4 + 3 batches ahead of the pushes; the
         * bound stops it at `bound`, which the slow compute stage makes it reach. */
        assert_int_equal(r.emb_staleness_bound, bound);
        assert_int_equal(r.emb_staleness_max, bound);
        assert_true(r.emb_staleness_mean > 0 && r.emb_staleness_mean <= bound);
        assert_true(r.test_auc > 0.6);
    }
}

/* With a straggler the other worker waits for every step's token: the time shows in
 * wait_seconds (the existing key: time in the step calls' begin) and in the wait stage. */
static void test_token_wait_is_counted(void **state)
{
    (void)state;
    ps_run p;
    ps_up(&p, GR_MODE_HYBRID, 2);
    gr_train_opts o;
    small_opts(&o, GR_MODE_HYBRID, 2);
    o.max_examples = 256 * 20;
    o.straggler = 1;
    o.straggler_factor = 3;
    gr_train_result r;
    assert_int_equal(gr_train_run(&o, &p.be, &r), 0);
    fprintf(stderr, "straggler: wait_seconds %.3f, wait stage %.3f, compute %.3f\n",
            r.wait_seconds, r.stage_wait_seconds, r.compute_seconds);
    assert_true(r.wait_seconds > 0);
    assert_true(r.stage_wait_seconds >= r.wait_seconds);
    ps_down(&p);
}

static void test_cli_default_is_hybrid(void **state)
{
    (void)state;
    char metrics[160], out[8192];
    snprintf(metrics, sizeof metrics, "%s/m.json", fx.dir);
    const char *args[] = {"train", "--train", fx.train, "--test", fx.test, "--workers", "2",
                          "--batch", "512", "--dim", "8", "--bottom", "16", "--top", "32",
                          "--progress", "0", "--metrics-out", metrics, NULL};
    int rc = ps_test_run_granary(args, out, sizeof out);
    if (rc) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    char *txt = NULL;
    assert_int_equal(gr_read_file(metrics, &txt, NULL), 0);
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(j, "mode")->valuestring, "hybrid");
    assert_int_equal((int)cJSON_GetObjectItemCaseSensitive(j, "emb_staleness_bound")->valuedouble, 0);
    assert_int_equal((int)cJSON_GetObjectItemCaseSensitive(j, "emb_staleness_max")->valuedouble, 0);
    /* Two workers: the dense step runs one behind by default. */
    assert_int_equal((int)cJSON_GetObjectItemCaseSensitive(j, "dense_lag")->valuedouble, 1);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "stage_seconds");
    const char *stages[] = {"read", "pull", "compute", "push", "wait"};
    for (int i = 0; i < 5; i++)
        assert_true(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(st, stages[i])));
    assert_true(cJSON_GetObjectItemCaseSensitive(st, "compute")->valuedouble > 0);
    assert_true(cJSON_GetObjectItemCaseSensitive(j, "auc")->valuedouble > 0.6);
    cJSON_Delete(j);
    /* One worker: async (nothing to synchronise). */
    const char *one[] = {"train", "--train", fx.train, "--workers", "1", "--batch", "512",
                         "--dim", "8", "--bottom", "16", "--top", "32", "--progress", "0",
                         "--max-examples", "2048", NULL};
    assert_int_equal(ps_test_run_granary(one, out, sizeof out), 0);
    assert_non_null(strstr(out, "mode async"));
    const char *bad[] = {"train", "--train", fx.train, "--emb-staleness", "65", NULL};
    assert_int_equal(ps_test_run_granary(bad, out, sizeof out), 2);
    const char *lag_bad[] = {"train", "--train", fx.train, "--dense-lag", "65", NULL};
    assert_int_equal(ps_test_run_granary(lag_bad, out, sizeof out), 2);
    assert_non_null(strstr(out, "dense-lag"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_worker_matches_sync),
        cmocka_unit_test(test_one_worker_pipelined_matches_sequential),
        cmocka_unit_test(test_two_workers_dense_sync),
        cmocka_unit_test(test_dense_lag),
        cmocka_unit_test(test_staleness_bound),
        cmocka_unit_test(test_token_wait_is_counted),
        cmocka_unit_test(test_cli_default_is_hybrid),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
