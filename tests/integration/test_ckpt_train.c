/* Integration: checkpoints in training, end to end through the trainer, the parameter-server
 * backend and embedded clusters.
 *  - sync, 2 workers, pipelined: a run of N steps with checkpoints every N/2 steps, and a run
 *    stopped at N/2 (max_steps) then resumed on a fresh cluster of another shard count, end
 *    with bitwise identical parameters (every row, the dense parameters) and the same test
 *    AUC and logloss; resuming from the uninterrupted run's middle checkpoint does too;
 *  - a worker with less data than the others (it leaves early) across a checkpoint;
 *  - async, semisync and ssp with shared chunks: checkpoints while workers run, and a resumed
 *    run reads exactly the examples the first one had not trained on;
 *  - refusals: a different batch size, nothing to resume (fresh start), the local backend;
 *  - hybrid with a dense lag of 1: the checkpoint barrier drains the step a worker may start
 *    early, so the checkpoint holds exactly the state after its step and restores bit for
 *    bit.
 * The data are fixed-width TSV lines, so byte ranges split them exactly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "granary/ckpt.h"
#include "granary/cluster.h"
#include "granary/client.h"
#include "granary/train.h"
#include "tests/support/ps_harness.h"
#include "tests/support/train_fixture.h"

#define B 32
#define STEPS 8 /* per worker in multi.tsv */
#define UNEVEN_LINES 487

static char tmp[128];

static void path_of(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", tmp, name);
}

static int setup(void **state)
{
    (void)state;
    if (!getenv("GRANARY_LOG")) gr_log_set_level(GR_LOG_WARN);
    if (ps_test_tmpdir(tmp, sizeof tmp)) return -1;
    char p[256];
    path_of(p, sizeof p, "multi.tsv");
    FILE *m = fopen(p, "w");
    for (unsigned i = 0; i < 2 * STEPS * B; i++) tr_write_fixed_line(m, i, false);
    fclose(m);
    path_of(p, sizeof p, "test.tsv");
    FILE *t = fopen(p, "w");
    for (unsigned i = 0; i < 300; i++) tr_write_fixed_line(t, 50000 + i, false);
    fclose(t);
    /* The last 200 lines are wider: byte ranges give the last of 3 workers fewer lines. */
    path_of(p, sizeof p, "uneven.tsv");
    FILE *u = fopen(p, "w");
    for (unsigned i = 0; i < UNEVEN_LINES; i++) tr_write_fixed_line(u, 1000 + i, i >= UNEVEN_LINES - 200);
    fclose(u);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    ps_test_rmdir(tmp);
    return 0;
}

typedef struct run_cfg {
    const char *file;
    unsigned workers, shards;
    gr_train_mode mode;
    bool pipeline;
    const char *ckpt_dir;
    uint64_t every, max_steps;
    const char *resume;
    size_t batch;
    uint32_t dense_lag;
} run_cfg;

static void model_opts(gr_train_opts *o)
{
    gr_train_opts_default(o, GR_MODEL_DLRM);
    o->model.dim = 4;
    o->model.n_bottom = 1;
    o->model.bottom[0] = 8;
    o->model.n_top = 1;
    o->model.top[0] = 8;
    o->emb.dim = 4;
}

