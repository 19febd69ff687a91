/* A worker's stages. Each worker reads its share of the training file and runs read/parse
 * -> dedup + pull -> forward/backward -> push as a pipeline of four threads joined by bounded
 * queues, so batch i+1 is read and pulled while batch i computes and batch i-1 is pushed (or
 * all four in turn with pipeline off). Async: pull rows -> pull dense, compute, push dense ->
 * push rows. With step calls (sync, semisync, ssp): begin (token) -> fetch (rows and dense
 * parameters at once) -> compute -> push (one message per shard). A worker that runs out of
 * data leaves the job. */
#include "train/trainer_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void tr_fail(trainer *tr, tr_worker *w, int rc)
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
    if (first && tr->be->steps && !atomic_exchange(&tr->cancelled, true))
        tr->be->steps->cancel(tr->be->ctx);
    /* Stop every worker: one failed step fails the job. */
    for (unsigned i = 0; i < tr->o->workers; i++) {
        tr_worker *x = &tr->workers[i];
        pthread_mutex_lock(&x->mu);
        x->abort = true;
        pthread_cond_broadcast(&x->inflight_cv);
        tr_queue *qs[] = {&x->free_q, &x->read_q, &x->fetch_q, &x->push_q};
        for (int k = 0; k < 4; k++)
            if (qs[k]->cap) pthread_cond_broadcast(&qs[k]->cv);
        pthread_mutex_unlock(&x->mu);
    }
}

bool tr_aborted(tr_worker *w)
{
    pthread_mutex_lock(&w->mu);
    bool a = w->abort;
    pthread_mutex_unlock(&w->mu);
    return a;
}

/* The buffers only the compute thread touches when tr->dense_beside: the gathered rows and
 * their gradient, the dense parameters and their gradient. It uses them one batch at a time
 * (gather, step, scatter and dense push all on that thread), so the worker keeps one set for
 * all its items: 4 MB less per item at Criteo's shapes, memory that was zeroed for each on
 * first use, and the step then reuses what is in its caches. */
static int compute_bufs_alloc(const trainer *tr, tr_item *it)
{
    size_t slots = (size_t)tr->o->batch * tr->bags.ns;
    /* 64-byte aligned: the model reads and writes these rows a cache line at a time */
    const size_t emb_bytes = ((slots ? slots : 1) * tr->dim * sizeof(float) + 63) / 64 * 64;
    it->emb = aligned_alloc(64, emb_bytes);
    it->gemb = aligned_alloc(64, emb_bytes);
    it->params = malloc((tr->np ? tr->np : 1) * sizeof *it->params);
    it->gdense = malloc((tr->np ? tr->np : 1) * sizeof *it->gdense);
    if (!it->emb || !it->gemb || !it->params || !it->gdense)
        return gr_seterr(GR_ENOMEM, "cannot allocate the model's buffers for a batch of %zu",
                         (size_t)tr->o->batch);
    return GR_OK;
}

static void compute_bufs_free(tr_item *it)
{
    free(it->emb);
    free(it->gemb);
    free(it->params);
    free(it->gdense);
}

/* shared: the worker's compute buffers (dense_beside), or NULL for the item's own. */
static int item_init(trainer *tr, tr_item *it, const tr_item *shared)
{
    memset(it, 0, sizeof *it);
    /* occ: ids of a full batch (with list columns, every list full). */
    size_t b = tr->o->batch, occ = b * tr->max_ids;
    int rc = gr_batch_init_schema(&it->batch, b, tr->schema);
    if (rc) return rc;
    it->uniq = malloc((occ ? occ : 1) * sizeof *it->uniq);
    it->inv = malloc((occ ? occ : 1) * sizeof *it->inv);
    it->rows = malloc((occ ? occ : 1) * tr->dim * sizeof *it->rows);
    if (shared) {
        it->emb = shared->emb;
        it->gemb = shared->gemb;
        it->params = shared->params;
        it->gdense = shared->gdense;
        it->compute_shared = true;
    } else if ((rc = compute_bufs_alloc(tr, it))) {
        return rc;
    }
    it->probs = malloc(b * sizeof *it->probs);
    if (tr->dense_beside) {
        it->common_keys = malloc((occ ? occ : 1) * sizeof *it->common_keys);
        it->common_at = malloc((occ ? occ : 1) * sizeof *it->common_at);
        it->common_prev = malloc((occ ? occ : 1) * sizeof *it->common_prev);
        it->shared = calloc(occ ? occ : 1, 1);
        if (!it->common_keys || !it->common_at || !it->common_prev || !it->shared)
            return gr_seterr(GR_ENOMEM, "cannot allocate buffers for a batch of %zu", b);
    }
    if (!it->uniq || !it->inv || !it->rows || !it->probs)
        return gr_seterr(GR_ENOMEM, "cannot allocate buffers for a batch of %zu", b);
    return GR_OK;
}

