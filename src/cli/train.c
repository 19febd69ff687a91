/* `granary train`: trains LR or DLRM on Criteo-layout files with W worker threads against a
 * backend (for now the local in-process one), prints progress on stderr, and reports test
 * AUC/logloss and throughput, also as JSON (--metrics-out). */
#include "cli/cli.h"
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
            "  --workers W          worker threads, each reading its part of the file (default 2)\n"
            "  --mode M             async (default); sync, semisync, ssp need the parameter server\n"
            "  --shards S           local shards (default 1)\n"
            "  --servers LIST       remote parameter servers host:port,... (not built yet)\n"
            "  --lr X               embedding learning rate (Adagrad lr; LR: FTRL alpha)\n"
            "                       (default 0.05)\n"
            "  --dense-lr X         dense parameters' learning rate (default dlrm 0.001, lr 0.01)\n"
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
            "  --metrics-out FILE   write the final metrics as JSON\n");
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

static int write_metrics(const char *path, const gr_train_opts *o, const gr_train_result *r)
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
    const char *metrics = NULL, *servers = NULL;
    double v;
    long shards = 1;
    bool dim_set = false;
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
            break;
        case O_WORKERS:
            if (parse_num("--workers", optarg, 1, 256, &v)) return 2;
            o.workers = (unsigned)v;
            break;
        case O_SHARDS:
            if (parse_num("--shards", optarg, 1, 4096, &v)) return 2;
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
    if (servers) {
        fprintf(stderr, "granary train: --servers is not built yet (the parameter-server client "
                        "backend comes with the client); train locally without it\n");
        return 2;
    }
    if (shards > 1) {
        fprintf(stderr, "granary train: --shards %ld is not built yet: the local backend holds "
                        "one in-process table (--shards 1)\n", shards);
        return 2;
    }
    if (o.mode != GR_MODE_ASYNC) {
        fprintf(stderr, "granary train: --mode %s is not built yet (it needs the parameter "
                        "server's step tokens); use --mode async\n", gr_train_mode_name(o.mode));
        return 2;
    }
    if (kind == GR_MODEL_LR && dim_set && o.model.dim != 1)
        fprintf(stderr, "granary train: --dim is ignored for lr (rows have dim 1)\n");
    o.model.seed = seed;
    o.emb.seed = seed ^ 0x656d62;
    if (kind == GR_MODEL_DLRM) o.emb.dim = o.model.dim;

    gr_train_backend be;
    int rc = gr_local_backend_create(&bo, &be);
    if (rc) {
        fprintf(stderr, "granary train: %s\n", gr_errmsg());
        return 1;
    }
    fprintf(stderr, "train: %s dim %u, batch %zu x %u workers, %u epoch(s), mode %s, %s\n",
            kind == GR_MODEL_LR ? "lr" : "dlrm", o.emb.dim, o.batch, o.workers, o.epochs,
            gr_train_mode_name(o.mode), o.pipeline ? "pipelined" : "sequential");
    gr_train_result r;
    rc = gr_train_run(&o, &be, &r);
    gr_train_backend_destroy(&be);
    if (rc) {
        fprintf(stderr, "granary train: %s: %s\n", gr_strerror(rc), gr_errmsg());
        return 1;
    }
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
    if (metrics && (rc = write_metrics(metrics, &o, &r))) {
        fprintf(stderr, "granary train: --metrics-out: %s\n", gr_errmsg());
        return 1;
    }
    return 0;
}
