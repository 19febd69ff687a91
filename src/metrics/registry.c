/* The registry: families and their series, and counting into them. Counting is the hot path
 * (a shard observes a latency per request): it touches only the series' own atomics, relaxed,
 * never a lock; the locks guard the lists, which change when a family or series is first
 * used and are walked by collections. */
#include "metrics/metrics_int.h"

#include <math.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

const double gr_metric_latency_buckets[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                            0.005,   0.01,   0.025,   0.05,   0.1,   0.25,
                                            0.5,     1,      2.5,     5,      10};
const size_t gr_metric_latency_nbuckets =
    sizeof gr_metric_latency_buckets / sizeof gr_metric_latency_buckets[0];
const double gr_metric_slow_buckets[] = {0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800};
const size_t gr_metric_slow_nbuckets =
    sizeof gr_metric_slow_buckets / sizeof gr_metric_slow_buckets[0];

int gr_metrics_create(gr_metrics **out)
{
    gr_metrics *r = calloc(1, sizeof *r);
    if (!r) return gr_seterr(GR_ENOMEM, "metrics: out of memory");
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->collect_mu, NULL);
    *out = r;
    return GR_OK;
}

static void series_free(gr_metric *m, unsigned nlabels)
{
    for (unsigned i = 0; i < nlabels; i++)
        free(m->values[i]);
    free(m->values);
    free(m->buckets);
    free(m);
}

void gr_metrics_destroy(gr_metrics *r)
{
    if (!r) return;
    for (gr_metric_family *f = r->head, *fn; f; f = fn) {
        fn = f->next;
        for (gr_metric *m = f->head, *mn; m; m = mn) {
            mn = m->next;
            series_free(m, f->nlabels);
        }
        for (unsigned i = 0; i < f->nlabels; i++)
            free(f->labels[i]);
        free(f->help);
        pthread_mutex_destroy(&f->mu);
        free(f);
    }
    for (mx_collector *c = r->collectors, *cn; c; c = cn) {
        cn = c->next;
        free(c);
    }
    free(r->process);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->collect_mu);
    free(r);
}

/* Prometheus metric names: [a-zA-Z_:][a-zA-Z0-9_:]*; label names the same without ':' and
 * not starting "__" (reserved). */
static bool valid_name(const char *s, size_t len, bool label)
{
    if (len == 0 || len >= GR_METRIC_NAME_MAX) return false;
    if (label && len >= 2 && s[0] == '_' && s[1] == '_') return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                  (!label && c == ':') || (i > 0 && c >= '0' && c <= '9');
        if (!ok) return false;
    }
    return true;
}

/* Splits "a,b" into f->labels. */
static int parse_labels(gr_metric_family *f, const char *labels)
{
    if (!labels || !*labels) return GR_OK;
    const char *p = labels;
    for (;;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (f->nlabels == GR_METRIC_MAX_LABELS)
            return gr_seterr(GR_EINVAL, "metric %s: more than %d labels", f->name,
                             GR_METRIC_MAX_LABELS);
        if (!valid_name(p, n, true) || (n == 2 && !memcmp(p, "le", 2)))
            return gr_seterr(GR_EINVAL, "metric %s: bad label name '%.*s'", f->name, (int)n, p);
        f->labels[f->nlabels] = strndup(p, n);
        if (!f->labels[f->nlabels]) return gr_seterr(GR_ENOMEM, "metrics: out of memory");
        f->nlabels++;
        if (!e) return GR_OK;
        p = e + 1;
    }
}

/* Same declaration as an existing family: what a second shard in one process asks for. */
static bool same_family(const gr_metric_family *a, const gr_metric_family *b)
{
    if (a->type != b->type || a->flags != b->flags || a->nlabels != b->nlabels ||
        a->nbuckets != b->nbuckets)
        return false;
    for (unsigned i = 0; i < a->nlabels; i++)
        if (strcmp(a->labels[i], b->labels[i])) return false;
    for (size_t i = 0; i < a->nbuckets; i++)
        if (a->bounds[i] != b->bounds[i]) return false;
    return true;
}

