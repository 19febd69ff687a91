/* granary proto: the wire format between workers and parameter-server shards.
 * Pure encode/decode: no I/O, no tables. Every length and count is checked against a
 * gr_proto_limits before anything is allocated; docs/protocol.md describes every byte. */
#ifndef GRANARY_PROTO_H
#define GRANARY_PROTO_H

#include "granary/core.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "granary's wire format is little-endian and the codec assumes a little-endian host"
#endif

#define GR_PROTO_VERSION 1
#define GR_PROTO_HEADER_SIZE 24
#define GR_PROTO_MAGIC0 'G'
#define GR_PROTO_MAGIC1 'R'
#define GR_PROTO_NONCE_SIZE 32 /* auth nonces */
#define GR_PROTO_MAC_SIZE 32   /* HMAC-SHA256 */
#define GR_PROTO_DIM_MAX 1024  /* equals GR_TABLE_DIM_MAX; proto does not include table.h */
#define GR_PROTO_OP_LIMIT 64   /* opcodes are 1..63; counters are sized by this */

/* Every opcode, declared once: X(NAME, number, "name", "summary"). The decoder, the server's
 * dispatcher, its stats counters and docs/protocol.md all come from this table. 16..20 are
 * the sync-job operations; 21 is the publisher's subscription (training shards), 22..23 are
 * answered by serving replicas; 24..63 are free for later operations; 40..42 are the
 * checkpoint operations. */
#define GR_PROTO_OPS(X)                                                                          \
    X(HELLO, 1, "hello", "handshake: reply carries shard layout, limits and the auth nonce")     \
    X(AUTH, 2, "auth", "answer the hello nonce with HMAC-SHA256(secret, nonce || client nonce)") \
    X(CREATE_TABLE, 3, "create_table", "create a table from its JSON spec (idempotent)")         \
    X(DESCRIBE_TABLE, 4, "describe_table", "JSON spec and row counts of one or all tables")      \
    X(DROP_TABLE, 5, "drop_table", "drop a table and all its rows")                              \
    X(PULL, 6, "pull", "rows of many keys over one or more tables")                              \
    X(PUSH, 7, "push", "apply gradient rows with each table's optimizer")                        \
    X(PUSH_PULL, 8, "push_pull", "push, then pull the same keys after the update (fused)")       \
    X(DENSE_CREATE, 9, "dense_create", "create a dense parameter from its JSON spec")            \
    X(DENSE_PULL, 10, "dense_pull", "the whole array of a dense parameter")                      \
    X(DENSE_PUSH, 11, "dense_push", "apply a gradient to a dense parameter")                     \
    X(DELETE, 12, "delete", "remove keys from tables")                                           \
    X(EVICT, 13, "evict", "drop rows past their TTL in one or all tables")                       \
    X(STATS, 14, "stats", "shard stats as JSON: tables, rows, memory, request counters")         \
    X(SHUTDOWN, 15, "shutdown", "drain in-flight requests and stop the shard")                   \
    X(SYNC_CONFIG, 16, "sync_config", "set, check, reset or clear the shard's sync job (mode, N, K, staleness)") \
    X(SYNC_ACQUIRE, 17, "sync_acquire", "wait until a worker may start a step; reply: the tag for its push") \
    X(PUSH_STEP, 18, "push_step", "a worker's step-tagged gradients, sparse and dense, through the step state machine") \
    X(SYNC_LEAVE, 19, "sync_leave", "a worker has finished its data: steps stop waiting for it")    \
    X(DENSE_SET, 20, "dense_set", "overwrite a dense parameter's values and reset its optimizer state") \
    X(SUBSCRIBE, 21, "subscribe", "a serving replica's long poll: the next publication of changed rows and dense parameters after a version, or a snapshot") \
    X(PREDICT, 22, "predict", "serving replica: click probabilities of a batch of examples (dense features and feature ids)") \
    X(LOOKUP, 23, "lookup", "serving replica: rows of many keys over one or more tables, never creating any") \
    X(CKPT_SAVE, 40, "ckpt_save", "write this shard's file of a checkpoint: its tables and the dense parameters it owns") \
    X(CKPT_COMMIT, 41, "ckpt_commit", "complete a checkpoint once every shard saved: metadata, then the manifest, then retention") \
    X(CKPT_LOAD, 42, "ckpt_load", "replace this shard's tables and dense parameters with the rows it owns in a checkpoint")

