/* The shard's sync job: SYNC_CONFIG, SYNC_ACQUIRE, PUSH_STEP, SYNC_LEAVE and DENSE_SET, on top
 * of the step state machine (step_machine.c). A job (mode, N workers, K, staleness) is installed
 * by SYNC_CONFIG and replaced only by a reset. PUSH_STEP checks every section like PUSH does,
 * then hands the parts to the state machine, whose apply callback writes into the shard's
 * tables and dense parameters.
 *
 * A waiting SYNC_ACQUIRE holds no thread: the connection loop polls the state machine and,
 * when the step cannot start yet, parks the request here with a reference on its connection.
 * Whoever changes the state (a push completing a step, a leave, a reset) re-polls the parked
 * requests and answers the ready ones; a timer thread answers those whose timeout passed. So N
 * blocked workers never occupy the worker pool that must run the pushes that free them
 * (docs/server.md, "Sync jobs and waiting acquires"). */
#include "server/server_int.h"
#include "server/step_machine.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_WAIT_MS (24u * 3600u * 1000u)

/* One installed job. Reference counted: a push holds a reference while it runs, so a reset
 * never frees a state machine under it. */
typedef struct sync_job {
    struct srv_sync *sy;
    gr_step_machine *ss;
    gr_sync_config cfg; /* as normalised by the step machine */
    /* Who installed it (docs/protocol.md, SYNC_CONFIG): 0 = nobody said (an older client). */
    uint64_t owner, started_ms;
    char label[GR_PROTO_SYNC_LABEL_MAX + 1];
    atomic_int refs;
} sync_job;

/* An acquire by direct call (gr_server_direct_acquire): the caller's thread waits here,
 * on its own stack, for the answer a parked request would get as a reply. */
typedef struct direct_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int rc;
    uint64_t tag, cur;
    char msg[320];
} direct_wait;

typedef struct srv_waiter {
    struct srv_waiter *next;
    struct srv_conn *c;  /* NULL for a direct call ... */
    direct_wait *dw;     /* ... which waits here instead */
    sync_job *job;
    uint64_t id;
    uint32_t worker;
    uint32_t timeout_ms;
    uint64_t step;
    uint64_t start_ns, deadline_ns;
} srv_waiter;

struct srv_sync {
    gr_server *s;
    pthread_mutex_t mu; /* job, waiters, timer state; taken before a step machine's */
    pthread_cond_t cv;  /* the timer thread (CLOCK_MONOTONIC) */
    sync_job *job;      /* NULL: no job */
    srv_waiter *waiters;
    size_t nwaiters;
    pthread_t timer;
    bool timer_live, stopping;
    /* Dense parameters get small stable numbers for the state machine (their table ids are
     * not unique: a dense spec's id defaults to 0). names_mu guards them and is innermost:
     * the apply callback, which runs under a state machine's mutex, takes it. */
    pthread_mutex_t names_mu;
    char (*dense_names)[GR_TABLE_NAME_MAX];
    uint32_t ndense, capdense;
    atomic_uint_fast64_t jobs, resets;
};

static const char *mode_name(uint32_t m) { return gr_sync_mode_name(m); }

/* ---- jobs ---- */

static void job_put(sync_job *j)
{
    if (j && atomic_fetch_sub(&j->refs, 1) == 1) {
        gr_step_machine_destroy(j->ss);
        free(j);
    }
}

static sync_job *job_get(srv_sync *sy)
{
    pthread_mutex_lock(&sy->mu);
    sync_job *j = sy->job;
    if (j) atomic_fetch_add(&j->refs, 1);
    pthread_mutex_unlock(&sy->mu);
    return j;
}

static int dense_name_of(srv_sync *sy, uint32_t idx, char *name)
{
    pthread_mutex_lock(&sy->names_mu);
    int rc = idx < sy->ndense ? GR_OK : GR_ENOENT;
    if (!rc) memcpy(name, sy->dense_names[idx], GR_TABLE_NAME_MAX);
    pthread_mutex_unlock(&sy->names_mu);
    return rc ? gr_seterr(rc, "unknown dense parameter number %u", idx) : GR_OK;
}

static int dense_index(srv_sync *sy, const char *name, uint32_t *idx)
{
    int rc = GR_OK;
    pthread_mutex_lock(&sy->names_mu);
    uint32_t i = 0;
    for (; i < sy->ndense; i++)
        if (!strcmp(sy->dense_names[i], name)) break;
    if (i == sy->ndense) {
        if (sy->ndense == sy->capdense) {
            uint32_t cap = sy->capdense ? sy->capdense * 2 : 8;
            void *p = realloc(sy->dense_names, (size_t)cap * GR_TABLE_NAME_MAX);
            if (!p) rc = gr_seterr(GR_ENOMEM, "out of memory");
            else {
                sy->dense_names = p;
                sy->capdense = cap;
            }
        }
        if (!rc) snprintf(sy->dense_names[sy->ndense++], GR_TABLE_NAME_MAX, "%s", name);
    }
    pthread_mutex_unlock(&sy->names_mu);
    *idx = i;
    return rc;
}

