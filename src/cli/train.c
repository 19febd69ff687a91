/* `granary train`: trains LR or DLRM on Criteo-layout files with W worker threads against a
 * parameter-server cluster (an embedded one of S in-process shards by default, or remote
 * servers), in async, sync, semisync, ssp or hybrid mode, or against the in-process local
 * backend (--local). Prints progress on stderr and reports test AUC/logloss and throughput,
 * also as JSON (--metrics-out). Its options are one table (cli/opts.h); the command is: parse,
 * turn the values into the trainer's options, check combinations, build the backend, run,
 * report. */
#include "cli/cli.h"
#include "cli/guard.h"
#include "cli/opts.h"
#include "granary/cluster.h"
#include "granary/client.h"
#include "granary/metrics.h"
#include "granary/train.h"
#include "cli/train_coord.h"
#include "cli/train_job.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every option of `granary train`, declared once (also the keys of --config FILE). */
#define TRAIN_OPTIONS(X)                                                                       \
    X(TO_TRAIN, "train", GR_CLI_STR, "train", 0, 0, NULL, "FILE", NULL,                        \
      "training file (Criteo TSV); required")                                                  \
    X(TO_TEST, "test", GR_CLI_STR, "test", 0, 0, NULL, "FILE", NULL,                           \
      "test file: AUC and logloss at the end")                                                 \
    X(TO_MODEL, "model", GR_CLI_CHOICE, "model", 0, 0, "lr|dlrm", NULL, "dlrm", "the model")   \
    X(TO_DIM, "dim", GR_CLI_INT, "dim", 1, GR_TABLE_DIM_MAX, NULL, "D", "16",                  \
      "DLRM embedding dim")                                                                    \
    X(TO_BOTTOM, "bottom", GR_CLI_STR, "bottom", 0, 0, NULL, "LIST", "64,32",                  \
      "DLRM bottom hidden sizes (output is D)")                                                \
    X(TO_TOP, "top", GR_CLI_STR, "top", 0, 0, NULL, "LIST", "128,64",                          \
      "DLRM top hidden sizes (output is 1)")                                                   \
    X(TO_BATCH, "batch", GR_CLI_INT, "batch", 1, 1 << 20, NULL, "B", "1024",                   \
      "examples per worker step")                                                              \
    X(TO_EPOCHS, "epochs", GR_CLI_INT, "epochs", 1, 1000, NULL, "E", "1",                      \
      "passes over the training file")                                                         \
    X(TO_WORKERS, "workers", GR_CLI_INT, "workers", 1, 256, NULL, "W", "2", "worker threads")  \
    X(TO_MODE, "mode", GR_CLI_CHOICE, "mode", 0, 0, "async|sync|semisync|ssp|hybrid", NULL,    \
      NULL, "docs/sync.md; default: async for 1 worker (and --local), hybrid for more")        \
    X(TO_EMBSTALE, "emb-staleness", GR_CLI_INT, "emb_staleness", 0, 64, NULL, "S", "0",        \
      "hybrid: a worker's batches pulled but not yet pushed when it pulls the next")           \
    X(TO_DENSELAG, "dense-lag", GR_CLI_INT, "dense_lag", 0, 64, NULL, "L", NULL,               \
      "hybrid: step t may start once step t-1-L is applied (delayed sync SGD);\n"            \
      "default 1 for 2+ workers, 0 for one (docs/sync.md)")                                    \
    X(TO_AGG, "aggregate", GR_CLI_INT, "aggregate", 1, 65536, NULL, "K", NULL,                 \
      "semisync: gradients per applied step (default N-1, N > 1)")                             \
    X(TO_BACKUP, "backup", GR_CLI_INT, "backup", 0, 65535, NULL, "B", NULL,                    \
      "semisync: B backup workers, i.e. K = N - B")                                            \
    X(TO_STALE, "staleness", GR_CLI_INT, "staleness", 0, 1e6, NULL, "S", NULL,                 \
      "semisync: drop gradients older than S steps (default 0);\n"                            \
      "ssp: run at most S steps ahead of the slowest (default 2)")                             \
    X(TO_STRAG, "straggler", GR_CLI_STR, "straggler", 0, 0, NULL, "W:F", NULL,                 \
      "slow worker W down F times (sleeps (F-1) x its compute time)")                          \
    X(TO_STIMEOUT, "sync-timeout", GR_CLI_INT, "sync_timeout", 1, 86400000, NULL, "MS",        \
      "60000", "a step waiting longer than this for the others fails")                         \
    X(TO_SRESET, "sync-reset", GR_CLI_FLAG, "sync_reset", 0, 0, NULL, NULL, NULL,              \
      "replace a different sync job the servers still run")                                    \
    X(TO_DATA, "data", GR_CLI_CHOICE, "data", 0, 0, "static|shared", NULL, NULL,               \
      "how workers split the file (default: static for sync, hybrid and one\n"                \
      "worker, shared chunks otherwise)")                                                      \
    X(TO_SHARDS, "shards", GR_CLI_INT, "shards", 0, 256, NULL, "S", "1",                       \
      "shards of the embedded local cluster (0: --local)")                                     \
    X(TO_SHTHREADS, "shard-threads", GR_CLI_INT, "shard_threads", 1, 256, NULL, "T", "2",      \
      "worker threads per embedded shard")                                                     \
    X(TO_NODIRECT, "no-direct", GR_CLI_FLAG, "no_direct", 0, 0, NULL, NULL, NULL,              \
      "embedded cluster: send rows to the shards over their sockets instead of\n"             \
      "calling their tables directly (docs/train.md, \"Direct shards\")")                      \
    X(TO_SERVERS, "servers", GR_CLI_STR, "servers", 0, 0, NULL, "LIST", NULL,                  \
      "use these parameter servers host:port,... instead")                                     \
    X(TO_AUTH, "auth-file", GR_CLI_STR, "auth_file", 0, 0, NULL, "F", NULL,                    \
      "the servers' shared secret (with --servers)")                                           \
    X(TO_LOCAL, "local", GR_CLI_FLAG, "local", 0, 0, NULL, NULL, NULL,                         \
      "no parameter server: the in-process local backend (async only; = --shards 0)")          \
    X(TO_LR, "lr", GR_CLI_NUM, "lr", 1e-9, 1e3, NULL, "X", NULL,                               \
      "embedding learning rate (Adagrad lr; LR: FTRL alpha) (default 0.05)")                   \
    X(TO_DLR, "dense-lr", GR_CLI_NUM, "dense_lr", 1e-9, 1e3, NULL, "X", NULL,                  \
      "dense parameters' learning rate for one worker (default dlrm 0.001,\n"                 \
      "lr 0.01); sync and hybrid use X * sqrt(W)")                                             \
    X(TO_DENSEOPT, "dense-optimizer", GR_CLI_CHOICE, "dense_optimizer", 0, 0,                  \
      "adam|adagrad|sgd", NULL, "adam", "the dense parameters' optimizer")                     \
    X(TO_EMBOPT, "emb-optimizer", GR_CLI_CHOICE, "emb_optimizer", 0, 0,                        \
      "sgd|adagrad|rowwise_adagrad|adam|ftrl", NULL, NULL,                                     \
      "embedding optimizer (default: adagrad for dlrm, ftrl for lr)")                          \
    X(TO_EMBINIT, "emb-init", GR_CLI_NUM, "emb_init", 0, 10, NULL, "X", NULL,                  \
      "embedding init uniform in [-X, X] (dlrm default 0.05; 0 = zeros)")                      \
    X(TO_EMBACC, "emb-init-acc", GR_CLI_NUM, "emb_init_acc", 0, 1e3, NULL, "X", NULL,          \
      "Adagrad initial accumulator (default 1e-7)")                                            \
    X(TO_ADMIT, "admit-min-count", GR_CLI_INT, "admit_min_count", 0, 1e6, NULL, "N", NULL,     \
      "an id gets a row once seen N times (table admission)")                                  \
    X(TO_SEED, "seed", GR_CLI_INT, "seed", 0, 9007199254740992.0, NULL, "S", "1",              \
      "dense init and embedding init seed")                                                    \
    X(TO_NOPIPE, "no-pipeline", GR_CLI_FLAG, "no_pipeline", 0, 0, NULL, NULL, NULL,            \
      "read, pull, compute and push in turn instead of overlapped")                            \
    X(TO_PIPE, "pipeline", GR_CLI_FLAG, "pipeline", 0, 0, NULL, NULL, NULL,                    \
      "overlap read, pull, compute and push (default: on, but off with the embedded\n"        \
      "cluster's direct calls and at least as many workers as CPUs)")                         \
    X(TO_DEPTH, "queue-depth", GR_CLI_INT, "queue_depth", 1, 64, NULL, "N", "1",               \
      "batches between pipeline stages")                                                       \
    X(TO_PARSE, "parse-threads", GR_CLI_INT, "parse_threads", 0, 64, NULL, "T", "0",           \
      "parser threads per worker (0: the reader stage parses)")                                \
    X(TO_STRICT, "strict", GR_CLI_FLAG, "strict", 0, 0, NULL, NULL, NULL,                      \
      "stop at the first bad line instead of skipping it")                                     \
    X(TO_SCHEMA, "schema", GR_CLI_STR, "schema", 0, 0, NULL, "FILE", NULL,                     \
      "the files' layout as JSON (docs/data.md); default: Criteo TSV")                         \
    X(TO_MINVALID, "min-valid", GR_CLI_NUM, "min_valid", 0, 1, NULL, "SHARE", "0.9",           \
      "fail when fewer than this share of a file's lines are valid examples\n"                \
      "(0: one valid example is enough)")                                                      \
    X(TO_MAX, "max-examples", GR_CLI_INT, "max_examples", 0, 1e18, NULL, "N", "0",             \
      "stop after about N training examples (0: no limit)")                                    \
    X(TO_PROGRESS, "progress", GR_CLI_NUM, "progress", 0, 86400, NULL, "SECS", "5",            \
      "progress line interval on stderr (0 = none)")                                           \
    X(TO_METRICS, "metrics-out", GR_CLI_STR, "metrics_out", 0, 0, NULL, "FILE", NULL,          \
      "write the final metrics as JSON")                                                       \
    X(TO_MAXSTEPS, "max-steps", GR_CLI_INT, "max_steps", 0, 1e15, NULL, "N", "0",              \
      "stop once every worker has done N steps (counting steps done before a resume)")         \
    X(TO_CKDIR, "ckpt-dir", GR_CLI_STR, "ckpt_dir", 0, 0, NULL, "DIR", NULL,                   \
      "checkpoint root, on the servers' filesystem (docs/checkpoints.md)")                     \
    X(TO_CKEVERY, "ckpt-every", GR_CLI_INT, "ckpt_every", 0, 1e15, NULL, "STEPS", "0",         \
      "checkpoint every STEPS steps (0: only at the end)")                                     \
    X(TO_CKKEEP, "ckpt-keep", GR_CLI_INT, "ckpt_keep", 0, 1e6, NULL, "N", "0",                 \
      "keep the newest N complete checkpoints (0: all)")                                       \
    X(TO_CKINCR, "ckpt-incremental", GR_CLI_FLAG, "ckpt_incremental", 0, 0, NULL, NULL, NULL,  \
      "write deltas on top of the previous checkpoint where possible")                         \
    X(TO_CKFULL, "ckpt-full-every", GR_CLI_INT, "ckpt_full_every", 0, 1e6, NULL, "N", "0",     \
      "with deltas: a full checkpoint at least every N")                                       \
    X(TO_CKZSTD, "ckpt-zstd", GR_CLI_INT, "ckpt_zstd", 0, 19, NULL, "L", "0",                  \
      "compress sections with zstd level L (0: raw)")                                          \
    X(TO_LOSSLOG, "loss-log", GR_CLI_STR, "loss_log", 0, 0, NULL, "FILE", NULL,                \
      "write every step's loss to FILE as 'WORKER STEP LOSS' lines (docs/python.md)")          \
    X(TO_RESUME, "resume", GR_CLI_STR, "resume", 0, 0, NULL, "DIR", NULL,                      \
      "continue from the newest complete checkpoint under DIR (or the checkpoint\n"           \
      "DIR): parameters, optimizer state and data position; nothing there yet: start\n"      \
      "from scratch; a DIR that does not exist is refused unless it is --ckpt-dir")          \
    X(TO_REUSE, "reuse-tables", GR_CLI_FLAG, "reuse_tables", 0, 0, NULL, NULL, NULL,           \
      "--servers: continue with the rows the servers' tables already hold (a run\n"          \
      "that is not a resume refuses them by default)")                                        \
    X(TO_FRESH, "fresh", GR_CLI_FLAG, "fresh", 0, 0, NULL, NULL, NULL,                         \
      "--servers: drop the tables the servers already hold and start from new ones")         \
    X(TO_COORD, "coord", GR_CLI_STR, "coord", 0, 0, NULL, "zk://HOSTS/PATH", NULL,             \
      "find the shards through the job's layout at PATH and recover when one is\n"            \
      "lost (instead of --servers; docs/operations.md)")                                       \
    X(TO_RECOVERY, "recovery", GR_CLI_CHOICE, "recovery", 0, 0, "partial|rollback", NULL,      \
      NULL, "with --coord, after a lost shard: partial = only its rows return to\n"            \
      "the newest checkpoint; rollback = every shard and the data position do\n"             \
      "(default: rollback for sync and semisync, partial otherwise)")                         \
    X(TO_RECTIMEOUT, "recovery-timeout", GR_CLI_INT, "recovery_timeout_ms", 1000, 86400000,    \
      NULL, "MS", "120000", "with --coord: how long to wait for the shards (at start, and\n"  \
      "for a standby to replace a lost one)")                                                  \
    X(TO_JOBWORKERS, "job-workers", GR_CLI_INT, "job_workers", 1, 256, NULL, "N", "1",           \
      "with --coord: the job's worker processes, each running --workers threads\n"          \
      "(they claim ranks, elect a chief and split the data; docs/coord.md)")                  \
    X(TO_FOLLOW, "follow", GR_CLI_FLAG, "follow", 0, 0, NULL, NULL, NULL,                      \
      "read --train as it grows (rotation and truncation handled; --train - reads\n"          \
      "stdin) and train until SIGTERM/SIGINT, then checkpoint and exit 0")                      \
    X(TO_WINDOW, "window", GR_CLI_INT, "window", 0, 1e8, NULL, "N", NULL,                      \
      "running AUC over the newest N predictions (made before training on them);\n"          \
      "default 100000 with --follow, else 0 (none)")                                           \
    X(TO_PUBLISH, "publish-interval", GR_CLI_INT, "publish_interval_ms", 0, 86400000, NULL,     \
      "MS", "0", "embedded cluster: publish changed rows to serving replicas every MS\n"      \
      "(granary serve --from the addresses printed at start; 0 = never)")                     \
    X(TO_PROM, "metrics", GR_CLI_STR, "metrics", 0, 0, NULL, "HOST:PORT", NULL,                \
      "serve Prometheus /metrics and /healthz here while training (the embedded\n"            \
      "cluster's shards too; docs/operations.md)")

