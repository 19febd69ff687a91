/* Step synchronisation on one shard: the state machine behind the sync modes (async, sync,
 * semisync with backup workers and a staleness bound, ssp). It does no I/O and knows nothing
 * of tables: admitted gradients reach the caller through an apply callback. The server's
 * dispatch calls it for pushes and pulls that carry a worker id and a step tag.
 *
 * Semantics (docs/sync.md): every worker pushes to every shard once per step, tagged with the
 * step it computed against (an empty push where it has no keys on a shard).
 *  - async: every push is applied on arrival.
 *  - sync / semisync: the shard aggregates the pushes tagged with steps >= G - staleness; when
 *    `aggregate` (K) have arrived it applies their sum divided by K (each worker sends the mean
 *    over its own batch, so this is the mean over the fixed global batch), in worker order so
 *    the result does not depend on arrival order, bumps G and wakes the waiters. Pushes older
 *    than the bound are dropped and counted. sync is semisync with K = N and staleness 0.
 *  - ssp: pushes apply on arrival; a worker may start step t only when every worker has pushed
 *    at least t - staleness steps.
 *  - sync with a dense lag L >= 1 (delayed synchronous SGD): a worker may start step t once
 *    G >= t - L, i.e. steps up to t - 1 - L are applied; it tags its push with t itself. The
 *    machine stages the pushes of steps G..G+L at once, each step in its own sum, and applies
 *    step G when every worker that has not left has pushed it, in worker order, then any
 *    following step that is already complete. Pushes for steps > G + L are refused as from
 *    the future; pushes for steps < G cannot exist (step G needs every worker's push).
 * Workers that run out of data leave (gr_step_machine_leave); steps then stop waiting for them.
 * A push repeating a (worker, step) already seen is acknowledged and ignored, so a client that
 * retries after a reconnect never applies a gradient twice. */
#ifndef GRANARY_SERVER_STEP_MACHINE_H
#define GRANARY_SERVER_STEP_MACHINE_H

#include "granary/core.h"

/* gr_sync_mode (the modes, with their wire values) is in core.h. */

typedef struct gr_sync_config {
    gr_sync_mode mode;
    uint32_t workers;   /* N */
    uint32_t aggregate; /* K: pushes per applied step (semisync; sync forces N) */
    uint32_t staleness; /* s: semisync drops older pushes; ssp lets a worker run s steps ahead */
    uint32_t dense_lag; /* L: sync only (0..GR_SYNC_MAX_LAG); 0 = lock-step, today's rule */
} gr_sync_config;

#define GR_SYNC_MAX_LAG 64

/* What a part's id names: a sparse table's wire id, or a dense tensor the caller numbered. */
enum { GR_SYNC_SPARSE = 0, GR_SYNC_DENSE = 1 };

/* One table's (or dense tensor's) part of a push. Parts are aggregated per (kind, id). */
typedef struct gr_sync_part {
    uint32_t id;
    uint32_t dim;
    size_t n;
    const uint64_t *keys;
    const float *grads; /* n * dim */
    uint32_t kind;      /* GR_SYNC_SPARSE (0, the default) or GR_SYNC_DENSE */
} gr_sync_part;

/* Applies one aggregated gradient: called with keys unique within the call. In async and ssp
 * it runs without the state machine's lock (pushes apply in parallel, like plain PUSH); in
 * sync and semisync under it, so a step is applied atomically. */
typedef int (*gr_sync_apply_fn)(void *ctx, uint32_t kind, uint32_t id, uint32_t dim,
                                const uint64_t *keys, size_t n, const float *grads);

typedef enum {
    GR_SYNC_APPLIED = 0,   /* applied now (async, ssp, or it completed a step) */
    GR_SYNC_STAGED = 1,    /* admitted, waiting for the rest of the step */
    GR_SYNC_DROPPED = 2,   /* older than the staleness bound: dropped and counted */
    GR_SYNC_DUPLICATE = 3, /* this (worker, step) was seen before: ignored */
} gr_sync_outcome;

