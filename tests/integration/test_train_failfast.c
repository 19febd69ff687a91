/* `granary train` fails fast and loudly, and keeps the model (issue 16):
 *  - every path is checked before training: a missing --train/--test/--auth-file, an
 *    unwritable --metrics-out or --ckpt-dir and a --resume root that does not exist are refused
 *    (exit 2) with a message naming the flag, before any step;
 *  - a final checkpoint that fails exits 1 and says the model is not saved;
 *  - the first SIGINT/SIGTERM stops at a step boundary, writes the checkpoint and the metrics,
 *    prints how to resume and exits 130/143 (embedded cluster and --servers); a second one ends
 *    the process at once;
 *  - progress lines keep coming with --ckpt-dir and show % done, the epoch and an ETA;
 *  - every run ends saying where the model is, or that it was not saved;
 *  - output to a closed pipe does not kill it (EPIPE, not SIGPIPE): the model is still saved;
 *  - the embedded shards' info lines stay out of train's output unless GRANARY_LOG asks;
 *  - --auth-file errors are one clean line; `granary stats` against an HTTP port says "not a
 *    granary server". */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "granary/http.h"
#include "support/ps_harness.h"
#include "support/train_fixture.h"

static tr_fixture g_fx;
static char g_tmp[256];

static int setup(void **state)
{
    (void)state;
    if (tr_fixture_make(&g_fx, "failfast", 16)) return -1;
    return ps_test_tmpdir(g_tmp, sizeof g_tmp);
}

static int teardown(void **state)
{
    (void)state;
    ps_test_rmdir(g_tmp);
    return tr_fixture_remove(&g_fx);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Starts `granary ARGS...` with stdout and stderr into the file `out` (env "NAME=VALUE" or
 * NULL); it dies with the test. */
static pid_t start(const char *const *args, const char *out, const char *env)
{
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)ps_test_granary_bin();
    for (; args[n - 1] && n < 63; n++) argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        dup2(fd, 1);
        dup2(fd, 2);
        if (env) putenv((char *)env);
        else unsetenv("GRANARY_LOG");
        execv(argv[0], argv);
        _exit(127);
    }
    close(fd);
    return pid;
}

/* Waits up to timeout_ms; returns the raw wait status, or -1 (then the child is killed). */
static int finish(pid_t pid, unsigned timeout_ms)
{
    uint64_t end = now_ms() + timeout_ms;
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return st;
        if (r < 0 || now_ms() > end) break;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return strdup("");
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strdup(buf);
}

/* Waits until the file holds `text` (true) or timeout_ms passed. */
static bool wait_text(const char *path, const char *text, unsigned timeout_ms)
{
    uint64_t end = now_ms() + timeout_ms;
    while (now_ms() < end) {
        char *s = slurp(path);
        bool found = strstr(s, text) != NULL;
        free(s);
        if (found) return true;
        usleep(20000);
    }
    return false;
}

/* Runs granary to its end (60 s at most); its exit code (or 1000 + signal), output in *out. */
static int run(const char *const *args, char **out, const char *env)
{
    char path[400];
    snprintf(path, sizeof path, "%s/out.txt", g_tmp);
    pid_t pid = start(args, path, env);
    assert_true(pid > 0);
    int st = finish(pid, 60000);
    *out = slurp(path);
    if (st < 0) fail_msg("granary did not finish:\n%s", *out);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1000 + WTERMSIG(st);
}

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

#define SMALL "--dim", "8", "--bottom", "16", "--top", "32", "--batch", "256"

static void expect_refused(const char *const *args, const char *msg)
{
    char *out;
    int rc = run(args, &out, NULL);
    if (rc != 2 || !strstr(out, msg) || strstr(out, "train: done") || strstr(out, "examples/s"))
        fail_msg("wanted exit 2 before training with '%s', got %d:\n%s", msg, rc, out);
    free(out);
}

