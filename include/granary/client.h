/* granary client: the library workers link to talk to a sharded parameter server. It routes
 * keys to shards by slot, deduplicates each batch, sends one request per shard (all in flight
 * at once), scatters rows back to every occurrence and sums the gradients of duplicate keys
 * before a push. Calls are asynchronous (start, then wait on a handle); the blocking calls
 * are thin wrappers. A gr_client is thread-safe: many threads may start operations at once.
 *
 * Errors name the shard: "shard 1 (127.0.0.1:7001): connection refused". */
#ifndef GRANARY_CLIENT_H
#define GRANARY_CLIENT_H

#include "granary/core.h"

typedef struct gr_client gr_client;
typedef struct gr_client_op gr_client_op;
typedef int (*gr_client_stale_fn)(void *ctx, gr_client *c, uint32_t shard, uint32_t epoch,
                                  const char *msg);

typedef struct gr_client_config {
    /* Either a list "host:port,host:port" (position = shard index; an entry may be
     * "unix:@NAME", an abstract AF_UNIX address on this machine) ... */
    const char *servers;
    /* ... or a cluster file: {"shards":["host:port", ...], "auth_file":"path"}. */
    const char *cluster_file;
    /* The shared secret: a file holding it (trailing whitespace trimmed), or the bytes. Both
     * NULL: no authentication (and a server that requires it refuses us). */
    const char *auth_file;
    const uint8_t *secret;
    size_t secret_len;
    uint32_t connect_timeout_ms; /* a (re)connect keeps retrying with backoff this long; 5000 */
    uint32_t request_timeout_ms; /* an operation not answered in this time fails; 30000 */
    uint32_t backoff_initial_ms; /* first retry delay, doubled per failed attempt; 10 */
    uint32_t backoff_max_ms;     /* cap of the retry delay; 500 */
    /* Admin tools: a single server, whatever shard it serves (stats, shutdown, describe).
     * Without it every server must say it is shard i of N for its position i in the list. */
    bool any_shard;
    /* Time slice (us, 100..100000; gr_thread_set_slice_us) the reader threads (one per shard)
     * ask for; 0 = the kernel's default. A client inside a process that computes (the
     * trainer) then takes its replies ahead of the computing threads' slices. Kernels without
     * custom slices keep the default. */
    uint32_t slice_us;
} gr_client_config;

GR_API void gr_client_config_default(gr_client_config *cfg);

/* Connects to every shard (hello, and auth when the server asks) and checks the layout.
 * Fails with the first shard that cannot be reached or disagrees. */
GR_API int gr_client_create(const gr_client_config *cfg, gr_client **out);
/* Closes every connection. Wait for every started operation first. NULL is a no-op. */
GR_API void gr_client_destroy(gr_client *c);
GR_API uint32_t gr_client_shards(const gr_client *c);
/* "host:port" of a shard (valid for the client's lifetime), or NULL. */
GR_API const char *gr_client_shard_addr(const gr_client *c, uint32_t shard);

/* One table's part of a batch. Keys may repeat; they are deduplicated per table, unless
 * flags has GR_CLIENT_BATCH_UNIQUE. */
typedef struct gr_client_batch {
    uint32_t table;     /* the table's wire id (its spec's "id") */
    uint32_t dim;       /* must equal the table's dim (else GR_EDIM from the shard) */
    size_t n;
    const uint64_t *keys;
    float *rows;        /* pull, push_pull: n * dim floats, written until the op completes */
    const float *grads; /* push, push_pull: n * dim floats, read only during the start call */
    unsigned flags;     /* GR_CLIENT_BATCH_*; 0 by default */
} gr_client_batch;

/* The caller's keys of this table are already unique (a trainer that deduplicated its batch
 * to compute on unique rows): the client skips its own dedup and occurrence links, row i of
 * rows / grads belongs to keys[i], and each row is copied once. The keys are not checked: with
 * this flag a repeated key is sent (and, in a push, applied) once per occurrence. */
#define GR_CLIENT_BATCH_UNIQUE 1u

#define GR_CLIENT_READONLY GR_READONLY /* pull: missing keys read the default row, nothing is created */

