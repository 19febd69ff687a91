/* `granary bench metrics`: what the Prometheus series cost. End to end: blocking 1-key pulls
 * (the smallest request, so the largest share of per-request cost) against a one-shard
 * embedded cluster without a registry (the baseline) and with one (latency histogram
 * observed per request), alternated, median pulls/s of each. Then the counting itself: ns
 * per histogram observation and per counter increment from 1 and 2 threads on one series,
 * beside a relaxed atomic add (what the shard's per-opcode counters already cost), and the
 * time of one scrape (collector + text) of that shard. */
#include "bench/bench.h"
#include "cli/opts.h"
#include "granary/client.h"
#include "granary/cluster.h"
#include "granary/metrics.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define METRICS_BENCH_OPTIONS(X)                                                                   \
    X(MB_JSON, "json", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL, "print a final JSON line")       \
    X(MB_PULLS, "pulls", GR_CLI_INT, NULL, 1, 1e8, NULL, "N", "20000", "blocking pulls per run") \
    X(MB_ROUNDS, "rounds", GR_CLI_INT, NULL, 1, 100, NULL, "R", "5",                               \
      "runs of each (alternated); the median is reported")

enum { METRICS_BENCH_OPTIONS(GR_CLI_ENUM) MB_COUNT };
static const gr_cli_opt metrics_bench_opts[] = {METRICS_BENCH_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec metrics_bench_spec = {
    .command = "bench metrics",
    .synopsis = "granary bench metrics [--json] [--pulls N] [--rounds R]\n"
                "  1-key pulls with and without the shard's metrics; cost per observation",
    .opts = metrics_bench_opts,
    .n_opts = MB_COUNT,
};

/* Pulls per second of `pulls` blocking 1-key pulls on a fresh one-shard cluster. */
static double pull_rate(gr_metrics *reg, long pulls, double *scrape_us)
{
    gr_local_cluster *cl = NULL;
    gr_client *c = NULL;
    double rate = -1;
    gr_client_config cc;
    gr_client_config_default(&cc);
    if (gr_local_cluster_start_metrics(1, 1, reg, &cl)) goto out;
    cc.servers = gr_local_cluster_servers(cl);
    if (gr_client_create(&cc, &c) ||
        gr_client_create_table(c, "{\"name\":\"t\",\"id\":1,\"dim\":16}"))
        goto out;
    float row[16];
    for (uint64_t k = 0; k < 1000; k++)
        gr_client_pull(c, 1, 16, &k, 1, row); /* warm up */
    double t0 = gr_now_s();
    for (long i = 0; i < pulls; i++) {
        uint64_t k = (uint64_t)i % 1000;
        if (gr_client_pull(c, 1, 16, &k, 1, row)) goto out;
    }
    rate = (double)pulls / (gr_now_s() - t0);
    if (reg && scrape_us) {
        char *text;
        double s0 = gr_now_s();
        for (int i = 0; i < 100; i++) {
            if (gr_metrics_format(reg, &text, NULL)) break;
            free(text);
        }
        *scrape_us = (gr_now_s() - s0) / 100 * 1e6;
    }
out:
    if (rate < 0) fprintf(stderr, "granary bench metrics: %s\n", gr_errmsg());
    gr_client_destroy(c);
    gr_local_cluster_stop(cl);
    return rate;
}

typedef struct counting {
    gr_metric *hist, *counter;
    atomic_uint_fast64_t *plain;
    int what; /* 0 observe, 1 inc, 2 a relaxed atomic add */
    long n;
} counting;

static void *count_main(void *arg)
{
    counting *k = arg;
    for (long i = 0; i < k->n; i++) {
        if (k->what == 0)
            gr_metric_observe(k->hist, (double)(i & 1023) * 1e-5);
        else if (k->what == 1)
            gr_metric_inc(k->counter, 1);
        else
            atomic_fetch_add_explicit(k->plain, 1, memory_order_relaxed);
    }
    return NULL;
}

/* ns per call of `what` from `threads` threads on one series. */
static double ns_per_call(counting k, int threads)
{
    pthread_t t[2];
    k.n = 5000000;
    double t0 = gr_now_s();
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, count_main, &k);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    return (gr_now_s() - t0) / (double)k.n * 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int gr_bench_metrics(int argc, char **argv)
{
    gr_cli_value v[MB_COUNT];
    gr_cli_parsed p;
    int exit_now = gr_cli_parse_or_exit(&metrics_bench_spec, argc, argv, v, &p);
    gr_cli_parsed_fini(&p);
    if (exit_now >= 0) return exit_now;
    long pulls = (long)v[MB_PULLS].i;
    int rounds = (int)v[MB_ROUNDS].i;
    double off[100], on[100], scrape_us = 0;
    if (pull_rate(NULL, pulls, NULL) < 0) return 1; /* warm-up, not counted */
    for (int r = 0; r < rounds; r++) {
        gr_metrics *reg;
        if (gr_metrics_create(&reg)) return 1;
        off[r] = pull_rate(NULL, pulls, NULL);
        on[r] = pull_rate(reg, pulls, &scrape_us);
        gr_metrics_destroy(reg);
        if (off[r] < 0 || on[r] < 0) return 1;
    }
    qsort(off, (size_t)rounds, sizeof off[0], cmp_double);
    qsort(on, (size_t)rounds, sizeof on[0], cmp_double);
    double base = off[rounds / 2], with = on[rounds / 2];
    printf("1-key pulls/s, median of %d: without metrics %.0f, with %.0f (ratio %.3f)\n", rounds,
           base, with, with / base);
    printf("one scrape of a shard (collector + text): %.0f us\n", scrape_us);

    gr_metrics *reg;
    if (gr_metrics_create(&reg)) return 1;
    gr_metric_family *hf, *cf;
    gr_metrics_family(reg, GR_METRIC_HISTOGRAM, "h_seconds", "", NULL, NULL, 0, 0, &hf);
    gr_metrics_family(reg, GR_METRIC_COUNTER, "c_total", "", NULL, NULL, 0, 0, &cf);
    atomic_uint_fast64_t plain = 0;
    counting k = {gr_metric_at(hf), gr_metric_at(cf), &plain, 0, 0};
    double ns[3][2];
    for (int what = 0; what < 3; what++)
        for (int th = 1; th <= 2; th++) {
            k.what = what;
            ns[what][th - 1] = ns_per_call(k, th);
        }
    gr_metrics_destroy(reg);
    for (int th = 0; th < 2; th++)
        printf("%d thread(s) on one series: observe %.1f ns, inc %.1f ns, relaxed atomic add "
               "%.1f ns (observe / atomic add %.2f)\n",
               th + 1, ns[0][th], ns[1][th], ns[2][th], ns[0][th] / ns[2][th]);
    if (v[MB_JSON].b)
        printf(
            "{\"bench\":\"metrics\",\"pulls_per_sec_without\":%.0f,\"pulls_per_sec_with\":%.0f,"
            "\"ratio\":%.4f,\"scrape_us\":%.0f,\"observe_ns\":[%.1f,%.1f],\"inc_ns\":[%.1f,%.1f],"
            "\"atomic_add_ns\":[%.1f,%.1f]}\n",
            base, with, with / base, scrape_us, ns[0][0], ns[0][1], ns[1][0], ns[1][1], ns[2][0],
            ns[2][1]);
    return 0;
}
