/* granary server: one parameter-server shard. It owns the shard's tables and dense
 * parameters (all daemon state lives in one gr_server), accepts connections, decodes frames
 * with proto and applies them to the tables. docs/server.md describes the threads and the
 * lock order. */
#ifndef GRANARY_SERVER_H
#define GRANARY_SERVER_H

#include "granary/core.h"
#include "granary/metrics.h"
#include "granary/proto.h"
#include "granary/table.h"

typedef struct gr_server gr_server;

typedef struct gr_server_config {
    const char *host;   /* listen address; default "127.0.0.1" */
    uint16_t port;      /* 0 = a free port, read back with gr_server_port */
    uint32_t shard;     /* this shard's index, < shards */
    uint32_t shards;    /* shards in the cluster, 1..GR_SLOTS */
    uint32_t threads;   /* worker threads; 0 = online CPUs */
    /* Shared secret for HMAC challenge-response; NULL = no authentication, in which case a
     * non-loopback host is refused unless insecure is set. Copied by gr_server_create. */
    const uint8_t *secret;
    size_t secret_len;
    bool insecure;
    gr_proto_limits limits;    /* zero fields take gr_proto_limits_default */
    uint32_t max_connections;  /* default 256; further connections get an error and close */
    uint32_t max_tables;       /* tables + dense parameters, default 1024 */
    uint32_t max_inflight;     /* requests queued or running per connection, default 256 */
    uint64_t max_inflight_bytes; /* their request bodies, per connection, default 1 GiB (a
                                    single larger frame is still taken, alone) */
    uint32_t send_timeout_ms;  /* a reply not written within this time of being queued drops
                                  the connection and its queued replies (a client that stopped
                                  reading), default 30000 */
    uint32_t auth_timeout_ms;  /* with a secret, a connection must authenticate within this
                                  time from accept (not reset by traffic), default 10000 */
    uint32_t frame_timeout_ms; /* a frame, once its first byte arrived, must be complete
                                  within this, default 60000 */
    uint32_t idle_timeout_ms;  /* a connection with nothing in flight that sends nothing for
                                  this long is closed, default 900000; UINT32_MAX = never */
    uint64_t max_total_inflight_bytes; /* request bodies in flight over all connections; a
                                  connection whose next body would pass it is not read until
                                  others finish, default 4 GiB (a single larger frame is taken
                                  alone) */
    /* Checkpoint requests name directories on this shard's filesystem. With ckpt_root set,
     * they must be relative paths under it (no "..", and no symlink may lead out of it; it is
     * created if missing); NULL = any path the process may write (for servers embedded in a
     * trusted process, e.g. the trainer's local cluster; `granary server` never passes NULL,
     * it defaults to its working directory). Copied by gr_server_create. */
    const char *ckpt_root;
    /* Serving: every publish_interval_ms the shard publishes the rows changed since the last
     * publication (weights only) and its changed dense parameters to subscribed replicas
     * (SUBSCRIBE; docs/serving.md). 0 = no publishing (SUBSCRIBE is refused). */
    uint32_t publish_interval_ms;
    /* Where the shard's Prometheus series go (docs/operations.md lists them; labelled with
     * shard="I", so several shards may share one registry); NULL = none. Not owned: it must
     * outlive the server. */
    gr_metrics *metrics;
    /* Also listen on an abstract AF_UNIX address (no file; gr_server_local_addr) for clients
     * on this machine: the same protocol, limits and auth without the TCP stack (the embedded
     * cluster's trainer uses it). */
    bool local_socket;
    /* Time slice (us, 100..100000; gr_thread_set_slice_us) the connection loop and the worker
     * threads ask for; 0 = the kernel's default. A shard that shares its cores with a
     * computing process (the embedded cluster inside the trainer) answers requests ahead of
     * the computing threads' slices instead of behind them (docs/server.md, "Time slices").
     * Kernels without custom slices keep the default (logged at debug). */
    uint32_t slice_us;
    /* Row memory handed out ahead (bytes past each growing table's rows; 0 = off): a thread of
     * the shard's own has the kernel back the pages the next rows will take, so their page
     * faults are taken beside the requests rather than inside the one that creates them
     * (gr_table_prefault_ahead; docs/server.md, "Row memory ahead"). At most 1 GiB. */
    uint64_t populate_ahead;
    /* Row memory of each sparse table this shard creates past this many bytes goes on 4 KiB
     * pages (gr_table_set_huge_rows; 0 = all on huge pages, the default). For the short-lived,
     * growing tables of a training run's embedded shards on a VM whose host backs memory
     * lazily: docs/server.md, "Huge pages". */
    uint64_t huge_rows;
} gr_server_config;

