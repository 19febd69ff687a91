/* Helpers shared by the benchmarks. */
#include "bench/bench.h"

#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

bool gr_bench_find_script(const char *env_var, const char *name, char *path, size_t cap)
{
    const char *env = getenv(env_var);
    if (env && access(env, R_OK) == 0) {
        snprintf(path, cap, "%s", env);
        return true;
    }
    snprintf(path, cap, "bench/%s", name);
    if (access(path, R_OK) == 0) return true;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return false;
    exe[n] = '\0';
    const char *dir = dirname(exe);
    const char *ups[] = {"/../bench/", "/../../bench/"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(path, cap, "%s%s%s", dir, ups[i], name);
        if (access(path, R_OK) == 0) return true;
    }
    return false;
}
