/* Internal to the metrics part: the registry, family and series structs shared by
 * registry.c (declaring, counting), expose.c (the text format), process.c and http.c. */
#ifndef GRANARY_METRICS_INT_H
#define GRANARY_METRICS_INT_H

#include "granary/metrics.h"

#include <pthread.h>
#include <stdatomic.h>

/* One series. Counters and gauges keep a whole-number part (inc: one atomic add) and a
 * floating part (add/set: the bits of a double, changed by compare-and-swap); the value is
 * their sum. A histogram keeps one non-cumulative count per bucket (the last is +Inf) and the
 * sum; its count is the sum of the buckets, so _count and the +Inf bucket always agree. */
struct gr_metric {
    gr_metric_family *f;
    struct gr_metric *next; /* the family's series, in creation order */
    char **values;          /* label values, f->nlabels of them */
    atomic_uint_fast64_t whole;
    atomic_uint_fast64_t frac_bits; /* a double */
    atomic_uint_fast64_t *buckets;  /* histograms: f->nbuckets + 1 */
    atomic_bool present;            /* mirrored families: set during this collection */
};

struct gr_metric_family {
    gr_metrics *r;
    struct gr_metric_family *next; /* the registry's families, in creation order */
    gr_metric_type type;
    unsigned flags;
    char name[GR_METRIC_NAME_MAX];
    char *help;
    unsigned nlabels;
    char *labels[GR_METRIC_MAX_LABELS];
    size_t nbuckets;
    double bounds[GR_METRIC_MAX_BUCKETS];
    pthread_mutex_t mu; /* the series list (not their values) */
    gr_metric *head, *tail;
};

typedef struct mx_collector {
    gr_metrics_collect_fn fn;
    void *ctx;
    struct mx_collector *next;
} mx_collector;

struct gr_metrics {
    pthread_mutex_t mu; /* the family list */
    gr_metric_family *head, *tail;
    pthread_mutex_t collect_mu; /* collectors and one exposition at a time */
    mx_collector *collectors;
    void *process; /* process.c's series, when added */
};

/* Walks a family's series; the family's lock is held while fn runs. */
void mx_family_each(gr_metric_family *f, void (*fn)(void *ctx, gr_metric *m), void *ctx);
/* Hides every series of every mirrored family (before the collectors run). */
void mx_hide_mirrored(gr_metrics *r);

#endif
