/* Step synchronisation on one shard (see step_machine.h and docs/sync.md). One mutex guards the
 * state. In sync and semisync the apply callback runs under it, so an aggregated step is
 * applied atomically with respect to other pushes on this shard; in async and ssp it runs
 * outside it, so pushes apply in parallel as plain PUSH requests do. */
#include "server/step_machine.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct staged_part {
    uint32_t kind, id, dim;
    size_t n;
    uint64_t *keys;
    float *grads;
} staged_part;

typedef struct contribution {
    uint32_t worker;
    uint64_t step;
    size_t n_parts;
    staged_part *parts;
} contribution;

struct gr_step_machine {
    gr_sync_config cfg;
    gr_sync_apply_fn apply;
    void *ctx;
    gr_sync_notify_fn notify;
    void *notify_ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool shutdown;
    uint64_t g;              /* applied steps */
    uint64_t *last_step;     /* per worker: last step tag seen + 1 (0 = none) */
    uint64_t *clock;         /* per worker: pushes applied (ssp) */
    bool *left;              /* per worker: has left the job */
    uint32_t nleft;
    contribution *staged;    /* admitted pushes for step g (with a dense lag: steps g..g+L) */
    size_t n_staged, cap_staged;
    gr_sync_stats st;
};

static void free_contribution(contribution *c)
{
    for (size_t i = 0; i < c->n_parts; i++) {
        free(c->parts[i].keys);
        free(c->parts[i].grads);
    }
    free(c->parts);
    c->parts = NULL;
    c->n_parts = 0;
}

int gr_step_machine_create(const gr_sync_config *cfg, gr_sync_apply_fn apply, void *ctx,
                       gr_step_machine **out)
{
    if (!cfg || !apply || !out) return gr_seterr(GR_EINVAL, "step machine: NULL argument");
    if (cfg->mode > GR_SYNC_SSP) return gr_seterr(GR_EINVAL, "step machine: unknown mode %d", (int)cfg->mode);
    if (cfg->workers == 0 || cfg->workers > 65536)
        return gr_seterr(GR_EINVAL, "step machine: workers must be 1..65536, got %u", cfg->workers);
    gr_sync_config c = *cfg;
    if (c.mode == GR_SYNC_SYNC) {
        c.aggregate = c.workers;
        c.staleness = 0;
    }
    if (c.dense_lag && c.mode != GR_SYNC_SYNC)
        return gr_seterr(GR_EINVAL, "step machine: a dense lag needs mode sync (hybrid), not %d",
                         (int)c.mode);
    if (c.dense_lag > GR_SYNC_MAX_LAG)
        return gr_seterr(GR_EINVAL, "step machine: dense lag must be 0..%d, got %u",
                         GR_SYNC_MAX_LAG, c.dense_lag);
    if (c.mode == GR_SYNC_SEMISYNC && (c.aggregate == 0 || c.aggregate > c.workers))
        return gr_seterr(GR_EINVAL, "step machine: semisync needs 1 <= K <= N, got K=%u N=%u",
                         c.aggregate, c.workers);
    gr_step_machine *ss = calloc(1, sizeof *ss);
    if (!ss) return gr_seterr(GR_ENOMEM, "step machine: out of memory");
    ss->cfg = c;
    ss->apply = apply;
    ss->ctx = ctx;
    ss->last_step = calloc(c.workers, sizeof *ss->last_step);
    ss->clock = calloc(c.workers, sizeof *ss->clock);
    ss->left = calloc(c.workers, sizeof *ss->left);
    pthread_mutex_init(&ss->mu, NULL);
    pthread_cond_init(&ss->cv, NULL);
    if (!ss->last_step || !ss->clock || !ss->left) {
        gr_step_machine_destroy(ss);
        return gr_seterr(GR_ENOMEM, "step machine: out of memory");
    }
    *out = ss;
    return GR_OK;
}

