/* Integration (ZooKeeper): a job of several `granary train --coord ... --job-workers N`
 * processes. Two shards under `granary server --coord`; the trainers claim ranks, wait for
 * each other, elect a chief and split the data by the job's worker index.
 *  - 2 processes x 1 worker reach the test AUC of 1 process x 2 workers (hybrid and async);
 *  - the chief killed with SIGKILL mid-run: the other process becomes chief, makes the dead
 *    one's worker leave the shards' sync job, writes a checkpoint after the kill, and the job
 *    ends by itself with a model that scores the test file;
 *  - sync: a worker process killed mid-run does not hang the job: the chief goes on alone and
 *    finishes. */
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
#include "granary/coord.h"
#include "granary/train.h"
#include "tests/support/ps_harness.h"
#include "tests/support/train_fixture.h"
#include "tests/support/zk_harness.h"

static zk_test_server zk;
static char tmp[256];
static tr_fixture data;

/* A hang detector for each run, not a speed target (a run takes seconds). */
#define RUN_BUDGET_S 150.0

static int setup(void **state)
{
    (void)state;
    if (ps_test_tmpdir(tmp, sizeof tmp)) return -1;
    if (!zk_test_available()) return 0;
    if (tr_fixture_make(&data, "coordworkers", 13)) return -1;
    return zk_test_start(&zk);
}

static int teardown(void **state)
{
    (void)state;
    zk_test_destroy(&zk);
    if (data.dir[0]) tr_fixture_remove(&data);
    ps_test_rmdir(tmp);
    return 0;
}

typedef struct job {
    char name[32], url[256], ck[64], ckpath[400], metrics[400];
    ps_test_server shard[2], standby;
} job;

/* The job's two shards and, with_standby, a standby that takes a lost shard's index over. */
static void start_job_with(job *j, const char *name, bool with_standby)
{
    memset(j, 0, sizeof *j);
    snprintf(j->name, sizeof j->name, "%s", name);
    char path[64];
    snprintf(path, sizeof path, "/jobs/%s", name);
    zk_test_url(&zk, path, j->url, sizeof j->url);
    snprintf(j->ck, sizeof j->ck, "ck-%s", name);
    rmdir(j->ck); /* an empty one an older build's trainer left in this directory */
    snprintf(j->ckpath, sizeof j->ckpath, "%s/%s", tmp, j->ck);
    snprintf(j->metrics, sizeof j->metrics, "%s/metrics-%s.json", tmp, name);
    for (int i = 0; i < 2; i++) {
        const char *args[] = {"server", "--coord", j->url, "--shards", "2", "--threads", "1",
                              "--session-timeout", "2000", "--ckpt-root", tmp, "--ckpt-dir",
                              j->ck, NULL};
        assert_int_equal(ps_test_server_start_args(&j->shard[i], args), 0);
    }
    if (with_standby) {
        const char *args[] = {"server", "--coord", j->url, "--shards", "2", "--threads", "1",
                              "--session-timeout", "2000", "--ckpt-root", tmp, "--ckpt-dir",
                              j->ck, "--standby", NULL};
        assert_int_equal(ps_test_server_start_args(&j->standby, args), 0);
    }
}

static void start_job(job *j, const char *name) { start_job_with(j, name, false); }

static void stop_job(job *j)
{
    /* The shards own the checkpoint directory (under their --ckpt-root): no worker process
     * may have made one of the same relative name where it ran. */
    struct stat st;
    assert_int_not_equal(stat(j->ck, &st), 0);
    for (int i = 0; i < 2; i++)
        if (j->shard[i].pid > 0) ps_test_server_stop(&j->shard[i], 0);
    if (j->standby.pid > 0) ps_test_server_stop(&j->standby, 0);
}

static void log_path(const job *j, int proc, char *out, size_t cap)
{
    snprintf(out, cap, "%s/train-%s-%d.log", tmp, j->name, proc);
}

/* One trainer process of the job: `procs` processes of `workers` threads each. */
/* --dense-lag for the processes spawned next (NULL: granary train's default). */
static const char *pin_dense_lag;