/* The state machine's apply callback: aggregated gradients into a table or dense parameter. */
static int job_apply(void *ctx, uint32_t kind, uint32_t id, uint32_t dim, const uint64_t *keys,
                     size_t n, const float *grads)
{
    sync_job *j = ctx;
    gr_server *s = j->sy->s;
    srv_entry *e;
    if (kind == GR_SYNC_DENSE) {
        char name[GR_TABLE_NAME_MAX];
        int rc = dense_name_of(j->sy, id, name);
        if (rc) return rc;
        e = srv_registry_get(&s->reg, true, name, 0);
        if (!e) return gr_seterr(GR_ENOENT, "dense parameter '%s' was dropped", name);
    } else {
        e = srv_registry_get(&s->reg, false, NULL, id);
        if (!e) return gr_seterr(GR_ENOENT, "no table with id %u on shard %u", id, s->cfg.shard);
    }
    /* Rows the table's finite policy refuses are counted in its stats; they must not stop
     * the rest of the step (or, in ssp, the worker's clock). */
    size_t refused = 0;
    int rc = gr_table_get_spec(e->table)->dim == dim
                 ? gr_table_apply_counted(e->table, keys, n, grads, &refused)
                 : gr_seterr(GR_EDIM, "table '%s': aggregated gradient has dim %u", e->name, dim);
    if (refused)
        GR_LOGW("shard %u: table '%s': %zu rows of a step refused, their result would not be "
                "finite (counted in nonfinite_rejected)", s->cfg.shard, e->name, refused);
    srv_entry_put(e);
    return rc;
}

/* ---- replies to parked acquires ---- */

static void reply_acquire(srv_waiter *w, int rc, uint64_t tag, uint64_t current, const char *msg)
{
    gr_server *s = w->job->sy->s;
    if (w->dw) {
        if (rc) atomic_fetch_add(&s->ops[GR_OP_SYNC_ACQUIRE].errors, 1);
        direct_wait *dw = w->dw;
        pthread_mutex_lock(&dw->mu);
        dw->rc = rc;
        dw->tag = tag;
        dw->cur = current;
        snprintf(dw->msg, sizeof dw->msg, "%s", rc && msg ? msg : "");
        dw->done = true;
        pthread_cond_signal(&dw->cv);
        pthread_mutex_unlock(&dw->mu); /* the caller may free dw from here on */
        return;
    }
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    if (rc) {
        atomic_fetch_add(&s->ops[GR_OP_SYNC_ACQUIRE].errors, 1);
        srv_conn_send_error(w->c, GR_OP_SYNC_ACQUIRE, w->id, rc, msg);
    } else if (!gr_proto_begin(&b, GR_PROTO_RESPONSE, GR_OP_SYNC_ACQUIRE, 0, 0, w->id) &&
               !gr_proto_put_pair(&b, tag, current) && !gr_proto_end(&b, 0)) {
        srv_conn_send(w->c, b.data, b.len, GR_OP_SYNC_ACQUIRE);
    }
    gr_proto_buf_fini(&b);
}

static void waiter_free(srv_waiter *w)
{
    if (w->c) srv_conn_put(w->c);
    job_put(w->job);
    free(w);
}

/* Unlinks every parked acquire for which pick says yes and returns them as a list, in reverse
 * order of the waiter list (caller holds sy->mu). */
typedef bool (*waiter_pick)(srv_waiter *w, void *arg);
static srv_waiter *take_waiters_locked(srv_sync *sy, waiter_pick pick, void *arg)
{
    srv_waiter *out = NULL;
    for (srv_waiter **pp = &sy->waiters; *pp;) {
        srv_waiter *w = *pp;
        if (pick(w, arg)) {
            *pp = w->next;
            sy->nwaiters--;
            w->next = out;
            out = w;
        } else {
            pp = &w->next;
        }
    }
    return out;
}

/* A waiter of job arg whose step is ready (or whose job shut down: answered with the error). */
static bool pick_ready(srv_waiter *w, void *arg)
{
    sync_job *j = arg;
    if (w->job != j) return false;
    bool ok = false;
    uint64_t tag = 0, cur = 0;
    return gr_step_machine_poll(j->ss, w->worker, w->step, false, &ok, &tag, &cur) || ok;
}

/* Re-polls the parked acquires of job j and answers the ready ones (the step machine's notify). */
static void job_notify(void *ctx)
{
    sync_job *j = ctx;
    srv_sync *sy = j->sy;
    pthread_mutex_lock(&sy->mu);
    srv_waiter *ready = take_waiters_locked(sy, pick_ready, j);
    pthread_mutex_unlock(&sy->mu);
    while (ready) {
        srv_waiter *w = ready;
        ready = w->next;
        bool ok = false;
        uint64_t tag = 0, cur = 0;
        int rc = gr_step_machine_poll(j->ss, w->worker, w->step, false, &ok, &tag, &cur);
        gr_step_machine_note_wait(j->ss, gr_now_ns() - w->start_ns);
        reply_acquire(w, rc, tag, cur, gr_errmsg());
        waiter_free(w);
    }
}

static void ts_at(uint64_t mono_ns, struct timespec *ts)
{
    ts->tv_sec = (time_t)(mono_ns / 1000000000u);
    ts->tv_nsec = (long)(mono_ns % 1000000000u);
}

/* A waiter whose deadline passed; the others' earliest deadline is kept in next. */
typedef struct deadline_scan {
    uint64_t now, next;
} deadline_scan;

static bool pick_expired(srv_waiter *w, void *arg)
{
    deadline_scan *d = arg;
    if (w->deadline_ns <= d->now) return true;
    if (w->deadline_ns < d->next) d->next = w->deadline_ns;
    return false;
}

