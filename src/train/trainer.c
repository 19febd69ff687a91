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
#include <cjson/cJSON.h>
#include <sys/stat.h>
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
    uint64_t chunk; /* shared data: the chunk (counter value) it was read from */
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
    /* Checkpoints and resume (under tr->mu, except skip and read: the reader's own). */
    uint64_t base;      /* batches this worker pushed before the resume */
    uint64_t skip;      /* static data: batches to skip first (done before the resume) */
    uint64_t read;      /* batches handed on in this run (for max_steps) */
    uint64_t fetched;   /* items past the checkpoint gate (fetch stage) */
    int gate;           /* GATE_* */
    bool finished;      /* its threads are done (it left the job) */
    uint64_t cur_chunk; /* shared data: chunk of its last pushed item (UINT64_MAX: none) */
} worker;

/* Where a worker's fetch stage is, for the checkpoint coordinator. */
enum { GATE_RUN = 0, GATE_PARKED = 1, GATE_ACQUIRING = 2, GATE_HELD = 3 };

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
    /* Checkpoints (under mu; docs/checkpoints.md "In training"). Sync mode pauses every worker
     * at the same step ("rounds"): before it takes the token of step ck_target. The other modes
     * pause every worker wherever it is between two steps (ck_pause). */
    bool ck, ck_rounds, ck_pause;
    uint64_t ck_npause;      /* pauses so far (started) */
    uint64_t ck_target;      /* rounds: the step at which workers pause next (0: none) */
    uint64_t ck_next_total;  /* pause mode: pause when this many batches are pushed in all */
    uint64_t ck_saved_total; /* batches pushed in all at the last checkpoint (or the resume) */
    char ck_parent[64];      /* the last checkpoint this run committed */
    uint64_t base_total, base_examples; /* done before the resume */
    uint64_t nchunk_total;   /* shared data: epochs * nchunks */
    int32_t *chunk_owner;    /* per chunk counter value: the worker that took it, or -1 */
    uint64_t *chunk_pushed;  /* per chunk counter value: batches pushed (resumed ones included) */
    uint8_t *chunk_done;     /* per chunk counter value: complete before the resume */
    gr_train_result *res;
};