void gr_step_machine_destroy(gr_step_machine *ss)
{
    if (!ss) return;
    for (size_t i = 0; i < ss->n_staged; i++) free_contribution(&ss->staged[i]);
    free(ss->staged);
    free(ss->last_step);
    free(ss->clock);
    free(ss->left);
    pthread_mutex_destroy(&ss->mu);
    pthread_cond_destroy(&ss->cv);
    free(ss);
}

const gr_sync_config *gr_step_machine_config(const gr_step_machine *ss) { return &ss->cfg; }

void gr_step_machine_set_notify(gr_step_machine *ss, gr_sync_notify_fn fn, void *ctx)
{
    pthread_mutex_lock(&ss->mu);
    ss->notify = fn;
    ss->notify_ctx = ctx;
    pthread_mutex_unlock(&ss->mu);
}

/* Called after the lock is released. */
static void notify(gr_step_machine *ss)
{
    if (ss->notify) ss->notify(ss->notify_ctx);
}

static int apply_direct(gr_step_machine *ss, const gr_sync_part *parts, size_t n_parts)
{
    for (size_t i = 0; i < n_parts; i++) {
        if (parts[i].n == 0) continue;
        int rc = ss->apply(ss->ctx, parts[i].kind, parts[i].id, parts[i].dim, parts[i].keys,
                           parts[i].n, parts[i].grads);
        if (rc) return rc;
    }
    return GR_OK;
}

static int stage(gr_step_machine *ss, uint32_t worker, uint64_t step, const gr_sync_part *parts,
                 size_t n_parts)
{
    if (ss->n_staged == ss->cap_staged) {
        size_t cap = ss->cap_staged ? ss->cap_staged * 2 : 8;
        contribution *s = realloc(ss->staged, cap * sizeof *s);
        if (!s) return gr_seterr(GR_ENOMEM, "step machine: out of memory staging a push");
        ss->staged = s;
        ss->cap_staged = cap;
    }
    contribution c = {.worker = worker, .step = step, .n_parts = 0};
    c.parts = calloc(n_parts ? n_parts : 1, sizeof *c.parts);
    if (!c.parts) return gr_seterr(GR_ENOMEM, "step machine: out of memory staging a push");
    for (size_t i = 0; i < n_parts; i++) {
        staged_part *p = &c.parts[c.n_parts++];
        p->kind = parts[i].kind;
        p->id = parts[i].id;
        p->dim = parts[i].dim;
        p->n = parts[i].n;
        p->keys = malloc((p->n ? p->n : 1) * sizeof *p->keys);
        p->grads = malloc((p->n ? p->n * p->dim : 1) * sizeof *p->grads);
        if (!p->keys || !p->grads) {
            free_contribution(&c);
            return gr_seterr(GR_ENOMEM, "step machine: out of memory staging a push");
        }
        if (p->n) {
            memcpy(p->keys, parts[i].keys, p->n * sizeof *p->keys);
            memcpy(p->grads, parts[i].grads, p->n * p->dim * sizeof *p->grads);
        }
    }
    ss->staged[ss->n_staged++] = c;
    return GR_OK;
}

static int cmp_contribution(const void *a, const void *b)
{
    const contribution *x = a, *y = b;
    if (x->worker != y->worker) return x->worker < y->worker ? -1 : 1;
    return x->step < y->step ? -1 : x->step > y->step;
}

/* Sums the pushes of one step per (kind, id) in (worker, step) order, divides by the number
 * of pushes in the step (K, fewer only in a short step) and applies. Frees them. */
