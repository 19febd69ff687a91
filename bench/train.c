/* `granary bench train`: end-to-end training throughput and quality on generated data. Runs
 * DLRM with the local backend pipelined and sequential (the in-run baseline), the reader alone
 * (parse ceiling), and PyTorch's DLRM on the same files (bench/torch_dlrm.py) when
 * /usr/bin/python3 has torch; reports examples/s and test AUC beside the teacher's AUC. */
#include "bench/bench.h"
#include "granary/train.h"

#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: granary bench train [--json] [--full] [--rows N] [--test-rows M] "
               "[--workers W] [--no-torch]\n"
               "  --rows N       training rows generated (default 200000; --full: 1000000)\n"
               "  --test-rows M  test rows (default 20000; --full: 100000)\n"
               "  --workers W    worker threads (default 2)\n"
               "  --no-torch     skip the PyTorch baseline\n"
               "  --json         print a final JSON line with the figures\n");
}

static bool find_script(char *path, size_t cap)
{
    const char *env = getenv("GR_TORCH_DLRM_SCRIPT");
    if (env && access(env, R_OK) == 0) {
        snprintf(path, cap, "%s", env);
        return true;
    }
    if (access("bench/torch_dlrm.py", R_OK) == 0) {
        snprintf(path, cap, "bench/torch_dlrm.py");
        return true;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return false;
    exe[n] = '\0';
    char *dir = dirname(exe);
    const char *ups[] = {"/../bench/torch_dlrm.py", "/../../bench/torch_dlrm.py"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(path, cap, "%s%s", dir, ups[i]);
        if (access(path, R_OK) == 0) return true;
    }
    return false;
}

/* PyTorch DLRM on the same files: examples/s and AUC, or -1 when unavailable. */
static void run_torch(const char *dir, unsigned threads, double *eps, double *auc)
{
    *eps = *auc = -1;
    if (access("/usr/bin/python3", X_OK) != 0) return;
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) return;
    char script[PATH_MAX];
    if (!find_script(script, sizeof script)) return;
    char cmd[2 * PATH_MAX + 256];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 '%s' --train '%s/train.tsv' --test '%s/test.tsv' --threads %u 2>&1",
             script, dir, dir, threads);
    FILE *f = popen(cmd, "r");
    if (!f) return;
    char line[2048];
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"examples_per_sec\": ");
        if (p) *eps = strtod(p + 20, NULL);
        p = strstr(line, "\"auc\": ");
        if (p) *auc = strtod(p + 7, NULL);
    }
    int st = pclose(f);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) *eps = *auc = -1;
}

/* Parse-only throughput of the reader over the training file, rows/s. */
static double run_reader(const char *path)
{
    gr_criteo_opts o;
    gr_criteo_opts_default(&o);
    gr_criteo_reader *r;
    if (gr_criteo_open(path, &o, &r)) return -1;
    gr_batch b;
    if (gr_batch_init(&b, o.batch)) {
        gr_criteo_close(r);
        return -1;
    }
    double t0 = gr_now_s();
    uint64_t n = 0;
    while (gr_criteo_next(r, &b) == 0 && b.n) n += b.n;
    double secs = gr_now_s() - t0;
    gr_batch_fini(&b);
    gr_criteo_close(r);
    return secs > 0 ? (double)n / secs : -1;
}

static int run_granary(const char *dir, unsigned workers, bool pipeline, gr_train_result *res)
{
    char train[PATH_MAX], test[PATH_MAX];
    snprintf(train, sizeof train, "%s/train.tsv", dir);
    snprintf(test, sizeof test, "%s/test.tsv", dir);
    gr_train_opts o;
    gr_train_opts_default(&o, GR_MODEL_DLRM);
    o.train_path = train;
    o.test_path = test;
    o.workers = workers;
    o.pipeline = pipeline;
    o.progress_s = 0;
    gr_train_backend be;
    int rc = gr_local_backend_create(NULL, &be);
    if (rc) return rc;
    rc = gr_train_run(&o, &be, res);
    gr_train_backend_destroy(&be);
    return rc;
}

/* A figure, or `missing` when it was not measured (negative). */
static void num(char *buf, size_t cap, double v, const char *fmt, const char *missing)
{
    if (v < 0)
        snprintf(buf, cap, "%s", missing);
    else
        snprintf(buf, cap, fmt, v);
}

