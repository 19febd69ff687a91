/* The worker loop. W workers (threads of this process) read the training file (each its own
 * byte range, or chunks taken in turn from a shared list) and run read/parse -> dedup + pull
 * -> forward/backward -> push as a pipeline of four threads joined by bounded queues, so
 * batch i+1 is read and pulled while batch i computes and batch i-1 is pushed (or all four in
 * turn with pipeline off). A step is: step_begin (token, sync modes) -> pull -> compute ->
 * push -> step_commit, or with the parameter-server backend in a sync mode: step_begin ->
 * fetch (rows and dense parameters at once) -> compute -> push_step (one message per shard).
 * A worker that runs out of data leaves the job (worker_done). */
#include "granary/train.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- bounded queue of work items ---------------------------------------------------------- */

typedef struct item item;

typedef struct queue {
    item **q;
    size_t cap, head, len;
    bool closed; /* no more pushes; pops drain what is left */
    bool *abort; /* shared: everything stops at once */
    pthread_mutex_t *mu;
    pthread_cond_t cv;
} queue;

static int queue_init(queue *q, size_t cap, pthread_mutex_t *mu, bool *abort)
{
    memset(q, 0, sizeof *q);
    q->q = calloc(cap, sizeof *q->q);
    if (!q->q) return gr_seterr(GR_ENOMEM, "cannot allocate a queue");
    q->cap = cap;
    q->mu = mu;
    q->abort = abort;
    pthread_cond_init(&q->cv, NULL);
    return GR_OK;
}

static void queue_fini(queue *q)
{
    free(q->q);
    if (q->cap) pthread_cond_destroy(&q->cv);
    memset(q, 0, sizeof *q);
}

