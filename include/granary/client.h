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

typedef struct gr_client_config {
    /* Either a list "host:port,host:port" (position = shard index) ... */
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

/* One table's part of a batch. Keys may repeat; they are deduplicated per table. */
typedef struct gr_client_batch {
    uint32_t table;     /* the table's wire id (its spec's "id") */
    uint32_t dim;       /* must equal the table's dim (else GR_EDIM from the shard) */
    size_t n;
    const uint64_t *keys;
    float *rows;        /* pull, push_pull: n * dim floats, written until the op completes */
    const float *grads; /* push, push_pull: n * dim floats, read only during the start call */
} gr_client_batch;

#define GR_CLIENT_READONLY 1u /* pull: missing keys read the default row, nothing is created */

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

/* A shard's stats JSON (see docs/server.md); *json malloc'd. */
GR_API int gr_client_stats(gr_client *c, uint32_t shard, char **json);
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
} gr_client_stats_t;
GR_API void gr_client_get_stats(gr_client *c, gr_client_stats_t *st);

#endif
