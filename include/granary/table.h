/* granary table: the in-memory embedding store every other part stands on.
 *
 * A table maps uint64 keys to rows without collisions. A row holds `dim` weights, the
 * optimizer's state for them and 8 bytes of metadata. Tables are partitioned: each partition
 * has its own lock, hash index and row arena, so lookups and applies from many threads run in
 * parallel and growth rehashes one partition at a time (never the whole table).
 *
 * All functions are thread-safe unless noted; gr_table_destroy must not race with anything.
 * Errors: functions return 0 or a negative gr_err and set gr_errmsg(). */
#ifndef GRANARY_TABLE_H
#define GRANARY_TABLE_H

#include "granary/core.h"

#define GR_TABLE_NAME_MAX 64
#define GR_TABLE_DIM_MAX 1024
#define GR_TABLE_TRACKERS 4 /* independent dirty-row trackers per table */

typedef enum { GR_DTYPE_F32 = 0, GR_DTYPE_F16 = 1 } gr_dtype;

typedef enum {
    GR_INIT_ZEROS = 0,
    GR_INIT_CONSTANT = 1,
    GR_INIT_UNIFORM = 2,      /* uniform in [low, high) */
    GR_INIT_TRUNC_NORMAL = 3, /* normal(mean, stddev) redrawn outside mean +- 2 stddev */
} gr_init_kind;

typedef enum {
    GR_OPT_SGD = 0,             /* w -= lr * g */
    GR_OPT_ADAGRAD = 1,         /* a += g*g; w -= lr * g / (sqrt(a) + eps), per element */
    GR_OPT_ROWWISE_ADAGRAD = 2, /* a += mean(g*g) over the row; w -= lr * g / (sqrt(a) + eps) */
    GR_OPT_ADAM = 3,            /* per-row step count t; bias-corrected m and v */
    GR_OPT_FTRL = 4,            /* FTRL-proximal (McMahan et al. 2013), per element z and n */
} gr_opt_kind;

/* What an update does when its result would not be finite (a weight or optimizer state value
 * that overflows to inf, or becomes NaN; for f16 storage, a weight outside +-65504). The
 * gradients themselves are always checked first (non-finite gradients: GR_EINVAL, nothing in
 * the batch applied); this is about finite gradients with a non-finite result, e.g. SGD lr 1
 * pushed 3e38 twice, or an Adagrad accumulator overflowed by a gradient of 1e20. */
typedef enum {
    GR_NONFINITE_REJECT = 0, /* the row is left exactly as it was and counted (stats
                                nonfinite_rejected); the batch's other rows are applied and
                                gr_table_apply returns GR_EINVAL naming the first such key */
    GR_NONFINITE_CLIP = 1,   /* the update is applied with every inf clamped to the largest
                                finite value of the storage type (same sign) and every NaN
                                element left at its previous value; counted (nonfinite_clipped) */
} gr_nonfinite;

typedef struct gr_init_spec {
    gr_init_kind kind;
    float value;        /* constant */
    float low, high;    /* uniform */
    float mean, stddev; /* truncated normal */
} gr_init_spec;

typedef struct gr_opt_spec {
    gr_opt_kind kind;
    float lr;                  /* all; FTRL's alpha */
    float eps;                 /* adagrad, rowwise adagrad, adam */
    float initial_accumulator; /* adagrad, rowwise adagrad */
    float beta1, beta2;        /* adam */
    float l1, l2, beta;        /* ftrl (beta is FTRL's smoothing term) */
} gr_opt_spec;