enum { TRAIN_OPTIONS(GR_CLI_ENUM) TO_COUNT };
static const gr_cli_opt train_opts[] = {TRAIN_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec train_spec = {
    .command = "train",
    .synopsis = "granary train --train FILE [--test FILE] [options]",
    .opts = train_opts,
    .n_opts = TO_COUNT,
    .config_section = "",
    .epilog = "Checkpoints (--ckpt-*, --resume): docs/checkpoints.md, docs/operations.md; the\n"
              "servers write them. Modes and their accuracy: docs/train.md, docs/sync.md.\n"
              "Ctrl-C or SIGTERM stops at the next step boundary, writes the checkpoint and the\n"
              "metrics and exits 130/143; a second one aborts. Exit 1: the run failed or its\n"
              "final checkpoint did; 2: bad options or paths. Counts take 10k, 2.5M, 1e6.\n",
};

/* What ran, for the metrics file. */
typedef struct run_info {
    const char *backend; /* "cluster", "servers", "local" */
    bool direct;         /* the embedded cluster reached by direct call */
    unsigned shards;
    uint32_t aggregate, staleness;
    uint32_t dense_lag; /* hybrid: the job's dense lag */
    bool have_sync;      /* the shards' sync counters below were read */
    bool coord;          /* --coord: the recovery figures below are reported */
    unsigned job_workers, job_rank; /* --job-workers: the job's processes and this one's rank */
    bool chief;          /* ... and whether this process led the job at the end */
    uint32_t recoveries;
    double recovery_seconds; /* from each failure until the run went on, summed */
    double applied_steps, admitted, short_steps, dropped, waits;
} run_info;

/* Sums the shards' sync counters (the job is still installed). */
static void read_sync_stats(gr_client *c, run_info *ri)
{
    for (uint32_t s = 0; s < gr_client_shards(c); s++) {
        char *txt = NULL;
        if (gr_client_stats(c, s, &txt)) continue;
        cJSON *root = cJSON_Parse(txt);
        free(txt);
        cJSON *sy = cJSON_GetObjectItemCaseSensitive(root, "sync");
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sy, "job"))) {
            double a = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(sy, "applied_steps"));
            /* Every shard applies the same steps: report the most any shard applied. */
            if (a > ri->applied_steps) ri->applied_steps = a;
            ri->admitted += cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(sy, "admitted"));
            ri->short_steps += cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(sy, "short_steps"));
            ri->dropped += cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(sy, "dropped"));
            ri->waits += cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(sy, "waits"));
            ri->have_sync = true;
        }
        cJSON_Delete(root);
    }
}