typedef enum {
#define GR_PROTO_OP_ENUM(name, num, lname, summary) GR_OP_##name = num,
    GR_PROTO_OPS(GR_PROTO_OP_ENUM)
#undef GR_PROTO_OP_ENUM
} gr_proto_op;

/* Lower-case name of an opcode ("pull"), or NULL for a number that is not an opcode. */
GR_API const char *gr_proto_op_name(unsigned op);
/* One-line summary of an opcode, or NULL. */
GR_API const char *gr_proto_op_summary(unsigned op);

enum { GR_PROTO_REQUEST = 0, GR_PROTO_RESPONSE = 1 };

/* Request flags (header `flags`). */
#define GR_PROTO_F_READONLY GR_READONLY /* pull: missing keys read the default row, nothing created */

/* The fixed 24-byte frame header. */
typedef struct gr_proto_header {
    uint8_t version;   /* GR_PROTO_VERSION */
    uint8_t kind;      /* GR_PROTO_REQUEST or GR_PROTO_RESPONSE */
    uint16_t op;       /* gr_proto_op */
    uint16_t flags;    /* GR_PROTO_F_* */
    int32_t status;    /* responses: 0 or a negative gr_err; requests: the layout epoch the
                        * sender works in, 0..GR_PROTO_EPOCH_MAX (0: not coordinated) */
    uint32_t body_len; /* bytes after the header */
    uint64_t id;       /* request id, echoed by the response */
} gr_proto_header;

/* Layout epochs (docs/protocol.md, "Layout epochs"). A coordinated worker stamps the epoch of
 * the layout it routes by into the status field of every request; a coordinated shard refuses
 * a request of another epoch with GR_ESTALE, so a worker that missed a layout change (a shard
 * replaced after a failure) finds out on its next request. Epoch 0 means "not coordinated"
 * and is accepted by every shard, as requests were before epochs existed. */
#define GR_PROTO_EPOCH_MAX 0x7fffffffu
/* The epoch a request header carries (its status field); 0 for a negative status, which the
 * receiver refuses as malformed anyway. */
static inline uint32_t gr_proto_request_epoch(const gr_proto_header *h)
{
    return h->status > 0 ? (uint32_t)h->status : 0u;
}
/* Overwrites the epoch of the encoded request frame at frame (its first 24 bytes), so a frame
 * built once can be resent under a newer layout. epoch must be <= GR_PROTO_EPOCH_MAX. */
GR_API void gr_proto_stamp_epoch(void *frame, uint32_t epoch);

/* Limits on every input. The server enforces its own; the client learns them from HELLO and
 * splits its requests to fit. */
typedef struct gr_proto_limits {
    uint32_t max_body;   /* bytes of one frame body */
    uint32_t max_keys;   /* keys in one request, summed over its tables */
    uint32_t max_tables; /* table sections in one request */
    uint32_t max_string; /* bytes of a string (JSON spec, name, message) */
} gr_proto_limits;

/* Defaults: 256 MiB bodies, 4 Mi keys, 256 tables per request, 1 MiB strings. */
GR_API void gr_proto_limits_default(gr_proto_limits *lim);

/* Parses a frame header from the first len bytes of buf and checks it against lim.
 * Returns GR_OK when the whole frame (header + body) is present; GR_EAGAIN ("need more bytes",
 * not an error) when it is not, with *need = the total bytes needed so far (the header size
 * until the header is complete, then header + body); GR_EPROTO for a bad magic or kind,
 * GR_EVERSION for another protocol version, GR_ETOOBIG for a body over lim->max_body. h is
 * filled whenever the header itself is complete and well-formed (so an error reply can
 * carry the request id). need may be NULL. */
GR_API int gr_proto_header_decode(const void *buf, size_t len, const gr_proto_limits *lim,
                                  gr_proto_header *h, size_t *need);
/* Writes a 24-byte header. */
GR_API void gr_proto_header_encode(void *buf, const gr_proto_header *h);

/* ---- Growable output buffer for encoding frames. ---- */
typedef struct gr_proto_buf {
    uint8_t *data;
    size_t len, cap;
} gr_proto_buf;