static int apply_contributions(gr_step_machine *ss, contribution *staged, size_t n_staged)
{
    qsort(staged, n_staged, sizeof *staged, cmp_contribution);
    int rc = GR_OK;
    float scale = 1.0f / (float)n_staged;
    /* Every distinct (kind, id), in order of first appearance. */
    for (size_t ci = 0; ci < n_staged && rc == GR_OK; ci++) {
        for (size_t pi = 0; pi < staged[ci].n_parts && rc == GR_OK; pi++) {
            staged_part *first = &staged[ci].parts[pi];
            if (first->dim == 0) continue; /* already merged */
            uint32_t kind = first->kind, id = first->id, dim = first->dim;
#define SAME(p) ((p)->id == id && (p)->kind == kind && (p)->dim)
            size_t total = 0;
            for (size_t cj = ci; cj < n_staged; cj++)
                for (size_t pj = 0; pj < staged[cj].n_parts; pj++)
                    if (SAME(&staged[cj].parts[pj])) total += staged[cj].parts[pj].n;
            uint64_t *keys = malloc((total ? total : 1) * sizeof *keys);
            uint64_t *uniq = malloc((total ? total : 1) * sizeof *uniq);
            uint32_t *inv = malloc((total ? total : 1) * sizeof *inv);
            float *sum = calloc(total ? total * dim : 1, sizeof *sum);
            if (!keys || !uniq || !inv || !sum) {
                rc = gr_seterr(GR_ENOMEM, "step machine: out of memory applying a step");
            } else {
                size_t at = 0;
                for (size_t cj = ci; cj < n_staged; cj++)
                    for (size_t pj = 0; pj < staged[cj].n_parts; pj++) {
                        staged_part *p = &staged[cj].parts[pj];
                        if (!SAME(p)) continue;
                        if (p->dim != dim) {
                            rc = gr_seterr(GR_EDIM, "step machine: id %u pushed with dim %u and %u",
                                           id, dim, p->dim);
                        }
                        memcpy(keys + at, p->keys, p->n * sizeof *keys);
                        at += p->n;
                    }
                long nu = rc ? 0 : gr_dedup(keys, total, uniq, inv, NULL);
                if (nu < 0) rc = (int)nu;
                at = 0;
                for (size_t cj = ci; cj < n_staged && rc == GR_OK; cj++)
                    for (size_t pj = 0; pj < staged[cj].n_parts; pj++) {
                        staged_part *p = &staged[cj].parts[pj];
                        if (!SAME(p)) continue;
                        for (size_t r = 0; r < p->n; r++, at++) {
                            float *dst = sum + (size_t)inv[at] * dim;
                            const float *src = p->grads + r * dim;
                            for (uint32_t d = 0; d < dim; d++) dst[d] += src[d];
                        }
                        p->dim = 0; /* merged */
                    }
#undef SAME
                if (rc == GR_OK && nu > 0) {
                    for (size_t i = 0; i < (size_t)nu * dim; i++) sum[i] *= scale;
                    rc = ss->apply(ss->ctx, kind, id, dim, uniq, (size_t)nu, sum);
                }
            }
            free(keys);
            free(uniq);
            free(inv);
            free(sum);
        }
    }
    for (size_t i = 0; i < n_staged; i++) free_contribution(&staged[i]);
    return rc;
}

/* True when the staged contribution c belongs to step G's sum: every staged one without a
 * dense lag (semisync admits older tags into step G), only step G's with one. */
static bool in_step_g(const gr_step_machine *ss, const contribution *c)
{
    return !ss->cfg.dense_lag || c->step == ss->g;
}

/* Applies step G's staged pushes and keeps the later steps' (dense lag) staged, in their
 * order. Caller holds mu. */
static int apply_staged(gr_step_machine *ss)
{
    size_t m = 0;
    for (size_t i = 0; i < ss->n_staged; i++)
        if (in_step_g(ss, &ss->staged[i])) {
            contribution c = ss->staged[i];
            memmove(ss->staged + m + 1, ss->staged + m, (i - m) * sizeof c);
            ss->staged[m++] = c;
        }
    int rc = apply_contributions(ss, ss->staged, m);
    memmove(ss->staged, ss->staged + m, (ss->n_staged - m) * sizeof *ss->staged);
    ss->n_staged -= m;
    return rc;
}