static int write_metrics(const char *path, const gr_train_opts *o, const gr_train_result *r,
                         const run_info *ri)
{
    cJSON *j = cJSON_CreateObject();
    if (!j) return gr_seterr(GR_ENOMEM, "out of memory");
    /* NaN is not JSON: an undefined metric is null. */
    if (isnan(r->test_auc))
        cJSON_AddNullToObject(j, "auc");
    else
        cJSON_AddNumberToObject(j, "auc", r->test_auc);
    if (isnan(r->test_logloss))
        cJSON_AddNullToObject(j, "logloss");
    else
        cJSON_AddNumberToObject(j, "logloss", r->test_logloss);
    cJSON_AddNumberToObject(j, "examples_per_sec", r->examples_per_sec);
    cJSON_AddNumberToObject(j, "examples", (double)r->examples);
    cJSON_AddStringToObject(j, "mode", gr_train_mode_name(o->mode));
    cJSON_AddNumberToObject(j, "dropped_gradients", (double)r->dropped_gradients);
    cJSON_AddStringToObject(j, "model", o->model.kind == GR_MODEL_LR ? "lr" : "dlrm");
    cJSON_AddNumberToObject(j, "dim", o->emb.dim);
    cJSON_AddNumberToObject(j, "batch", (double)o->batch);
    cJSON_AddNumberToObject(j, "epochs", o->epochs);
    cJSON_AddNumberToObject(j, "workers", o->workers);
    cJSON_AddBoolToObject(j, "pipeline", o->pipeline);
    cJSON_AddNumberToObject(j, "steps", (double)r->steps);
    cJSON_AddNumberToObject(j, "train_seconds", r->train_seconds);
    if (isnan(r->last_loss))
        cJSON_AddNullToObject(j, "train_loss");
    else
        cJSON_AddNumberToObject(j, "train_loss", r->last_loss);
    cJSON_AddNumberToObject(j, "test_examples", (double)r->test_examples);
    cJSON_AddNumberToObject(j, "bad_lines", (double)r->bad_lines);
    if (o->window) {
        if (isnan(r->window_auc))
            cJSON_AddNullToObject(j, "window_auc");
        else
            cJSON_AddNumberToObject(j, "window_auc", r->window_auc);
        cJSON_AddNumberToObject(j, "window", o->window);
    }
    cJSON_AddStringToObject(j, "backend", ri->backend);
    cJSON_AddNumberToObject(j, "shards", ri->shards);
    cJSON_AddBoolToObject(j, "direct", ri->direct);
    if (o->mode == GR_MODE_SEMISYNC) cJSON_AddNumberToObject(j, "aggregate", ri->aggregate);
    if (o->mode == GR_MODE_SEMISYNC || o->mode == GR_MODE_SSP)
        cJSON_AddNumberToObject(j, "staleness", ri->staleness);
    if (o->straggler_factor > 1) {
        cJSON_AddNumberToObject(j, "straggler", o->straggler);
        cJSON_AddNumberToObject(j, "straggler_factor", o->straggler_factor);
    }
    cJSON_AddNumberToObject(j, "wait_seconds", r->wait_seconds);
    /* Seconds per stage, summed over every batch of every worker (docs/train.md). */
    cJSON *st = cJSON_AddObjectToObject(j, "stage_seconds");
    cJSON_AddNumberToObject(st, "read", r->read_seconds);
    cJSON_AddNumberToObject(st, "pull", r->pull_seconds);
    cJSON_AddNumberToObject(st, "compute", r->compute_seconds);
    cJSON_AddNumberToObject(st, "push", r->push_seconds);
    cJSON_AddNumberToObject(st, "wait", r->stage_wait_seconds);
    if (o->mode == GR_MODE_HYBRID) {
        cJSON_AddNumberToObject(j, "emb_staleness_bound", r->emb_staleness_bound);
        cJSON_AddNumberToObject(j, "dense_lag", ri->dense_lag);
        cJSON_AddNumberToObject(j, "emb_staleness_max", (double)r->emb_staleness_max);
        cJSON_AddNumberToObject(j, "emb_staleness_mean", r->emb_staleness_mean);
    }
    if (o->resume || o->ckpt_dir) {
        cJSON_AddNumberToObject(j, "resumed_step", (double)r->resumed_step);
        cJSON_AddStringToObject(j, "resumed_from", r->resumed_from);
        cJSON_AddNumberToObject(j, "ckpt_saves", r->ckpt_saves);
        cJSON_AddNumberToObject(j, "ckpt_failures", r->ckpt_failures);
        cJSON_AddNumberToObject(j, "ckpt_seconds", r->ckpt_seconds);
        cJSON_AddStringToObject(j, "ckpt_last", r->ckpt_last);
        cJSON_AddBoolToObject(j, "ckpt_final_failed", r->ckpt_final_failed);
    }
    /* Where the trained model is (the checkpoint of the final state), or null: not saved. */
    if (o->ckpt_dir && r->ckpt_last[0] && !r->ckpt_final_failed) {
        char saved[1200];
        snprintf(saved, sizeof saved, "%s/%s", o->ckpt_dir, r->ckpt_last);
        cJSON_AddStringToObject(j, "model_saved", saved);
    } else {
        cJSON_AddNullToObject(j, "model_saved");
    }
    cJSON_AddBoolToObject(j, "stopped", r->stopped);
    if (ri->job_workers > 1) {
        cJSON_AddNumberToObject(j, "job_workers", ri->job_workers);
        cJSON_AddNumberToObject(j, "job_rank", ri->job_rank);
        cJSON_AddBoolToObject(j, "chief", ri->chief);
    }
    if (ri->coord) {
        cJSON_AddNumberToObject(j, "recoveries", ri->recoveries);
        cJSON_AddNumberToObject(j, "recovery_seconds", ri->recovery_seconds);
    }
    cJSON *ws = cJSON_AddArrayToObject(j, "worker_steps");
    for (unsigned i = 0; i < o->workers && i < GR_TRAIN_MAX_REPORTED_WORKERS; i++)
        cJSON_AddItemToArray(ws, cJSON_CreateNumber((double)r->worker_steps[i]));
    cJSON *wp = cJSON_AddArrayToObject(j, "worker_position");
    for (unsigned i = 0; i < o->workers && i < GR_TRAIN_MAX_REPORTED_WORKERS; i++)
        cJSON_AddItemToArray(wp, cJSON_CreateNumber((double)r->worker_position[i]));
    if (ri->have_sync) {
        /* The shards' view: steps applied, pushes admitted into them (summed over shards),
         * steps short of K because workers had left, stale pushes dropped. */
        cJSON *sy = cJSON_AddObjectToObject(j, "sync");
        cJSON_AddNumberToObject(sy, "applied_steps", ri->applied_steps);
        cJSON_AddNumberToObject(sy, "admitted", ri->admitted);
        cJSON_AddNumberToObject(sy, "short_steps", ri->short_steps);
        cJSON_AddNumberToObject(sy, "dropped", ri->dropped);
        cJSON_AddNumberToObject(sy, "waits", ri->waits);
    }
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return gr_seterr(GR_ENOMEM, "out of memory");
    size_t len = strlen(text);
    text[len] = '\n'; /* cJSON allocates len + 1 */
    int rc = gr_write_file_atomic(path, text, len + 1);
    free(text);
    return rc;
}

