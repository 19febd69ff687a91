/* granary train: the training runtime that needs no network. Criteo TSV reader, synthetic
 * data generator, metrics (AUC, logloss), the reference models (logistic regression, DLRM),
 * the backend interface that says where embedding rows and dense parameters live, a local
 * backend over gr_table, and the worker loop with its pipeline.
 *
 * Errors: functions return 0 or a negative gr_err and set gr_errmsg(). Nothing here aborts. */
#ifndef GRANARY_TRAIN_H
#define GRANARY_TRAIN_H

#include "granary/core.h"
#include "granary/metrics.h"
#include "granary/table.h"

#include <stdatomic.h>

/* ------------------------------------------------------------------------------------------ */
/* Criteo TSV layout                                                                           */

#define GR_CRITEO_DENSE 13  /* I1..I13 */
#define GR_CRITEO_SPARSE 26 /* C1..C26 */
#define GR_CRITEO_FIELDS (1 + GR_CRITEO_DENSE + GR_CRITEO_SPARSE)

/* The feature id of categorical value `value` (the 32-bit number its hex spells) in slot
 * 0..25: a fixed 64-bit hash of (slot, value). Two slots never share an id (up to 2^-64). */
GR_API uint64_t gr_criteo_feature_id(unsigned slot, uint32_t value);
/* The id a missing (empty) categorical field of that slot maps to: one fixed id per slot,
 * different from every value's id. */
GR_API uint64_t gr_criteo_missing_id(unsigned slot);

/* Parses one line (without its '\n'; a trailing '\r' is ignored) into label, 13 dense
 * features already transformed log(1 + max(x, 0)) (missing -> 0) and 26 feature ids.
 * GR_ECORRUPT when the line is malformed, with a message naming the field ("field 5 (I4):
 * not an integer: 'x1'"); outputs are then unspecified. */
GR_API int gr_criteo_parse_line(const char *line, size_t len, float *label, float *dense,
                                uint64_t *ids);

/* ------------------------------------------------------------------------------------------ */
/* Data schemas: the layout of any training file (docs/data.md)                                */

/* What a column of the file is. A file has exactly one label column; dense columns become the
 * model's dense features in column order, categorical and list columns its sparse slots (one
 * embedding, or one pooled embedding bag, per column) in column order. */
typedef enum {
    GR_COL_IGNORE = 0,  /* read past, never used */
    GR_COL_LABEL = 1,   /* 0 or 1, in any float syntax ("1", "0.0", "1e0") */
    GR_COL_DENSE = 2,   /* a float in any syntax; empty = missing -> `fill` */
    GR_COL_CATEGORICAL = 3, /* one id: text or an integer of any width; empty = missing */
    GR_COL_LIST = 4,    /* several ids split by `separator`, pooled into one bag */
} gr_col_type;

/* How a categorical value's text is read before it is hashed with its column into a feature
 * id: as bytes (STRING), as a decimal integer of any width (INT: sign and leading zeros do
 * not matter), or hexadecimal (HEX: case and leading zeros do not matter). */
typedef enum { GR_ENC_STRING = 0, GR_ENC_INT = 1, GR_ENC_HEX = 2 } gr_col_encoding;
typedef enum { GR_POOL_SUM = 0, GR_POOL_MEAN = 1 } gr_pooling;
typedef enum { GR_TRANSFORM_NONE = 0, GR_TRANSFORM_LOG1P = 1 } gr_transform;

#define GR_SCHEMA_MAX_COLUMNS 1024
#define GR_SCHEMA_MAX_NAME 64     /* bytes of a column name, with its NUL */
#define GR_SCHEMA_MAX_ITEMS 1024  /* ids a list column keeps per line, at most */
#define GR_SCHEMA_DEFAULT_ITEMS 50

typedef struct gr_schema_column {
    char name[GR_SCHEMA_MAX_NAME];
    gr_col_type type;
    gr_col_encoding encoding; /* categorical and list */
    gr_transform transform;   /* dense: log1p is log(1 + max(x, 0)) */
    float fill;               /* dense: the feature value of an empty field */
    char separator;           /* list: between items */
    gr_pooling pooling;       /* list */
    uint32_t max_items;       /* list: the first max_items items are kept */
    uint32_t index;           /* dense feature / sparse slot number (label, ignore: 0) */
} gr_schema_column;

typedef struct gr_schema gr_schema;

/* The built-in Criteo layout (label, 13 integer, 26 hex columns, tab-separated, no header):
 * the default everywhere a schema may be given, read by the Criteo fast path with its own ids
 * (gr_criteo_feature_id). Never destroyed (gr_schema_destroy ignores it). */
GR_API const gr_schema *gr_schema_criteo(void);
/* Parses a schema from JSON text (docs/data.md): {"delimiter": ",", "header": true,
 * "columns": [{"name": "y", "type": "label"}, ...]} or {"builtin": "criteo"}. GR_EINVAL with a
 * message naming the column and key for an unknown type or key, a missing or second label, a
 * duplicate name, a bad delimiter or separator (not one character, a line end, or the same as
 * the delimiter), an out-of-range number; GR_ECORRUPT for text that is not JSON. */
GR_API int gr_schema_parse(const char *json, size_t len, gr_schema **out);
/* gr_schema_parse of a file (the message starts with the path). The word "criteo" instead of a
 * path is the built-in schema. */
GR_API int gr_schema_load(const char *path, gr_schema **out);
/* The schema as JSON (malloc'd, caller frees; NULL when out of memory): parses back to an
 * equal schema. The built-in one is {"builtin": "criteo", ...its columns}. */
GR_API char *gr_schema_to_json(const gr_schema *s);
GR_API int gr_schema_clone(const gr_schema *s, gr_schema **out);
GR_API void gr_schema_destroy(gr_schema *s);
/* Same columns, delimiter and header: files read the same way. */
GR_API bool gr_schema_equal(const gr_schema *a, const gr_schema *b);
GR_API bool gr_schema_is_criteo(const gr_schema *s);
GR_API uint32_t gr_schema_n_columns(const gr_schema *s);
GR_API const gr_schema_column *gr_schema_column_at(const gr_schema *s, uint32_t i);
GR_API uint32_t gr_schema_n_dense(const gr_schema *s);
GR_API uint32_t gr_schema_n_sparse(const gr_schema *s);
GR_API char gr_schema_delimiter(const gr_schema *s);
GR_API bool gr_schema_header(const gr_schema *s);
/* Whether some column is a list (its examples then carry bags of ids, see gr_batch). */
GR_API bool gr_schema_has_lists(const gr_schema *s);
/* The most ids one line can give: the categorical columns plus each list's max_items. */
GR_API uint32_t gr_schema_max_ids(const gr_schema *s);

/* The feature id of one categorical value's text in sparse slot `slot` (what the reader
 * computes; serving uses it for raw requests). Empty text is the slot's missing id.
 * GR_EINVAL when the text does not fit the column's encoding. */
GR_API int gr_schema_feature_id(const gr_schema *s, uint32_t slot, const char *text, size_t len,
                                uint64_t *id);