static void count_staleness(gr_sync_stats *st, uint64_t lag)
{
    int b = lag < 4 ? (int)lag : lag < 8 ? 4 : lag < 16 ? 5 : lag < 32 ? 6 : 7;
    st->staleness_hist[b]++;
}

/* Sync modes: the staged pushes form a step once K arrived, or once every worker that has not
 * left has one staged (fewer than K remain: a short step). Caller holds mu. */
static size_t staged_for_g(const gr_step_machine *ss)
{
    size_t n = 0;
    for (size_t i = 0; i < ss->n_staged; i++) n += in_step_g(ss, &ss->staged[i]);
    return n;
}

static bool step_complete(const gr_step_machine *ss)
{
    size_t n = staged_for_g(ss);
    if (n == 0) return false;
    if (n >= ss->cfg.aggregate) return true;
    for (uint32_t w = 0; w < ss->cfg.workers; w++) {
        if (ss->left[w]) continue;
        bool has = false;
        for (size_t i = 0; i < ss->n_staged && !has; i++)
            has = ss->staged[i].worker == w && in_step_g(ss, &ss->staged[i]);
        if (!has) return false;
    }
    return true;
}

/* Applies the staged step and advances G; with a dense lag, then every following step that
 * is complete already (a worker that left had pushed it). Caller holds mu. */
static int finish_step(gr_step_machine *ss)
{
    int rc = GR_OK;
    do {
        size_t n = staged_for_g(ss);
        if (n < ss->cfg.aggregate) ss->st.short_steps++;
        int r = apply_staged(ss);
        if (!rc) rc = r;
        ss->g++;
        ss->st.applied_steps++;
        ss->st.admitted += n;
    } while (ss->cfg.dense_lag && step_complete(ss));
    pthread_cond_broadcast(&ss->cv);
    return rc;
}

int gr_step_machine_push(gr_step_machine *ss, uint32_t worker, uint64_t step, const gr_sync_part *parts,
                     size_t n_parts, gr_sync_outcome *outcome)
{
    if (!ss || (n_parts && !parts))
        return gr_seterr(GR_EINVAL, "step machine: NULL argument");
    if (worker >= ss->cfg.workers)
        return gr_seterr(GR_EINVAL, "step machine: worker %u out of range (job has %u workers)",
                         worker, ss->cfg.workers);
    gr_sync_outcome out = GR_SYNC_APPLIED;
    int rc = GR_OK;
    bool wake = false;
    pthread_mutex_lock(&ss->mu);
    ss->st.pushes++;
    if (ss->last_step[worker] > step) {
        /* Already saw a later or equal step from this worker: a retry. */
        out = GR_SYNC_DUPLICATE;
        ss->st.duplicates++;
        goto done;
    }
    switch (ss->cfg.mode) {
    case GR_SYNC_ASYNC:
    case GR_SYNC_SSP:
        /* Claim the (worker, step) first so a concurrent retry is a duplicate, then apply
         * without the lock: async pushes must not serialise on the shard. The ssp clock moves
         * only after the apply, so a worker allowed to start sees these updates. */
        ss->last_step[worker] = step + 1;
        pthread_mutex_unlock(&ss->mu);
        rc = apply_direct(ss, parts, n_parts);
        pthread_mutex_lock(&ss->mu);
        if (rc == GR_OK) {
            ss->st.admitted++;
            count_staleness(&ss->st, 0);
            if (ss->cfg.mode == GR_SYNC_SSP && ss->clock[worker] < step + 1) {
                ss->clock[worker] = step + 1;
                pthread_cond_broadcast(&ss->cv);
                wake = true;
            }
        }
        goto done;
    case GR_SYNC_SYNC:
    case GR_SYNC_SEMISYNC:
        if (step > ss->g + ss->cfg.dense_lag) {
            rc = gr_seterr(GR_ESTALE,
                           "step machine: worker %u pushed step %llu but the shard is at step %llu "
                           "(dense lag %u; acquire the step first)",
                           worker, (unsigned long long)step, (unsigned long long)ss->g,
                           ss->cfg.dense_lag);
            break;
        }
        if (step < ss->g && ss->g - step > ss->cfg.staleness) {
            out = GR_SYNC_DROPPED;
            ss->st.dropped++;
            break;
        }
        rc = stage(ss, worker, step, parts, n_parts);
        if (rc) break;
        count_staleness(&ss->st, step < ss->g ? ss->g - step : 0);
        if (step > ss->g) ss->st.ahead++;
        out = GR_SYNC_STAGED;
        if (step_complete(ss)) {
            rc = finish_step(ss);
            out = GR_SYNC_APPLIED;
            wake = true;
        }
        break;
    }
    if (rc == GR_OK) ss->last_step[worker] = step + 1;
done:
    ss->st.step = ss->g;
    pthread_mutex_unlock(&ss->mu);
    if (wake) notify(ss);
    if (outcome) *outcome = out;
    return rc;
}

