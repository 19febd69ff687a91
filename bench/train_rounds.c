/* `granary bench train`'s speed ratio against PyTorch, taken in rounds.
 *
 * This machine's speed moves by tens of percent from one minute to the next (PyTorch alone
 * ran at 40-68 k examples/s over one session), and a run that starts a process touches memory
 * the host has to back anew, which the runs after it in the same process find already backed.
 * So the ratio is taken in rounds: each round runs `granary train` as a user runs it (a fresh
 * process, its defaults) right beside a PyTorch run, the two in turn going first, and the
 * figure is the median of the rounds' ratios. */
#include "bench/train_int.h"
#include "granary/core.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int gr_bench_cli_train(const char *exe, const char *dir, const gr_bench_cli_args *a,
                       double *eps, double *auc, char *why, size_t cap)
{
    *eps = *auc = -1;
    char self[PATH_MAX], train[PATH_MAX], test[PATH_MAX], metrics[PATH_MAX], lag[32];
    if (!exe) {
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) {
            snprintf(why, cap, "cannot find this binary (/proc/self/exe)");
            return -1;
        }
        self[n] = 0;
        exe = self;
    }
    snprintf(train, sizeof train, "%s/train.tsv", dir);
    snprintf(test, sizeof test, "%s/test.tsv", dir);
    snprintf(metrics, sizeof metrics, "%s/round_metrics.json", dir);
    snprintf(lag, sizeof lag, "%ld", a->dense_lag);
    unlink(metrics);
    const char *argv[16];
    int k = 0;
    argv[k++] = exe;
    argv[k++] = "train";
    argv[k++] = "--train";
    argv[k++] = train;
    argv[k++] = "--test";
    argv[k++] = test;
    argv[k++] = "--progress";
    argv[k++] = "0";
    argv[k++] = "--metrics-out";
    argv[k++] = metrics;
    if (a->no_direct) argv[k++] = "--no-direct";
    if (a->dense_lag >= 0) {
        argv[k++] = "--dense-lag";
        argv[k++] = lag;
    }
    argv[k] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, cap, "cannot start granary train (fork failed)");
        return -1;
    }
    if (pid == 0) {
        /* Its own report goes nowhere: the figures come from its metrics file. */
        if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr)) _exit(126);
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    int st;
    pid_t got;
    while ((got = waitpid(pid, &st, 0)) < 0 && errno == EINTR) {
    }
    if (got < 0) {
        snprintf(why, cap, "cannot wait for granary train: %s", strerror(errno));
        return -1;
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        if (WIFSIGNALED(st))
            snprintf(why, cap, "granary train was killed by signal %d", WTERMSIG(st));
        else
            snprintf(why, cap, "granary train failed (exit status %d)", WEXITSTATUS(st));
        return -1;
    }
    char *text = NULL;
    size_t len = 0;
    cJSON *j = gr_read_file(metrics, &text, &len) == GR_OK ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "examples_per_sec");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "auc");
    int rc = -1;
    if (cJSON_IsNumber(e) && e->valuedouble > 0) {
        *eps = e->valuedouble;
        *auc = cJSON_IsNumber(u) ? u->valuedouble : -1;
        rc = 0;
    } else {
        snprintf(why, cap, "granary train's metrics (%s) hold no examples_per_sec", metrics);
    }
    cJSON_Delete(j);
    return rc;
}

size_t gr_bench_rounds(const char *dir, const gr_bench_cli_args *a, unsigned threads, size_t n,
                       double first_torch_eps, double first_torch_auc, gr_bench_round *out,
                       char *why, size_t cap)
{
    size_t done = 0;
    for (size_t i = 0; i < n; i++) {
        gr_bench_round r = {.eps = -1, .auc = -1, .torch_eps = -1, .torch_auc = -1};
        r.torch_first = i % 2 == 0;
        fprintf(stderr, "bench train: round %zu of %zu: %s ...\n", i + 1, n,
                r.torch_first ? "PyTorch, then granary train" : "granary train, then PyTorch");
        bool ok = true;
        for (int part = 0; part < 2 && ok; part++) {
            bool torch_now = (part == 0) == r.torch_first;
            if (torch_now) {
                if (i == 0 && first_torch_eps > 0) {
                    r.torch_eps = first_torch_eps;
                    r.torch_auc = first_torch_auc;
                } else {
                    gr_bench_run_torch(dir, threads, &r.torch_eps, &r.torch_auc);
                    if (r.torch_eps <= 0) {
                        snprintf(why, cap, "%s", gr_bench_torch_why);
                        ok = false;
                    }
                }
            } else if (gr_bench_cli_train(NULL, dir, a, &r.eps, &r.auc, why, cap)) {
                ok = false;
            }
        }
        if (!ok) break;
        out[done++] = r;
    }
    return done;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double gr_bench_rounds_median_ratio(const gr_bench_round *r, size_t n)
{
    if (n == 0) return -1;
    double *v = malloc(n * sizeof *v);
    if (!v) return -1;
    for (size_t i = 0; i < n; i++) v[i] = gr_bench_round_ratio(&r[i]);
    qsort(v, n, sizeof *v, cmp_double);
    double m = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    free(v);
    return m;
}