/* Parses one line (without its '\n'; a trailing '\r' is ignored) with a schema: *label,
 * dense[n_dense] (transformed, empty -> fill), ids (room for gr_schema_max_ids) and
 * bag_len[n_sparse] (may be NULL; ids of each sparse column: 1 for a categorical one,
 * 1..max_items for a list; an empty list gives its missing id); *n_ids the ids written. GR_ECORRUPT naming the
 * column when the line does not match ("column 3 'price': not a number: 'abc'"). */
GR_API int gr_schema_parse_line(const gr_schema *s, const char *line, size_t len, float *label,
                                float *dense, uint64_t *ids, uint32_t *bag_len, size_t *n_ids);

/* A batch of examples, row-major: labels[n], dense[n * n_dense], ids[n_ids]. Without list
 * columns every example has exactly n_sparse ids (n_ids = n * n_sparse, example i's slot s at
 * ids[i * n_sparse + s]) and bag_off is NULL; with them, the ids of example i's sparse column
 * s (its bag) are ids[bag_off[i * n_sparse + s] .. bag_off[i * n_sparse + s + 1]). */
typedef struct gr_batch {
    size_t n, cap;
    float *labels;
    float *dense;
    uint64_t *ids;
    uint32_t n_dense, n_sparse; /* per example */
    size_t n_ids, ids_cap;
    uint32_t *bag_off;          /* n * n_sparse + 1 offsets, or NULL */
} gr_batch;

/* A batch of the Criteo layout (13 dense, 26 ids per example). */
GR_API int gr_batch_init(gr_batch *b, size_t cap);
/* A batch for files of schema s (NULL: Criteo). */
GR_API int gr_batch_init_schema(gr_batch *b, size_t cap, const gr_schema *s);
GR_API void gr_batch_fini(gr_batch *b);

typedef struct gr_criteo_opts {
    size_t batch;        /* examples per batch (> 0) */
    unsigned threads;    /* parser threads; 0 = parse in the caller's thread */
    bool strict;         /* a bad line is an error (GR_ECORRUPT) instead of skipped + counted */
    uint64_t start, end; /* byte range [start, end) of the file; end 0 = to the end of file.
                          * start must be 0 or the first byte of a line (see gr_criteo_split) */
    uint64_t first_line; /* line number of the line at `start` (1 for start 0; 0 = 1) */
    size_t block_bytes;  /* read size; 0 = 1 MiB */
    unsigned log_bad;    /* bad lines logged as warnings before going quiet; 0 = 5 */
    /* The file's layout; NULL = Criteo. With a header the file's line 1 is skipped (when the
     * range starts there). Must outlive the reader. */
    const gr_schema *schema;
    /* Lenient mode: when set, called for every bad line (from a parser thread; several
     * readers may share one callback) instead of the reader logging log_bad of them itself,
     * so a caller with many readers over one file logs the first few of all of them once. */
    void (*on_bad)(void *ctx, const char *path, uint64_t line, const char *why);
    void *on_bad_ctx;
} gr_criteo_opts;

GR_API void gr_criteo_opts_default(gr_criteo_opts *o);

typedef struct gr_criteo_stats {
    uint64_t lines;          /* lines read, including bad and empty ones */
    uint64_t examples;       /* examples returned */
    uint64_t bad_lines;      /* skipped as malformed */
    uint64_t empty_lines;    /* empty lines (ignored, not bad), and a schema's header line */
    uint64_t first_bad_line; /* line number of the first bad line (0 = none) */
    char first_bad_msg[256]; /* its message */
} gr_criteo_stats;

typedef struct gr_criteo_reader gr_criteo_reader;

/* Opens a streaming reader over path (or its byte range): it reads blocks of block_bytes, cut
 * at line ends, and parses them on `threads` threads; batches come out in file order whatever
 * the thread count. */
GR_API int gr_criteo_open(const char *path, const gr_criteo_opts *opts, gr_criteo_reader **out);
/* Fills b with the next examples (at most min(opts.batch, b->cap)). b->n == 0 means end of
 * data. In strict mode a bad line returns GR_ECORRUPT with "PATH:LINE: ..." as the message;
 * the reader is then finished. */
GR_API int gr_criteo_next(gr_criteo_reader *r, gr_batch *b);
/* A reader without parser threads: reads and parses now the next block (1 MiB of lines by
 * default) that gr_criteo_next will take examples from, at most one block past the one it is
 * taking them from, so a caller with a moment to spare (a worker about to wait for the
 * others) does that work then instead of inside a later gr_criteo_next. What the batches hold,
 * the bad-line handling and the stats are the same either way. Returns 1 when it parsed a
 * block, 0 when there was nothing to do (one block is ready ahead already, the end of the
 * range, parser threads, or an earlier error), or a negative gr_err (a read error), which
 * gr_criteo_next then returns where that block's examples would have started. */
GR_API int gr_criteo_read_ahead(gr_criteo_reader *r);
GR_API void gr_criteo_get_stats(const gr_criteo_reader *r, gr_criteo_stats *st);
/* Stops the parser threads and frees everything. NULL is a no-op. */
GR_API void gr_criteo_close(gr_criteo_reader *r);

/* Splits a file into `parts` byte ranges that start at line starts: offsets[0..parts] (parts +
 * 1 entries; offsets[parts] = file size) and, if first_lines is not NULL, the line number of
 * each range's first line (found by counting newlines, one pass over the file). Ranges may
 * be empty when the file has fewer lines than parts. */
GR_API int gr_criteo_split(const char *path, unsigned parts, uint64_t *offsets,
                           uint64_t *first_lines);

/* ------------------------------------------------------------------------------------------ */
/* Synthetic data with a planted teacher                                                       */

typedef struct gr_datagen_opts {
    uint64_t train_rows, test_rows;
    uint64_t seed;
    unsigned threads; /* 0 = 2 */
    /* The layout to write (NULL: Criteo, byte for byte what it always was). Any other schema
     * gets its own planted teacher over its columns (docs/data.md). */
    const gr_schema *schema;
} gr_datagen_opts;

typedef struct gr_datagen_result {
    char train_file[32], test_file[32]; /* names in DIR: train.tsv, or train.csv for commas */
    uint64_t train_rows, test_rows;
    double train_positive_rate, test_positive_rate;
    double teacher_auc, teacher_logloss; /* of the teacher's probabilities on the test set */
    double base_logloss;                 /* predicting the test positive rate for every row */
    double seconds;
} gr_datagen_result;

/* Writes DIR/train.tsv, DIR/test.tsv (.csv when the schema's delimiter is a comma, .txt for
 * another one; a header line when it has one) and DIR/oracle.json (creating DIR if needed).
 * The output depends only on (schema, seed, rows), not on the thread count. */
GR_API int gr_datagen_run(const char *dir, const gr_datagen_opts *opts, gr_datagen_result *res);

/* An endless stream of rows in the same layout (label first, '\n' at the end) from the same
 * kind of teacher, whose per-id weights drift: after t rows each weight has turned by
 * drift * t / 100000 radians from its first draw towards an independent second one (drift 0:
 * a fixed teacher). Deterministic for (seed, drift). */
