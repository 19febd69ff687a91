/* The trainer's internals, shared by its parts: trainer.c (the run: options, threads,
 * progress, results), queue.c (bounded queues between pipeline stages), pipeline.c (the
 * stages of a worker and its threads), datasplit.c (how workers share the training file),
 * ckcoord.c (checkpoint coordination and resume) and eval.c (scoring a file). */
#ifndef GRANARY_TRAIN_TRAINER_INT_H
#define GRANARY_TRAIN_TRAINER_INT_H

#include "granary/train.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>

/* ---- bounded queue of work items (queue.c) ------------------------------------------------ */

typedef struct tr_item tr_item;

typedef struct tr_queue {
    tr_item **q;
    size_t cap, head, len;
    bool closed; /* no more pushes; pops drain what is left */
    bool *abort; /* shared: everything stops at once */
    pthread_mutex_t *mu;
    pthread_cond_t cv;
} tr_queue;

int tr_queue_init(tr_queue *q, size_t cap, pthread_mutex_t *mu, bool *abort);
void tr_queue_fini(tr_queue *q);
/* Never blocks for long: the queue holds every item of its worker. */
void tr_queue_push(tr_queue *q, tr_item *it);
/* NULL when closed and empty, or aborted. */
tr_item *tr_queue_pop(tr_queue *q);
/* The next item if one is queued now, else NULL; never waits. */
tr_item *tr_queue_try_pop(tr_queue *q);
void tr_queue_close(tr_queue *q);

/* ---- a batch on its way through a worker's stages ----------------------------------------- */

/* Seconds per pipeline stage, of one batch or summed: read (parse), pull (the fetch stage:
 * rows, and in sync/semisync/ssp the dense parameters with them), compute (the compute stage:
 * the model, and in async/hybrid the dense parameters' round trips, which sit there for
 * accuracy), push (the push stage: row gradients, in sync/semisync/ssp with the dense one),
 * wait (blocked on step tokens or the hybrid staleness bound; not in the others). */
typedef struct tr_stage_times {
    double read, pull, compute, push, wait;
} tr_stage_times;

struct tr_item {
    gr_batch batch;
    uint64_t *uniq;
    uint32_t *inv;
    size_t nuniq;
    float *rows;   /* nuniq x dim: pulled rows, later the summed gradients */
    float *emb;    /* n x 26 x dim: per occurrence */
    float *gemb;   /* its gradient */
    bool compute_shared; /* emb, gemb, params and gdense are the worker's (dense_beside) */
    float *params; /* dense parameters as pulled */
    float *gdense;
    float *probs;  /* the model's predictions for the batch, before it trains on it */
    double loss;
    uint64_t token;
    uint64_t chunk;   /* shared data: the chunk (counter value) it was read from */
    uint64_t seq;     /* this worker's batch number, from 0 (hybrid: embedding staleness) */
    uint64_t stale;   /* hybrid: this worker's earlier batches not yet pushed at its pull */
    bool dropped;     /* its step push was refused as stale */
    /* Hybrid with the dense step in flight beside the row push (tr->dense_beside): the
     * compute stage's dense push is done (under the worker's mu; inflight_cv), with its rc. */
    bool dense_done;
    int dense_rc;
    /* dense_beside: the ids this batch shares with the worker's previous one (their rows wait
     * for its push) and their positions among uniq, as the fetch stage split them; the compute
     * stage fetches them (common_pending) right after it pushed the previous batch itself. */
    uint64_t *common_keys;
    uint32_t *common_at;
    uint32_t *common_prev; /* ... and their positions among the previous batch's uniq */
    size_t ncommon;
    /* dense_beside: the compute stage pushed only the rows the next batch shares (shared[u]
     * set); the push stage pushes the rest. */
    uint8_t *shared;
    bool rest_pending;
    bool common_pending;
    bool pushed; /* dense_beside: the compute stage pushed its rows and dense gradient */
    tr_stage_times t; /* seconds this batch spent in each stage */
};

typedef struct trainer trainer;

/* ---- a file's bad lines across its readers (badlines.c) ----------------------------------- */

#define TR_BAD_LOGGED 5 /* bad lines of a file printed before going quiet */