/* The slowest clock among workers that have not left (UINT64_MAX when all have). */
static uint64_t slowest_clock(const gr_step_machine *ss, uint32_t *who)
{
    uint64_t m = UINT64_MAX;
    for (uint32_t w = 0; w < ss->cfg.workers; w++)
        if (!ss->left[w] && ss->clock[w] < m) {
            m = ss->clock[w];
            if (who) *who = w;
        }
    return m;
}

static bool may_start(const gr_step_machine *ss, uint64_t step)
{
    switch (ss->cfg.mode) {
    case GR_SYNC_ASYNC: return true;
    case GR_SYNC_SSP: {
        uint64_t need = step > ss->cfg.staleness ? step - ss->cfg.staleness : 0;
        return slowest_clock(ss, NULL) >= need;
    }
    default: return ss->g + ss->cfg.dense_lag >= step;
    }
}

static uint64_t current_of(const gr_step_machine *ss)
{
    if (ss->cfg.mode != GR_SYNC_SSP) return ss->g;
    uint64_t m = slowest_clock(ss, NULL);
    return m == UINT64_MAX ? 0 : m;
}

static void describe_locked(const gr_step_machine *ss, uint64_t step, char *buf, size_t len)
{
    if (ss->cfg.mode == GR_SYNC_SSP) {
        uint32_t who = 0;
        uint64_t slow = slowest_clock(ss, &who);
        snprintf(buf, len, "worker %u is at step %llu (staleness bound %u)", who,
                 (unsigned long long)(slow == UINT64_MAX ? 0 : slow), ss->cfg.staleness);
    } else {
        uint32_t need = ss->cfg.aggregate, remaining = ss->cfg.workers - ss->nleft;
        if (remaining < need) need = remaining;
        snprintf(buf, len, "shard is at step %llu with %zu of %u gradients (waiting for step %llu)",
                 (unsigned long long)ss->g, staged_for_g(ss), need, (unsigned long long)step);
    }
}

void gr_step_machine_describe_wait(gr_step_machine *ss, uint64_t step, char *buf, size_t len)
{
    pthread_mutex_lock(&ss->mu);
    describe_locked(ss, step, buf, len);
    pthread_mutex_unlock(&ss->mu);
}

void gr_step_machine_note_wait(gr_step_machine *ss, uint64_t ns)
{
    pthread_mutex_lock(&ss->mu);
    ss->st.wait_ns += ns;
    pthread_mutex_unlock(&ss->mu);
}