GR_API void gr_proto_buf_init(gr_proto_buf *b);
GR_API void gr_proto_buf_fini(gr_proto_buf *b);
/* Makes room for `extra` more bytes (pointers into data are invalidated when it grows). */
GR_API int gr_proto_buf_reserve(gr_proto_buf *b, size_t extra);
/* Starts a frame at the current end of b: writes a header with body_len 0. */
GR_API int gr_proto_begin(gr_proto_buf *b, uint8_t kind, uint16_t op, uint16_t flags,
                          int32_t status, uint64_t id);
/* Finishes the frame started at byte offset `start`: fills in body_len. GR_ETOOBIG when the
 * body does not fit in 32 bits. */
GR_API int gr_proto_end(gr_proto_buf *b, size_t start);
GR_API int gr_proto_put_u32(gr_proto_buf *b, uint32_t v);
GR_API int gr_proto_put_u64(gr_proto_buf *b, uint64_t v);
/* Raw bytes, then zero padding to the next multiple of 8. */
GR_API int gr_proto_put_bytes(gr_proto_buf *b, const void *p, size_t n);
/* A string: u32 length, bytes, zero padding to 8. */
GR_API int gr_proto_put_str(gr_proto_buf *b, const char *s, size_t n);
/* Reserves n bytes (plus zero padding to 8) and returns a pointer to them (valid until the
 * buffer next grows), for callers that fill arrays in place. */
GR_API void *gr_proto_put_space(gr_proto_buf *b, size_t n);

/* ---- Batches: PULL, PUSH, PUSH_PULL, DELETE requests and PULL/PUSH_PULL responses. ----
 * Body: u32 ntables, u32 reserved (0), then ntables sections, each:
 *   u32 table, u32 dim, u32 n, u32 reserved (0), [u64 keys[n]], [f32 values[n*dim], pad to 8]
 * Which arrays a section carries depends on the layout. */
typedef enum {
    GR_PROTO_KEYS = 1,        /* pull / delete requests */
    GR_PROTO_KEYS_VALUES = 3, /* push / push_pull requests: keys then gradients */
    GR_PROTO_VALUES = 2,      /* pull / push_pull responses: rows in request order */
} gr_proto_layout;

typedef struct gr_proto_section {
    uint32_t table, dim, n;
    const uint64_t *keys; /* points into the decoded body; NULL without keys */
    const float *values;  /* n * dim floats into the body; NULL without values */
} gr_proto_section;

typedef struct gr_proto_batch {
    uint32_t ntables;
    uint64_t total_keys;
    gr_proto_section *sections; /* ntables entries, malloc'd; gr_proto_batch_fini frees */
} gr_proto_batch;

/* Bytes a section of n keys at dim takes in the given layout (header included). */
GR_API size_t gr_proto_section_size(gr_proto_layout layout, uint32_t n, uint32_t dim);
/* Writes the batch prefix (u32 ntables, u32 0). */
GR_API int gr_proto_put_batch_head(gr_proto_buf *b, uint32_t ntables);
/* The 8 bytes a batch body starts with and a section's 16-byte header, exactly as the put
 * functions write them, so that a reader streaming a reply in can compare what arrives with
 * what it asked for (the client does) without a second copy of the layout. */
GR_API void gr_proto_batch_head_bytes(uint32_t ntables, uint8_t out[8]);
GR_API void gr_proto_section_head_bytes(uint32_t table, uint32_t dim, uint32_t n, uint8_t out[16]);
/* Appends a section header and reserves its arrays; *keys and *values (either may be NULL
 * when the layout has no such array) point at the space to fill. Reserve the whole frame
 * first (gr_proto_buf_reserve) so the pointers stay valid while filling several sections. */
GR_API int gr_proto_put_section(gr_proto_buf *b, gr_proto_layout layout, uint32_t table,
                                uint32_t dim, uint32_t n, uint64_t **keys, float **values);
/* Decodes a batch body. body must be 8-byte aligned (frame bodies are malloc'd); the
 * sections point into it. GR_EPROTO for truncated or trailing bytes or nonzero reserved
 * fields, GR_ETOOBIG for counts over lim, GR_EINVAL for dim 0 or over GR_PROTO_DIM_MAX. On
 * success free out with gr_proto_batch_fini; on failure nothing is allocated. */
GR_API int gr_proto_decode_batch(const void *body, size_t len, gr_proto_layout layout,
                                 const gr_proto_limits *lim, gr_proto_batch *out);
GR_API void gr_proto_batch_fini(gr_proto_batch *b);

/* ---- Simple bodies. ---- */
/* A body that is exactly one string (u32 len, bytes, pad): *s points into body (not
 * NUL-terminated). GR_ETOOBIG when longer than lim->max_string. */