typedef struct gr_table_spec {
    char name[GR_TABLE_NAME_MAX]; /* [A-Za-z0-9_.-]+, NUL-terminated */
    uint32_t id;                  /* numeric id used on the wire */
    uint32_t dim;                 /* 1..GR_TABLE_DIM_MAX */
    gr_dtype dtype;               /* storage type of weights; state is always f32 */
    uint64_t seed;                /* initializer seed */
    gr_init_spec init;
    gr_opt_spec opt;
    /* Admission: a missing key gets storage only once it has been looked up at least
     * min_count times (counted in a count-min sketch; 0 or 1 admits at once), and then
     * with probability `probability` (1 = always; decided per key, deterministically). Keys not
     * admitted read the default row (zeros) and their gradients are dropped and counted. */
    uint32_t admit_min_count;
    float admit_probability;
    /* Eviction: rows not updated for ttl_s seconds go at gr_table_evict_expired(); with
     * capacity > 0, inserting into a full table evicts a cold row (sampled LRU). 0 = off. */
    uint64_t ttl_s;
    uint64_t capacity;
    uint64_t mem_limit; /* bytes for rows + index; 0 = unlimited */
    uint32_t partitions; /* power of two; 0 = default (256) */
    gr_nonfinite nonfinite; /* JSON "nonfinite": "reject" (default) or "clip" */
} gr_table_spec;

/* Row metadata, as the table keeps it. */
typedef struct gr_row_meta {
    uint32_t last_update; /* table clock (seconds) of the last apply or insert */
    uint32_t hits;        /* lookups + applies, saturating at UINT32_MAX - 1; exact below
                             64, above an unbiased estimate (lookups count probabilistically,
                             docs/table.md "Hit counts") */
} gr_row_meta;

typedef struct gr_table_stats {
    uint64_t rows;
    uint64_t bytes;           /* rows + index + trackers, as allocated */
    uint64_t row_bytes;       /* bytes of one row: weights + state + metadata */
    uint64_t payload_bytes;   /* per row: weights + optimizer state only */
    double bytes_per_row;     /* bytes / rows */
    uint64_t hits, misses;    /* lookups of present / missing keys */
    uint64_t admits, rejects; /* missing keys given storage / refused by admission */
    uint64_t evictions;       /* capacity evictions */
    uint64_t expirations;     /* TTL evictions */
    uint64_t applies;         /* gradient rows applied */
    uint64_t nonfinite_rejected; /* row updates refused: the result would not be finite */
    uint64_t nonfinite_clipped;  /* row updates applied clipped (nonfinite = clip) */
    uint64_t mem_limit;
} gr_table_stats;

typedef struct gr_table gr_table;

/* What a table of this spec will hold at `rows` rows, by the engine's own accounting: the
 * `bytes` gr_table_get_stats reports (rows in whole chunks per partition, their tracker bits,
 * the index at its load factor, the fixed structs), expected over how keys spread across
 * partitions (a Poisson count per partition). For capacity planning (`granary plan`). */
typedef struct gr_table_estimate {
    uint64_t rows;          /* rows held: the given count, capped by the spec's capacity */
    uint64_t bytes;         /* expected gr_table_stats.bytes */
    uint64_t row_bytes;     /* one row: weights + state + metadata (the stride) */
    uint64_t payload_bytes; /* one row: weights + optimizer state */
    double bytes_per_row;   /* bytes / rows */
} gr_table_estimate;
/* The optimizer's name as specs spell it ("adagrad", ...; "unknown" out of range). */
GR_API const char *gr_table_opt_name(gr_opt_kind kind);
/* GR_EINVAL (from gr_table_spec_validate) for a bad spec. */
GR_API int gr_table_estimate_bytes(const gr_table_spec *spec, uint64_t rows,
                                   gr_table_estimate *out);

/* Fills spec with defaults for a table (f32, zeros init, SGD lr 0.01, admit all, no
 * eviction, no cap). */
GR_API void gr_table_spec_default(gr_table_spec *spec, const char *name, uint32_t dim);
/* Checks every field; GR_EINVAL with a message naming the field. */
GR_API int gr_table_spec_validate(const gr_table_spec *spec);
/* Floats of optimizer state per row for this spec (adagrad: dim, adam: 2*dim+1, ...). */
GR_API uint32_t gr_table_state_floats(const gr_table_spec *spec);
/* True when two specs describe the same table (every field equal). */
GR_API bool gr_table_spec_equal(const gr_table_spec *a, const gr_table_spec *b);