static void family_free(gr_metric_family *f)
{
    for (unsigned i = 0; i < f->nlabels; i++)
        free(f->labels[i]);
    free(f->help);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

int gr_metrics_family(gr_metrics *r, gr_metric_type type, const char *name, const char *help,
                      const char *labels, const double *buckets, size_t nbuckets, unsigned flags,
                      gr_metric_family **out)
{
    if (!r || !name || !out) return gr_seterr(GR_EINVAL, "metrics: NULL argument");
    if (!valid_name(name, strlen(name), false))
        return gr_seterr(GR_EINVAL, "metrics: bad metric name '%s'", name);
    if (type != GR_METRIC_COUNTER && type != GR_METRIC_GAUGE && type != GR_METRIC_HISTOGRAM)
        return gr_seterr(GR_EINVAL, "metric %s: unknown type %d", name, (int)type);
    gr_metric_family *f = calloc(1, sizeof *f);
    if (!f) return gr_seterr(GR_ENOMEM, "metrics: out of memory");
    pthread_mutex_init(&f->mu, NULL);
    f->r = r;
    f->type = type;
    f->flags = flags;
    snprintf(f->name, sizeof f->name, "%s", name);
    f->help = strdup(help ? help : "");
    int rc = f->help ? parse_labels(f, labels) : gr_seterr(GR_ENOMEM, "metrics: out of memory");
    if (!rc && type == GR_METRIC_HISTOGRAM) {
        if (!buckets) {
            buckets = gr_metric_latency_buckets;
            nbuckets = gr_metric_latency_nbuckets;
        }
        if (nbuckets == 0 || nbuckets > GR_METRIC_MAX_BUCKETS)
            rc = gr_seterr(GR_EINVAL, "metric %s: %zu buckets (want 1..%d)", name, nbuckets,
                           GR_METRIC_MAX_BUCKETS);
        for (size_t i = 0; !rc && i < nbuckets; i++) {
            if (!isfinite(buckets[i]) || (i > 0 && buckets[i] <= buckets[i - 1]))
                rc = gr_seterr(GR_EINVAL,
                               "metric %s: bucket bounds must be finite and strictly "
                               "increasing (bound %zu is %g)",
                               name, i, buckets[i]);
            else
                f->bounds[i] = buckets[i];
        }
        f->nbuckets = nbuckets;
    } else if (!rc && buckets) {
        rc = gr_seterr(GR_EINVAL, "metric %s: only histograms have buckets", name);
    }
    if (rc) {
        family_free(f);
        return rc;
    }
    pthread_mutex_lock(&r->mu);
    for (gr_metric_family *e = r->head; e; e = e->next) {
        if (strcmp(e->name, name)) continue;
        bool same = same_family(e, f);
        pthread_mutex_unlock(&r->mu);
        family_free(f);
        if (!same)
            return gr_seterr(GR_EINVAL,
                             "metric %s is already declared with another type, "
                             "labels, buckets or flags",
                             name);
        *out = e;
        return GR_OK;
    }
    if (r->tail)
        r->tail->next = f;
    else
        r->head = f;
    r->tail = f;
    pthread_mutex_unlock(&r->mu);
    *out = f;
    return GR_OK;
}

gr_metric *gr_metric_at_v(gr_metric_family *f, const char *const *values)
{
    if (!f) return NULL;
    for (unsigned i = 0; i < f->nlabels; i++)
        if (!values[i]) return NULL;
    pthread_mutex_lock(&f->mu);
    gr_metric *m = f->head;
    for (; m; m = m->next) {
        unsigned i = 0;
        while (i < f->nlabels && !strcmp(m->values[i], values[i]))
            i++;
        if (i == f->nlabels) break;
    }
    if (!m && (m = calloc(1, sizeof *m))) {
        m->f = f;
        bool ok = (m->values = calloc(f->nlabels + 1, sizeof *m->values)) != NULL;
        for (unsigned i = 0; ok && i < f->nlabels; i++)
            ok = (m->values[i] = strdup(values[i]));
        if (ok && f->type == GR_METRIC_HISTOGRAM)
            ok = (m->buckets = calloc(f->nbuckets + 1, sizeof *m->buckets)) != NULL;
        if (!ok) {
            series_free(m, f->nlabels);
            m = NULL;
        } else {
            /* A series counted here is always shown; a mirrored one once a collector sets it,
             * a lazy one once first counted. */
            atomic_store(&m->present, !(f->flags & (GR_METRIC_MIRRORED | GR_METRIC_LAZY)));
            if (f->tail)
                f->tail->next = m;
            else
                f->head = m;
            f->tail = m;
        }
    }
    pthread_mutex_unlock(&f->mu);
    return m;
}

gr_metric *gr_metric_at(gr_metric_family *f, ...)
{
    if (!f) return NULL;
    const char *values[GR_METRIC_MAX_LABELS + 1] = {0};
    va_list ap;
    va_start(ap, f);
    for (unsigned i = 0; i < f->nlabels; i++)
        values[i] = va_arg(ap, const char *);
    va_end(ap);
    return gr_metric_at_v(f, values);
}

static double bits_to_double(uint64_t b)
{
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static uint64_t double_to_bits(double d)
{
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}

static void add_double(atomic_uint_fast64_t *cell, double v)
{
    uint_fast64_t old = atomic_load_explicit(cell, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(cell, &old,
                                                  double_to_bits(bits_to_double(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

static void mark_present(gr_metric *m)
{
    /* A load first: the store (a cache-line write) happens once per collection, not per call. */
    if ((m->f->flags & (GR_METRIC_MIRRORED | GR_METRIC_LAZY)) &&
        !atomic_load_explicit(&m->present, memory_order_relaxed))
        atomic_store_explicit(&m->present, true, memory_order_relaxed);
}

void gr_metric_inc(gr_metric *m, uint64_t n)
{
    if (!m) return;
    atomic_fetch_add_explicit(&m->whole, n, memory_order_relaxed);
    mark_present(m);
}

void gr_metric_add(gr_metric *m, double v)
{
    if (!m) return;
    add_double(&m->frac_bits, v);
    mark_present(m);
}

void gr_metric_set(gr_metric *m, double v)
{
    if (!m) return;
    atomic_store_explicit(&m->whole, 0, memory_order_relaxed);
    atomic_store_explicit(&m->frac_bits, double_to_bits(v), memory_order_relaxed);
    mark_present(m);
}

void gr_metric_observe(gr_metric *m, double v)
{
    if (!m || !m->buckets || isnan(v)) return;
    const gr_metric_family *f = m->f;
    size_t i = 0;
    while (i < f->nbuckets && v > f->bounds[i])
        i++;
    atomic_fetch_add_explicit(&m->buckets[i], 1, memory_order_relaxed);
    add_double(&m->frac_bits, v);
    mark_present(m);
}

uint64_t gr_metric_bucket(const gr_metric *m, size_t i)
{
    if (!m || !m->buckets) return 0;
    if (i > m->f->nbuckets) i = m->f->nbuckets;
    uint64_t c = 0;
    for (size_t j = 0; j <= i; j++)
        c += atomic_load_explicit(&m->buckets[j], memory_order_relaxed);
    return c;
}

double gr_metric_sum(const gr_metric *m)
{
    return m ? bits_to_double(atomic_load_explicit(&m->frac_bits, memory_order_relaxed)) : 0;
}

double gr_metric_value(const gr_metric *m)
{
    if (!m) return 0;
    if (m->buckets) return (double)gr_metric_bucket(m, m->f->nbuckets);
    return (double)atomic_load_explicit(&m->whole, memory_order_relaxed) + gr_metric_sum(m);
}

void mx_family_each(gr_metric_family *f, void (*fn)(void *ctx, gr_metric *m), void *ctx)
{
    pthread_mutex_lock(&f->mu);
    for (gr_metric *m = f->head; m; m = m->next)
        fn(ctx, m);
    pthread_mutex_unlock(&f->mu);
}

static void hide(void *ctx, gr_metric *m)
{
    (void)ctx;
    atomic_store_explicit(&m->present, false, memory_order_relaxed);
}

void mx_hide_mirrored(gr_metrics *r)
{
    pthread_mutex_lock(&r->mu);
    for (gr_metric_family *f = r->head; f; f = f->next)
        if (f->flags & GR_METRIC_MIRRORED) mx_family_each(f, hide, NULL);
    pthread_mutex_unlock(&r->mu);
}

int gr_metrics_add_collector(gr_metrics *r, gr_metrics_collect_fn fn, void *ctx)
{
    if (!r || !fn) return gr_seterr(GR_EINVAL, "metrics: NULL collector");
    mx_collector *c = calloc(1, sizeof *c);
    if (!c) return gr_seterr(GR_ENOMEM, "metrics: out of memory");
    c->fn = fn;
    c->ctx = ctx;
    pthread_mutex_lock(&r->collect_mu);
    mx_collector **p = &r->collectors;
    while (*p)
        p = &(*p)->next;
    *p = c;
    pthread_mutex_unlock(&r->collect_mu);
    return GR_OK;
}

void gr_metrics_remove_collector(gr_metrics *r, gr_metrics_collect_fn fn, void *ctx)
{
    if (!r) return;
    pthread_mutex_lock(&r->collect_mu);
    for (mx_collector **p = &r->collectors; *p; p = &(*p)->next) {
        if ((*p)->fn == fn && (*p)->ctx == ctx) {
            mx_collector *c = *p;
            *p = c->next;
            free(c);
            break;
        }
    }
    pthread_mutex_unlock(&r->collect_mu);
}