typedef struct gr_datagen_stream gr_datagen_stream;
#define GR_DATAGEN_ROW_MAX 512 /* bytes one row may take */
GR_API int gr_datagen_stream_create(uint64_t seed, double drift, gr_datagen_stream **out);
/* Writes the next row into buf (GR_DATAGEN_ROW_MAX bytes) and returns its length; label and
 * the teacher's probability (either may be NULL). */
GR_API size_t gr_datagen_stream_next(gr_datagen_stream *s, char *buf, float *label, float *prob);
GR_API uint64_t gr_datagen_stream_rows(const gr_datagen_stream *s);
GR_API void gr_datagen_stream_destroy(gr_datagen_stream *s);

/* ------------------------------------------------------------------------------------------ */
/* Metrics                                                                                     */

/* Exact ROC AUC: rank-based, tied scores get their average rank, O(n log n). labels are
 * 0/1 (anything > 0.5 is positive). When all examples are of one class (or n == 0) the AUC
 * is undefined and the result is NaN. *out gets the value; GR_ENOMEM if the sort buffer
 * cannot be allocated. */
GR_API int gr_auc(const float *scores, const float *labels, size_t n, double *out);

/* DLRM's pairwise-dot interaction exactly as the trainer computes it, for other front ends
 * (the PyTorch module's DenseDLRM). Per example, nvec = ns + 1 vectors of d floats: vector 0
 * its bottom MLP's output (bot, n x d), vector v its slot v - 1's row (emb, n x ns x d).
 * Forward: z (n x (d + nvec (nvec - 1) / 2)) = [bot, <va, vb> for a > b, a-major], each dot
 * summed in element order. Backward: from dz (the same shape as z) the gradients of bot
 * (dbot, n x d: dz's first d columns plus the dots' part) and of every row (gemb, n x ns x d).
 * GR_EINVAL for d or ns of 0 or ns over 1024, GR_ENOMEM. Any thread, no shared state. */
GR_API int gr_dlrm_interact_forward(const float *bot, const float *emb, size_t n, uint32_t d,
                                    uint32_t ns, float *z);
GR_API int gr_dlrm_interact_backward(const float *dz, const float *bot, const float *emb, size_t n,
                                     uint32_t d, uint32_t ns, float *dbot, float *gemb);
/* Mean binary log loss, -[y log p + (1-y) log(1-p)], p clipped to [1e-7, 1 - 1e-7]. 0 for
 * n == 0. */
GR_API double gr_logloss(const float *probs, const float *labels, size_t n);

/* ------------------------------------------------------------------------------------------ */
/* Models                                                                                      */

typedef enum { GR_MODEL_LR = 0, GR_MODEL_DLRM = 1 } gr_model_kind;

#define GR_MODEL_MAX_LAYERS 8

typedef struct gr_model_config {
    gr_model_kind kind;
    uint32_t dim;                              /* DLRM embedding dim (LR: always 1) */
    uint32_t bottom[GR_MODEL_MAX_LAYERS];      /* DLRM bottom hidden sizes; output is dim */
    uint32_t n_bottom;
    uint32_t top[GR_MODEL_MAX_LAYERS];         /* DLRM top hidden sizes; output is 1 */
    uint32_t n_top;
    uint64_t seed;                             /* dense parameter init */
    /* The input: n_dense dense features and n_sparse embedding vectors (one per sparse
     * column, bags already pooled) per example. With a schema both come from it (0 or equal
     * values); without one, 0 and 0 mean Criteo's 13 and 26. The model keeps its own copy of
     * the schema (gr_model_schema), so a saved model knows how to read its files. */
    uint32_t n_dense, n_sparse;
    const gr_schema *schema;                   /* NULL: Criteo */
} gr_model_config;

/* DLRM, dim 16, bottom 64,32 (13-64-32-16), top 128,64 (..-128-64-1), seed 1, Criteo input. */
GR_API void gr_model_config_default(gr_model_config *c, gr_model_kind kind);
/* Parses "512,256,64" into sizes (at most GR_MODEL_MAX_LAYERS, each 1..65536). */
GR_API int gr_model_parse_layers(const char *s, uint32_t *sizes, uint32_t *n);

typedef struct gr_model gr_model;
typedef struct gr_model_ws gr_model_ws; /* per-thread scratch for forward/backward */

GR_API int gr_model_create(const gr_model_config *c, gr_model **out);
GR_API void gr_model_destroy(gr_model *m);
GR_API const gr_model_config *gr_model_get_config(const gr_model *m);
/* Dense features and sparse vectors per example. */
GR_API uint32_t gr_model_n_dense(const gr_model *m);
GR_API uint32_t gr_model_n_sparse(const gr_model *m);
/* The layout of the files the model reads (gr_schema_criteo() when none was given; NULL for a
 * model built from bare shapes other than Criteo's, which cannot read files); owned by the
 * model (config.schema of gr_model_get_config points to it too). */
GR_API const gr_schema *gr_model_schema(const gr_model *m);
/* Floats in the flat dense parameter array. */
GR_API size_t gr_model_dense_size(const gr_model *m);
/* Embedding row width: dim for DLRM, 1 for LR. */
GR_API uint32_t gr_model_emb_dim(const gr_model *m);
/* The dense parameters' name on a backend ("dlrm.dense" / "lr.dense"). */
GR_API const char *gr_model_dense_name(const gr_model *m);
/* Deterministic initial dense parameters from config.seed (Xavier-normal weights, small
 * normal biases as in DLRM; LR: zeros). */
GR_API void gr_model_init_dense(const gr_model *m, float *params);
/* Describes the layout of the dense array, e.g. "bottom0.w 64x13 @0, bottom0.b 64 @832, ..."
 * into buf (truncated to len). */
GR_API void gr_model_describe(const gr_model *m, char *buf, size_t len);

GR_API int gr_model_ws_create(const gr_model *m, gr_model_ws **out);
GR_API void gr_model_ws_destroy(gr_model_ws *ws);

/* One forward + backward pass over n examples. emb holds every sparse slot's embedding row
 * (a bag's pooled row): n * S * emb_dim floats, S = n_sparse (example i, slot s at (i*S + s)
 * * emb_dim). Writes *loss (mean log
 * loss over the batch), probs[n] (may be NULL), grad_dense (dense_size floats, overwritten)
 * and grad_emb (same layout as emb, one row per occurrence, overwritten; the caller sums the
 * rows of duplicate ids). Gradients are of the mean loss. */
GR_API int gr_model_train_step(const gr_model *m, gr_model_ws *ws, const float *params,
                               size_t n, const float *dense, const float *emb,
                               const float *labels, double *loss, float *probs,
                               float *grad_dense, float *grad_emb);
/* Forward only: probs[n]. */
GR_API int gr_model_predict(const gr_model *m, gr_model_ws *ws, const float *params, size_t n,
                            const float *dense, const float *emb, float *probs);

/* Dense parameters laid out for scoring one example at a time (a serving replica's request):
 * for n = 1 cblas_sgemm repacks every weight matrix on every call, which costs more than the
 * product. A prepared copy holds each layer's weights transposed and, per layer, the blocking
 * with which a vector kernel gives cblas_sgemm's bits exactly (checked against it on these
 * weights when prepared; a layer without an exact match keeps cblas_sgemm). So
 * gr_model_predict_prepared gives bitwise what gr_model_predict gives, for any n. */