/* JSON form of one table spec, e.g.
 *   {"name":"user","id":1,"dim":16,"dtype":"f32","seed":7,
 *    "init":{"kind":"uniform","low":-0.05,"high":0.05},
 *    "optimizer":{"kind":"adagrad","lr":0.05,"eps":1e-8,"initial_accumulator":0.0},
 *    "admit":{"min_count":2,"probability":1.0},
 *    "evict":{"ttl_s":86400,"capacity":1000000},"mem_limit":"4G","partitions":256}
 * Missing fields take the defaults above. Unknown fields are errors. */
GR_API int gr_table_spec_from_json(const char *json, gr_table_spec *spec);
/* A document {"tables":[spec, ...]} (or a bare array): allocates *specs (free() it). */
GR_API int gr_table_specs_from_json(const char *json, gr_table_spec **specs, size_t *n);
/* Serialises a spec; returns a malloc'd string the caller frees, or NULL on out of memory. */
GR_API char *gr_table_spec_to_json(const gr_table_spec *spec);

/* Creates an empty table from a validated copy of spec. */
GR_API int gr_table_create(const gr_table_spec *spec, gr_table **out);
/* Frees the table and all rows. NULL is a no-op. */
GR_API void gr_table_destroy(gr_table *t);
/* The table's spec; valid for the table's lifetime. */
GR_API const gr_table_spec *gr_table_get_spec(const gr_table *t);

#define GR_LOOKUP_READONLY GR_READONLY /* missing keys read the default row; nothing is created */

/* Gathers the rows of n keys into out (n * dim floats, row i at out + i*dim). Missing keys
 * are created by the initializer (subject to admission) unless GR_LOOKUP_READONLY; keys not
 * stored read zeros. Duplicated keys are fine. GR_ENOMEM when the memory cap stops a row
 * from being created (rows before it in the batch are filled and stay created; the rest of
 * the batch is still served, keys that could not be created reading zeros). */
GR_API int gr_table_lookup(gr_table *t, const uint64_t *keys, size_t n, float *out,
                           unsigned flags);

/* Applies n gradient rows (grads: n * dim floats) with the table's optimizer. Each row is one
 * optimizer step for its key; a key repeated in the batch gets one step per occurrence (sum
 * duplicates first, with gr_dedup, for the usual semantics). Missing keys are created by the
 * initializer first, subject to admission; gradients for keys not admitted are dropped and
 * counted as rejects. Non-finite gradients are GR_EINVAL and nothing in the batch is applied.
 * A finite gradient whose result would not be finite follows spec.nonfinite (see gr_nonfinite):
 * with "reject", that row is left unchanged, the others are applied and GR_EINVAL names the
 * first such key and how many there were.
 * GR_ENOMEM when the memory cap stops a row from being created: that key's gradient is
 * dropped, every other key is applied. */
GR_API int gr_table_apply(gr_table *t, const uint64_t *keys, size_t n, const float *grads);
/* gr_table_apply where rows refused by the finite policy are not an error: *refused gets how
 * many there were (they are counted in the stats as always). For callers that apply a
 * server-side aggregate (the sync job's steps), where one refused row must not stop the rest
 * of the step. Every other error is as gr_table_apply's. */
GR_API int gr_table_apply_counted(gr_table *t, const uint64_t *keys, size_t n,
                                  const float *grads, size_t *refused);
/* gr_table_apply for a caller that has already checked every gradient of the batch is finite
 * (the server checks a whole request before applying any of it): the same, without reading the
 * gradients a second time. A non-finite gradient passed anyway is not detected as such; its
 * row's result is not finite and follows spec.nonfinite, so the table still stays finite. */
GR_API int gr_table_apply_checked(gr_table *t, const uint64_t *keys, size_t n,
                                  const float *grads);

/* Removes keys; *deleted (may be NULL) gets how many were present. */
GR_API int gr_table_delete(gr_table *t, const uint64_t *keys, size_t n, size_t *deleted);

