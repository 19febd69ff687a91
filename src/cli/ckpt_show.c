/* `granary ckpt inspect` beyond the manifest, and `granary ckpt list`: the dense parameters
 * (names, sizes, the layers they hold, a checksum and a summary of the values), the trainer's
 * position in the data and its settings, the model's shapes, and every checkpoint of a root
 * with its kind, time, size and whether it is complete. */
#include "cli/ckpt_show.h"
#include "granary/ckpt.h"
#include "granary/train.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct summary {
    double min, max, mean, rms;
    uint64_t checksum, nonfinite;
} summary;

static summary summarize(const float *v, uint64_t n)
{
    summary s = {INFINITY, -INFINITY, 0, 0, gr_checksum(v, n * sizeof *v), 0};
    double sum = 0, sq = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (!isfinite(v[i])) {
            s.nonfinite++;
            continue;
        }
        if (v[i] < s.min) s.min = v[i];
        if (v[i] > s.max) s.max = v[i];
        sum += v[i];
        sq += (double)v[i] * v[i];
    }
    uint64_t k = n - s.nonfinite;
    s.mean = k ? sum / (double)k : 0;
    s.rms = k ? sqrt(sq / (double)k) : 0;
    if (!k) s.min = s.max = 0;
    return s;
}

static void show_dense(const char *dir, const gr_ckpt_dense_info *v, size_t n, cJSON *arr, int *rc)
{
    if (!arr) printf("dense       %zu parameter(s)\n", n);
    for (size_t i = 0; i < n && !*rc; i++) {
        float *vals;
        uint64_t cnt;
        if ((*rc = gr_ckpt_dense_read(dir, v[i].name, &vals, &cnt))) break;
        summary s = summarize(vals, cnt);
        free(vals);
        char ck[17];
        snprintf(ck, sizeof ck, "%016" PRIx64, s.checksum);
        if (arr) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", v[i].name);
            cJSON_AddNumberToObject(o, "size", (double)cnt);
            cJSON_AddStringToObject(o, "part", v[i].part);
            cJSON_AddStringToObject(o, "checksum", ck);
            cJSON_AddNumberToObject(o, "min", s.min);
            cJSON_AddNumberToObject(o, "max", s.max);
            cJSON_AddNumberToObject(o, "mean", s.mean);
            cJSON_AddNumberToObject(o, "rms", s.rms);
            cJSON_AddNumberToObject(o, "nonfinite", (double)s.nonfinite);
            cJSON_AddItemToArray(arr, o);
        } else {
            printf("  %-20s %" PRIu64 " floats in %s, checksum %s (XXH3 of the f32 bytes)\n"
                   "  %-20s min %.6g max %.6g mean %.6g rms %.6g%s\n",
                   v[i].name, cnt, v[i].part, ck, "", s.min, s.max, s.mean, s.rms,
                   s.nonfinite ? " (NON-FINITE VALUES)" : "");
        }
    }
}

