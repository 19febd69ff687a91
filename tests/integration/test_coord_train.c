/* Integration (ZooKeeper), the headline of coordinated training: two shards and a standby
 * under `granary server --coord`, one `granary train --coord` process with two workers. Once
 * the run has written a checkpoint, the shard serving index 1 is killed with SIGKILL; the
 * standby takes its index over and restores it, the trainer waits for the healed layout and
 * goes on, and the job finishes by itself.
 *  - sync with --recovery rollback (the default for sync) ends bitwise equal to an
 *    uninterrupted coordinated run: the same test AUC and logloss to the last digit;
 *  - async with --recovery partial (the default for async) ends with a test AUC within 0.003
 *    of an uninterrupted run's.
 * Both record one recovery in their metrics. And the chief dies: a second train process that
 * waited takes the job over from the newest checkpoint. Shards and trainers share this host's
 * loopback (no network namespaces here). */
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
#include <sys/wait.h>
#include <unistd.h>

#include "granary/ckpt.h"
#include "granary/coord.h"
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
    if (tr_fixture_make(&data, "coordtrain", 11)) return -1;
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
    char url[256], ck[64], ckpath[400], metrics[400], log[400];
    ps_test_server shard[2], standby;
    bool with_standby;
} job;

static void start_job(job *j, const char *name, bool standby)
{
    memset(j->shard, 0, sizeof j->shard);
    char path[64];
    snprintf(path, sizeof path, "/jobs/%s", name);
    zk_test_url(&zk, path, j->url, sizeof j->url);
    snprintf(j->ck, sizeof j->ck, "ck-%s", name);
    snprintf(j->ckpath, sizeof j->ckpath, "%s/%s", tmp, j->ck);
    snprintf(j->metrics, sizeof j->metrics, "%s/metrics-%s.json", tmp, name);
    snprintf(j->log, sizeof j->log, "%s/train-%s.log", tmp, name);
    j->with_standby = standby;
    for (int i = 0; i < 2 + standby; i++) {
        const char *args[] = {"server", "--coord", j->url, "--shards", "2", "--threads", "1",
                              "--session-timeout", "2000", "--ckpt-root", tmp, "--ckpt-dir",
                              j->ck, i == 2 ? "--standby" : NULL, NULL};
        assert_int_equal(ps_test_server_start_args(i == 2 ? &j->standby : &j->shard[i], args), 0);
    }
}

static void stop_job(job *j)
{
    for (int i = 0; i < 2; i++)
        if (j->shard[i].pid > 0) ps_test_server_stop(&j->shard[i], 0);
    if (j->with_standby) ps_test_server_stop(&j->standby, 0);
}

static pid_t spawn_train(job *j, const char *mode)
{
    const char *args[] = {ps_test_granary_bin(), "train", "--train", data.train, "--test",
                          data.test, "--coord", j->url, "--mode", mode, "--workers", "2",
                          "--batch", "64", "--dim", "4", "--bottom", "8", "--top", "8",
                          "--progress", "0", "--ckpt-dir", j->ck, "--ckpt-every", "24",
                          "--metrics-out", j->metrics, "--recovery-timeout", "60000", NULL};
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(j->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(args[0], (char *const *)args);
        _exit(127);
    }
    return pid;
}

static int wait_exit(pid_t pid, double until, const char *what)
{
    int st = 0;
    double t0 = gr_now_s();
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            fprintf(stderr, "coord train: %s took %.1f s\n", what, gr_now_s() - t0);
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        if (r < 0 || gr_now_s() > until) break;
        usleep(5000);
    }
    fprintf(stderr, "coord train: %s did not end in time: killed\n", what);
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

/* The shard process serving index 1 now. */
static ps_test_server *serving_index1(job *j)
{
    gr_coord *c = NULL;
    assert_int_equal(gr_coord_open(j->url, NULL, &c), 0);
    gr_coord_layout l;
    assert_int_equal(gr_coord_layout_get(c, &l), 0);
    ps_test_server *s = NULL;
    for (int i = 0; i < 2; i++)
        if (!strcmp(l.shards[1].address, j->shard[i].addr)) s = &j->shard[i];
    gr_coord_layout_fini(&l);
    gr_coord_close(c);
    assert_non_null(s);
    return s;
}

/* Runs the job to the end; with kill_after_ckpt, SIGKILLs index 1's shard once the first
 * checkpoint is complete (and asserts the run was still going then). */
