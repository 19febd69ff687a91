/* `granary eval --model DIR --test FILE`: scores a file with a saved model (a checkpoint
 * root, one checkpoint or an export) through the trainer's own evaluation path, so the AUC
 * and logloss of a run's final model equal what that run printed. */
#include "cli/cli.h"
#include "cli/opts.h"
#include "granary/train.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define EVAL_OPTIONS(X)                                                                        \
    X(EO_MODEL, "model", GR_CLI_STR, "model", 0, 0, NULL, "DIR", NULL,                          \
      "a checkpoint root (its newest checkpoint), one checkpoint, or an export")               \
    X(EO_TEST, "test", GR_CLI_STR, "test", 0, 0, NULL, "FILE", NULL,                            \
      "the file to score, read with the model's schema (Criteo TSV by default)")               \
    X(EO_SCHEMA, "schema", GR_CLI_STR, "schema", 0, 0, NULL, "FILE", NULL,                      \
      "the layout you expect (docs/data.md): refused unless it is the model's own")            \
    X(EO_PRED, "predictions-out", GR_CLI_STR, "predictions_out", 0, 0, NULL, "FILE", NULL,      \
      "write each example's probability, one per line, in file order (bad lines skipped)")     \
    X(EO_JSON, "json", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL, "print the result as one JSON line") \
    X(EO_BATCH, "batch", GR_CLI_INT, "batch", 0, 1048576, NULL, "B", "0",                       \
      "examples per batch (0 = the model's training batch, as its trainer evaluated)")         \
    X(EO_THREADS, "threads", GR_CLI_INT, "threads", 0, 64, NULL, "T", "0",                      \
      "scoring threads, one byte range each (0 = the model's worker count, as its trainer)")

enum { EVAL_OPTIONS(GR_CLI_ENUM) EO_COUNT };
static const gr_cli_opt eval_opts[] = {EVAL_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec eval_spec = {
    .command = "eval",
    .synopsis = "granary eval --model DIR --test FILE [--predictions-out FILE] [--json]",
    .opts = eval_opts,
    .n_opts = EO_COUNT,
    .config_section = "",
    .epilog = "The scores are bitwise those of the training run's own final evaluation when\n"
              "--batch and --threads are left at 0 (the model's recorded batch and workers).\n",
};

/* Every digit (%.17g): cJSON's own printing may drop the last bit, and these numbers are
 * compared with the trainer's exactly. */
static void json_num(cJSON *o, const char *k, double v)
{
    if (isnan(v)) {
        cJSON_AddNullToObject(o, k);
        return;
    }
    char buf[40];
    snprintf(buf, sizeof buf, "%.17g", v);
    cJSON_AddRawToObject(o, k, buf);
}

/* f was opened before the model was loaded, so a bad path fails before any work. */
static int write_predictions(FILE *f, const char *path, const float *p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) fprintf(f, "%.9g\n", (double)p[i]);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) return gr_seterr(GR_EIO, "cannot write %s: %m", path);
    return GR_OK;
}

static int fail(int rc, bool json)
{
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "ok", 0);
        cJSON_AddStringToObject(o, "error", gr_errmsg());
        cJSON_AddStringToObject(o, "class", gr_strerror(rc));
        char *s = cJSON_PrintUnformatted(o);
        printf("%s\n", s ? s : "{\"ok\":false}");
        free(s);
        cJSON_Delete(o);
    }
    fprintf(stderr, "granary eval: %s\n", *gr_errmsg() ? gr_errmsg() : gr_strerror(rc));
    return 1;
}

int gr_cli_eval(int argc, char **argv)
{
    gr_cli_value v[EO_COUNT];
    gr_cli_parsed p;
    int status = gr_cli_parse_or_exit(&eval_spec, argc, argv, v, &p);
    if (status >= 0) {
        gr_cli_parsed_fini(&p);
        return status;
    }
    bool json = v[EO_JSON].b;
    if (!v[EO_MODEL].s || !v[EO_TEST].s) {
        fprintf(stderr, "granary eval: --model DIR and --test FILE are required (see granary eval "
                        "--help)\n");
        gr_cli_parsed_fini(&p);
        return 2;
    }
    gr_saved_model *sm = NULL;
    gr_eval_result r = {0};
    FILE *pf = NULL;
    int rc = GR_OK;
    if (v[EO_PRED].s && !(pf = fopen(v[EO_PRED].s, "w")))
        rc = gr_seterr(GR_EIO, "--predictions-out: cannot write %s: %m", v[EO_PRED].s);
    double t0 = gr_now_s();
    if (!rc) rc = gr_saved_model_open(v[EO_MODEL].s, &sm);
    double t1 = gr_now_s();
    if (!rc && v[EO_SCHEMA].s) {
        /* The model's ids come from the schema it was trained with: another one would score
         * other features, so it can only be checked, not replaced. */
        gr_schema *want = NULL;
        rc = gr_schema_load(v[EO_SCHEMA].s, &want);
        const gr_schema *has = gr_model_schema(gr_saved_model_model(sm));
        if (!rc && !gr_schema_equal(want, has))
            rc = gr_seterr(GR_EINVAL, "--schema %s is not the schema the model was trained with "
                           "(%s); leave --schema out to read the file with the model's own",
                           v[EO_SCHEMA].s, has && gr_schema_is_criteo(has) ? "Criteo" : "its user.json "
                           "has it");
        gr_schema_destroy(want);
    }
    if (!rc)
        rc = gr_saved_model_evaluate(sm, v[EO_TEST].s, (size_t)v[EO_BATCH].i,
                                     (unsigned)v[EO_THREADS].i, v[EO_PRED].s != NULL, &r);
    double t2 = gr_now_s();
    if (!rc && pf) {
        rc = write_predictions(pf, v[EO_PRED].s, r.probs, r.examples);
        pf = NULL;
    }
    if (pf) fclose(pf);
    if (rc) {
        status = fail(rc, json);
    } else {
        const gr_saved_model_info *in = gr_saved_model_get_info(sm);
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddBoolToObject(o, "ok", 1);
            cJSON_AddStringToObject(o, "model", in->dir);
            cJSON_AddStringToObject(o, "kind", in->kind);
            cJSON_AddNumberToObject(o, "step", (double)in->step);
            json_num(o, "auc", r.auc);
            json_num(o, "logloss", r.logloss);
            cJSON_AddNumberToObject(o, "examples", (double)r.examples);
            cJSON_AddNumberToObject(o, "bad_lines", (double)r.bad_lines);
            cJSON_AddNumberToObject(o, "load_seconds", t1 - t0);
            cJSON_AddNumberToObject(o, "eval_seconds", t2 - t1);
            if (v[EO_PRED].s) cJSON_AddStringToObject(o, "predictions", v[EO_PRED].s);
            char *s = cJSON_PrintUnformatted(o);
            printf("%s\n", s);
            free(s);
            cJSON_Delete(o);
        } else {
            printf("model %s (%s, step %" PRIu64 ", %s, %" PRIu64 " embedding rows)\n", in->dir,
                   in->kind, in->step, in->model.kind == GR_MODEL_LR ? "lr" : "dlrm", in->rows);
            printf("auc %.6f logloss %.6f examples %" PRIu64 " (%.2f s)\n", r.auc, r.logloss,
                   r.examples, t2 - t1);
            if (v[EO_PRED].s) printf("predictions written to %s\n", v[EO_PRED].s);
        }
        status = 0;
    }
    free(r.probs);
    gr_saved_model_close(sm);
    gr_cli_parsed_fini(&p);
    return status;
}
