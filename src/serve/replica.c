/* The serving replica: its tables, the current dense parameters, scoring with the trainer's
 * forward pass (gr_model_predict over rows gathered exactly as the trainer's evaluation
 * gathers them), applying publications, and the life cycle of its faces. */
#include "serve/serve_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include <math.h>
#include <time.h>

typedef struct sv_ws {
    gr_score_ws *ws;
    struct sv_ws *next;
} sv_ws;

uint64_t sv_wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void gr_serve_config_default(gr_serve_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->poll_wait_ms = 1000;
    cfg->threads = 4;
    cfg->slice_us = 0; /* measured no gain on 2 cores (docs/serving.md): opt-in */
    cfg->max_body = 8u << 20;
    cfg->max_batch = 10000;
    /* Not libmicrohttpd's 32 KiB: it zeroes the pool for every request of a kept-alive
     * connection, 2.6 % of a one-example request's CPU (docs/serving.md); 8 KiB holds the
     * headers any client sends (nginx's default limit for them). */
    cfg->conn_memory = 8192;
}

static char *dup_or_null(const char *s, bool *oom)
{
    if (!s) return NULL;
    char *d = strdup(s);
    if (!d) *oom = true;
    return d;
}

static void dense_put(sv_dense *d)
{
    if (d && atomic_fetch_sub(&d->refs, 1) == 1) {
        gr_model_prepared_destroy(d->prep);
        free(d);
    }
}

static void bump_version(gr_serve *s, uint64_t v)
{
    uint64_t cur = atomic_load(&s->model_version);
    while (v > cur && !atomic_compare_exchange_weak(&s->model_version, &cur, v)) {
    }
}

int gr_serve_set_dense(gr_serve *s, const float *params, size_t n, uint64_t version)
{
    size_t want = gr_model_dense_size(s->model);
    if (n != want)
        return gr_seterr(GR_EDIM, "dense parameters '%s' have %zu floats, the model needs %zu",
                         gr_model_dense_name(s->model), n, want);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(params[i]))
            return gr_seterr(GR_EINVAL, "dense parameter %zu of version %llu is not finite", i,
                             (unsigned long long)version);
    sv_dense *d = malloc(sizeof *d + n * sizeof(float));
    if (!d) return gr_seterr(GR_ENOMEM, "out of memory for dense parameters");
    atomic_init(&d->refs, 1);
    d->version = version;
    d->n = n;
    memcpy(d->params, params, n * sizeof(float));
    /* Made once per version, outside the lock: requests of one example score with it. Without
     * it (out of memory) they take the plain path, with the same bits. */
    d->prep = NULL;
    if (gr_model_prepare(s->model, d->params, &d->prep)) d->prep = NULL;
    pthread_mutex_lock(&s->mu);
    sv_dense *old = s->dense;
    bool newer = !old || version > old->version;
    if (newer) s->dense = d;
    pthread_mutex_unlock(&s->mu);
    if (newer) {
        dense_put(old);
        bump_version(s, version);
    } else {
        dense_put(d);
    }
    return GR_OK;
}

sv_table *sv_find_table(gr_serve *s, uint32_t id)
{
    sv_table *t = NULL;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->ntables && !t; i++)
        if (s->tables[i]->id == id) t = s->tables[i];
    pthread_mutex_unlock(&s->mu);
    return t;
}

/* The table of that id, created (named name, or "table-ID") when absent. */
static int table_get_or_add(gr_serve *s, uint32_t id, const char *name, uint32_t dim, sv_table **out)
{
    pthread_mutex_lock(&s->mu);
    sv_table *t = NULL;
    for (size_t i = 0; i < s->ntables && !t; i++)
        if (s->tables[i]->id == id) t = s->tables[i];
    int rc = GR_OK;
    if (!t) {
        sv_table **nt = realloc(s->tables, (s->ntables + 1) * sizeof *nt);
        if (!nt) rc = gr_seterr(GR_ENOMEM, "out of memory for a table");
        else s->tables = nt;
        if (!rc && !(rc = sv_table_create(id, name, dim, &t))) s->tables[s->ntables++] = t;
    }
    pthread_mutex_unlock(&s->mu);
    if (!rc && t->dim != dim)
        rc = gr_seterr(GR_EDIM, "table '%s' (id %u) has dim %u, the update carried dim %u", t->name,
                       id, t->dim, dim);
    *out = rc ? NULL : t;
    return rc;
}

int sv_add_table(gr_serve *s, uint32_t id, const char *name, uint32_t dim)
{
    sv_table *t;
    return table_get_or_add(s, id, name, dim, &t);
}