/* Answers parked acquires whose timeout passed. */
static void *timer_main(void *arg)
{
    srv_sync *sy = arg;
    pthread_mutex_lock(&sy->mu);
    while (!sy->stopping) {
        deadline_scan scan = {gr_now_ns(), UINT64_MAX};
        srv_waiter *expired = take_waiters_locked(sy, pick_expired, &scan);
        uint64_t next = scan.next;
        if (expired) {
            pthread_mutex_unlock(&sy->mu);
            while (expired) {
                srv_waiter *w = expired;
                expired = w->next;
                bool ok = false;
                uint64_t tag = 0, cur = 0;
                int rc = gr_step_machine_poll(w->job->ss, w->worker, w->step, false, &ok, &tag, &cur);
                char why[200], msg[320];
                if (!rc && !ok) {
                    gr_step_machine_describe_wait(w->job->ss, w->step, why, sizeof why);
                    snprintf(msg, sizeof msg, "timed out after %u ms waiting for step %llu: %s",
                             w->timeout_ms, (unsigned long long)w->step, why);
                    rc = GR_ETIMEDOUT;
                } else {
                    snprintf(msg, sizeof msg, "%s", rc ? gr_errmsg() : "");
                }
                gr_step_machine_note_wait(w->job->ss, gr_now_ns() - w->start_ns);
                reply_acquire(w, rc, tag, cur, msg);
                waiter_free(w);
            }
            pthread_mutex_lock(&sy->mu);
            continue;
        }
        if (next == UINT64_MAX) {
            pthread_cond_wait(&sy->cv, &sy->mu);
        } else {
            struct timespec ts;
            ts_at(next, &ts);
            pthread_cond_timedwait(&sy->cv, &sy->mu, &ts);
        }
    }
    pthread_mutex_unlock(&sy->mu);
    return NULL;
}

/* A waiter of job arg (of any job when arg is NULL). */
static bool pick_job(srv_waiter *w, void *arg) { return !arg || w->job == arg; }

/* Takes every parked acquire of job j (all jobs when j is NULL) off the list and answers it
 * with rc/msg. Caller holds no lock. */
static void fail_waiters(srv_sync *sy, sync_job *j, int rc, const char *msg)
{
    pthread_mutex_lock(&sy->mu);
    srv_waiter *out = take_waiters_locked(sy, pick_job, j);
    pthread_mutex_unlock(&sy->mu);
    while (out) {
        srv_waiter *w = out;
        out = w->next;
        reply_acquire(w, rc, 0, 0, msg);
        waiter_free(w);
    }
}

/* A waiter parked by connection arg. */
static bool pick_conn(srv_waiter *w, void *arg) { return w->c == arg; }

static void srv_sync_conn_closed(gr_server *s, srv_conn *c)
{
    srv_sync *sy = s->sync;
    pthread_mutex_lock(&sy->mu);
    srv_waiter *out = take_waiters_locked(sy, pick_conn, c);
    pthread_mutex_unlock(&sy->mu);
    while (out) {
        srv_waiter *w = out;
        out = w->next;
        waiter_free(w);
    }
}

/* ---- lifecycle ---- */

static int srv_sync_create(gr_server *s)
{
    srv_sync *sy = calloc(1, sizeof *sy);
    if (!sy) return gr_seterr(GR_ENOMEM, "cannot allocate the sync state");
    sy->s = s;
    pthread_mutex_init(&sy->mu, NULL);
    pthread_mutex_init(&sy->names_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&sy->cv, &ca);
    pthread_condattr_destroy(&ca);
    s->sync = sy;
    return GR_OK;
}

static int srv_sync_start(gr_server *s)
{
    srv_sync *sy = s->sync;
    if (pthread_create(&sy->timer, NULL, timer_main, sy) != 0)
        return gr_seterr(GR_EINTERNAL, "cannot start the sync timer thread");
    sy->timer_live = true;
    return GR_OK;
}

static void srv_sync_stop(gr_server *s)
{
    srv_sync *sy = s->sync;
    if (!sy) return;
    fail_waiters(sy, NULL, GR_ESHUTDOWN, "shard is shutting down");
    pthread_mutex_lock(&sy->mu);
    sy->stopping = true;
    pthread_cond_broadcast(&sy->cv);
    pthread_mutex_unlock(&sy->mu);
    if (sy->timer_live) pthread_join(sy->timer, NULL);
    sy->timer_live = false;
    sync_job *j = job_get(sy);
    if (j) {
        gr_step_machine_shutdown(j->ss);
        job_put(j);
    }
}

static void srv_sync_destroy(gr_server *s)
{
    srv_sync *sy = s ? s->sync : NULL;
    if (!sy) return;
    srv_sync_stop(s);
    job_put(sy->job);
    free(sy->dense_names);
    pthread_mutex_destroy(&sy->mu);
    pthread_mutex_destroy(&sy->names_mu);
    pthread_cond_destroy(&sy->cv);
    free(sy);
    s->sync = NULL;
}

/* ---- SYNC_ACQUIRE (run by the connection loop) ---- */

/* Polls worker's step and, when it cannot start yet, parks the acquire: for connection c
 * (request id) or, with dw, for a caller waiting on dw. *ready says it may start now. */