typedef struct tr_badlog {
    const char *path;
    const char *what;      /* "train", "test": the messages' prefix */
    bool quiet;            /* count, print nothing (the probe) */
    atomic_uint logged;    /* bad lines reported so far */
    pthread_mutex_t mu;    /* what follows */
    uint64_t first_line;   /* the earliest bad line reported, and why */
    char first_msg[256];
    uint64_t good, bad;    /* from the readers' stats as they close */
} tr_badlog;

void tr_badlog_init(tr_badlog *l, const char *path, const char *what);
void tr_badlog_fini(tr_badlog *l);
/* gr_criteo_opts.on_bad with ctx = the tr_badlog: prints the first TR_BAD_LOGGED, then one
 * line saying the rest are counted. */
void tr_badlog_on_bad(void *ctx, const char *path, uint64_t line, const char *why);
/* Adds a closed reader's counts. */
void tr_badlog_add(tr_badlog *l, const gr_criteo_stats *st);
/* The summary (when there were bad lines), and GR_ECORRUPT when no line
 * read was valid or fewer than min_valid of them. Nothing read at all is fine (the probe ran). */
int tr_badlog_check(tr_badlog *l, double min_valid);
/* Reads the file up to its first valid example: GR_ECORRUPT naming the first bad line when
 * there is none in its first TR_PROBE_BYTES (in all of it with min_valid 0), or when the file
 * is empty. */
#define TR_PROBE_BYTES (4u << 20)
int tr_probe_file(const char *path, const gr_schema *schema, double min_valid);

/* ---- ids to the model's vectors per sparse slot, and back (bags.c) ------------------------ */

typedef struct tr_bags {
    bool on;          /* the schema has list columns: batches carry bag offsets */
    uint32_t ns;      /* sparse slots */
    uint8_t *mean;    /* per slot: mean pooling (else sum) */
} tr_bags;

int tr_bags_init(tr_bags *g, const gr_schema *s);
void tr_bags_fini(tr_bags *g);
/* emb (n * ns * d): each slot's pulled row, or its bag's rows pooled. */
void tr_bags_gather(const tr_bags *g, const gr_batch *b, const float *rows, const uint32_t *inv,
                    uint32_t d, float *emb);
/* rows (nuniq * d, overwritten): each unique id's gradient, summed over its occurrences from
 * the per-slot gradient gemb (a mean bag's items get 1/len of it). */
void tr_bags_scatter(const tr_bags *g, const gr_batch *b, const float *gemb, const uint32_t *inv,
                     size_t nuniq, uint32_t d, float *rows);

/* ---- rows pulled before the previous push lands (prefetch.c) -------------------------------- */

/* A hybrid worker's (bound 0) split of a batch's unique ids: those its previous batch did not
 * touch (fresh: pulled while the previous batch computes) and those it did (common: pulled
 * after that batch's push). Owned by the worker's fetch stage. */
typedef struct tr_prefetch {
    uint64_t *keys;  /* open-addressing set of the previous batch's ids */
    uint32_t *stamp; /* a slot holds an id of the set when its stamp is gen */
    size_t mask;
    uint32_t gen;
    uint32_t *idx;   /* per slot: the id's position among the previous batch's unique ids */
    uint64_t *fresh_keys, *common_keys; /* the split (tr_prefetch_split) */
    uint32_t *fresh_at, *common_at;     /* their positions among the batch's unique ids */
    uint32_t *common_prev;              /* the common ids' positions in the previous batch */
    size_t nfresh, ncommon;
    float *rows; /* one part's rows as pulled, before tr_prefetch_place */
} tr_prefetch;

/* For batches of at most cap unique ids of dim floats. */
int tr_prefetch_init(tr_prefetch *p, size_t cap, uint32_t dim);
void tr_prefetch_fini(tr_prefetch *p);
/* Splits keys[0..n) (unique) against the remembered set, keeping their order in each part. */
void tr_prefetch_split(tr_prefetch *p, const uint64_t *keys, size_t n);
/* The set becomes keys[0..n). */
void tr_prefetch_remember(tr_prefetch *p, const uint64_t *keys, size_t n);
/* rows[at[i]] = src[i] for i < n (rows of dim floats). */
void tr_prefetch_place(const float *src, const uint32_t *at, size_t n, uint32_t dim, float *rows);