int gr_step_machine_poll(gr_step_machine *ss, uint32_t worker, uint64_t step, bool count_wait,
                     bool *ready, uint64_t *tag, uint64_t *current)
{
    if (!ss) return gr_seterr(GR_EINVAL, "step machine: NULL argument");
    if (worker >= ss->cfg.workers)
        return gr_seterr(GR_EINVAL, "step machine: worker %u out of range (job has %u workers)",
                         worker, ss->cfg.workers);
    int rc = GR_OK;
    pthread_mutex_lock(&ss->mu);
    if (ss->shutdown) {
        rc = gr_seterr(GR_ESHUTDOWN, "the sync job was stopped (shard shutting down or job reset)");
    } else {
        *ready = may_start(ss, step);
        if (!*ready && count_wait) ss->st.waits++;
        /* With a dense lag the step itself is the tag: G may be up to L behind it. */
        bool tag_g = (ss->cfg.mode == GR_SYNC_SYNC && !ss->cfg.dense_lag) ||
                     ss->cfg.mode == GR_SYNC_SEMISYNC;
        if (tag) *tag = tag_g ? ss->g : step;
        if (current) *current = current_of(ss);
    }
    pthread_mutex_unlock(&ss->mu);
    return rc;
}

int gr_step_machine_acquire(gr_step_machine *ss, uint32_t worker, uint64_t step, unsigned timeout_ms,
                        uint64_t *current)
{
    if (!ss) return gr_seterr(GR_EINVAL, "step machine: NULL argument");
    if (worker >= ss->cfg.workers)
        return gr_seterr(GR_EINVAL, "step machine: worker %u out of range (job has %u workers)",
                         worker, ss->cfg.workers);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    int rc = GR_OK;
    pthread_mutex_lock(&ss->mu);
    if (!may_start(ss, step)) ss->st.waits++;
    while (!ss->shutdown && !may_start(ss, step)) {
        int e = pthread_cond_timedwait(&ss->cv, &ss->mu, &deadline);
        if (e == ETIMEDOUT && !may_start(ss, step)) {
            char why[160];
            describe_locked(ss, step, why, sizeof why);
            rc = gr_seterr(GR_ETIMEDOUT, "timed out after %u ms waiting for step %llu: %s",
                           timeout_ms, (unsigned long long)step, why);
            break;
        }
    }
    if (rc == GR_OK && ss->shutdown)
        rc = gr_seterr(GR_ESHUTDOWN, "shard is shutting down");
    if (current) *current = current_of(ss);
    pthread_mutex_unlock(&ss->mu);
    return rc;
}

int gr_step_machine_leave(gr_step_machine *ss, uint32_t worker, bool *applied)
{
    if (applied) *applied = false;
    if (!ss) return gr_seterr(GR_EINVAL, "step machine: NULL argument");
    if (worker >= ss->cfg.workers)
        return gr_seterr(GR_EINVAL, "step machine: worker %u out of range (job has %u workers)",
                         worker, ss->cfg.workers);
    int rc = GR_OK;
    pthread_mutex_lock(&ss->mu);
    if (!ss->left[worker]) {
        ss->left[worker] = true;
        ss->nleft++;
        ss->st.left = ss->nleft;
        bool sync_mode = ss->cfg.mode == GR_SYNC_SYNC || ss->cfg.mode == GR_SYNC_SEMISYNC;
        if (sync_mode && step_complete(ss)) {
            rc = finish_step(ss);
            if (applied) *applied = true;
        }
        ss->st.step = ss->g;
        pthread_cond_broadcast(&ss->cv);
    }
    pthread_mutex_unlock(&ss->mu);
    notify(ss);
    return rc;
}

uint32_t gr_step_machine_active(gr_step_machine *ss)
{
    pthread_mutex_lock(&ss->mu);
    uint32_t n = ss->cfg.workers - ss->nleft;
    pthread_mutex_unlock(&ss->mu);
    return n;
}

void gr_step_machine_shutdown(gr_step_machine *ss)
{
    if (!ss) return;
    pthread_mutex_lock(&ss->mu);
    ss->shutdown = true;
    pthread_cond_broadcast(&ss->cv);
    pthread_mutex_unlock(&ss->mu);
    notify(ss);
}

void gr_step_machine_get_stats(gr_step_machine *ss, gr_sync_stats *st)
{
    pthread_mutex_lock(&ss->mu);
    *st = ss->st;
    st->step = ss->g;
    st->left = ss->nleft;
    pthread_mutex_unlock(&ss->mu);
}