GR_API int gr_proto_decode_str(const void *body, size_t len, const gr_proto_limits *lim,
                               const char **s, uint32_t *slen);

typedef struct gr_proto_hello {
    uint32_t shard, shards;
    uint32_t auth_required; /* 1: AUTH must follow before anything else */
    gr_proto_limits limits; /* the server's limits */
    uint8_t nonce[GR_PROTO_NONCE_SIZE];
    char server_version[32]; /* NUL-terminated */
} gr_proto_hello;
/* HELLO response body: u32 shard, u32 shards, u32 auth_required, u32 reserved,
 * u32 max_body, u32 max_keys, u32 max_tables, u32 max_string, nonce[32], str version. */
GR_API int gr_proto_put_hello(gr_proto_buf *b, const gr_proto_hello *h);
GR_API int gr_proto_decode_hello(const void *body, size_t len, gr_proto_hello *out);

/* AUTH request body: client nonce[32], mac[32]. AUTH response body: server proof mac[32]. */
GR_API int gr_proto_decode_auth(const void *body, size_t len, uint8_t nonce[GR_PROTO_NONCE_SIZE],
                                uint8_t mac[GR_PROTO_MAC_SIZE]);

/* DENSE_PUSH request body: str name, u64 size, f32 grad[size], pad. DENSE_PULL response body:
 * u64 size, f32 values[size], pad. */
GR_API int gr_proto_decode_dense_push(const void *body, size_t len, const gr_proto_limits *lim,
                                      const char **name, uint32_t *name_len, uint64_t *size,
                                      const float **grad);
GR_API int gr_proto_decode_dense_values(const void *body, size_t len, uint64_t *size,
                                        const float **values);

/* A body of n u64 values (DELETE response: rows deleted per table; EVICT: rows evicted). */
GR_API int gr_proto_decode_u64s(const void *body, size_t len, uint32_t max, uint64_t *vals,
                                uint32_t *n);

/* The auth proof: HMAC-SHA256(secret, a || b) with OpenSSL. The client proves itself with
 * a = server nonce, b = client nonce; the server answers with a = client nonce, b = server
 * nonce, so each side checks the other holds the secret. */
GR_API int gr_proto_auth_mac(const uint8_t *secret, size_t secret_len,
                             const uint8_t a[GR_PROTO_NONCE_SIZE],
                             const uint8_t b[GR_PROTO_NONCE_SIZE], uint8_t out[GR_PROTO_MAC_SIZE]);
/* Fills buf with n cryptographically random bytes (OpenSSL RAND_bytes). */
GR_API int gr_proto_random(uint8_t *buf, size_t n);

/* Routing. The default slot map is the core's gr_slot_shard (this name forwards to it). A dense
 * parameter lives whole on the shard that owns the slot of its name's hash. */
GR_API uint32_t gr_proto_default_shard(uint32_t slot, uint32_t shards);
GR_API uint32_t gr_proto_dense_slot(const char *name, size_t len);

/* ---- Sync jobs (SYNC_CONFIG, SYNC_ACQUIRE, PUSH_STEP, SYNC_LEAVE; docs/protocol.md). ---- */

/* Modes, as on the wire: the core's gr_sync_mode values. */
#define GR_PROTO_SYNC_ASYNC GR_SYNC_ASYNC
#define GR_PROTO_SYNC_SYNC GR_SYNC_SYNC
#define GR_PROTO_SYNC_SEMISYNC GR_SYNC_SEMISYNC
#define GR_PROTO_SYNC_SSP GR_SYNC_SSP
/* SYNC_CONFIG flags. */
#define GR_PROTO_SYNC_RESET 1u /* drop the current job (waiters fail), then install this one */
#define GR_PROTO_SYNC_CLEAR 2u /* drop the current job and install nothing */

/* SYNC_CONFIG request body (24 bytes): u32 mode, u32 workers, u32 aggregate, u32 staleness,
 * u32 flags, u32 dense_lag (sync: how many steps a step may start before the ones before it
 * are applied, docs/sync.md; 0 = lock-step, what older clients send); with an owner (owner != 0) the body goes on: u64 owner,
 * u64 started_ms, u32 label_len (<= GR_PROTO_SYNC_LABEL_MAX), u32 reserved (0), the label's
 * bytes, zero padding to 8. A body without an owner is the 24-byte form older clients send. */
