/* granary serve: a serving replica. It holds a weights-only copy of the embedding tables and
 * the dense model, answers scoring (predict) and lookup requests over HTTP/JSON and the binary
 * protocol, and applies the rows and dense parameters that training shards publish while it
 * serves (docs/serving.md).
 *
 * Concurrency: every call here may run from many threads at once. Applying a publication
 * locks one partition of one table for one row at a time, so a reader never waits for a whole
 * delta; a predict takes one reference on the current dense parameters, so a request sees one
 * consistent dense version however many publications land meanwhile.
 *
 * Errors: 0 or a negative gr_err with gr_errmsg() naming what was wrong. Nothing aborts. */
#ifndef GRANARY_SERVE_H
#define GRANARY_SERVE_H

#include "granary/core.h"
#include "granary/proto.h"
#include "granary/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gr_serve gr_serve;

typedef struct gr_serve_config {
    /* The model: either the saved model in model_dir (a checkpoint root, one checkpoint or an
     * export; its metadata gives the model kind and shapes), or model (shapes only; rows and
     * dense parameters then come from the training shards). */
    const char *model_dir;
    const gr_model_config *model;
    /* Training shards to subscribe to ("host:port,..."), or NULL: serve the model as loaded. */
    const char *from;
    const char *auth_file;      /* with from: the shards' shared secret, or NULL */
    bool f16;                   /* ask the shards for rows as half floats */
    uint32_t poll_wait_ms;      /* how long one subscription poll may be parked; 0 = 1000 */
    const char *http;           /* "HOST:PORT" of the HTTP API, or NULL for none */
    const char *listen;         /* "HOST:PORT" of the binary protocol, or NULL for none */
    unsigned threads;           /* HTTP handler threads; 0 = 4 */
    unsigned slice_us;          /* time slice the handler threads ask for (gr_thread_set_slice_us:
                                   a request's thread then runs ahead of threads on the
                                   kernel's default slice); 0 = the default slice */
    size_t max_body;            /* HTTP and binary request bodies; 0 = 8 MiB */
    size_t conn_memory;         /* HTTP: per-connection memory, where request headers must fit
                                   (gr_http_config.conn_memory); 0 = 8 KiB */
    uint32_t max_batch;         /* examples in one predict; 0 = 10000 */
    bool coalesce;              /* HTTP: the one-example predicts a handler thread reads in
                                   one pass are scored together (gr_serve_predict_each: one
                                   pass over the weights, each score what it gets alone).
                                   Off by default: no gain measured on 2 cores (serving.md) */
} gr_serve_config;

GR_API void gr_serve_config_default(gr_serve_config *cfg);

/* Builds the replica (loads model_dir when given), not yet serving. GR_EINVAL names a bad
 * setting; loading errors are the loader's. */
GR_API int gr_serve_create(const gr_serve_config *cfg, gr_serve **out);
/* Starts the HTTP server, the binary listener and the subscriptions that cfg asks for. */
GR_API int gr_serve_start(gr_serve *s);
/* Stops everything started and frees the replica. NULL is a no-op. */
GR_API void gr_serve_destroy(gr_serve *s);

/* Bound ports (useful with port 0); 0 when that face is not running. */
GR_API uint16_t gr_serve_http_port(const gr_serve *s);
GR_API uint16_t gr_serve_port(const gr_serve *s);

GR_API const gr_model *gr_serve_model(const gr_serve *s);

/* Click probabilities of n examples: dense[n * GR_CRITEO_DENSE] model inputs (as
 * gr_criteo_parse_line makes them), ids[n * GR_CRITEO_SPARSE] feature ids. Missing rows read
 * zeros, as the trainer's evaluation reads them. *version (may be NULL): the model version
 * the request was scored with (newest publication applied when it started). */
GR_API int gr_serve_predict(gr_serve *s, size_t n, const float *dense, const uint64_t *ids,
                            float *probs, uint64_t *version);