static void fail(trainer *tr, worker *w, int rc)
{
    pthread_mutex_lock(&tr->mu);
    bool first = !tr->err;
    if (!tr->err) {
        tr->err = rc;
        snprintf(tr->errmsg, sizeof tr->errmsg, "worker %u: %s", w->id, gr_errmsg());
    }
    pthread_cond_broadcast(&tr->cv); /* workers parked for a checkpoint */
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

/* ---- checkpoint gate ---------------------------------------------------------------------- */

/* Where checkpoints pause a worker: its fetch stage, before it takes the next step's token
 * (after = false) and, in the pause modes, again once it holds the token (after = true). A
 * parked worker's earlier items still go through compute and push, so when every worker is
 * parked (or finished) and drained, nothing is in flight and the coordinator saves. Sync mode
 * parks every worker before the token of the same step, so the shards are exactly at that
 * step's boundary; a worker blocked taking a token counts as quiet in the pause modes (a token
 * changes nothing on the shards) and, should the token come during the save, waits after it. */
/* A count that moves by one when a checkpoint pause starts and by one when it ends (odd while
 * one is on), so a step token that timed out can tell whether the others stood paused. */
static uint64_t ck_pauses(trainer *tr)
{
    pthread_mutex_lock(&tr->mu);
    uint64_t n = 2 * tr->ck_npause + (tr->ck_pause ? 1 : 0);
    pthread_mutex_unlock(&tr->mu);
    return n;
}

static int ck_gate(worker *w, bool after)
{
    trainer *tr = w->tr;
    pthread_mutex_lock(&tr->mu);
    for (;;) {
        bool park = after ? !tr->ck_rounds && tr->ck_pause
                          : tr->ck_rounds ? tr->ck_target && w->base + w->fetched == tr->ck_target
                                          : tr->ck_pause;
        if (!park || tr->err) break;
        w->gate = after ? GATE_HELD : GATE_PARKED;
        pthread_cond_broadcast(&tr->cv);
        pthread_cond_wait(&tr->cv, &tr->mu);
    }
    if (!after) w->fetched++;
    w->gate = !after && tr->be->step_begin ? GATE_ACQUIRING : GATE_RUN;
    int rc = tr->err ? gr_seterr(GR_ESHUTDOWN, "training stopped") : GR_OK;
    pthread_mutex_unlock(&tr->mu);
    return rc;
}

/* ---- the four stages ---------------------------------------------------------------------- */

/* Reads the worker's part of the file for every epoch, handing full items to `out`. Items come
 * from `pool` (pipeline) or are the single `it` (sequential: fn is called per batch). */
typedef int (*batch_fn)(worker *w, item *it);

/* The next byte range this worker reads: its own range once per epoch (static data), or the
 * next chunk of the shared list. false when there is none left. */
static bool next_range(worker *w, unsigned *epoch, uint64_t *start, uint64_t *end, uint64_t *line,
                       uint64_t *chunk, uint64_t *skip)
{
    trainer *tr = w->tr;
    *chunk = UINT64_MAX;
    *skip = 0;
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
        if (tr->chunk_owner) {
            /* Checkpoints track who reads which chunk; a resumed run skips what is done. */
            pthread_mutex_lock(&tr->mu);
            bool done = tr->chunk_done[c];
            tr->chunk_owner[c] = (int32_t)w->id;
            *skip = tr->chunk_pushed[c];
            pthread_mutex_unlock(&tr->mu);
            if (done) continue;
        }
        *chunk = c;
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
    uint64_t start, end, line, chunk, range_skip;
    while (next_range(w, &epoch, &start, &end, &line, &chunk, &range_skip)) {
        /* Batches a resumed run already trained are read again and dropped: static data skips
         * the worker's count across epochs, shared data each chunk's own count. */
        uint64_t *skip = tr->shared ? &range_skip : &w->skip;
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
            if (o->max_steps && w->base + w->read >= o->max_steps) break;
            item *it = single ? single : queue_pop(pool);
            if (!it) break; /* aborted */
            rc = gr_criteo_next(r, &it->batch);
            while (!rc && it->batch.n > 0 && *skip > 0) {
                (*skip)--;
                rc = gr_criteo_next(r, &it->batch);
            }
            if (rc || it->batch.n == 0) {
                if (!single) queue_push(pool, it);
                break;
            }
            it->chunk = chunk;
            w->read++;
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
            (o->max_examples && atomic_load(&tr->read_examples) >= o->max_examples) ||
            (o->max_steps && w->base + w->read >= o->max_steps))
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
    if (tr->ck && (rc = ck_gate(w, false))) return rc;
    if (be->step_begin) {
        double t0 = gr_now_s();
        for (;;) {
            uint64_t pauses = ck_pauses(tr);
            rc = be->step_begin(be->ctx, w->id, &it->token);
            /* A token that could not come because every other worker stood paused for a
             * checkpoint longer than the step timeout is asked for again. */
            uint64_t now = ck_pauses(tr);
            if (rc != GR_ETIMEDOUT || !tr->ck || (now == pauses && !(now & 1))) break;
            GR_LOGI("train: worker %u: step token timed out during a checkpoint; asking again",
                    w->id);
        }
        double waited = gr_now_s() - t0;
        pthread_mutex_lock(&tr->mu);
        tr->wait_s += waited;
        pthread_mutex_unlock(&tr->mu);
        if (rc) return rc;
    }
    if (tr->ck && (rc = ck_gate(w, true))) return rc;
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
    pthread_mutex_lock(&tr->mu);
    w->steps++;
    if (tr->chunk_pushed && it->chunk != UINT64_MAX) {
        tr->chunk_pushed[it->chunk]++;
        w->cur_chunk = it->chunk;
    }
    if (tr->ck) pthread_cond_broadcast(&tr->cv); /* the checkpoint coordinator counts pushes */
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

static void worker_done(worker *w)
{
    trainer *tr = w->tr;
    pthread_mutex_lock(&tr->mu);
    w->finished = true;
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
    worker_done(w);
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
    worker_done(w);
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

const char *gr_train_mode_name(gr_train_mode m) { return gr_sync_mode_name(m); }

int gr_train_mode_parse(const char *s, gr_train_mode *out)
{
    return gr_sync_mode_parse(s, out);
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
    if (o->ckpt_dir && !be->ckpt_save)
        return gr_seterr(GR_EINVAL, "train: checkpoints are saved by the parameter servers: use "
                         "the parameter-server backend (the embedded cluster or --servers)");
    if (o->resume && !be->ckpt_load)
        return gr_seterr(GR_EINVAL, "train: resuming needs the parameter-server backend (the "
                         "embedded cluster or --servers)");
    if (o->ckpt_zstd < 0 || o->ckpt_zstd > 19)
        return gr_seterr(GR_EINVAL, "train: checkpoint zstd level must be 0..19");
    uint32_t want_dim = o->model.kind == GR_MODEL_LR ? 1 : o->model.dim;
    if (o->emb.dim != want_dim)
        return gr_seterr(GR_EDIM, "train: embedding table '%s' has dim %u, the model needs %u",
                         o->emb.name, o->emb.dim, want_dim);
    return GR_OK;
}

/* ---- checkpoints: the coordinator, the trainer's position, resume ------------------------ */

/* Batches pushed by all workers, before the resume included. Under mu. */
static uint64_t total_pushed(const trainer *tr)
{
    uint64_t t = tr->base_total;
    for (unsigned i = 0; i < tr->o->workers; i++) t += tr->workers[i].steps;
    return t;
}

/* True when every worker is finished or parked where the pause wants it, with nothing in
 * flight; *any when at least one is parked (not all finished). Under mu. */
static bool ck_quiet(const trainer *tr, bool *any)
{
    *any = false;
    for (unsigned i = 0; i < tr->o->workers; i++) {
        const worker *w = &tr->workers[i];
        if (w->finished) continue;
        bool ok;
        if (tr->ck_rounds)
            ok = w->gate == GATE_PARKED && w->base + w->fetched == tr->ck_target &&
                 w->steps == w->fetched;
        else
            ok = (w->gate == GATE_PARKED && w->steps == w->fetched) ||
                 ((w->gate == GATE_ACQUIRING || w->gate == GATE_HELD) && w->steps + 1 == w->fetched);
        if (!ok) return false;
        *any = true;
    }
    return true;
}

static const char *data_name(const trainer *tr) { return tr->shared ? "shared" : "static"; }

static uint64_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* The trainer's position as JSON, stored beside the checkpoint's manifest (user.json): what a
 * resumed run needs to continue exactly where this one is. Under mu. */
static char *ck_meta(const trainer *tr, uint64_t step)
{
    const gr_train_opts *o = tr->o;
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON_AddStringToObject(j, "format", "granary-train");
    cJSON_AddNumberToObject(j, "version", 1);
    cJSON_AddNumberToObject(j, "step", (double)step);
    cJSON_AddStringToObject(j, "mode", gr_train_mode_name(o->mode));
    cJSON_AddNumberToObject(j, "workers", o->workers);
    cJSON_AddNumberToObject(j, "batch", (double)o->batch);
    cJSON_AddNumberToObject(j, "epochs", o->epochs);
    cJSON_AddStringToObject(j, "data", data_name(tr));
    cJSON_AddNumberToObject(j, "train_bytes", (double)file_size(o->train_path));
    cJSON_AddNumberToObject(j, "examples", (double)(tr->base_examples + tr->examples));
    cJSON_AddNumberToObject(j, "batches", (double)total_pushed(tr));
    cJSON *ws = cJSON_AddArrayToObject(j, "worker_steps");
    for (unsigned i = 0; i < o->workers; i++)
        cJSON_AddItemToArray(ws, cJSON_CreateNumber((double)(tr->workers[i].base + tr->workers[i].steps)));
    if (tr->shared) {
        /* Per chunk (counter value over epochs): -1 done, else batches pushed. A chunk is done
         * when the worker that took it has pushed from a later chunk (it reads its chunks in
         * order, and its items are pushed in order). */
        cJSON *ch = cJSON_AddObjectToObject(j, "chunks");
        cJSON_AddNumberToObject(ch, "count", tr->nchunks);
        cJSON *pr = cJSON_AddArrayToObject(ch, "progress");
        uint64_t last = 0;
        for (uint64_t c = 0; c < tr->nchunk_total; c++)
            if (tr->chunk_done[c] || tr->chunk_owner[c] >= 0 || tr->chunk_pushed[c]) last = c + 1;
        for (uint64_t c = 0; c < last; c++) {
            int32_t ow = tr->chunk_owner[c];
            bool done = tr->chunk_done[c] ||
                        (ow >= 0 && tr->workers[ow].cur_chunk != UINT64_MAX &&
                         c < tr->workers[ow].cur_chunk);
            cJSON_AddItemToArray(pr, cJSON_CreateNumber(done ? -1.0 : (double)tr->chunk_pushed[c]));
        }
    }
    char *txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return txt;
}

/* Saves checkpoint `step` (every worker is parked or finished). A failure is reported and
 * training goes on; the shards make the next one full. */
static void ck_save(trainer *tr, uint64_t step)
{
    const gr_train_opts *o = tr->o;
    pthread_mutex_lock(&tr->mu);
    char *meta = ck_meta(tr, step);
    uint64_t total = total_pushed(tr);
    gr_train_ckpt k;
    memset(&k, 0, sizeof k);
    k.root = o->ckpt_dir;
    k.step = step;
    k.parent = tr->ck_parent[0] ? tr->ck_parent : NULL;
    k.incremental = o->ckpt_incremental;
    k.full_every = o->ckpt_full_every;
    k.keep = o->ckpt_keep;
    k.zstd_level = o->ckpt_zstd;
    k.same_step = tr->ck_rounds;
    k.meta = meta;
    pthread_mutex_unlock(&tr->mu);
    double t0 = gr_now_s();
    int rc = meta ? tr->be->ckpt_save(tr->be->ctx, &k)
                  : gr_seterr(GR_ENOMEM, "out of memory for the checkpoint's metadata");
    double secs = gr_now_s() - t0;
    free(meta);
    pthread_mutex_lock(&tr->mu);
    gr_train_result *res = tr->res;
    res->ckpt_seconds += secs;
    if (rc) {
        res->ckpt_failures++;
        tr->ck_parent[0] = '\0';
        GR_LOGW("train: checkpoint of step %llu failed (training goes on; the next one is full): "
                "%s", (unsigned long long)step, gr_errmsg());
    } else {
        res->ckpt_saves++;
        snprintf(tr->ck_parent, sizeof tr->ck_parent, "%s", k.name);
        snprintf(res->ckpt_last, sizeof res->ckpt_last, "%s", k.name);
        if (o->progress_s > 0)
            fprintf(stderr, "train: checkpoint %s/%s (%s, %llu rows, %.1f MB, %.2f s)\n",
                    o->ckpt_dir, k.name, k.delta ? "delta" : "full", (unsigned long long)k.rows,
                    (double)k.bytes / 1e6, secs);
    }
    tr->ck_saved_total = total;
    pthread_mutex_unlock(&tr->mu);
}

/* The coordinator's turn (the run's main thread, holding mu): start a pause when one is due,
 * and save once every worker is quiet. Returns true when it saved. */
static bool ck_turn(trainer *tr)
{
    const gr_train_opts *o = tr->o;
    if (!tr->ck || tr->err) return false;
    if (!tr->ck_rounds && !tr->ck_pause && o->ckpt_every &&
        total_pushed(tr) >= tr->ck_next_total) {
        tr->ck_pause = true;
        pthread_cond_broadcast(&tr->cv);
    }
    bool due = tr->ck_rounds ? tr->ck_target != 0 : tr->ck_pause, any = false;
    if (!due || !ck_quiet(tr, &any) || !any) return false;
    uint64_t step = tr->ck_rounds ? tr->ck_target : total_pushed(tr);
    pthread_mutex_unlock(&tr->mu);
    ck_save(tr, step);
    pthread_mutex_lock(&tr->mu);
    tr->ck_npause++;
    if (tr->ck_rounds) {
        tr->ck_target += o->ckpt_every;
    } else {
        tr->ck_pause = false;
        tr->ck_next_total = total_pushed(tr) + o->ckpt_every * o->workers;
    }
    pthread_cond_broadcast(&tr->cv);
    return true;
}

static uint64_t json_u64(const cJSON *o, const char *k, bool *ok)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0) {
        *ok = false;
        return 0;
    }
    return (uint64_t)v->valuedouble;
}

/* Restores the checkpoint to resume from and checks that its position fits this run.
 * *meta gets the position (NULL when there was nothing to resume). Sets tr->nchunks for shared
 * data (the checkpoint's chunking, so the worker count may change). */
static int ck_restore(trainer *tr, cJSON **meta)
{
    const gr_train_opts *o = tr->o;
    gr_train_backend *be = tr->be;
    *meta = NULL;
    gr_train_ckpt ld;
    memset(&ld, 0, sizeof ld);
    int rc = be->ckpt_load(be->ctx, o->resume, NULL, &ld);
    if (rc == GR_ENOENT) {
        fprintf(stderr, "train: nothing to resume under %s (%s): starting from scratch\n",
                o->resume, gr_errmsg());
        return GR_OK;
    }
    if (rc) return rc;
    cJSON *j = ld.meta ? cJSON_Parse(ld.meta) : NULL;
    free(ld.meta);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "granary-train")) {
        cJSON_Delete(j);
        return gr_seterr(GR_EINVAL, "%s: checkpoint %s holds no training position (user.json): it "
                         "was not written by granary train", o->resume, ld.name);
    }
    bool ok = true;
    uint64_t workers = json_u64(j, "workers", &ok), batch = json_u64(j, "batch", &ok);
    uint64_t bytes = json_u64(j, "train_bytes", &ok);
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(j, "data");
    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(j, "worker_steps");
    if (!ok || !cJSON_IsString(data) || !cJSON_IsArray(ws) ||
        (uint64_t)cJSON_GetArraySize(ws) != workers) {
        cJSON_Delete(j);
        return gr_seterr(GR_ECORRUPT, "%s: the training position in %s is malformed", o->resume,
                         ld.name);
    }
    rc = GR_OK;
    if (strcmp(data->valuestring, data_name(tr)))
        rc = gr_seterr(GR_EINVAL, "%s was written with %s data assignment, this run has %s "
                       "(--data %s to resume it)", ld.name, data->valuestring, data_name(tr),
                       data->valuestring);
    else if (batch != o->batch)
        rc = gr_seterr(GR_EINVAL, "%s was written with batch %llu, this run has %zu: the data "
                       "position is counted in batches", ld.name, (unsigned long long)batch, o->batch);
    else if (!tr->shared && workers != o->workers)
        rc = gr_seterr(GR_EINVAL, "%s was written by %llu workers with static data ranges, this "
                       "run has %u: the ranges would differ", ld.name, (unsigned long long)workers,
                       o->workers);
    else if (bytes != file_size(o->train_path))
        rc = gr_seterr(GR_EINVAL, "%s was trained on a %llu-byte file, %s has %llu bytes",
                       ld.name, (unsigned long long)bytes, o->train_path,
                       (unsigned long long)file_size(o->train_path));
    if (!rc && tr->shared) {
        const cJSON *ch = cJSON_GetObjectItemCaseSensitive(j, "chunks");
        uint64_t n = json_u64(ch, "count", &ok);
        if (!ok || n == 0 || n > (1u << 20))
            rc = gr_seterr(GR_ECORRUPT, "%s: bad chunk count in the training position", ld.name);
        else
            tr->nchunks = (unsigned)n;
    }
    if (rc) {
        cJSON_Delete(j);
        return rc;
    }
    tr->res->resumed_step = ld.step;
    snprintf(tr->res->resumed_from, sizeof tr->res->resumed_from, "%s", ld.name);
    if (o->progress_s > 0)
        fprintf(stderr, "train: resumed from %s/%s (step %llu, %llu rows loaded in %.2f s)\n",
                o->resume, ld.name, (unsigned long long)ld.step, (unsigned long long)ld.rows,
                ld.seconds);
    *meta = j;
    return GR_OK;
}