static double num(const cJSON *j, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *str(const cJSON *j, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsString(v) ? v->valuestring : "?";
}

static void print_layers(const char *what, const uint32_t *v, uint32_t n)
{
    printf(" %s ", what);
    if (!n) printf("(none)");
    for (uint32_t i = 0; i < n; i++) printf("%s%u", i ? "," : "", v[i]);
}

/* The trainer's position (how far each worker got) and its settings, as text. */
static void print_trainer(const cJSON *u)
{
    printf("trainer     step %.0f, mode %s, %.0f worker(s), batch %.0f per worker, %.0f epoch(s), "
           "data %s\n", num(u, "step"), str(u, "mode"), num(u, "workers"), num(u, "batch"),
           num(u, "epochs"), str(u, "data"));
    printf("position    %.0f examples, %.0f batches trained; batches per worker:", num(u, "examples"),
           num(u, "batches"));
    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(u, "worker_steps"), *it;
    cJSON_ArrayForEach(it, ws) printf(" %.0f", it->valuedouble);
    printf("\n");
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(u, "chunks");
    if (ch) {
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(ch, "progress");
        unsigned done = 0, started = 0;
        cJSON_ArrayForEach(it, pr)
        {
            if (it->valuedouble < 0) done++;
            else if (it->valuedouble > 0) started++;
        }
        printf("            shared data: %.0f chunks per epoch; %u done, %u part-done\n",
               num(ch, "count"), done, started);
    }
    printf("            training file %.0f bytes (a resume refuses another size)\n",
           num(u, "train_bytes"));
}

static void print_model(const gr_saved_model_info *in)
{
    const gr_model_config *c = &in->model;
    printf("model       %s: %u dense + %u categorical features, embedding dim %u,",
           c->kind == GR_MODEL_LR ? "lr" : "dlrm", in->n_dense, in->n_sparse, c->dim);
    print_layers("bottom", c->bottom, c->kind == GR_MODEL_LR ? 0 : c->n_bottom);
    print_layers("top", c->top, c->kind == GR_MODEL_LR ? 0 : c->n_top);
    printf("\n            embedding table '%s' (id %u), dense parameter '%s' (%" PRIu64
           " floats)\n", in->table, in->table_id, in->dense_name, in->dense_size);
    gr_model *m;
    if (gr_model_create(c, &m) == GR_OK) {
        char buf[2048];
        gr_model_describe(m, buf, sizeof buf);
        printf("            layout of '%s': %s\n", in->dense_name, buf);
        gr_model_destroy(m);
    }
}

int ckpt_show_model(const char *dir, cJSON *o)
{
    char *txt = NULL;
    int rc = gr_ckpt_read_user(dir, &txt);
    if (rc) return rc;
    cJSON *u = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    gr_saved_model_info in;
    bool have_model = gr_saved_model_read_info(dir, &in) == GR_OK;
    gr_clearerr();
    if (o) {
        cJSON_AddItemToObject(o, "trainer", u ? u : cJSON_CreateNull());
        u = NULL;
        if (have_model) {
            gr_model *m;
            if (gr_model_create(&in.model, &m) == GR_OK) {
                char buf[2048];
                gr_model_describe(m, buf, sizeof buf);
                cJSON_AddStringToObject(o, "dense_layout", buf);
                gr_model_destroy(m);
            }
        }
    } else if (u) {
        print_trainer(u);
        if (have_model) print_model(&in);
        else printf("model       (not recorded with this checkpoint)\n");
    } else {
        printf("trainer     (no user.json: not written by granary train)\n");
    }
    cJSON_Delete(u);
    gr_ckpt_dense_info *v = NULL;
    size_t n = 0;
    if ((rc = gr_ckpt_dense_list(dir, &v, &n))) return rc;
    cJSON *arr = o ? cJSON_AddArrayToObject(o, "dense") : NULL;
    show_dense(dir, v, n, arr, &rc);
    free(v);
    return rc;
}

static void time_text(uint64_t t, char *buf, size_t cap)
{
    if (!t) {
        snprintf(buf, cap, "-");
        return;
    }
    time_t tt = (time_t)t;
    struct tm tm;
    gmtime_r(&tt, &tm);
    strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

int ckpt_list(const char *root, bool json)
{
    gr_ckpt_entry *e;
    size_t n;
    int rc = gr_ckpt_list(root, &e, &n);
    if (rc) return rc;
    cJSON *o = json ? cJSON_CreateObject() : NULL;
    cJSON *arr = o ? cJSON_AddArrayToObject(o, "checkpoints") : NULL;
    if (o) {
        cJSON_AddBoolToObject(o, "ok", 1);
        cJSON_AddStringToObject(o, "root", root);
    } else {
        printf("%-20s %12s  %-20s  %-6s %12s  %s\n", "checkpoint", "step", "time (UTC)", "kind",
               "bytes", "complete");
    }
    for (size_t i = 0; i < n; i++) {
        char t[32];
        time_text(e[i].created, t, sizeof t);
        const char *why = e[i].complete ? "yes"
                          : !e[i].has_manifest ? "no (no manifest: unfinished or failed save)"
                                               : "no (its delta chain is broken)";
        if (arr) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "name", e[i].name);
            cJSON_AddNumberToObject(x, "step", (double)e[i].step);
            cJSON_AddNumberToObject(x, "created", (double)e[i].created);
            cJSON_AddStringToObject(x, "time", t);
            if (e[i].has_manifest) cJSON_AddStringToObject(x, "kind", gr_ckpt_kind_name(e[i].kind));
            else cJSON_AddNullToObject(x, "kind");
            cJSON_AddNumberToObject(x, "bytes", (double)e[i].bytes);
            cJSON_AddBoolToObject(x, "complete", e[i].complete);
            if (e[i].parent[0]) cJSON_AddStringToObject(x, "parent", e[i].parent);
            cJSON_AddItemToArray(arr, x);
        } else {
            printf("%-20s %12" PRIu64 "  %-20s  %-6s %12" PRIu64 "  %s%s%s\n", e[i].name,
                   e[i].step, t, e[i].has_manifest ? gr_ckpt_kind_name(e[i].kind) : "-",
                   e[i].bytes, why, e[i].parent[0] ? "; parent " : "", e[i].parent);
        }
    }
    if (o) {
        char *s = cJSON_PrintUnformatted(o);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(o);
    } else if (!n) {
        printf("(no checkpoints under %s)\n", root);
    }
    free(e);
    return GR_OK;
}
