/* `granary train`: trains LR or DLRM on Criteo-layout files with W worker threads against a
 * parameter-server cluster (an embedded one of S in-process shards by default, or remote
 * servers), in async, sync, semisync or ssp mode, or against the in-process local backend
 * (--local). Prints progress on stderr and reports test AUC/logloss and throughput, also as
 * JSON (--metrics-out). */
#include "cli/cli.h"
#include "granary/cluster.h"
#include "granary/client.h"
#include "granary/train.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: granary train --train FILE [--test FILE] [options]\n"
            "  --model lr|dlrm      model (default dlrm)\n"
            "  --dim D              DLRM embedding dim (default 16)\n"
            "  --bottom LIST        DLRM bottom hidden sizes (default 64,32; output is D)\n"
            "  --top LIST           DLRM top hidden sizes (default 128,64; output is 1)\n"
            "  --batch B            examples per worker step (default 1024)\n"
            "  --epochs E           passes over the training file (default 1)\n"
            "  --workers W          worker threads (default 2)\n"
            "  --mode M             async, sync, semisync, ssp or hybrid (docs/sync.md); default:\n"
            "                       async for 1 worker (and --local), hybrid for more\n"
            "  --emb-staleness S    hybrid: a worker's unpushed batches allowed at a pull (default 0)\n"
            "  --aggregate K        semisync: gradients per applied step (default N-1, N > 1)\n"
            "  --backup B           semisync: B backup workers, i.e. K = N - B\n"
            "  --staleness S        semisync: drop gradients older than S steps (default 0);\n"
            "                       ssp: run at most S steps ahead of the slowest (default 2)\n"
            "  --straggler W:F      slow worker W down F times (sleeps (F-1) x its compute time)\n"
            "  --sync-timeout MS    a step waiting longer than this for the others fails\n"
            "                       (default 60000)\n"
            "  --sync-reset         replace a different sync job the servers still run\n"
            "  --data static|shared how workers split the file (default: static for sync and one\n"
            "                       worker, shared chunks otherwise)\n"
            "  --shards S           shards of the embedded local cluster (default 2)\n"
            "  --shard-threads T    worker threads per embedded shard (default 2)\n"
            "  --servers LIST       use these parameter servers host:port,... instead\n"
            "  --auth-file F        the servers' shared secret (with --servers)\n"
            "  --local              no parameter server: the in-process local backend (async\n"
            "                       only; same as --shards 0)\n"
            "  --lr X               embedding learning rate (Adagrad lr; LR: FTRL alpha)\n"
            "                       (default 0.05)\n"
            "  --dense-lr X         dense parameters' learning rate for one worker (default dlrm\n"
            "                       0.001, lr 0.01); sync and hybrid use X * sqrt(W)\n"
            "  --dense-optimizer O  adam (default), adagrad or sgd\n"
            "  --emb-optimizer O    adagrad (dlrm default), rowwise_adagrad, adam, sgd, ftrl (lr\n"
            "                       default)\n"
            "  --emb-init X         embedding init uniform in [-X, X] (dlrm default 0.05; 0 = zeros)\n"
            "  --emb-init-acc X     Adagrad initial accumulator (default 1e-7)\n"
            "  --admit-min-count N  an id gets a row once seen N times (table admission)\n"
            "  --seed S             dense init and embedding init seed (default 1)\n"
            "  --no-pipeline        read, pull, compute and push in turn instead of overlapped\n"
            "  --queue-depth N      batches between pipeline stages (default 1)\n"
            "  --parse-threads T    parser threads per worker (default 0: the reader stage parses)\n"
            "  --strict             stop at the first bad line instead of skipping it\n"
            "  --max-examples N     stop after about N training examples\n"
            "  --progress SECS      progress line interval on stderr (default 5; 0 = none)\n"
            "  --metrics-out FILE   write the final metrics as JSON\n"
            "  --max-steps N        stop once every worker has done N steps (counting steps done\n"
            "                       before a resume)\n"
            "checkpoints (docs/checkpoints.md, docs/operations.md; the servers write them):\n"
            "  --ckpt-dir DIR       checkpoint root, on the servers' filesystem\n"
            "  --ckpt-every STEPS   checkpoint every STEPS steps (default 0: only at the end)\n"
            "  --ckpt-keep N        keep the newest N complete checkpoints (default 0: all)\n"
            "  --ckpt-incremental   write deltas on top of the previous checkpoint where possible\n"
            "  --ckpt-full-every N  with deltas: a full checkpoint at least every N\n"
            "  --ckpt-zstd L        compress sections with zstd level L (1..19; default 0: raw)\n"
            "  --resume DIR         continue from the newest complete checkpoint under DIR (or the\n"
            "                       checkpoint DIR): parameters, optimizer state and data position;\n"
            "                       nothing there: start from scratch\n");
}