/* What the command runs with, from the option values. */
typedef struct train_cmd {
    gr_train_opts o;
    gr_schema *schema; /* --schema, owned (NULL: Criteo) */
    gr_local_backend_opts bo; /* the dense optimizer (local backend, or the shards') */
    const char *metrics, *servers, *auth_file;
    const char *prom;                     /* --metrics HOST:PORT */
    unsigned shards, shard_threads;
    bool no_direct; /* --no-direct: the embedded cluster's rows over its sockets */
    bool pipeline_given; /* --pipeline or --no-pipeline */
    long aggregate, backup, staleness; /* -1: not given */
    uint32_t k, stale;                 /* semisync K and the staleness the job runs with */
    long dense_lag_given;              /* --dense-lag, -1: not given */
    uint32_t dense_lag;                /* the hybrid job's dense lag */
    uint32_t sync_timeout_ms;
    bool sync_reset, local;
    uint32_t publish_ms;
    int tables; /* GR_PS_TABLES_*: rows an earlier run left on the servers */
    const char *coord;             /* --coord */
    bool partial;                  /* --recovery partial */
    uint32_t recovery_timeout_ms;
    bool position_only;            /* the next backend restores only the data position */
    uint32_t same_epoch_retries;   /* recoveries in a row that found no shard replaced */
    unsigned job_workers;          /* --job-workers */
    tj_job *tj;                    /* one of several worker processes of the job, or NULL */
} train_cmd;

/* The values into the trainer's options: the model kind's defaults first, then what was given. */
static int apply_opts(const gr_cli_value *v, train_cmd *c)
{
    gr_model_kind kind = v[TO_MODEL].i == 0 ? GR_MODEL_LR : GR_MODEL_DLRM;
    gr_train_opts *o = &c->o;
    gr_train_opts_default(o, kind);
    /* LR's 14 dense weights (13 features + bias) need a bigger step than DLRM's MLPs to get
     * the bias to the base rate within one epoch. */
    c->bo = (gr_local_backend_opts){GR_DENSE_OPT_ADAM, kind == GR_MODEL_LR ? 1e-2f : 1e-3f,
                                    0.9f, 0.999f, 1e-8f};
    o->train_path = v[TO_TRAIN].s;
    o->test_path = v[TO_TEST].s;
    o->follow = v[TO_FOLLOW].b || (o->train_path && !strcmp(o->train_path, "-"));
    o->window = v[TO_WINDOW].given ? (uint32_t)v[TO_WINDOW].i : o->follow ? 100000u : 0u;
    c->publish_ms = (uint32_t)v[TO_PUBLISH].i;
    /* Only what was given replaces the model kind's defaults (the table's defaults say what
     * they are for --help). */
    if (v[TO_DIM].given) o->model.dim = (uint32_t)v[TO_DIM].i;
    if (v[TO_BOTTOM].given &&
        gr_model_parse_layers(v[TO_BOTTOM].s, o->model.bottom, &o->model.n_bottom)) {
        fprintf(stderr, "granary train: --bottom: %s\n", gr_errmsg());
        return 2;
    }
    if (v[TO_TOP].given && gr_model_parse_layers(v[TO_TOP].s, o->model.top, &o->model.n_top)) {
        fprintf(stderr, "granary train: --top: %s\n", gr_errmsg());
        return 2;
    }
    o->batch = (size_t)v[TO_BATCH].i;
    o->epochs = (unsigned)v[TO_EPOCHS].i;
    o->workers = (unsigned)v[TO_WORKERS].i;
    o->emb_staleness = (uint32_t)v[TO_EMBSTALE].i;
    if (v[TO_PIPE].b && v[TO_NOPIPE].b) {
        fprintf(stderr, "granary train: --pipeline and --no-pipeline contradict each other\n");
        return 2;
    }
    /* Settled in make_backend when neither is given: it depends on the shards being called
     * in process (gr_train_default_pipeline). */
    o->pipeline = !v[TO_NOPIPE].b;
    c->pipeline_given = v[TO_PIPE].b || v[TO_NOPIPE].b;
    o->queue_depth = (unsigned)v[TO_DEPTH].i;
    o->parse_threads = (unsigned)v[TO_PARSE].i;
    o->strict = v[TO_STRICT].b;
    o->min_valid = v[TO_MINVALID].d;
    if (v[TO_SCHEMA].s) {
        if (gr_schema_load(v[TO_SCHEMA].s, &c->schema)) {
            fprintf(stderr, "granary train: --schema: %s\n", gr_errmsg());
            return 2;
        }
        o->model.schema = c->schema;
    }
    o->max_examples = (uint64_t)v[TO_MAX].i;
    o->progress_s = v[TO_PROGRESS].d;
    o->max_steps = (uint64_t)v[TO_MAXSTEPS].i;
    if (v[TO_DATA].given) o->data = v[TO_DATA].i == 0 ? GR_TRAIN_DATA_STATIC : GR_TRAIN_DATA_SHARED;
    if (v[TO_LR].given) o->emb.opt.lr = (float)v[TO_LR].d;
    if (v[TO_DLR].given) c->bo.dense_lr = (float)v[TO_DLR].d;
    static const gr_dense_opt dense_opts[] = {GR_DENSE_OPT_ADAM, GR_DENSE_OPT_ADAGRAD,
                                              GR_DENSE_OPT_SGD};
    c->bo.dense_opt = dense_opts[v[TO_DENSEOPT].i];
    if (v[TO_EMBOPT].given) {
        static const gr_opt_kind emb_opts[] = {GR_OPT_SGD, GR_OPT_ADAGRAD, GR_OPT_ROWWISE_ADAGRAD,
                                               GR_OPT_ADAM, GR_OPT_FTRL};
        o->emb.opt.kind = emb_opts[v[TO_EMBOPT].i];
        if (o->emb.opt.kind == GR_OPT_ADAM) {
            o->emb.opt.beta1 = 0.9f;
            o->emb.opt.beta2 = 0.999f;
            o->emb.opt.eps = 1e-8f;
        }
    }
    if (v[TO_EMBINIT].given) {
        double x = v[TO_EMBINIT].d;
        o->emb.init.kind = x > 0 ? GR_INIT_UNIFORM : GR_INIT_ZEROS;
        o->emb.init.low = (float)-x;
        o->emb.init.high = (float)x;
    }
    if (v[TO_EMBACC].given) o->emb.opt.initial_accumulator = (float)v[TO_EMBACC].d;
    if (v[TO_ADMIT].given) o->emb.admit_min_count = (uint32_t)v[TO_ADMIT].i;
    if (v[TO_STRAG].given) {
        const char *a = v[TO_STRAG].s;
        const char *colon = strchr(a, ':');
        char *wend = NULL, *fend = NULL;
        unsigned long w = 0;
        double f = 0;
        bool ok = colon && a[0] >= '0' && a[0] <= '9';
        if (ok) {
            /* Each half is checked against its own end pointer: the worker must end exactly at
             * the ':' ("3x:3" is not worker 3) and the factor at the end of the text. */
            errno = 0;
            w = strtoul(a, &wend, 10);
            ok = !errno && wend == colon;
            errno = 0;
            f = ok ? strtod(colon + 1, &fend) : 0;
            ok = ok && !errno && fend != colon + 1 && *fend == '\0' && colon[1] != ' ' &&
                 colon[1] != '\t';
        }
        if (!ok || w > 255 || !(f >= 1 && f <= 1000)) {
            fprintf(stderr, "granary train: --straggler wants WORKER:FACTOR, a worker in "
                            "0..255 and a factor in 1..1000 (e.g. 3:3), got '%s'\n", a);
            return 2;
        }
        o->straggler = (unsigned)w;
        o->straggler_factor = f;
    }
    o->ckpt_dir = v[TO_CKDIR].s;
    o->ckpt_every = (uint64_t)v[TO_CKEVERY].i;
    o->ckpt_keep = (uint32_t)v[TO_CKKEEP].i;
    o->ckpt_incremental = v[TO_CKINCR].b;
    o->ckpt_full_every = (uint32_t)v[TO_CKFULL].i;
    o->ckpt_zstd = (int)v[TO_CKZSTD].i;
    o->resume = v[TO_RESUME].s;
    o->loss_log = v[TO_LOSSLOG].s;
    uint64_t seed = (uint64_t)v[TO_SEED].i;
    o->model.seed = seed;
    o->emb.seed = seed ^ 0x656d62;
    if (kind == GR_MODEL_DLRM) o->emb.dim = o->model.dim;
    else if (v[TO_DIM].given && o->model.dim != 1)
        fprintf(stderr, "granary train: --dim is ignored for lr (rows have dim 1)\n");

    c->metrics = v[TO_METRICS].s;
    c->prom = v[TO_PROM].s;
    c->servers = v[TO_SERVERS].s;
    c->auth_file = v[TO_AUTH].s;
    c->shards = v[TO_LOCAL].b ? 0 : (unsigned)v[TO_SHARDS].i;
    c->shard_threads = (unsigned)v[TO_SHTHREADS].i;
    c->no_direct = v[TO_NODIRECT].b;
    c->aggregate = v[TO_AGG].given ? (long)v[TO_AGG].i : -1;
    c->backup = v[TO_BACKUP].given ? (long)v[TO_BACKUP].i : -1;
    c->staleness = v[TO_STALE].given ? (long)v[TO_STALE].i : -1;
    c->dense_lag_given = v[TO_DENSELAG].given ? (long)v[TO_DENSELAG].i : -1;
    c->sync_timeout_ms = (uint32_t)v[TO_STIMEOUT].i;
    c->sync_reset = v[TO_SRESET].b;
    /* A resume replaces the tables with the checkpoint's: whatever they hold is fine. */
    c->tables = v[TO_FRESH].b ? GR_PS_TABLES_FRESH
              : v[TO_REUSE].b || o->resume ? GR_PS_TABLES_REUSE : GR_PS_TABLES_REFUSE;
    if (v[TO_FRESH].b && (v[TO_REUSE].b || o->resume)) {
        fprintf(stderr, "granary train: --fresh drops the servers' tables; it cannot go with %s\n",
                v[TO_REUSE].b ? "--reuse-tables" : "--resume (which restores them)");
        return 2;
    }
    c->coord = v[TO_COORD].s;
    c->recovery_timeout_ms = (uint32_t)v[TO_RECTIMEOUT].i;
    c->job_workers = (unsigned)v[TO_JOBWORKERS].i;
    c->local = !c->servers && !c->coord && c->shards == 0;
    /* No --mode: the trainer's choice for the worker count (the local backend is async only). */
    if (v[TO_MODE].given) {
        if (gr_train_mode_parse(v[TO_MODE].s, &o->mode)) {
            fprintf(stderr, "granary train: %s\n", gr_errmsg());
            return 2;
        }
    } else {
        o->mode = c->local ? GR_MODE_ASYNC : gr_train_default_mode(o->workers * c->job_workers);
    }
    c->partial = v[TO_RECOVERY].given ? v[TO_RECOVERY].i == 0
                                      : o->mode != GR_MODE_SYNC && o->mode != GR_MODE_SEMISYNC;
    return -1;
}

