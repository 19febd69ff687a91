/* Benchmarks, run as `granary bench NAME`. Each prints its figures beside a baseline measured
 * in the same run and, with --json, a final JSON line. Declared once here. */
#ifndef GRANARY_BENCH_H
#define GRANARY_BENCH_H

#define GR_BENCHES(X)            \
    X("table", gr_bench_table) \
    X("ps", gr_bench_ps)       \
    X("train", gr_bench_train) \
    X("ckpt", gr_bench_ckpt)

#define GR_BENCH_DECLARE(name, fn) int fn(int argc, char **argv);
GR_BENCHES(GR_BENCH_DECLARE)
#undef GR_BENCH_DECLARE

#endif