/* Fills cfg with defaults (shard 0 of 1 on 127.0.0.1, any port, no auth). */
GR_API void gr_server_config_default(gr_server_config *cfg);

/* Validates cfg and creates a stopped server with no tables. GR_EINVAL names the bad field
 * (including "refusing to listen on 0.0.0.0 without --auth-file; pass --insecure"). */
GR_API int gr_server_create(const gr_server_config *cfg, gr_server **out);
/* Frees a stopped (or never started) server and all its tables. NULL is a no-op. */
GR_API void gr_server_destroy(gr_server *s);

/* Binds, listens and starts the connection loop and the worker threads. GR_EIO with the address
 * when the bind fails. */
GR_API int gr_server_start(gr_server *s);
/* The bound port (after start). */
GR_API uint16_t gr_server_port(const gr_server *s);
/* "unix:@NAME", the AF_UNIX address clients on this machine may give instead of host:port
 * (after start, with local_socket); NULL without one. */
GR_API const char *gr_server_local_addr(const gr_server *s);
/* Blocks until a stop is requested (SHUTDOWN request or gr_server_request_stop) or timeout_ms
 * passes (-1 = forever). Returns GR_OK when a stop was requested, GR_ETIMEDOUT otherwise. */
GR_API int gr_server_wait(gr_server *s, int timeout_ms);
/* Asks the server to stop; async-signal-safe (writes one byte to a pipe). */
GR_API void gr_server_request_stop(gr_server *s);
/* Graceful stop: stops accepting, stops reading new requests, finishes and answers every
 * request already received, then closes the connections and joins all threads. */
GR_API int gr_server_stop(gr_server *s);

/* Creates a table on this shard (as CREATE_TABLE does). An existing table with an equal spec
 * is not an error (*created = false); a different spec under the same name or id is
 * GR_EEXIST. created may be NULL. */
GR_API int gr_server_create_table(gr_server *s, const gr_table_spec *spec, bool *created);
/* Creates the tables of a {"tables":[...]} document (the --config file's format, which may
 * also hold "dense":[...] entries as DENSE_CREATE takes). */
GR_API int gr_server_load_config(gr_server *s, const char *json);

/* Table registry iteration, for operations that work on every table (checkpoints): calls
 * fn once per table (not dense parameters) with a reference held, outside the registry lock.
 * A nonzero return from fn stops the walk and is returned. */
typedef int (*gr_server_table_fn)(void *ctx, const char *name, gr_table *table);
GR_API int gr_server_foreach_table(gr_server *s, gr_server_table_fn fn, void *ctx);

/* Direct table operations for a caller in the same process (the embedded cluster's trainer,
 * through gr_client_direct): a PULL or PUSH of one table's rows on the caller's thread, with
 * no frame, socket or worker hop. The same checks as the requests (started and not stopping:
 * GR_ESHUTDOWN; fence: GR_ESTALE; unknown table: GR_ENOENT; dim: GR_EDIM; a key this shard
 * does not own: GR_ESTALE; a non-finite gradient: GR_EINVAL with nothing applied), the same
 * per-opcode stats, and the same table calls, so results are bitwise those of the requests.
 * Keys of a push are unique (the client sums duplicates first). Thread-safe. */
GR_API int gr_server_direct_pull(gr_server *s, uint32_t table, uint32_t dim,
                                 const uint64_t *keys, size_t n, float *rows, bool readonly);
GR_API int gr_server_direct_push(gr_server *s, uint32_t table, uint32_t dim,
                                 const uint64_t *keys, size_t n, const float *grads);
/* The same for a dense parameter: its n floats (DENSE_PULL) and an asynchronous gradient
 * (DENSE_PUSH, applied by its optimizer). */
GR_API int gr_server_direct_dense_pull(gr_server *s, const char *name, float *out, size_t n);
GR_API int gr_server_direct_dense_push(gr_server *s, const char *name, const float *grad,
                                       size_t n);