/* Combinations the table cannot see; exit status 2 when refused, -1 to go on. */
static int check_combinations(train_cmd *c)
{
    gr_train_opts *o = &c->o;
    if (!o->train_path) {
        fprintf(stderr, "granary train: --train FILE is required (see granary train --help)\n");
        return 2;
    }
    if (c->local && (o->ckpt_dir || o->resume)) {
        fprintf(stderr, "granary train: checkpoints are written by the parameter servers: drop "
                        "--local (the embedded cluster checkpoints)\n");
        return 2;
    }
    if (!o->ckpt_dir && (o->ckpt_every || o->ckpt_keep || o->ckpt_incremental || o->ckpt_zstd))
        fprintf(stderr, "granary train: --ckpt-every/--ckpt-keep/--ckpt-incremental/--ckpt-zstd "
                        "need --ckpt-dir\n");
    if (c->local && o->mode != GR_MODE_ASYNC) {
        fprintf(stderr, "granary train: --mode %s needs the parameter server's step tokens: drop "
                        "--local (the embedded cluster has them)\n", gr_train_mode_name(o->mode));
        return 2;
    }
    if (c->coord && (c->servers || c->local)) {
        fprintf(stderr, "granary train: --coord finds the shards itself: drop --servers/--local\n");
        return 2;
    }
    if (c->job_workers > 1 && !c->coord) {
        fprintf(stderr, "granary train: --job-workers %u: the worker processes find each other "
                        "through the coordinator: give --coord zk://HOSTS/PATH\n", c->job_workers);
        return 2;
    }
    if (c->job_workers > 1 && (o->follow || o->data == GR_TRAIN_DATA_SHARED || o->straggler_factor > 1)) {
        fprintf(stderr, "granary train: --job-workers %u: the processes read static ranges of one "
                        "file (drop --follow, --data shared, --straggler)\n", c->job_workers);
        return 2;
    }
    if (c->coord && !o->ckpt_dir)
        fprintf(stderr, "granary train: --coord without --ckpt-dir: a lost shard comes back "
                        "empty and a rollback has nothing to return to\n");
    if (c->aggregate >= 0 && c->backup >= 0) {
        fprintf(stderr, "granary train: give --aggregate K or --backup B, not both\n");
        return 2;
    }
    /* The job's workers: every process's threads. */
    unsigned all = o->workers * c->job_workers;
    if (c->backup >= 0 && c->backup >= (long)all) {
        fprintf(stderr, "granary train: --backup %ld leaves no worker to aggregate (%u workers)\n",
                c->backup, all);
        return 2;
    }
    c->k = c->aggregate >= 0 ? (uint32_t)c->aggregate
         : c->backup >= 0   ? all - (uint32_t)c->backup
         : all > 1          ? all - 1 : 1;
    if (o->mode == GR_MODE_SEMISYNC && c->k > all) {
        fprintf(stderr, "granary train: --aggregate %u is more than the %u workers\n", c->k, all);
        return 2;
    }
    if ((c->aggregate >= 0 || c->backup >= 0) && o->mode != GR_MODE_SEMISYNC)
        fprintf(stderr, "granary train: --aggregate/--backup only apply to --mode semisync\n");
    c->stale = c->staleness >= 0 ? (uint32_t)c->staleness : o->mode == GR_MODE_SSP ? 2 : 0;
    if (c->staleness >= 0 && o->mode != GR_MODE_SEMISYNC && o->mode != GR_MODE_SSP)
        fprintf(stderr, "granary train: --staleness only applies to semisync and ssp\n");
    /* As --staleness: a setting the mode has no use for is said and ignored. */
    if (c->dense_lag_given > 0 && o->mode != GR_MODE_HYBRID)
        fprintf(stderr, "granary train: --dense-lag only applies to --mode hybrid (mode %s runs "
                        "lock-step)\n", gr_train_mode_name(o->mode));
    c->dense_lag = o->mode != GR_MODE_HYBRID ? 0
                 : c->dense_lag_given >= 0 ? (uint32_t)c->dense_lag_given
                                           : gr_train_dense_lag_default(all);
    if (c->no_direct && (c->servers || c->shards == 0 || c->coord))
        fprintf(stderr, "granary train: --no-direct only applies to the embedded cluster (no "
                        "--servers, --local or --coord)\n");
    if (o->straggler_factor > 1 && o->straggler >= o->workers) {
        fprintf(stderr, "granary train: --straggler %u: there are only %u workers\n", o->straggler,
                o->workers);
        return 2;
    }
    return -1;
}

/* Every path the run reads or writes, before anything starts: a missing test file or an
 * unwritable metrics file found after training would cost the whole run. Checkpoint paths
 * are checked here only for the embedded cluster, whose shards share this process's
 * filesystem and directory; remote shards resolve them under their own --ckpt-root (a
 * --resume root they do not have is refused by the trainer before the first step). */