#define GR_PROTO_SYNC_LABEL_MAX 127
typedef struct gr_proto_sync_config {
    uint32_t mode, workers, aggregate, staleness, flags;
    uint32_t dense_lag; /* sync only: steps may start L ahead of the applied step (0: none) */
    uint32_t label_len; /* bytes of label (the decoder sets it; the encoder uses strlen) */
    /* Who runs the job: a trainer's random id (0: nobody said), when it started (unix ms) and
     * a label for people ("host:pid"). A shard refuses a second owner's job. */
    uint64_t owner, started_ms;
    char label[GR_PROTO_SYNC_LABEL_MAX + 1];
} gr_proto_sync_config;
GR_API int gr_proto_put_sync_config(gr_proto_buf *b, const gr_proto_sync_config *c);
GR_API int gr_proto_decode_sync_config(const void *body, size_t len, gr_proto_sync_config *out);

/* SYNC_ACQUIRE request body (16 bytes): u32 worker, u32 timeout_ms, u64 step. */
typedef struct gr_proto_sync_acquire {
    uint32_t worker, timeout_ms;
    uint64_t step;
} gr_proto_sync_acquire;
GR_API int gr_proto_put_sync_acquire(gr_proto_buf *b, const gr_proto_sync_acquire *a);
GR_API int gr_proto_decode_sync_acquire(const void *body, size_t len, gr_proto_sync_acquire *out);

/* SYNC_LEAVE request body (8 bytes): u32 worker, u32 reserved (0). */
GR_API int gr_proto_decode_sync_leave(const void *body, size_t len, uint32_t *worker);

/* The replies of SYNC_CONFIG, SYNC_ACQUIRE, PUSH_STEP and SYNC_LEAVE are one pair (16 bytes):
 * u64 a, u64 b (what each means: docs/protocol.md). */
GR_API int gr_proto_put_pair(gr_proto_buf *b, uint64_t first, uint64_t second);
GR_API int gr_proto_decode_pair(const void *body, size_t len, uint64_t *a, uint64_t *b);

/* PUSH_STEP request body: u32 worker, u32 ndense, u64 step, u64 batch_len, then batch_len
 * bytes of a KEYS_VALUES batch (0: no sparse sections), then ndense dense parts, each: str
 * name, u64 size, f32 grad[size], zero pad to 8. */
typedef struct gr_proto_dense_part {
    const char *name; /* into the body, not NUL-terminated */
    uint32_t name_len;
    uint64_t size;
    const float *values;
} gr_proto_dense_part;

typedef struct gr_proto_push_step {
    uint32_t worker;
    uint64_t step;
    gr_proto_batch batch;       /* ntables 0 when the push carries no sparse sections */
    uint32_t ndense;
    gr_proto_dense_part *dense; /* malloc'd; gr_proto_push_step_fini frees */
} gr_proto_push_step;

/* Writes the 24-byte PUSH_STEP prefix; batch_len must be the exact size of the batch that
 * follows (gr_proto_put_batch_head + sections), 0 for none. */
GR_API int gr_proto_put_push_step_head(gr_proto_buf *b, uint32_t worker, uint32_t ndense,
                                       uint64_t step, uint64_t batch_len);
/* Appends one dense part. */
GR_API int gr_proto_put_dense_part(gr_proto_buf *b, const char *name, const float *values,
                                   uint64_t size);
/* Decodes a PUSH_STEP body (8-byte aligned) with the same checks as the batch decoder; on
 * failure nothing is allocated. */
GR_API int gr_proto_decode_push_step(const void *body, size_t len, const gr_proto_limits *lim,
                                     gr_proto_push_step *out);
GR_API void gr_proto_push_step_fini(gr_proto_push_step *p);

/* ---- Serving (SUBSCRIBE on training shards; PREDICT and LOOKUP on replicas) ---- */

#define GR_PROTO_SUB_F16 1u /* SUBSCRIBE: row values as IEEE half floats */

/* SUBSCRIBE request (32 bytes): u64 epoch, u64 since, u32 wait_ms, u32 flags, u32 from_slot,
 * u32 reserved (0). epoch and since name the last publication the replica applied from this
 * shard (0, 0: none); from_slot > 0 asks for the next page of the snapshot at publication
 * `since`, starting at that slot. */
