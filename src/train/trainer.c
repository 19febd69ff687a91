/* The trainer: options, the run (model, backend declarations, resume, the workers' threads,
 * progress lines, the last checkpoint, results) and nothing else. Its parts: pipeline.c (a
 * worker's stages), queue.c, datasplit.c (who reads what), ckcoord.c (checkpoints and resume)
 * and eval.c. */
#include "train/trainer_int.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char *gr_train_mode_name(gr_train_mode m)
{
    return m == GR_MODE_HYBRID ? "hybrid" : gr_sync_mode_name((uint32_t)m);
}

int gr_train_mode_parse(const char *s, gr_train_mode *out)
{
    if (s && !strcmp(s, "hybrid")) {
        *out = GR_MODE_HYBRID;
        return GR_OK;
    }
    gr_sync_mode m;
    int rc = gr_sync_mode_parse(s, &m);
    if (rc) return gr_seterr(rc, "%s (or hybrid)", gr_errmsg());
    *out = (gr_train_mode)m;
    return GR_OK;
}

gr_train_mode gr_train_default_mode(unsigned workers)
{
    return workers > 1 ? GR_MODE_HYBRID : GR_MODE_ASYNC;
}

bool gr_train_default_pipeline(unsigned workers, bool direct)
{
    if (!direct) return true;
    cpu_set_t set;
    long cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                            : sysconf(_SC_NPROCESSORS_ONLN);
    return cpus < 1 || (long)workers < cpus;
}

uint32_t gr_train_dense_lag_default(unsigned workers)
{
    return workers > 1 ? 1u : 0u;
}