static int check_paths(const train_cmd *c)
{
    const gr_train_opts *o = &c->o;
    char err[1024];
    /* "-" is stdin (a stream, --follow implied): nothing to check. */
    int bad = strcmp(o->train_path, "-") ? gr_cli_check_input("--train", o->train_path, err, sizeof err) : 0;
    if (!bad && o->test_path) bad = gr_cli_check_input("--test", o->test_path, err, sizeof err);
    if (!bad && c->auth_file) bad = gr_cli_check_input("--auth-file", c->auth_file, err, sizeof err);
    if (!bad && c->metrics)
        bad = gr_cli_check_output_file("--metrics-out", c->metrics, err, sizeof err);
    /* The embedded cluster's checkpoints are ours to place; under --servers or --coord the
     * shards write them, under their own --ckpt-root, and a directory made here would be an
     * empty stray beside the caller. */
    bool embedded = !c->local && !c->servers && !c->coord;
    if (!bad && embedded && o->resume && !gr_cli_path_exists(o->resume) &&
        !(o->ckpt_dir && !strcmp(o->resume, o->ckpt_dir))) {
        snprintf(err, sizeof err, "--resume %s: no such checkpoint root or checkpoint (to start "
                 "a job that later resumes from there, give the same directory as --ckpt-dir)",
                 o->resume);
        bad = -1;
    }
    if (!bad && embedded && o->ckpt_dir)
        bad = gr_cli_check_output_dir("--ckpt-dir", o->ckpt_dir, err, sizeof err);
    if (bad) {
        fprintf(stderr, "granary train: %s\n", err);
        return 2;
    }
    return -1;
}

/* The backend: the local one, or the parameter-server one over remote servers or an embedded
 * cluster (started here). Prints the error itself. */
static int make_backend(train_cmd *c, run_info *ri, gr_local_cluster **cluster, gr_client **client,
                        gr_train_backend *be)
{
    memset(be, 0, sizeof *be);
    if (c->local) return gr_local_backend_create(&c->bo, be);
    if (!c->servers) {
        /* The embedded cluster: S shards in this process on free loopback ports. */
        gr_local_cluster_opts lo;
        gr_local_cluster_opts_default(&lo, c->shards);
        lo.threads = c->shard_threads;
        lo.publish_interval_ms = c->publish_ms;
        lo.metrics = c->o.metrics;
        /* Its cores idle between a step's hand-offs: new rows' page faults go there. */
        lo.populate_ahead = GR_LOCAL_CLUSTER_AHEAD;
        /* Its tables live for this run and keep growing: past their first rows, pages the
         * host backs faster (gr_server_config.huge_rows). */
        lo.huge_rows = GR_LOCAL_CLUSTER_HUGE_ROWS;
        int rc = gr_local_cluster_start_opts(&lo, cluster);
        if (rc) return rc;
        c->servers = gr_local_cluster_servers(*cluster);
    }
    gr_client_config cc;
    gr_client_config_default(&cc);
    /* The embedded cluster's own clients skip the TCP stack (docs/server.md, "Connections"). */
    cc.servers = cluster && *cluster ? gr_local_cluster_local_servers(*cluster) : c->servers;
    cc.auth_file = c->auth_file;
    cc.slice_us = GR_TRAIN_IO_SLICE_US; /* its readers wait more than they compute */
    /* Under a coordinator a shard that does not answer is replaced, not waited for: give up
     * on it soon and let the layout say where its index went. */
    if (c->coord) cc.connect_timeout_ms = 1000;
    int rc = gr_client_create(&cc, client);
    if (rc) return rc;
    /* Its rows go to the shards' tables by function call (docs/train.md, "Direct shards"). */
    if (cluster && *cluster && !c->no_direct) {
        if ((rc = gr_local_cluster_direct(*cluster, *client))) return rc;
        ri->direct = true;
        /* Its stage threads then wait on no socket: short slices would only preempt compute
         * (gr_train_opts.stage_slice_us). */
        c->o.stage_slice_us = 0;
    }
    if (!c->pipeline_given) c->o.pipeline = gr_train_default_pipeline(c->o.workers, ri->direct);
    ri->shards = gr_client_shards(*client);
    gr_ps_backend_opts po;
    gr_ps_backend_opts_default(&po);
    po.client = *client;
    po.mode = c->o.mode;
    po.workers = c->o.workers;
    po.aggregate = c->k;
    po.staleness = c->stale;
    po.dense_lag = c->dense_lag;
    po.timeout_ms = c->sync_timeout_ms;
    po.reset = c->sync_reset;
    po.tables = c->tables;
    po.resume_position_only = c->position_only;
    po.dense_opt = c->bo.dense_opt;
    /* --dense-lr is the one-worker rate; the trainer scales it for modes whose steps average
     * several workers' dense gradients. */
    po.dense_lr = gr_train_dense_lr(c->o.mode, c->o.workers * c->job_workers, c->bo.dense_lr);
    if (c->tj) {
        /* One process of several: the job's workers, this one's first, the run's owner; only
         * the process that sets the job up writes the dense values and resets the sync job. */
        po.job_workers = c->o.workers * c->job_workers;
        po.worker_base = tj_rank(c->tj) * c->o.workers;
        po.owner = tj_owner(c->tj);
        po.joined = !tj_initialises(c->tj);
    }
    po.beta1 = c->bo.beta1;
    po.beta2 = c->bo.beta2;
    po.eps = c->bo.eps;
    return gr_ps_backend_create(&po, be);
}

static void print_start(const train_cmd *c, const run_info *ri, bool cluster)
{
    const gr_train_opts *o = &c->o;
    char modebuf[96];
    if (o->mode == GR_MODE_SEMISYNC)
        snprintf(modebuf, sizeof modebuf, "semisync (K %u of %u, staleness %u)", c->k, o->workers,
                 c->stale);
    else if (o->mode == GR_MODE_SSP)
        snprintf(modebuf, sizeof modebuf, "ssp (staleness %u)", c->stale);
    else if (o->mode == GR_MODE_HYBRID)
        snprintf(modebuf, sizeof modebuf, "hybrid (dense sync, dense lag %u, embedding staleness "
                 "<= %u)", c->dense_lag, o->emb_staleness);
    else
        snprintf(modebuf, sizeof modebuf, "%s", gr_train_mode_name(o->mode));
    fprintf(stderr, "train: %s dim %u, batch %zu x %u workers, %u epoch(s), mode %s, %s, %s\n",
            o->model.kind == GR_MODEL_LR ? "lr" : "dlrm", o->emb.dim, o->batch, o->workers,
            o->epochs, modebuf, o->pipeline ? "pipelined" : "sequential",
            c->local ? "local backend" : cluster ? "embedded cluster" : "remote servers");
    if (!c->local) fprintf(stderr, "train: %u shard(s) at %s\n", ri->shards, c->servers);
    if (c->schema && !gr_schema_is_criteo(c->schema))
        fprintf(stderr, "train: schema: %u columns, %u dense, %u sparse%s, delimiter '%s'%s\n",
                gr_schema_n_columns(c->schema), gr_schema_n_dense(c->schema),
                gr_schema_n_sparse(c->schema), gr_schema_has_lists(c->schema) ? " (with lists)" : "",
                gr_schema_delimiter(c->schema) == '\t' ? "\\t" : (char[2]){gr_schema_delimiter(c->schema), 0},
                gr_schema_header(c->schema) ? ", header line" : "");
    if (o->straggler_factor > 1)
        fprintf(stderr, "train: worker %u is a straggler (x%g)\n", o->straggler,
                o->straggler_factor);
}

/* The run's last words: where the model is and the command that continues from it, or that
 * it was not saved and why. `failed`: training itself failed (then only checkpoints written
 * before the failure exist). */
static void print_model(const train_cmd *c, const gr_train_result *r, const run_info *ri,
                        bool failed, int argc, char **argv)
{
    const gr_train_opts *o = &c->o;
    const char *remote = !strcmp(ri->backend, "servers") ? " (on the servers, under their --ckpt-root)" : "";
    if (!o->ckpt_dir) {
        if (c->local)
            fprintf(stderr, "train: the model was not saved (--local keeps no checkpoints; drop "
                            "--local and give --ckpt-dir DIR to keep it)\n");
        else
            fprintf(stderr, "train: the model was not saved (give --ckpt-dir DIR to keep it)\n");
        return;
    }
    if (r->ckpt_final_failed)
        fprintf(stderr, "granary train: the final checkpoint failed: %s\n"
                        "granary train: the model of this run is NOT saved%s%s%s%s\n",
                r->ckpt_final_error, r->ckpt_last[0] ? "; the newest checkpoint, older than the "
                                                       "end of training, is " : "",
                r->ckpt_last[0] ? o->ckpt_dir : "", r->ckpt_last[0] ? "/" : "", r->ckpt_last);
    if (!r->ckpt_last[0] && ri->job_workers > 1 && !ri->chief) {
        /* Only the job's chief writes the job's checkpoints: this process's rows are in them. */
        fprintf(stderr, "train: the job's checkpoints are written by its chief under %s%s; this "
                        "process (rank %u) writes none\n", o->ckpt_dir, remote, ri->job_rank);
        return;
    }
    if (!r->ckpt_last[0]) {
        if (!r->ckpt_final_failed)
            fprintf(stderr, "train: no checkpoint was written under %s%s (%s)\n", o->ckpt_dir,
                    remote, r->resumed_from[0] ? "the model is as resumed" : "nothing was trained");
        return;
    }
    if (!r->ckpt_final_failed)
        fprintf(stderr, "train: %s %s/%s%s; resume with:\n  ",
                failed ? "the newest checkpoint of this run is" : "model saved to", o->ckpt_dir,
                r->ckpt_last, remote);
    else
        fprintf(stderr, "train: to continue from that checkpoint:\n  ");
    gr_cli_print_command(stderr, argc, argv, "resume", o->ckpt_dir);
}

