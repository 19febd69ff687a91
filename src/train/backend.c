/* The local training backend: embedding tables are gr_tables in this process (their own
 * optimizers apply pushed gradients), dense parameters are flat arrays here with Adam,
 * Adagrad or SGD. It implements gr_train_backend so the trainer runs unchanged against the
 * parameter-server client backend later. Async only: every push applies on arrival. */
#include "granary/train.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TABLES 64
#define MAX_DENSE 64
#define DENSE_NAME_MAX 64

typedef struct dense_param {
    char name[DENSE_NAME_MAX];
    size_t n;
    float *w, *m, *v; /* Adam: m, v; Adagrad: v is the accumulator */
    uint64_t t;       /* Adam step count */
    pthread_mutex_t mu;
} dense_param;

typedef struct local_ctx {
    gr_local_backend_opts o;
    pthread_rwlock_t lock; /* the lists below; rows and values have their own locks */
    gr_table *tables[MAX_TABLES];
    uint32_t ntables;
    dense_param *dense[MAX_DENSE];
    uint32_t ndense;
} local_ctx;

static gr_table *find_table(local_ctx *c, uint32_t id)
{
    gr_table *t = NULL;
    pthread_rwlock_rdlock(&c->lock);
    for (uint32_t i = 0; i < c->ntables; i++)
        if (gr_table_get_spec(c->tables[i])->id == id) t = c->tables[i];
    pthread_rwlock_unlock(&c->lock);
    return t;
}

static dense_param *find_dense(local_ctx *c, const char *name)
{
    dense_param *d = NULL;
    pthread_rwlock_rdlock(&c->lock);
    for (uint32_t i = 0; i < c->ndense; i++)
        if (!strcmp(c->dense[i]->name, name)) d = c->dense[i];
    pthread_rwlock_unlock(&c->lock);
    return d;
}

static int lb_table_init(void *ctx, const gr_table_spec *spec)
{
    local_ctx *c = ctx;
    pthread_rwlock_wrlock(&c->lock);
    int rc = GR_OK;
    for (uint32_t i = 0; i < c->ntables; i++) {
        const gr_table_spec *have = gr_table_get_spec(c->tables[i]);
        if (have->id == spec->id || !strcmp(have->name, spec->name)) {
            if (!gr_table_spec_equal(have, spec))
                rc = gr_seterr(GR_EEXIST, "table %u ('%s') exists with another spec", have->id,
                               have->name);
            pthread_rwlock_unlock(&c->lock);
            return rc;
        }
    }
    if (c->ntables == MAX_TABLES) {
        rc = gr_seterr(GR_ECAPACITY, "local backend holds at most %d tables", MAX_TABLES);
    } else {
        gr_table *t;
        rc = gr_table_create(spec, &t);
        if (!rc) c->tables[c->ntables++] = t;
    }
    pthread_rwlock_unlock(&c->lock);
    return rc;
}

static int lb_pull(void *ctx, uint32_t table, const uint64_t *keys, size_t n, float *rows,
                   unsigned flags)
{
    gr_table *t = find_table(ctx, table);
    if (!t) return gr_seterr(GR_ENOENT, "pull: no table %u", table);
    return gr_table_lookup(t, keys, n, rows, flags & GR_PULL_READONLY ? GR_LOOKUP_READONLY : 0);
}

static int lb_push(void *ctx, uint32_t table, const uint64_t *keys, size_t n, const float *grads)
{
    gr_table *t = find_table(ctx, table);
    if (!t) return gr_seterr(GR_ENOENT, "push: no table %u", table);
    return gr_table_apply(t, keys, n, grads);
}