/* Trains on a fresh embedded cluster; reads back every parameter when ids is not NULL. */
static int run(const run_cfg *c, const uint64_t *ids, size_t nids, tr_params *out,
               gr_train_result *res)
{
    gr_local_cluster *cl;
    assert_int_equal(gr_local_cluster_start(c->shards, 2, &cl), 0);
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
    po.dense_lag = c->dense_lag;
    po.timeout_ms = 20000;
    gr_train_backend be;
    assert_int_equal(gr_ps_backend_create(&po, &be), 0);
    gr_train_opts o;
    model_opts(&o);
    char test[256];
    path_of(test, sizeof test, "test.tsv");
    o.train_path = c->file;
    o.test_path = test;
    o.workers = c->workers;
    o.batch = c->batch ? c->batch : B;
    o.mode = c->mode;
    o.pipeline = c->pipeline;
    o.progress_s = 0;
    o.ckpt_dir = c->ckpt_dir;
    o.ckpt_every = c->every;
    o.max_steps = c->max_steps;
    o.resume = c->resume;
    int rc = gr_train_run(&o, &be, res);
    char msg[600];
    snprintf(msg, sizeof msg, "%s", rc ? gr_errmsg() : "");
    if (!rc && ids) assert_int_equal(tr_params_read(client, &o.model, ids, nids, 4, out), 0);
    gr_ps_backend_finish(&be);
    gr_train_backend_destroy(&be);
    gr_client_destroy(client);
    gr_local_cluster_stop(cl);
    if (rc) gr_seterr(rc, "%s", msg);
    return rc;
}

static void assert_params_equal(const tr_params *a, const tr_params *b)
{
    assert_int_equal(a->nd, b->nd);
    assert_int_equal(a->nrows, b->nrows);
    assert_memory_equal(a->dense, b->dense, a->nd * sizeof(float));
    assert_memory_equal(a->rows, b->rows, a->nrows * sizeof(float));
}