typedef struct gr_model_prepared gr_model_prepared;
GR_API int gr_model_prepare(const gr_model *m, const float *params, gr_model_prepared **out);
GR_API void gr_model_prepared_destroy(gr_model_prepared *p);
/* How many layers take the fast path (0 on a CPU without FMA or an OpenBLAS that computes
 * otherwise); for tests and benchmarks. */
GR_API int gr_model_prepared_layers(const gr_model_prepared *p);

/* OpenBLAS (the predict paths' sgemm) on one thread for the whole process, and its idle thread
 * pool stopped; once per process, later calls return at once. The trainer, evaluation, saved
 * models and replicas call it; a program that calls openblas_set_num_threads itself restarts
 * the pool (src/train/blas.c). */
GR_API void gr_blas_one_thread(void);
/* gr_model_predict using prep (NULL, or made from other parameters than `params`: ignored)
 * when n == 1. */
GR_API int gr_model_predict_prepared(const gr_model *m, gr_model_ws *ws, const float *params,
                                     const gr_model_prepared *prep, size_t n, const float *dense,
                                     const float *emb, float *probs);
/* n independent examples at once, each scored as if alone: probs[i] is bitwise what
 * gr_model_predict_prepared(m, ws, params, prep, 1, dense + i * n_dense,
 * emb + i * n_sparse * emb_dim, probs + i) gives, for any n and whatever the other examples
 * are (gr_model_predict with n > 1 may differ in the last bits: sgemm's rows depend on its M).
 * Cheaper than n such calls: each weight vector is loaded once for up to four examples.
 * GR_EINVAL when prep is NULL or was made from other parameters than `params`. */
GR_API int gr_model_predict_each(const gr_model *m, gr_model_ws *ws, const float *params,
                                 const gr_model_prepared *prep, size_t n, const float *dense,
                                 const float *emb, float *probs);

/* ------------------------------------------------------------------------------------------ */
/* Scoring: the one forward path of evaluation, saved models and serving                       */

/* Where scoring gets embedding rows: the n unique keys' rows into rows (n * emb_dim floats).
 * A key the source does not hold must read as the trainer's evaluation reads it: zeros
 * (GR_PULL_READONLY on a backend, GR_LOOKUP_READONLY on a gr_table). 0 or a negative gr_err. */
typedef int (*gr_rows_fn)(void *ctx, const uint64_t *keys, size_t n, float *rows);

typedef struct gr_score_ws gr_score_ws; /* per-thread scratch for gr_model_score */

GR_API int gr_score_ws_create(const gr_model *m, gr_score_ws **out);
GR_API void gr_score_ws_destroy(gr_score_ws *ws);
/* Prepared weights (gr_model_prepare) for the scoring calls that follow with the parameters
 * they were made from; NULL clears. Bits are unchanged either way. */
GR_API void gr_score_ws_set_prepared(gr_score_ws *ws, const gr_model_prepared *prep);
/* With `each` (default false) and a prepared copy set, the scoring calls that follow compute
 * every example as if it were scored alone (gr_model_predict_each): a score never depends on
 * what else is in the batch. The prepared copy must then be made from the `params` scored
 * with (else GR_EINVAL). Dedup, fetch and gather are unchanged. */
GR_API void gr_score_ws_set_each(gr_score_ws *ws, bool each);

/* Scores n examples (dense: n * n_dense features, ids: n * n_sparse feature ids, as gr_batch
 * holds them for a schema without list columns; Criteo: 13 and 26) into probs[n]: dedups the
 * ids, fetches the unique rows through `rows`, scatters them to the occurrences and runs
 * gr_model_predict with the dense parameters `params`. The trainer's test evaluation,
 * gr_saved_model_predict and `granary eval` all score through this, so the same parameters
 * give bitwise the same probabilities for the same batches. GR_EINVAL for a model whose
 * schema has list columns (use gr_model_score_batch). */
GR_API int gr_model_score(const gr_model *m, gr_score_ws *ws, const float *params,
                          gr_rows_fn rows, void *ctx, size_t n, const float *dense,
                          const uint64_t *ids, float *probs);
/* The same for a batch as the reader fills it (gr_batch_init_schema with the model's schema):
 * list columns' bags are pooled as in training. */
GR_API int gr_model_score_batch(const gr_model *m, gr_score_ws *ws, const float *params,
                                gr_rows_fn rows, void *ctx, const gr_batch *b, float *probs);

/* ------------------------------------------------------------------------------------------ */
/* Saved models: a checkpoint or an export, ready for inference                                */

/* What a saved model is, read from the metadata the trainer stores with every checkpoint
 * (user.json, member "model"; docs/train.md "Saved models"): explicit shapes, not a data set's
 * name. */
typedef struct gr_saved_model_info {
    gr_model_config model;         /* kind, dim, bottom and top layer sizes, seed */
    uint32_t n_dense, n_sparse;    /* dense features and categorical columns per example */
    char table[GR_TABLE_NAME_MAX]; /* the embedding table (all categorical columns share it) */
    uint32_t table_id;
    char dense_name[GR_TABLE_NAME_MAX]; /* the dense parameter ("dlrm.dense" / "lr.dense") */
    uint64_t dense_size;           /* its floats */
    uint64_t rows;                 /* embedding rows loaded */
    uint64_t step;                 /* the checkpoint's step */
    char kind[16];                 /* "full", "delta" or "export" */
    char dir[4096];                /* the checkpoint directory that was opened */
    /* Training settings recorded with it (0 when unknown): the batch per worker and the
     * worker count. `granary eval` scores with these so that its batches, hence its bitwise
     * results, are the trainer's own final evaluation's. */
    uint64_t batch;
    uint32_t workers;
} gr_saved_model_info;

typedef struct gr_saved_model gr_saved_model;

/* Opens a saved model: path is a checkpoint root (its newest complete checkpoint), one
 * checkpoint (a delta with its chain) or an export (`granary ckpt export`). Loads the
 * embedding table into a local gr_table (weights; optimizer state too for a full checkpoint)
 * and the dense parameters into memory, and builds the model from the recorded shapes.
 * Errors name the path and what is missing: no checkpoint, no model metadata (a checkpoint
 * written before models were recorded), a missing dense part, shapes that disagree with the
 * dense parameter's size. Sets OpenBLAS to one thread, as gr_train_run does (the trainer
 * evaluated that way, and threaded BLAS changes the last bits of a score). */
GR_API int gr_saved_model_open(const char *path, gr_saved_model **out);
/* Parses the trainer's metadata (the text of a checkpoint's user.json, len bytes) into the
 * model part of info (model, n_dense, n_sparse, table, table_id, dense_name, dense_size,
 * batch, workers); messages start with `where`. Every field is checked (kinds, layer counts
 * and sizes, the table spec); GR_ENOENT when there is no "model" member. */
GR_API int gr_saved_model_parse_meta(const char *json, size_t len, const char *where,
                                     gr_saved_model_info *info);