/* Scores a file (eval.c): gr_train_evaluate with the run's share of valid lines required. */
int tr_evaluate(const gr_model *m, gr_train_backend *be, uint32_t table, const char *path,
                size_t batch, unsigned threads, double min_valid, double *auc, double *logloss,
                uint64_t *examples);


typedef struct tr_worker {
    trainer *tr;
    unsigned id;
    uint64_t start, end, first_line; /* byte range of the training file (static data) */
    uint64_t steps;                  /* batches pushed (push stage only) */
    tr_item *items;
    unsigned nitems;
    tr_queue free_q, read_q, fetch_q, push_q;
    pthread_mutex_t mu;
    bool abort;
    gr_model_ws *ws;
    gr_dedup_scratch dedup;
    /* Checkpoints and resume (under tr->mu, except skip and read: the reader's own). */
    uint64_t base;      /* batches this worker pushed before the resume */
    uint64_t skip;      /* static data: batches to skip first (done before the resume) */
    uint64_t read;      /* batches handed on in this run (max_steps; under mu: a stop) */
    uint64_t fetched;   /* items past the checkpoint gate (fetch stage) */
    int gate;           /* TR_GATE_* */
    bool finished;      /* its threads are done (it left the job) */
    uint64_t cur_chunk; /* shared data: chunk of its last pushed item (UINT64_MAX: none) */
    /* Batches read (the reader's) and pushed (under mu; hybrid waits on inflight_cv for the
     * staleness bound). */
    uint64_t next_seq, pushed_seq;
    uint64_t dense_pushed_seq; /* dense_beside: batches whose dense step push is done */
    pthread_cond_t inflight_cv;
    tr_prefetch pf; /* tr->dense_beside: the fetch stage's split of each batch's ids */
    float *common_rows; /* tr->dense_beside: the compute stage's pull of the common rows */
    /* tr->dense_beside: every item's emb, gemb, params and gdense (pipeline.c,
     * compute_bufs_alloc); only they are set. */
    tr_item compute;
    /* tr->dense_beside: a batch's rows pushed in two parts, those the next batch shares (by
     * the compute stage, scratch part_*) and the rest (by the push stage, rest_*);
     * shared_pushed_seq counts batches whose shared part is out. */
    uint64_t *part_keys, *rest_keys;
    float *part_grads, *rest_grads;
    uint64_t shared_pushed_seq;
    /* Hybrid: this run's dense step pushes done (written by the worker, read by the others:
     * token_would_wait). */
    atomic_uint_fast64_t dense_done;
    /* The reader of its current range (tr_read_epochs), while one is open: a sequential
     * worker reads ahead with it when it is about to wait for the others. */
    gr_criteo_reader *reader;
} tr_worker;

/* Where a worker's fetch stage is, for the checkpoint coordinator. */
enum { TR_GATE_RUN = 0, TR_GATE_PARKED = 1, TR_GATE_ACQUIRING = 2, TR_GATE_HELD = 3 };

/* How the training file is cut among workers (datasplit.c). */
typedef struct tr_data {
    bool shared;                      /* workers take chunks in turn */
    /* Shared chunks hold whole batches (they start at every k-th batch's first example), so
     * --batch is honoured: an epoch is ceil(examples / batch) batches. false only to resume a
     * checkpoint written when chunks were cut at byte offsets. */
    bool by_batch;
    uint64_t *chunk_off, *chunk_line; /* nchunks + 1 entries */
    unsigned nchunks;
    atomic_uint_fast64_t next_chunk;  /* over epochs * nchunks */
    uint64_t nchunk_total;            /* with checkpoints: epochs * nchunks */
    int32_t *chunk_owner;             /* per chunk counter value: the worker that took it, or -1 */
    uint64_t *chunk_pushed;           /* per chunk counter value: batches pushed (resumed included) */
    uint8_t *chunk_done;              /* per chunk counter value: complete before the resume */
} tr_data;

/* Checkpoint coordination (ckcoord.c; under trainer.mu; docs/checkpoints.md "In training").
 * Sync mode pauses every worker at the same step ("rounds"): before it takes the token of
 * step target. The other modes pause every worker wherever it is between two steps (pause). */