/* Starts a pull of nb tables' keys. keys arrays are read only during the call; rows arrays
 * must stay valid until gr_client_wait returns. On success *op is a handle to wait on; on
 * failure *op is NULL, nothing is in flight and nothing will be written. */
GR_API int gr_client_pull_start(gr_client *c, const gr_client_batch *b, size_t nb, unsigned flags,
                                gr_client_op **op);
/* Starts a push. The gradients of repeated keys are summed (in order of occurrence) and each
 * key gets one optimizer step. grads are copied during the call. A push that fails after it
 * was sent may have been applied on the shards that answered. */
GR_API int gr_client_push_start(gr_client *c, const gr_client_batch *b, size_t nb,
                                gr_client_op **op);
/* Push, then read back the updated rows of the same keys, in one round trip per shard. */
GR_API int gr_client_push_pull_start(gr_client *c, const gr_client_batch *b, size_t nb,
                                     gr_client_op **op);
/* Waits up to timeout_ms (-1: until the op completes or hits the request timeout). Returns
 * GR_EAGAIN when the op is still running (the handle stays valid: wait again). Otherwise the op
 * is finished and freed, and the return is its result: 0, or the first shard's error
 * (GR_ETIMEDOUT when a shard did not answer within the request timeout). */
GR_API int gr_client_wait(gr_client_op *op, int timeout_ms);

/* Blocking wrappers. */
GR_API int gr_client_pull(gr_client *c, uint32_t table, uint32_t dim, const uint64_t *keys,
                          size_t n, float *rows);
GR_API int gr_client_push(gr_client *c, uint32_t table, uint32_t dim, const uint64_t *keys,
                          size_t n, const float *grads);
GR_API int gr_client_pull_many(gr_client *c, const gr_client_batch *b, size_t nb, unsigned flags);
GR_API int gr_client_push_many(gr_client *c, const gr_client_batch *b, size_t nb);
GR_API int gr_client_push_pull_many(gr_client *c, const gr_client_batch *b, size_t nb);
/* Deletes keys of one table; *deleted (may be NULL) gets how many rows were present. */
GR_API int gr_client_delete(gr_client *c, uint32_t table, uint32_t dim, const uint64_t *keys,
                            size_t n, uint64_t *deleted);

/* ---- Direct shards (docs/client.md, "Direct shards") ----
 * Table operations a caller in the shard's own process runs by function call instead of over
 * the socket: the embedded cluster (gr_local_cluster_direct) fills this so its trainer's rows
 * skip frames, copies through the kernel and thread hops. The client still plans the batch
 * (dedup, routing by its slot map, duplicate gradients summed in occurrence order, every
 * gradient checked finite before anything is applied), then calls pull or push once per
 * table and shard with that shard's unique keys in plan order, and scatters the rows. Pull,
 * push and push_pull batches use it, for every shard, while the client is not coordinated
 * (no stale hook): an op started that way is already complete when the start call returns.
 * So do sync acquires, step pushes and dense pulls and pushes when their optional hooks are
 * set. Table management, checkpoints, stats and the rest stay on the socket. The hooks return
 * 0 or a gr_err with the message set. */
struct gr_client_dense_grad; /* below, with the step calls */
typedef struct gr_client_direct {
    void *ctx;
    uint32_t shards; /* must equal gr_client_shards */
    int (*pull)(void *ctx, uint32_t shard, uint32_t table, uint32_t dim, const uint64_t *keys,
                size_t n, float *rows, bool readonly);
    int (*push)(void *ctx, uint32_t shard, uint32_t table, uint32_t dim, const uint64_t *keys,
                size_t n, const float *grads);
    /* Optional (NULL: that call stays on the socket). The sync job's calls (acquire blocks
     * until the step may start; push_step gets the shard's unique keys with their summed
     * gradients, one gr_client_batch per table, and the dense parts the shard owns) and the
     * dense parameters' pull and asynchronous push. */
    int (*acquire)(void *ctx, uint32_t shard, uint32_t worker, uint64_t step,
                   uint32_t timeout_ms, uint64_t *tag, uint64_t *current);
    int (*push_step)(void *ctx, uint32_t shard, uint32_t worker, uint64_t step,
                     const struct gr_client_batch *rows, size_t nrows,
                     const struct gr_client_dense_grad *dense, size_t ndense, uint32_t *outcome);
    int (*dense_pull)(void *ctx, uint32_t shard, const char *name, float *out, size_t n);
    int (*dense_push)(void *ctx, uint32_t shard, const char *name, const float *grad, size_t n);
} gr_client_direct;
/* Installs (d non-NULL) or removes (NULL) the direct hooks; the struct is copied. Set before
 * the client is shared between threads, and remove before what ctx points to goes away.
 * GR_EINVAL when d's shard count is not the client's or a hook is missing. */