static pid_t spawn_train(const job *j, int proc, const char *mode, unsigned procs,
                         unsigned workers, const char *epochs, const char *data_split)
{
    char np[16], nw[16], lg[400];
    snprintf(np, sizeof np, "%u", procs);
    snprintf(nw, sizeof nw, "%u", workers);
    log_path(j, proc, lg, sizeof lg);
    const char *args[] = {ps_test_granary_bin(), "train", "--train", data.train, "--test",
                          data.test, "--coord", j->url, "--job-workers", np, "--mode", mode,
                          "--workers", nw, "--batch", "64", "--dim", "4", "--bottom", "8",
                          "--top", "8", "--progress", "0", "--epochs", epochs, "--ckpt-dir",
                          j->ck, "--ckpt-every", "20", "--metrics-out", j->metrics,
                          "--recovery-timeout", "60000", "--data", data_split,
                          pin_dense_lag ? "--dense-lag" : NULL, pin_dense_lag, NULL};
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(lg, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(args[0], (char *const *)args);
        _exit(127);
    }
    return pid;
}

static void dump_log(const job *j, int proc)
{
    char lg[400];
    log_path(j, proc, lg, sizeof lg);
    char *txt = NULL;
    if (gr_read_file(lg, &txt, NULL) == 0) fprintf(stderr, "--- %s\n%s\n", lg, txt);
    free(txt);
}

static bool log_has(const job *j, int proc, const char *needle)
{
    char lg[400];
    log_path(j, proc, lg, sizeof lg);
    char *txt = NULL;
    if (gr_read_file(lg, &txt, NULL) != 0) return false;
    bool has = strstr(txt, needle) != NULL;
    free(txt);
    return has;
}

static int wait_exit(pid_t pid, double until, const char *what)
{
    int st = 0;
    double t0 = gr_now_s();
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            fprintf(stderr, "coord workers: %s took %.1f s\n", what, gr_now_s() - t0);
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        if (r < 0 || gr_now_s() > until) break;
        usleep(5000);
    }
    fprintf(stderr, "coord workers: %s did not end in time: killed\n", what);
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

static double metric(const char *path, const char *key)
{
    char v[64];
    assert_int_equal(tr_metrics_text(path, key, v, sizeof v), 0);
    return atof(v);
}

static bool is_true(const char *path, const char *key)
{
    char v[64];
    assert_int_equal(tr_metrics_text(path, key, v, sizeof v), 0);
    return strstr(v, "true") != NULL; /* the file indents with tabs */
}

/* Runs n processes of the job to their end; every one must exit 0. */
static void run_procs(const job *j, const char *mode, unsigned n, unsigned workers,
                      const char *data_split)
{
    double until = gr_now_s() + RUN_BUDGET_S;
    pid_t pid[4];
    for (unsigned p = 0; p < n; p++) {
        pid[p] = spawn_train(j, (int)p, mode, n, workers, "1", data_split);
        assert_true(pid[p] > 0);
    }
    int rc[4];
    for (unsigned p = 0; p < n; p++) rc[p] = wait_exit(pid[p], until, "a trainer process");
    for (unsigned p = 0; p < n; p++) {
        if (rc[p] != 0 || getenv("GR_TEST_VERBOSE")) dump_log(j, (int)p);
        assert_int_equal(rc[p], 0);
    }
}

/* The metrics of the process that ended as chief (FILE) and the other one's (FILE.rank-R). */
static void other_metrics(const job *j, char *out, size_t cap)
{
    double chief_rank = metric(j->metrics, "job_rank");
    snprintf(out, cap, "%s.rank-%d", j->metrics, chief_rank == 0 ? 1 : 0);
}

/* 2 processes x 1 worker against 1 process x 2 workers, the same static split of the file
 * (worker i of the job reads the i-th half either way) and the same sync steps of the dense
 * parameters in hybrid. Neither kind of run is the same twice: asynchronous row updates (and in
 * async the dense ones) land in another order each time. The bounds are that spread, measured
 * over 6 runs of each kind on this fixture (loaded 2-core machine, one of them under ASan):
 * hybrid, 1 process 0.76098-0.76288, 2 processes 0.76146-0.76319 (any two runs within 0.0022);
 * async, 1 process 0.75943-0.76577, 2 processes 0.76139-0.76674 (within 0.0073). A wrong split
 * (a share trained twice or not at all) or a worker missing from the steps costs more: the
 * example counts are checked exactly besides. Hybrid runs with dense lag 0 here, the setting
 * those bounds were measured with: with granary train's default lag 1 a worker's dense
 * parameters may miss the other's previous step depending on timing, which widens the spread
 * on this 78-step fixture (6 runs, session 7: 0.76088-0.76569, two runs 0.0047 apart) and
 * would hide a split error; the lag's accuracy is measured on full-size data
 * (docs/train.md, "Dense lag"). */
