/* Placeholder: bench ckpt lands with its issue. */
#include "bench/bench.h"
#include <stdio.h>
int gr_bench_ckpt(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "granary: 'bench ckpt' is not built yet\n");
    return 1;
}