static void item_fini(tr_item *it)
{
    gr_batch_fini(&it->batch);
    free(it->uniq);
    free(it->inv);
    free(it->rows);
    if (!it->compute_shared) compute_bufs_free(it);
    free(it->probs);
    free(it->common_keys);
    free(it->common_at);
    free(it->common_prev);
    free(it->shared);
}

/* Takes the step token for it (waiting for the others as the mode says); the time counts
 * as waiting. */
static int take_token(tr_worker *w, tr_item *it)
{
    trainer *tr = w->tr;
    gr_train_backend *be = tr->be;
    double t0 = gr_now_s();
    int rc;
    for (;;) {
        uint64_t pauses = tr_ck_pauses(tr);
        rc = be->steps->begin(be->ctx, w->id, &it->token);
        /* A token that could not come because every other worker stood paused for a
         * checkpoint longer than the step timeout is asked for again. */
        uint64_t now = tr_ck_pauses(tr);
        if (rc != GR_ETIMEDOUT || !tr->ck.on || (now == pauses && !(now & 1))) break;
        GR_LOGI("train: worker %u: step token timed out during a checkpoint; asking again", w->id);
    }
    double waited = gr_now_s() - t0;
    it->t.wait += waited;
    pthread_mutex_lock(&tr->mu);
    tr->wait_s += waited; /* wait_seconds: the time in the step calls' begin */
    pthread_mutex_unlock(&tr->mu);
    return rc;
}

/* Hybrid, sequential workers: whether this worker's next step token will likely wait, by
 * what the others have pushed. Step s may start once step s-1-L is applied, that is once
 * every worker has pushed the dense gradients of its first s-L batches; this worker has pushed
 * s of them, and the trainer does not know L, so the shards' default for 2+ workers (1) is
 * assumed. A wrong guess costs nothing but where the read-ahead falls. A worker done with its
 * batches has left the job and holds no step up. */
static bool token_would_wait(tr_worker *w)
{
    trainer *tr = w->tr;
    if (tr->o->workers < 2) return false;
    const uint64_t mine = atomic_load_explicit(&w->dense_done, memory_order_relaxed);
    if (mine < 1) return false;
    bool behind = false;
    pthread_mutex_lock(&tr->mu); /* for `finished` */
    for (unsigned i = 0; i < tr->o->workers && !behind; i++) {
        const tr_worker *o = &tr->workers[i];
        behind = o != w && !o->finished &&
                 atomic_load_explicit(&o->dense_done, memory_order_acquire) + 1 < mine;
    }
    pthread_mutex_unlock(&tr->mu);
    return behind;
}

/* Hybrid: the rows of batch it->seq may be pulled once at most emb_bound of this worker's
 * earlier batches are still unpushed, so no row it reads misses more than emb_bound of this
 * worker's own updates (other workers' pushes land asynchronously, as in async mode). With
 * dense_beside the dense parameters come with those rows: they also wait for this worker's
 * own dense push of the batch before, which the step token does not order when the dense
 * step may run behind (dense lag >= 1). So a worker's dense parameters always hold its own
 * previous gradient once its step was applied (one worker: exactly lock-step's), and only
 * the others' may be missing. */
static int wait_inflight(tr_worker *w, tr_item *it)
{
    trainer *tr = w->tr;
    double t0 = gr_now_s();
    pthread_mutex_lock(&w->mu);
    /* dense_beside: what this batch shares with the previous one is that batch's shared part
     * (pushed by the compute stage, which calls this); the rest of its rows are not read here,
     * and the fetch stage saw every batch before it pushed whole (wait_pushed). */
    uint64_t *done = tr->dense_beside ? &w->shared_pushed_seq : &w->pushed_seq;
    while (!w->abort && (it->seq - *done > tr->emb_bound ||
                         (tr->dense_beside && w->dense_pushed_seq < it->seq)))
        pthread_cond_wait(&w->inflight_cv, &w->mu);
    it->stale = it->seq - *done;
    bool ab = w->abort;
    pthread_mutex_unlock(&w->mu);
    it->t.wait += gr_now_s() - t0;
    return ab ? gr_seterr(GR_ESHUTDOWN, "training stopped") : GR_OK;
}