static int poll_or_park(gr_server *s, srv_conn *c, direct_wait *dw, uint64_t id,
                        const gr_proto_sync_acquire *ap, bool *ready, uint64_t *tagp,
                        uint64_t *curp)
{
    srv_sync *sy = s->sync;
    gr_proto_sync_acquire a = *ap;
    int rc;
    *ready = false;
    if (a.timeout_ms > MAX_WAIT_MS)
        return gr_seterr(GR_EINVAL, "acquire timeout of %u ms is over the %u ms limit",
                         a.timeout_ms, MAX_WAIT_MS);
    pthread_mutex_lock(&sy->mu);
    sync_job *j = sy->job;
    if (!j) {
        pthread_mutex_unlock(&sy->mu);
        return gr_seterr(GR_ENOENT, "shard %u has no sync job: send sync_config first",
                         s->cfg.shard);
    }
    bool now = false;
    uint64_t tag = 0, cur = 0;
    /* Polled and parked under sy->mu, so a step applied in between cannot be missed: its
     * notify takes sy->mu after us and finds the waiter parked. */
    rc = gr_step_machine_poll(j->ss, a.worker, a.step, true, &now, &tag, &cur);
    if (!rc && !now) {
        if (sy->stopping) {
            rc = gr_seterr(GR_ESHUTDOWN, "shard is shutting down");
        } else if (a.timeout_ms == 0) {
            char why[200];
            gr_step_machine_describe_wait(j->ss, a.step, why, sizeof why);
            rc = gr_seterr(GR_ETIMEDOUT, "step %llu cannot start yet: %s",
                           (unsigned long long)a.step, why);
        } else if (sy->nwaiters >= 4 * (size_t)j->cfg.workers + 64) {
            rc = gr_seterr(GR_EBUSY, "shard %u already holds %zu waiting acquires for a job of %u "
                           "workers", s->cfg.shard, sy->nwaiters, j->cfg.workers);
        } else {
            srv_waiter *w = calloc(1, sizeof *w);
            if (!w) {
                rc = gr_seterr(GR_ENOMEM, "out of memory parking an acquire");
            } else {
                w->c = c;
                w->dw = dw;
                if (c) srv_conn_get(c);
                w->job = j;
                atomic_fetch_add(&j->refs, 1);
                w->id = id;
                w->worker = a.worker;
                w->step = a.step;
                w->timeout_ms = a.timeout_ms;
                w->start_ns = gr_now_ns();
                w->deadline_ns = w->start_ns + (uint64_t)a.timeout_ms * 1000000u;
                w->next = sy->waiters;
                sy->waiters = w;
                sy->nwaiters++;
                pthread_cond_signal(&sy->cv); /* the timer may need an earlier wake-up */
            }
        }
        pthread_mutex_unlock(&sy->mu);
        return rc;
    }
    pthread_mutex_unlock(&sy->mu);
    *ready = !rc;
    *tagp = tag;
    *curp = cur;
    return rc;
}

static int acquire(gr_server *s, srv_conn *c, const gr_proto_header *h,
                   const uint8_t *body, bool *fatal)
{
    *fatal = false;
    gr_proto_sync_acquire a;
    int rc = gr_proto_decode_sync_acquire(body, h->body_len, &a);
    if (rc) {
        *fatal = true;
        return rc;
    }
    bool ready = false;
    uint64_t tag = 0, cur = 0;
    rc = poll_or_park(s, c, NULL, h->id, &a, &ready, &tag, &cur);
    if (rc || !ready) return rc; /* parked: answered by whoever frees the step */
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    rc = gr_proto_begin(&b, GR_PROTO_RESPONSE, GR_OP_SYNC_ACQUIRE, 0, 0, h->id);
    if (!rc) rc = gr_proto_put_pair(&b, tag, cur);
    if (!rc) rc = gr_proto_end(&b, 0);
    if (!rc) srv_conn_send(c, b.data, b.len, GR_OP_SYNC_ACQUIRE);
    gr_proto_buf_fini(&b);
    return rc;
}

/* ---- requests run by the worker pool ---- */

static int reply_pair(const gr_proto_header *h, gr_proto_buf *out, uint64_t a, uint64_t b)
{
    size_t start = out->len;
    int rc = gr_proto_begin(out, GR_PROTO_RESPONSE, h->op, 0, 0, h->id);
    if (!rc) rc = gr_proto_put_pair(out, a, b);
    if (!rc) rc = gr_proto_end(out, start);
    return rc;
}

static bool same_config(const gr_sync_config *a, const gr_sync_config *b)
{
    return a->mode == b->mode && a->workers == b->workers && a->aggregate == b->aggregate &&
           a->staleness == b->staleness && a->dense_lag == b->dense_lag;
}

static void describe_config(const gr_sync_config *c, char *buf, size_t len)
{
    int n = snprintf(buf, len, "mode %s, %u workers, K %u, staleness %u", mode_name(c->mode),
                     c->workers, c->aggregate, c->staleness);
    if (c->dense_lag && n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, ", dense lag %u", c->dense_lag);
}

/* The running job for a refusal: owner, its settings, when it started and where it is. */
static void describe_job(const sync_job *j, char *buf, size_t len)
{
    char cfg[128], when[64] = "at an unknown time";
    describe_config(&j->cfg, cfg, sizeof cfg);
    if (j->started_ms) {
        time_t t = (time_t)(j->started_ms / 1000);
        struct tm tm;
        gmtime_r(&t, &tm);
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        double ago = (double)now.tv_sec + now.tv_nsec * 1e-9 - (double)j->started_ms / 1e3;
        char iso[32];
        strftime(iso, sizeof iso, "%Y-%m-%dT%H:%M:%SZ", &tm);
        snprintf(when, sizeof when, "%s, %.1f s ago", iso, ago);
    }
    gr_sync_stats st;
    gr_step_machine_get_stats(j->ss, &st);
    if (j->owner)
        snprintf(buf, len, "%s; owner %s (id %016llx), started %s, at step %llu", cfg,
                 j->label[0] ? j->label : "(no label)", (unsigned long long)j->owner, when,
                 (unsigned long long)st.step);
    else
        snprintf(buf, len, "%s; owner unknown (an older client), at step %llu", cfg,
                 (unsigned long long)st.step);
}