static void test_paths_checked_first(void **state)
{
    (void)state;
    char dir_as_file[300], ckfile[300], missing[300];
    snprintf(dir_as_file, sizeof dir_as_file, "%s", g_tmp);
    snprintf(ckfile, sizeof ckfile, "%s/plainfile", g_tmp);
    snprintf(missing, sizeof missing, "%s/no-such-root", g_tmp);
    FILE *f = fopen(ckfile, "w");
    assert_non_null(f);
    fclose(f);
    expect_refused((const char *const[]){"train", "--train", g_fx.train, "--test",
                                         "/nonexistent/test.tsv", NULL},
                   "granary train: --test /nonexistent/test.tsv: No such file or directory");
    expect_refused((const char *const[]){"train", "--train", g_tmp, NULL},
                   "is a directory, not a file");
    expect_refused((const char *const[]){"train", "--train", g_fx.train, "--metrics-out",
                                         dir_as_file, NULL},
                   "is a directory; name a file");
    expect_refused((const char *const[]){"train", "--train", g_fx.train, "--metrics-out",
                                         "/proc/m.json", NULL},
                   "granary train: --metrics-out /proc/m.json: cannot create a file in /proc");
    expect_refused((const char *const[]){"train", "--train", g_fx.train, "--ckpt-dir",
                                         "/proc/nope", NULL},
                   "granary train: --ckpt-dir /proc/nope: cannot create /proc/nope");
    char under_file[400];
    snprintf(under_file, sizeof under_file, "%s/sub", ckfile);
    expect_refused((const char *const[]){"train", "--train", g_fx.train, "--ckpt-dir", under_file,
                                         NULL},
                   "is not a directory");
    /* A mistyped --resume used to train from scratch and exit 0. */
    expect_refused((const char *const[]){"train", "--train", g_fx.train, "--resume", missing, NULL},
                   "--resume");
    expect_refused((const char *const[]){"train", "--train", g_fx.train, "--servers",
                                         "127.0.0.1:1", "--auth-file", "/nonexistent/secret", NULL},
                   "granary train: --auth-file /nonexistent/secret: No such file or directory\n");
    /* The same root as --ckpt-dir starts a job that a rerun of the same command resumes. */
    char *out;
    char ck[300];
    snprintf(ck, sizeof ck, "%s/startjob", g_tmp);
    assert_int_equal(run((const char *const[]){"train", "--train", g_fx.train, SMALL, "--progress",
                                               "0", "--max-steps", "3", "--ckpt-dir", ck,
                                               "--resume", ck, NULL},
                         &out, NULL),
                     0);
    assert_non_null(strstr(out, "nothing to resume"));
    assert_non_null(strstr(out, "model saved to "));
    free(out);
}

/* The model of a run is its final checkpoint: when that fails the run must not say success. */
static void test_final_checkpoint_failure_exits_1(void **state)
{
    (void)state;
    char root[300], blocker[400], metrics[400];
    snprintf(root, sizeof root, "%s/root", g_tmp);
    assert_int_equal(mkdir(root, 0755), 0);
    snprintf(blocker, sizeof blocker, "%s/blk", root);
    FILE *f = fopen(blocker, "w"); /* a file where the checkpoint root's parent should be */
    assert_non_null(f);
    fclose(f);
    snprintf(metrics, sizeof metrics, "%s/m.json", g_tmp);
    ps_test_server s;
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, (const char *const[]){"--ckpt-root", root,
                                                                            NULL}),
                     0);
    char *out;
    int rc = run((const char *const[]){"train", "--train", g_fx.train, SMALL, "--progress", "0",
                                       "--servers", s.addr, "--ckpt-dir", "blk/x", "--max-steps",
                                       "4", "--metrics-out", metrics, NULL},
                 &out, NULL);
    if (rc != 1 || !strstr(out, "the final checkpoint failed") ||
        !strstr(out, "the model of this run is NOT saved"))
        fail_msg("wanted exit 1 and the model reported lost, got %d:\n%s", rc, out);
    free(out);
    char *m = slurp(metrics);
    assert_non_null(strstr(m, "\"ckpt_final_failed\":\ttrue"));
    assert_non_null(strstr(m, "\"model_saved\":\tnull"));
    free(m);
    /* A --resume root the servers do not have is refused before the first step. */
    rc = run((const char *const[]){"train", "--train", g_fx.train, SMALL, "--progress", "0",
                                   "--servers", s.addr, "--resume", "nope", NULL},
             &out, NULL);
    if (rc != 1 || !strstr(out, "--resume nope: no such checkpoint root") ||
        strstr(out, "train: done"))
        fail_msg("wanted the resume refused, got %d:\n%s", rc, out);
    free(out);
    ps_test_server_stop(&s, 0);
}

/* Progress lines used to stop with --ckpt-dir: every push woke the wait between them, which
 * then started over. */