/* The exit status of a run that trained to its end or to a stop: 1 when the model of the
 * final state is not saved (its checkpoint failed) or the metrics file could not be written;
 * 128 + N when signal N stopped it (130 SIGINT, 143 SIGTERM: the shell's status for a process
 * that signal ended, so a script sees the run did not finish, although its checkpoint and
 * metrics are written); else 0. A check of the result that should fail the run (too few valid
 * examples, say) goes here. */
static int exit_status(const gr_train_result *r, bool metrics_ok)
{
    if (r->ckpt_final_failed || !metrics_ok) return 1;
    if (r->stopped) return gr_cli_signal_status(gr_cli_stop_signal());
    return 0;
}

static int report(const train_cmd *c, const gr_train_result *r, const run_info *ri)
{
    const gr_train_opts *o = &c->o;
    if (o->mode != GR_MODE_ASYNC)
        fprintf(stderr, "train: waited %.1f s for steps (all workers), %llu gradients dropped%s\n",
                r->wait_seconds, (unsigned long long)r->dropped_gradients,
                ri->have_sync ? "" : " (shard stats unavailable)");
    if (o->mode == GR_MODE_HYBRID)
        fprintf(stderr, "train: embedding staleness (own batches not yet pushed at a pull): max "
                        "%llu, mean %.2f, bound %u\n", (unsigned long long)r->emb_staleness_max,
                r->emb_staleness_mean, r->emb_staleness_bound);
    if (r->resumed_from[0])
        fprintf(stderr, "train: resumed from %s/%s (step %llu)\n", o->resume, r->resumed_from,
                (unsigned long long)r->resumed_step);
    if (o->ckpt_dir)
        fprintf(stderr, "train: %u checkpoint(s) saved under %s (last %s), %u failed, workers "
                        "paused %.2f s for them\n", r->ckpt_saves, o->ckpt_dir,
                r->ckpt_last[0] ? r->ckpt_last : "none", r->ckpt_failures, r->ckpt_seconds);
    fprintf(stderr,
            "train: done: %llu examples in %.1f s (%.0f examples/s), last train loss %.5f, "
            "%llu bad lines\n",
            (unsigned long long)r->examples, r->train_seconds, r->examples_per_sec, r->last_loss,
            (unsigned long long)r->bad_lines);
    if (o->test_path && !r->stopped)
        fprintf(stderr, "test: %llu examples, AUC %.5f, logloss %.5f\n",
                (unsigned long long)r->test_examples, r->test_auc, r->test_logloss);
    else if (o->test_path && r->stopped)
        fprintf(stderr, "test: not scored (the run was stopped)\n");
    printf("auc %.6f logloss %.6f examples_per_sec %.1f examples %llu mode %s\n", r->test_auc,
           r->test_logloss, r->examples_per_sec, (unsigned long long)r->examples,
           gr_train_mode_name(o->mode));
    if (r->stopped)
        fprintf(stderr, "train: stopped by %s after %llu steps (exit status %d)\n",
                gr_cli_signal_name(gr_cli_stop_signal()), (unsigned long long)r->steps,
                gr_cli_signal_status(gr_cli_stop_signal()));
    /* One of several worker processes: the chief writes the job's metrics file, each other
     * process its own beside it (FILE.rank-R). */
    char own[4200];
    const char *metrics = c->metrics;
    if (metrics && ri->job_workers > 1 && !ri->chief) {
        snprintf(own, sizeof own, "%s.rank-%u", metrics, ri->job_rank);
        metrics = own;
    }
    if (metrics && write_metrics(metrics, o, r, ri)) {
        fprintf(stderr, "granary train: --metrics-out: %s\n", gr_errmsg());
        return 1;
    }
    return 0;
}

/* Follow mode with --metrics-out: the file is rewritten at every progress line with the
 * running figures, so a long run can be watched; the final metrics replace it at the end. */
static void on_progress(void *ctx, const gr_train_progress *p)
{
    const char *path = ctx;
    if (p->final) return;
    cJSON *j = cJSON_CreateObject();
    if (!j) return;
    cJSON_AddBoolToObject(j, "running", true);
    cJSON_AddNumberToObject(j, "seconds", p->seconds);
    cJSON_AddNumberToObject(j, "examples", (double)p->examples);
    cJSON_AddNumberToObject(j, "examples_per_sec", p->examples_per_sec);
    if (isnan(p->loss)) cJSON_AddNullToObject(j, "train_loss");
    else cJSON_AddNumberToObject(j, "train_loss", p->loss);
    if (isnan(p->window_auc)) cJSON_AddNullToObject(j, "window_auc");
    else cJSON_AddNumberToObject(j, "window_auc", p->window_auc);
    cJSON_AddNumberToObject(j, "window_examples", (double)p->window_examples);
    cJSON_AddNumberToObject(j, "bad_lines", (double)p->bad_lines);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return;
    size_t len = strlen(text);
    text[len] = '\n';
    if (gr_write_file_atomic(path, text, len + 1))
        GR_LOGW("--metrics-out: %s", gr_errmsg());
    free(text);
}

/* After a coordinated run failed for a lost shard: waits until a standby serves its index,
 * connects to the new layout and runs again from the newest checkpoint under --ckpt-dir
 * (partial: the data position only, the shards keep their rows; rollback: everything). */
static int recover(train_cmd *c, run_info *ri, tc_job *job, gr_client **client,
                   gr_train_backend *be, gr_train_result *r, char *errbuf, size_t cap)
{
    double t0 = gr_now_s();
    uint64_t epoch = *client ? gr_client_epoch(*client) : tc_epoch(job);
    fprintf(stderr, "train: %s; waiting for the job to heal (recovery %s)\n", errbuf,
            c->partial ? "partial" : "rollback");
    if (c->tj) tj_recover_mark(c->tj); /* the chief waits for every process to stop */
    gr_train_backend_destroy(be);
    gr_client_destroy(*client);
    *client = NULL;
    int rc = tc_wait_healed(job, epoch, c->recovery_timeout_ms);
    /* Healed at the same epoch: no shard was replaced (a shard was still restoring, or a
     * transient failure). Go on, but not forever for an error that keeps coming back. */
    if (!rc && tc_epoch(job) == epoch && ++c->same_epoch_retries > 3)
        rc = gr_seterr(GR_EIO, "the run failed %u times in a row with every shard serving "
                       "(last: %s)", c->same_epoch_retries, errbuf);
    if (!rc && tc_epoch(job) != epoch) c->same_epoch_retries = 0;
    /* One of several processes: the leader sets the job up again (restore, sync job reset);
     * the others wait for it and join, reading only their data position. */
    if (!rc && c->tj) rc = tj_recover_join(c->tj, c->recovery_timeout_ms);
    if (!rc) {
        bool sets_up = !c->tj || tj_initialises(c->tj);
        c->servers = tc_servers(job);
        c->sync_reset = sets_up; /* the survivors still hold the failed run's job */
        c->tables = GR_PS_TABLES_REUSE; /* ... and its rows: this job's own, to continue */
        c->position_only = c->partial || !sets_up;
        if (c->o.ckpt_dir) c->o.resume = c->o.ckpt_dir;
        rc = make_backend(c, ri, NULL, client, be);
    }
    if (!rc) {
        tc_attach(job, *client);
        ri->recoveries++;
        ri->recovery_seconds += gr_now_s() - t0;
        fprintf(stderr, "train: recovered in %.1f s at layout epoch %llu; continuing from %s\n",
                gr_now_s() - t0, (unsigned long long)tc_epoch(job),
                c->o.resume ? c->o.resume : "the shards' rows (no --ckpt-dir)");
        rc = gr_train_run(&c->o, be, r);
    }
    if (rc) snprintf(errbuf, cap, "%s", gr_errmsg());
    return rc;
}