GR_API int gr_client_set_direct(gr_client *c, const gr_client_direct *d);

/* Table management, on every shard. spec_json is the table engine's JSON spec. An existing
 * table with an equal spec is fine; a different one is GR_EEXIST. */
GR_API int gr_client_create_table(gr_client *c, const char *spec_json);
GR_API int gr_client_drop_table(gr_client *c, const char *name);
/* *json (malloc'd, caller frees): {"spec":{...},"rows":R,"bytes":B,"shards":[{"rows":..,
 * "bytes":..}, ...]} summed over shards. GR_ENOENT when no shard has it. */
GR_API int gr_client_describe_table(gr_client *c, const char *name, char **json);
/* Rows past their TTL removed on every shard (name NULL or "" = all tables). */
GR_API int gr_client_evict(gr_client *c, const char *name, uint64_t *evicted);

/* Dense parameters live whole on the shard that owns their name. spec_json:
 * {"name":"mlp","size":N,"init":{...},"optimizer":{...},"seed":S} (table spec fields
 * without "dim"). */
GR_API int gr_client_dense_create(gr_client *c, const char *spec_json);
GR_API int gr_client_dense_pull(gr_client *c, const char *name, float *out, size_t n);
GR_API int gr_client_dense_push(gr_client *c, const char *name, const float *grad, size_t n);

/* Starts a pull of a whole dense parameter into out (n floats, valid until the wait returns);
 * the async form of gr_client_dense_pull, so a worker can fetch rows and dense parameters at
 * once. */
GR_API int gr_client_dense_pull_start(gr_client *c, const char *name, float *out, size_t n,
                                      gr_client_op **op);
/* Starts a dense push (the async form of gr_client_dense_push); grad is copied during the
 * call. */
GR_API int gr_client_dense_push_start(gr_client *c, const char *name, const float *grad, size_t n,
                                      gr_client_op **op);
/* Overwrites a dense parameter's values (its initialisation) and resets its optimizer state. */
GR_API int gr_client_dense_set(gr_client *c, const char *name, const float *values, size_t n);

/* ---- Coordination (docs/client.md, "Layout epochs") ----
 * Under a coordinator every request carries the epoch of the layout the client routes by, and
 * a shard of another epoch (or one fenced after losing its coordinator session) refuses it
 * with GR_ESTALE before running it. The coordination-aware caller installs a hook that
 * re-reads the layout; the client then sends the refused requests again. */

/* The epoch stamped on every request sent from now on; 0 (the default) = not coordinated.
 * GR_EINVAL over GR_PROTO_EPOCH_MAX. Thread-safe. */
GR_API int gr_client_set_epoch(gr_client *c, uint32_t epoch);
GR_API uint32_t gr_client_epoch(const gr_client *c);

/* The stale hook: called on the thread that waits on an operation whose only failures are
 * GR_ESTALE refusals, with the first refused request's shard, the epoch it carried and the
 * shard's message. It re-reads the layout (it may block, e.g. until the layout moves past
 * `epoch` or a fenced shard re-registers), installs what it learnt (gr_client_set_epoch), and
 * returns 0 to have the refused requests sent again under the client's epoch now, or a
 * negative gr_err to let the operation fail with the refusal. A refused request ran nothing
 * on its shard, so sending it again applies it once. Retries stop at the operation's request
 * timeout and after 64 rounds. Operations that fail for other reasons as well are not
 * retried. */
/* Installs (fn NULL: removes) the hook. Not thread-safe: call before the client is shared.
 * With a hook, each request keeps its frame until its operation ends (to send it again). */
GR_API void gr_client_set_stale_hook(gr_client *c, gr_client_stale_fn fn, void *ctx);