typedef struct tr_ck {
    bool on, rounds, pause;
    uint64_t npause;      /* pauses so far (started) */
    uint64_t target;      /* rounds: the step at which workers pause next (0: none) */
    uint64_t next_total;  /* pause mode: pause when this many batches are pushed in all */
    uint64_t saved_total; /* batches pushed in all at the last checkpoint (or the resume) */
    char parent[64];      /* the last checkpoint this run committed */
    bool last_failed;     /* the last save failed (the final state then still needs one) */
    /* A multi-process job (o->job): whether this process led it at the coordinator's last
     * turn. Only the chief pauses its workers and saves. */
    bool chief;
} tr_ck;

struct trainer {
    const gr_train_opts *o;
    gr_train_backend *be;
    gr_model *m;
    const gr_schema *schema; /* the model's: how the files are read */
    tr_bags bags;
    size_t max_ids;          /* ids per batch, at most */
    tr_badlog badlog;        /* the training file's bad lines */
    uint32_t dim;
    size_t np;
    const char *dense_name;
    tr_worker *workers;
    /* How a step talks to the backend. stepped: the backend's step calls order the dense
     * parameters (sync, semisync, ssp, hybrid). hybrid: only the dense parameters go through
     * the step calls; embedding rows are pulled and pushed asynchronously. */
    bool stepped, hybrid;
    uint32_t emb_bound; /* hybrid: batches a worker may have pulled but not pushed */
    /* Hybrid with emb_bound 0, pipelined: the fetch stage takes the token and fetches the rows
     * with the dense parameters (one round trip), and the compute stage hands a batch to the
     * push stage before its dense step push, so the two pushes are in flight together. */
    bool token_in_fetch, dense_beside;

    pthread_mutex_t mu; /* everything below */
    pthread_cond_t cv;
    int err;
    char errmsg[512];
    unsigned running; /* workers not finished */
    uint64_t examples, steps, dropped, bad_lines;
    double loss_sum;        /* since the last progress line: sum of loss * n */
    uint64_t loss_n;
    double wait_s;          /* in steps->begin, summed over workers */
    uint64_t stale_max, stale_sum; /* hybrid: embedding staleness (batches) at the pulls */
    tr_stage_times t;       /* summed over all batches */
    FILE *loss_log;         /* o->loss_log opened (NULL: none) */
    atomic_uint_fast64_t read_examples; /* for max_examples */
    atomic_bool cancelled;
    tr_data data;
    tr_ck ck;
    uint64_t base_total, base_examples; /* done before the resume */
    /* A stop asked for by o->should_stop (under mu): no batch is handed on once `stopping`;
     * in sync and hybrid mode a worker still hands on batches until base + read reaches
     * stop_at, the most any worker had handed on, so all stop after the same step. */
    bool stopping;
    uint64_t stop_at;
    gr_train_result *res;
    struct gr_follow *follow; /* follow mode: the one stream every worker reads */
    /* The running AUC's window (under mu): the newest win_len of win_cap predictions. */
    float *win_probs, *win_labels;
    size_t win_cap, win_len, win_head;
    /* The last progress window's examples/s and mean loss (for the metrics; under mu). */
    double window_rate, window_loss;
    double t0;                  /* when the workers started (gr_now_s) */
    struct tr_metrics *mx;      /* exporter.c: o->metrics's series; NULL without a registry */
};

/* ---- exporter.c --------------------------------------------------------------------------- */

/* Declares the trainer's Prometheus series in o->metrics and installs the collector that
 * copies the run's counters (under mu) into them at each scrape; no-op without a registry.
 * stop copies them a last time (the final values stay in the exposition) and removes it. */
int tr_metrics_start(trainer *tr);
void tr_metrics_stop(trainer *tr);
/* A checkpoint pause of secs seconds (ckcoord.c), failed or not. */
void tr_metrics_ckpt(trainer *tr, double secs);

/* ---- pipeline.c --------------------------------------------------------------------------- */

