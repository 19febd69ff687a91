/* Placeholder: bench ps lands with its issue. */
#include "bench/bench.h"
#include <stdio.h>
int gr_bench_ps(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "granary: 'bench ps' is not built yet\n");
    return 1;
}