/* Points shard's connection at another address (a standby took its index): the connection is
 * closed and the next request connects to addr ("host:port"). No operation may be in flight
 * to that shard (the trainer's recovery calls it with its pipeline stopped). GR_EINVAL for a
 * bad address or shard. */
GR_API int gr_client_set_shard_addr(gr_client *c, uint32_t shard, const char *addr);

/* ---- Sync jobs: step tokens for sync, semisync and ssp (docs/sync.md) ----
 * Every shard runs the job's step state machine on its own. A worker acquires a step from
 * every shard, pulls, computes, and pushes its gradient to every shard tagged with that
 * shard's answer (shards without its keys get an empty push, so each counts every worker's
 * step); when it runs out of data it leaves. Tags are per shard because in semisync two
 * shards may be at different steps for a moment. */

/* The core's gr_sync_mode values, under the client's names. */
#define GR_CLIENT_SYNC_ASYNC GR_SYNC_ASYNC
#define GR_CLIENT_SYNC_SYNC GR_SYNC_SYNC
#define GR_CLIENT_SYNC_SEMISYNC GR_SYNC_SEMISYNC
#define GR_CLIENT_SYNC_SSP GR_SYNC_SSP

typedef struct gr_client_sync_config {
    uint32_t mode;      /* GR_CLIENT_SYNC_* */
    uint32_t workers;   /* N */
    uint32_t aggregate; /* K (semisync; sync forces N) */
    uint32_t staleness; /* semisync: drop bound; ssp: how far ahead a worker may run */
    uint32_t dense_lag; /* sync: step t may start once step t-1-L is applied (0: lock-step) */
} gr_client_sync_config;

#define GR_CLIENT_SYNC_RESET 1u /* replace whatever job the shards run (its waiters fail) */
#define GR_CLIENT_SYNC_CLEAR 2u /* drop the job; cfg is ignored */
#define GR_CLIENT_SYNC_LIVE 4u  /* best effort: only shards whose connection is up right now,
                                 * one at a time, errors ignored (returns 0) — for a clean-up
                                 * that must not wait on a dead shard's reconnect */

/* Installs the job on every shard. Idempotent: the same config (and owner) again is fine
 * (every worker process of a job may call it); a different one, or another owner's, while a
 * job is installed is GR_EBUSY, unless flags has GR_CLIENT_SYNC_RESET. *step (may be NULL)
 * gets the highest shard step. */
GR_API int gr_client_sync_configure(gr_client *c, const gr_client_sync_config *cfg,
                                    unsigned flags, uint64_t *step);

/* Who runs a job. A shard that runs another owner's job refuses a config with GR_EBUSY and a
 * message naming the running job (owner, mode, workers, started when, step), unless
 * GR_CLIENT_SYNC_RESET; a CLEAR with an owner clears only that owner's job. Every process of
 * one job passes the same owner. */
typedef struct gr_client_sync_owner {
    uint64_t id;         /* nonzero: a trainer's random id */
    uint64_t started_ms; /* unix ms, for the message */
    const char *label;   /* for people, e.g. "host:pid" (at most 127 bytes; NULL: none) */
} gr_client_sync_owner;

/* gr_client_sync_configure with an owner (owner NULL: none, as gr_client_sync_configure). With
 * CLEAR, cfg may be NULL. */
GR_API int gr_client_sync_configure_owned(gr_client *c, const gr_client_sync_config *cfg,
                                          const gr_client_sync_owner *owner, unsigned flags,
                                          uint64_t *step);

/* Starts an acquire: on every shard s, waits (on the shard, holding no thread there) until
 * worker may start step want[s] (for a worker's first step 0, then its last tag there + 1).
 * When the op completes, tags[s] holds the tag for its push to shard s (sync/semisync: the
 * shard's step G >= want[s]; ssp and async: want[s]) and current[s] (may be NULL) the shard's
 * G or, in ssp, its slowest worker's step. A shard that cannot let it start within timeout_ms
 * fails the op with GR_ETIMEDOUT and a message naming what it waits for ("shard is at step 12
 * with 2 of 3 gradients"). want may equal tags (read during the call only). Arrays have
 * gr_client_shards() entries. */