#define AUC_TOLERANCE_HYBRID 0.004
#define AUC_TOLERANCE_ASYNC 0.008

static void compare_modes(const char *mode, const char *a_name, const char *b_name,
                          double tolerance)
{
    job a, b;
    start_job(&a, a_name);
    run_procs(&a, mode, 1, 2, "static");
    stop_job(&a);
    start_job(&b, b_name);
    run_procs(&b, mode, 2, 1, "static");
    stop_job(&b);
    double aucA = metric(a.metrics, "auc"), aucB = metric(b.metrics, "auc");
    char other[512];
    other_metrics(&b, other, sizeof other);
    double exA = metric(a.metrics, "examples");
    double exB = metric(b.metrics, "examples") + metric(other, "examples");
    fprintf(stderr, "coord workers %s: 1 process x 2 workers auc %.6f (%.0f examples); 2 processes "
            "x 1 worker auc %.6f (chief) %.6f (other), %.0f examples\n", mode, aucA, exA, aucB,
            metric(other, "auc"), exB);
    /* The processes together trained the file once, as the one process did. */
    assert_true(exA == exB);
    assert_true(metric(b.metrics, "job_workers") == 2);
    assert_true(is_true(b.metrics, "chief") && !is_true(other, "chief"));
    assert_true(metric(other, "examples") > 0 && metric(b.metrics, "examples") > 0);
    assert_true(fabs(aucA - aucB) <= tolerance);
    /* The other process scores the same final model. */
    assert_true(fabs(metric(other, "auc") - aucB) <= 1e-9);
    /* One process led the job and saved it; the other says the chief saves, not that nothing
     * was saved. */
    assert_true(log_has(&b, 0, "is the job's chief") != log_has(&b, 1, "is the job's chief"));
    assert_true(log_has(&b, 0, "writes none") != log_has(&b, 1, "writes none"));
    assert_true(log_has(&b, 0, "writes none") == log_has(&b, 1, "is the job's chief"));
    assert_false(log_has(&b, 0, "no checkpoint was written") || log_has(&b, 1, "no checkpoint was written"));
}

static void test_two_processes_hybrid_reach_one_process_auc(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    pin_dense_lag = "0";
    compare_modes("hybrid", "hybridA", "hybridB", AUC_TOLERANCE_HYBRID);
    pin_dense_lag = NULL;
}

/* A finished job started again with --resume: a new run; its chief restores the final
 * checkpoint, the other process reads its position there, both find their data done, and the
 * model scores as before, bitwise. */
static void test_resumed_job_of_two_processes(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    job j;
    start_job(&j, "resume2");
    run_procs(&j, "hybrid", 2, 1, "static");
    char before[64];
    assert_int_equal(tr_metrics_text(j.metrics, "auc", before, sizeof before), 0);
    double until = gr_now_s() + RUN_BUDGET_S;
    pid_t pid[2];
    for (int p = 0; p < 2; p++) {
        char np[16], lg[400];
        snprintf(np, sizeof np, "%d", 2);
        snprintf(lg, sizeof lg, "%s/train-resume2-again-%d.log", tmp, p);
        const char *args[] = {ps_test_granary_bin(), "train", "--train", data.train, "--test",
                              data.test, "--coord", j.url, "--job-workers", np, "--mode",
                              "hybrid", "--workers", "1", "--batch", "64", "--dim", "4",
                              "--bottom", "8", "--top", "8", "--progress", "0", "--ckpt-dir",
                              j.ck, "--ckpt-every", "20", "--metrics-out", j.metrics,
                              "--resume", j.ck, "--data", "static", NULL};
        pid[p] = fork();
        if (pid[p] == 0) {
            int fd = open(lg, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
            }
            execv(args[0], (char *const *)args);
            _exit(127);
        }
    }
    for (int p = 0; p < 2; p++) {
        int rc = wait_exit(pid[p], until, "a resumed process");
        if (rc) {
            char lg[400], *txt = NULL;
            snprintf(lg, sizeof lg, "%s/train-resume2-again-%d.log", tmp, p);
            if (gr_read_file(lg, &txt, NULL) == 0) fprintf(stderr, "%s\n", txt);
            free(txt);
        }
        assert_int_equal(rc, 0);
    }
    stop_job(&j);
    char after[64], other[512];
    assert_int_equal(tr_metrics_text(j.metrics, "auc", after, sizeof after), 0);
    other_metrics(&j, other, sizeof other);
    fprintf(stderr, "coord workers: resumed job auc %s (before %s), %.0f + %.0f new examples\n",
            after, before, metric(j.metrics, "examples"), metric(other, "examples"));
    assert_string_equal(after, before);
    assert_true(metric(j.metrics, "examples") == 0 && metric(other, "examples") == 0);
    assert_true(metric(j.metrics, "resumed_step") > 0 && metric(other, "resumed_step") > 0);
}