static int lb_dense_init(void *ctx, const char *name, const float *init, size_t n)
{
    local_ctx *c = ctx;
    if (!name || strlen(name) >= DENSE_NAME_MAX)
        return gr_seterr(GR_EINVAL, "dense parameter name missing or longer than %d",
                         DENSE_NAME_MAX - 1);
    if (n == 0) return gr_seterr(GR_EINVAL, "dense parameter '%s' has no values", name);
    pthread_rwlock_wrlock(&c->lock);
    int rc = GR_OK;
    for (uint32_t i = 0; i < c->ndense; i++) {
        if (!strcmp(c->dense[i]->name, name)) {
            if (c->dense[i]->n != n)
                rc = gr_seterr(GR_EDIM, "dense parameter '%s' has %zu values, init carried %zu",
                               name, c->dense[i]->n, n);
            pthread_rwlock_unlock(&c->lock);
            return rc;
        }
    }
    dense_param *d = NULL;
    if (c->ndense == MAX_DENSE) {
        rc = gr_seterr(GR_ECAPACITY, "local backend holds at most %d dense parameters", MAX_DENSE);
        goto out;
    }
    d = calloc(1, sizeof *d);
    if (d) {
        d->w = malloc(n * sizeof *d->w);
        d->m = calloc(n, sizeof *d->m);
        d->v = calloc(n, sizeof *d->v);
    }
    if (!d || !d->w || !d->m || !d->v) {
        if (d) {
            free(d->w);
            free(d->m);
            free(d->v);
            free(d);
        }
        rc = gr_seterr(GR_ENOMEM, "cannot allocate dense parameter '%s' (%zu values)", name, n);
        goto out;
    }
    snprintf(d->name, sizeof d->name, "%s", name);
    d->n = n;
    if (init)
        memcpy(d->w, init, n * sizeof *d->w);
    else
        memset(d->w, 0, n * sizeof *d->w);
    pthread_mutex_init(&d->mu, NULL);
    c->dense[c->ndense++] = d;
out:
    pthread_rwlock_unlock(&c->lock);
    return rc;
}

static int lb_dense_pull(void *ctx, const char *name, float *out, size_t n)
{
    dense_param *d = find_dense(ctx, name);
    if (!d) return gr_seterr(GR_ENOENT, "no dense parameter '%s'", name);
    if (d->n != n)
        return gr_seterr(GR_EDIM, "dense parameter '%s' has %zu values, pull asked for %zu", name,
                         d->n, n);
    pthread_mutex_lock(&d->mu);
    memcpy(out, d->w, n * sizeof *out);
    pthread_mutex_unlock(&d->mu);
    return GR_OK;
}

/* One optimizer step of d with gradient g (caller holds d->mu). With store false nothing is
 * written: it returns the index of the first value (weight or optimizer state) that would not be
 * finite, or n. With store true it writes the step and returns n. */
static size_t dense_update(dense_param *d, const gr_local_backend_opts *o, const float *g,
                           size_t n, bool store)
{
    switch (o->dense_opt) {
    case GR_DENSE_OPT_ADAM: {
        uint64_t t = d->t + 1;
        double bc1 = 1.0 - pow(o->beta1, (double)t), bc2 = 1.0 - pow(o->beta2, (double)t);
        float step = (float)(o->dense_lr * sqrt(bc2) / bc1);
        for (size_t i = 0; i < n; i++) {
            float m = o->beta1 * d->m[i] + (1 - o->beta1) * g[i];
            float v = o->beta2 * d->v[i] + (1 - o->beta2) * g[i] * g[i];
            float w = d->w[i] - step * m / (sqrtf(v) + o->eps);
            if (!store) {
                if (!isfinite(m) || !isfinite(v) || !isfinite(w)) return i;
                continue;
            }
            d->m[i] = m;
            d->v[i] = v;
            d->w[i] = w;
        }
        if (store) d->t = t;
        break;
    }
    case GR_DENSE_OPT_ADAGRAD:
        for (size_t i = 0; i < n; i++) {
            float v = d->v[i] + g[i] * g[i];
            float w = d->w[i] - o->dense_lr * g[i] / (sqrtf(v) + o->eps);
            if (!store) {
                if (!isfinite(v) || !isfinite(w)) return i;
                continue;
            }
            d->v[i] = v;
            d->w[i] = w;
        }
        break;
    case GR_DENSE_OPT_SGD:
        for (size_t i = 0; i < n; i++) {
            float w = d->w[i] - o->dense_lr * g[i];
            if (!store) {
                if (!isfinite(w)) return i;
                continue;
            }
            d->w[i] = w;
        }
        break;
    }
    return n;
}

static int lb_dense_push(void *ctx, const char *name, const float *g, size_t n)
{
    local_ctx *c = ctx;
    dense_param *d = find_dense(c, name);
    if (!d) return gr_seterr(GR_ENOENT, "no dense parameter '%s'", name);
    if (d->n != n)
        return gr_seterr(GR_EDIM, "dense parameter '%s' has %zu values, push carried %zu", name,
                         d->n, n);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(g[i]))
            return gr_seterr(GR_EINVAL, "dense push to '%s': gradient %zu is not finite", name, i);
    pthread_mutex_lock(&d->mu);
    /* The table engine's finite policy (docs/table.md), for the local dense parameters: an
     * update whose result would not be finite is refused whole and changes nothing. The first
     * pass computes every new value without storing it; the second recomputes the same
     * expressions and stores them, so a good update is bitwise what one pass gave. */
    size_t bad = dense_update(d, &c->o, g, n, false);
    if (bad < n) {
        pthread_mutex_unlock(&d->mu);
        return gr_seterr(GR_EINVAL,
                         "dense push to '%s': the update of value %zu would not be finite "
                         "(gradient %g); nothing was applied",
                         name, bad, (double)g[bad]);
    }
    dense_update(d, &c->o, g, n, true);
    pthread_mutex_unlock(&d->mu);
    return GR_OK;
}