/* Applies a restored position to the workers (after worker_init) and the chunk table. */
static int ck_apply(trainer *tr, const cJSON *j)
{
    const gr_train_opts *o = tr->o;
    bool ok = true;
    tr->base_examples = json_u64(j, "examples", &ok);
    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(j, "worker_steps");
    uint64_t sum = 0;
    unsigned i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, ws)
    {
        uint64_t v = cJSON_IsNumber(it) && it->valuedouble >= 0 ? (uint64_t)it->valuedouble : 0;
        sum += v;
        /* Static data: worker i continues its own range. Shared data with the same worker
         * count: the step counts carry over (for max_steps); with another count they cannot. */
        if (i < o->workers && (!tr->shared || cJSON_GetArraySize(ws) == (int)o->workers)) {
            tr->workers[i].base = v;
            if (!tr->shared) tr->workers[i].skip = v;
        }
        i++;
    }
    tr->base_total = sum;
    if (tr->shared) {
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "chunks"),
                                                          "progress");
        uint64_t c = 0;
        cJSON_ArrayForEach(it, pr)
        {
            if (c >= tr->nchunk_total) break;
            double v = cJSON_GetNumberValue(it);
            if (v < 0) tr->chunk_done[c] = 1;
            else if (v > 0) tr->chunk_pushed[c] = (uint64_t)v;
            c++;
        }
    }
    return ok ? GR_OK : gr_seterr(GR_ECORRUPT, "the training position's example count is malformed");
}

