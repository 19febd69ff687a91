/* `granary bench torch`: PyTorch with its embeddings on granary, against plain PyTorch and
 * `granary train` (bench/torch_granary.py does the work; this entry finds it and runs it with
 * Debian's python3, passing the options on and pointing it at this build). */
#include "bench/bench.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int gr_bench_torch(int argc, char **argv)
{
    char script[PATH_MAX];
    if (!gr_bench_find_script("GR_TORCH_GRANARY_SCRIPT", "torch_granary.py", script,
                              sizeof script)) {
        fprintf(stderr, "granary bench torch: bench/torch_granary.py not found (run from the "
                        "repository, or set GR_TORCH_GRANARY_SCRIPT)\n");
        return 2;
    }
    if (access("/usr/bin/python3", X_OK) != 0) {
        fprintf(stderr, "granary bench torch: needs /usr/bin/python3 with python3-torch "
                        "(GRANARY_TORCH=1 scripts/setup) and `make python`\n");
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
    char **args = calloc((size_t)argc + 5, sizeof *args);
    if (!args) return 1;
    int k = 0;
    args[k++] = "/usr/bin/python3";
    args[k++] = script;
    args[k++] = "--build";
    args[k++] = self;
    for (int i = 1; i < argc; i++) args[k++] = argv[i];
    args[k] = NULL;
    fflush(stdout);
    execv(args[0], args);
    perror("granary bench torch: exec /usr/bin/python3");
    free(args);
    return 1;
}