static void test_two_processes_async_reach_one_process_auc(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    compare_modes("async", "asyncA", "asyncB", AUC_TOLERANCE_ASYNC);
}

/* The pid of the chief now (from its member record). */
static pid_t chief_pid(const job *j)
{
    gr_coord *c = NULL;
    assert_int_equal(gr_coord_open(j->url, NULL, &c), 0);
    gr_coord_member m;
    pid_t pid = 0;
    for (int i = 0; i < 100 && !pid; i++) {
        if (gr_coord_leader(c, &m) == 0) pid = (pid_t)m.pid;
        else usleep(50000);
    }
    gr_coord_close(c);
    assert_true(pid > 0);
    return pid;
}

/* Starts 2 processes, waits for the first checkpoint, kills one with SIGKILL (the chief or the
 * other), and waits for the survivor. Returns the survivor's index; *ck_at_kill: the newest
 * checkpoint's step then. */
static int kill_one(const job *j, const char *mode, bool kill_chief, uint64_t *ck_at_kill)
{
    double until = gr_now_s() + RUN_BUDGET_S;
    pid_t pid[2];
    for (int p = 0; p < 2; p++) {
        pid[p] = spawn_train(j, p, mode, 2, 1, "2", "static");
        assert_true(pid[p] > 0);
    }
    char name[GR_CKPT_NAME_MAX];
    while (gr_ckpt_latest(j->ckpath, name, ck_at_kill) != GR_OK) {
        int st;
        for (int p = 0; p < 2; p++) assert_int_equal(waitpid(pid[p], &st, WNOHANG), 0);
        assert_true(gr_now_s() < until);
        usleep(2000);
    }
    pid_t chief = chief_pid(j);
    int victim = (pid[0] == chief) == kill_chief ? 0 : 1;
    /* What a person sees meanwhile: both ranks, the chief, the run training. */
    char out[8192];
    const char *st_args[] = {"cluster", "status", "--coord", j->url, NULL};
    assert_int_equal(ps_test_run_granary(st_args, out, sizeof out), 0);
    if (getenv("GR_TEST_VERBOSE")) fprintf(stderr, "%s", out);
    assert_non_null(strstr(out, "worker 0"));
    assert_non_null(strstr(out, "worker 1"));
    assert_non_null(strstr(out, "2 ranks, training"));
    assert_non_null(strstr(out, "running"));
    assert_non_null(strstr(out, "  chief\n"));
    const char *js_args[] = {"cluster", "status", "--coord", j->url, "--json", NULL};
    assert_int_equal(ps_test_run_granary(js_args, out, sizeof out), 0);
    assert_non_null(strstr(out, "\"worker_run\":{"));
    assert_non_null(strstr(out, "\"up\":true"));
    int st;
    for (int p = 0; p < 2; p++) assert_int_equal(waitpid(pid[p], &st, WNOHANG), 0);
    assert_int_equal(kill(pid[victim], SIGKILL), 0);
    waitpid(pid[victim], &st, 0);
    fprintf(stderr, "coord workers: killed the %s (pid %d) after checkpoint %s\n",
            kill_chief ? "chief" : "other process", (int)pid[victim], name);
    int rc = wait_exit(pid[1 - victim], until, "the surviving process");
    if (rc != 0 || getenv("GR_TEST_VERBOSE")) dump_log(j, 1 - victim);
    assert_int_equal(rc, 0);
    return 1 - victim;
}