/* Records the first error and stops every worker: one failed step fails the job. */
void tr_fail(trainer *tr, tr_worker *w, int rc);
bool tr_aborted(tr_worker *w);
int tr_worker_init(trainer *tr, tr_worker *w, unsigned id);
void tr_worker_fini(tr_worker *w);
/* Thread mains of a worker: four stages as threads, or all in turn (--no-pipeline). */
void *tr_pipeline_main(void *arg);
void *tr_sequential_main(void *arg);

/* ---- datasplit.c -------------------------------------------------------------------------- */

/* Called once per batch read (sequential workers): the rest of the step. */
typedef int (*tr_batch_fn)(tr_worker *w, tr_item *it);

/* Cuts the training file: W contiguous ranges (static) or up to 64 W chunks taken in turn
 * (shared; by_batch: each a whole number of batches, and nchunks becomes how many there are).
 * tr->data.shared, by_batch and nchunks (the most) are set before (a resume sets them from
 * the checkpoint). */
int tr_data_setup(trainer *tr);
/* With checkpoints or a resume, shared data tracks who read which chunk. */
int tr_data_track(trainer *tr);
void tr_data_fini(tr_data *d);
/* Reads the worker's part of the file for every epoch, handing full items to `out`. Items come
 * from `pool` (pipeline) or are the single `it` (sequential: each is called per batch). */
int tr_read_epochs(tr_worker *w, tr_queue *pool, tr_queue *out, tr_item *single, tr_batch_fn each);
/* follow.c: the same in follow mode, from tr->follow, and the trainer's should_stop as a
 * second way to end the stream. */
void tr_follow_set_stop(struct gr_follow *f, bool (*fn)(void *ctx), void *ctx);
int tr_read_follow(tr_worker *w, tr_queue *pool, tr_queue *out, tr_item *single, tr_batch_fn each);

/* ---- ckcoord.c ---------------------------------------------------------------------------- */

/* Batches pushed by all workers, before the resume included. Under mu. */
uint64_t tr_total_pushed(const trainer *tr);
/* The pause count (odd while a pause is on): a token that timed out can tell whether the
 * others stood paused. */
uint64_t tr_ck_pauses(trainer *tr);
/* The fetch stage's gate: parks the worker while a checkpoint wants it (after: once it holds
 * the step token). */
int tr_ck_gate(tr_worker *w, bool after);
/* Restores the checkpoint to resume from (before the workers exist); *meta: the position. */
int tr_ck_restore(trainer *tr, cJSON **meta);
/* Applies a restored position to the workers and the chunk table. */
int tr_ck_apply(trainer *tr, const cJSON *j);
/* Arms the coordinator (after the resume, before the workers start). */
void tr_ck_setup(trainer *tr);
/* The coordinator's turn (main thread, holding mu): true when it saved. */
bool tr_ck_turn(trainer *tr);
/* The last checkpoint when training ends (unless the last one is it); a failure of it is
 * recorded in the result (ckpt_final_failed): the model is then not saved. */
void tr_ck_finish(trainer *tr);

/* ---- eval.c ------------------------------------------------------------------------------- */

/* Scores a file with the dense parameters `params` and rows from `rows`: `threads` byte ranges
 * in parallel, batches of `batch`, then AUC and logloss over the whole file (and, with
 * want_probs, every probability in file order). The file is read with the model's schema;
 * GR_ECORRUPT when it has no valid example or fewer than min_valid of its lines are valid. */
int tr_eval_file(const gr_model *m, const float *params, gr_rows_fn rows, void *ctx,
                 const char *path, size_t batch, unsigned threads, double min_valid,
                 bool want_probs, gr_eval_result *res);

/* ---- model_meta.c ------------------------------------------------------------------------- */

/* The model as the trainer records it with every checkpoint (user.json "model"): kind, shapes,
 * the embedding table's spec and the dense parameter's name and size. */
cJSON *tr_model_meta(const gr_model *m, const gr_table_spec *emb);
/* Reads it back into info (model, n_dense, n_sparse, table, dense_name, dense_size) and, when
 * schema is not NULL, the files' layout into *schema (caller destroys; a model recorded
 * without one reads Criteo); errors name the member ("model.bottom: ..."), prefixed with
 * `where`. */
int tr_model_meta_parse(const cJSON *j, const char *where, gr_saved_model_info *info,
                        gr_schema **schema);

#endif