typedef struct gr_proto_subscribe {
    uint64_t epoch, since;
    uint32_t wait_ms, flags;
    uint32_t from_slot;
} gr_proto_subscribe;
GR_API int gr_proto_put_subscribe(gr_proto_buf *b, const gr_proto_subscribe *s);
GR_API int gr_proto_decode_subscribe(const void *body, size_t len, gr_proto_subscribe *out);

enum { GR_PROTO_PUB_NONE = 0, GR_PROTO_PUB_DELTA = 1, GR_PROTO_PUB_SNAPSHOT = 2 };

/* SUBSCRIBE reply, a publication: u64 epoch, u64 seq, u64 version, u32 kind, u32 shard,
 * u32 nsparse, u32 ndense, u32 f16, u32 next_slot (a snapshot page: the slot the next page
 * starts at, 0 when this page ends the snapshot; 0 otherwise); nsparse sections, each u32 table,
 * u32 dim, u32 n, u32 reserved (0), u64 keys[n], values[n*dim] (f32, or f16 when f16 is 1),
 * pad to 8; then ndense dense parts as in PUSH_STEP (str name, u64 size, f32 values, pad). */
typedef struct gr_proto_pub_section {
    uint32_t table, dim, n;
    const uint64_t *keys;
    const void *values; /* float or uint16_t (f16) */
} gr_proto_pub_section;

typedef struct gr_proto_publication {
    uint64_t epoch, seq, version;
    uint32_t kind, shard, f16;
    uint32_t nsparse, ndense;
    uint32_t next_slot;
    gr_proto_pub_section *sparse; /* malloc'd; gr_proto_publication_fini frees */
    gr_proto_dense_part *dense;   /* malloc'd */
} gr_proto_publication;

/* Writes the 48-byte head of a publication. */
GR_API int gr_proto_put_pub_head(gr_proto_buf *b, const gr_proto_publication *p);
/* Appends a section's header and reserves its arrays (values: n*dim f32, or f16 when f16). */
GR_API int gr_proto_put_pub_section(gr_proto_buf *b, uint32_t table, uint32_t dim, uint32_t n,
                                    bool f16, uint64_t **keys, void **values);
/* Decodes a publication (8-byte aligned body): counts checked against lim (sections against
 * max_tables, keys against max_keys), dims against GR_PROTO_DIM_MAX, every length against the
 * body. On failure nothing is allocated. */
GR_API int gr_proto_decode_publication(const void *body, size_t len, const gr_proto_limits *lim,
                                       gr_proto_publication *out);
GR_API void gr_proto_publication_fini(gr_proto_publication *p);

/* PREDICT request: u32 n, u32 ndense, u32 nsparse, u32 reserved (0), f32 dense[n*ndense]
 * (model inputs, already transformed), pad to 8, u64 ids[n*nsparse] (feature ids). Reply:
 * u64 model_version, u32 n, u32 reserved (0), f32 probs[n], pad to 8. */
typedef struct gr_proto_predict {
    uint32_t n, ndense, nsparse;
    const float *dense;
    const uint64_t *ids;
} gr_proto_predict;
GR_API int gr_proto_put_predict(gr_proto_buf *b, const gr_proto_predict *p);
/* n * (ndense + nsparse) is checked against lim->max_keys. */
GR_API int gr_proto_decode_predict(const void *body, size_t len, const gr_proto_limits *lim,
                                   gr_proto_predict *out);
GR_API int gr_proto_put_predict_reply(gr_proto_buf *b, uint64_t version, const float *probs,
                                      uint32_t n);
GR_API int gr_proto_decode_predict_reply(const void *body, size_t len, uint64_t *version,
                                         const float **probs, uint32_t *n);
/* LOOKUP uses the batch layouts: a KEYS request, a VALUES reply. */

/* ---- Checkpoints (CKPT_SAVE, CKPT_COMMIT, CKPT_LOAD; docs/protocol.md, docs/checkpoints.md) ----
 * Paths name the shard's own filesystem. Strings point into the decoded body (not
 * NUL-terminated); the decoders check lengths, padding and flags, not what the paths mean. */

typedef struct gr_proto_strv {
    const char *p; /* into the body (decode) or the caller's string (encode); may be NULL if n 0 */
    uint32_t n;
} gr_proto_strv;

#define GR_PROTO_CKPT_INCREMENTAL 1u /* CKPT_SAVE: write a delta when the shard's saver allows */
#define GR_PROTO_CKPT_RESOLVE 1u     /* CKPT_LOAD: only say which checkpoint it would load */