/* --metrics: the registry (with the process's series) and its endpoint; /healthz answers ok
 * while the process runs. */
static int start_metrics(const char *listen, gr_metrics **reg, gr_metrics_http **http)
{
    int rc = gr_metrics_create(reg);
    if (!rc) rc = gr_metrics_add_process(*reg);
    if (!rc) rc = gr_metrics_http_start(*reg, listen, NULL, NULL, http);
    if (!rc) fprintf(stderr, "train: metrics on port %u\n", gr_metrics_http_port(*http));
    return rc;
}

int gr_cli_train(int argc, char **argv)
{
    gr_cli_value v[TO_COUNT];
    gr_cli_parsed p;
    int exit_now = gr_cli_parse_or_exit(&train_spec, argc, argv, v, &p);
    train_cmd c;
    memset(&c, 0, sizeof c);
    if (exit_now < 0) exit_now = apply_opts(v, &c);
    if (exit_now < 0) exit_now = check_combinations(&c);
    if (exit_now < 0) exit_now = check_paths(&c);
    if (exit_now >= 0) {
        gr_schema_destroy(c.schema);
        gr_cli_parsed_fini(&p);
        return exit_now;
    }
    run_info ri = {.backend = c.local ? "local" : c.coord ? "coord" : c.servers ? "servers" : "cluster",
                   .shards = c.local ? 0 : c.shards, .aggregate = c.k, .staleness = c.stale,
                   .dense_lag = c.dense_lag,
                   .coord = c.coord != NULL};
    /* The embedded shards' info lines (listening, table created, job installed) would mix
     * into the trainer's own; GRANARY_LOG=info shows them (warnings show anyway). */
    if (!getenv("GRANARY_LOG")) gr_log_set_level(GR_LOG_WARN);
    gr_cli_stop_signals_install("train");
    c.o.should_stop = gr_cli_stop_requested;
    gr_local_cluster *cluster = NULL;
    gr_client *client = NULL;
    gr_train_backend be;
    memset(&be, 0, sizeof be);
    tc_job *job = NULL;
    bool took_over = false;
    gr_metrics *metrics = NULL;
    gr_metrics_http *metrics_http = NULL;
    int rc = c.prom ? start_metrics(c.prom, &metrics, &metrics_http) : 0;
    c.o.metrics = metrics;
    if (!rc && c.coord && c.job_workers > 1) {
        tj_want want = {c.job_workers, c.o.workers, gr_train_mode_name(c.o.mode),
                        c.recovery_timeout_ms, c.auth_file, !c.partial};
        rc = tj_open(c.coord, &want, &c.tj);
        if (!rc) {
            job = tj_tc(c.tj);
            c.servers = tc_servers(job);
            ri.job_workers = c.job_workers;
            ri.job_rank = tj_rank(c.tj);
            if (!tj_initialises(c.tj)) {
                /* The chief declared the tables (they may hold its rows by now) and restored
                 * any checkpoint: this process reads only its position there. */
                c.tables = GR_PS_TABLES_REUSE;
                c.position_only = true;
            }
            /* A replacement for a lost rank continues from the job's newest checkpoint, the
             * job's rows kept; one that leads by now (the chief died meanwhile) sets the job up
             * again from there as a recovery would. */
            if (tj_joining(c.tj)) {
                if (c.o.ckpt_dir && !c.o.resume) c.o.resume = c.o.ckpt_dir;
                c.tables = GR_PS_TABLES_REUSE;
                c.position_only = !tj_initialises(c.tj) || c.partial;
                c.sync_reset = tj_initialises(c.tj);
            }
        }
    } else if (!rc && c.coord) {
        rc = tc_open(c.coord, c.recovery_timeout_ms, &job, &took_over);
    }
    if (job && !c.tj) {
        c.servers = tc_servers(job);
        if (took_over && c.o.ckpt_dir && !c.o.resume) c.o.resume = c.o.ckpt_dir;
        c.position_only = took_over && c.partial;
        c.sync_reset = c.sync_reset || took_over;
        if (took_over) c.tables = GR_PS_TABLES_REUSE; /* the job's rows, to continue */
    }
    if (!rc) rc = make_backend(&c, &ri, &cluster, &client, &be);
    if (!rc && job) tc_attach(job, client);
    if (c.tj && (!rc || tc_recoverable(rc))) c.o.job = tj_train_hooks(c.tj);
    /* A shard lost between the barrier and the first request (the others may have trained a
     * while already): recover as from a failed run. */
    char errbuf[600] = "";
    bool lost_at_start = rc && job && tc_recoverable(rc);
    if (lost_at_start) snprintf(errbuf, sizeof errbuf, "%s", gr_errmsg());
    if (rc && !lost_at_start) {
        if (c.tj) tj_close(c.tj);
        else tc_close(job);
        fprintf(stderr, "granary train: %s\n", gr_errmsg());
        gr_cli_explain_no_reply("train", gr_errmsg());
        gr_client_destroy(client);
        gr_local_cluster_stop(cluster);
        gr_schema_destroy(c.schema);
        gr_metrics_http_stop(metrics_http);
        gr_metrics_destroy(metrics);
        gr_cli_stop_signals_restore();
        gr_cli_parsed_fini(&p);
        return 1;
    }
    if (!lost_at_start) print_start(&c, &ri, cluster != NULL);
    if (cluster && c.publish_ms)
        fprintf(stderr, "train: publishing every %u ms to replicas: granary serve --from %s\n",
                c.publish_ms, c.servers);
    /* Follow mode: the stop signals (should_stop above) end the stream, which is how a
     * stream's training ends: the run is not "stopped", it saves its last checkpoint and exits
     * 0. */
    if (c.o.follow && c.metrics) {
        c.o.on_progress = on_progress;
        c.o.progress_ctx = (void *)c.metrics;
    }
    gr_train_result r;
    memset(&r, 0, sizeof r);
    if (!lost_at_start) rc = gr_train_run(&c.o, &be, &r);
    if (rc && !lost_at_start) snprintf(errbuf, sizeof errbuf, "%s", gr_errmsg());
    for (;;) {
        /* Done with its data and waiting for the others, but the job recovers: run again. */
        if (!rc && c.tj && tj_must_recover(c.tj)) {
            rc = GR_ESTALE;
            snprintf(errbuf, sizeof errbuf, "the job recovers while this process waits for the "
                     "others");
        }
        if (!(rc && job && (tc_recoverable(rc) || (c.tj && tj_recovering(c.tj))))) break;
        /* A shard was lost (or the job re-admits a process): heal, then go on. */
        rc = recover(&c, &ri, job, &client, &be, &r, errbuf, sizeof errbuf);
    }
    ri.chief = c.tj && tj_is_chief(c.tj);
    if (client && c.o.mode != GR_MODE_ASYNC) {
        if (!rc) read_sync_stats(client, &ri);
        /* Drop the job from the shards; in a job of several processes the chief does, once
         * the others are done. */
        if (!c.tj || ri.chief) gr_ps_backend_finish(&be);
    }
    if (c.tj && ri.chief && !rc) tj_done(c.tj);
    gr_train_backend_destroy(&be);
    gr_client_destroy(client);
    gr_local_cluster_stop(cluster);
    if (c.tj) tj_close(c.tj);
    else tc_close(job);
    if (rc) fprintf(stderr, "granary train: %s: %s\n", gr_strerror(rc), errbuf);
    int status = 1;
    if (!rc) status = exit_status(&r, report(&c, &r, &ri) == 0);
    print_model(&c, &r, &ri, rc != 0, argc, argv);
    gr_cli_stop_signals_restore();
    gr_schema_destroy(c.schema);
    gr_metrics_http_stop(metrics_http);
    gr_metrics_destroy(metrics);
    gr_cli_parsed_fini(&p);
    return status;
}

/* The option table, for the controller's checks of job arguments (cli/job_args.c). */
const gr_cli_spec *gr_cli_train_spec(void);
const gr_cli_spec *gr_cli_train_spec(void) { return &train_spec; }