static void test_chief_killed_another_process_takes_over(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    job j;
    start_job(&j, "chiefkill");
    uint64_t at_kill = 0;
    int survivor = kill_one(&j, "hybrid", true, &at_kill);
    stop_job(&j);
    /* It became the chief, made the dead chief's worker leave, and saved after the kill. */
    assert_true(log_has(&j, survivor, "is the job's chief"));
    assert_true(log_has(&j, survivor, "was lost; the job goes on without its 1 worker"));
    char name[GR_CKPT_NAME_MAX];
    uint64_t last = 0;
    assert_int_equal(gr_ckpt_latest(j.ckpath, name, &last), GR_OK);
    fprintf(stderr, "coord workers: newest checkpoint %s (step %llu; %llu at the kill)\n", name,
            (unsigned long long)last, (unsigned long long)at_kill);
    assert_true(last > at_kill);
    /* The survivor, chief at the end, wrote the job's metrics and the model it names scores
     * the test file as the run said. */
    assert_true(is_true(j.metrics, "chief"));
    double auc = metric(j.metrics, "auc");
    assert_true(auc > 0.6);
    gr_saved_model *sm = NULL;
    assert_int_equal(gr_saved_model_open(j.ckpath, &sm), 0);
    gr_eval_result er;
    assert_int_equal(gr_saved_model_evaluate(sm, data.test, 0, 0, false, &er), 0);
    fprintf(stderr, "coord workers: after the chief's death auc %.6f; the saved model scores "
            "%.6f\n", auc, er.auc);
    assert_true(fabs(er.auc - auc) < 1e-9);
    gr_saved_model_close(sm);
}

static void test_sync_worker_death_does_not_hang(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    job j;
    start_job(&j, "syncdeath");
    uint64_t at_kill = 0;
    int survivor = kill_one(&j, "sync", false, &at_kill);
    stop_job(&j);
    assert_true(log_has(&j, survivor, "was lost; the job goes on without its 1 worker"));
    /* The chief went on alone: its steps after the death were short of the dead worker. */
    assert_true(is_true(j.metrics, "chief"));
    assert_true(metric(j.metrics, "auc") > 0.6);
    char name[GR_CKPT_NAME_MAX];
    uint64_t last = 0;
    assert_int_equal(gr_ckpt_latest(j.ckpath, name, &last), GR_OK);
    assert_true(last > at_kill);
}


/* ---- recovery inside a job of several processes ---- */

/* The shard process serving index 1 now (a shard prints its address before it claims an
 * index: the layout is read until index 1 names one of the job's shards). */
static ps_test_server *serving_index1(job *j)
{
    gr_coord *c = NULL;
    assert_int_equal(gr_coord_open(j->url, NULL, &c), 0);
    ps_test_server *s = NULL;
    for (double until = gr_now_s() + 30; !s && gr_now_s() < until;) {
        gr_coord_layout l;
        memset(&l, 0, sizeof l);
        if (gr_coord_layout_get(c, &l) == 0 && l.n_shards == 2)
            for (int i = 0; i < 2; i++)
                if (!strcmp(l.shards[1].address, j->shard[i].addr)) s = &j->shard[i];
        gr_coord_layout_fini(&l);
        if (!s) usleep(20000);
    }
    gr_coord_close(c);
    assert_non_null(s);
    return s;
}

/* The metrics file of the process that ended with rank `rank`. */
static void rank_metrics(const job *j, int rank, char *out, size_t cap)
{
    if (metric(j->metrics, "job_rank") == rank) snprintf(out, cap, "%s", j->metrics);
    else snprintf(out, cap, "%s.rank-%d", j->metrics, rank);
}

/* Waits for the job's first checkpoint while every process still trains. */
static void wait_first_ckpt(const job *j, const pid_t *pid, int n, double until)
{
    char name[GR_CKPT_NAME_MAX];
    uint64_t step = 0;
    while (gr_ckpt_latest(j->ckpath, name, &step) != GR_OK) {
        int st;
        for (int p = 0; p < n; p++) assert_int_equal(waitpid(pid[p], &st, WNOHANG), 0);
        assert_true(gr_now_s() < until);
        usleep(2000);
    }
    fprintf(stderr, "coord workers: first checkpoint %s\n", name);
}