/* CKPT_SAVE request: u64 step, u32 flags, i32 zstd_level, u32 full_every, u32 reserved (0),
 * str root, str name, str parent. */
typedef struct gr_proto_ckpt_save {
    uint64_t step;
    uint32_t flags;
    int32_t zstd_level; /* 0..19 */
    uint32_t full_every;
    gr_proto_strv root, name, parent; /* parent: "" for none */
} gr_proto_ckpt_save;
GR_API int gr_proto_put_ckpt_save(gr_proto_buf *b, const gr_proto_ckpt_save *s);
GR_API int gr_proto_decode_ckpt_save(const void *body, size_t len, const gr_proto_limits *lim,
                                     gr_proto_ckpt_save *out);

/* CKPT_SAVE reply (56 bytes): u32 kind (0 full, 1 delta), u32 ndense, u64 rows, u64 bytes,
 * u64 checksum, u64 usec, u64 sync_step, u64 sync_job (1 when a sync job is installed). */
typedef struct gr_proto_ckpt_saved {
    uint32_t kind, ndense;
    uint64_t rows, bytes, checksum, usec;
    uint64_t sync_step; /* the shard's step G when sync_job is 1 */
    uint64_t sync_job;
} gr_proto_ckpt_saved;
GR_API int gr_proto_put_ckpt_saved(gr_proto_buf *b, const gr_proto_ckpt_saved *s);
GR_API int gr_proto_decode_ckpt_saved(const void *body, size_t len, gr_proto_ckpt_saved *out);

/* CKPT_COMMIT request: u32 shards, u32 keep, str root, str name, str parent, str meta (JSON
 * written beside the manifest, "" for none). */
typedef struct gr_proto_ckpt_commit {
    uint32_t shards, keep;
    gr_proto_strv root, name, parent, meta;
} gr_proto_ckpt_commit;
GR_API int gr_proto_put_ckpt_commit(gr_proto_buf *b, const gr_proto_ckpt_commit *c);
GR_API int gr_proto_decode_ckpt_commit(const void *body, size_t len, const gr_proto_limits *lim,
                                       gr_proto_ckpt_commit *out);

/* CKPT_COMMIT reply (16 bytes): u64 step, u32 kind, u32 deleted (checkpoints retention
 * removed). */
typedef struct gr_proto_ckpt_committed {
    uint64_t step;
    uint32_t kind, deleted;
} gr_proto_ckpt_committed;
GR_API int gr_proto_put_ckpt_committed(gr_proto_buf *b, const gr_proto_ckpt_committed *c);
GR_API int gr_proto_decode_ckpt_committed(const void *body, size_t len,
                                          gr_proto_ckpt_committed *out);

/* CKPT_LOAD request: u32 flags, u32 reserved (0), str root, str name ("" = root itself when it
 * is a checkpoint, else the newest complete checkpoint under root). */
typedef struct gr_proto_ckpt_load {
    uint32_t flags;
    gr_proto_strv root, name;
} gr_proto_ckpt_load;
GR_API int gr_proto_put_ckpt_load(gr_proto_buf *b, const gr_proto_ckpt_load *l);
GR_API int gr_proto_decode_ckpt_load(const void *body, size_t len, const gr_proto_limits *lim,
                                     gr_proto_ckpt_load *out);

/* CKPT_LOAD reply: u64 step, u64 rows_loaded, u64 rows_read, u64 usec, u32 shards (of the
 * checkpoint), u32 tables (loaded on this shard, dense included), str name (the checkpoint
 * directory's name), str meta (its metadata JSON, "" when none). */
typedef struct gr_proto_ckpt_loaded {
    uint64_t step, rows_loaded, rows_read, usec;
    uint32_t shards, tables;
    gr_proto_strv name, meta;
} gr_proto_ckpt_loaded;
GR_API int gr_proto_put_ckpt_loaded(gr_proto_buf *b, const gr_proto_ckpt_loaded *l);
GR_API int gr_proto_decode_ckpt_loaded(const void *body, size_t len, const gr_proto_limits *lim,
                                       gr_proto_ckpt_loaded *out);

/* Error response: header status < 0, body = str message. Encodes a whole frame. */
GR_API int gr_proto_put_error(gr_proto_buf *b, uint16_t op, uint64_t id, int status,
                              const char *msg);

#endif