/* What gr_saved_model_open would build, without loading any rows: the checkpoint directory,
 * its kind and step, and the recorded model (info.rows stays 0). Same errors. */
GR_API int gr_saved_model_read_info(const char *path, gr_saved_model_info *info);
/* NULL is a no-op. */
GR_API void gr_saved_model_close(gr_saved_model *sm);
GR_API const gr_saved_model_info *gr_saved_model_get_info(const gr_saved_model *sm);
/* The model (shapes; valid until close). */
GR_API const gr_model *gr_saved_model_model(const gr_saved_model *sm);
/* The dense parameters: info.dense_size floats (valid until close). */
GR_API const float *gr_saved_model_dense(const gr_saved_model *sm);
/* The embedding table (valid until close; safe for concurrent lookups). */
GR_API gr_table *gr_saved_model_table(gr_saved_model *sm);
/* Scores n examples (gr_model_score over the saved table, unknown ids reading zeros as in
 * the trainer's evaluation). One ws per thread; calls from several threads are fine. */
GR_API int gr_saved_model_predict(gr_saved_model *sm, gr_score_ws *ws, size_t n,
                                  const float *dense, const uint64_t *ids, float *probs);
/* The same for a batch of the model's schema (gr_model_schema of gr_saved_model_model), with
 * list columns' bags: what a schema with lists needs. */
GR_API int gr_saved_model_predict_batch(gr_saved_model *sm, gr_score_ws *ws, const gr_batch *b,
                                        float *probs);

/* The result of scoring a file. */
typedef struct gr_eval_result {
    double auc, logloss; /* NaN when undefined (no examples, or one class for the AUC) */
    uint64_t examples;
    uint64_t bad_lines;
    float *probs;        /* with want_probs: every example's probability in file order
                            (caller frees), else NULL */
} gr_eval_result;

/* Scores a file with a saved model exactly as the trainer's final evaluation does: `threads`
 * byte ranges (0 = the recorded worker count, else 1), batches of `batch` (0 = the recorded
 * batch, else 1024). */
GR_API int gr_saved_model_evaluate(gr_saved_model *sm, const char *path, size_t batch,
                                   unsigned threads, bool want_probs, gr_eval_result *res);

/* ------------------------------------------------------------------------------------------ */
/* Backends: where embedding rows and dense parameters live                                    */

#define GR_PULL_READONLY GR_READONLY /* do not create missing rows (evaluation); they read zeros */

/* The trainer calls these from several threads at once; a backend must be thread-safe.
 * Keys passed to pull/push are unique within a call (the trainer dedups with gr_dedup and
 * sums the gradients of duplicates). Every function returns 0 or a negative gr_err. */
struct gr_train_ckpt;

/* The step calls of the modes with step tokens (sync, semisync, ssp, hybrid; docs/sync.md).
 * A backend that has them has all of them. A worker's step is: begin (acquire a token) ->
 * fetch -> compute -> push; in hybrid mode fetch and push carry only the dense parameters
 * (n = 0 rows) and the rows go through the core's pull and push, outside the step. */
typedef struct gr_train_steps {
    int (*begin)(void *ctx, uint32_t worker, uint64_t *token);
    /* The n unique rows (n may be 0) and the whole dense parameter together: fetched right
     * after the token, they are exactly the current step's. */
    int (*fetch)(void *ctx, uint32_t table, const uint64_t *keys, size_t n, float *rows,
                 const char *dense, float *params, size_t np);
    /* The step's whole gradient tagged with the token: row gradients (n may be 0) and the
     * dense gradient. *dropped: it was refused as stale (semisync) and counts as dropped. */
    int (*push)(void *ctx, uint32_t worker, uint64_t token, uint32_t table, const uint64_t *keys,
                size_t n, const float *grads, const char *dense, const float *dgrad, size_t dn,
                bool *dropped);
    /* The worker has finished its data: steps stop waiting for it. */
    int (*leave)(void *ctx, uint32_t worker);
    /* After a failure: make calls blocked in other threads (begin) return an error promptly. */
    void (*cancel)(void *ctx);
} gr_train_steps;

/* A backend: a required core (every slot set) and the optional step calls. */
typedef struct gr_train_backend {
    void *ctx;
    /* Declares an embedding table (idempotent: an existing table with the same spec is
     * fine, a different one is GR_EEXIST). */
    int (*table_init)(void *ctx, const gr_table_spec *spec);
    /* Rows of n keys into rows (n * dim). */
    int (*pull)(void *ctx, uint32_t table, const uint64_t *keys, size_t n, float *rows,
                unsigned flags);
    /* Gradient rows of n keys, applied by the table's optimizer. */
    int (*push)(void *ctx, uint32_t table, const uint64_t *keys, size_t n, const float *grads);
    /* Declares a dense parameter with its initial value; the first caller's init wins. */
    int (*dense_init)(void *ctx, const char *name, const float *init, size_t n);
    int (*dense_pull)(void *ctx, const char *name, float *out, size_t n);
    int (*dense_push)(void *ctx, const char *name, const float *grad, size_t n);
    /* Started forms of dense_pull and dense_push: start, do other work, then op_wait (exactly
     * once per started op). A backend without real async I/O does the work at the start and
     * hands back a NULL op (op_wait(NULL) is GR_OK). */
    int (*dense_pull_start)(void *ctx, const char *name, float *out, size_t n, void **op);
    int (*dense_push_start)(void *ctx, const char *name, const float *grad, size_t n, void **op);
    int (*op_wait)(void *ctx, void *op);
    /* Checkpoints of everything the backend holds (tables and dense parameters, with optimizer
     * state); the trainer calls them only while no step is in flight (docs/checkpoints.md,
     * "In training"). A backend that keeps none says so (checkpoints false) and both return
     * GR_EINVAL. */
    int (*ckpt_save)(void *ctx, struct gr_train_ckpt *c);
    /* Restores the checkpoint `name` under root (NULL: root itself when it is a checkpoint,
     * else the newest complete one), and forgets any step state of the job (a resumed job
     * starts its step tokens over). Fills *loaded; loaded->meta is malloc'd (caller frees). */
    int (*ckpt_load)(void *ctx, const char *root, const char *name, struct gr_train_ckpt *loaded);
    /* Frees ctx. */
    void (*destroy)(void *ctx);
    bool checkpoints; /* ckpt_save and ckpt_load work (the parameter-server backend) */
    /* NULL in async mode: every push applies on arrival. */
    const gr_train_steps *steps;
} gr_train_backend;

/* One checkpoint, as the trainer asks a backend for it (in: root .. meta; out: the rest), or
 * as a backend reports a restored one (root unused; name, step, meta filled). */
typedef struct gr_train_ckpt {
    const char *root;    /* checkpoint root */
    uint64_t step;
    const char *parent;  /* the checkpoint this run committed last (deltas build on it), or NULL */
    bool incremental;
    uint32_t full_every, keep;
    int zstd_level;
    bool same_step;      /* refuse to commit unless every shard is at the same sync step */
    char *meta;          /* the trainer's position (JSON), stored beside the manifest */
    char name[64];       /* out: "step-000000000100" */
    bool delta;          /* out */
    uint64_t bytes, rows; /* out */
    double seconds;      /* out */
} gr_train_ckpt;