int gr_serve_put_rows(gr_serve *s, uint32_t table, uint32_t dim, const uint64_t *keys, size_t n,
                      const float *rows, uint64_t version)
{
    sv_table *t;
    int rc = table_get_or_add(s, table, NULL, dim, &t);
    if (rc) return rc;
    uint64_t w = 0, ig = 0;
    rc = sv_table_put(t, keys, n, rows, version, &w, &ig);
    atomic_fetch_add(&s->rows_applied, w);
    atomic_fetch_add(&s->rows_ignored, ig);
    if (w) bump_version(s, version);
    return rc;
}

int gr_serve_apply(gr_serve *s, const gr_proto_publication *p)
{
    if (p->kind == GR_PROTO_PUB_NONE) return GR_OK;
    int rc = GR_OK;
    float *conv = NULL;
    size_t conv_cap = 0;
    for (uint32_t i = 0; i < p->nsparse && !rc; i++) {
        const gr_proto_pub_section *sec = &p->sparse[i];
        const float *rows = sec->values;
        if (p->f16) {
            size_t need = (size_t)sec->n * sec->dim;
            if (need > conv_cap) {
                float *c = realloc(conv, need * sizeof *c);
                if (!c) {
                    rc = gr_seterr(GR_ENOMEM, "out of memory converting half floats");
                    break;
                }
                conv = c;
                conv_cap = need;
            }
            const uint16_t *h = sec->values;
            for (size_t j = 0; j < need; j++) conv[j] = gr_f16_to_f32(h[j]);
            rows = conv;
        }
        /* Apply in pieces so the version counters move while a large delta lands. */
        for (size_t off = 0; off < sec->n && !rc; off += 4096) {
            size_t m = sec->n - off < 4096 ? sec->n - off : 4096;
            rc = gr_serve_put_rows(s, sec->table, sec->dim, sec->keys + off, m,
                                   rows + off * sec->dim, p->version);
        }
    }
    free(conv);
    for (uint32_t i = 0; i < p->ndense && !rc; i++) {
        const gr_proto_dense_part *d = &p->dense[i];
        const char *want = gr_model_dense_name(s->model);
        if (d->name_len != strlen(want) || memcmp(d->name, want, d->name_len)) continue;
        rc = gr_serve_set_dense(s, d->values, d->size, p->version);
    }
    if (!rc) {
        atomic_fetch_add(&s->publications, 1);
        atomic_store(&s->last_apply_wall_ns, sv_wall_ns());
        bump_version(s, p->version);
    }
    return rc;
}

/* ---- scoring ---- */

/* Scratch for one more request in flight (the free list was empty). */
static int ws_new(gr_serve *s, sv_ws **out)
{
    sv_ws *w = calloc(1, sizeof *w);
    if (!w) return gr_seterr(GR_ENOMEM, "out of memory for model scratch");
    int rc = gr_score_ws_create(s->model, &w->ws);
    if (rc) {
        free(w);
        return rc;
    }
    *out = w;
    return GR_OK;
}

static void ws_give(gr_serve *s, sv_ws *w)
{
    pthread_mutex_lock(&s->mu);
    w->next = s->ws_free;
    s->ws_free = w;
    pthread_mutex_unlock(&s->mu);
}

/* gr_model_score's row source: the replica's table (absent rows read zeros, as the trainer's
 * evaluation reads them). */
static int rows_of(void *ctx, const uint64_t *keys, size_t n, float *rows)
{
    sv_table_get(ctx, keys, n, rows, NULL);
    return GR_OK;
}

/* gr_serve_predict and gr_serve_predict_each: `each` scores every example as if alone
 * (bitwise; one predict counted per example: each was a request of its own). */