/* n one-example requests scored together: probs[i] is bitwise what gr_serve_predict gives
 * example i alone (the model's layers read once for several examples, gr_model_predict_each);
 * counted as n predicts. */
GR_API int gr_serve_predict_each(gr_serve *s, size_t n, const float *dense, const uint64_t *ids,
                                 float *probs, uint64_t *version);
/* Rows of n keys of a table (by id) into out (n * dim); found (may be NULL) per key. GR_ENOENT
 * for an unknown table. */
GR_API int gr_serve_lookup(gr_serve *s, uint32_t table, const uint64_t *keys, size_t n,
                           float *out, bool *found);
/* The table's id and dim by name (GR_ENOENT when the replica has none of that name). */
GR_API int gr_serve_table_find(gr_serve *s, const char *name, uint32_t *id, uint32_t *dim);

/* Applies one decoded publication of training shard `shard` (what a subscription does with
 * each SUBSCRIBE reply; tests call it directly): a row is written only when the publication's
 * version is newer than the version of the replica's copy, a dense parameter likewise, so
 * replays and reordering are harmless. Counts rows applied and ignored. */
GR_API int gr_serve_apply(gr_serve *s, const gr_proto_publication *p);
/* Replaces the dense parameters with these values at this version (ignored when not newer). */
GR_API int gr_serve_set_dense(gr_serve *s, const float *params, size_t n, uint64_t version);
/* Writes rows of a table (created with that dim when the replica has no table of that id) at
 * a version, with the same rule as gr_serve_apply. */
GR_API int gr_serve_put_rows(gr_serve *s, uint32_t table, uint32_t dim, const uint64_t *keys,
                             size_t n, const float *rows, uint64_t version);

/* Stops applying publications (the subscriptions end); the replica keeps serving the model it
 * has. For a frozen reference model beside a live one, and before maintenance. */
GR_API void gr_serve_freeze(gr_serve *s);

/* Writes f as JSON: the 9 significant digits that read back as exactly f (as %.9g, without
 * printf; plain decimals from 1e-5 to 1e9, else d.ddde-X), "-0" for a negative zero, "null"
 * for NaN and infinities. Returns the length; no NUL is written. The replica's predict replies
 * and the benchmark's Redis-backed baseline share it. */
#define GR_SERVE_FLOAT_CHARS 16
GR_API size_t gr_serve_format_float(float f, char out[GR_SERVE_FLOAT_CHARS]);

/* Parses a POST /v1/predict body (either form, docs/serving.md) into model inputs: *n
 * examples, *dense (n * GR_CRITEO_DENSE) and *ids (n * GR_CRITEO_SPARSE), both malloc'd (free
 * them). More than max examples is GR_ETOOBIG. On error err (errlen bytes) says what was
 * wrong ("example 2: has 12 fields, expected 39 ..."). The HTTP API and the benchmark's
 * Redis-backed baseline share it. */
GR_API int gr_serve_parse_predict(const char *body, size_t len, uint32_t max, size_t *n,
                                  float **dense, uint64_t **ids, char *err, size_t errlen);

typedef struct gr_serve_stats {
    uint64_t model_version;        /* newest version applied (publication or load) */
    uint64_t dense_version;
    uint64_t publications;         /* applied */
    uint64_t rows_applied, rows_ignored; /* rows written / skipped as not newer */
    uint64_t last_apply_wall_ns;   /* wall clock of the newest application (0: none) */
    uint64_t predicts, predict_examples, lookups, errors;
    uint64_t coalesced_runs;       /* HTTP: runs of parked one-example predicts */
    uint64_t coalesced_requests;   /* the requests those runs answered (/ runs: the mean batch) */
    uint64_t rows;                 /* rows held, all tables */
    uint32_t tables;
    uint32_t shards_connected;     /* subscriptions whose last poll succeeded */
} gr_serve_stats;
GR_API void gr_serve_get_stats(gr_serve *s, gr_serve_stats *st);

#ifdef __cplusplus
}
#endif
#endif