/* Drops the installed job: its parked acquires fail, its state machine is shut down. */
static void drop_job(srv_sync *sy, const char *why)
{
    pthread_mutex_lock(&sy->mu);
    sync_job *old = sy->job;
    sy->job = NULL;
    pthread_mutex_unlock(&sy->mu);
    if (!old) return;
    fail_waiters(sy, old, GR_ESHUTDOWN, why);
    gr_step_machine_shutdown(old->ss);
    job_put(old);
    atomic_fetch_add(&sy->resets, 1);
}

static int op_sync_config(gr_server *s, const gr_proto_header *h, const uint8_t *body,
                          gr_proto_buf *out, bool *fatal)
{
    srv_sync *sy = s->sync;
    gr_proto_sync_config pc;
    int rc = gr_proto_decode_sync_config(body, h->body_len, &pc);
    if (rc) {
        *fatal = true;
        return rc;
    }
    if (pc.flags & GR_PROTO_SYNC_CLEAR) {
        /* A clear that names its owner clears only that owner's job: a trainer cleaning up
         * never takes another trainer's job away. */
        if (pc.owner) {
            pthread_mutex_lock(&sy->mu);
            sync_job *cur = sy->job;
            char d[512] = "";
            if (cur && cur->owner && cur->owner != pc.owner) describe_job(cur, d, sizeof d);
            pthread_mutex_unlock(&sy->mu);
            if (d[0])
                return gr_seterr(GR_EBUSY, "shard %u runs another trainer's sync job (%s): not "
                                 "cleared", s->cfg.shard, d);
        }
        drop_job(sy, "the sync job was cleared");
        GR_LOGI("shard %u: sync job cleared", s->cfg.shard);
        return reply_pair(h, out, 2, 0);
    }
    if (pc.mode > GR_PROTO_SYNC_SSP)
        return gr_seterr(GR_EINVAL, "unknown sync mode %u", pc.mode);
    gr_sync_config cfg = {(gr_sync_mode)pc.mode, pc.workers, pc.aggregate, pc.staleness,
                          pc.dense_lag};
    sync_job *nj = calloc(1, sizeof *nj);
    if (!nj) return gr_seterr(GR_ENOMEM, "out of memory");
    nj->sy = sy;
    atomic_init(&nj->refs, 1);
    rc = gr_step_machine_create(&cfg, job_apply, nj, &nj->ss);
    if (rc) {
        free(nj);
        return rc;
    }
    nj->cfg = *gr_step_machine_config(nj->ss);
    nj->owner = pc.owner;
    nj->started_ms = pc.started_ms;
    memcpy(nj->label, pc.label, sizeof nj->label);
    gr_step_machine_set_notify(nj->ss, job_notify, nj);
    if (pc.flags & GR_PROTO_SYNC_RESET) drop_job(sy, "the sync job was reset");
    pthread_mutex_lock(&sy->mu);
    sync_job *cur = sy->job;
    uint64_t result = 0, step = 0;
    if (!cur) {
        sy->job = nj;
        nj = NULL;
        atomic_fetch_add(&sy->jobs, 1);
    } else if (cur->owner && nj->owner && cur->owner != nj->owner) {
        /* Two trainers must never share a job: the second would take the first's steps. */
        char have[512];
        describe_job(cur, have, sizeof have);
        rc = gr_seterr(GR_EBUSY,
                       "shard %u runs the sync job of another trainer (%s): wait for it to "
                       "finish, or replace it with granary train --sync-reset (that trainer then "
                       "fails)", s->cfg.shard, have);
    } else if (same_config(&cur->cfg, &nj->cfg)) {
        gr_sync_stats st;
        gr_step_machine_get_stats(cur->ss, &st);
        result = 1;
        step = st.step;
    } else {
        char have[512], want[128];
        describe_job(cur, have, sizeof have);
        describe_config(&nj->cfg, want, sizeof want);
        rc = gr_seterr(GR_EBUSY,
                       "shard %u runs another sync job (%s); this one asks for %s: let it finish "
                       "and clear it, or reset it (granary train --sync-reset)",
                       s->cfg.shard, have, want);
    }
    pthread_mutex_unlock(&sy->mu);
    if (nj) job_put(nj);
    if (rc) return rc;
    if (result == 0) {
        char d[128];
        describe_config(gr_step_machine_config(sy->job->ss), d, sizeof d);
        GR_LOGI("shard %u: sync job installed (%s)", s->cfg.shard, d);
    }
    return reply_pair(h, out, result, step);
}

/* A decoded PUSH_STEP (from a frame, or built by a direct call): every part resolved and
 * checked, then handed to the state machine. *oc and *step_out: the reply's pair. */