/* Writes whole rows (for restore and resharding): weights (n * dim), optimizer state
 * (n * gr_table_state_floats, or NULL for the initial state) and metadata (n, or NULL for
 * "now, 0 hits"). Replaces existing rows. Bypasses admission; honours the memory cap. */
GR_API int gr_table_insert(gr_table *t, const uint64_t *keys, size_t n, const float *weights,
                           const float *state, const gr_row_meta *meta);

/* Whole rows for gr_table_insert_bulk, as gr_table_insert takes them: n keys, weights
 * (n * dim), state (n * gr_table_state_floats, or NULL: the initial state), meta (n, or NULL:
 * "now, 0 hits"), and optionally the keys' table hashes (gr_table_hash_keys; NULL: computed). */
typedef struct gr_table_rows {
    const uint64_t *keys;
    size_t n;
    const float *weights, *state;
    const gr_row_meta *meta;
    const uint64_t *hashes;
} gr_table_rows;

/* The caller has checked every weight and state value of the rows: finite and, for an f16
 * table, within the half-float range (the checkpoint loader does, to name the file). */
#define GR_TABLE_BULK_CHECKED 1u

/* gr_table_insert for filling a table that is not serving yet (a restore), restricted to the
 * rows whose partition belongs to `group` of `groups` (groups 1: every row). The rows are
 * grouped by partition first; each partition's lock is taken once and its index grown once
 * per call, and the table's row count is updated once. Threads that each pass a different
 * group of the same `groups` fill one table together without waiting for each other, and
 * every key always falls in the same group, so rows of one key are written in the order the
 * calls give them, as with gr_table_insert. Tables with a capacity take gr_table_insert's
 * path (it evicts). Errors as gr_table_insert's: unless flags has GR_TABLE_BULK_CHECKED, every
 * row of the batch is checked (whatever its group) before any is written, so each group's call
 * refuses the same batch; GR_EINVAL for group >= groups. */
GR_API int gr_table_insert_bulk(gr_table *t, const gr_table_rows *rows, uint32_t group,
                                uint32_t groups, unsigned flags);
/* The table's hashes of n keys into out (n entries), for gr_table_rows.hashes: computed once,
 * they serve every group's call. */
GR_API void gr_table_hash_keys(const gr_table *t, const uint64_t *keys, size_t n, uint64_t *out);
/* Grows every partition's index to hold its share of `rows` more rows (with a margin for
 * uneven spread), so that a restore of that many rows does not rehash as it fills. Memory is
 * counted as the index's own growth would count it. */
GR_API int gr_table_reserve(gr_table *t, uint64_t rows);
/* Prepares a new, empty table for a fill of about `rows` rows (a standby waiting to restore a
 * shard, docs/coord.md "Warm standby"): commits the row arena, its bitsets and one index
 * region for that many rows, as gr_table_reserve and the bulk insert will use them, and has
 * the kernel hand out their pages now (MADV_POPULATE_WRITE, or a write per page), so the fill
 * writes into memory that is already mapped and zeroed. Nothing the table shows changes:
 * rows, `bytes` and every row are those of a table that was not prepared, and a fill larger
 * than prepared carries on as usual. The memory is held until the table is destroyed
 * (gr_table_prefault_bytes says how much). GR_EINVAL unless the table is empty and was not
 * prepared or filled before; GR_ENOMEM when the kernel has not the memory (the table stays
 * usable). */
GR_API int gr_table_prefault(gr_table *t, uint64_t rows);
/* As gr_table_prefault, but asks stop(arg) between pieces of 32 MiB and returns at once when
 * it says true: the table is then usable and partly prepared (a standby whose job just lost a
 * shard must not finish a preparation before it claims it). *stopped says which. */
GR_API int gr_table_prefault_until(gr_table *t, uint64_t rows, bool (*stop)(void *arg),
                                   void *arg, bool *stopped);