GR_API int gr_client_sync_acquire_start(gr_client *c, uint32_t worker, const uint64_t *want,
                                        uint32_t timeout_ms, uint64_t *tags, uint64_t *current,
                                        gr_client_op **op);
/* Blocking form; *step (may be NULL) gets the smallest tag, the step this worker computes. */
GR_API int gr_client_sync_acquire(gr_client *c, uint32_t worker, const uint64_t *want,
                                  uint32_t timeout_ms, uint64_t *tags, uint64_t *step);

/* A dense parameter's gradient in a step push. */
typedef struct gr_client_dense_grad {
    const char *name;
    const float *grad;
    size_t n;
} gr_client_dense_grad;

/* What a shard did with a step push (outcomes[s]). */
enum { GR_CLIENT_PUSH_APPLIED = 0, GR_CLIENT_PUSH_STAGED = 1, GR_CLIENT_PUSH_DROPPED = 2,
       GR_CLIENT_PUSH_DUPLICATE = 3 };

/* Starts a step push: one PUSH_STEP frame to every shard, tagged tags[s], carrying that
 * shard's keys of every table (gradients of repeated keys summed in order of occurrence, as
 * gr_client_push_start does) and the dense gradients of the parameters it owns; a shard with
 * none gets an empty push. Each worker sends the mean gradient over its batch. A step is one
 * frame per shard, never split: GR_ETOOBIG when it does not fit a shard's limits. nb or nd may
 * be 0. outcomes (may be NULL; gr_client_shards() entries) get GR_CLIENT_PUSH_* per shard
 * when the op completes. grads are copied during the call. */
GR_API int gr_client_push_step_start(gr_client *c, uint32_t worker, const uint64_t *tags,
                                     const gr_client_batch *b, size_t nb,
                                     const gr_client_dense_grad *d, size_t nd, uint32_t *outcomes,
                                     gr_client_op **op);
GR_API int gr_client_push_step(gr_client *c, uint32_t worker, const uint64_t *tags,
                               const gr_client_batch *b, size_t nb, const gr_client_dense_grad *d,
                               size_t nd, uint32_t *outcomes);
/* Worker has finished: every shard stops waiting for it. */
GR_API int gr_client_sync_leave(gr_client *c, uint32_t worker);

/* A shard's stats JSON (see docs/server.md); *json malloc'd. */
GR_API int gr_client_stats(gr_client *c, uint32_t shard, char **json);
/* One request to one shard with a body the caller encoded (gr_proto_*), for operations that
 * have no call of their own here (a serving replica's SUBSCRIBE): waits up to timeout_ms (0 =
 * the request timeout) and hands back the reply body (*reply malloc'd, free() it). A shard's
 * error reply is returned as its code with the shard's message. */
GR_API int gr_client_call(gr_client *c, uint32_t shard, uint16_t opcode, const void *body,
                          size_t len, uint32_t timeout_ms, void **reply, size_t *reply_len);
/* Asks one shard (or every shard with shard < 0) to drain and stop. */
GR_API int gr_client_shutdown(gr_client *c, int shard);

/* Client-side counters since create. */
typedef struct gr_client_stats_t {
    uint64_t requests;       /* frames sent */
    uint64_t bytes_sent;     /* frame bytes written, headers included */
    uint64_t bytes_received; /* frame bytes read */
    uint64_t keys_in;        /* keys given to batch calls (before dedup) */
    uint64_t keys_sent;      /* keys sent (after dedup) */
    uint64_t reconnects;     /* successful connects after the first */
    /* Where the client's CPU goes, summed over every batch call (pull, push, push_pull,
     * delete, step push) since create: CPU time (ns) of the thread that did each phase, so
     * time blocked on a full socket or an empty one is not counted. */
    uint64_t plan_ns;    /* dedup, occurrence links and routing by slot (start call) */
    uint64_t frame_ns;   /* splitting into requests, frame building, gradient sums (start) */
    uint64_t send_ns;    /* writing frames to the sockets, every frame (the kernel's copy) */
    uint64_t recv_ns;    /* reading reply bodies from the sockets, every frame (readers) */
    uint64_t scatter_ns; /* decoding replies and copying rows to the caller (reader threads) */
    uint64_t direct_calls; /* direct hook calls (gr_client_direct), one per table and shard */
    uint64_t direct_ns;    /* CPU time in batch calls that went direct (plan, hooks, scatter) */
} gr_client_stats_t;
GR_API void gr_client_get_stats(gr_client *c, gr_client_stats_t *st);