static int push_step_run(gr_server *s, const gr_proto_push_step *psp, uint64_t *oc_out,
                         uint64_t *step_out)
{
    srv_sync *sy = s->sync;
    const gr_proto_push_step ps = *psp;
    int rc = GR_OK;
    size_t nparts = ps.batch.ntables + ps.ndense;
    srv_entry **ents = calloc(nparts ? nparts : 1, sizeof *ents);
    gr_sync_part *parts = calloc(nparts ? nparts : 1, sizeof *parts);
    uint64_t **dkeys = calloc(ps.ndense ? ps.ndense : 1, sizeof *dkeys);
    float **dgrads = calloc(ps.ndense ? ps.ndense : 1, sizeof *dgrads);
    sync_job *j = NULL;
    if (!ents || !parts || !dkeys || !dgrads) {
        rc = gr_seterr(GR_ENOMEM, "out of memory for a push_step");
        goto out;
    }
    /* Resolve and check everything before the state machine sees any of it. */
    for (uint32_t i = 0; i < ps.batch.ntables && !rc; i++) {
        const gr_proto_section *sec = &ps.batch.sections[i];
        srv_entry *e = srv_registry_get(&s->reg, false, NULL, sec->table);
        if (!e) {
            rc = gr_seterr(GR_ENOENT, "no table with id %u on shard %u", sec->table, s->cfg.shard);
            break;
        }
        ents[i] = e;
        uint32_t dim = gr_table_get_spec(e->table)->dim;
        if (dim != sec->dim) {
            rc = gr_seterr(GR_EDIM, "table '%s' has dim %u, push_step carried dim %u", e->name,
                           dim, sec->dim);
            break;
        }
        rc = srv_check_routing(s, sec);
        if (!rc) rc = srv_check_finite(sec->values, (size_t)sec->n * sec->dim, e->name);
        parts[i] = (gr_sync_part){.kind = GR_SYNC_SPARSE, .id = sec->table, .dim = sec->dim,
                                  .n = sec->n, .keys = sec->keys, .grads = sec->values};
    }
    for (uint32_t i = 0; i < ps.ndense && !rc; i++) {
        const gr_proto_dense_part *d = &ps.dense[i];
        char name[GR_TABLE_NAME_MAX];
        if (d->name_len == 0 || d->name_len >= GR_TABLE_NAME_MAX || memchr(d->name, '\0', d->name_len)) {
            rc = gr_seterr(GR_EINVAL, "bad dense parameter name in push_step");
            break;
        }
        memcpy(name, d->name, d->name_len);
        name[d->name_len] = '\0';
        srv_entry *e = srv_get_dense(s, name, &rc);
        if (!e) break;
        ents[ps.batch.ntables + i] = e;
        if (d->size != e->dense_size) {
            rc = gr_seterr(GR_EDIM, "dense parameter '%s' has %llu floats, push_step carried %llu",
                           name, (unsigned long long)e->dense_size, (unsigned long long)d->size);
            break;
        }
        if ((rc = srv_check_finite(d->values, d->size, name))) break;
        uint32_t idx;
        if ((rc = dense_index(sy, name, &idx))) break;
        /* As chunk rows keyed 0, 1, ...: the last chunk padded with zero gradients. */
        uint64_t chunks = (d->size + e->chunk - 1) / e->chunk;
        dkeys[i] = malloc(chunks * sizeof **dkeys);
        dgrads[i] = calloc(chunks * e->chunk, sizeof **dgrads);
        if (!dkeys[i] || !dgrads[i]) {
            rc = gr_seterr(GR_ENOMEM, "out of memory for a dense gradient");
            break;
        }
        for (uint64_t k = 0; k < chunks; k++) dkeys[i][k] = k;
        memcpy(dgrads[i], d->values, d->size * sizeof(float));
        parts[ps.batch.ntables + i] = (gr_sync_part){.kind = GR_SYNC_DENSE, .id = idx,
                                                     .dim = e->chunk, .n = chunks,
                                                     .keys = dkeys[i], .grads = dgrads[i]};
    }
    if (rc) goto out;
    j = job_get(sy);
    if (!j) {
        rc = gr_seterr(GR_ENOENT, "shard %u has no sync job: send sync_config first", s->cfg.shard);
        goto out;
    }
    gr_sync_outcome oc = GR_SYNC_APPLIED;
    rc = gr_step_machine_push(j->ss, ps.worker, ps.step, parts, nparts, &oc);
    if (!rc) {
        gr_sync_stats st;
        gr_step_machine_get_stats(j->ss, &st);
        *oc_out = (uint64_t)oc;
        *step_out = st.step;
    }
out:
    job_put(j);
    for (size_t i = 0; ents && i < nparts; i++)
        if (ents[i]) srv_entry_put(ents[i]);
    for (uint32_t i = 0; dkeys && dgrads && i < ps.ndense; i++) {
        free(dkeys[i]);
        free(dgrads[i]);
    }
    free(ents);
    free(parts);
    free(dkeys);
    free(dgrads);
    return rc;
}

static int op_push_step(gr_server *s, const gr_proto_header *h, const uint8_t *body,
                        gr_proto_buf *out, bool *fatal)
{
    gr_proto_push_step ps;
    int rc = gr_proto_decode_push_step(body, h->body_len, &s->cfg.limits, &ps);
    if (rc) {
        *fatal = true;
        return rc;
    }
    atomic_fetch_add(&s->ops[h->op].keys, ps.batch.total_keys);
    uint64_t oc = 0, step = 0;
    rc = push_step_run(s, &ps, &oc, &step);
    if (!rc) rc = reply_pair(h, out, oc, step);
    gr_proto_push_step_fini(&ps);
    return rc;
}