typedef enum { GR_DENSE_OPT_ADAM = 0, GR_DENSE_OPT_ADAGRAD = 1, GR_DENSE_OPT_SGD = 2 } gr_dense_opt;

typedef struct gr_local_backend_opts {
    gr_dense_opt dense_opt;
    float dense_lr;
    float beta1, beta2, eps; /* Adam; eps also Adagrad */
} gr_local_backend_opts;

/* Forward declaration: the parameter-server backend talks through a client. */
typedef struct gr_client gr_client;

/* A backend over the parameter-server client: tables and dense parameters live on the
 * shards (dense parameters as dense tensors with their optimizer, run by the shard). In the
 * sync modes it installs the job on every shard (SYNC_CONFIG), hands out step tokens
 * (SYNC_ACQUIRE on every shard, per-shard tags kept per worker), pushes rows and dense
 * gradients of a step in one PUSH_STEP per shard, and makes a finished worker leave. */
typedef struct gr_ps_backend_opts {
    gr_client *client;     /* the client to use (not owned), or NULL to connect to ... */
    const char *servers;   /* ... "host:port,..." (owned connection) */
    const char *auth_file; /* with servers: the shared secret, or NULL */
    int mode;              /* gr_train_mode (async: plain pushes, no job) */
    uint32_t workers;      /* N (sync modes) */
    uint32_t aggregate;    /* semisync K; 0 = N - 1 when N > 1, else 1 */
    uint32_t staleness;    /* semisync: drop bound; ssp: the bound */
    uint32_t dense_lag;    /* sync and hybrid: step t may start once step t-1-L is applied
                              (delayed synchronous SGD, docs/sync.md); 0 = lock-step */
    uint32_t timeout_ms;   /* how long a step may wait for the others; 0 = 60000 */
    bool reset;            /* replace a different job the shards run (else that is an error) */
    /* Tables the servers already hold with rows, from an earlier run (table_init):
     * GR_PS_TABLES_REFUSE (the default) fails with GR_EEXIST naming the table and its row
     * count; REUSE continues with them (a resume, whose restore replaces them anyway); FRESH
     * drops and recreates them. */
    int tables;
    uint64_t owner;        /* the sync job's owner id (0: a fresh random one; processes of one
                              job pass the same); a shard running another owner's job refuses
                              this backend with GR_EBUSY naming that job */
    gr_dense_opt dense_opt; /* the shards' optimizer for dense parameters */
    float dense_lr, beta1, beta2, eps;
    /* ckpt_load reads only the checkpoint's name, step and training position and loads no rows:
     * the "partial" recovery after a lost shard, whose replacement restored its own rows while
     * the other shards keep their newer ones (docs/operations.md, "Recovery"). */
    bool resume_position_only;
    /* One process of a job of several (gr_train_job): the sync job has job_workers workers
     * (0: `workers`), and this backend's worker i is the job's worker worker_base + i.
     * joined: another process of the job (its chief) sets the dense parameters' initial values
     * and resets the sync job at a restore; this one does neither. */
    uint32_t job_workers, worker_base;
    bool joined;
} gr_ps_backend_opts;

enum { GR_PS_TABLES_REFUSE = 0, GR_PS_TABLES_REUSE = 1, GR_PS_TABLES_FRESH = 2 };

/* Fills o with defaults: async, Adam lr 1e-3 (0.9, 0.999, 1e-8) for dense parameters. */
GR_API void gr_ps_backend_opts_default(gr_ps_backend_opts *o);
/* Connects (or uses o->client), installs the sync job when the mode needs one, and fills
 * *out. GR_EBUSY when the shards run a different job and reset is false. */
GR_API int gr_ps_backend_create(const gr_ps_backend_opts *o, gr_train_backend *out);
/* Drops the sync job from the shards (at the end of a run; the trainer does not). */
GR_API int gr_ps_backend_finish(gr_train_backend *b);


/* A backend in this process over gr_table (tables created by table_init) and dense
 * parameters held in memory with their optimizer (Adam by default, lr 1e-3). Free it with
 * gr_train_backend_destroy. */
GR_API int gr_local_backend_create(const gr_local_backend_opts *opts, gr_train_backend *out);
/* Calls b->destroy(b->ctx) if set and clears *b. */
GR_API void gr_train_backend_destroy(gr_train_backend *b);
/* The local backend's table with that id (NULL if none): for tests and stats. */
GR_API gr_table *gr_local_backend_table(gr_train_backend *b, uint32_t table);

/* ------------------------------------------------------------------------------------------ */
/* The trainer                                                                                 */

/* The core's sync modes under the trainer's names (same values), and hybrid, a trainer mode
 * whose shards run a sync job for the dense parameters only. */
typedef enum {
    GR_MODE_ASYNC = GR_SYNC_ASYNC,
    GR_MODE_SYNC = GR_SYNC_SYNC,
    GR_MODE_SEMISYNC = GR_SYNC_SEMISYNC,
    GR_MODE_SSP = GR_SYNC_SSP,
    /* Dense parameters synchronous (every step averages all workers' dense gradients, through
     * the shards' sync job), embedding rows asynchronous with a bounded staleness (PERSIA). */
    GR_MODE_HYBRID = 4,
} gr_train_mode;

GR_API const char *gr_train_mode_name(gr_train_mode m);
GR_API int gr_train_mode_parse(const char *s, gr_train_mode *out);

/* The table every categorical slot's ids live in: one shared table, ids already salted by
 * their slot (gr_criteo_feature_id). */
#define GR_TRAIN_EMB_TABLE 1u

struct gr_train_progress;

/* A training process that is one of several of a job (granary train --coord --job-workers N;
 * docs/coord.md, "Worker processes"). Every process runs opts.workers threads; worker i of the
 * process of rank r is the job's worker r * workers + i: the training file is cut into
 * ranks * workers static ranges by that index (as one process with ranks * workers threads
 * cuts it), and the backend's step calls carry it. The hooks are called from the run's main
 * thread; each may block. */
typedef struct gr_train_job {
    unsigned ranks; /* processes in the job, >= 1 */
    unsigned rank;  /* this one's, < ranks */
    void *ctx;
    /* Whether this process leads the job now (asked often; must be cheap): only the chief
     * saves checkpoints, periodic and final; a process that becomes chief mid-run starts
     * saving at its next due step. */
    bool (*is_chief)(void *ctx);
    /* After the tables and dense parameters are declared and a resume restored, before the
     * workers start; an error fails the run. NULL: none. */
    int (*started)(void *ctx);
    /* After this process's workers are done, before the final checkpoint and the test file:
     * returns once the job's other processes are done with their data (or gone), so the final
     * checkpoint of the chief holds the whole job's training. Not called after a failure or
     * a stop (should_stop). NULL: none. */
    void (*wait_others)(void *ctx);
    /* The step of the newest checkpoint the job recorded (0: none): a new chief numbers its
     * checkpoints above it. NULL: 0. */
    uint64_t (*last_ckpt_step)(void *ctx);
    /* A checkpoint this process committed. NULL: none. */
    void (*saved)(void *ctx, const char *name, uint64_t step);
    /* At a resume with static data: the batches worker `worker` of this process has done,
     * given the checkpoint's count for it (`from_ckpt`); a process that takes over a lost
     * rank returns that rank's own position, which the job recorded. NULL: from_ckpt. */
    uint64_t (*position)(void *ctx, unsigned worker, uint64_t from_ckpt);
} gr_train_job;