/* SYNC_ACQUIRE by direct call: blocks the caller until worker's step `step` may start (tag and
 * current step out, as the reply's pair), or fails as the request would (no job: GR_ENOENT;
 * timeout_ms 0 and not ready, or the timeout passed: GR_ETIMEDOUT; the job dropped or the shard
 * stopping meanwhile: that error). The wait holds no worker thread and no connection: the
 * caller's thread sleeps until whoever frees the step answers it. */
GR_API int gr_server_direct_acquire(gr_server *s, uint32_t worker, uint64_t step,
                                    uint32_t timeout_ms, uint64_t *tag, uint64_t *current);
/* PUSH_STEP by direct call: rows (unique keys, one section per table) and dense parts for step
 * `step` (the tag acquire gave), checked and applied exactly as the request's; *outcome is a
 * gr_sync_outcome (GR_CLIENT_PUSH_*), *current the job's step after it. */
GR_API int gr_server_direct_push_step(gr_server *s, uint32_t worker, uint64_t step,
                                      const gr_proto_section *rows, uint32_t nrows,
                                      const gr_proto_dense_part *dense, uint32_t ndense,
                                      uint32_t *outcome, uint64_t *current);

/* For /healthz: true while the server is started and not stopping; otherwise false with the
 * reason in why. */
GR_API bool gr_server_healthy(const gr_server *s, char *why, size_t whycap);

/* The shard this server serves, and whether it owns a slot under its slot map. */
GR_API uint32_t gr_server_shard(const gr_server *s);
GR_API uint32_t gr_server_shards(const gr_server *s);
GR_API bool gr_server_owns_slot(const gr_server *s, uint32_t slot);

/* ---- Coordination (docs/server.md, "Coordination"): the layout epoch and the fence ----
 * A shard run under a coordinator serves one layout epoch: requests stamped with another
 * (nonzero) epoch are refused with GR_ESTALE before anything runs, so a worker that routes by
 * an old layout learns of the change at once. A fence stops requests while the shard is not
 * sure it still owns its index: a shard that lost its coordinator session fences writes (all
 * requests but the handshake, stats and shutdown in sync modes, where a read of a stale row
 * would also be wrong) until it has re-registered, so a paused or partitioned shard that was
 * replaced meanwhile never accepts a write beside its replacement. Fenced requests get
 * GR_ESTALE naming why. A new server serves epoch 0 unfenced: exactly as before. All of
 * these are thread-safe and take effect for the next request that arrives. */
typedef enum gr_server_fence {
    GR_SERVER_OPEN = 0,         /* serve everything */
    GR_SERVER_FENCE_WRITES = 1, /* refuse what changes tables, the sync job or checkpoints */
    GR_SERVER_FENCE_ALL = 2,    /* refuse reads too */
} gr_server_fence;
GR_API void gr_server_set_fence(gr_server *s, gr_server_fence fence);
GR_API gr_server_fence gr_server_get_fence(const gr_server *s);
/* The fence for a shard that lost its coordinator session: GR_SERVER_FENCE_ALL while a sync or
 * semisync job is installed (hybrid's dense job included), else GR_SERVER_FENCE_WRITES. */
GR_API gr_server_fence gr_server_session_fence(gr_server *s);
/* A lease: past until_ns (gr_now_ns's clock) the shard behaves as fenced with
 * gr_server_session_fence until the lease is renewed; 0 = no lease. The coordination thread
 * renews it after every round trip to the coordinator, to that round trip's start plus most of
 * the session timeout: a coordinator cannot expire the session before then, so a shard that
 * was paused (SIGSTOP, a long stall) refuses writes the moment it runs again, before any of
 * its threads has learnt that its session expired and a standby took its index. */
GR_API void gr_server_set_lease(gr_server *s, uint64_t until_ns);
/* epoch <= GR_PROTO_EPOCH_MAX, else GR_EINVAL. */
GR_API int gr_server_set_epoch(gr_server *s, uint32_t epoch);
GR_API uint32_t gr_server_epoch(const gr_server *s);
/* Gives the server another shard index (a standby that claimed a lost shard's index). Only
 * while it is fenced with GR_SERVER_FENCE_ALL and before any client may know its address
 * (the caller publishes the address after this returns): GR_EBUSY otherwise; GR_EINVAL for
 * an index out of range. */
GR_API int gr_server_assign(gr_server *s, uint32_t shard, uint32_t shards);

