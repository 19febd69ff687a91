/* granary metrics: the one metrics registry every long-running process shares (shards,
 * trainers, serving replicas, the controller), its Prometheus text exposition, and the
 * `/metrics` + `/healthz` HTTP endpoint behind `--metrics HOST:PORT` (served by the shared
 * HTTP part, include/granary/http.h).
 *
 * A registry holds families (a name, a help line, a type, label names); a family holds series,
 * one per set of label values. Hot paths take a series pointer once (gr_metric_at) and then
 * count through it: gr_metric_inc / gr_metric_add / gr_metric_set / gr_metric_observe are a
 * few relaxed atomic operations, never a lock. Values that another part already counts (the
 * server's per-opcode counters, table sizes) are not counted twice: a collector callback,
 * run at every scrape, copies them into "mirrored" families (GR_METRIC_MIRRORED), whose series
 * are hidden before the collectors run and shown again when one sets them, so a dropped table
 * or a stopped shard disappears from the exposition.
 *
 * Names follow Prometheus conventions (docs/operations.md lists ours): a `granary_` prefix,
 * base units (seconds, bytes), `_total` for counters. Errors: functions return 0 or a negative
 * gr_err and set gr_errmsg(). Thread safety: everything may be called from any thread; a
 * collector runs under the registry's collection lock and must not call gr_metrics_format or
 * add or remove collectors. */
#ifndef GRANARY_METRICS_H
#define GRANARY_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "granary/core.h"
#include "granary/http.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gr_metrics gr_metrics;             /* a registry */
typedef struct gr_metric_family gr_metric_family; /* one name: type, help, label names */
typedef struct gr_metric gr_metric;               /* one series: a family + label values */

typedef enum gr_metric_type {
    GR_METRIC_COUNTER = 0,   /* only goes up (or is mirrored from a counter kept elsewhere) */
    GR_METRIC_GAUGE = 1,     /* any value, set or moved */
    GR_METRIC_HISTOGRAM = 2, /* observations counted into buckets, with their sum */
} gr_metric_type;

/* Family flag: the family's values are copied in by a collector at each scrape; series not set
 * during a collection are left out of that exposition. */
#define GR_METRIC_MIRRORED 1u
/* Family flag: a series appears in the exposition once it is first counted into (series made
 * ahead of time for every operation stay out until used). */
#define GR_METRIC_LAZY 2u

#define GR_METRIC_MAX_LABELS 6
#define GR_METRIC_MAX_BUCKETS 32
#define GR_METRIC_NAME_MAX 128

/* Buckets for request and operation latencies in seconds: 50 us .. 10 s. */
GR_API extern const double gr_metric_latency_buckets[];
GR_API extern const size_t gr_metric_latency_nbuckets;
/* Buckets for slow things in seconds (checkpoints, restores): 10 ms .. 30 min. */
GR_API extern const double gr_metric_slow_buckets[];
GR_API extern const size_t gr_metric_slow_nbuckets;

GR_API int gr_metrics_create(gr_metrics **out);
/* Frees the registry, its families and series. Stop the HTTP endpoint first. NULL: no-op. */
GR_API void gr_metrics_destroy(gr_metrics *r);

/* Declares a family, or returns the existing one of that name when type, labels, buckets and
 * flags are the same (several shards of one process share a family; their series differ in
 * a label). name: [a-zA-Z_:][a-zA-Z0-9_:]*; labels: comma-separated label names or NULL for
 * none (at most GR_METRIC_MAX_LABELS); buckets: histograms only, strictly increasing upper
 * bounds (the +Inf bucket is implied), NULL = gr_metric_latency_buckets. GR_EINVAL names a bad
 * name, label, bucket list, or a clash with an existing family of that name. The family lives
 * as long as the registry. */
GR_API int gr_metrics_family(gr_metrics *r, gr_metric_type type, const char *name, const char *help,
                             const char *labels, const double *buckets, size_t nbuckets,
                             unsigned flags, gr_metric_family **out);

/* The series of a family for its label values: exactly as many const char * arguments as the
 * family has labels (none for a family without labels). Created (at zero) on first use;
 * the pointer stays valid as long as the registry. NULL only when out of memory, or a value
 * is NULL. Takes the family's lock: call it once and keep the pointer on hot paths. */