GR_API uint64_t gr_table_prefault_bytes(const gr_table *t);
/* For a table that grows while it serves (rows created by lookups and applies): has the
 * kernel hand out now the row memory the next rows will take, up to `ahead` bytes past the
 * slots already carved, so the first store to a new row does not take the page fault (a huge
 * page fresh from a VM's host costs milliseconds: docs/table.md, "Row creation while
 * training"). Meant for a thread that would otherwise be idle (the shard's grow thread,
 * docs/server.md): the fault's cost moves there, off the request that creates the row. Memory
 * already handed out is not asked for again, and a table without rows is left alone. Safe
 * while other threads create rows. Nothing the table shows changes (rows, `bytes`, values).
 * *bytes: what this call had handed out (0: nothing to do). GR_ENOMEM when the kernel has
 * not the memory (the table stays usable). */
GR_API int gr_table_prefault_ahead(gr_table *t, size_t ahead, uint64_t *bytes);
/* The bytes gr_table_prefault_ahead had handed out over the table's life. */
GR_API uint64_t gr_table_ahead_bytes(const gr_table *t);
/* Row memory is committed on huge pages by default (fewer TLB misses on random row access). A
 * table that lives for one short run and keeps growing (the trainer's embedded shards) may pay
 * more for them: on a VM whose host backs memory lazily, a fresh 2 MiB page cost 2.5-3.7 ms
 * per MiB measured against 0.5-1 ms on 4 KiB pages (docs/table.md, "Huge pages for the first
 * rows only"). With `bytes` > 0, row memory from that offset on (rounded up to 2 MiB) is
 * committed on 4 KiB pages from now on: the rows created first, which a skewed workload touches
 * most, keep the huge pages. 0 puts every row on huge pages again (the default). Pages already
 * committed keep what they have. Values and everything else the table shows are the same. */
GR_API void gr_table_set_huge_rows(gr_table *t, uint64_t bytes);

/* Reads whole rows without creating or counting anything: weights, state (may be NULL) and
 * meta (may be NULL) for each key; found[i] (may be NULL) says whether key i is present
 * (absent rows read zeros). */
GR_API int gr_table_get(gr_table *t, const uint64_t *keys, size_t n, float *weights,
                        float *state, gr_row_meta *meta, bool *found);

/* Scan callback: called once per row with pointers valid only during the call (weights are
 * f32 even for f16 storage). It runs under a partition lock and must not call into the same
 * table. Return 0 to continue, anything else to stop the scan (gr_table_scan returns it). */
typedef int (*gr_table_scan_fn)(void *ctx, uint64_t key, const float *weights,
                                const float *state, const gr_row_meta *meta);

/* Visits every row, one partition at a time (each partition locked only while it is read). */
GR_API int gr_table_scan(gr_table *t, gr_table_scan_fn fn, void *ctx);

/* Dirty tracking. Each tracker (0..GR_TABLE_TRACKERS-1, e.g. 0 = checkpoints, 1 = serving)
 * remembers which rows were applied to or inserted since that tracker's last dirty scan.
 * gr_table_scan_dirty visits those rows and clears their marks atomically with the read
 * (under the partition lock), so no update is lost between scans. A row deleted or evicted
 * after being marked is not visited. */
GR_API int gr_table_scan_dirty(gr_table *t, unsigned tracker, gr_table_scan_fn fn, void *ctx);
/* Rows currently marked dirty for a tracker. */
GR_API uint64_t gr_table_dirty_count(gr_table *t, unsigned tracker);

/* The table clock (seconds) used for last_update and TTL. By default seconds since the table
 * was created; gr_table_set_clock pins it to a value (tests, step-driven TTL); 0 unpins it. */
GR_API uint32_t gr_table_clock(const gr_table *t);
GR_API void gr_table_set_clock(gr_table *t, uint32_t now);

/* Removes rows whose last update is more than ttl_s before the table clock; works one
 * partition at a time, holding each lock for a bounded slice of slots (well under 1 ms).
 * *evicted (may be NULL) gets the count. No-op when ttl_s is 0. */
GR_API int gr_table_evict_expired(gr_table *t, uint64_t *evicted);

GR_API void gr_table_get_stats(gr_table *t, gr_table_stats *st);

#endif