/* Sync, 2 workers, pipelined: uninterrupted vs stopped at the middle and resumed. */
static void test_sync_resume_is_exact(void **state)
{
    (void)state;
    char file[256], rootA[256], rootB[256];
    path_of(file, sizeof file, "multi.tsv");
    path_of(rootA, sizeof rootA, "syncA");
    path_of(rootB, sizeof rootB, "syncB");
    uint64_t *ids;
    size_t nids = tr_file_ids(file, &ids);
    assert_true(nids > 0);
    tr_params pa, pb, pc;
    gr_train_result ra, rb1, rb2, rc2;

    run_cfg a = {.file = file, .workers = 2, .shards = 2, .mode = GR_MODE_SYNC, .pipeline = true,
                 .ckpt_dir = rootA, .every = STEPS / 2};
    int rc = run(&a, ids, nids, &pa, &ra);
    if (rc) fprintf(stderr, "run A: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    assert_int_equal(ra.steps, 2 * STEPS);
    assert_int_equal(ra.ckpt_saves, 2); /* at step 4 and at the end (8) */
    assert_int_equal(ra.ckpt_failures, 0);
    assert_string_equal(ra.ckpt_last, "step-000000000008");
    char dir[300];
    snprintf(dir, sizeof dir, "%s/step-000000000004", rootA);
    assert_int_equal(gr_ckpt_verify(dir, true, NULL), 0);

    /* Stop at the middle (a clean stop at step 4 with its checkpoint)... */
    run_cfg b1 = a;
    b1.ckpt_dir = rootB;
    b1.max_steps = STEPS / 2;
    assert_int_equal(run(&b1, NULL, 0, NULL, &rb1), 0);
    assert_int_equal(rb1.steps, STEPS);
    assert_int_equal(rb1.ckpt_saves, 1);
    assert_string_equal(rb1.ckpt_last, "step-000000000004");
    /* ... and resume on a fresh cluster of 3 shards, to the end. */
    run_cfg b2 = a;
    b2.ckpt_dir = rootB;
    b2.shards = 3;
    b2.resume = rootB;
    rc = run(&b2, ids, nids, &pb, &rb2);
    if (rc) fprintf(stderr, "run B: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    assert_int_equal(rb2.resumed_step, STEPS / 2);
    assert_string_equal(rb2.resumed_from, "step-000000000004");
    assert_int_equal(rb2.steps, STEPS); /* the second half only */
    assert_int_equal(rb2.examples, STEPS * B);
    assert_string_equal(rb2.ckpt_last, "step-000000000008");
    assert_params_equal(&pa, &pb);
    assert_true(ra.test_auc > 0.5);
    assert_true(ra.test_auc == rb2.test_auc);
    assert_true(ra.test_logloss == rb2.test_logloss);
    fprintf(stderr, "sync: uninterrupted AUC %.9f logloss %.9f; resumed AUC %.9f logloss %.9f\n",
            ra.test_auc, ra.test_logloss, rb2.test_auc, rb2.test_logloss);

    /* Resuming from the uninterrupted run's middle checkpoint (a directory given directly),
     * sequential this time (the pipeline does not change what is computed). */
    run_cfg c2 = a;
    c2.ckpt_dir = NULL;
    c2.pipeline = false;
    c2.resume = dir;
    assert_int_equal(run(&c2, ids, nids, &pc, &rc2), 0);
    assert_int_equal(rc2.resumed_step, STEPS / 2);
    assert_params_equal(&pa, &pc);

    tr_params_fini(&pa);
    tr_params_fini(&pb);
    tr_params_fini(&pc);
    free(ids);
}

/* Three workers with 12, 11 and 9 batches: the last leaves before the checkpoint at step 10,
 * the second has one step after it; the resumed run must reproduce both. */
static void test_sync_resume_with_a_worker_that_left(void **state)
{
    (void)state;
    char file[256], root[256], root2[256];
    path_of(file, sizeof file, "uneven.tsv");
    path_of(root, sizeof root, "unevenA");
    path_of(root2, sizeof root2, "unevenB");
    uint64_t *ids;
    size_t nids = tr_file_ids(file, &ids);
    assert_true(nids > 0);
    tr_params pa, pb;
    gr_train_result ra, rb1, rb2;
    run_cfg a = {.file = file, .workers = 3, .shards = 2, .mode = GR_MODE_SYNC, .pipeline = true,
                 .ckpt_dir = root, .every = 10, .batch = 16};
    assert_int_equal(run(&a, ids, nids, &pa, &ra), 0);
    assert_true(ra.worker_steps[2] < ra.worker_steps[0]);
    /* 12, 11 and 9 batches: the last worker left before the checkpoint at step 10, and the
     * second one has one step after it. */
    assert_int_equal(ra.worker_steps[0], 12);
    assert_int_equal(ra.worker_steps[1], 11);
    assert_int_equal(ra.worker_steps[2], 9);
    assert_int_equal(ra.ckpt_saves, 2);
    run_cfg b1 = a;
    b1.ckpt_dir = root2;
    b1.max_steps = 10;
    assert_int_equal(run(&b1, NULL, 0, NULL, &rb1), 0);
    run_cfg b2 = a;
    b2.ckpt_dir = root2;
    b2.resume = root2;
    b2.pipeline = false;
    assert_int_equal(run(&b2, ids, nids, &pb, &rb2), 0);
    assert_int_equal(rb2.resumed_step, 10);
    assert_int_equal(rb2.worker_steps[0], 2);
    assert_int_equal(rb2.worker_steps[1], 1);
    assert_int_equal(rb2.worker_steps[2], 0); /* nothing left for the short worker */
    assert_int_equal(rb1.examples + rb2.examples, ra.examples);
    assert_params_equal(&pa, &pb);
    tr_params_fini(&pa);
    tr_params_fini(&pb);
    free(ids);
}

/* Async, semisync (one backup) and ssp with shared chunks: checkpoints are taken while workers
 * run (each pauses between two steps, some holding a step token), and a resumed run trains on
 * exactly the examples the first one had not pushed. */
static void test_pause_modes_resume_covers_the_rest(void **state)
{
    (void)state;
    const gr_train_mode modes[] = {GR_MODE_ASYNC, GR_MODE_SEMISYNC, GR_MODE_SSP};
    for (int m = 0; m < 3; m++) {
        char file[256], root[256];
        path_of(file, sizeof file, "uneven.tsv");
        snprintf(root, sizeof root, "%s/pause-%s", tmp, gr_train_mode_name(modes[m]));
        gr_train_result r1, r2;
        run_cfg a = {.file = file, .workers = 3, .shards = 2, .mode = modes[m],
                     .pipeline = true, .ckpt_dir = root, .every = 1, .batch = 8, .max_steps = 5};
        int rc = run(&a, NULL, 0, NULL, &r1);
        if (rc) fprintf(stderr, "%s: %s\n", gr_train_mode_name(modes[m]), gr_errmsg());
        assert_int_equal(rc, 0);
        /* How many pauses land before the workers run out of steps depends on scheduling
         * (under ASan on 2 busy cores it has been 1); what matters is the resume below. */
        assert_true(r1.ckpt_saves >= 1);
        assert_int_equal(r1.ckpt_failures, 0);
        assert_int_equal(r1.steps, 15);
        run_cfg b = a;
        b.max_steps = 0;
        b.resume = root;
        rc = run(&b, NULL, 0, NULL, &r2);
        if (rc) fprintf(stderr, "%s resume: %s\n", gr_train_mode_name(modes[m]), gr_errmsg());
        assert_int_equal(rc, 0);
        assert_true(r2.resumed_step > 0);
        /* Every example exactly once over the two runs. */
        assert_int_equal(r1.examples + r2.examples, UNEVEN_LINES);
        /* A third run from the final checkpoint has nothing left. */
        gr_train_result r3;
        assert_int_equal(run(&b, NULL, 0, NULL, &r3), 0);
        assert_int_equal(r3.examples, 0);
        assert_int_equal(r3.ckpt_saves, 0);
    }
}

static void test_refusals(void **state)
{
    (void)state;
    char file[256], root[256], empty[256];
    path_of(file, sizeof file, "multi.tsv");
    path_of(root, sizeof root, "syncA"); /* written by the first test */
    path_of(empty, sizeof empty, "no-checkpoints-here");
    gr_train_result r;
    /* Another batch size: the data position cannot be mapped. */
    run_cfg a = {.file = file, .workers = 2, .shards = 1, .mode = GR_MODE_SYNC, .pipeline = true,
                 .resume = root, .batch = 16};
    assert_int_equal(run(&a, NULL, 0, NULL, &r), GR_EINVAL);
    fprintf(stderr, "refused as expected: %s\n", gr_errmsg());
    assert_non_null(strstr(gr_errmsg(), "batch"));
    /* Another worker count with static ranges. */
    a.batch = B;
    a.workers = 1;
    assert_int_equal(run(&a, NULL, 0, NULL, &r), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "workers"));
    /* A root that does not exist: refused (a mistyped --resume must not start from scratch). */
    a.workers = 2;
    a.resume = empty;
    a.max_steps = 1;
    assert_int_equal(run(&a, NULL, 0, NULL, &r), GR_ENOENT);
    assert_non_null(strstr(gr_errmsg(), "no such checkpoint root"));
    /* Nothing under an existing root: a fresh start. */
    assert_int_equal(mkdir(empty, 0755), 0);
    assert_int_equal(run(&a, NULL, 0, NULL, &r), 0);
    assert_int_equal(r.resumed_step, 0);
    assert_int_equal(r.steps, 2);
    /* The local backend cannot checkpoint. */
    gr_train_backend be;
    gr_local_backend_opts lo = {GR_DENSE_OPT_ADAM, 1e-3f, 0.9f, 0.999f, 1e-8f};
    assert_int_equal(gr_local_backend_create(&lo, &be), 0);
    gr_train_opts o;
    model_opts(&o);
    o.train_path = file;
    o.ckpt_dir = root;
    o.progress_s = 0;
    assert_int_equal(gr_train_run(&o, &be, &r), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "parameter-server"));
    gr_train_backend_destroy(&be);
}