/* Never blocks for long: the queue holds every item of its worker. */
static void queue_push(queue *q, item *it)
{
    pthread_mutex_lock(q->mu);
    while (q->len == q->cap && !*q->abort) pthread_cond_wait(&q->cv, q->mu);
    if (!*q->abort) {
        q->q[(q->head + q->len++) % q->cap] = it;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(q->mu);
}

/* NULL when closed and empty, or aborted. */
static item *queue_pop(queue *q)
{
    item *it = NULL;
    pthread_mutex_lock(q->mu);
    while (q->len == 0 && !q->closed && !*q->abort) pthread_cond_wait(&q->cv, q->mu);
    if (q->len && !*q->abort) {
        it = q->q[q->head];
        q->head = (q->head + 1) % q->cap;
        q->len--;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(q->mu);
    return it;
}

static void queue_close(queue *q)
{
    pthread_mutex_lock(q->mu);
    q->closed = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(q->mu);
}

/* ---- trainer state ------------------------------------------------------------------------ */

struct item {
    gr_batch batch;
    uint64_t *uniq;
    uint32_t *inv;
    size_t nuniq;
    float *rows;   /* nuniq x dim: pulled rows, later the summed gradients */
    float *emb;    /* n x 26 x dim: per occurrence */
    float *gemb;   /* its gradient */
    float *params; /* dense parameters as pulled */
    float *gdense;
    double loss;
    uint64_t token;
};

typedef struct trainer trainer;

typedef struct worker {
    trainer *tr;
    unsigned id;
    uint64_t start, end, first_line; /* byte range of the training file (static data) */
    uint64_t steps;                  /* batches pushed (push stage only) */
    item *items;
    unsigned nitems;
    queue free_q, read_q, fetch_q, push_q;
    pthread_mutex_t mu;
    bool abort;
    gr_model_ws *ws;
    gr_dedup_scratch dedup;
} worker;

struct trainer {
    const gr_train_opts *o;
    gr_train_backend *be;
    gr_model *m;
    uint32_t dim;
    size_t np;
    const char *dense_name;
    worker *workers;

    pthread_mutex_t mu; /* everything below */
    pthread_cond_t cv;
    int err;
    char errmsg[512];
    unsigned running; /* workers not finished */
    uint64_t examples, steps, dropped, bad_lines;
    double loss_sum;        /* since the last progress line: sum of loss * n */
    uint64_t loss_n;
    double wait_s;          /* in step_begin, summed over workers */
    atomic_uint_fast64_t read_examples; /* for max_examples */
    /* How the data is cut: sync modes fetch dense parameters with the rows right after the
     * token and push everything with push_step; async pulls/pushes dense around compute. */
    bool stepped;
    bool shared;            /* workers take chunks in turn */
    uint64_t *chunk_off, *chunk_line; /* nchunks + 1 entries */
    unsigned nchunks;
    atomic_uint_fast64_t next_chunk;  /* over epochs * nchunks */
    atomic_bool cancelled;
};

static void fail(trainer *tr, worker *w, int rc)
{
    pthread_mutex_lock(&tr->mu);
    bool first = !tr->err;
    if (!tr->err) {
        tr->err = rc;
        snprintf(tr->errmsg, sizeof tr->errmsg, "worker %u: %s", w->id, gr_errmsg());
    }
    pthread_mutex_unlock(&tr->mu);
    /* Workers blocked on a step token would wait out their timeout: wake them. */
    if (first && tr->be->cancel && !atomic_exchange(&tr->cancelled, true)) tr->be->cancel(tr->be->ctx);
    /* Stop every worker: one failed step fails the job. */
    for (unsigned i = 0; i < tr->o->workers; i++) {
        worker *x = &tr->workers[i];
        pthread_mutex_lock(&x->mu);
        x->abort = true;
        queue *qs[] = {&x->free_q, &x->read_q, &x->fetch_q, &x->push_q};
        for (int k = 0; k < 4; k++)
            if (qs[k]->cap) pthread_cond_broadcast(&qs[k]->cv);
        pthread_mutex_unlock(&x->mu);
    }
}

static bool aborted(worker *w)
{
    pthread_mutex_lock(&w->mu);
    bool a = w->abort;
    pthread_mutex_unlock(&w->mu);
    return a;
}

static int item_init(trainer *tr, item *it)
{
    memset(it, 0, sizeof *it);
    size_t b = tr->o->batch, occ = b * GR_CRITEO_SPARSE;
    int rc = gr_batch_init(&it->batch, b);
    if (rc) return rc;
    it->uniq = malloc(occ * sizeof *it->uniq);
    it->inv = malloc(occ * sizeof *it->inv);
    it->rows = malloc(occ * tr->dim * sizeof *it->rows);
    it->emb = malloc(occ * tr->dim * sizeof *it->emb);
    it->gemb = malloc(occ * tr->dim * sizeof *it->gemb);
    it->params = malloc(tr->np * sizeof *it->params);
    it->gdense = malloc(tr->np * sizeof *it->gdense);
    if (!it->uniq || !it->inv || !it->rows || !it->emb || !it->gemb || !it->params ||
        !it->gdense)
        return gr_seterr(GR_ENOMEM, "cannot allocate buffers for a batch of %zu", b);
    return GR_OK;
}

static void item_fini(item *it)
{
    gr_batch_fini(&it->batch);
    free(it->uniq);
    free(it->inv);
    free(it->rows);
    free(it->emb);
    free(it->gemb);
    free(it->params);
    free(it->gdense);
}

/* ---- the four stages ---------------------------------------------------------------------- */

/* Reads the worker's part of the file for every epoch, handing full items to `out`. Items come
 * from `pool` (pipeline) or are the single `it` (sequential: fn is called per batch). */
typedef int (*batch_fn)(worker *w, item *it);

/* The next byte range this worker reads: its own range once per epoch (static data), or the
 * next chunk of the shared list. false when there is none left. */
static bool next_range(worker *w, unsigned *epoch, uint64_t *start, uint64_t *end, uint64_t *line)
{
    trainer *tr = w->tr;
    if (!tr->shared) {
        if (*epoch >= tr->o->epochs || w->start >= w->end) return false;
        *start = w->start;
        *end = w->end;
        *line = w->first_line;
        (*epoch)++;
        return true;
    }
    for (;;) {
        uint64_t c = atomic_fetch_add(&tr->next_chunk, 1);
        if (c >= (uint64_t)tr->o->epochs * tr->nchunks) return false;
        unsigned k = (unsigned)(c % tr->nchunks);
        if (tr->chunk_off[k] >= tr->chunk_off[k + 1]) continue; /* empty chunk */
        *start = tr->chunk_off[k];
        *end = tr->chunk_off[k + 1];
        *line = tr->chunk_line[k];
        return true;
    }
}

static int read_epochs(worker *w, queue *pool, queue *out, item *single, batch_fn each)
{
    trainer *tr = w->tr;
    const gr_train_opts *o = tr->o;
    unsigned epoch = 0;
    uint64_t start, end, line;
    while (next_range(w, &epoch, &start, &end, &line)) {
        gr_criteo_opts ro;
        gr_criteo_opts_default(&ro);
        ro.batch = o->batch;
        ro.threads = o->parse_threads;
        ro.strict = o->strict;
        ro.start = start;
        ro.end = end;
        ro.first_line = line;
        gr_criteo_reader *r;
        int rc = gr_criteo_open(o->train_path, &ro, &r);
        if (rc) return rc;
        for (;;) {
            if (o->max_examples && atomic_load(&tr->read_examples) >= o->max_examples) break;
            item *it = single ? single : queue_pop(pool);
            if (!it) break; /* aborted */
            rc = gr_criteo_next(r, &it->batch);
            if (rc || it->batch.n == 0) {
                if (!single) queue_push(pool, it);
                break;
            }
            atomic_fetch_add(&tr->read_examples, it->batch.n);
            if (single) {
                rc = each(w, it);
                if (rc) break;
            } else {
                queue_push(out, it);
            }
            if (aborted(w)) break;
        }
        gr_criteo_stats st;
        gr_criteo_get_stats(r, &st);
        gr_criteo_close(r);
        pthread_mutex_lock(&tr->mu);
        tr->bad_lines += st.bad_lines;
        pthread_mutex_unlock(&tr->mu);
        if (rc) return rc;
        if (aborted(w) ||
            (o->max_examples && atomic_load(&tr->read_examples) >= o->max_examples))
            break;
    }
    return GR_OK;
}

static int stage_fetch(worker *w, item *it)
{
    trainer *tr = w->tr;
    gr_train_backend *be = tr->be;
    int rc;
    size_t occ = it->batch.n * GR_CRITEO_SPARSE;
    long nu = gr_dedup(it->batch.ids, occ, it->uniq, it->inv, &w->dedup);
    if (nu < 0) return (int)nu;
    it->nuniq = (size_t)nu;
    if (be->step_begin) {
        double t0 = gr_now_s();
        rc = be->step_begin(be->ctx, w->id, &it->token);
        double waited = gr_now_s() - t0;
        pthread_mutex_lock(&tr->mu);
        tr->wait_s += waited;
        pthread_mutex_unlock(&tr->mu);
        if (rc) return rc;
    }
    /* In the sync modes the token orders everything: the dense parameters fetched right after
     * it are exactly the current step's, so they come with the rows (one round trip). */
    if (tr->stepped && be->fetch)
        rc = be->fetch(be->ctx, tr->o->emb.id, it->uniq, it->nuniq, it->rows, tr->dense_name,
                       it->params, tr->np);
    else
        rc = be->pull(be->ctx, tr->o->emb.id, it->uniq, it->nuniq, it->rows, 0);
    if (!rc && tr->stepped && !be->fetch)
        rc = be->dense_pull(be->ctx, tr->dense_name, it->params, tr->np);
    if (rc) return rc;
    /* Each occurrence's row, for the model. Done here rather than in compute: the compute
     * stage is the pipeline's slowest, so memory work moves to the stages around it. */
    const uint32_t d = tr->dim;
    for (size_t i = 0; i < occ; i++)
        memcpy(it->emb + i * d, it->rows + (size_t)it->inv[i] * d, d * sizeof(float));
    return GR_OK;
}

/* Sleeps seconds (a straggler's extra time). */
static void sleep_s(double secs)
{
    if (secs <= 0) return;
    struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static int stage_compute(worker *w, item *it)
{
    trainer *tr = w->tr;
    gr_train_backend *be = tr->be;
    double t0 = gr_now_s();
    /* Dense parameters are pulled here, not with the rows: every batch touches all of them,
     * so prefetching them would make each step several steps stale (measured: AUC 0.68 vs
     * 0.77 after 100 k rows), while a given embedding row is touched rarely. (In the sync
     * modes the step token already orders them: stage_fetch pulled them.) */
    bool async_dense = !tr->stepped && be->dense_pull_start && be->dense_push_start && be->op_wait;
    void *op = NULL;
    int rc = GR_OK;
    if (async_dense)
        rc = be->dense_pull_start(be->ctx, tr->dense_name, it->params, tr->np, &op);
    else if (!tr->stepped)
        rc = be->dense_pull(be->ctx, tr->dense_name, it->params, tr->np);
    if (rc) return rc;
    if (op && (rc = be->op_wait(be->ctx, op))) return rc;
    op = NULL;
    rc = gr_model_train_step(tr->m, w->ws, it->params, it->batch.n, it->batch.dense, it->emb,
                             it->batch.labels, &it->loss, NULL, it->gdense, it->gemb);
    if (rc) return rc;
    if (!isfinite(it->loss))
        return gr_seterr(GR_EINVAL, "training loss is not finite (learning rate too high?)");
    /* The dense gradient goes out at once, for the same reason the pull came late: the next
     * batch's compute then sees this step's dense update (it is waited for before this stage
     * ends). (Sync modes: with the step.) */
    if (async_dense)
        rc = be->dense_push_start(be->ctx, tr->dense_name, it->gdense, tr->np, &op);
    else if (!tr->stepped)
        rc = be->dense_push(be->ctx, tr->dense_name, it->gdense, tr->np);
    if (rc) return rc;
    if (op && (rc = be->op_wait(be->ctx, op))) return rc;
    if (w->id == tr->o->straggler && tr->o->straggler_factor > 1)
        sleep_s((tr->o->straggler_factor - 1) * (gr_now_s() - t0));
    return GR_OK;
}

static int stage_push(worker *w, item *it)
{
    trainer *tr = w->tr;
    gr_train_backend *be = tr->be;
    bool dropped = false;
    int rc;
    /* Sum the gradients of duplicate ids into one row per unique id (reusing rows). */
    const uint32_t d = tr->dim;
    size_t occ = it->batch.n * GR_CRITEO_SPARSE;
    memset(it->rows, 0, it->nuniq * d * sizeof(float));
    for (size_t i = 0; i < occ; i++) {
        float *dst = it->rows + (size_t)it->inv[i] * d;
        const float *src = it->gemb + i * d;
        for (uint32_t k = 0; k < d; k++) dst[k] += src[k];
    }
    if (tr->stepped)
        rc = be->push_step(be->ctx, w->id, it->token, tr->o->emb.id, it->uniq, it->nuniq,
                           it->rows, tr->dense_name, it->gdense, tr->np, &dropped);
    else
        rc = be->push(be->ctx, tr->o->emb.id, it->uniq, it->nuniq, it->rows);
    if (!rc && !tr->stepped && be->step_commit) {
        rc = be->step_commit(be->ctx, w->id, it->token);
        if (rc == GR_ESTALE) {
            dropped = true;
            rc = GR_OK;
        }
    }
    if (rc) return rc;
    w->steps++;
    pthread_mutex_lock(&tr->mu);
    tr->examples += it->batch.n;
    tr->steps++;
    tr->dropped += dropped;
    tr->loss_sum += it->loss * (double)it->batch.n;
    tr->loss_n += it->batch.n;
    pthread_mutex_unlock(&tr->mu);
    return GR_OK;
}

static int sequential_step(worker *w, item *it)
{
    int rc = stage_fetch(w, it);
    if (!rc) rc = stage_compute(w, it);
    if (!rc) rc = stage_push(w, it);
    return rc;
}

static void *reader_main(void *arg)
{
    worker *w = arg;
    int rc = read_epochs(w, &w->free_q, &w->read_q, NULL, NULL);
    if (rc) fail(w->tr, w, rc);
    queue_close(&w->read_q);
    return NULL;
}

static void *fetch_main(void *arg)
{
    worker *w = arg;
    item *it;
    while ((it = queue_pop(&w->read_q))) {
        int rc = stage_fetch(w, it);
        if (rc) {
            fail(w->tr, w, rc);
            break;
        }
        queue_push(&w->fetch_q, it);
    }
    queue_close(&w->fetch_q);
    return NULL;
}

static void *compute_main(void *arg)
{
    worker *w = arg;
    item *it;
    while ((it = queue_pop(&w->fetch_q))) {
        int rc = stage_compute(w, it);
        if (rc) {
            fail(w->tr, w, rc);
            break;
        }
        queue_push(&w->push_q, it);
    }
    queue_close(&w->push_q);
    return NULL;
}

static void *push_main(void *arg)
{
    worker *w = arg;
    item *it;
    while ((it = queue_pop(&w->push_q))) {
        int rc = stage_push(w, it);
        if (rc) {
            fail(w->tr, w, rc);
            break;
        }
        queue_push(&w->free_q, it);
    }
    return NULL;
}

/* After a worker's last push: it leaves the sync job so the others stop waiting for it. */
static void leave_job(worker *w)
{
    trainer *tr = w->tr;
    if (!tr->be->worker_done || aborted(w)) return;
    int rc = tr->be->worker_done(tr->be->ctx, w->id);
    if (rc) fail(tr, w, rc);
}

static void worker_done(trainer *tr)
{
    pthread_mutex_lock(&tr->mu);
    tr->running--;
    pthread_cond_broadcast(&tr->cv);
    pthread_mutex_unlock(&tr->mu);
}

static void *sequential_main(void *arg)
{
    worker *w = arg;
    int rc = read_epochs(w, NULL, NULL, &w->items[0], sequential_step);
    if (rc) fail(w->tr, w, rc);
    else leave_job(w);
    worker_done(w->tr);
    return NULL;
}

/* A pipelined worker: this thread runs the push stage after starting the other three. */
static void *pipeline_main(void *arg)
{
    worker *w = arg;
    pthread_t t[3];
    void *(*fns[3])(void *) = {reader_main, fetch_main, compute_main};
    unsigned started = 0;
    for (; started < 3; started++)
        if (pthread_create(&t[started], NULL, fns[started], w) != 0) {
            fail(w->tr, w, gr_seterr(GR_ENOMEM, "cannot start a pipeline thread"));
            queue_close(&w->read_q);
            queue_close(&w->fetch_q);
            queue_close(&w->push_q);
            break;
        }
    push_main(w);
    for (unsigned i = 0; i < started; i++) pthread_join(t[i], NULL);
    leave_job(w);
    worker_done(w->tr);
    return NULL;
}

static void worker_fini(worker *w)
{
    if (w->items)
        for (unsigned i = 0; i < w->nitems; i++) item_fini(&w->items[i]);
    free(w->items);
    queue_fini(&w->free_q);
    queue_fini(&w->read_q);
    queue_fini(&w->fetch_q);
    queue_fini(&w->push_q);
    gr_model_ws_destroy(w->ws);
    gr_dedup_scratch_fini(&w->dedup);
    pthread_mutex_destroy(&w->mu);
}

static int worker_init(trainer *tr, worker *w, unsigned id)
{
    memset(w, 0, sizeof *w);
    w->tr = tr;
    w->id = id;
    pthread_mutex_init(&w->mu, NULL);
    unsigned depth = tr->o->queue_depth ? tr->o->queue_depth : 1;
    /* Every stage holds at most one item and every queue `depth`: 3 queues + 4 stages. */
    w->nitems = tr->o->pipeline ? 3 * depth + 4 : 1;
    w->items = calloc(w->nitems, sizeof *w->items);
    if (!w->items) return gr_seterr(GR_ENOMEM, "cannot allocate work items");
    for (unsigned i = 0; i < w->nitems; i++) {
        int rc = item_init(tr, &w->items[i]);
        if (rc) return rc;
    }
    int rc = gr_model_ws_create(tr->m, &w->ws);
    if (rc) return rc;
    if (tr->o->pipeline) {
        if ((rc = queue_init(&w->free_q, w->nitems, &w->mu, &w->abort)) ||
            (rc = queue_init(&w->read_q, depth, &w->mu, &w->abort)) ||
            (rc = queue_init(&w->fetch_q, depth, &w->mu, &w->abort)) ||
            (rc = queue_init(&w->push_q, depth, &w->mu, &w->abort)))
            return rc;
        for (unsigned i = 0; i < w->nitems; i++) queue_push(&w->free_q, &w->items[i]);
    }
    return GR_OK;
}

/* ---- options ------------------------------------------------------------------------------ */

const char *gr_train_mode_name(gr_train_mode m)
{
    switch (m) {
    case GR_MODE_ASYNC: return "async";
    case GR_MODE_SYNC: return "sync";
    case GR_MODE_SEMISYNC: return "semisync";
    case GR_MODE_SSP: return "ssp";
    }
    return "unknown";
}

int gr_train_mode_parse(const char *s, gr_train_mode *out)
{
    for (int m = GR_MODE_ASYNC; m <= GR_MODE_SSP; m++)
        if (s && !strcmp(s, gr_train_mode_name((gr_train_mode)m))) {
            *out = (gr_train_mode)m;
            return GR_OK;
        }
    return gr_seterr(GR_EINVAL, "unknown mode '%s' (async, sync, semisync, ssp)", s ? s : "");
}

void gr_train_opts_default(gr_train_opts *o, gr_model_kind kind)
{
    memset(o, 0, sizeof *o);
    gr_model_config_default(&o->model, kind);
    o->batch = 1024;
    o->epochs = 1;
    o->workers = 2;
    o->mode = GR_MODE_ASYNC;
    o->pipeline = true;
    o->queue_depth = 1;
    o->progress_s = 5.0;
    gr_table_spec *t = &o->emb;
    if (kind == GR_MODEL_LR) {
        gr_table_spec_default(t, "lr_weights", 1);
        t->init.kind = GR_INIT_ZEROS;
        t->opt.kind = GR_OPT_FTRL;
        t->opt.lr = 0.05f; /* FTRL alpha */
        t->opt.beta = 1.0f;
        t->opt.l1 = 0.1f;
        t->opt.l2 = 1.0f;
    } else {
        gr_table_spec_default(t, "embeddings", o->model.dim);
        t->init.kind = GR_INIT_UNIFORM;
        t->init.low = -0.05f;
        t->init.high = 0.05f;
        t->opt.kind = GR_OPT_ADAGRAD;
        t->opt.lr = 0.05f;
        t->opt.eps = 1e-8f;
        /* A tiny accumulator damps the first steps of rare rows (with zero, Adagrad's first
         * step is lr * sign(g) whatever the gradient's size). */
        t->opt.initial_accumulator = 1e-7f;
    }
    t->id = GR_TRAIN_EMB_TABLE;
    t->seed = 0x656d62; /* "emb" */
}

/* ---- run ---------------------------------------------------------------------------------- */

static void progress_line(trainer *tr, double t0, double *last_t, uint64_t *last_ex,
                          double *window_loss)
{
    double now = gr_now_s();
    pthread_mutex_lock(&tr->mu);
    uint64_t ex = tr->examples;
    double loss = tr->loss_n ? tr->loss_sum / (double)tr->loss_n : NAN;
    tr->loss_sum = 0;
    tr->loss_n = 0;
    pthread_mutex_unlock(&tr->mu);
    if (!isnan(loss)) *window_loss = loss;
    double dt = now - *last_t;
    fprintf(stderr, "train: %.1fs %llu examples, %.0f examples/s, loss %.5f\n", now - t0,
            (unsigned long long)ex, dt > 0 ? (double)(ex - *last_ex) / dt : 0.0, *window_loss);
    *last_t = now;
    *last_ex = ex;
}

static int check_opts(const gr_train_opts *o, const gr_train_backend *be)
{
    if (!o->train_path) return gr_seterr(GR_EINVAL, "train: a training file is needed");
    if (o->batch == 0 || o->batch > (1u << 20))
        return gr_seterr(GR_EINVAL, "train: batch must be 1..%u", 1u << 20);
    if (o->workers == 0 || o->workers > 256)
        return gr_seterr(GR_EINVAL, "train: workers must be 1..256");
    if (o->queue_depth > 64) return gr_seterr(GR_EINVAL, "train: queue depth must be <= 64");
    if (!be || !be->pull || !be->push || !be->dense_pull || !be->dense_push || !be->table_init ||
        !be->dense_init)
        return gr_seterr(GR_EINVAL, "train: the backend lacks a function");
    if (o->mode != GR_MODE_ASYNC && (!be->step_begin || (!be->step_commit && !be->push_step)))
        return gr_seterr(GR_EINVAL,
                         "train: mode %s needs a backend with step tokens: the parameter-server "
                         "backend (the local in-process backend is async only)",
                         gr_train_mode_name(o->mode));
    if (o->straggler_factor > 1 && o->straggler >= o->workers)
        return gr_seterr(GR_EINVAL, "train: straggler worker %u does not exist (%u workers)",
                         o->straggler, o->workers);
    if (o->data < GR_TRAIN_DATA_AUTO || o->data > GR_TRAIN_DATA_SHARED)
        return gr_seterr(GR_EINVAL, "train: unknown data assignment %d", o->data);
    uint32_t want_dim = o->model.kind == GR_MODEL_LR ? 1 : o->model.dim;
    if (o->emb.dim != want_dim)
        return gr_seterr(GR_EDIM, "train: embedding table '%s' has dim %u, the model needs %u",
                         o->emb.name, o->emb.dim, want_dim);
    return GR_OK;
}

int gr_train_run(const gr_train_opts *o, gr_train_backend *be, gr_train_result *res)
{
    memset(res, 0, sizeof *res);
    res->test_auc = res->test_logloss = NAN;
    int rc = check_opts(o, be);
    if (rc) return rc;
    /* The workers are the parallelism; OpenBLAS threads on top would fight them for cores. */
    openblas_set_num_threads(1);

    trainer tr = {.o = o, .be = be};
    pthread_mutex_init(&tr.mu, NULL);
    pthread_cond_init(&tr.cv, NULL);
    float *init = NULL;
    uint64_t *offsets = NULL, *first = NULL;
    unsigned started = 0;
    pthread_t *tids = NULL;
    if ((rc = gr_model_create(&o->model, &tr.m))) goto out;
    tr.dim = gr_model_emb_dim(tr.m);
    tr.np = gr_model_dense_size(tr.m);
    tr.dense_name = gr_model_dense_name(tr.m);
    if ((rc = be->table_init(be->ctx, &o->emb))) goto out;
    init = malloc(tr.np * sizeof *init);
    if (!init) {
        rc = gr_seterr(GR_ENOMEM, "train: out of memory");
        goto out;
    }
    gr_model_init_dense(tr.m, init);
    if ((rc = be->dense_init(be->ctx, tr.dense_name, init, tr.np))) goto out;

    offsets = calloc(o->workers + 1, sizeof *offsets);
    first = calloc(o->workers + 1, sizeof *first);
    tr.workers = calloc(o->workers, sizeof *tr.workers);
    tids = calloc(o->workers, sizeof *tids);
    if (!offsets || !first || !tr.workers || !tids) {
        rc = gr_seterr(GR_ENOMEM, "train: out of memory");
        goto out;
    }
    tr.stepped = be->step_begin && be->push_step;
    tr.shared = o->data == GR_TRAIN_DATA_SHARED ||
                (o->data == GR_TRAIN_DATA_AUTO && o->workers > 1 && o->mode != GR_MODE_SYNC);
    if (tr.shared) {
        /* Small chunks taken in turn: a fast worker reads more of the file, so a straggler
         * does not leave a tail of its own range for the end of the run. */
        tr.nchunks = o->workers * 64;
        tr.chunk_off = calloc(tr.nchunks + 1, sizeof *tr.chunk_off);
        tr.chunk_line = calloc(tr.nchunks + 1, sizeof *tr.chunk_line);
        if (!tr.chunk_off || !tr.chunk_line) {
            rc = gr_seterr(GR_ENOMEM, "train: out of memory");
            goto out;
        }
        if ((rc = gr_criteo_split(o->train_path, tr.nchunks, tr.chunk_off, tr.chunk_line))) goto out;
    } else if ((rc = gr_criteo_split(o->train_path, o->workers, offsets, first))) {
        goto out;
    }
    for (unsigned i = 0; i < o->workers; i++) {
        if ((rc = worker_init(&tr, &tr.workers[i], i))) goto out;
        tr.workers[i].start = offsets[i];
        tr.workers[i].end = offsets[i + 1];
        tr.workers[i].first_line = first[i];
    }

    double t0 = gr_now_s(), last_t = t0, window_loss = NAN;
    uint64_t last_ex = 0;
    tr.running = o->workers;
    for (; started < o->workers; started++) {
        if (pthread_create(&tids[started], NULL, o->pipeline ? pipeline_main : sequential_main,
                           &tr.workers[started]) != 0) {
            pthread_mutex_lock(&tr.mu);
            tr.running -= o->workers - started;
            pthread_mutex_unlock(&tr.mu);
            fail(&tr, &tr.workers[0], gr_seterr(GR_ENOMEM, "cannot start worker %u", started));
            break;
        }
    }
    /* Wait for the workers, with a progress line every progress_s seconds. */
    pthread_mutex_lock(&tr.mu);
    while (tr.running) {
        if (o->progress_s > 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            double next = ts.tv_sec + ts.tv_nsec * 1e-9 + o->progress_s;
            ts.tv_sec = (time_t)next;
            ts.tv_nsec = (long)((next - (double)ts.tv_sec) * 1e9);
            int w = pthread_cond_timedwait(&tr.cv, &tr.mu, &ts);
            if (w != 0 && tr.running) {
                pthread_mutex_unlock(&tr.mu);
                progress_line(&tr, t0, &last_t, &last_ex, &window_loss);
                pthread_mutex_lock(&tr.mu);
            }
        } else {
            pthread_cond_wait(&tr.cv, &tr.mu);
        }
    }
    pthread_mutex_unlock(&tr.mu);
    for (unsigned i = 0; i < started; i++) pthread_join(tids[i], NULL);
    double t1 = gr_now_s();
    if (o->progress_s > 0) progress_line(&tr, t0, &last_t, &last_ex, &window_loss);
    else if (tr.loss_n) window_loss = tr.loss_sum / (double)tr.loss_n;

    res->examples = tr.examples;
    res->steps = tr.steps;
    res->train_seconds = t1 - t0;
    res->examples_per_sec = res->train_seconds > 0 ? (double)tr.examples / res->train_seconds : 0;
    res->last_loss = window_loss;
    res->dropped_gradients = tr.dropped;
    res->bad_lines = tr.bad_lines;
    res->wait_seconds = tr.wait_s;
    for (unsigned i = 0; i < o->workers && i < GR_TRAIN_MAX_REPORTED_WORKERS; i++)
        res->worker_steps[i] = tr.workers[i].steps;
    if (tr.err) {
        rc = gr_seterr(tr.err, "%s", tr.errmsg);
        goto out;
    }
    if (o->test_path) {
        rc = gr_train_evaluate(tr.m, be, o->emb.id, o->test_path, o->batch, o->workers,
                               &res->test_auc, &res->test_logloss, &res->test_examples);
    }
out:
    if (tr.workers)
        for (unsigned i = 0; i < o->workers; i++) worker_fini(&tr.workers[i]);
    free(tr.workers);
    free(tr.chunk_off);
    free(tr.chunk_line);
    free(tids);
    free(offsets);
    free(first);
    free(init);
    gr_model_destroy(tr.m);
    pthread_mutex_destroy(&tr.mu);
    pthread_cond_destroy(&tr.cv);
    return rc;
}

/* ---- evaluation --------------------------------------------------------------------------- */

typedef struct eval_part {
    const gr_model *m;
    gr_train_backend *be;
    uint32_t table;
    const char *path;
    size_t batch;
    uint64_t start, end, first_line;
    float *probs, *labels;
    size_t n, cap;
    int rc;
    char errmsg[512];
} eval_part;

static int eval_range(eval_part *p)
{
    const gr_model *m = p->m;
    uint32_t d = gr_model_emb_dim(m);
    size_t np = gr_model_dense_size(m), occ = p->batch * GR_CRITEO_SPARSE;
    gr_criteo_opts ro;
    gr_criteo_opts_default(&ro);
    ro.batch = p->batch;
    ro.start = p->start;
    ro.end = p->end;
    ro.first_line = p->first_line;
    gr_criteo_reader *r = NULL;
    gr_model_ws *ws = NULL;
    gr_dedup_scratch ds = {0};
    gr_batch b = {0};
    float *params = malloc(np * sizeof *params), *rows = malloc(occ * d * sizeof *rows),
          *emb = malloc(occ * d * sizeof *emb);
    uint64_t *uniq = malloc(occ * sizeof *uniq);
    uint32_t *inv = malloc(occ * sizeof *inv);
    int rc;
    if (!params || !rows || !emb || !uniq || !inv) {
        rc = gr_seterr(GR_ENOMEM, "evaluate: out of memory");
        goto out;
    }
    if ((rc = gr_batch_init(&b, p->batch)) || (rc = gr_model_ws_create(m, &ws))) goto out;
    if ((rc = p->be->dense_pull(p->be->ctx, gr_model_dense_name(m), params, np))) goto out;
    if ((rc = gr_criteo_open(p->path, &ro, &r))) goto out;
    for (;;) {
        if ((rc = gr_criteo_next(r, &b)) || b.n == 0) break;
        long nu = gr_dedup(b.ids, b.n * GR_CRITEO_SPARSE, uniq, inv, &ds);
        if (nu < 0) {
            rc = (int)nu;
            break;
        }
        rc = p->be->pull(p->be->ctx, p->table, uniq, (size_t)nu, rows, GR_PULL_READONLY);
        if (rc) break;
        for (size_t i = 0; i < b.n * GR_CRITEO_SPARSE; i++)
            memcpy(emb + i * d, rows + (size_t)inv[i] * d, d * sizeof *emb);
        if (p->n + b.n > p->cap) {
            size_t cap = p->cap ? p->cap * 2 : 65536;
            while (cap < p->n + b.n) cap *= 2;
            float *np1 = realloc(p->probs, cap * sizeof *np1);
            if (np1) p->probs = np1;
            float *nl = realloc(p->labels, cap * sizeof *nl);
            if (nl) p->labels = nl;
            if (!np1 || !nl) {
                rc = gr_seterr(GR_ENOMEM, "evaluate: out of memory");
                break;
            }
            p->cap = cap;
        }
        if ((rc = gr_model_predict(m, ws, params, b.n, b.dense, emb, p->probs + p->n))) break;
        memcpy(p->labels + p->n, b.labels, b.n * sizeof *p->labels);
        p->n += b.n;
    }
out:
    gr_criteo_close(r);
    gr_model_ws_destroy(ws);
    gr_dedup_scratch_fini(&ds);
    gr_batch_fini(&b);
    free(params);
    free(rows);
    free(emb);
    free(uniq);
    free(inv);
    return rc;
}

static void *eval_main(void *arg)
{
    eval_part *p = arg;
    p->rc = eval_range(p);
    if (p->rc) snprintf(p->errmsg, sizeof p->errmsg, "%s", gr_errmsg());
    return NULL;
}

int gr_train_evaluate(const gr_model *m, gr_train_backend *be, uint32_t table, const char *path,
                      size_t batch, unsigned threads, double *auc, double *logloss,
                      uint64_t *examples)
{
    *auc = *logloss = NAN;
    *examples = 0;
    if (!threads) threads = 1;
    if (threads > 64) threads = 64;
    if (!batch) batch = 1024;
    uint64_t off[65], first[65];
    int rc = gr_criteo_split(path, threads, off, first);
    if (rc) return rc;
    eval_part parts[64];
    pthread_t tids[64];
    unsigned started = 0;
    for (unsigned i = 0; i < threads; i++) {
        parts[i] = (eval_part){.m = m, .be = be, .table = table, .path = path, .batch = batch,
                               .start = off[i], .end = off[i + 1], .first_line = first[i]};
    }
    for (unsigned i = 1; i < threads; i++, started++)
        if (pthread_create(&tids[i], NULL, eval_main, &parts[i]) != 0) {
            parts[i].rc = gr_seterr(GR_ENOMEM, "evaluate: cannot start a thread");
            snprintf(parts[i].errmsg, sizeof parts[i].errmsg, "%s", gr_errmsg());
            break;
        }
    eval_main(&parts[0]);
    for (unsigned i = 1; i <= started; i++) pthread_join(tids[i], NULL);
    size_t n = 0;
    for (unsigned i = 0; i < threads; i++) {
        if (parts[i].rc && !rc) rc = gr_seterr(parts[i].rc, "%s", parts[i].errmsg);
        n += parts[i].n;
    }
    float *probs = NULL, *labels = NULL;
    if (!rc && n) {
        probs = malloc(n * sizeof *probs);
        labels = malloc(n * sizeof *labels);
        if (!probs || !labels) rc = gr_seterr(GR_ENOMEM, "evaluate: out of memory");
    }
    if (!rc && n) {
        size_t at = 0;
        for (unsigned i = 0; i < threads; i++) {
            memcpy(probs + at, parts[i].probs, parts[i].n * sizeof *probs);
            memcpy(labels + at, parts[i].labels, parts[i].n * sizeof *labels);
            at += parts[i].n;
        }
        rc = gr_auc(probs, labels, n, auc);
        *logloss = gr_logloss(probs, labels, n);
        *examples = n;
    }
    for (unsigned i = 0; i < threads; i++) {
        free(parts[i].probs);
        free(parts[i].labels);
    }
    free(probs);
    free(labels);
    return rc;
}