int gr_train_run(const gr_train_opts *o, gr_train_backend *be, gr_train_result *res)
{
    memset(res, 0, sizeof *res);
    res->test_auc = res->test_logloss = NAN;
    int rc = check_opts(o, be);
    if (rc) return rc;
    /* The workers are the parallelism; OpenBLAS threads on top would fight them for cores. */
    openblas_set_num_threads(1);

    trainer tr = {.o = o, .be = be, .res = res};
    cJSON *resumed = NULL;
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
    tr.stepped = be->step_begin && be->push_step;
    tr.shared = o->data == GR_TRAIN_DATA_SHARED ||
                (o->data == GR_TRAIN_DATA_AUTO && o->workers > 1 && o->mode != GR_MODE_SYNC);
    /* Small chunks taken in turn (shared data): a fast worker reads more of the file, so a
     * straggler does not leave a tail of its own range for the end of the run. A resumed run
     * keeps the chunking it was checkpointed with. */
    tr.nchunks = tr.shared ? o->workers * 64 : 0;
    /* Resume after the tables and dense parameters are declared (the restore replaces their
     * contents, optimizer state included) and before any worker runs. */
    if (o->resume && (rc = ck_restore(&tr, &resumed))) goto out;

    offsets = calloc(o->workers + 1, sizeof *offsets);
    first = calloc(o->workers + 1, sizeof *first);
    tr.workers = calloc(o->workers, sizeof *tr.workers);
    tids = calloc(o->workers, sizeof *tids);
    if (!offsets || !first || !tr.workers || !tids) {
        rc = gr_seterr(GR_ENOMEM, "train: out of memory");
        goto out;
    }
    if (tr.shared) {
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
        tr.workers[i].cur_chunk = UINT64_MAX;
    }
    tr.ck = o->ckpt_dir != NULL;
    if (tr.shared && (tr.ck || resumed)) {
        tr.nchunk_total = (uint64_t)o->epochs * tr.nchunks;
        tr.chunk_owner = malloc(tr.nchunk_total * sizeof *tr.chunk_owner);
        tr.chunk_pushed = calloc(tr.nchunk_total, sizeof *tr.chunk_pushed);
        tr.chunk_done = calloc(tr.nchunk_total, sizeof *tr.chunk_done);
        if (!tr.chunk_owner || !tr.chunk_pushed || !tr.chunk_done) {
            rc = gr_seterr(GR_ENOMEM, "train: out of memory");
            goto out;
        }
        for (uint64_t c = 0; c < tr.nchunk_total; c++) tr.chunk_owner[c] = -1;
    }
    if (resumed && (rc = ck_apply(&tr, resumed))) goto out;
    if (tr.ck) {
        /* Sync pauses every worker before the same step's token; the other modes pause all
         * workers wherever they are once enough batches were pushed. */
        tr.ck_rounds = o->mode == GR_MODE_SYNC && tr.stepped;
        uint64_t from = res->resumed_step;
        tr.ck_target = tr.ck_rounds && o->ckpt_every ? (from / o->ckpt_every + 1) * o->ckpt_every : 0;
        tr.ck_next_total = tr.base_total + o->ckpt_every * o->workers;
        tr.ck_saved_total = tr.base_total;
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
        if (ck_turn(&tr)) continue;
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
    /* The last checkpoint: the state at the end of training (unless the last one is it). */
    if (tr.ck && !tr.err && total_pushed(&tr) != tr.ck_saved_total) {
        uint64_t step = total_pushed(&tr);
        if (tr.ck_rounds) {
            step = 0;
            for (unsigned i = 0; i < o->workers; i++)
                if (tr.workers[i].base + tr.workers[i].steps > step)
                    step = tr.workers[i].base + tr.workers[i].steps;
        }
        ck_save(&tr, step);
    }
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
    free(tr.chunk_owner);
    free(tr.chunk_pushed);
    free(tr.chunk_done);
    cJSON_Delete(resumed);
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
