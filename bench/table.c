/* Placeholder until the table benchmark lands. */
#include "bench/bench.h"
#include <stdio.h>
int gr_bench_table(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "not yet\n"); return 1; }