typedef struct gr_train_opts {
    gr_model_config model;
    const char *train_path, *test_path; /* test_path may be NULL: no evaluation */
    size_t batch;                       /* per worker */
    unsigned epochs, workers;
    gr_train_mode mode;
    bool pipeline;       /* false: each worker does read, pull, compute, push in turn */
    unsigned queue_depth; /* batches between pipeline stages; 0 = 1 */
    unsigned parse_threads; /* per worker reader; 0 = parse in the reader stage's thread */
    bool strict;         /* refuse bad lines instead of skipping them */
    gr_table_spec emb;   /* embedding table (name, dim, init, optimizer); see defaults */
    double progress_s;   /* progress line on stderr every so often; 0 = never */
    uint64_t max_examples; /* stop after this many training examples; 0 = no limit */
    /* How workers share the training file. STATIC: worker i reads the i-th of W contiguous
     * ranges (per epoch). SHARED: the file is cut into 64 W chunks that workers take in turn,
     * so a fast worker reads more (stragglers do not leave a tail). AUTO: STATIC for sync and
     * for one worker, SHARED otherwise. */
    int data;            /* GR_TRAIN_DATA_* */
    /* A straggler for tests and benchmarks: worker `straggler` sleeps (straggler_factor - 1)
     * times its compute time after each step's compute. straggler_factor <= 1: none. */
    unsigned straggler;
    double straggler_factor;
    /* Checkpoints (docs/checkpoints.md, "In training"; the backend must have ckpt_save, as the
     * parameter-server backend does). Every ckpt_every steps all workers pause between steps,
     * the trainer saves, and they go on; a last checkpoint is saved when training ends. In
     * sync mode a step is a global step (one batch of every worker) and the checkpoint holds
     * exactly the state after it; in the other modes the step number counts the batches all
     * workers pushed, and workers pause wherever they are between two steps. */
    const char *ckpt_dir;     /* checkpoint root (on the shards' filesystem); NULL = none */
    uint64_t ckpt_every;      /* steps between checkpoints; 0 = only the last one */
    uint32_t ckpt_keep;       /* complete checkpoints kept under ckpt_dir; 0 = all */
    bool ckpt_incremental;    /* deltas on top of the previous checkpoint where possible */
    uint32_t ckpt_full_every; /* with deltas: a full checkpoint at least every N (0 = no bound) */
    int ckpt_zstd;            /* 0 = raw, 1..19 = zstd-compressed sections */
    /* Resume: restore the newest complete checkpoint under this root (or this checkpoint
     * directory) before training: tables, dense parameters and their optimizer state, and
     * where every worker was in the data; training continues from there. A root without any
     * checkpoint starts from scratch; a root that does not exist is refused (GR_ENOENT: a
     * mistyped path must not silently train from scratch) unless it is ckpt_dir too, so one
     * command both starts a job and restarts it. NULL = no resume. */
    const char *resume;
    /* Stop once every worker has done this many steps (batches), counting those done before
     * a resume; 0 = no limit. With sync mode and checkpoints, a clean stop at a step. */
    uint64_t max_steps;
    /* Hybrid mode: how many of a worker's own earlier batches may still be unpushed when it
     * pulls a batch's rows (0 = none: every row read includes all of this worker's updates).
     * Default GR_TRAIN_STALENESS_DEFAULT = 0: measured, the rows a pipelined worker prefetches
     * before its own previous push lands are what costs accuracy (docs/train.md). */
    uint32_t emb_staleness;
    /* The share of a data file's lines (empty lines and a header aside) that must be valid
     * examples: below it, or with no valid example at all, the run (or the evaluation) fails
     * with GR_ECORRUPT after one summary line, instead of training on what little was
     * readable. Default GR_TRAIN_MIN_VALID_DEFAULT; 0 only requires one valid example. Both
     * files are probed up to their first valid example before training starts. The files'
     * layout is model.schema (NULL: Criteo). */
    double min_valid;
    /* Streaming (docs/train.md, "Streaming input"): train_path is read as it grows (tail -F:
     * new lines, truncation, rotation) or, when it is "-", from stdin, with every worker
     * taking batches in turn from the one stream; training ends when *stop becomes true (a
     * signal handler sets it) or stdin ends, then the last checkpoint is saved as usual. */
    bool follow;
    const atomic_bool *stop;
    /* Examples in the sliding window of the running AUC (each batch's predictions made just
     * before it is trained on); 0 = none. */
    uint32_t window;
    /* Called on the progress thread at every progress line (progress_s) and at the end. */
    void (*on_progress)(void *ctx, const struct gr_train_progress *p);
    void *progress_ctx;
    /* Every step's training loss written to this file as it is pushed, one line "WORKER
     * STEP LOSS" (STEP counts that worker's batches from 1; LOSS the batch's mean log loss,
     * %.9g): to compare runs step by step (the PyTorch path's consistency test,
     * docs/python.md). NULL = none. */
    const char *loss_log;
    /* Asked before each batch is handed on (from reader threads; it must be thread-safe and
     * cheap): once it returns true, training stops at the next step boundary. In sync and
     * hybrid mode every worker then stops after the same step (the most any worker had begun),
     * so the shards stay at one step; in the other modes each worker stops after its batches in
     * flight. The last checkpoint is written as at the end of the data; the test file is not
     * scored. NULL: never (`granary train` asks whether SIGINT or SIGTERM came). */
    bool (*should_stop)(void *ctx);
    void *stop_ctx;
    /* Where the run's Prometheus series go (granary_train_*: examples, steps, loss,
     * examples/s, dropped gradients, stage seconds, checkpoints; docs/operations.md); NULL =
     * none. Not owned; it must outlive the run. */
    gr_metrics *metrics;
    /* One process of a multi-process job (see gr_train_job); NULL: the job is this process. */
    const gr_train_job *job;
    /* The time slice (us) a pipelined worker's read, fetch and push threads ask for
     * (gr_thread_want_slice_us); 0 = the kernel's default. Default GR_TRAIN_IO_SLICE_US, for a
     * backend whose calls wait on sockets: a woken stage thread then runs ahead of the compute
     * threads. `granary train` sets 0 when its calls to the embedded shards are direct (they
     * wait on nothing, and the short slices only preempt compute; docs/train.md). */
    uint32_t stage_slice_us;
} gr_train_opts;

/* What a progress line says (gr_train_opts.on_progress). */
typedef struct gr_train_progress {
    double seconds;          /* since training started */
    uint64_t examples;       /* trained so far */
    double examples_per_sec; /* over the last progress interval */
    double loss;             /* mean training loss over the last progress interval */
    double window_auc;       /* AUC of the last window_examples predictions (NaN: none) */
    uint64_t window_examples;
    uint64_t bad_lines;
    bool final;              /* the call after training ended */
} gr_train_progress;