static void test_progress_with_checkpoints(void **state)
{
    (void)state;
    char ck[300];
    snprintf(ck, sizeof ck, "%s/prog", g_tmp);
    char *out;
    assert_int_equal(run((const char *const[]){"train", "--train", g_fx.train, SMALL, "--epochs",
                                               "4", "--progress", "0.1", "--ckpt-dir", ck,
                                               "--ckpt-every", "50", NULL},
                         &out, NULL),
                     0);
    int lines = count(out, "% done, epoch ");
    if (lines < 3 || !strstr(out, ", ETA ") || !strstr(out, "epoch 4/4") ||
        !strstr(out, "s finished; "))
        fail_msg("wanted progress lines with %% done, epoch and ETA, got %d:\n%s", lines, out);
    /* The end: where the model is and how to continue. */
    char want[400];
    snprintf(want, sizeof want, "train: model saved to %s/step-", ck);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof want, "resume with:\n  granary train --train %s", g_fx.train);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof want, "--resume %s\n", ck);
    assert_non_null(strstr(out, want));
    /* Shards are quiet under train unless GRANARY_LOG asks. */
    assert_null(strstr(out, " I shard"));
    free(out);
    assert_int_equal(run((const char *const[]){"train", "--train", g_fx.train, SMALL, "--progress",
                                               "0", "--max-steps", "2", NULL},
                         &out, "GRANARY_LOG=info"),
                     0);
    assert_non_null(strstr(out, " I shard 0 of 1 listening on"));
    assert_non_null(strstr(out, "train: the model was not saved (give --ckpt-dir DIR to keep it)"));
    free(out);
    /* A level that is not one says so. */
    assert_int_equal(run((const char *const[]){"train", "--train", g_fx.train, SMALL, "--progress",
                                               "0", "--max-steps", "1", NULL},
                         &out, "GRANARY_LOG=verbose"),
                     0);
    assert_non_null(strstr(out, "granary: GRANARY_LOG=verbose is not one of error, warn, info, "
                                "debug; logging at info\n"));
    assert_int_equal(count(out, "GRANARY_LOG=verbose"), 1);
    free(out);
}

/* Starts a long run, waits for its first progress line, sends `sig`; returns its output and
 * wait status. */
static int interrupt(const char *const *args, int sig, char **out)
{
    char path[400];
    snprintf(path, sizeof path, "%s/sig.txt", g_tmp);
    pid_t pid = start(args, path, NULL);
    assert_true(pid > 0);
    if (!wait_text(path, ", ETA ", 60000)) { /* a line after the first steps */
        kill(pid, SIGKILL);
        finish(pid, 5000);
        fail_msg("no progress line:\n%s", slurp(path));
    }
    kill(pid, sig);
    int st = finish(pid, 60000);
    *out = slurp(path);
    if (st < 0) fail_msg("granary did not stop after signal %d:\n%s", sig, *out);
    return st;
}

static char *metric_value(const char *json, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(json, k);
    return p ? strndup(p + strlen(k), strcspn(p + strlen(k), ",}")) : strdup("(none)");
}

static void test_sigint_stops_sync_and_resumes(void **state)
{
    (void)state;
    char ck[300], metrics[300];
    snprintf(ck, sizeof ck, "%s/sigint", g_tmp);
    snprintf(metrics, sizeof metrics, "%s/sigint.json", g_tmp);
    char *out;
    int st = interrupt((const char *const[]){"train", "--train", g_fx.train, "--test", g_fx.test,
                                             SMALL, "--mode", "sync", "--epochs", "100",
                                             "--progress", "0.05", "--ckpt-dir", ck,
                                             "--metrics-out", metrics, NULL},
                       SIGINT, &out);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 130 || !strstr(out, "stopping at the next step") ||
        !strstr(out, "resume with:") || !strstr(out, "test: not scored (the run was stopped)") ||
        !strstr(out, "train: stopped by SIGINT after "))
        fail_msg("wanted a clean stop with status 130, got %d:\n%s", st, out);
    free(out);
    char *m = slurp(metrics);
    char *stopped = metric_value(m, "stopped"), *saved = metric_value(m, "model_saved");
    const char *steps = strstr(m, "\"worker_steps\":");
    assert_non_null(steps);
    assert_string_equal(stopped, "\ttrue");
    assert_non_null(strstr(saved, "/step-"));
    /* Sync: both workers stopped after the same step. */
    unsigned a = 0, b = 0;
    assert_int_equal(sscanf(steps, "\"worker_steps\": [%u, %u]", &a, &b), 2);
    assert_int_equal(a, b);
    assert_true(a > 0);
    free(m);
    free(stopped);
    free(saved);
    /* The printed command continues from that checkpoint. */
    char maxs[32];
    snprintf(maxs, sizeof maxs, "%u", a + 2);
    assert_int_equal(run((const char *const[]){"train", "--train", g_fx.train, SMALL, "--mode",
                                               "sync", "--epochs", "100", "--progress", "0",
                                               "--ckpt-dir", ck, "--resume", ck, "--max-steps",
                                               maxs, NULL},
                         &out, NULL),
                     0);
    char want[64];
    snprintf(want, sizeof want, "(step %u)", a);
    if (!strstr(out, "train: resumed from") || !strstr(out, want))
        fail_msg("wanted a resume from step %u:\n%s", a, out);
    free(out);
}

