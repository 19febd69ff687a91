/* Integration: what the sync modes compute, end to end through the trainer, the
 * parameter-server backend and an embedded cluster of 2 shards.
 *  - sync with W workers and batch b equals one worker with batch W*b fed the same examples in
 *    the same steps, to a tight tolerance (why not bitwise: below);
 *  - semisync with K = N and staleness 0 equals sync bitwise on every final parameter;
 *  - a worker that runs out of data early leaves, and the others finish.
 * The data are fixed-width TSV lines, so byte ranges split them exactly into equal halves. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "granary/cluster.h"
#include "granary/client.h"
#include "granary/train.h"
#include "tests/support/train_fixture.h"

#define STEPS 8
#define B 32
#define W 2
#define THREE_LINES 487

static char tmpdir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/gr_trainsync_XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    char p[128];
    /* multi.tsv: worker w reads rows [w * STEPS * B, (w + 1) * STEPS * B). */
    snprintf(p, sizeof p, "%s/multi.tsv", tmpdir);
    FILE *m = fopen(p, "w");
    for (unsigned i = 0; i < W * STEPS * B; i++) tr_write_fixed_line(m, i, false);
    fclose(m);
    /* single.tsv: step t is worker 0's t-th batch followed by worker 1's t-th batch. */
    snprintf(p, sizeof p, "%s/single.tsv", tmpdir);
    FILE *s = fopen(p, "w");
    for (unsigned t = 0; t < STEPS; t++)
        for (unsigned w = 0; w < W; w++)
            for (unsigned k = 0; k < B; k++) tr_write_fixed_line(s, w * STEPS * B + t * B + k, false);
    fclose(s);
    /* three.tsv for 3 workers: the last 200 lines are wider, and ranges are cut by bytes, so
     * the last worker gets fewer lines (and steps) than the others and leaves first. */
    snprintf(p, sizeof p, "%s/three.tsv", tmpdir);
    FILE *u = fopen(p, "w");
    for (unsigned i = 0; i < THREE_LINES; i++) tr_write_fixed_line(u, 1000 + i, i >= THREE_LINES - 200);
    fclose(u);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

typedef struct run_cfg {
    const char *file;
    unsigned workers;
    size_t batch;
    gr_train_mode mode;
    uint32_t aggregate;
    bool sgd;        /* SGD everywhere (linear in the gradient) instead of Adagrad + Adam */
    bool pipeline;
} run_cfg;

