/* Placeholder: bench train lands with its issue. */
#include "bench/bench.h"
#include <stdio.h>
int gr_bench_train(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "granary: 'bench train' is not built yet\n");
    return 1;
}