static int op_sync_leave(gr_server *s, const gr_proto_header *h, const uint8_t *body,
                         gr_proto_buf *out, bool *fatal)
{
    uint32_t worker;
    int rc = gr_proto_decode_sync_leave(body, h->body_len, &worker);
    if (rc) {
        *fatal = true;
        return rc;
    }
    sync_job *j = job_get(s->sync);
    if (!j) return gr_seterr(GR_ENOENT, "shard %u has no sync job", s->cfg.shard);
    rc = gr_step_machine_leave(j->ss, worker, NULL);
    if (!rc) {
        gr_sync_stats st;
        gr_step_machine_get_stats(j->ss, &st);
        rc = reply_pair(h, out, gr_step_machine_active(j->ss), st.step);
    }
    job_put(j);
    return rc;
}

static int op_dense_set(gr_server *s, const gr_proto_header *h, const uint8_t *body,
                        gr_proto_buf *out, bool *fatal)
{
    const char *nm;
    uint32_t nlen;
    uint64_t size;
    const float *vals;
    int rc = gr_proto_decode_dense_push(body, h->body_len, &s->cfg.limits, &nm, &nlen, &size, &vals);
    if (rc) {
        *fatal = true;
        return rc;
    }
    if (nlen == 0 || nlen >= GR_TABLE_NAME_MAX || memchr(nm, '\0', nlen))
        return gr_seterr(GR_EINVAL, "bad dense parameter name");
    char name[GR_TABLE_NAME_MAX];
    memcpy(name, nm, nlen);
    name[nlen] = '\0';
    srv_entry *e = srv_get_dense(s, name, &rc);
    if (!e) return rc;
    atomic_fetch_add(&s->ops[h->op].keys, size);
    if (size != e->dense_size) {
        rc = gr_seterr(GR_EDIM, "dense parameter '%s' has %llu floats, dense_set carried %llu",
                       name, (unsigned long long)e->dense_size, (unsigned long long)size);
    } else if (!(rc = srv_check_finite(vals, size, name))) {
        uint64_t chunks = (size + e->chunk - 1) / e->chunk;
        uint64_t *keys = malloc(chunks * sizeof *keys);
        float *w = calloc(chunks * e->chunk, sizeof *w);
        if (!keys || !w) {
            rc = gr_seterr(GR_ENOMEM, "out of memory for dense_set");
        } else {
            for (uint64_t k = 0; k < chunks; k++) keys[k] = k;
            memcpy(w, vals, size * sizeof *w);
            /* Whole rows, optimizer state back to its initial value. */
            rc = gr_table_insert(e->table, keys, chunks, w, NULL, NULL);
        }
        free(keys);
        free(w);
    }
    srv_entry_put(e);
    if (rc) return rc;
    size_t start = out->len;
    rc = gr_proto_begin(out, GR_PROTO_RESPONSE, h->op, 0, 0, h->id);
    if (!rc) rc = gr_proto_end(out, start);
    return rc;
}

int srv_op_sync_config(srv_req *r) { return op_sync_config(r->s, r->h, r->body, r->out, r->fatal); }
int srv_op_push_step(srv_req *r) { return op_push_step(r->s, r->h, r->body, r->out, r->fatal); }
int srv_op_sync_leave(srv_req *r) { return op_sync_leave(r->s, r->h, r->body, r->out, r->fatal); }
int srv_op_dense_set(srv_req *r) { return op_dense_set(r->s, r->h, r->body, r->out, r->fatal); }

/* SYNC_ACQUIRE's row in the table of operations (runs on the connection loop). */
void srv_sync_acquire_take(gr_server *s, srv_conn *c, const gr_proto_header *h, uint8_t *body)
{
    bool bad = false;
    int rc = acquire(s, c, h, body, &bad);
    free(body);
    if (rc) {
        atomic_fetch_add(&s->ops[h->op].errors, 1);
        if (bad) atomic_fetch_add(&s->bad_frames, 1);
        srv_conn_write_error(c, h->op, h->id, rc, gr_errmsg(), bad);
    }
}

/* ---- by direct call (the embedded cluster's trainer; server.h) ---- */

int gr_server_direct_acquire(gr_server *s, uint32_t worker, uint64_t step, uint32_t timeout_ms,
                             uint64_t *tag, uint64_t *current)
{
    if (!s) return gr_seterr(GR_EINVAL, "direct acquire: no server");
    int rc = srv_direct_admit(s, GR_OP_SYNC_ACQUIRE);
    if (rc) return rc;
    direct_wait dw;
    memset(&dw, 0, sizeof dw);
    pthread_mutex_init(&dw.mu, NULL);
    pthread_cond_init(&dw.cv, NULL);
    gr_proto_sync_acquire a = {worker, timeout_ms, step};
    bool ready = false;
    uint64_t t = 0, cur = 0;
    rc = poll_or_park(s, NULL, &dw, 0, &a, &ready, &t, &cur);
    if (!rc && !ready) { /* parked: whoever frees the step (or the timer, or a stop) answers */
        pthread_mutex_lock(&dw.mu);
        while (!dw.done) pthread_cond_wait(&dw.cv, &dw.mu);
        pthread_mutex_unlock(&dw.mu);
        rc = dw.rc;
        t = dw.tag;
        cur = dw.cur;
        if (rc) gr_seterr(rc, "%s", dw.msg);
    } else if (rc) {
        atomic_fetch_add(&s->ops[GR_OP_SYNC_ACQUIRE].errors, 1);
    }
    pthread_mutex_destroy(&dw.mu);
    pthread_cond_destroy(&dw.cv);
    if (!rc) {
        if (tag) *tag = t;
        if (current) *current = cur;
    }
    return rc;
}

