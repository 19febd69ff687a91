/* Benchmarks, run as `granary bench NAME`. Each prints its figures beside a baseline measured
 * in the same run and, with --json, a final JSON line. Declared once here. */
#ifndef GRANARY_BENCH_H
#define GRANARY_BENCH_H

#define GR_BENCHES(X)            \
    X("table", gr_bench_table) \
    X("ps", gr_bench_ps)       \
    X("train", gr_bench_train) \
    X("ckpt", gr_bench_ckpt)   \
    X("soak", gr_bench_soak)   \
    X("serve", gr_bench_serve) \
    X("torch", gr_bench_torch) \
    X("recovery", gr_bench_recovery)

#define GR_BENCH_DECLARE(name, fn) int fn(int argc, char **argv);
GR_BENCHES(GR_BENCH_DECLARE)
#undef GR_BENCH_DECLARE

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Finds a helper script of bench/ (e.g. "torch_dlrm.py"): $env_var if set and readable, else
 * bench/NAME from the current directory, else next to the granary binary (../bench/NAME or
 * ../../bench/NAME). Writes the path to path (cap bytes) and returns true when found. */
bool gr_bench_find_script(const char *env_var, const char *name, char *path, size_t cap);

/* Reads the port at the start of `text` (what follows the ':' of a child's "listening on
 * HOST:PORT" line, or of one entry of a "HOST:PORT,HOST:PORT" list): 1..65535, then the end
 * of the text, a line end, or a ','. Returns 0, or -1 for anything else. */
int gr_bench_parse_port(const char *text, uint16_t *port);
/* A TCP connection to 127.0.0.1:port with TCP_NODELAY, or -1. */
int gr_bench_tcp_connect(uint16_t port);

/* Reads a finite number at the start of `text`, as a child printed it; the end pointer must
 * have moved. Returns 0, or -1 when there is no number there. */
int gr_bench_parse_double(const char *text, double *out);

#endif