/* 2 processes x 1 worker of `mode` (a sync run is the same every time: each step sums the
 * workers' gradients in worker order); with kill_shard, the shard serving index 1 is killed with
 * SIGKILL after the first checkpoint, and the standby takes its index over. Every process must
 * finish by itself with exit 0. */
static void run_two(job *j, const char *mode, bool kill_shard)
{
    double until = gr_now_s() + RUN_BUDGET_S;
    pid_t pid[2];
    for (int p = 0; p < 2; p++) {
        pid[p] = spawn_train(j, p, mode, 2, 1, "1", "static");
        assert_true(pid[p] > 0);
    }
    if (kill_shard) {
        ps_test_server *victim = serving_index1(j);
        wait_first_ckpt(j, pid, 2, until);
        fprintf(stderr, "coord workers: killing the shard of index 1 (pid %d)\n", (int)victim->pid);
        assert_int_equal(ps_test_server_stop(victim, SIGKILL), 128 + SIGKILL);
        victim->pid = 0;
    }
    int rc[2];
    for (int p = 0; p < 2; p++) rc[p] = wait_exit(pid[p], until, "a trainer process");
    for (int p = 0; p < 2; p++) {
        if (rc[p] != 0 || getenv("GR_TEST_VERBOSE")) dump_log(j, p);
        assert_int_equal(rc[p], 0);
    }
}

/* The headline under rollback: a sync job of 2 processes survives the SIGKILL of a shard
 * (every process returns to the newest checkpoint, the chief restores every shard from it)
 * and ends bitwise equal to an uninterrupted run: the same AUC and logloss to the last
 * digit, in the chief's metrics and the other process's; each counts one recovery. */
static void test_shard_killed_sync_rollback_is_bitwise_equal(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    job a, b;
    start_job_with(&a, "rbA", false);
    run_two(&a, "sync", false);
    stop_job(&a);
    start_job_with(&b, "rbB", true);
    run_two(&b, "sync", true);
    stop_job(&b);
    char aucA[64], llA[64], aucB[64], llB[64], otherB[512], aucO[64];
    assert_int_equal(tr_metrics_text(a.metrics, "auc", aucA, sizeof aucA), 0);
    assert_int_equal(tr_metrics_text(a.metrics, "logloss", llA, sizeof llA), 0);
    assert_int_equal(tr_metrics_text(b.metrics, "auc", aucB, sizeof aucB), 0);
    assert_int_equal(tr_metrics_text(b.metrics, "logloss", llB, sizeof llB), 0);
    other_metrics(&b, otherB, sizeof otherB);
    assert_int_equal(tr_metrics_text(otherB, "auc", aucO, sizeof aucO), 0);
    fprintf(stderr, "coord workers sync: clean auc %s logloss %s; shard killed auc %s logloss %s "
            "(other process %s); recoveries %g and %g\n", aucA, llA, aucB, llB, aucO,
            metric(b.metrics, "recoveries"), metric(otherB, "recoveries"));
    assert_true(metric(a.metrics, "recoveries") == 0);
    assert_true(metric(b.metrics, "recoveries") == 1 && metric(otherB, "recoveries") == 1);
    assert_true(metric(otherB, "recovery_seconds") > 0);
    assert_string_equal(aucA, aucB);
    assert_string_equal(llA, llB);
    assert_string_equal(aucO, aucB);
}

/* Under partial (the default of async and hybrid): every process re-resolves the layout and
 * goes on from the checkpoint's data position; the survivor keeps its newer rows, the restored
 * shard its checkpoint's. Run in hybrid, the default for several workers: in async two
 * uninterrupted runs of 2 processes already differ by up to 0.0073 AUC (the order in which the
 * processes' updates land, dense parameters included), and clean-vs-killed async runs differed
 * by 0.0001-0.0107, so no bound tighter than the noise could be asserted there; hybrid's
 * synchronous dense step takes most of that spread away (two uninterrupted hybrid runs: within
 * 0.0022 over 6 runs; clean-vs-killed 0.0001-0.0008 over 5), so the 0.003 holds here.
 * A recovery that lost the shard's rows or a share of the data costs far
 * more (a process's missing share: AUC 0.70, test_chief_killed_another_process_takes_over).
 * Those spreads are lock-step's: the runs pin dense lag 0. With granary train's default lag 1
 * the dense parameters a worker reads depend on timing too, and on this 78-step fixture clean
 * runs alone spread over 0.0048 (session 7; one clean-vs-killed pair 0.0030 apart, three
 * others within 0.0008), more than the bound; the lag's accuracy is measured on full-size
 * data (docs/train.md, "Dense lag"). */