int gr_server_direct_push_step(gr_server *s, uint32_t worker, uint64_t step,
                               const gr_proto_section *rows, uint32_t nrows,
                               const gr_proto_dense_part *dense, uint32_t ndense,
                               uint32_t *outcome, uint64_t *current)
{
    if (!s) return gr_seterr(GR_EINVAL, "direct push_step: no server");
    int rc = srv_direct_admit(s, GR_OP_PUSH_STEP);
    if (rc) return rc;
    gr_proto_push_step ps;
    memset(&ps, 0, sizeof ps);
    ps.worker = worker;
    ps.step = step;
    ps.batch.ntables = nrows;
    ps.batch.sections = (gr_proto_section *)rows;
    for (uint32_t i = 0; i < nrows; i++) ps.batch.total_keys += rows[i].n;
    ps.ndense = ndense;
    ps.dense = (gr_proto_dense_part *)dense;
    atomic_fetch_add(&s->ops[GR_OP_PUSH_STEP].keys, ps.batch.total_keys);
    uint64_t oc = 0, cur = 0;
    rc = push_step_run(s, &ps, &oc, &cur);
    if (rc) {
        atomic_fetch_add(&s->ops[GR_OP_PUSH_STEP].errors, 1);
        return rc;
    }
    if (outcome) *outcome = (uint32_t)oc;
    if (current) *current = cur;
    srv_grow_kick(s);
    return GR_OK;
}

/* ---- stats ---- */

static void srv_sync_stats_json(gr_server *s, void *root_json)
{
    cJSON *root = root_json;
    srv_sync *sy = s->sync;
    if (!sy) return;
    cJSON *o = cJSON_AddObjectToObject(root, "sync");
    if (!o) return;
    pthread_mutex_lock(&sy->mu);
    size_t nw = sy->nwaiters;
    pthread_mutex_unlock(&sy->mu);
    sync_job *j = job_get(sy);
    cJSON_AddBoolToObject(o, "job", j != NULL);
    cJSON_AddNumberToObject(o, "jobs", (double)atomic_load(&sy->jobs));
    cJSON_AddNumberToObject(o, "resets", (double)atomic_load(&sy->resets));
    cJSON_AddNumberToObject(o, "waiting", (double)nw);
    if (j) {
        gr_sync_stats st;
        gr_step_machine_get_stats(j->ss, &st);
        if (j->owner) {
            char id[17];
            snprintf(id, sizeof id, "%016llx", (unsigned long long)j->owner);
            cJSON_AddStringToObject(o, "owner", id);
            cJSON_AddStringToObject(o, "owner_label", j->label);
            cJSON_AddNumberToObject(o, "started_ms", (double)j->started_ms);
        }
        cJSON_AddStringToObject(o, "mode", mode_name(j->cfg.mode));
        cJSON_AddNumberToObject(o, "workers", j->cfg.workers);
        cJSON_AddNumberToObject(o, "aggregate", j->cfg.aggregate);
        cJSON_AddNumberToObject(o, "staleness", j->cfg.staleness);
        cJSON_AddNumberToObject(o, "dense_lag", j->cfg.dense_lag);
        cJSON_AddNumberToObject(o, "step", (double)st.step);
        cJSON_AddNumberToObject(o, "pushes", (double)st.pushes);
        cJSON_AddNumberToObject(o, "applied_steps", (double)st.applied_steps);
        cJSON_AddNumberToObject(o, "admitted", (double)st.admitted);
        cJSON_AddNumberToObject(o, "short_steps", (double)st.short_steps);
        cJSON_AddNumberToObject(o, "dropped", (double)st.dropped);
        cJSON_AddNumberToObject(o, "duplicates", (double)st.duplicates);
        cJSON_AddNumberToObject(o, "waits", (double)st.waits);
        cJSON_AddNumberToObject(o, "wait_s", (double)st.wait_ns / 1e9);
        cJSON_AddNumberToObject(o, "left", (double)st.left);
        cJSON_AddNumberToObject(o, "ahead", (double)st.ahead);
        double h[8];
        for (int i = 0; i < 8; i++) h[i] = (double)st.staleness_hist[i];
        cJSON_AddItemToObject(o, "staleness_hist", cJSON_CreateDoubleArray(h, 8));
        job_put(j);
    }
}

bool srv_sync_step(gr_server *s, uint64_t *step)
{
    sync_job *j = s->sync ? job_get(s->sync) : NULL;
    if (!j) return false;
    gr_sync_stats st;
    gr_step_machine_get_stats(j->ss, &st);
    *step = st.step;
    job_put(j);
    return true;
}

bool srv_sync_mode(gr_server *s, uint32_t *mode)
{
    sync_job *j = s->sync ? job_get(s->sync) : NULL;
    if (!j) return false;
    *mode = (uint32_t)j->cfg.mode;
    job_put(j);
    return true;
}

const srv_module srv_sync_module = {
    .name = "sync",
    .create = srv_sync_create,
    .start = srv_sync_start,
    .stop = srv_sync_stop,
    .destroy = srv_sync_destroy,
    .stats_json = srv_sync_stats_json,
    .conn_closed = srv_sync_conn_closed,
};