static void test_sigterm_stops_async_on_servers(void **state)
{
    (void)state;
    char root[300], metrics[300], list[256];
    snprintf(root, sizeof root, "%s/sroot", g_tmp);
    assert_int_equal(mkdir(root, 0755), 0);
    snprintf(metrics, sizeof metrics, "%s/sigterm.json", g_tmp);
    ps_test_server s[2];
    assert_int_equal(ps_test_cluster_start(s, 2, (const char *const[]){"--ckpt-root", root, NULL},
                                           list, sizeof list),
                     0);
    char *out;
    int st = interrupt((const char *const[]){"train", "--train", g_fx.train, SMALL, "--mode",
                                             "async", "--epochs", "100", "--progress", "0.05",
                                             "--servers", list, "--ckpt-dir", "job",
                                             "--metrics-out", metrics, NULL},
                       SIGTERM, &out);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 143 || !strstr(out, "train: model saved to job/step-") ||
        !strstr(out, "(on the servers, under their --ckpt-root)"))
        fail_msg("wanted a clean stop with status 143, got %d:\n%s", st, out);
    free(out);
    char *m = slurp(metrics);
    assert_non_null(strstr(m, "\"stopped\":\ttrue"));
    free(m);
    char latest[400];
    snprintf(latest, sizeof latest, "%s/job", root);
    static char buf[4096];
    assert_int_equal(ps_test_run_granary((const char *const[]){"ckpt", "latest", latest, NULL},
                                         buf, sizeof buf),
                     0);
    assert_non_null(strstr(buf, "step-"));
    /* The text of `stats` shows the sync job and the checkpoints (not only --json). */
    assert_int_equal(ps_test_run_granary((const char *const[]){"stats", "--server", s[0].addr, NULL},
                                         buf, sizeof buf),
                     0);
    if (!strstr(buf, "\nsync job: none (") || !strstr(buf, "\ncheckpoints: ") ||
        !strstr(buf, "\nlast save: step-"))
        fail_msg("stats lacks the sync job or the checkpoints:\n%s", buf);
    ps_test_cluster_stop(s, 2);
}

/* A second signal does not wait for the stop: worker 1 takes ~1000x its compute time per
 * batch, so a clean stop would take many seconds. */
static void test_second_signal_aborts(void **state)
{
    (void)state;
    char path[400];
    snprintf(path, sizeof path, "%s/abort.txt", g_tmp);
    pid_t pid = start((const char *const[]){"train", "--train", g_fx.train, SMALL, "--mode",
                                            "async", "--epochs", "100", "--progress", "0.05",
                                            "--straggler", "1:1000", NULL},
                      path, NULL);
    assert_true(pid > 0);
    assert_true(wait_text(path, ", ETA ", 60000));
    kill(pid, SIGINT);
    assert_true(wait_text(path, "stopping at the next step boundary", 10000));
    uint64_t t0 = now_ms();
    kill(pid, SIGINT);
    int st = finish(pid, 10000);
    char *out = slurp(path);
    if (st < 0 || !WIFSIGNALED(st) || WTERMSIG(st) != SIGINT)
        fail_msg("wanted the process ended by SIGINT, got %d:\n%s", st, out);
    assert_true(now_ms() - t0 < 5000);
    assert_null(strstr(out, "train: done"));
    free(out);
}

static void http_handler(void *ctx, const gr_http_request *req, gr_http_response *resp)
{
    (void)ctx;
    (void)req;
    gr_http_printf(resp, 200, "text/plain", "hello\n");
}