/* ---- Checkpoints through the servers (docs/checkpoints.md, "Through the servers") ----
 * Paths name the shards' filesystem: every shard writes its own file into the same checkpoint
 * directory (a filesystem they share, or one path per machine that is gathered later). The
 * caller needs no access to it. */

typedef struct gr_client_ckpt_opts {
    const char *root;    /* checkpoint root on the shards; the checkpoint is root/step-<12 digits> */
    uint64_t step;       /* the training step it holds */
    const char *parent;  /* the checkpoint this caller last committed under root (a name), so
                            shards may write deltas on it; NULL = full */
    bool incremental;    /* allow deltas (each shard's saver still writes a full file when it
                            cannot prove the chain, e.g. after a failure or a restart) */
    uint32_t full_every; /* at most full_every - 1 deltas after a full one (0 = no bound) */
    int zstd_level;      /* 0 = raw, 1..19 = zstd sections */
    uint32_t keep;       /* retention after the commit: complete checkpoints kept (0 = all) */
    const char *meta;    /* JSON written beside the manifest as user.json (e.g. the trainer's
                            data position), or NULL */
    uint32_t timeout_ms; /* how long the shards' saves may take; 0 = 3600000 */
    bool same_step;      /* commit only if every shard runs a sync job and all are at the same
                            step G (else GR_ESTALE, nothing committed): a step-boundary check */
} gr_client_ckpt_opts;

typedef struct gr_client_ckpt_info {
    char name[64];            /* "step-000000000100" */
    uint64_t step;
    bool delta;               /* at least one shard wrote a delta */
    uint64_t rows;            /* rows written, all shards */
    uint64_t bytes;           /* file bytes, all shards, dense parts included */
    uint32_t dense;           /* dense parameters saved */
    uint32_t deleted;         /* checkpoints retention removed */
    double seconds;           /* the whole call */
    double shard_seconds_max; /* the slowest shard's save */
    bool sync_job;            /* the shards run a sync job ... */
    bool sync_agree;          /* ... and every shard was at the same step G */
    uint64_t sync_step;       /* that step (the highest when they disagree) */
} gr_client_ckpt_info;

/* Saves a checkpoint of every table and dense parameter on every shard: CKPT_SAVE to all shards
 * at once, and when every shard has reported its file durable, CKPT_COMMIT to shard 0, which
 * writes meta, then the manifest (so the checkpoint exists only once it is whole), then applies
 * retention. A failed save commits nothing: the previous checkpoint stays the newest.
 * Consistency is the caller's business: in sync training save between steps (gr_train does).
 * info may be NULL. */
GR_API int gr_client_ckpt_save(gr_client *c, const gr_client_ckpt_opts *o,
                               gr_client_ckpt_info *info);

typedef struct gr_client_ckpt_loaded {
    char name[64];    /* the checkpoint's directory name */
    uint64_t step;
    uint32_t shards;  /* how many shards wrote it */
    uint64_t rows;    /* rows loaded, all shards (dense chunks included) */
    double seconds;
    char *meta;       /* its user.json (malloc'd, the caller frees), NULL when none */
} gr_client_ckpt_loaded;

/* Loads a checkpoint into every shard: each shard builds new tables from the rows whose slots
 * it owns (any shard count against the checkpoint's) and the dense parameters it owns, with
 * optimizer state, then swaps them in; tables not in the checkpoint are left alone. name
 * NULL or "": root itself when it is a checkpoint, else the newest complete one under root
 * (resolved once, on shard 0, so every shard loads the same). resolve_only: load nothing, only
 * fill out (name, step, shards, meta). A table that exists on a shard with another spec is
 * refused before anything changes on that shard. On an error some shards may have loaded and
 * others not: load again. */
GR_API int gr_client_ckpt_load(gr_client *c, const char *root, const char *name,
                               bool resolve_only, gr_client_ckpt_loaded *out);

#endif