/* ---- Joining a coordinated job (`granary server --coord`, docs/operations.md) ----
 * The shard registers with the coordinator, and a thread of its own keeps it in step with
 * the job's layout: it takes a vacant index (unless standby) or, as a standby, the index of a
 * shard whose member vanished, by compare-and-set with epoch + 1; after a takeover it restores
 * that index's rows from the newest checkpoint under ckpt_dir before it opens; it follows the
 * layout's epoch while it holds its index; it fences itself while its session is lost
 * (gr_server_session_fence) and takes its index back when nobody replaced it; when it was
 * replaced meanwhile it stays fenced and asks the server to stop. The server must be started
 * (its address is published) and stays fenced until it holds an index. */
struct gr_coord;
typedef struct gr_server_join gr_server_join;
typedef struct gr_server_join_opts {
    const char *address; /* "host:port" workers reach this shard at (published in the layout) */
    uint32_t shards;     /* creates the layout with this many shards when the job has none;
                            0 = wait for one */
    bool standby;        /* only take over lost indexes, never a vacant one */
    const char *ckpt_dir; /* the job's checkpoint root, as CKPT_LOAD names it; NULL = no
                             restore (a takeover serves empty tables) */
    uint32_t session_timeout_ms; /* the coordinator's session timeout (the lease, see
                                    gr_server_set_lease); 0 = 4000 */
    /* A standby with a ckpt_dir keeps tables ready for the largest shard of the newest
     * checkpoint, their memory prefaulted (docs/coord.md, "Warm standby"): at most
     * warm_max_bytes of it (0 = as much as that shard needs); no_warm turns it off. */
    uint64_t warm_max_bytes;
    bool no_warm;
} gr_server_join_opts;
/* Registers and starts the thread; the coordinator's callbacks (session, members, layout) are
 * the join's until gr_server_join_stop. GR_EAGAIN when not connected. */
GR_API int gr_server_join_start(gr_server *s, struct gr_coord *coord,
                                const gr_server_join_opts *o, gr_server_join **out);
/* Stops the thread and removes the callbacks (does not unregister: close the coordinator for
 * that). A callback the coordinator had already begun may still run until the coordinator is
 * closed, so: gr_server_join_stop, gr_coord_close, then gr_server_join_destroy. NULL is a
 * no-op. */
GR_API void gr_server_join_stop(gr_server_join *j);
/* Frees the join, after gr_coord_close. Stops it first if gr_server_join_stop was not called
 * (then the coordinator must still be open). NULL is a no-op. */
GR_API void gr_server_join_destroy(gr_server_join *j);
/* What the join did, for stats and the recovery benchmark. Times are Unix milliseconds. */
typedef struct gr_server_join_stats {
    int32_t index;          /* -1 while standby */
    uint64_t epoch;         /* the layout epoch served */
    uint32_t takeovers;     /* indexes taken over from a lost shard */
    uint64_t lost_seen_ms;  /* last takeover: when the loss was first seen */
    uint64_t claimed_ms;    /* ... when the compare-and-set won */
    uint64_t serving_ms;    /* ... when the rows were restored and the fence opened */
    uint64_t restore_ms;    /* ... the restore's duration */
    uint64_t rows_restored; /* ... rows loaded (this shard's, dense chunks included) */
    char restored_from[64]; /* ... the checkpoint's name ("" when none) */
    bool replaced;          /* another member serves our index: the shard stopped */
} gr_server_join_stats;
GR_API void gr_server_join_get(gr_server_join *j, gr_server_join_stats *out);
GR_API bool gr_server_join_replaced(gr_server_join *j);

/* What gr_server_ckpt_load restored. */
typedef struct gr_server_ckpt_loaded {
    char name[64];        /* the checkpoint's directory name */
    uint64_t step;
    uint64_t rows_loaded; /* rows this shard owns, dense chunks included */
    uint64_t rows_read;   /* rows read from the checkpoint's files */
    uint64_t usec;
} gr_server_ckpt_loaded;
/* Restores this shard's rows from a checkpoint, in this process, as CKPT_LOAD does (root and
 * name as there: name NULL or "" = the newest complete checkpoint under root, or root itself
 * when it is one); GR_ENOENT when root holds none. Runs on the caller's thread: call it while
 * the shard is fenced, before it serves (a standby restoring a lost shard). out may be NULL. */
GR_API int gr_server_ckpt_load(gr_server *s, const char *root, const char *name,
                               gr_server_ckpt_loaded *out);

#endif