static void test_messages(void **state)
{
    (void)state;
    static char out[8192];
    /* One clean line for a missing auth file, and for a directory (it used to read "cannot
     * read the auth file: cannot read the auth file: uch file or directory"). */
    assert_int_equal(ps_test_run_granary((const char *const[]){"stats", "--server", "127.0.0.1:1",
                                                               "--auth-file", "/nonexistent/s",
                                                               NULL},
                                         out, sizeof out),
                     1);
    assert_string_equal(out, "granary stats: cannot read the auth file: cannot open "
                             "/nonexistent/s: No such file or directory\n");
    assert_int_equal(ps_test_run_granary((const char *const[]){"stats", "--server", "127.0.0.1:1",
                                                               "--auth-file", g_tmp, NULL},
                                         out, sizeof out),
                     1);
    char want[512];
    snprintf(want, sizeof want, "granary stats: cannot read the auth file: %s is not a regular "
             "file\n", g_tmp);
    assert_string_equal(out, want);
    /* `granary --help` names every ckpt verb. */
    assert_int_equal(ps_test_run_granary((const char *const[]){"--help", NULL}, out, sizeof out), 0);
    assert_non_null(strstr(out, "granary ckpt list|inspect|verify|reshard|export|latest|retain"));
    /* `granary stats` against an HTTP port. */
    gr_http_config hc = {.listen = "127.0.0.1:0", .handler = http_handler};
    gr_http_server *h;
    assert_int_equal(gr_http_start(&hc, &h), 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", gr_http_port(h));
    int rc = ps_test_run_granary((const char *const[]){"stats", "--server", addr, NULL}, out,
                                 sizeof out);
    if (rc != 1 || !strstr(out, "is not a granary server: it answered in HTTP"))
        fail_msg("wanted 'not a granary server', got %d: %s", rc, out);
    /* The same for train --servers. */
    rc = ps_test_run_granary((const char *const[]){"train", "--train", g_fx.train, "--servers",
                                                   addr, NULL},
                             out, sizeof out);
    gr_http_stop(h);
    char want_http[128];
    snprintf(want_http, sizeof want_http, "granary train: %s is not a granary server: it answered "
             "in HTTP", addr);
    if (rc != 1 || !strstr(out, want_http))
        fail_msg("wanted 'not a granary server' from train, got %d: %s", rc, out);
}

/* Output to a reader that went away (a supervisor's log pipe closed, `| head`): the writes fail
 * with EPIPE, and the run still trains, saves its model and its metrics, and exits 0 (before,
 * SIGPIPE killed it with status 141 at its first progress line, model unsaved). */
static void test_closed_output_pipe_keeps_the_model(void **state)
{
    (void)state;
    char ck[300], metrics[300];
    snprintf(ck, sizeof ck, "%s/pipe", g_tmp);
    snprintf(metrics, sizeof metrics, "%s/pipe-metrics.json", g_tmp);
    const char *args[] = {ps_test_granary_bin(), "train", "--train", g_fx.train, SMALL,
                          "--progress", "0.01", "--max-steps", "20", "--ckpt-dir", ck,
                          "--metrics-out", metrics, NULL};
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    close(fds[0]); /* nobody will ever read */
    pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        signal(SIGPIPE, SIG_DFL); /* what a shell gives it: an ignored signal would be inherited */
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        unsetenv("GRANARY_LOG");
        execv(args[0], (char *const *)args);
        _exit(127);
    }
    close(fds[1]);
    int st = finish(pid, 60000);
    assert_true(st >= 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("wanted exit 0 with a closed output pipe, got %s %d",
                 WIFEXITED(st) ? "exit" : "signal",
                 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    char *js = slurp(metrics);
    assert_non_null(strstr(js, "\"steps\""));
    free(js);
    char step[400];
    snprintf(step, sizeof step, "%s/step-000000000020", ck); /* the final checkpoint */
    struct stat sb;
    assert_int_equal(stat(step, &sb), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_paths_checked_first),
        cmocka_unit_test(test_final_checkpoint_failure_exits_1),
        cmocka_unit_test(test_progress_with_checkpoints),
        cmocka_unit_test(test_sigint_stops_sync_and_resumes),
        cmocka_unit_test(test_sigterm_stops_async_on_servers),
        cmocka_unit_test(test_second_signal_aborts),
        cmocka_unit_test(test_closed_output_pipe_keeps_the_model),
    };
    return cmocka_run_group_tests_name("train_failfast", tests, setup, teardown);
}