static void run(job *j, const char *mode, bool kill_after_ckpt)
{
    double until = gr_now_s() + RUN_BUDGET_S;
    pid_t pid = spawn_train(j, mode);
    assert_true(pid > 0);
    if (kill_after_ckpt) {
        ps_test_server *victim = serving_index1(j); /* before: the kill follows the checkpoint */
        char name[GR_CKPT_NAME_MAX];
        uint64_t step = 0;
        while (gr_ckpt_latest(j->ckpath, name, &step) != GR_OK) {
            int st;
            assert_int_equal(waitpid(pid, &st, WNOHANG), 0); /* still training */
            assert_true(gr_now_s() < until);
            usleep(2000);
        }
        int st;
        assert_int_equal(waitpid(pid, &st, WNOHANG), 0);
        fprintf(stderr, "coord train: killing shard 1 (pid %d) after checkpoint %s\n",
                (int)victim->pid, name);
        assert_int_equal(ps_test_server_stop(victim, SIGKILL), 128 + SIGKILL);
        victim->pid = 0;
    }
    int rc = wait_exit(pid, until, kill_after_ckpt ? "the interrupted run" : "the clean run");
    if (rc != 0 || getenv("GR_TEST_VERBOSE")) {
        char *txt = NULL;
        if (gr_read_file(j->log, &txt, NULL) == 0) fprintf(stderr, "%s\n", txt);
        free(txt);
    }
    assert_int_equal(rc, 0);
}

static void read_metrics(const job *j, char *auc, char *logloss, double *recoveries)
{
    char rec[64];
    assert_int_equal(tr_metrics_text(j->metrics, "auc", auc, 64), 0);
    assert_int_equal(tr_metrics_text(j->metrics, "logloss", logloss, 64), 0);
    assert_int_equal(tr_metrics_text(j->metrics, "recoveries", rec, sizeof rec), 0);
    *recoveries = atof(rec);
}

static void test_sync_rollback_is_bitwise_equal(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    job a, b;
    start_job(&a, "syncA", false);
    run(&a, "sync", false);
    stop_job(&a);
    start_job(&b, "syncB", true);
    run(&b, "sync", true);
    stop_job(&b);
    char aucA[64], llA[64], aucB[64], llB[64];
    double recA, recB;
    read_metrics(&a, aucA, llA, &recA);
    read_metrics(&b, aucB, llB, &recB);
    fprintf(stderr, "coord train sync: clean auc %s logloss %s; killed auc %s logloss %s\n", aucA,
            llA, aucB, llB);
    assert_true(recA == 0 && recB == 1);
    assert_string_equal(aucA, aucB);
    assert_string_equal(llA, llB);
}

static void test_async_partial_keeps_auc(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    job a, b;
    start_job(&a, "asyncA", false);
    run(&a, "async", false);
    stop_job(&a);
    start_job(&b, "asyncB", true);
    run(&b, "async", true);
    stop_job(&b);
    char aucA[64], llA[64], aucB[64], llB[64];
    double recA, recB;
    read_metrics(&a, aucA, llA, &recA);
    read_metrics(&b, aucB, llB, &recB);
    fprintf(stderr, "coord train async: clean auc %s; killed (partial) auc %s\n", aucA, aucB);
    assert_true(recA == 0 && recB == 1);
    assert_true(fabs(atof(aucA) - atof(aucB)) <= 0.003);
}

/* The chief dies: a second train process of the same job waits while the first leads, takes
 * over when it is killed (after its session expires), resumes from the newest checkpoint and
 * finishes the job; in sync mode it ends bitwise equal to an uninterrupted run. */
static void test_second_trainer_takes_over_from_a_dead_chief(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    job a, b;
    start_job(&a, "chiefA", false);
    run(&a, "sync", false);
    stop_job(&a);
    start_job(&b, "chiefB", false);
    double until = gr_now_s() + RUN_BUDGET_S;
    pid_t first = spawn_train(&b, "sync");
    char log1[400];
    snprintf(log1, sizeof log1, "%s", b.log);
    char name[GR_CKPT_NAME_MAX];
    uint64_t step = 0;
    while (gr_ckpt_latest(b.ckpath, name, &step) != GR_OK) {
        int st;
        assert_int_equal(waitpid(first, &st, WNOHANG), 0);
        assert_true(gr_now_s() < until);
        usleep(2000);
    }
    snprintf(b.log, sizeof b.log, "%s/train-chiefB-2.log", tmp);
    pid_t second = spawn_train(&b, "sync"); /* waits: the first one leads */
    usleep(300000);
    int st;
    assert_int_equal(waitpid(first, &st, WNOHANG), 0);
    assert_int_equal(kill(first, SIGKILL), 0);
    waitpid(first, &st, 0);
    fprintf(stderr, "coord train: killed the chief after checkpoint %s\n", name);
    int rc = wait_exit(second, until, "the second trainer");
    char *txt = NULL;
    assert_int_equal(gr_read_file(b.log, &txt, NULL), 0);
    if (rc) fprintf(stderr, "%s\n", txt);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(txt, "waiting to take over as its chief"));
    free(txt);
    stop_job(&b);
    char aucA[64], llA[64], aucB[64], llB[64];
    double recA, recB;
    read_metrics(&a, aucA, llA, &recA);
    read_metrics(&b, aucB, llB, &recB);
    fprintf(stderr, "coord train chief: clean auc %s; taken over auc %s\n", aucA, aucB);
    assert_string_equal(aucA, aucB);
    assert_string_equal(llA, llB);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_rollback_is_bitwise_equal),
        cmocka_unit_test(test_async_partial_keeps_auc),
        cmocka_unit_test(test_second_trainer_takes_over_from_a_dead_chief),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