/* The started forms: this backend has no I/O to overlap, so the work is done at the start. */
static int lb_dense_pull_start(void *ctx, const char *name, float *out, size_t n, void **op)
{
    *op = NULL;
    return lb_dense_pull(ctx, name, out, n);
}

static int lb_dense_push_start(void *ctx, const char *name, const float *g, size_t n, void **op)
{
    *op = NULL;
    return lb_dense_push(ctx, name, g, n);
}

static int lb_op_wait(void *ctx, void *op)
{
    (void)ctx;
    (void)op;
    return GR_OK;
}

static int lb_ckpt_save(void *ctx, gr_train_ckpt *k)
{
    (void)ctx;
    (void)k;
    return gr_seterr(GR_EINVAL, "the local backend keeps no checkpoints: they are saved by the "
                     "parameter servers (the embedded cluster or --servers)");
}

static int lb_ckpt_load(void *ctx, const char *root, const char *name, gr_train_ckpt *k)
{
    (void)ctx;
    (void)name;
    (void)k;
    return gr_seterr(GR_EINVAL, "the local backend cannot restore %s: checkpoints are loaded by the "
                     "parameter servers (the embedded cluster or --servers)", root ? root : "a checkpoint");
}

static void lb_destroy(void *ctx)
{
    local_ctx *c = ctx;
    if (!c) return;
    for (uint32_t i = 0; i < c->ntables; i++) gr_table_destroy(c->tables[i]);
    for (uint32_t i = 0; i < c->ndense; i++) {
        pthread_mutex_destroy(&c->dense[i]->mu);
        free(c->dense[i]->w);
        free(c->dense[i]->m);
        free(c->dense[i]->v);
        free(c->dense[i]);
    }
    pthread_rwlock_destroy(&c->lock);
    free(c);
}

int gr_local_backend_create(const gr_local_backend_opts *opts, gr_train_backend *out)
{
    memset(out, 0, sizeof *out);
    gr_local_backend_opts o = {GR_DENSE_OPT_ADAM, 1e-3f, 0.9f, 0.999f, 1e-8f};
    if (opts) o = *opts;
    if (o.dense_opt != GR_DENSE_OPT_ADAM && o.dense_opt != GR_DENSE_OPT_ADAGRAD &&
        o.dense_opt != GR_DENSE_OPT_SGD)
        return gr_seterr(GR_EINVAL, "unknown dense optimizer %d", (int)o.dense_opt);
    if (!(o.dense_lr > 0) || !isfinite(o.dense_lr))
        return gr_seterr(GR_EINVAL, "dense learning rate must be > 0");
    if (o.dense_opt == GR_DENSE_OPT_ADAM &&
        !(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1))
        return gr_seterr(GR_EINVAL, "adam betas must be in [0, 1)");
    if (!(o.eps > 0) && o.dense_opt != GR_DENSE_OPT_SGD)
        return gr_seterr(GR_EINVAL, "dense optimizer eps must be > 0");
    local_ctx *c = calloc(1, sizeof *c);
    if (!c) return gr_seterr(GR_ENOMEM, "cannot allocate a local backend");
    c->o = o;
    pthread_rwlock_init(&c->lock, NULL);
    out->ctx = c;
    out->table_init = lb_table_init;
    out->pull = lb_pull;
    out->push = lb_push;
    out->dense_init = lb_dense_init;
    out->dense_pull = lb_dense_pull;
    out->dense_push = lb_dense_push;
    out->dense_pull_start = lb_dense_pull_start;
    out->dense_push_start = lb_dense_push_start;
    out->op_wait = lb_op_wait;
    out->ckpt_save = lb_ckpt_save;
    out->ckpt_load = lb_ckpt_load;
    out->checkpoints = false;
    out->steps = NULL; /* async only: no step tokens */
    out->destroy = lb_destroy;
    return GR_OK;
}

void gr_train_backend_destroy(gr_train_backend *b)
{
    if (!b) return;
    if (b->destroy) b->destroy(b->ctx);
    memset(b, 0, sizeof *b);
}

gr_table *gr_local_backend_table(gr_train_backend *b, uint32_t table)
{
    if (!b || b->destroy != lb_destroy) return NULL;
    return find_table(b->ctx, table);
}
