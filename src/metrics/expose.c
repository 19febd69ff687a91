/* The Prometheus text exposition format (version 0.0.4): run the collectors, then write each
 * family with series as # HELP, # TYPE and one line per series (a histogram as cumulative
 * _bucket lines with le, then _sum and _count). Label values and help text are escaped as the
 * format says: backslash, double quote (label values only) and newline. */
#include "metrics/metrics_int.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mx_buf {
    char *p;
    size_t len, cap;
    bool oom;
} mx_buf;

static void put(mx_buf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void puts_(mx_buf *b, const char *s)
{
    put(b, s, strlen(s));
}

static void escaped(mx_buf *b, const char *s, bool quote)
{
    for (; *s; s++) {
        if (*s == '\\')
            puts_(b, "\\\\");
        else if (*s == '\n')
            puts_(b, "\\n");
        else if (quote && *s == '"')
            puts_(b, "\\\"");
        else
            put(b, s, 1);
    }
}

/* Shortest text that reads back as the same double; the format's words for the non-finite. */
static void number(mx_buf *b, double v)
{
    char t[40];
    if (isnan(v))
        snprintf(t, sizeof t, "NaN");
    else if (isinf(v))
        snprintf(t, sizeof t, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 9007199254740992.0)
        snprintf(t, sizeof t, "%.0f", v);
    else {
        snprintf(t, sizeof t, "%.15g", v);
        if (strtod(t, NULL) != v) snprintf(t, sizeof t, "%.17g", v);
    }
    puts_(b, t);
}

/* name{l1="v1",...,extra="x"} with an optional extra label (le of a bucket). */
static void series_name(mx_buf *b, const gr_metric *m, const char *suffix, const char *extra,
                        const char *extra_value)
{
    const gr_metric_family *f = m->f;
    puts_(b, f->name);
    puts_(b, suffix);
    if (!f->nlabels && !extra) return;
    puts_(b, "{");
    for (unsigned i = 0; i < f->nlabels; i++) {
        if (i) puts_(b, ",");
        puts_(b, f->labels[i]);
        puts_(b, "=\"");
        escaped(b, m->values[i], true);
        puts_(b, "\"");
    }
    if (extra) {
        if (f->nlabels) puts_(b, ",");
        puts_(b, extra);
        puts_(b, "=\"");
        puts_(b, extra_value);
        puts_(b, "\"");
    }
    puts_(b, "}");
}

static void write_series(void *ctx, gr_metric *m)
{
    mx_buf *b = ctx;
    if (!atomic_load_explicit(&m->present, memory_order_relaxed)) return;
    const gr_metric_family *f = m->f;
    if (f->type != GR_METRIC_HISTOGRAM) {
        series_name(b, m, "", NULL, NULL);
        puts_(b, " ");
        number(b, gr_metric_value(m));
        puts_(b, "\n");
        return;
    }
    /* Read the buckets once, so the cumulative lines and _count agree with each other. */
    uint64_t cum = 0;
    for (size_t i = 0; i <= f->nbuckets; i++) {
        cum += atomic_load_explicit(&m->buckets[i], memory_order_relaxed);
        char le[40];
        if (i == f->nbuckets)
            snprintf(le, sizeof le, "+Inf");
        else {
            mx_buf lb = {0};
            number(&lb, f->bounds[i]);
            snprintf(le, sizeof le, "%s", lb.p ? lb.p : "0");
            free(lb.p);
        }
        series_name(b, m, "_bucket", "le", le);
        puts_(b, " ");
        number(b, (double)cum);
        puts_(b, "\n");
    }
    series_name(b, m, "_sum", NULL, NULL);
    puts_(b, " ");
    number(b, gr_metric_sum(m));
    puts_(b, "\n");
    series_name(b, m, "_count", NULL, NULL);
    puts_(b, " ");
    number(b, (double)cum);
    puts_(b, "\n");
}

static void any_present(void *ctx, gr_metric *m)
{
    if (atomic_load_explicit(&m->present, memory_order_relaxed)) *(bool *)ctx = true;
}

static const char *type_word(gr_metric_type t)
{
    return t == GR_METRIC_COUNTER ? "counter" : t == GR_METRIC_GAUGE ? "gauge" : "histogram";
}

int gr_metrics_format(gr_metrics *r, char **out, size_t *len)
{
    if (!r || !out) return gr_seterr(GR_EINVAL, "metrics: NULL argument");
    mx_buf b = {0};
    pthread_mutex_lock(&r->collect_mu);
    mx_hide_mirrored(r);
    for (mx_collector *c = r->collectors; c; c = c->next)
        c->fn(c->ctx, r);
    /* Lock order: r->mu, then a family's mu (nothing takes them the other way round). */
    pthread_mutex_lock(&r->mu);
    for (gr_metric_family *f = r->head; f; f = f->next) {
        bool shown = false;
        mx_family_each(f, any_present, &shown);
        if (!shown) continue;
        puts_(&b, "# HELP ");
        puts_(&b, f->name);
        puts_(&b, " ");
        escaped(&b, f->help, false);
        puts_(&b, "\n# TYPE ");
        puts_(&b, f->name);
        puts_(&b, " ");
        puts_(&b, type_word(f->type));
        puts_(&b, "\n");
        mx_family_each(f, write_series, &b);
    }
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_unlock(&r->collect_mu);
    if (!b.p && !b.oom) puts_(&b, "");
    if (b.oom) {
        free(b.p);
        return gr_seterr(GR_ENOMEM, "metrics: out of memory formatting the exposition");
    }
    *out = b.p;
    if (len) *len = b.len;
    return GR_OK;
}