int gr_bench_train(int argc, char **argv)
{
    bool json = false, full = false, torch = true;
    uint64_t rows = 0, test_rows = 0;
    unsigned workers = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--full")) {
            full = true;
        } else if (!strcmp(a, "--no-torch")) {
            torch = false;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "--rows") || !strcmp(a, "--test-rows") || !strcmp(a, "--workers")) &&
                   i + 1 < argc) {
            char *end;
            unsigned long long v = strtoull(argv[++i], &end, 10);
            if (*end || !*argv[i] || v == 0 || (!strcmp(a, "--workers") && v > 64)) {
                fprintf(stderr, "granary bench train: bad value '%s' for %s\n", argv[i], a);
                return 2;
            }
            if (!strcmp(a, "--rows")) rows = v;
            else if (!strcmp(a, "--test-rows")) test_rows = v;
            else workers = (unsigned)v;
        } else {
            fprintf(stderr, "granary bench train: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!rows) rows = full ? 1000000 : 200000;
    if (!test_rows) test_rows = full ? 100000 : 20000;

    char dir[] = "/tmp/granary_bench_train_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("granary bench train: mkdtemp");
        return 1;
    }
    int status = 1;
    gr_datagen_opts go = {.train_rows = rows, .test_rows = test_rows, .seed = 1, .threads = 2};
    gr_datagen_result gd;
    printf("granary bench train: DLRM (dim 16, 13-64-32-16, 367-128-64-1), batch 1024, %u "
           "workers, 1 epoch; datagen seed 1, %llu train / %llu test rows\n",
           workers, (unsigned long long)rows, (unsigned long long)test_rows);
    if (gr_datagen_run(dir, &go, &gd)) {
        fprintf(stderr, "granary bench train: datagen: %s\n", gr_errmsg());
        goto out;
    }
    printf("datagen: %.2f s (%.0f rows/s); teacher test AUC %.4f logloss %.4f\n", gd.seconds,
           (double)(rows + test_rows) / gd.seconds, gd.teacher_auc, gd.teacher_logloss);
    char train[PATH_MAX];
    snprintf(train, sizeof train, "%s/train.tsv", dir);
    double parse = run_reader(train);
    printf("reader alone (1 thread, parse only): %.0f rows/s\n", parse);
    gr_train_result pipe, seq;
    if (run_granary(dir, workers, true, &pipe) || run_granary(dir, workers, false, &seq)) {
        fprintf(stderr, "granary bench train: %s\n", gr_errmsg());
        goto out;
    }
    double t_eps = -1, t_auc = -1;
    if (torch) run_torch(dir, workers, &t_eps, &t_auc);
    printf("\n%-28s %14s %9s %9s\n", "run", "examples/s", "test AUC", "logloss");
    printf("%-28s %14.0f %9.4f %9.4f\n", "granary, pipelined", pipe.examples_per_sec,
           pipe.test_auc, pipe.test_logloss);
    printf("%-28s %14.0f %9.4f %9.4f\n", "granary, --no-pipeline", seq.examples_per_sec,
           seq.test_auc, seq.test_logloss);
    char te[32], ta[32];
    num(te, sizeof te, t_eps, "%.0f", "n/a");
    num(ta, sizeof ta, t_auc, "%.4f", "n/a");
    printf("%-28s %14s %9s %9s\n", "pytorch (torch_dlrm.py)", te, ta, "");
    printf("%-28s %14s %9.4f %9.4f\n", "teacher (ceiling)", "", gd.teacher_auc,
           gd.teacher_logloss);
    printf("\npipeline speedup %.2fx; AUC gap to the teacher %.4f%s\n",
           pipe.examples_per_sec / seq.examples_per_sec, gd.teacher_auc - pipe.test_auc,
           t_eps < 0 && torch ? "; PyTorch baseline skipped (needs /usr/bin/python3 with torch: "
                                "GRANARY_TORCH=1 bash scripts/setup)"
                              : "");
    if (json) {
        num(te, sizeof te, t_eps, "%.1f", "null");
        num(ta, sizeof ta, t_auc, "%.6f", "null");
        printf("{\"bench\":\"train\",\"rows\":%llu,\"test_rows\":%llu,\"workers\":%u,"
               "\"examples_per_sec\":%.1f,\"auc\":%.6f,\"logloss\":%.6f,"
               "\"no_pipeline_examples_per_sec\":%.1f,\"no_pipeline_auc\":%.6f,"
               "\"reader_rows_per_sec\":%.0f,\"teacher_auc\":%.6f,"
               "\"torch_examples_per_sec\":%s,\"torch_auc\":%s}\n",
               (unsigned long long)rows, (unsigned long long)test_rows, workers,
               pipe.examples_per_sec, pipe.test_auc, pipe.test_logloss, seq.examples_per_sec,
               seq.test_auc, parse, gd.teacher_auc, te, ta);
    }
    status = 0;
out:;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "granary bench train: could not remove %s\n", dir);
    return status;
}
