/* bench serve's load generators (bench/serve_load.c): wrk at saturation and the paced
 * client at a fixed rate, with what each run cost in CPU and where its latency went. */
#ifndef GRANARY_BENCH_SERVE_LOAD_H
#define GRANARY_BENCH_SERVE_LOAD_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Request bodies ({"lines": [...]}), cycled through by every client. */
typedef struct bodies {
    char **b;
    size_t *len;
    size_t n;
} bodies;

/* One measured run. */
typedef struct load {
    double qps, p50_ms, p99_ms;
    uint64_t requests, errors;
    /* CPU microseconds per answered request (load changes them far less than wall-clock
     * rates): this process (the server under test), the load generator, and a helper process
     * (redis-server for the baseline). NAN when not measured. */
    double cpu_us, gen_cpu_us, helper_cpu_us;
    double late_p99_ms, service_p99_ms; /* the paced client's: send lateness, reply time */
    /* Where the paced client's lateness came from (NAN when not measured): its thread's time
     * runnable but not running (the guest scheduler gave the CPU to another thread), the
     * machine's steal time over the run (the hypervisor ran another guest on our vCPUs), the
     * p99 of how late its timer wakeups came, and the latest request's lateness. */
    double runq_ms, steal_ms, wake_late_p99_ms, late_max_ms;
    /* The send lateness split: waiting for a free connection (every one had a request in
     * flight: the server's backlog) and the rest (the client itself was late). */
    double conn_wait_p99_ms, own_late_p99_ms;
    bool fifo; /* the paced client ran as SCHED_FIFO */
    bool slice; /* the paced client got the time slice of sl_set_pacer_slice */
    /* The paced client's latencies (ms from each request's due time), malloc'd: sl_load_free.
     * NULL for wrk runs. */
    double *lat;
    size_t nlat;
} load;

double sl_now_s(void);
/* The p-quantile of v[0..n) (sorts v); NAN when n is 0. */
double sl_pct(double *v, size_t n, double p);
int sl_send_all(int fd, const char *p, size_t n);
/* User + system CPU seconds of RUSAGE_SELF / _CHILDREN / _THREAD. */
double sl_rusage_s(int who);
/* User + system CPU seconds of another process (from /proc), or NAN. */
double sl_proc_cpu_s(pid_t pid);

/* Writes a wrk Lua script that cycles through the bodies. */
int sl_write_script(const char *path, const bodies *b);
/* wrk -t wthreads -c conns for secs against POST /v1/predict on 127.0.0.1:port; helper: a
 * process whose CPU is counted with the server's (redis-server), or 0. */
int sl_run_wrk(uint16_t port, const char *script, unsigned wthreads, unsigned conns, double secs,
               pid_t helper, load *out);
/* Placement for the runs with the client on a core of its own, as a client on another
 * machine loads a server without taking its CPU: wrk pinned to `cpu` from now on (-1: no pin,
 * the default), every thread of process `pid` to `set` (0 or more threads pinned, or -1),
 * and the allowed CPUs split into the servers' (all but the last) and the client's (the last;
 * -1 when fewer than 2 are allowed). */
void sl_set_wrk_cpu(int cpu);
int sl_pin_threads(pid_t pid, const cpu_set_t *set);
int sl_split_cpus(const cpu_set_t *allowed, cpu_set_t *servers, int *client);
/* Medians, field by field, of n runs of the same measurement (requests and errors: sums; the
 * latencies of paced runs pooled into out->lat). */
void sl_load_median(const load *runs, unsigned n, load *out);
/* Frees the latencies a run kept. */
void sl_load_free(load *l);
/* The time slice (us, gr_thread_set_slice_us) the paced client asks for from now on; 0: the
 * kernel's default. */
void sl_set_pacer_slice(unsigned us);
/* The paced client at `rate` requests/s for secs (fifo: as SCHED_FIFO when permitted). */
void sl_run_paced(uint16_t port, const bodies *b, double rate, double secs, bool fifo, load *out);
/* How long the paced client may sleep (seconds): 0 when a request is due and a connection is
 * idle (send it now), `full_wait` when one is due but every connection is busy (a reply frees
 * one and wakes it), else until the next request is due (`next`; none left: `full_wait`). */
double sl_paced_wait(bool left, double next, double now, int busy, int conns, double full_wait);
/* The earlier paced client: 4 threads each blocking on one connection. */
void sl_run_paced_threads(uint16_t port, const bodies *b, double rate, double secs, load *out);

#endif
