/* `granary bench torch`: PyTorch with its embeddings on granary, against plain PyTorch and
 * `granary train` (docs/benchmarks.md). The options are declared here, once, and checked by
 * the shared parser; bench/torch_granary.py does the work: this entry finds it, and runs it
 * with Debian's python3 on the checked values and this program's build. */
#include "bench/bench.h"
#include "cli/opts.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TORCH_BENCH_OPTIONS(X)                                                                 \
    X(TB_ROWS, "rows", GR_CLI_INT, NULL, 1, 1e9, NULL, "N", "200000",                          \
      "training rows to generate")                                                             \
    X(TB_TEST, "test-rows", GR_CLI_INT, NULL, 1, 1e9, NULL, "M", "20000", "test rows")         \
    X(TB_DATA, "data", GR_CLI_STR, NULL, 0, 0, NULL, "DIR",                                    \
      NULL, "use DIR/train.tsv and DIR/test.tsv instead of generating")                        \
    X(TB_THREADS, "threads", GR_CLI_INT, NULL, 1, 256, NULL, "T", "1",                         \
      "torch threads of both PyTorch runs (1: both ran faster with 1 than 2 on 2 cores)")      \
    X(TB_WORKERS, "workers", GR_CLI_INT, NULL, 1, 64, NULL, "W", "2",                          \
      "PyTorch + granary worker processes (DDP over gloo)")                                    \
    X(TB_TWORKERS, "torch-workers", GR_CLI_INT, NULL, 0, 64, NULL, "W", "2",                   \
      "plain PyTorch DDP processes also run, faster one the baseline (0: skip)")             \
    X(TB_GWORKERS, "granary-workers", GR_CLI_INT, NULL, 1, 256, NULL, "W", "2",                \
      "granary train --workers")                                                               \
    X(TB_PRELOAD, "preload", GR_CLI_INT, NULL, 0, 1, NULL, "0|1", "1",                        \
      "PyTorch + granary parses its data before its clock, as plain PyTorch (0: inside)")    \
    X(TB_INTERACTION, "interaction", GR_CLI_CHOICE, NULL, 0, 0, "granary|torch", NULL,         \
      "granary", "PyTorch + granary's DLRM interaction: granary's C kernel or torch's")         \
    X(TB_JSON, "json", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL, "print a final JSON line")

enum { TORCH_BENCH_OPTIONS(GR_CLI_ENUM) TB_COUNT };
static const gr_cli_opt torch_bench_opts[] = {TORCH_BENCH_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec torch_bench_spec = {
    .command = "bench torch",
    .synopsis =
        "granary bench torch [--json] [--rows N] [--test-rows M] [--data DIR] [--threads T]\n"
        "                           [--workers W] [--torch-workers W] [--granary-workers W]\n"
        "                           [--preload 0|1] [--interaction granary|torch]\n"
        "  DLRM dim 16, batch 1024 on the same files: plain PyTorch (bench/torch_dlrm.py),\n"
        "  PyTorch with its embeddings on a 2-shard granary cluster (examples/torch_dlrm.py)\n"
        "  and granary train; needs /usr/bin/python3 with python3-torch and `make python`",
    .opts = torch_bench_opts,
    .n_opts = TB_COUNT,
};

int gr_bench_torch(int argc, char **argv)
{
    gr_cli_value v[TB_COUNT];
    gr_cli_parsed p;
    int st = gr_cli_parse_or_exit(&torch_bench_spec, argc, argv, v, &p);
    gr_cli_parsed_fini(&p);
    if (st >= 0) return st;
    char script[PATH_MAX];
    if (!gr_bench_find_script("GR_TORCH_GRANARY_SCRIPT", "torch_granary.py", script,
                              sizeof script)) {
        fprintf(stderr, "granary bench torch: bench/torch_granary.py not found (run from the "
                        "repository, or set GR_TORCH_GRANARY_SCRIPT)\n");
        return 2;
    }
    if (access("/usr/bin/python3", X_OK) != 0) {
        fprintf(stderr, "granary bench torch: needs /usr/bin/python3 with python3-torch "
                        "(GRANARY_TORCH=1 scripts/setup)\n");
        return 2;
    }
    /* The build this program belongs to: the folder holding it. */
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "granary bench torch: cannot find this program's folder\n");
        return 1;
    }
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash) *slash = '\0';
    char nums[7][32];
    snprintf(nums[0], sizeof nums[0], "%lld", (long long)v[TB_ROWS].i);
    snprintf(nums[1], sizeof nums[1], "%lld", (long long)v[TB_TEST].i);
    snprintf(nums[2], sizeof nums[2], "%lld", (long long)v[TB_THREADS].i);
    snprintf(nums[3], sizeof nums[3], "%lld", (long long)v[TB_WORKERS].i);
    snprintf(nums[4], sizeof nums[4], "%lld", (long long)v[TB_GWORKERS].i);
    snprintf(nums[5], sizeof nums[5], "%lld", (long long)v[TB_TWORKERS].i);
    snprintf(nums[6], sizeof nums[6], "%lld", (long long)v[TB_PRELOAD].i);
    char *args[24];
    int k = 0;
    args[k++] = "/usr/bin/python3";
    args[k++] = script;
    args[k++] = "--build";
    args[k++] = self;
    args[k++] = "--rows";
    args[k++] = nums[0];
    args[k++] = "--test-rows";
    args[k++] = nums[1];
    args[k++] = "--threads";
    args[k++] = nums[2];
    args[k++] = "--workers";
    args[k++] = nums[3];
    args[k++] = "--granary-workers";
    args[k++] = nums[4];
    args[k++] = "--torch-workers";
    args[k++] = nums[5];
    args[k++] = "--preload";
    args[k++] = nums[6];
    args[k++] = "--interaction";
    args[k++] = (char *)v[TB_INTERACTION].s;
    if (v[TB_DATA].s) {
        args[k++] = "--data";
        args[k++] = (char *)v[TB_DATA].s;
    }
    if (v[TB_JSON].b) args[k++] = "--json";
    args[k] = NULL;
    fflush(stdout);
    execv(args[0], args);
    perror("granary bench torch: exec /usr/bin/python3");
    return 1;
}