#define AUC_TOLERANCE_PARTIAL_RECOVERY 0.003
static void test_shard_killed_hybrid_partial_keeps_auc(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    job a, b;
    pin_dense_lag = "0";
    start_job_with(&a, "ptA", false);
    run_two(&a, "hybrid", false);
    stop_job(&a);
    start_job_with(&b, "ptB", true);
    run_two(&b, "hybrid", true);
    stop_job(&b);
    pin_dense_lag = NULL;
    char otherB[512];
    other_metrics(&b, otherB, sizeof otherB);
    double aucA = metric(a.metrics, "auc"), aucB = metric(b.metrics, "auc");
    fprintf(stderr, "coord workers hybrid: clean auc %.6f; shard killed (partial) auc %.6f; "
            "recoveries %g and %g\n", aucA, aucB, metric(b.metrics, "recoveries"),
            metric(otherB, "recoveries"));
    assert_true(metric(b.metrics, "recoveries") == 1 && metric(otherB, "recoveries") == 1);
    assert_true(fabs(aucA - aucB) <= AUC_TOLERANCE_PARTIAL_RECOVERY);
    assert_true(fabs(metric(otherB, "auc") - aucB) <= 1e-9);
}

/* A worker process killed with SIGKILL and a replacement started with the same
 * command: it takes the lost rank over (once the dead process's session ended), the chief
 * resets the sync job to take its worker in again (the whole job returns to the newest
 * checkpoint), and it continues the rank's data from the rank's own position at the last
 * checkpoint the dead process was alive for. Every example is trained: the replacement's
 * worker ends at the same data position (batches of its range) as that rank's worker in an
 * uninterrupted run, and so does the chief's. */
static void test_replacement_takes_the_lost_rank(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    job a, b;
    start_job_with(&a, "rjA", false);
    run_two(&a, "sync", false);
    stop_job(&a);

    start_job_with(&b, "rjB", false);
    double until = gr_now_s() + RUN_BUDGET_S;
    pid_t pid[2];
    for (int p = 0; p < 2; p++) {
        pid[p] = spawn_train(&b, p, "sync", 2, 1, "1", "static");
        assert_true(pid[p] > 0);
    }
    wait_first_ckpt(&b, pid, 2, until);
    pid_t chief = chief_pid(&b);
    int victim = pid[0] == chief ? 1 : 0;
    assert_int_equal(kill(pid[victim], SIGKILL), 0);
    waitpid(pid[victim], NULL, 0);
    fprintf(stderr, "coord workers: killed the other process (pid %d)\n", (int)pid[victim]);
    /* A supervisor restarts it at once: the replacement waits until the rank is free. */
    pid_t repl = spawn_train(&b, 2, "sync", 2, 1, "1", "static");
    assert_true(repl > 0);
    int rc_chief = wait_exit(pid[1 - victim], until, "the chief");
    int rc_repl = wait_exit(repl, until, "the replacement");
    stop_job(&b);
    if (rc_chief || rc_repl || getenv("GR_TEST_VERBOSE")) {
        dump_log(&b, 1 - victim);
        dump_log(&b, 2);
    }
    assert_int_equal(rc_chief, 0);
    assert_int_equal(rc_repl, 0);
    assert_true(log_has(&b, 2, "takes it over"));
    /* The chief set the job up again for it (a recovery of the whole job), whether its watch
     * saw the replacement first or it was done with its data and waiting. */
    assert_true(log_has(&b, 1 - victim, "leads the job's recovery"));
    char otherB[512];
    other_metrics(&b, otherB, sizeof otherB);
    assert_true(is_true(b.metrics, "chief") && !is_true(otherB, "chief"));
    /* Either run's chief may hold either rank: compare rank by rank. */
    for (int rank = 0; rank < 2; rank++) {
        char fa[512], fb[512], wpA[64], wpB[64];
        rank_metrics(&a, rank, fa, sizeof fa);
        rank_metrics(&b, rank, fb, sizeof fb);
        assert_int_equal(tr_metrics_text(fa, "worker_position", wpA, sizeof wpA), 0);
        assert_int_equal(tr_metrics_text(fb, "worker_position", wpB, sizeof wpB), 0);
        fprintf(stderr, "coord workers: rank %d (%s) ends at data position %s (uninterrupted "
                "%s)\n", rank, !strcmp(fb, otherB) ? "the replacement" : "the chief", wpB, wpA);
        assert_string_equal(wpB, wpA);
    }
    fprintf(stderr, "coord workers: after the replacement auc %.6f (uninterrupted %.6f)\n",
            metric(b.metrics, "auc"), metric(a.metrics, "auc"));
    assert_true(metric(b.metrics, "auc") > 0.6);
    assert_true(fabs(metric(otherB, "auc") - metric(b.metrics, "auc")) <= 1e-9);
}