float gr_train_dense_lr(gr_train_mode mode, unsigned workers, float base_lr)
{
    if ((mode == GR_MODE_SYNC || mode == GR_MODE_HYBRID) && workers > 1)
        return base_lr * sqrtf((float)workers);
    return base_lr;
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
    o->stage_slice_us = GR_TRAIN_IO_SLICE_US;
    o->progress_s = 5.0;
    o->emb_staleness = GR_TRAIN_STALENESS_DEFAULT;
    o->min_valid = GR_TRAIN_MIN_VALID_DEFAULT;
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

/* What the last progress line saw, so the next one reports its own window. */
typedef struct progress {
    double t0, last_t, window_loss;
    uint64_t last_ex, last_steps;
    tr_stage_times last;
    /* Examples in one epoch and in the whole run (estimates; 0: unknown), for % done, the
     * epoch and the time left. */
    double per_epoch, total;
} progress;

/* The running AUC over the window (NaN when empty or of one class). */
static double window_auc(trainer *tr, uint64_t *n)
{
    *n = 0;
    if (!tr->win_cap) return NAN;
    pthread_mutex_lock(&tr->mu);
    size_t len = tr->win_len;
    float *p = malloc((len ? len : 1) * sizeof *p), *l = malloc((len ? len : 1) * sizeof *l);
    if (p && l) {
        memcpy(p, tr->win_probs, len * sizeof *p);
        memcpy(l, tr->win_labels, len * sizeof *l);
    }
    pthread_mutex_unlock(&tr->mu);
    double auc = NAN;
    if (p && l && len && gr_auc(p, l, len, &auc) == GR_OK) *n = len;
    free(p);
    free(l);
    return auc;
}

/* Examples the run will train, estimated from the training file's size and the line length
 * of its first MiB (reading the whole file to count lines would cost a pass over it), then
 * capped by max_examples and max_steps. */
static void estimate_work(const trainer *tr, progress *pg)
{
    const gr_train_opts *o = tr->o;
    enum { SAMPLE = 1 << 20 };
    FILE *f = fopen(o->train_path, "rb");
    char *buf = malloc(SAMPLE);
    size_t got = f && buf ? fread(buf, 1, SAMPLE, f) : 0;
    double size = 0;
    if (f && fseeko(f, 0, SEEK_END) == 0) size = (double)ftello(f);
    if (f) fclose(f);
    size_t lines = 0;
    for (size_t i = 0; i < got; i++) lines += buf[i] == '\n';
    if (got > 0 && buf[got - 1] != '\n') lines++;
    free(buf);
    if (lines == 0 || size <= 0) return;
    pg->per_epoch = size * (double)lines / (double)got;
    if (o->job && o->job->ranks > 1) pg->per_epoch /= o->job->ranks; /* this process's share */
    double total = pg->per_epoch * o->epochs - (double)tr->base_examples;
    if (o->max_examples && (double)o->max_examples < total) total = (double)o->max_examples;
    if (o->max_steps) {
        double left = 0;
        for (unsigned i = 0; i < o->workers; i++)
            if (tr->workers[i].base < o->max_steps)
                left += (double)(o->max_steps - tr->workers[i].base) * (double)o->batch;
        if (left < total) total = left;
    }
    pg->total = total > 0 ? total : 0;
}

/* "37% done, epoch 1/2, ETA 12s": where the run is, from the estimates. */
static void progress_where(const trainer *tr, const progress *pg, uint64_t ex, double elapsed,
                           bool final, char *out, size_t cap)
{
    out[0] = '\0';
    if (pg->total <= 0) return;
    double frac = (double)ex / pg->total;
    if (frac > 0.99) frac = 0.99; /* an estimate: never claim 100 % before the end */
    if (final) {
        snprintf(out, cap, "%s", tr->stopping ? "stopped" : "finished");
        return;
    }
    double done = (double)(tr->base_examples + ex);
    unsigned epoch = pg->per_epoch > 0 ? (unsigned)(done / pg->per_epoch) + 1 : 1;
    if (epoch > tr->o->epochs) epoch = tr->o->epochs;
    int n = snprintf(out, cap, "%.0f%% done, epoch %u/%u", frac * 100, epoch, tr->o->epochs);
    if (ex > 0 && elapsed > 0 && n > 0 && (size_t)n < cap) {
        double left = elapsed * (1 - frac) / frac;
        if (left >= 3600)
            snprintf(out + n, cap - (size_t)n, ", ETA %.0fh%02.0fm", floor(left / 3600),
                     floor(fmod(left, 3600) / 60));
        else if (left >= 60)
            snprintf(out + n, cap - (size_t)n, ", ETA %.0fm%02.0fs", floor(left / 60),
                     floor(fmod(left, 60)));
        else
            snprintf(out + n, cap - (size_t)n, ", ETA %.0fs", ceil(left));
    }
}

/* A progress line: where the run is (% done, epoch, time left), examples/s and loss over the
 * window, and each stage's milliseconds per batch (summed over workers, so the stage that
 * bounds a worker's rate shows). */
static void progress_line(trainer *tr, progress *pg, bool final)
{
    double now = gr_now_s();
    double dt = now - pg->last_t;
    pthread_mutex_lock(&tr->mu);
    uint64_t ex = tr->examples, steps = tr->steps;
    tr_stage_times t = tr->t;
    double loss = tr->loss_n ? tr->loss_sum / (double)tr->loss_n : NAN;
    tr->loss_sum = 0;
    tr->loss_n = 0;
    if (!isnan(loss)) tr->window_loss = loss;
    if (dt > 0) tr->window_rate = (double)(ex - pg->last_ex) / dt;
    pthread_mutex_unlock(&tr->mu);
    uint64_t wn = 0;
    double auc = window_auc(tr, &wn);
    if (tr->follow) {
        gr_criteo_stats st;
        gr_follow_get_stats(tr->follow, &st);
        pthread_mutex_lock(&tr->mu);
        tr->bad_lines = st.bad_lines;
        pthread_mutex_unlock(&tr->mu);
    }
    if (tr->o->on_progress) {
        double dt = now - pg->last_t;
        gr_train_progress p = {.seconds = now - pg->t0, .examples = ex,
                               .examples_per_sec = dt > 0 ? (double)(ex - pg->last_ex) / dt : 0,
                               .loss = isnan(loss) ? pg->window_loss : loss, .window_auc = auc,
                               .window_examples = wn, .bad_lines = tr->bad_lines, .final = final};
        tr->o->on_progress(tr->o->progress_ctx, &p);
    }
    if (tr->o->progress_s <= 0) {
        if (!isnan(loss)) pg->window_loss = loss;
        return;
    }
    if (wn) fprintf(stderr, "train: running AUC %.5f over the last %llu examples\n", auc,
                    (unsigned long long)wn);
    if (!isnan(loss)) pg->window_loss = loss;
    double nb = (double)(steps - pg->last_steps);
    double k = nb > 0 ? 1e3 / nb : 0;
    char where[96];
    progress_where(tr, pg, ex, now - pg->t0, final, where, sizeof where);
    fprintf(stderr, "train: %.1fs %s%s%llu examples, %.0f examples/s, loss %.5f; ms/batch read %.2f "
            "pull %.2f compute %.2f push %.2f wait %.2f\n", now - pg->t0, where, *where ? "; " : "",
            (unsigned long long)ex,
            dt > 0 ? (double)(ex - pg->last_ex) / dt : 0.0, pg->window_loss,
            (t.read - pg->last.read) * k, (t.pull - pg->last.pull) * k,
            (t.compute - pg->last.compute) * k, (t.push - pg->last.push) * k,
            (t.wait - pg->last.wait) * k);
    pg->last_t = now;
    pg->last_ex = ex;
    pg->last_steps = steps;
    pg->last = t;
}

static int check_opts(const gr_train_opts *o, const gr_train_backend *be)
{
    if (!o->train_path) return gr_seterr(GR_EINVAL, "train: a training file is needed");
    if (o->batch == 0 || o->batch > (1u << 20))
        return gr_seterr(GR_EINVAL, "train: batch must be 1..%u", 1u << 20);
    if (o->workers == 0 || o->workers > 256)
        return gr_seterr(GR_EINVAL, "train: workers must be 1..256");
    if (o->queue_depth > 64) return gr_seterr(GR_EINVAL, "train: queue depth must be <= 64");
    if (!be || !be->table_init || !be->pull || !be->push || !be->dense_init || !be->dense_pull ||
        !be->dense_push || !be->dense_pull_start || !be->dense_push_start || !be->op_wait ||
        !be->ckpt_save || !be->ckpt_load || !be->destroy)
        return gr_seterr(GR_EINVAL, "train: the backend lacks a function of its core");
    if (be->steps && (!be->steps->begin || !be->steps->fetch || !be->steps->push ||
                      !be->steps->leave || !be->steps->cancel))
        return gr_seterr(GR_EINVAL, "train: the backend's step calls are incomplete");
    if (o->mode != GR_MODE_ASYNC && !be->steps)
        return gr_seterr(GR_EINVAL,
                         "train: mode %s needs a backend with step tokens: the parameter-server "
                         "backend (the local in-process backend is async only)",
                         gr_train_mode_name(o->mode));
    if (o->straggler_factor > 1 && o->straggler >= o->workers)
        return gr_seterr(GR_EINVAL, "train: straggler worker %u does not exist (%u workers)",
                         o->straggler, o->workers);
    if (o->job && (o->job->ranks == 0 || o->job->rank >= o->job->ranks || !o->job->is_chief))
        return gr_seterr(GR_EINVAL, "train: job rank %u of %u processes (or no chief test)",
                         o->job->rank, o->job->ranks);
    if (o->job && o->job->ranks > 1 && (o->follow || o->data == GR_TRAIN_DATA_SHARED))
        return gr_seterr(GR_EINVAL, "train: a job of several worker processes reads static ranges "
                         "of a file (no --follow, no --data shared)");
    if (o->data < GR_TRAIN_DATA_AUTO || o->data > GR_TRAIN_DATA_SHARED)
        return gr_seterr(GR_EINVAL, "train: unknown data assignment %d", o->data);
    if (o->ckpt_dir && !be->checkpoints)
        return gr_seterr(GR_EINVAL, "train: checkpoints are saved by the parameter servers: use "
                         "the parameter-server backend (the embedded cluster or --servers)");
    if (o->resume && !be->checkpoints)
        return gr_seterr(GR_EINVAL, "train: resuming needs the parameter-server backend (the "
                         "embedded cluster or --servers)");
    if (o->ckpt_zstd < 0 || o->ckpt_zstd > 19)
        return gr_seterr(GR_EINVAL, "train: checkpoint zstd level must be 0..19");
    if (!(o->min_valid >= 0 && o->min_valid <= 1))
        return gr_seterr(GR_EINVAL, "train: the share of valid lines required must be in 0..1");
    uint32_t want_dim = o->model.kind == GR_MODEL_LR ? 1 : o->model.dim;
    if (o->emb.dim != want_dim)
        return gr_seterr(GR_EDIM, "train: embedding table '%s' has dim %u, the model needs %u",
                         o->emb.name, o->emb.dim, want_dim);
    return GR_OK;
}

int gr_train_run(const gr_train_opts *o, gr_train_backend *be, gr_train_result *res)
{
    memset(res, 0, sizeof *res);
    res->test_auc = res->test_logloss = res->window_auc = NAN;
    int rc = check_opts(o, be);
    if (rc) return rc;
    /* The workers are the parallelism; OpenBLAS threads on top would fight them for cores. */
    gr_blas_one_thread();

    trainer tr = {.o = o, .be = be, .res = res, .window_loss = NAN};
    cJSON *resumed = NULL;
    pthread_mutex_init(&tr.mu, NULL);
    pthread_cond_init(&tr.cv, NULL);
    float *init = NULL;
    unsigned started = 0;
    pthread_t *tids = NULL;
    tr_badlog_init(&tr.badlog, o->train_path, "train");
    if ((rc = gr_model_create(&o->model, &tr.m))) goto out;
    tr.schema = gr_model_schema(tr.m);
    if (!tr.schema) {
        rc = gr_seterr(GR_EINVAL, "train: the model has %u dense and %u sparse inputs but no "
                       "schema: give model.schema to say how the files are read",
                       gr_model_n_dense(tr.m), gr_model_n_sparse(tr.m));
        goto out;
    }
    tr.max_ids = gr_schema_max_ids(tr.schema);
    if ((rc = tr_bags_init(&tr.bags, tr.schema))) goto out;
    /* A file in the wrong format fails here, before any table exists or any step runs. A
     * stream (stdin, a followed file) is not probed: reading ahead would take its lines or
     * wait for them; its bad lines are counted as it goes. */
    bool stream = o->follow || !strcmp(o->train_path, "-");
    if (stream && !gr_schema_is_criteo(tr.schema)) {
        rc = gr_seterr(GR_EINVAL, "train: a stream (--follow, --train -) is read in the Criteo "
                       "layout only; drop --schema or train on a file");
        goto out;
    }
    if ((!stream && (rc = tr_probe_file(o->train_path, tr.schema, o->min_valid))) ||
        (o->test_path && (rc = tr_probe_file(o->test_path, tr.schema, o->min_valid))))
        goto out;
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
    tr.stepped = be->steps != NULL;
    tr.hybrid = o->mode == GR_MODE_HYBRID;
    tr.emb_bound = o->emb_staleness;
    /* Hybrid with bound 0: a worker's next pull waits for its own push anyway, so taking the
     * token before it costs no overlap, and the dense parameters then come with the rows. */
    tr.token_in_fetch = tr.stepped && (!tr.hybrid || tr.emb_bound == 0);
    tr.dense_beside = tr.hybrid && tr.emb_bound == 0 && o->pipeline && tr.stepped;
    /* Sync and hybrid take one batch of every worker per step: static ranges. */
    /* A job of several processes cuts static ranges by the job's worker index (chunks taken in
     * turn would need a counter shared across processes). */
    bool multi = o->job && o->job->ranks > 1;
    tr.data.shared = !o->follow && !multi && (o->data == GR_TRAIN_DATA_SHARED ||
                     (o->data == GR_TRAIN_DATA_AUTO && o->workers > 1 && o->mode != GR_MODE_SYNC &&
                      o->mode != GR_MODE_HYBRID));
    /* Small chunks taken in turn (shared data): a fast worker reads more of the file, so a
     * straggler does not leave a tail of its own range for the end of the run. A resumed run
     * keeps the chunking it was checkpointed with. */
    tr.data.nchunks = tr.data.shared ? o->workers * 64 : 0;
    /* Chunks of whole batches, so that every batch but the file's last is full. */
    tr.data.by_batch = tr.data.shared;
    /* Resume after the tables and dense parameters are declared (the restore replaces their
     * contents, optimizer state included) and before any worker runs. */
    if (o->resume && (rc = tr_ck_restore(&tr, &resumed))) goto out;

    tr.workers = calloc(o->workers, sizeof *tr.workers);
    tids = calloc(o->workers, sizeof *tids);
    if (!tr.workers || !tids) {
        rc = gr_seterr(GR_ENOMEM, "train: out of memory");
        goto out;
    }
    for (unsigned i = 0; i < o->workers; i++)
        if ((rc = tr_worker_init(&tr, &tr.workers[i], i))) goto out;
    if (o->window) {
        tr.win_cap = o->window;
        tr.win_probs = malloc(tr.win_cap * sizeof *tr.win_probs);
        tr.win_labels = malloc(tr.win_cap * sizeof *tr.win_labels);
        if (!tr.win_probs || !tr.win_labels) {
            rc = gr_seterr(GR_ENOMEM, "train: out of memory for an AUC window of %u", o->window);
            goto out;
        }
    }
    /* Follow mode reads one stream, not ranges of a file. */
    if (o->follow) {
        rc = gr_follow_open(o->train_path, o->stop, &tr.follow);
        if (!rc && o->should_stop) tr_follow_set_stop(tr.follow, o->should_stop, o->stop_ctx);
    }
    else rc = tr_data_setup(&tr);
    if (rc) goto out;
    tr.ck.on = o->ckpt_dir != NULL;
    if ((tr.ck.on || resumed) && (rc = tr_data_track(&tr))) goto out;
    /* A stream has no position to return to: a resumed follow run keeps the restored tables
     * and dense parameters and reads what comes next. */
    if (resumed && !o->follow && (rc = tr_ck_apply(&tr, resumed))) goto out;
    tr_ck_setup(&tr);

    if (o->loss_log && !(tr.loss_log = fopen(o->loss_log, "w"))) {
        rc = gr_seterr(GR_EIO, "--loss-log %s: cannot open for writing", o->loss_log);
        goto out;
    }
    double t0 = gr_now_s();
    progress pg = {.t0 = t0, .last_t = t0, .window_loss = NAN};
    if (o->progress_s > 0 && !o->follow) estimate_work(&tr, &pg); /* a stream has no end */
    tr.t0 = t0;
    tr.running = o->workers;
    if ((rc = tr_metrics_start(&tr))) goto out;
    /* The job's other processes wait for this one's tables, dense parameters and restore. */
    if (o->job && o->job->started && (rc = o->job->started(o->job->ctx))) goto out;
    for (; started < o->workers; started++) {
        if (pthread_create(&tids[started], NULL, o->pipeline ? tr_pipeline_main : tr_sequential_main,
                           &tr.workers[started]) != 0) {
            pthread_mutex_lock(&tr.mu);
            tr.running -= o->workers - started;
            pthread_mutex_unlock(&tr.mu);
            tr_fail(&tr, &tr.workers[0], gr_seterr(GR_ENOMEM, "cannot start worker %u", started));
            break;
        }
    }
    /* Wait for the workers, with a progress line every progress_s seconds. The next line's
     * time is fixed when the last one is printed: the condition variable is woken far more
     * often than that (with checkpoints, at every push), and a wait computed afresh after each
     * wake-up never ran out, so no progress line ever came. */
    pthread_mutex_lock(&tr.mu);
    double next_line = t0 + o->progress_s;
    while (tr.running) {
        if (tr_ck_turn(&tr)) continue;
        if (o->progress_s > 0) {
            if (gr_now_s() >= next_line) {
                pthread_mutex_unlock(&tr.mu);
                progress_line(&tr, &pg, false);
                pthread_mutex_lock(&tr.mu);
                next_line = gr_now_s() + o->progress_s;
                continue;
            }
            /* gr_now_s is CLOCK_MONOTONIC; the condition variable waits on CLOCK_REALTIME. */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            double at = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + (next_line - gr_now_s());
            ts.tv_sec = (time_t)at;
            ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
            if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
            pthread_cond_timedwait(&tr.cv, &tr.mu, &ts);
        } else {
            pthread_cond_wait(&tr.cv, &tr.mu);
        }
    }
    bool stopped = tr.stopping;
    pthread_mutex_unlock(&tr.mu);
    for (unsigned i = 0; i < started; i++) pthread_join(tids[i], NULL);
    /* The chief's final checkpoint must hold the other processes' training too. A process
     * stopped by a signal does not wait for them: it saves (if it leads) and goes. */
    if (o->job && o->job->wait_others && !tr.err && !tr.stopping) o->job->wait_others(o->job->ctx);
    tr_ck_finish(&tr);
    double t1 = gr_now_s();
    progress_line(&tr, &pg, true);
    res->window_auc = window_auc(&tr, &(uint64_t){0});

    res->examples = tr.examples;
    res->steps = tr.steps;
    res->train_seconds = t1 - t0;
    res->examples_per_sec = res->train_seconds > 0 ? (double)tr.examples / res->train_seconds : 0;
    res->last_loss = pg.window_loss;
    res->dropped_gradients = tr.dropped;
    res->bad_lines = tr.bad_lines;
    res->wait_seconds = tr.wait_s;
    for (unsigned i = 0; i < o->workers && i < GR_TRAIN_MAX_REPORTED_WORKERS; i++)
    {
        res->worker_steps[i] = tr.workers[i].steps;
        res->worker_position[i] = tr.workers[i].base + tr.workers[i].steps;
    }
    res->read_seconds = tr.t.read;
    res->pull_seconds = tr.t.pull;
    res->compute_seconds = tr.t.compute;
    res->push_seconds = tr.t.push;
    res->stage_wait_seconds = tr.t.wait;
    if (tr.hybrid) {
        res->emb_staleness_bound = tr.emb_bound;
        res->emb_staleness_max = tr.stale_max;
        res->emb_staleness_mean = tr.steps ? (double)tr.stale_sum / (double)tr.steps : 0;
    }
    if (tr.err) {
        rc = gr_seterr(tr.err, "%s", tr.errmsg);
        goto out;
    }
    res->stopped = stopped;
    if ((rc = tr_badlog_check(&tr.badlog, o->min_valid))) goto out;
    if (o->test_path && !stopped) {
        rc = tr_evaluate(tr.m, be, o->emb.id, o->test_path, o->batch, o->workers, o->min_valid,
                         &res->test_auc, &res->test_logloss, &res->test_examples);
    }
out:
    tr_metrics_stop(&tr);
    if (tr.loss_log && fclose(tr.loss_log) != 0 && !rc)
        rc = gr_seterr(GR_EIO, "--loss-log %s: write failed", o->loss_log);
    if (tr.workers)
        for (unsigned i = 0; i < o->workers; i++) tr_worker_fini(&tr.workers[i]);
    free(tr.workers);
    tr_data_fini(&tr.data);
    gr_follow_close(tr.follow);
    free(tr.win_probs);
    free(tr.win_labels);
    cJSON_Delete(resumed);
    free(tids);
    free(init);
    tr_bags_fini(&tr.bags);
    tr_badlog_fini(&tr.badlog);
    gr_model_destroy(tr.m);
    pthread_mutex_destroy(&tr.mu);
    pthread_cond_destroy(&tr.cv);
    return rc;
}