GR_API gr_metric *gr_metric_at(gr_metric_family *f, ...);
/* The same with the values in an array of the family's label count. */
GR_API gr_metric *gr_metric_at_v(gr_metric_family *f, const char *const *values);

/* Counters and gauges. inc adds a whole number (one relaxed atomic add); add adds any amount
 * (a compare-and-swap loop); set replaces the value (gauges, and counters mirrored from a
 * counter kept elsewhere: a counter is either counted here or mirrored, never both). Each
 * marks a mirrored series present for the current collection. NULL m: no-op. */
GR_API void gr_metric_inc(gr_metric *m, uint64_t n);
GR_API void gr_metric_add(gr_metric *m, double v);
GR_API void gr_metric_set(gr_metric *m, double v);
/* Histograms: counts v into the first bucket whose bound is >= v, and adds it to the sum.
 * NaN is ignored. NULL m: no-op. */
GR_API void gr_metric_observe(gr_metric *m, double v);
/* The value of a counter or gauge; a histogram's count. */
GR_API double gr_metric_value(const gr_metric *m);
/* A histogram's observations at or below bucket i's bound (cumulative; i == nbuckets is
 * +Inf = the count) and its sum. */
GR_API uint64_t gr_metric_bucket(const gr_metric *m, size_t i);
GR_API double gr_metric_sum(const gr_metric *m);

/* Collectors: fn(ctx, r) runs at every gr_metrics_format, in the order added, and sets the
 * mirrored families' series from wherever the values live. Remove it before ctx goes away:
 * after gr_metrics_remove_collector returns, fn is not running and will not run again. */
typedef void (*gr_metrics_collect_fn)(void *ctx, gr_metrics *r);
GR_API int gr_metrics_add_collector(gr_metrics *r, gr_metrics_collect_fn fn, void *ctx);
GR_API void gr_metrics_remove_collector(gr_metrics *r, gr_metrics_collect_fn fn, void *ctx);

/* The process's own series under Prometheus's standard names (process_resident_memory_bytes,
 * process_virtual_memory_bytes, process_cpu_seconds_total, process_open_fds,
 * process_start_time_seconds, process_threads), read from /proc at each scrape. */
GR_API int gr_metrics_add_process(gr_metrics *r);

/* Runs the collectors and renders every family in the Prometheus text exposition format
 * (version 0.0.4): # HELP and # TYPE lines, one line per series, a histogram as its
 * cumulative _bucket{le=...} lines, _sum and _count. Families without series are left out.
 * *out is malloc'd and NUL-terminated (free it). */
GR_API int gr_metrics_format(gr_metrics *r, char **out, size_t *len);

/* The HTTP endpoint: GET /metrics (the exposition, "text/plain; version=0.0.4") and GET
 * /healthz (200 "ok" while health returns true, or when health is NULL; 503 with the reason
 * it wrote otherwise); anything else 404, other methods 405. */
typedef bool (*gr_metrics_health_fn)(void *ctx, char *why, size_t whycap);
typedef struct gr_metrics_http gr_metrics_http;
/* listen: "HOST:PORT" (port 0 picks a free one, see gr_metrics_http_port). GR_EINVAL for a bad
 * address, GR_EIO naming it when it cannot bind. */
GR_API int gr_metrics_http_start(gr_metrics *r, const char *listen, gr_metrics_health_fn health,
                                 void *health_ctx, gr_metrics_http **out);
GR_API uint16_t gr_metrics_http_port(const gr_metrics_http *h);
/* Stops serving and waits for requests in flight. NULL: no-op. */
GR_API void gr_metrics_http_stop(gr_metrics_http *h);

/* For a part with an HTTP server of its own (serving replicas, the controller): answers
 * GET /metrics and GET /healthz exactly as the endpoint above does and returns true, or
 * returns false (resp untouched) for any other path, which the caller answers. */
GR_API bool gr_metrics_http_answer(gr_metrics *r, gr_metrics_health_fn health, void *health_ctx,
                                   const gr_http_request *req, gr_http_response *resp);

#ifdef __cplusplus
}
#endif
#endif