/* Processes that ask for different settings are refused, naming both. */
static void test_mismatched_process_is_refused(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    job j;
    start_job(&j, "mismatch");
    double until = gr_now_s() + RUN_BUDGET_S;
    pid_t first = spawn_train(&j, 0, "hybrid", 2, 1, "1", "static");
    usleep(500000);
    pid_t second = spawn_train(&j, 1, "hybrid", 2, 2, "1", "static");
    int rc = wait_exit(second, until, "the mismatched process");
    kill(first, SIGKILL);
    waitpid(first, NULL, 0);
    stop_job(&j);
    if (rc != 1) dump_log(&j, 1);
    assert_int_equal(rc, 1);
    assert_true(log_has(&j, 1, "give every process of a job the same --job-workers"));
}

/* Job values under ZooKeeper: of two handles writing at the same version one wins, the other
 * gets GR_ESTALE and reads the winner's text. */
static void test_value_cas_race(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    char url[256];
    zk_test_url(&zk, "/jobs/values", url, sizeof url);
    gr_coord *a = NULL, *b = NULL;
    assert_int_equal(gr_coord_open(url, NULL, &a), 0);
    assert_int_equal(gr_coord_open(url, NULL, &b), 0);
    int64_t va = -1, vb = -1;
    assert_int_equal(gr_coord_value_cas(a, "workers", "{\"by\":\"a\"}", &va), 0);
    assert_int_equal(gr_coord_value_cas(b, "workers", "{\"by\":\"b\"}", &vb), GR_ESTALE);
    char *txt = NULL;
    assert_int_equal(gr_coord_value_get(b, "workers", &txt, &vb), 0);
    assert_string_equal(txt, "{\"by\":\"a\"}");
    free(txt);
    int64_t stale = va;
    assert_int_equal(gr_coord_value_cas(b, "workers", "{\"by\":\"b\"}", &vb), 0);
    assert_int_equal(gr_coord_value_cas(a, "workers", "{\"by\":\"a2\"}", &stale), GR_ESTALE);
    assert_int_equal(gr_coord_value_get(a, "workers", &txt, NULL), 0);
    assert_string_equal(txt, "{\"by\":\"b\"}");
    free(txt);
    gr_coord_close(a);
    gr_coord_close(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_value_cas_race),
        cmocka_unit_test(test_two_processes_hybrid_reach_one_process_auc),
        cmocka_unit_test(test_resumed_job_of_two_processes),
        cmocka_unit_test(test_two_processes_async_reach_one_process_auc),
        cmocka_unit_test(test_chief_killed_another_process_takes_over),
        cmocka_unit_test(test_sync_worker_death_does_not_hang),
        cmocka_unit_test(test_mismatched_process_is_refused),
        cmocka_unit_test(test_shard_killed_sync_rollback_is_bitwise_equal),
        cmocka_unit_test(test_shard_killed_hybrid_partial_keeps_auc),
        cmocka_unit_test(test_replacement_takes_the_lost_rank),
    };
    /* GR_TEST_FILTER=NAME runs the tests whose names match (cmocka's pattern). */
    if (getenv("GR_TEST_FILTER")) cmocka_set_test_filter(getenv("GR_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