static int parse_num(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !(v >= lo && v <= hi)) {
        fprintf(stderr, "granary train: %s wants a number in [%g, %g], got '%s'\n", opt, lo, hi,
                s);
        return -1;
    }
    *out = v;
    return 0;
}

/* What ran, for the metrics file. */
typedef struct run_info {
    const char *backend; /* "cluster", "servers", "local" */
    unsigned shards;
    uint32_t aggregate, staleness;
    bool have_sync;      /* the shards' sync counters below were read */
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
    cJSON_AddStringToObject(j, "backend", ri->backend);
    cJSON_AddNumberToObject(j, "shards", ri->shards);
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
    }
    cJSON *ws = cJSON_AddArrayToObject(j, "worker_steps");
    for (unsigned i = 0; i < o->workers && i < GR_TRAIN_MAX_REPORTED_WORKERS; i++)
        cJSON_AddItemToArray(ws, cJSON_CreateNumber((double)r->worker_steps[i]));
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

int gr_cli_train(int argc, char **argv)
{
    enum {
        O_TRAIN = 256, O_TEST, O_MODEL, O_DIM, O_BATCH, O_EPOCHS, O_MODE, O_WORKERS, O_SHARDS,
        O_SERVERS, O_METRICS, O_NOPIPE, O_SEED, O_LR, O_DLR, O_BOTTOM, O_TOP, O_PARSE, O_STRICT,
        O_MAX, O_PROGRESS, O_EMBOPT, O_EMBINIT, O_EMBACC, O_DENSEOPT, O_ADMIT, O_DEPTH,
        O_AGG, O_BACKUP, O_STALE, O_STRAG, O_STIMEOUT, O_SRESET, O_DATA, O_SHTHREADS, O_AUTH,
        O_LOCAL, O_CKDIR, O_CKEVERY, O_CKKEEP, O_CKINCR, O_CKFULL, O_CKZSTD, O_RESUME,
        O_MAXSTEPS, O_EMBSTALE,
    };
    static const struct option opts[] = {
        {"train", required_argument, NULL, O_TRAIN},     {"test", required_argument, NULL, O_TEST},
        {"model", required_argument, NULL, O_MODEL},     {"dim", required_argument, NULL, O_DIM},
        {"batch", required_argument, NULL, O_BATCH},     {"epochs", required_argument, NULL, O_EPOCHS},
        {"mode", required_argument, NULL, O_MODE},       {"workers", required_argument, NULL, O_WORKERS},
        {"shards", required_argument, NULL, O_SHARDS},   {"servers", required_argument, NULL, O_SERVERS},
        {"metrics-out", required_argument, NULL, O_METRICS},
        {"no-pipeline", no_argument, NULL, O_NOPIPE},    {"seed", required_argument, NULL, O_SEED},
        {"lr", required_argument, NULL, O_LR},           {"dense-lr", required_argument, NULL, O_DLR},
        {"bottom", required_argument, NULL, O_BOTTOM},   {"top", required_argument, NULL, O_TOP},
        {"parse-threads", required_argument, NULL, O_PARSE},
        {"strict", no_argument, NULL, O_STRICT},         {"max-examples", required_argument, NULL, O_MAX},
        {"progress", required_argument, NULL, O_PROGRESS},
        {"emb-optimizer", required_argument, NULL, O_EMBOPT},
        {"emb-init", required_argument, NULL, O_EMBINIT},
        {"emb-init-acc", required_argument, NULL, O_EMBACC},
        {"dense-optimizer", required_argument, NULL, O_DENSEOPT},
        {"admit-min-count", required_argument, NULL, O_ADMIT},
        {"queue-depth", required_argument, NULL, O_DEPTH},
        {"aggregate", required_argument, NULL, O_AGG},   {"backup", required_argument, NULL, O_BACKUP},
        {"staleness", required_argument, NULL, O_STALE},
        {"straggler", required_argument, NULL, O_STRAG},
        {"sync-timeout", required_argument, NULL, O_STIMEOUT},
        {"sync-reset", no_argument, NULL, O_SRESET},     {"data", required_argument, NULL, O_DATA},
        {"shard-threads", required_argument, NULL, O_SHTHREADS},
        {"auth-file", required_argument, NULL, O_AUTH},  {"local", no_argument, NULL, O_LOCAL},
        {"ckpt-dir", required_argument, NULL, O_CKDIR},
        {"ckpt-every", required_argument, NULL, O_CKEVERY},
        {"ckpt-keep", required_argument, NULL, O_CKKEEP},
        {"ckpt-incremental", no_argument, NULL, O_CKINCR},
        {"ckpt-full-every", required_argument, NULL, O_CKFULL},
        {"ckpt-zstd", required_argument, NULL, O_CKZSTD},
        {"resume", required_argument, NULL, O_RESUME},
        {"max-steps", required_argument, NULL, O_MAXSTEPS},
        {"emb-staleness", required_argument, NULL, O_EMBSTALE},
        {"help", no_argument, NULL, 'h'},                {NULL, 0, NULL, 0},
    };
    /* First pass: the model kind decides the defaults the other options change. */
    gr_model_kind kind = GR_MODEL_DLRM;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--model")) {
            if (!strcmp(argv[i + 1], "lr"))
                kind = GR_MODEL_LR;
            else if (strcmp(argv[i + 1], "dlrm")) {
                fprintf(stderr, "granary train: --model must be lr or dlrm, got '%s'\n",
                        argv[i + 1]);
                return 2;
            }
        }
    gr_train_opts o;
    gr_train_opts_default(&o, kind);
    /* LR's 14 dense weights (13 features + bias) need a bigger step than DLRM's MLPs to get
     * the bias to the base rate within one epoch. */
    gr_local_backend_opts bo = {GR_DENSE_OPT_ADAM, kind == GR_MODEL_LR ? 1e-2f : 1e-3f, 0.9f,
                                0.999f, 1e-8f};
    const char *metrics = NULL, *servers = NULL, *auth_file = NULL;
    double v;
    long shards = 2, shard_threads = 2, aggregate = -1, backup = -1, staleness = -1;
    double sync_timeout = 60000;
    bool sync_reset = false;
    bool dim_set = false, mode_set = false;
    uint64_t seed = 1;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_TRAIN: o.train_path = optarg; break;
        case O_TEST: o.test_path = optarg; break;
        case O_MODEL: break; /* handled above */
        case O_DIM:
            if (parse_num("--dim", optarg, 1, GR_TABLE_DIM_MAX, &v)) return 2;
            o.model.dim = (uint32_t)v;
            dim_set = true;
            break;
        case O_BATCH:
            if (parse_num("--batch", optarg, 1, 1 << 20, &v)) return 2;
            o.batch = (size_t)v;
            break;
        case O_EPOCHS:
            if (parse_num("--epochs", optarg, 1, 1000, &v)) return 2;
            o.epochs = (unsigned)v;
            break;
        case O_MODE:
            if (gr_train_mode_parse(optarg, &o.mode)) {
                fprintf(stderr, "granary train: %s\n", gr_errmsg());
                return 2;
            }
            mode_set = true;
            break;
        case O_WORKERS:
            if (parse_num("--workers", optarg, 1, 256, &v)) return 2;
            o.workers = (unsigned)v;
            break;
        case O_SHARDS:
            if (parse_num("--shards", optarg, 0, 256, &v)) return 2;
            shards = (long)v;
            break;
        case O_SERVERS: servers = optarg; break;
        case O_METRICS: metrics = optarg; break;
        case O_NOPIPE: o.pipeline = false; break;
        case O_SEED:
            if (parse_num("--seed", optarg, 0, 9007199254740992.0, &v)) return 2;
            seed = (uint64_t)v;
            break;
        case O_LR:
            if (parse_num("--lr", optarg, 1e-9, 1e3, &v)) return 2;
            o.emb.opt.lr = (float)v;
            break;
        case O_DLR:
            if (parse_num("--dense-lr", optarg, 1e-9, 1e3, &v)) return 2;
            bo.dense_lr = (float)v;
            break;
        case O_BOTTOM:
            if (gr_model_parse_layers(optarg, o.model.bottom, &o.model.n_bottom)) {
                fprintf(stderr, "granary train: --bottom: %s\n", gr_errmsg());
                return 2;
            }
            break;
        case O_TOP:
            if (gr_model_parse_layers(optarg, o.model.top, &o.model.n_top)) {
                fprintf(stderr, "granary train: --top: %s\n", gr_errmsg());
                return 2;
            }
            break;
        case O_PARSE:
            if (parse_num("--parse-threads", optarg, 0, 64, &v)) return 2;
            o.parse_threads = (unsigned)v;
            break;
        case O_STRICT: o.strict = true; break;
        case O_MAX:
            if (parse_num("--max-examples", optarg, 0, 1e18, &v)) return 2;
            o.max_examples = (uint64_t)v;
            break;
        case O_PROGRESS:
            if (parse_num("--progress", optarg, 0, 86400, &v)) return 2;
            o.progress_s = v;
            break;
        case O_EMBOPT:
            if (!strcmp(optarg, "sgd")) o.emb.opt.kind = GR_OPT_SGD;
            else if (!strcmp(optarg, "adagrad")) o.emb.opt.kind = GR_OPT_ADAGRAD;
            else if (!strcmp(optarg, "rowwise_adagrad")) o.emb.opt.kind = GR_OPT_ROWWISE_ADAGRAD;
            else if (!strcmp(optarg, "adam")) o.emb.opt.kind = GR_OPT_ADAM;
            else if (!strcmp(optarg, "ftrl")) o.emb.opt.kind = GR_OPT_FTRL;
            else {
                fprintf(stderr, "granary train: --emb-optimizer: sgd, adagrad, rowwise_adagrad, "
                                "adam or ftrl, not '%s'\n", optarg);
                return 2;
            }
            if (o.emb.opt.kind == GR_OPT_ADAM) {
                o.emb.opt.beta1 = 0.9f;
                o.emb.opt.beta2 = 0.999f;
                o.emb.opt.eps = 1e-8f;
            }
            break;
        case O_EMBINIT:
            if (parse_num("--emb-init", optarg, 0, 10, &v)) return 2;
            o.emb.init.kind = v > 0 ? GR_INIT_UNIFORM : GR_INIT_ZEROS;
            o.emb.init.low = (float)-v;
            o.emb.init.high = (float)v;
            break;
        case O_EMBACC:
            if (parse_num("--emb-init-acc", optarg, 0, 1e3, &v)) return 2;
            o.emb.opt.initial_accumulator = (float)v;
            break;
        case O_DENSEOPT:
            if (!strcmp(optarg, "adam")) bo.dense_opt = GR_DENSE_OPT_ADAM;
            else if (!strcmp(optarg, "adagrad")) bo.dense_opt = GR_DENSE_OPT_ADAGRAD;
            else if (!strcmp(optarg, "sgd")) bo.dense_opt = GR_DENSE_OPT_SGD;
            else {
                fprintf(stderr, "granary train: --dense-optimizer: adam, adagrad or sgd\n");
                return 2;
            }
            break;
        case O_AGG:
            if (parse_num("--aggregate", optarg, 1, 65536, &v)) return 2;
            aggregate = (long)v;
            break;
        case O_BACKUP:
            if (parse_num("--backup", optarg, 0, 65535, &v)) return 2;
            backup = (long)v;
            break;
        case O_STALE:
            if (parse_num("--staleness", optarg, 0, 1e6, &v)) return 2;
            staleness = (long)v;
            break;
        case O_STRAG: {
            char *colon = strchr(optarg, ':'), *end;
            errno = 0;
            unsigned long w = strtoul(optarg, &end, 10);
            double f = colon ? strtod(colon + 1, &end) : 0;
            if (!colon || colon == optarg || *end || errno || w > 255 || !(f >= 1 && f <= 1000)) {
                fprintf(stderr, "granary train: --straggler wants WORKER:FACTOR (e.g. 3:3), got "
                                "'%s'\n", optarg);
                return 2;
            }
            o.straggler = (unsigned)w;
            o.straggler_factor = f;
            break;
        }
        case O_STIMEOUT:
            if (parse_num("--sync-timeout", optarg, 1, 86400000, &v)) return 2;
            sync_timeout = v;
            break;
        case O_SRESET: sync_reset = true; break;
        case O_DATA:
            if (!strcmp(optarg, "static")) o.data = GR_TRAIN_DATA_STATIC;
            else if (!strcmp(optarg, "shared")) o.data = GR_TRAIN_DATA_SHARED;
            else {
                fprintf(stderr, "granary train: --data static or shared, not '%s'\n", optarg);
                return 2;
            }
            break;
        case O_SHTHREADS:
            if (parse_num("--shard-threads", optarg, 1, 256, &v)) return 2;
            shard_threads = (long)v;
            break;
        case O_AUTH: auth_file = optarg; break;
        case O_CKDIR: o.ckpt_dir = optarg; break;
        case O_CKEVERY:
            if (parse_num("--ckpt-every", optarg, 0, 1e15, &v)) return 2;
            o.ckpt_every = (uint64_t)v;
            break;
        case O_CKKEEP:
            if (parse_num("--ckpt-keep", optarg, 0, 1e6, &v)) return 2;
            o.ckpt_keep = (uint32_t)v;
            break;
        case O_CKINCR: o.ckpt_incremental = true; break;
        case O_CKFULL:
            if (parse_num("--ckpt-full-every", optarg, 0, 1e6, &v)) return 2;
            o.ckpt_full_every = (uint32_t)v;
            break;
        case O_CKZSTD:
            if (parse_num("--ckpt-zstd", optarg, 0, 19, &v)) return 2;
            o.ckpt_zstd = (int)v;
            break;
        case O_RESUME: o.resume = optarg; break;
        case O_MAXSTEPS:
            if (parse_num("--max-steps", optarg, 0, 1e15, &v)) return 2;
            o.max_steps = (uint64_t)v;
            break;
        case O_EMBSTALE:
            if (parse_num("--emb-staleness", optarg, 0, 64, &v)) return 2;
            o.emb_staleness = (uint32_t)v;
            break;
        case O_LOCAL: shards = 0; break;
        case O_DEPTH:
            if (parse_num("--queue-depth", optarg, 1, 64, &v)) return 2;
            o.queue_depth = (unsigned)v;
            break;
        case O_ADMIT:
            if (parse_num("--admit-min-count", optarg, 0, 1e6, &v)) return 2;
            o.emb.admit_min_count = (uint32_t)v;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "granary train: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!o.train_path) {
        fprintf(stderr, "granary train: --train FILE is required\n");
        usage(stderr);
        return 2;
    }
    bool local = !servers && shards == 0;
    /* No --mode: the trainer's choice for the worker count (the local backend is async only). */
    if (!mode_set) o.mode = local ? GR_MODE_ASYNC : gr_train_default_mode(o.workers);
    if (local && (o.ckpt_dir || o.resume)) {
        fprintf(stderr, "granary train: checkpoints are written by the parameter servers: drop "
                        "--local (the embedded cluster checkpoints)\n");
        return 2;
    }
    if (!o.ckpt_dir && (o.ckpt_every || o.ckpt_keep || o.ckpt_incremental || o.ckpt_zstd))
        fprintf(stderr, "granary train: --ckpt-every/--ckpt-keep/--ckpt-incremental/--ckpt-zstd "
                        "need --ckpt-dir\n");
    if (local && o.mode != GR_MODE_ASYNC) {
        fprintf(stderr, "granary train: --mode %s needs the parameter server's step tokens: drop "
                        "--local (the embedded cluster has them)\n", gr_train_mode_name(o.mode));
        return 2;
    }
    if (aggregate >= 0 && backup >= 0) {
        fprintf(stderr, "granary train: give --aggregate K or --backup B, not both\n");
        return 2;
    }
    if (backup >= 0 && backup >= (long)o.workers) {
        fprintf(stderr, "granary train: --backup %ld leaves no worker to aggregate (%u workers)\n",
                backup, o.workers);
        return 2;
    }
    uint32_t k = aggregate >= 0 ? (uint32_t)aggregate
               : backup >= 0   ? o.workers - (uint32_t)backup
               : o.workers > 1 ? o.workers - 1 : 1;
    if (o.mode == GR_MODE_SEMISYNC && k > o.workers) {
        fprintf(stderr, "granary train: --aggregate %u is more than the %u workers\n", k, o.workers);
        return 2;
    }
    if ((aggregate >= 0 || backup >= 0) && o.mode != GR_MODE_SEMISYNC)
        fprintf(stderr, "granary train: --aggregate/--backup only apply to --mode semisync\n");
    uint32_t stale = staleness >= 0 ? (uint32_t)staleness : o.mode == GR_MODE_SSP ? 2 : 0;
    if (staleness >= 0 && o.mode != GR_MODE_SEMISYNC && o.mode != GR_MODE_SSP)
        fprintf(stderr, "granary train: --staleness only applies to semisync and ssp\n");
    if (o.straggler_factor > 1 && o.straggler >= o.workers) {
        fprintf(stderr, "granary train: --straggler %u: there are only %u workers\n", o.straggler,
                o.workers);
        return 2;
    }
    if (kind == GR_MODEL_LR && dim_set && o.model.dim != 1)
        fprintf(stderr, "granary train: --dim is ignored for lr (rows have dim 1)\n");
    o.model.seed = seed;
    o.emb.seed = seed ^ 0x656d62;
    if (kind == GR_MODEL_DLRM) o.emb.dim = o.model.dim;

    run_info ri = {.backend = local ? "local" : servers ? "servers" : "cluster",
                   .shards = local ? 0 : (unsigned)shards, .aggregate = k, .staleness = stale};
    gr_local_cluster *cluster = NULL;
    gr_client *client = NULL;
    gr_train_backend be;
    memset(&be, 0, sizeof be);
    int rc;
    if (local) {
        rc = gr_local_backend_create(&bo, &be);
    } else {
        if (!servers) {
            /* The embedded cluster: S shards in this process on free loopback ports. */
            rc = gr_local_cluster_start((unsigned)shards, (unsigned)shard_threads, &cluster);
            if (rc) {
                fprintf(stderr, "granary train: %s\n", gr_errmsg());
                return 1;
            }
            servers = gr_local_cluster_servers(cluster);
        }
        gr_client_config cc;
        gr_client_config_default(&cc);
        cc.servers = servers;
        cc.auth_file = auth_file;
        rc = gr_client_create(&cc, &client);
        if (!rc) {
            ri.shards = gr_client_shards(client);
            gr_ps_backend_opts po;
            gr_ps_backend_opts_default(&po);
            po.client = client;
            po.mode = o.mode;
            po.workers = o.workers;
            po.aggregate = k;
            po.staleness = stale;
            po.timeout_ms = (uint32_t)sync_timeout;
            po.reset = sync_reset;
            po.dense_opt = bo.dense_opt;
            /* --dense-lr is the one-worker rate; the trainer scales it for modes whose steps
             * average several workers' dense gradients. */
            po.dense_lr = gr_train_dense_lr(o.mode, o.workers, bo.dense_lr);
            po.beta1 = bo.beta1;
            po.beta2 = bo.beta2;
            po.eps = bo.eps;
            rc = gr_ps_backend_create(&po, &be);
        }
    }
    if (rc) {
        fprintf(stderr, "granary train: %s\n", gr_errmsg());
        gr_client_destroy(client);
        gr_local_cluster_stop(cluster);
        return 1;
    }
    char modebuf[96];
    if (o.mode == GR_MODE_SEMISYNC)
        snprintf(modebuf, sizeof modebuf, "semisync (K %u of %u, staleness %u)", k, o.workers, stale);
    else if (o.mode == GR_MODE_SSP)
        snprintf(modebuf, sizeof modebuf, "ssp (staleness %u)", stale);
    else if (o.mode == GR_MODE_HYBRID)
        snprintf(modebuf, sizeof modebuf, "hybrid (dense sync, embedding staleness <= %u)",
                 o.emb_staleness);
    else
        snprintf(modebuf, sizeof modebuf, "%s", gr_train_mode_name(o.mode));
    fprintf(stderr, "train: %s dim %u, batch %zu x %u workers, %u epoch(s), mode %s, %s, %s\n",
            kind == GR_MODEL_LR ? "lr" : "dlrm", o.emb.dim, o.batch, o.workers, o.epochs, modebuf,
            o.pipeline ? "pipelined" : "sequential",
            local ? "local backend" : cluster ? "embedded cluster" : "remote servers");
    if (!local)
        fprintf(stderr, "train: %u shard(s) at %s\n", ri.shards, servers);
    if (o.straggler_factor > 1)
        fprintf(stderr, "train: worker %u is a straggler (x%g)\n", o.straggler, o.straggler_factor);
    gr_train_result r;
    rc = gr_train_run(&o, &be, &r);
    char errbuf[600] = "";
    if (rc) snprintf(errbuf, sizeof errbuf, "%s", gr_errmsg());
    if (client && o.mode != GR_MODE_ASYNC) {
        if (!rc) read_sync_stats(client, &ri);
        gr_ps_backend_finish(&be); /* drop the job from the shards */
    }
    gr_train_backend_destroy(&be);
    gr_client_destroy(client);
    gr_local_cluster_stop(cluster);
    if (rc) {
        fprintf(stderr, "granary train: %s: %s\n", gr_strerror(rc), errbuf);
        return 1;
    }
    if (o.mode != GR_MODE_ASYNC)
        fprintf(stderr, "train: waited %.1f s for steps (all workers), %llu gradients dropped%s\n",
                r.wait_seconds, (unsigned long long)r.dropped_gradients,
                ri.have_sync ? "" : " (shard stats unavailable)");
    if (r.resumed_from[0])
        fprintf(stderr, "train: resumed from %s/%s (step %llu)\n", o.resume, r.resumed_from,
                (unsigned long long)r.resumed_step);
    if (o.ckpt_dir)
        fprintf(stderr, "train: %u checkpoint(s) saved under %s (last %s), %u failed, workers "
                        "paused %.2f s for them\n", r.ckpt_saves, o.ckpt_dir,
                r.ckpt_last[0] ? r.ckpt_last : "none", r.ckpt_failures, r.ckpt_seconds);
    fprintf(stderr,
            "train: done: %llu examples in %.1f s (%.0f examples/s), last train loss %.5f, "
            "%llu bad lines\n",
            (unsigned long long)r.examples, r.train_seconds, r.examples_per_sec, r.last_loss,
            (unsigned long long)r.bad_lines);
    if (o.test_path)
        fprintf(stderr, "test: %llu examples, AUC %.5f, logloss %.5f\n",
                (unsigned long long)r.test_examples, r.test_auc, r.test_logloss);
    printf("auc %.6f logloss %.6f examples_per_sec %.1f examples %llu mode %s\n", r.test_auc,
           r.test_logloss, r.examples_per_sec, (unsigned long long)r.examples,
           gr_train_mode_name(o.mode));
    if (metrics && (rc = write_metrics(metrics, &o, &r, &ri))) {
        fprintf(stderr, "granary train: --metrics-out: %s\n", gr_errmsg());
        return 1;
    }
    return 0;
}