/* dense_beside: until at most `bound` of this worker's batches before it->seq are unpushed
 * (rows only); the time counts as waiting. */
static int wait_pushed(tr_worker *w, tr_item *it, uint64_t bound)
{
    double t0 = gr_now_s();
    pthread_mutex_lock(&w->mu);
    while (!w->abort && it->seq - w->pushed_seq > bound)
        pthread_cond_wait(&w->inflight_cv, &w->mu);
    bool ab = w->abort;
    pthread_mutex_unlock(&w->mu);
    it->t.wait += gr_now_s() - t0;
    return ab ? gr_seterr(GR_ESHUTDOWN, "training stopped") : GR_OK;
}

static int stage_fetch(tr_worker *w, tr_item *it)
{
    trainer *tr = w->tr;
    gr_train_backend *be = tr->be;
    int rc;
    size_t occ = it->batch.n_ids;
    long nu = gr_dedup(it->batch.ids, occ, it->uniq, it->inv, &w->dedup);
    if (nu < 0) return (int)nu;
    it->nuniq = (size_t)nu;
    /* dense_beside: the rows the previous batch did not touch are pulled now, while it still
     * computes (prefetch.c); the others wait for its push, and the compute stage fetches them
     * once it has pushed that batch itself (fetch_common). */
    tr_prefetch *pf = tr->dense_beside ? &w->pf : NULL;
    if (pf) {
        tr_prefetch_split(pf, it->uniq, it->nuniq);
        /* A fresh id may still be one of the batch before the previous one: its push must
         * have landed (this stage runs a batch ahead of the compute stage, which pushes). */
        if ((rc = wait_pushed(w, it, 1))) return rc;
        double t0 = gr_now_s();
        if (pf->nfresh &&
            (rc = be->pull(be->ctx, tr->o->emb.id, pf->fresh_keys, pf->nfresh, pf->rows, 0)))
            return rc;
        tr_prefetch_place(pf->rows, pf->fresh_at, pf->nfresh, tr->dim, it->rows);
        memcpy(it->common_keys, pf->common_keys, pf->ncommon * sizeof *it->common_keys);
        memcpy(it->common_at, pf->common_at, pf->ncommon * sizeof *it->common_at);
        memcpy(it->common_prev, pf->common_prev, pf->ncommon * sizeof *it->common_prev);
        it->ncommon = pf->ncommon;
        tr_prefetch_remember(pf, it->uniq, it->nuniq);
        it->t.pull += gr_now_s() - t0;
    }
    if (tr->ck.on && (rc = tr_ck_gate(w, false))) return rc;
    /* Hybrid with a staleness bound takes its token in compute: only the dense parameters
     * wait for the step, and the rows of the next batch are pulled while this one computes.
     * With bound 0 the pull waits for this worker's previous push anyway: the token is taken
     * here, early (the shard answers once the step is complete, while the previous batch is
     * still being pushed), and the dense parameters come with the rows. */
    bool token_here = tr->token_in_fetch;
    /* Hybrid without the pipeline: the rows first, then the token and the dense parameters
     * alone. The rows wait only for this worker's own previous push, done already (one
     * thread does it all, in turn); the token waits for the other workers, and a worker whose
     * token is not ready has nothing else to do: the rows' pull now fills part of that wait
     * instead of following it (session 11). One more call per batch, which with the embedded
     * cluster's direct calls costs no round trip. */
    const bool rows_first = !pf && tr->hybrid && token_here && !tr->o->pipeline;
    if (rows_first) {
        if ((rc = wait_inflight(w, it))) return rc;
        double t0 = gr_now_s();
        if ((rc = be->pull(be->ctx, tr->o->emb.id, it->uniq, it->nuniq, it->rows, 0)))
            return rc;
        it->t.pull += gr_now_s() - t0;
    }
    /* A worker about to wait for the others reads and parses its next block of lines now
     * (session 12): the wait would otherwise be idle, and that read would come later anyway.
     * A read error is left for the reader to return where that block's examples start, as
     * it would without this. */
    if (rows_first && w->reader && token_would_wait(w)) {
        double t0 = gr_now_s();
        (void)gr_criteo_read_ahead(w->reader);
        it->t.read += gr_now_s() - t0;
    }
    if (token_here && (rc = take_token(w, it))) return rc;
    if (tr->ck.on && (rc = tr_ck_gate(w, true))) return rc;
    if (pf) {
        it->common_pending = true;
        return GR_OK;
    }
    if (tr->hybrid && !rows_first && (rc = wait_inflight(w, it))) return rc;
    double t0 = gr_now_s();
    /* In the sync modes the token orders everything: the dense parameters fetched right after
     * it are exactly the current step's, so they come with the rows (one round trip). */
    if (rows_first)
        rc = be->steps->fetch(be->ctx, tr->o->emb.id, NULL, 0, NULL, tr->dense_name, it->params,
                              tr->np);
    else if (token_here)
        rc = be->steps->fetch(be->ctx, tr->o->emb.id, it->uniq, it->nuniq, it->rows,
                              tr->dense_name, it->params, tr->np);
    else
        rc = be->pull(be->ctx, tr->o->emb.id, it->uniq, it->nuniq, it->rows, 0);
    if (rc) return rc;
    /* Each slot's row (or pooled bag), for the model. Done here rather than in compute: the
     * compute stage is the pipeline's slowest, so memory work moves to the stages around it. */
    tr_bags_gather(&tr->bags, &it->batch, it->rows, it->inv, tr->dim, it->emb);
    it->t.pull += gr_now_s() - t0;
    return GR_OK;
}