/* Trains on an embedded 2-shard cluster and reads back every parameter. */
static void run(const run_cfg *c, const uint64_t *ids, size_t nids, tr_params *out,
                gr_train_result *res)
{
    gr_local_cluster *cl;
    assert_int_equal(gr_local_cluster_start(2, 2, &cl), 0);
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = gr_local_cluster_servers(cl);
    gr_client *client;
    assert_int_equal(gr_client_create(&cc, &client), 0);
    gr_ps_backend_opts po;
    gr_ps_backend_opts_default(&po);
    po.client = client;
    po.mode = c->mode;
    po.workers = c->workers;
    po.aggregate = c->aggregate;
    po.timeout_ms = 20000;
    if (c->sgd) {
        po.dense_opt = GR_DENSE_OPT_SGD;
        po.dense_lr = 0.05f;
    }
    gr_train_backend be;
    assert_int_equal(gr_ps_backend_create(&po, &be), 0);
    gr_train_opts o;
    gr_train_opts_default(&o, GR_MODEL_DLRM);
    o.model.dim = 4;
    o.model.n_bottom = 1;
    o.model.bottom[0] = 8;
    o.model.n_top = 1;
    o.model.top[0] = 8;
    o.emb.dim = 4;
    if (c->sgd) {
        o.emb.opt.kind = GR_OPT_SGD;
        o.emb.opt.lr = 0.1f;
    }
    o.train_path = c->file;
    o.workers = c->workers;
    o.batch = c->batch;
    o.mode = c->mode;
    o.pipeline = c->pipeline;
    o.progress_s = 0;
    o.data = GR_TRAIN_DATA_STATIC;
    int rc = gr_train_run(&o, &be, res);
    if (rc) fprintf(stderr, "train: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    assert_int_equal(tr_params_read(client, &o.model, ids, nids, 4, out), 0);
    gr_ps_backend_finish(&be);
    gr_train_backend_destroy(&be);
    gr_client_destroy(client);
    gr_local_cluster_stop(cl);
}

/* Largest |a - b| / (1 + |a|) over two parameter sets. */
static double max_rel_diff(const tr_params *a, const tr_params *b)
{
    double m = 0;
    assert_int_equal(a->nd, b->nd);
    assert_int_equal(a->nrows, b->nrows);
    for (size_t i = 0; i < a->nd; i++) {
        double d = fabs((double)a->dense[i] - b->dense[i]) / (1 + fabs((double)a->dense[i]));
        if (d > m) m = d;
    }
    for (size_t i = 0; i < a->nrows; i++) {
        double d = fabs((double)a->rows[i] - b->rows[i]) / (1 + fabs((double)a->rows[i]));
        if (d > m) m = d;
    }
    return m;
}

/* Sync, 2 workers x 32 vs one worker x 64 over the same 8 global batches. Not bitwise: the
 * same sums are formed in another order. The single worker's model sums 64 examples'
 * gradients in one sgemm and its client sums each id's occurrences over all 64; in sync each
 * worker sums its own 32 and the shard adds the two means and halves them. Float addition
 * is not associative, so results agree to rounding (measured ~1e-7 relative), and SGD keeps
 * them that close (an adaptive optimizer would too, but divides by tiny accumulators on rare
 * rows, which can magnify a 1-ulp difference). Async on the same data differs by far more
 * (each half-batch is applied as a full step), which shows the comparison has teeth. */
static void test_sync_equals_big_batch(void **state)
{
    (void)state;
    char multi[128], single[128];
    snprintf(multi, sizeof multi, "%s/multi.tsv", tmpdir);
    snprintf(single, sizeof single, "%s/single.tsv", tmpdir);
    uint64_t *ids;
    size_t nids = tr_file_ids(multi, &ids);
    assert_true(nids > 0);
    tr_params ps, p1, pa;
    gr_train_result rs, r1, ra;
    run_cfg sync2 = {multi, W, B, GR_MODE_SYNC, 0, true, true};
    run_cfg one = {single, 1, W * B, GR_MODE_SYNC, 0, true, false};
    run_cfg async2 = {multi, W, B, GR_MODE_ASYNC, 0, true, false};
    run(&sync2, ids, nids, &ps, &rs);
    run(&one, ids, nids, &p1, &r1);
    run(&async2, ids, nids, &pa, &ra);
    assert_int_equal(rs.examples, W * STEPS * B);
    assert_int_equal(r1.examples, W * STEPS * B);
    assert_int_equal(rs.worker_steps[0], STEPS);
    assert_int_equal(rs.worker_steps[1], STEPS);
    assert_int_equal(r1.steps, STEPS);
    double d_sync = max_rel_diff(&ps, &p1), d_async = max_rel_diff(&pa, &p1);
    fprintf(stderr, "sync W=2 vs one worker 2b: max rel diff %.3g; async: %.3g\n", d_sync, d_async);
    assert_true(d_sync <= 1e-5);
    assert_true(d_async > 1e-3);
    tr_params_fini(&ps);
    tr_params_fini(&p1);
    tr_params_fini(&pa);
    free(ids);
}

/* semisync with K = N and staleness 0 is sync: bitwise, with the default adaptive optimizers,
 * 3 workers, pipelined, and a last worker with less data than the others (it leaves first). */
static void test_semisync_full_equals_sync(void **state)
{
    (void)state;
    char three[128];
    snprintf(three, sizeof three, "%s/three.tsv", tmpdir);
    uint64_t *ids;
    size_t nids = tr_file_ids(three, &ids);
    assert_true(nids > 0);
    tr_params a, b;
    gr_train_result ra, rb;
    run_cfg sync3 = {three, 3, B, GR_MODE_SYNC, 0, false, true};
    run_cfg semi3 = {three, 3, B, GR_MODE_SEMISYNC, 3, false, true};
    run(&sync3, ids, nids, &a, &ra);
    run(&semi3, ids, nids, &b, &rb);
    assert_int_equal(ra.examples, THREE_LINES);
    assert_int_equal(rb.examples, ra.examples);
    assert_int_equal(rb.dropped_gradients, 0);
    /* The last worker had fewer steps: it left and the others went on without it. */
    assert_true(ra.worker_steps[2] < ra.worker_steps[0]);
    assert_int_equal(ra.worker_steps[2], rb.worker_steps[2]);
    assert_memory_equal(a.dense, b.dense, a.nd * sizeof(float));
    assert_memory_equal(a.rows, b.rows, a.nrows * sizeof(float));
    /* And training moved the dense parameters away from their initialisation. */
    gr_model_config mc;
    gr_model_config_default(&mc, GR_MODEL_DLRM);
    mc.dim = 4;
    mc.n_bottom = 1;
    mc.bottom[0] = 8;
    mc.n_top = 1;
    mc.top[0] = 8;
    gr_model *m;
    assert_int_equal(gr_model_create(&mc, &m), 0);
    float *init = malloc(a.nd * sizeof *init);
    gr_model_init_dense(m, init);
    size_t moved = 0;
    for (size_t i = 0; i < a.nd; i++) moved += init[i] != a.dense[i];
    assert_true(moved > a.nd / 2);
    free(init);
    gr_model_destroy(m);
    tr_params_fini(&a);
    tr_params_fini(&b);
    free(ids);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_equals_big_batch),
        cmocka_unit_test(test_semisync_full_equals_sync),
    };
    return cmocka_run_group_tests_name("train_sync", tests, setup, teardown);
}
