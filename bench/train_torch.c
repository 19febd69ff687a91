/* `granary bench train`: PyTorch DLRM on the bench's files (train_torch.c). */
#include "bench/train_int.h"

#include "bench/bench.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* PyTorch DLRM on the same files with granary's DLRM defaults (dim 16, bottom 64,32, top
 * 128,64, Adagrad 0.05 for embeddings, Adam 1e-3 dense, batch 1024) with `threads` torch (and
 * OpenBLAS) threads: examples/s and AUC, or -1 when unavailable. */
/* Why the last gr_bench_run_torch gave no figure ("" when it gave one): printed in place of the
 * ratio, so a run that failed is not reported as a missing PyTorch. */
char gr_bench_torch_why[320];

void gr_bench_run_torch(const char *dir, unsigned threads, double *eps, double *auc)
{
    char *why = gr_bench_torch_why;
    const size_t cap = sizeof gr_bench_torch_why;
    *eps = *auc = -1;
    why[0] = 0;
    if (access("/usr/bin/python3", X_OK) != 0) {
        snprintf(why, cap, "needs /usr/bin/python3 with torch: "
                 "GRANARY_TORCH=1 bash scripts/setup");
        return;
    }
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
        snprintf(why, cap, "/usr/bin/python3 cannot import torch: "
                 "GRANARY_TORCH=1 bash scripts/setup");
        return;
    }
    char script[PATH_MAX];
    if (!gr_bench_find_script("GR_TORCH_DLRM_SCRIPT", "torch_dlrm.py", script, sizeof script)) {
        snprintf(why, cap, "bench/torch_dlrm.py not found "
                 "(GR_TORCH_DLRM_SCRIPT names it)");
        return;
    }
    char cmd[2 * PATH_MAX + 512];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 '%s' --train '%s/train.tsv' --test '%s/test.tsv' --threads %u "
             "--dim 16 --bottom 64,32 --top 128,64 --lr-emb 0.05 --lr-dense 0.001 --batch 1024 "
             "2>&1",
             script, dir, dir, threads);
    FILE *f = popen(cmd, "r");
    if (!f) {
        snprintf(why, cap, "cannot start %.200s", script);
        return;
    }
    char line[2048], last[200] = "";
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"examples_per_sec\": ");
        /* A line that names a figure but holds no number makes it unknown (-1), not 0. */
        if (p && gr_bench_parse_double(p + 20, eps)) *eps = -1;
        p = strstr(line, "\"auc\": ");
        if (p && gr_bench_parse_double(p + 7, auc)) *auc = -1;
        size_t k = strlen(line);
        if (k > 1) {
            if (k >= sizeof last) k = sizeof last - 1;
            memcpy(last, line, k);
            last[k] = 0;
        }
    }
    last[strcspn(last, "\n")] = 0;
    int st = pclose(f);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        *eps = *auc = -1;
        if (st != -1 && WIFSIGNALED(st))
            snprintf(why, cap, "the %u-thread run was killed by signal %d; "
                     "its last line: %s", threads, WTERMSIG(st), last);
        else
            snprintf(why, cap, "the %u-thread run failed (status %d); its "
                     "last line: %s", threads, st == -1 ? -1 : WEXITSTATUS(st), last);
    } else if (*eps < 0) {
        snprintf(why, cap, "the %u-thread run printed no figure; its last "
                 "line: %s", threads, last);
    }
}