static int predict(gr_serve *s, size_t n, const float *dense, const uint64_t *ids, float *probs,
                   uint64_t *version, bool each)
{
    uint64_t requests = each ? n : 1;
    if (n == 0) return GR_OK;
    if (n > s->cfg.max_batch) {
        atomic_fetch_add(&s->errors, requests);
        return gr_seterr(GR_ETOOBIG, "predict of %zu examples is over the limit of %u", n,
                         s->cfg.max_batch);
    }
    uint64_t ver = atomic_load(&s->model_version);
    /* One acquisition of the replica's mutex for the dense version and the scratch (four
     * with sv_find_table and ws_take: the mutex's line went from core to core per request). */
    pthread_mutex_lock(&s->mu);
    sv_dense *d = s->dense;
    if (d) atomic_fetch_add(&d->refs, 1);
    sv_ws *w = d ? s->ws_free : NULL;
    if (w) s->ws_free = w->next;
    pthread_mutex_unlock(&s->mu);
    if (!d) {
        atomic_fetch_add(&s->errors, requests);
        return gr_seterr(GR_ENOENT, "the replica has no dense parameters yet");
    }
    sv_table *t = s->emb;
    int rc = t ? GR_OK : gr_seterr(GR_ENOENT, "the replica has no table %u", s->emb_table);
    if (t && t->dim != gr_model_emb_dim(s->model))
        rc = gr_seterr(GR_EDIM, "table '%s' has dim %u, the model needs %u", t->name, t->dim,
                       gr_model_emb_dim(s->model));
    /* The trainer's scoring path (gr_model_score: dedup, rows of the unique ids, scatter,
     * forward pass), with the rows read from this replica's store. */
    if (!rc && !w) rc = ws_new(s, &w);
    if (!rc) {
        gr_score_ws_set_prepared(w->ws, d->prep);
        gr_score_ws_set_each(w->ws, each);
        rc = gr_model_score(s->model, w->ws, d->params, rows_of, t, n, dense, ids, probs);
        gr_score_ws_set_each(w->ws, false);
        gr_score_ws_set_prepared(w->ws, NULL);
    }
    if (w) ws_give(s, w);
    dense_put(d);
    if (!rc) {
        atomic_fetch_add(&s->predicts, requests);
        atomic_fetch_add(&s->predict_examples, n);
        if (version) *version = ver;
    } else {
        atomic_fetch_add(&s->errors, requests);
    }
    return rc;
}

int gr_serve_predict(gr_serve *s, size_t n, const float *dense, const uint64_t *ids, float *probs,
                     uint64_t *version)
{
    return predict(s, n, dense, ids, probs, version, false);
}

int gr_serve_predict_each(gr_serve *s, size_t n, const float *dense, const uint64_t *ids,
                          float *probs, uint64_t *version)
{
    return predict(s, n, dense, ids, probs, version, true);
}

int gr_serve_lookup(gr_serve *s, uint32_t table, const uint64_t *keys, size_t n, float *out,
                    bool *found)
{
    sv_table *t = sv_find_table(s, table);
    if (!t) {
        atomic_fetch_add(&s->errors, 1);
        return gr_seterr(GR_ENOENT, "the replica has no table with id %u", table);
    }
    sv_table_get(t, keys, n, out, found);
    atomic_fetch_add(&s->lookups, 1);
    return GR_OK;
}

int gr_serve_table_find(gr_serve *s, const char *name, uint32_t *id, uint32_t *dim)
{
    int rc = gr_seterr(GR_ENOENT, "the replica has no table named '%s'", name);
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->ntables; i++)
        if (!strcmp(s->tables[i]->name, name)) {
            *id = s->tables[i]->id;
            *dim = s->tables[i]->dim;
            rc = GR_OK;
            break;
        }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

const gr_model *gr_serve_model(const gr_serve *s) { return s->model; }

void gr_serve_get_stats(gr_serve *s, gr_serve_stats *st)
{
    memset(st, 0, sizeof *st);
    st->model_version = atomic_load(&s->model_version);
    st->publications = atomic_load(&s->publications);
    st->rows_applied = atomic_load(&s->rows_applied);
    st->rows_ignored = atomic_load(&s->rows_ignored);
    st->last_apply_wall_ns = atomic_load(&s->last_apply_wall_ns);
    st->predicts = atomic_load(&s->predicts);
    st->predict_examples = atomic_load(&s->predict_examples);
    st->lookups = atomic_load(&s->lookups);
    st->errors = atomic_load(&s->errors);
    st->coalesced_runs = atomic_load(&s->coalesced_runs);
    st->coalesced_requests = atomic_load(&s->coalesced_requests);
    st->shards_connected = atomic_load(&s->shards_connected);
    pthread_mutex_lock(&s->mu);
    st->dense_version = s->dense ? s->dense->version : 0;
    st->tables = (uint32_t)s->ntables;
    sv_table **ts = s->tables;
    size_t nt = s->ntables;
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < nt; i++) st->rows += sv_table_rows(ts[i]);
}

/* ---- life cycle ---- */