/* ---- granary train: kill -9 mid-run, --resume, same final metrics ---- */

static pid_t spawn_train(const char *const *args)
{
    size_t n = 0;
    while (args[n]) n++;
    char **argv = calloc(n + 2, sizeof *argv);
    argv[0] = (char *)ps_test_granary_bin();
    for (size_t i = 0; i < n; i++) argv[i + 1] = (char *)args[i];
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) {
            dup2(devnull, 1);
            dup2(devnull, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    free(argv);
    return pid;
}

/* The whole of test_cli_kill_and_resume must end within this, so that a hung run fails here
 * with its name instead of the runner's per-binary limit (scripts/run-tests, 300 s) killing
 * the binary. It is a hang detector, not a speed target: a run takes ~1 s on a quiet machine. */
#define CLI_BUDGET_S 200.0

/* Waits for pid's exit until the monotonic clock passes `until` (then kills it: -1). Counts
 * clock time, not polls: a poll's sleep lasts longer than asked on a loaded machine. */
static int wait_exit(pid_t pid, double until, const char *what)
{
    int st = 0;
    double t0 = gr_now_s();
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            fprintf(stderr, "cli: %s took %.1f s\n", what, gr_now_s() - t0);
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        if (r < 0 || gr_now_s() > until) break;
        usleep(5000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    fprintf(stderr, "cli: %s had not ended %.0f s into the test: killed\n", what, CLI_BUDGET_S);
    return -1;
}

/* "auc" and "logloss" of a --metrics-out file, as printed (17 significant digits). */
/* "auc" and "logloss" of a --metrics-out file, as printed (17 significant digits). */
static void read_metrics(const char *path, char *auc, char *logloss)
{
    assert_int_equal(tr_metrics_text(path, "auc", auc, 64), 0);
    assert_int_equal(tr_metrics_text(path, "logloss", logloss, 64), 0);
}

static void test_cli_kill_and_resume(void **state)
{
    (void)state;
    char file[256], test[256], rootA[256], rootB[256], mA[256], mB[256];
    path_of(file, sizeof file, "long.tsv");
    path_of(test, sizeof test, "test.tsv");
    path_of(rootA, sizeof rootA, "cliA");
    path_of(rootB, sizeof rootB, "cliB");
    path_of(mA, sizeof mA, "metricsA.json");
    path_of(mB, sizeof mB, "metricsB.json");
    FILE *f = fopen(file, "w");
    for (unsigned i = 0; i < 2 * 96 * B; i++) tr_write_fixed_line(f, 7000 + i, false);
    fclose(f);
    const char *common[] = {"train", "--train", file, "--test", test, "--mode", "sync",
                            "--workers", "2", "--batch", "32", "--shards", "2", "--dim", "4",
                            "--bottom", "8", "--top", "8", "--progress", "0", "--ckpt-every", "8",
                            "--ckpt-keep", "2", "--ckpt-incremental"};
    enum { NC = sizeof common / sizeof common[0] };
    const char *args[NC + 8];
    memcpy(args, common, sizeof common);
    /* Uninterrupted. */
    size_t n = NC;
    args[n++] = "--ckpt-dir";
    args[n++] = rootA;
    args[n++] = "--metrics-out";
    args[n++] = mA;
    args[n] = NULL;
    const double until = gr_now_s() + CLI_BUDGET_S;
    assert_int_equal(wait_exit(spawn_train(args), until, "the uninterrupted run"), 0);
    /* Killed once its first checkpoint is complete. */
    n = NC;
    args[n++] = "--ckpt-dir";
    args[n++] = rootB;
    args[n] = NULL;
    pid_t pid = spawn_train(args);
    assert_true(pid > 0);
    char name[GR_CKPT_NAME_MAX];
    uint64_t step = 0;
    int st = -1;
    bool exited = false;
    while (gr_now_s() < until) {
        if (gr_ckpt_latest(rootB, name, &step) == GR_OK) break;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            exited = true;
            break;
        }
        usleep(1000);
    }
    int rc = exited ? (WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st)) : -1;
    if (!exited) {
        kill(pid, SIGKILL);
        rc = wait_exit(pid, until, "the run to kill");
    }
    assert_int_equal(gr_ckpt_latest(rootB, name, &step), 0);
    fprintf(stderr, "cli: train %s at its checkpoint of step %llu (of 96)\n",
            rc == 128 + SIGKILL ? "killed" : "had finished", (unsigned long long)step);
    /* Resumed to the end. */
    n = NC;
    args[n++] = "--ckpt-dir";
    args[n++] = rootB;
    args[n++] = "--resume";
    args[n++] = rootB;
    args[n++] = "--metrics-out";
    args[n++] = mB;
    args[n] = NULL;
    assert_int_equal(wait_exit(spawn_train(args), until, "the resumed run"), 0);
    char aucA[64], llA[64], aucB[64], llB[64];
    read_metrics(mA, aucA, llA);
    read_metrics(mB, aucB, llB);
    fprintf(stderr, "cli: uninterrupted auc %s logloss %s; killed and resumed auc %s logloss %s\n",
            aucA, llA, aucB, llB);
    assert_string_equal(aucA, aucB);
    assert_string_equal(llA, llB);
    char *txt = NULL;
    assert_int_equal(gr_read_file(mB, &txt, NULL), 0);
    assert_non_null(strstr(txt, "step-000000000096")); /* ckpt_last */
    free(txt);
    assert_int_equal(gr_ckpt_latest(rootB, name, &step), 0);
    assert_int_equal(step, 96);
}