/* Streaming input (used by the trainer in follow mode; exposed for tests and tools): a
 * reader of Criteo lines from a file as it grows, or from stdin (path "-" or NULL). */
typedef struct gr_follow gr_follow;
GR_API int gr_follow_open(const char *path, const atomic_bool *stop, gr_follow **out);
/* Fills b with up to max examples (at most b->cap): waits for new lines; hands out a partial
 * batch when no line came for half a second; b->n == 0 when *stop is set (or stdin ended).
 * Bad lines are skipped and counted. Safe to call from several threads (they take turns). */
GR_API int gr_follow_next(gr_follow *f, gr_batch *b, size_t max);
GR_API void gr_follow_get_stats(gr_follow *f, gr_criteo_stats *st);
GR_API void gr_follow_close(gr_follow *f);

#define GR_TRAIN_STALENESS_DEFAULT 0u
/* The time slice (us, gr_thread_set_slice_us) a pipelined worker's read, fetch and push threads
 * ask for (compute keeps the kernel's default); `granary train` gives its client's readers the
 * same (gr_client_config.slice_us). They wait more than they compute: with a short slice a
 * woken one runs ahead of the compute threads instead of behind their slices. */
#define GR_TRAIN_IO_SLICE_US 200u
/* Real data has few malformed lines; a file where more than one in ten is bad is more likely
 * in the wrong format (or read with the wrong schema) than worth training on. */
#define GR_TRAIN_MIN_VALID_DEFAULT 0.9

/* The mode `granary train` picks for W workers when none is given: async for one worker
 * (nothing to synchronise), hybrid for more (dense parameters exact, as with one worker). */
GR_API gr_train_mode gr_train_default_mode(unsigned workers);
/* Whether `granary train` pipelines its workers (gr_train_opts.pipeline) when neither
 * --pipeline nor --no-pipeline is given: yes, unless its shards are called in process
 * (`direct`: the embedded cluster's direct calls, where a step waits on no socket) and the
 * workers are at least as many as the CPUs this process may run on. The workers then keep
 * the cores busy between them, and a pipeline's three more threads per worker, their
 * hand-offs (each a wake-up: about 30 us on the VMs we measure) and its seven batches of
 * buffers only cost CPU (docs/train.md, "Pipeline or not"). */
GR_API bool gr_train_default_pipeline(unsigned workers, bool direct);
/* The dense learning rate for a mode and worker count, from the one-worker rate: the modes
 * that average W workers' dense gradients per step (sync, hybrid) take W times fewer dense
 * steps with a W times larger batch, so the rate grows with sqrt(W) (Adam's usual scaling
 * for a larger batch). Other modes: unchanged. */
GR_API float gr_train_dense_lr(gr_train_mode mode, unsigned workers, float base_lr);
/* The dense lag `granary train` gives a hybrid job of W workers when none is given: 1 for
 * W >= 2 (a worker's dense step does not wait for the others' previous gradient; measured in
 * docs/train.md), 0 for one worker (its results stay those of lock-step). */
GR_API uint32_t gr_train_dense_lag_default(unsigned workers);

enum { GR_TRAIN_DATA_AUTO = 0, GR_TRAIN_DATA_STATIC = 1, GR_TRAIN_DATA_SHARED = 2 };

/* Defaults for a model kind: batch 1024, 1 epoch, 2 workers, async, pipeline on (depth 1),
 * progress every 5 s; the embedding table: DLRM -> Adagrad lr 0.05 (initial accumulator
 * 1e-7), init uniform +-0.05, dim 16; LR -> FTRL (alpha 0.05, beta 1, l1 0.1, l2 1), zeros,
 * dim 1. */
GR_API void gr_train_opts_default(gr_train_opts *o, gr_model_kind kind);

#define GR_TRAIN_MAX_REPORTED_WORKERS 16

typedef struct gr_train_result {
    uint64_t examples;        /* training examples processed (all epochs, all workers) */
    uint64_t steps;           /* batches */
    double train_seconds;
    double examples_per_sec;
    double last_loss;         /* mean training loss over the last progress window */
    double test_auc, test_logloss; /* NaN when there is no test set */
    uint64_t test_examples;
    uint64_t dropped_gradients; /* commits refused as stale (semisync); 0 otherwise */
    uint64_t bad_lines;
    double wait_seconds;      /* time workers spent waiting for step tokens, summed */
    uint64_t worker_steps[GR_TRAIN_MAX_REPORTED_WORKERS]; /* batches pushed per worker */
    /* Each worker's data position at the end (batches of its range done, the resumed ones
     * included): a run that trained its whole range ends at the range's batch count. */
    uint64_t worker_position[GR_TRAIN_MAX_REPORTED_WORKERS];
    /* Checkpoints. */
    uint64_t resumed_step;    /* the step the run resumed from (0: a fresh start) */
    char resumed_from[64];    /* that checkpoint's name ("" when none) */
    uint32_t ckpt_saves;      /* checkpoints committed by this run */
    uint32_t ckpt_failures;   /* checkpoints that failed (training went on; the next is full) */
    double ckpt_seconds;      /* wall time of the saves, summed (workers stand paused meanwhile) */
    char ckpt_last[64];       /* the last one committed ("" when none) */
    /* The checkpoint of the final state failed: the trained model is not saved (ckpt_last,
     * if any, is older), and ckpt_final_error says why. */
    bool ckpt_final_failed;
    char ckpt_final_error[256];
    bool stopped;             /* should_stop ended the run early (the test file was not scored) */
    /* Seconds per pipeline stage, summed over all batches of all workers: read (parse), pull
     * (the fetch stage: rows; sync/semisync/ssp: with the dense parameters), compute (the
     * compute stage: the model; async/hybrid: with the dense round trips), push (the push
     * stage: row gradients; sync/semisync/ssp: with the dense gradient), wait (blocked on
     * step tokens or the hybrid staleness bound, counted in no other stage). */
    double read_seconds, pull_seconds, compute_seconds, push_seconds, stage_wait_seconds;
    /* Hybrid: the embedding staleness bound, and the staleness seen at the pulls (in batches
     * of the same worker not yet pushed): max and mean. */
    uint32_t emb_staleness_bound;
    uint64_t emb_staleness_max;
    double emb_staleness_mean;
    double window_auc; /* with opts.window: the running AUC at the end (NaN: none) */
} gr_train_result;

/* Trains with W worker threads against the backend, then evaluates on the test file.
 * Creates the embedding table and dense parameters through the backend. */
GR_API int gr_train_run(const gr_train_opts *o, gr_train_backend *be, gr_train_result *res);

/* Scores a file (read with the model's schema) with the model's current parameters on the
 * backend (rows read with GR_PULL_READONLY): AUC and logloss. GR_ECORRUPT when the file has no
 * valid example or fewer than GR_TRAIN_MIN_VALID_DEFAULT of its lines are valid. */
GR_API int gr_train_evaluate(const gr_model *m, gr_train_backend *be, uint32_t table,
                             const char *path, size_t batch, unsigned threads, double *auc,
                             double *logloss, uint64_t *examples);

#endif