int gr_serve_create(const gr_serve_config *cfg, gr_serve **out)
{
    *out = NULL;
    if (!cfg->model_dir && !cfg->model)
        return gr_seterr(GR_EINVAL, "a replica needs a saved model (--model DIR) or a model config");
    if (cfg->slice_us && (cfg->slice_us < 100 || cfg->slice_us > 100000))
        return gr_seterr(GR_EINVAL, "--slice-us %u: a time slice is 100 to 100000 us (0: the "
                         "kernel's default)", cfg->slice_us);
    gr_serve *s = calloc(1, sizeof *s);
    if (!s) return gr_seterr(GR_ENOMEM, "out of memory for a replica");
    /* The request threads are the parallelism, as the trainer's workers are: OpenBLAS threads
     * on top would fight them for cores, and a forward pass split over a varying number of
     * BLAS threads need not give the trainer's bits. */
    gr_blas_one_thread();
    s->cfg = *cfg;
    gr_serve_config def;
    gr_serve_config_default(&def);
    if (!s->cfg.poll_wait_ms) s->cfg.poll_wait_ms = def.poll_wait_ms;
    if (!s->cfg.threads) s->cfg.threads = def.threads;
    if (!s->cfg.max_body) s->cfg.max_body = def.max_body;
    if (!s->cfg.max_batch) s->cfg.max_batch = def.max_batch;
    if (!s->cfg.conn_memory) s->cfg.conn_memory = def.conn_memory;
    bool oom = false;
    s->model_dir = dup_or_null(cfg->model_dir, &oom);
    s->from = dup_or_null(cfg->from, &oom);
    s->auth_file = dup_or_null(cfg->auth_file, &oom);
    s->http_addr = dup_or_null(cfg->http, &oom);
    s->listen_addr = dup_or_null(cfg->listen, &oom);
    s->cfg.model_dir = s->model_dir;
    s->cfg.from = s->from;
    s->cfg.auth_file = s->auth_file;
    s->cfg.http = s->http_addr;
    s->cfg.listen = s->listen_addr;
    s->cfg.model = NULL;
    pthread_mutex_init(&s->mu, NULL);
    int rc = oom ? gr_seterr(GR_ENOMEM, "out of memory for a replica") : GR_OK;
    s->emb_table = GR_TRAIN_EMB_TABLE;
    if (!rc && cfg->model_dir) rc = sv_load_model_dir(s, cfg->model_dir);
    else if (!rc) rc = gr_model_create(cfg->model, &s->model);
    if (!rc) rc = sv_add_table(s, s->emb_table, NULL, gr_model_emb_dim(s->model));
    if (!rc) s->emb = sv_find_table(s, s->emb_table); /* before any other thread runs */
    if (rc) {
        gr_serve_destroy(s);
        return rc;
    }
    *out = s;
    return GR_OK;
}

int gr_serve_start(gr_serve *s)
{
    int rc = GR_OK;
    if (s->cfg.http) {
        gr_http_config hc = {.listen = s->cfg.http,
                             .threads = s->cfg.threads,
                             .max_body = s->cfg.max_body,
                             .slice_us = s->cfg.slice_us,
                             .conn_memory = s->cfg.conn_memory,
                             .handler = sv_http_handle,
                             .ctx = s};
        if (s->cfg.coalesce) {
            hc.park = sv_http_park;
            hc.run = sv_http_run;
            hc.reply = sv_http_reply;
        }
        rc = gr_http_start(&hc, &s->http);
    }
    if (!rc && s->cfg.listen) rc = sv_listen_start(s, s->cfg.listen, &s->listen);
    if (!rc && s->cfg.from) rc = sv_follow_start(s, &s->follow);
    return rc;
}

void gr_serve_freeze(gr_serve *s)
{
    pthread_mutex_lock(&s->mu);
    sv_follow *f = s->follow;
    s->follow = NULL;
    pthread_mutex_unlock(&s->mu);
    sv_follow_stop(f);
}

uint16_t gr_serve_http_port(const gr_serve *s) { return s->http ? gr_http_port(s->http) : 0; }
uint16_t gr_serve_port(const gr_serve *s) { return s->listen ? sv_listen_port(s->listen) : 0; }

void gr_serve_destroy(gr_serve *s)
{
    if (!s) return;
    gr_serve_freeze(s);
    sv_listen_stop(s->listen);
    gr_http_stop(s->http);
    for (size_t i = 0; i < s->ntables; i++) sv_table_destroy(s->tables[i]);
    free(s->tables);
    dense_put(s->dense);
    while (s->ws_free) {
        sv_ws *w = s->ws_free;
        s->ws_free = w->next;
        gr_score_ws_destroy(w->ws);
        free(w);
    }
    gr_model_destroy(s->model);
    pthread_mutex_destroy(&s->mu);
    free(s->model_dir), free(s->from), free(s->auth_file), free(s->http_addr), free(s->listen_addr);
    free(s);
}