/* Hybrid: one sequential worker resumes exactly (its rows and dense steps are deterministic);
 * two pipelined workers checkpoint at global steps like sync (every worker paused before the
 * same step's token) and a resumed run does the rest. */
static void test_hybrid_resume(void **state)
{
    (void)state;
    char file[256], rootA[256], rootB[256], rootC[256];
    path_of(file, sizeof file, "multi.tsv");
    path_of(rootA, sizeof rootA, "hybA");
    path_of(rootB, sizeof rootB, "hybB");
    path_of(rootC, sizeof rootC, "hybC");
    uint64_t *ids;
    size_t nids = tr_file_ids(file, &ids);
    assert_true(nids > 0);
    tr_params pa, pb;
    gr_train_result ra, rb1, rb2;
    run_cfg a = {.file = file, .workers = 1, .shards = 2, .mode = GR_MODE_HYBRID,
                 .pipeline = false, .ckpt_dir = rootA, .every = STEPS};
    int rc = run(&a, ids, nids, &pa, &ra);
    if (rc) fprintf(stderr, "hybrid A: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    assert_int_equal(ra.steps, 2 * STEPS);
    assert_string_equal(ra.ckpt_last, "step-000000000016");
    run_cfg b1 = a;
    b1.ckpt_dir = rootB;
    b1.max_steps = STEPS;
    assert_int_equal(run(&b1, NULL, 0, NULL, &rb1), 0);
    assert_string_equal(rb1.ckpt_last, "step-000000000008");
    run_cfg b2 = a;
    b2.ckpt_dir = rootB;
    b2.resume = rootB;
    assert_int_equal(run(&b2, ids, nids, &pb, &rb2), 0);
    assert_int_equal(rb2.resumed_step, STEPS);
    assert_int_equal(rb2.steps, STEPS);
    assert_params_equal(&pa, &pb);
    assert_true(ra.test_auc == rb2.test_auc);
    tr_params_fini(&pa);
    tr_params_fini(&pb);

    run_cfg c = {.file = file, .workers = 2, .shards = 2, .mode = GR_MODE_HYBRID,
                 .pipeline = true, .ckpt_dir = rootC, .every = STEPS / 2};
    gr_train_result rc1, rc2;
    c.max_steps = STEPS / 2;
    assert_int_equal(run(&c, NULL, 0, NULL, &rc1), 0);
    assert_int_equal(rc1.steps, STEPS); /* 4 global steps of 2 workers */
    assert_string_equal(rc1.ckpt_last, "step-000000000004");
    c.max_steps = 0;
    c.resume = rootC;
    assert_int_equal(run(&c, NULL, 0, NULL, &rc2), 0);
    assert_int_equal(rc2.resumed_step, STEPS / 2);
    assert_int_equal(rc2.steps, STEPS);
    assert_int_equal(rc2.examples, STEPS * B);
    assert_string_equal(rc2.ckpt_last, "step-000000000008");
    free(ids);
}

/* Hybrid, 2 pipelined workers, dense lag 1: a worker may start step t + 1 before step t is
 * applied, but every worker parks before the checkpoint step's token with its earlier pushes
 * done, so no step's sum is staged while the shards save (the barrier drains it). The state
 * read right after a run that stopped at the checkpoint equals, bit for bit, the state that
 * checkpoint restores on a fresh cluster of another shard count; a resumed run does the rest,
 * and a mid-run checkpoint of a whole run restores to a state the shards were in at a step
 * boundary (step count and every worker's position). */
static void test_hybrid_lag_checkpoint_restores(void **state)
{
    (void)state;
    char file[256], root[256], rootD[256];
    path_of(file, sizeof file, "multi.tsv");
    path_of(root, sizeof root, "hybLag");
    path_of(rootD, sizeof rootD, "hybLagD");
    uint64_t *ids;
    size_t nids = tr_file_ids(file, &ids);
    assert_true(nids > 0);
    tr_params p1, p2;
    gr_train_result r1, r2, r3, rd;
    run_cfg c = {.file = file, .workers = 2, .shards = 2, .mode = GR_MODE_HYBRID,
                 .pipeline = true, .ckpt_dir = root, .every = STEPS / 2, .dense_lag = 1};
    c.max_steps = STEPS / 2;
    int rc = run(&c, ids, nids, &p1, &r1);
    if (rc) fprintf(stderr, "hybrid lag 1: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    assert_int_equal(r1.steps, STEPS);
    assert_string_equal(r1.ckpt_last, "step-000000000004");
    /* Restored on 3 shards, nothing more to train (max_steps reached): the same bits. */
    run_cfg r = c;
    r.shards = 3;
    r.resume = root;
    r.ckpt_dir = NULL;
    assert_int_equal(run(&r, ids, nids, &p2, &r2), 0);
    assert_int_equal(r2.resumed_step, STEPS / 2);
    assert_int_equal(r2.steps, 0);
    assert_params_equal(&p1, &p2);
    tr_params_fini(&p2);
    /* And the rest of the data from there. */
    r.max_steps = 0;
    assert_int_equal(run(&r, NULL, 0, NULL, &r3), 0);
    assert_int_equal(r3.steps, STEPS);
    assert_int_equal(r3.examples, STEPS * B);
    /* A whole run with a checkpoint in the middle, while the workers run one step apart. */
    run_cfg d = c;
    d.ckpt_dir = rootD;
    d.max_steps = 0;
    assert_int_equal(run(&d, NULL, 0, NULL, &rd), 0);
    assert_int_equal(rd.steps, 2 * STEPS);
    assert_int_equal(rd.ckpt_saves, 2);
    char mid[300];
    snprintf(mid, sizeof mid, "%s/step-000000000004", rootD);
    assert_int_equal(gr_ckpt_verify(mid, true, NULL), 0);
    run_cfg e = c;
    e.ckpt_dir = NULL;
    e.resume = mid;
    e.max_steps = 0;
    gr_train_result re;
    assert_int_equal(run(&e, NULL, 0, NULL, &re), 0);
    assert_int_equal(re.resumed_step, STEPS / 2);
    assert_int_equal(re.steps, STEPS);
    assert_int_equal(re.examples, STEPS * B);
    tr_params_fini(&p1);
    free(ids);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_resume_is_exact),
        cmocka_unit_test(test_sync_resume_with_a_worker_that_left),
        cmocka_unit_test(test_pause_modes_resume_covers_the_rest),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_cli_kill_and_resume),
        cmocka_unit_test(test_hybrid_resume),
        cmocka_unit_test(test_hybrid_lag_checkpoint_restores),
    };
    return cmocka_run_group_tests_name("ckpt_train", tests, setup, teardown);
}