/* dense_beside, on the compute thread: the rows this batch shares with the previous one and
 * the dense parameters, fetched once this worker's push of that batch (done by this thread
 * just before) has landed; then every slot's row for the model. Doing it here and not on the
 * fetch thread takes two thread hand-offs out of the worker's chain from one batch's compute
 * to the next (measured in docs/train.md, "The chain on the compute thread"). */
static int fetch_common(tr_worker *w, tr_item *it)
{
    trainer *tr = w->tr;
    gr_train_backend *be = tr->be;
    it->common_pending = false;
    int rc = wait_inflight(w, it);
    if (rc) return rc;
    double t0 = gr_now_s();
    rc = be->steps->fetch(be->ctx, tr->o->emb.id, it->common_keys, it->ncommon, w->common_rows,
                          tr->dense_name, it->params, tr->np);
    if (rc) return rc;
    tr_prefetch_place(w->common_rows, it->common_at, it->ncommon, tr->dim, it->rows);
    tr_bags_gather(&tr->bags, &it->batch, it->rows, it->inv, tr->dim, it->emb);
    it->t.pull += gr_now_s() - t0;
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

/* The dense parameters of this step, before compute: async pulls the newest ones (started
 * and waited for); hybrid takes the step token and fetches them alone (no rows), so they are
 * exactly the current global step's. The sync modes have them from stage_fetch already. */
static int dense_in(tr_worker *w, tr_item *it)
{
    trainer *tr = w->tr;
    gr_train_backend *be = tr->be;
    int rc = GR_OK;
    if (tr->hybrid && tr->token_in_fetch) return GR_OK; /* fetched with the rows */
    if (tr->hybrid && (rc = take_token(w, it))) return rc;
    double t0 = gr_now_s();
    void *op = NULL;
    if (tr->hybrid)
        rc = be->steps->fetch(be->ctx, tr->o->emb.id, NULL, 0, NULL, tr->dense_name, it->params,
                              tr->np);
    else if (!tr->stepped)
        rc = be->dense_pull_start(be->ctx, tr->dense_name, it->params, tr->np, &op);
    if (!rc && op) rc = be->op_wait(be->ctx, op);
    it->t.compute += gr_now_s() - t0; /* the compute stage's time: it bounds the pipeline */
    return rc;
}

/* The dense gradient out, right after compute (async: applied on arrival; hybrid: the step's
 * dense-only push, which the shards average over the workers; sync modes: later, with the
 * rows in stage_push). */
static int dense_out(tr_worker *w, tr_item *it)
{
    trainer *tr = w->tr;
    gr_train_backend *be = tr->be;
    double t0 = gr_now_s();
    void *op = NULL;
    int rc = GR_OK;
    if (tr->hybrid) {
        rc = be->steps->push(be->ctx, w->id, it->token, tr->o->emb.id, NULL, 0, NULL,
                             tr->dense_name, it->gdense, tr->np, &it->dropped);
        if (!rc) atomic_fetch_add_explicit(&w->dense_done, 1, memory_order_release);
    }
    else if (!tr->stepped)
        rc = be->dense_push_start(be->ctx, tr->dense_name, it->gdense, tr->np, &op);
    if (!rc && op) rc = be->op_wait(be->ctx, op);
    it->t.compute += gr_now_s() - t0;
    return rc;
}

static int stage_compute(tr_worker *w, tr_item *it)
{
    trainer *tr = w->tr;
    if (it->common_pending) {
        int rc = fetch_common(w, it);
        if (rc) return rc;
    }
    double t_stage = gr_now_s(), waited = it->t.wait;
    /* Dense parameters are pulled here, not with the rows: every batch touches all of them,
     * so prefetching them would make each step several steps stale (measured: AUC 0.68 vs
     * 0.77 after 100 k rows), while a given embedding row is touched rarely. */
    int rc = dense_in(w, it);
    if (rc) return rc;
    double t0 = gr_now_s();
    rc = gr_model_train_step(tr->m, w->ws, it->params, it->batch.n, it->batch.dense, it->emb,
                             it->batch.labels, &it->loss, tr->win_cap ? it->probs : NULL,
                             it->gdense, it->gemb);
    if (rc) return rc;
    if (!isfinite(it->loss))
        return gr_seterr(GR_EINVAL, "training loss is not finite (learning rate too high?)");
    it->t.compute += gr_now_s() - t0;
    /* The dense gradient goes out at once, for the same reason the pull came late: the next
     * batch's compute then sees this step's dense update (it is waited for before this stage
     * ends). With dense_beside the compute thread sends it after handing the batch on. */
    if (!tr->dense_beside && (rc = dense_out(w, it))) return rc;
    if (w->id == tr->o->straggler && tr->o->straggler_factor > 1) {
        /* The straggler's stage takes F times as long: it sleeps F - 1 times its busy time
         * (dense round trips included, step-token waits not). */
        double busy = gr_now_s() - t_stage - (it->t.wait - waited);
        double t1 = gr_now_s();
        sleep_s((tr->o->straggler_factor - 1) * busy);
        it->t.compute += gr_now_s() - t1;
    }
    return GR_OK;
}

static void add_times(tr_stage_times *to, const tr_stage_times *t)
{
    to->read += t->read;
    to->pull += t->pull;
    to->compute += t->compute;
    to->push += t->push;
    to->wait += t->wait;
}

/* dense_beside: the compute thread's dense step push of it is done; its rc. */
static void dense_beside_done(tr_worker *w, tr_item *it, int rc)
{
    pthread_mutex_lock(&w->mu);
    it->dense_rc = rc;
    it->dense_done = true;
    if (!rc && w->dense_pushed_seq < it->seq + 1) w->dense_pushed_seq = it->seq + 1;
    pthread_cond_broadcast(&w->inflight_cv);
    pthread_mutex_unlock(&w->mu);
}

static int dense_beside_wait(tr_worker *w, tr_item *it)
{
    pthread_mutex_lock(&w->mu);
    while (!it->dense_done && !w->abort) pthread_cond_wait(&w->inflight_cv, &w->mu);
    int rc = it->dense_done ? it->dense_rc : gr_seterr(GR_ESHUTDOWN, "training stopped");
    it->dense_done = false;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

/* Marks it->seq pushed: whole (the fetch stage's fresh rows may go), and its shared part. */
static void mark_pushed(tr_worker *w, tr_item *it, bool whole)
{
    pthread_mutex_lock(&w->mu);
    /* Only forward: the push stage's rest of batch i lands after the compute stage has pushed
     * batch i+1's shared part. */
    if (whole && w->pushed_seq < it->seq + 1) w->pushed_seq = it->seq + 1;
    if (w->shared_pushed_seq < it->seq + 1) w->shared_pushed_seq = it->seq + 1;
    pthread_cond_broadcast(&w->inflight_cv);
    pthread_mutex_unlock(&w->mu);
}

/* The batch's row gradients out (with its dense gradient in the sync modes); hybrid then lets
 * the worker's next pull of the rows it shares go. */
static int push_rows(tr_worker *w, tr_item *it)
{
    trainer *tr = w->tr;
    gr_train_backend *be = tr->be;
    double t0 = gr_now_s();
    int rc;
    /* Sum the gradients of duplicate ids into one row per unique id (reusing rows). */
    tr_bags_scatter(&tr->bags, &it->batch, it->gemb, it->inv, it->nuniq, tr->dim, it->rows);
    if (tr->stepped && !tr->hybrid)
        rc = be->steps->push(be->ctx, w->id, it->token, tr->o->emb.id, it->uniq, it->nuniq,
                             it->rows, tr->dense_name, it->gdense, tr->np, &it->dropped);
    else
        rc = be->push(be->ctx, tr->o->emb.id, it->uniq, it->nuniq, it->rows);
    if (rc) return rc;
    it->t.push += gr_now_s() - t0;
    if (tr->hybrid) mark_pushed(w, it, true);
    return GR_OK;
}

/* dense_beside, on the compute thread: only the rows of `it` that the next batch shares
 * (next->common_prev: their positions among it->uniq) go out now, so the next batch's compute
 * need not wait for the rest, which the push stage sends (push_rest). A row's update does not
 * depend on another's, so the two parts give bitwise what one push gives. */
static int push_shared(tr_worker *w, tr_item *it, const tr_item *next)
{
    trainer *tr = w->tr;
    gr_train_backend *be = tr->be;
    double t0 = gr_now_s();
    tr_bags_scatter(&tr->bags, &it->batch, it->gemb, it->inv, it->nuniq, tr->dim, it->rows);
    size_t d = tr->dim, m = next->ncommon;
    for (size_t j = 0; j < m; j++) {
        uint32_t u = next->common_prev[j];
        it->shared[u] = 1;
        w->part_keys[j] = it->uniq[u];
        memcpy(w->part_grads + j * d, it->rows + (size_t)u * d, d * sizeof(float));
    }
    int rc = m ? be->push(be->ctx, tr->o->emb.id, w->part_keys, m, w->part_grads) : GR_OK;
    it->rest_pending = true;
    if (rc) return rc;
    it->t.push += gr_now_s() - t0;
    mark_pushed(w, it, false);
    return GR_OK;
}

/* The push stage's part of a batch push_shared split: every row not sent yet. */
static int push_rest(tr_worker *w, tr_item *it)
{
    trainer *tr = w->tr;
    gr_train_backend *be = tr->be;
    double t0 = gr_now_s();
    size_t d = tr->dim, m = 0;
    for (size_t u = 0; u < it->nuniq; u++) {
        if (it->shared[u]) {
            it->shared[u] = 0;
            continue;
        }
        w->rest_keys[m] = it->uniq[u];
        memcpy(w->rest_grads + m * d, it->rows + u * d, d * sizeof(float));
        m++;
    }
    it->rest_pending = false;
    int rc = m ? be->push(be->ctx, tr->o->emb.id, w->rest_keys, m, w->rest_grads) : GR_OK;
    if (rc) return rc;
    it->t.push += gr_now_s() - t0;
    mark_pushed(w, it, true);
    return GR_OK;
}

static int stage_push(tr_worker *w, tr_item *it)
{
    trainer *tr = w->tr;
    int rc;
    /* dense_beside: the compute stage pushed it already (compute_main); what is left here is
     * the bookkeeping. */
    if (it->rest_pending) {
        if ((rc = push_rest(w, it))) return rc;
    } else if (!it->pushed && (rc = push_rows(w, it))) {
        return rc;
    }
    it->pushed = false;
    /* The step counts as pushed (checkpoints, leaving the job) once its dense part is out too;
     * the item goes back to the free list only after the compute thread is done with it. */
    if (tr->dense_beside && (rc = dense_beside_wait(w, it))) return rc;
    bool dropped = it->dropped;
    pthread_mutex_lock(&tr->mu);
    w->steps++;
    if (tr->data.chunk_pushed && it->chunk != UINT64_MAX) {
        tr->data.chunk_pushed[it->chunk]++;
        w->cur_chunk = it->chunk;
    }
    if (tr->ck.on) pthread_cond_broadcast(&tr->cv); /* the checkpoint coordinator counts pushes */
    tr->examples += it->batch.n;
    tr->steps++;
    tr->dropped += dropped;
    if (tr->loss_log)
        fprintf(tr->loss_log, "%u %llu %.9g\n", w->id, (unsigned long long)w->steps, it->loss);
    tr->loss_sum += it->loss * (double)it->batch.n;
    tr->loss_n += it->batch.n;
    for (size_t i = 0; tr->win_cap && i < it->batch.n; i++) {
        tr->win_probs[tr->win_head] = it->probs[i];
        tr->win_labels[tr->win_head] = it->batch.labels[i];
        tr->win_head = (tr->win_head + 1) % tr->win_cap;
        if (tr->win_len < tr->win_cap) tr->win_len++;
    }
    add_times(&tr->t, &it->t);
    if (tr->hybrid) {
        tr->stale_sum += it->stale;
        if (it->stale > tr->stale_max) tr->stale_max = it->stale;
    }
    pthread_mutex_unlock(&tr->mu);
    return GR_OK;
}

static int sequential_step(tr_worker *w, tr_item *it)
{
    int rc = stage_fetch(w, it);
    if (!rc) rc = stage_compute(w, it);
    if (!rc) rc = stage_push(w, it);
    return rc;
}

/* The time slice a pipelined worker's read, fetch and push threads ask for (compute keeps the
 * kernel's default). Those threads do a little work and then wait on a queue, a shard or a
 * reply; with two workers' compute threads on two cores, a woken one otherwise waits behind a
 * compute thread's slice (1.4 ms on 2 cores) before it may hand the next batch on, and the
 * whole step's chain of hand-offs pays that wait again at each link. With a short slice the
 * woken thread preempts compute at once (EEVDF, Linux 6.12+); its share of the CPU is the
 * same. Measured in docs/train.md ("Session 8"). */
static void io_slice(const tr_worker *w)
{
    uint32_t us = w->tr->o->stage_slice_us;
    if (us) gr_thread_want_slice_us(us, "train: a pipeline stage");
}

static void *reader_main(void *arg)
{
    tr_worker *w = arg;
    io_slice(w);
    int rc = tr_read_epochs(w, &w->free_q, &w->read_q, NULL, NULL);
    if (rc) tr_fail(w->tr, w, rc);
    tr_queue_close(&w->read_q);
    return NULL;
}

static void *fetch_main(void *arg)
{
    tr_worker *w = arg;
    io_slice(w);
    tr_item *it;
    while ((it = tr_queue_pop(&w->read_q))) {
        int rc = stage_fetch(w, it);
        if (rc) {
            tr_fail(w->tr, w, rc);
            break;
        }
        tr_queue_push(&w->fetch_q, it);
    }
    tr_queue_close(&w->fetch_q);
    return NULL;
}

static void *compute_main(void *arg)
{
    tr_worker *w = arg;
    tr_item *it, *next = NULL;
    while ((it = next ? next : tr_queue_pop(&w->fetch_q))) {
        next = NULL;
        int rc = stage_compute(w, it);
        if (rc) {
            tr_fail(w->tr, w, rc);
            break;
        }
        if (w->tr->dense_beside) {
            /* This thread pushes the batch itself, the dense step first (the other workers'
             * tokens wait for it) and then the rows, and goes straight on to fetch the next
             * batch's shared rows: nothing in the worker's chain waits for another thread.
             * The push stage keeps the bookkeeping. */
            rc = dense_out(w, it);
            dense_beside_done(w, it, rc);
            /* When the next batch is already fetched (the usual case: the fetch stage runs
             * ahead), only the rows it shares go out here and the push stage sends the rest;
             * never wait for it (a checkpoint may hold the fetch stage until this push). */
            next = rc ? NULL : tr_queue_try_pop(&w->fetch_q);
            if (!rc && next && next->common_pending && next->seq == it->seq + 1)
                rc = push_shared(w, it, next);
            else if (!rc)
                rc = push_rows(w, it);
            it->pushed = true;
            if (rc) {
                tr_fail(w->tr, w, rc);
                break;
            }
        }
        tr_queue_push(&w->push_q, it);
    }
    tr_queue_close(&w->push_q);
    return NULL;
}

static void *push_main(void *arg)
{
    tr_worker *w = arg;
    tr_item *it;
    while ((it = tr_queue_pop(&w->push_q))) {
        int rc = stage_push(w, it);
        if (rc) {
            tr_fail(w->tr, w, rc);
            break;
        }
        tr_queue_push(&w->free_q, it);
    }
    return NULL;
}

/* After a worker's last push: it leaves the sync job so the others stop waiting for it. */
static void leave_job(tr_worker *w)
{
    trainer *tr = w->tr;
    if (!tr->be->steps || tr_aborted(w)) return;
    int rc = tr->be->steps->leave(tr->be->ctx, w->id);
    if (rc) tr_fail(tr, w, rc);
}

static void worker_done(tr_worker *w)
{
    trainer *tr = w->tr;
    pthread_mutex_lock(&tr->mu);
    w->finished = true;
    tr->running--;
    pthread_cond_broadcast(&tr->cv);
    pthread_mutex_unlock(&tr->mu);
}

void *tr_sequential_main(void *arg)
{
    tr_worker *w = arg;
    int rc = tr_read_epochs(w, NULL, NULL, &w->items[0], sequential_step);
    if (rc) tr_fail(w->tr, w, rc);
    else leave_job(w);
    worker_done(w);
    return NULL;
}

/* A pipelined worker: this thread runs the push stage after starting the other three. */
void *tr_pipeline_main(void *arg)
{
    tr_worker *w = arg;
    pthread_t t[3];
    void *(*fns[3])(void *) = {reader_main, fetch_main, compute_main};
    unsigned started = 0;
    for (; started < 3; started++)
        if (pthread_create(&t[started], NULL, fns[started], w) != 0) {
            tr_fail(w->tr, w, gr_seterr(GR_ENOMEM, "cannot start a pipeline thread"));
            tr_queue_close(&w->read_q);
            tr_queue_close(&w->fetch_q);
            tr_queue_close(&w->push_q);
            break;
        }
    /* This thread runs the push stage. Asked only now: a new thread inherits its creator's
     * slice, and compute must keep the default. */
    io_slice(w);
    push_main(w);
    for (unsigned i = 0; i < started; i++) pthread_join(t[i], NULL);
    leave_job(w);
    worker_done(w);
    return NULL;
}

void tr_worker_fini(tr_worker *w)
{
    if (w->items)
        for (unsigned i = 0; i < w->nitems; i++) item_fini(&w->items[i]);
    free(w->items);
    tr_queue_fini(&w->free_q);
    tr_queue_fini(&w->read_q);
    tr_queue_fini(&w->fetch_q);
    tr_queue_fini(&w->push_q);
    gr_model_ws_destroy(w->ws);
    gr_dedup_scratch_fini(&w->dedup);
    tr_prefetch_fini(&w->pf);
    compute_bufs_free(&w->compute);
    free(w->common_rows);
    free(w->part_keys);
    free(w->rest_keys);
    free(w->part_grads);
    free(w->rest_grads);
    pthread_cond_destroy(&w->inflight_cv);
    pthread_mutex_destroy(&w->mu);
}

int tr_worker_init(trainer *tr, tr_worker *w, unsigned id)
{
    memset(w, 0, sizeof *w);
    w->tr = tr;
    w->id = id;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->inflight_cv, NULL);
    w->cur_chunk = UINT64_MAX;
    unsigned depth = tr->o->queue_depth ? tr->o->queue_depth : 1;
    /* Every stage holds at most one tr_item and every tr_queue `depth`: 3 queues + 4 stages. */
    w->nitems = tr->o->pipeline ? 3 * depth + 4 : 1;
    w->items = calloc(w->nitems, sizeof *w->items);
    if (!w->items) return gr_seterr(GR_ENOMEM, "cannot allocate work items");
    if (tr->dense_beside) {
        int rc = compute_bufs_alloc(tr, &w->compute);
        if (rc) return rc;
    }
    for (unsigned i = 0; i < w->nitems; i++) {
        int rc = item_init(tr, &w->items[i], tr->dense_beside ? &w->compute : NULL);
        if (rc) return rc;
    }
    int rc = gr_model_ws_create(tr->m, &w->ws);
    if (rc) return rc;
    if (tr->dense_beside && (rc = tr_prefetch_init(&w->pf, tr->o->batch * tr->max_ids, tr->dim)))
        return rc;
    if (tr->dense_beside) {
        size_t occ = tr->o->batch * tr->max_ids;
        w->common_rows = malloc(occ * tr->dim * sizeof *w->common_rows);
        w->part_keys = malloc(occ * sizeof *w->part_keys);
        w->rest_keys = malloc(occ * sizeof *w->rest_keys);
        w->part_grads = malloc(occ * tr->dim * sizeof *w->part_grads);
        w->rest_grads = malloc(occ * tr->dim * sizeof *w->rest_grads);
        if (!w->common_rows || !w->part_keys || !w->rest_keys || !w->part_grads ||
            !w->rest_grads)
            return gr_seterr(GR_ENOMEM, "cannot allocate the row buffers of a batch");
    }
    if (tr->o->pipeline) {
        if ((rc = tr_queue_init(&w->free_q, w->nitems, &w->mu, &w->abort)) ||
            (rc = tr_queue_init(&w->read_q, depth, &w->mu, &w->abort)) ||
            (rc = tr_queue_init(&w->fetch_q, depth, &w->mu, &w->abort)) ||
            (rc = tr_queue_init(&w->push_q, depth, &w->mu, &w->abort)))
            return rc;
        for (unsigned i = 0; i < w->nitems; i++) tr_queue_push(&w->free_q, &w->items[i]);
    }
    return GR_OK;
}

/* ---- options ------------------------------------------------------------------------------ */
