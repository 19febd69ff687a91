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
    /* Where the shard's Prometheus series go (docs/operations.md lists them; labelled with
     * shard="I", so several shards may share one registry); NULL = none. Not owned: it must
     * outlive the server. */
    gr_metrics *metrics;
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

/* For /healthz: true while the server is started and not stopping; otherwise false with the
 * reason in why. */
GR_API bool gr_server_healthy(const gr_server *s, char *why, size_t whycap);

/* The shard this server serves, and whether it owns a slot under its slot map. */
GR_API uint32_t gr_server_shard(const gr_server *s);
GR_API uint32_t gr_server_shards(const gr_server *s);
GR_API bool gr_server_owns_slot(const gr_server *s, uint32_t slot);

#endif
