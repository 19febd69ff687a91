/* `granary bench NAME`: dispatches to the benchmarks under bench/. */
#include "cli/cli.h"
#include "bench/bench.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
} benches[] = {
#define GR_BENCH_ENTRY(name, fn) {name, fn},
    GR_BENCHES(GR_BENCH_ENTRY)
#undef GR_BENCH_ENTRY
};

int gr_cli_bench(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        printf("usage: granary bench <name> [--json] [--full] [options]\nbenchmarks:");
        for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++) printf(" %s", benches[i].name);
        printf("\n");
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        if (!strcmp(argv[1], benches[i].name)) return benches[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "granary bench: unknown benchmark '%s'\n", argv[1]);
    return 2;
}
