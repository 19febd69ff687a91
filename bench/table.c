/* Placeholder: bench table lands with its issue. */
#include "bench/bench.h"
#include <stdio.h>
int gr_bench_table(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "granary: 'bench table' is not built yet\n");
    return 1;
}