typedef struct gr_sync_stats {
    uint64_t step;          /* G: applied steps (sync modes) */
    uint64_t pushes;
    uint64_t applied_steps;
    uint64_t admitted;      /* pushes admitted into applied steps (sync modes) or applied */
    uint64_t short_steps;   /* steps applied with fewer than K pushes because workers had left */
    uint64_t dropped;       /* stale gradients dropped */
    uint64_t duplicates;
    uint64_t waits;         /* acquires that had to block */
    uint64_t wait_ns;       /* time blocked acquires waited, summed (as reported by callers) */
    uint64_t left;          /* workers that have left */
    uint64_t staleness_hist[8]; /* admitted pushes by G - tag: 0,1,2,3,4-7,8-15,16-31,32+ */
    uint64_t ahead;         /* with a dense lag: pushes staged for a step beyond G (counted in
                             * staleness_hist[0]) */
} gr_sync_stats;

typedef struct gr_step_machine gr_step_machine;

int gr_step_machine_create(const gr_sync_config *cfg, gr_sync_apply_fn apply, void *ctx,
                       gr_step_machine **out);
void gr_step_machine_destroy(gr_step_machine *ss);

/* Handles worker `worker`'s gradient for step `step`. The parts are copied when staged.
 * GR_EINVAL for a worker id >= N, GR_ESTALE for a step from the future (> G + L in sync
 * modes), or the apply callback's error. */
int gr_step_machine_push(gr_step_machine *ss, uint32_t worker, uint64_t step, const gr_sync_part *parts,
                     size_t n_parts, gr_sync_outcome *outcome);

/* Blocks until worker may start step `step` (sync/semisync: G >= step - L; ssp: every worker has
 * pushed >= step - staleness steps; async: at once), or timeout_ms passes (GR_ETIMEDOUT, with
 * a message naming the slowest worker), or the step machine is shut down (GR_ESHUTDOWN).
 * *current (may be NULL) gets G (sync modes) or the slowest worker's clock (ssp). */
int gr_step_machine_acquire(gr_step_machine *ss, uint32_t worker, uint64_t step, unsigned timeout_ms,
                        uint64_t *current);

/* The non-blocking form of acquire, for callers that park waiters themselves (the server
 * does, so a waiting acquire holds no thread). *ready says whether the worker may start `step`
 * now; then *tag is what it tags its push with (sync/semisync: G; sync with a lag, ssp,
 * async: step) and
 * *current is G (sync modes) or the slowest active worker's clock (ssp). count_wait: count a
 * not-ready answer in stats.waits (pass true on a request's first poll only). GR_EINVAL for a
 * bad worker, GR_ESHUTDOWN after shutdown. */
int gr_step_machine_poll(gr_step_machine *ss, uint32_t worker, uint64_t step, bool count_wait,
                     bool *ready, uint64_t *tag, uint64_t *current);
/* Writes why `step` cannot start yet, e.g. "shard is at step 12 with 2 of 3 gradients" or
 * "worker 1 is at step 3 (staleness bound 2)", for a timeout message. */
void gr_step_machine_describe_wait(gr_step_machine *ss, uint64_t step, char *buf, size_t len);
/* Adds a finished wait's duration to stats.wait_ns. */
void gr_step_machine_note_wait(gr_step_machine *ss, uint64_t ns);

/* Worker `worker` has finished its data and pushes no more: steps stop waiting for it (sync:
 * a step needs every worker that has not left; semisync: K, or every remaining worker when
 * fewer than K remain; ssp: it no longer counts as the slowest). A step that was waiting only
 * for it is applied now (*applied set, may be NULL). Idempotent. */
int gr_step_machine_leave(gr_step_machine *ss, uint32_t worker, bool *applied);
/* Workers that have not left. */
uint32_t gr_step_machine_active(gr_step_machine *ss);

/* Called (without the state machine's lock) after anything that may let a waiter start: a
 * step applied, a clock advanced, a worker left, shutdown. The server re-polls its parked
 * acquires from it. */
typedef void (*gr_sync_notify_fn)(void *ctx);
void gr_step_machine_set_notify(gr_step_machine *ss, gr_sync_notify_fn fn, void *ctx);

/* Wakes every waiter with GR_ESHUTDOWN; later acquires fail at once. */
void gr_step_machine_shutdown(gr_step_machine *ss);

void gr_step_machine_get_stats(gr_step_machine *ss, gr_sync_stats *st);
const gr_sync_config *gr_step_machine_config(const gr_step_machine *ss);

#endif
