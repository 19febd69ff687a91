/* `granary plan`: how many shards and how much memory a model needs before anyone asks for
 * machines. From the table specs (dim, optimizer, dtype, admission, capacity), the expected
 * rows and ids per example, and the training rate, it computes with the table engine's own
 * byte accounting (gr_table_estimate_bytes: what `granary stats` will report) the memory per
 * shard with headroom, the number of shards for a machine's memory, network bytes per second
 * per shard, and the checkpoint size and time; `--emit-kustomize DIR` writes a kustomize
 * overlay with those numbers (plan_emit.c). docs/kubernetes.md explains each figure. */
#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/plan.h"
#include "granary/train.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_OPTIONS(X)                                                                        \
    X(PO_TABLES, "tables", GR_CLI_STR, NULL, 0, 0, NULL, "SPEC.json", NULL,                    \
      "{\"tables\": [table spec + \"rows\" + \"ids_per_example\", ...]}; required")            \
    X(PO_ROWS, "rows-per-table", GR_CLI_STR, NULL, 0, 0, NULL, "N|NAME=N,...", NULL,           \
      "expected rows (1e9 or 1000000000): N for every table, or per table\n"                \
      "(overrides \"rows\")")                   \
    X(PO_QPS, "qps", GR_CLI_NUM, NULL, 0, 1e12, NULL, "N", NULL,                               \
      "training examples per second, all workers (default: the file's\n"                      \
      "\"examples_per_second\", else 100000)")                                                 \
    X(PO_MODE, "mode", GR_CLI_CHOICE, NULL, 0, 0, "async|sync|semisync|ssp|hybrid", NULL,      \
      "hybrid", "training mode (sync modes stage a step's gradients on the shards)")          \
    X(PO_WORKERS, "workers", GR_CLI_INT, NULL, 1, 65536, NULL, "W", NULL,                      \
      "workers (default: the file's \"workers\", else 8)")                                    \
    X(PO_BATCH, "batch", GR_CLI_INT, NULL, 1, 1 << 24, NULL, "B", NULL,                        \
      "examples per worker step (default: the file's \"batch\", else 1024)")                  \
    X(PO_MEMORY, "memory-per-shard", GR_CLI_SIZE, NULL, 1 << 20, 1e15, NULL, NULL, "64G",      \
      "memory of one machine (one shard per machine)")                                         \
    X(PO_HEADROOM, "headroom", GR_CLI_NUM, NULL, 0, 10, NULL, "X", "0.3",                      \
      "fraction on top of the steady state for growth and buffers")                           \
    X(PO_SHARDS, "shards", GR_CLI_INT, NULL, 0, 16384, NULL, "N", "0",                         \
      "plan for N shards (0: the fewest that fit the machine)")                               \
    X(PO_DISK, "disk-speed", GR_CLI_SIZE, NULL, 1 << 20, 1e13, NULL, "BYTES/S", "200M",       \
      "checkpoint write speed of one shard")                                                   \
    X(PO_CPUS, "cpus", GR_CLI_INT, NULL, 1, 4096, NULL, "N", "4",                              \
      "CPUs per shard (its worker threads; the overlay's CPU request)")                        \
    X(PO_JSON, "json", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL, "print the plan as JSON")   \
    X(PO_EMIT, "emit-kustomize", GR_CLI_STR, NULL, 0, 0, NULL, "DIR", NULL,                    \
      "write a kustomize overlay with the plan's numbers into DIR")                           \
    X(PO_BASE, "base", GR_CLI_STR, NULL, 0, 0, NULL, "PATH", "../../base",                     \
      "the overlay's base, relative to DIR (deploy/k8s/base)")

enum { PLAN_OPTIONS(GR_CLI_ENUM) PO_COUNT };
static const gr_cli_opt plan_opts[] = {PLAN_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec plan_spec = {
    .command = "plan",
    .synopsis = "granary plan --tables SPEC.json [--rows-per-table N|NAME=N,...] [--qps N]\n"
                "             [--mode M] [--json] [--emit-kustomize DIR]",
    .opts = plan_opts,
    .n_opts = PO_COUNT,
    .config_section = NULL,
    .epilog = "Memory is what `granary stats` will report for those rows (the table engine's\n"
              "accounting), network assumes no id repeats within a batch (an upper bound).\n"
              "docs/kubernetes.md explains every figure.\n",
};

/* ---- input ---- */

static int read_table(cJSON *t, size_t i, plan_table *pt)
{
    /* The planner's own fields come off a copy; the rest must be a table spec. */
    cJSON *copy = cJSON_Duplicate(t, true);
    if (!copy) return gr_seterr(GR_ENOMEM, "out of memory");
    cJSON *rows = cJSON_DetachItemFromObjectCaseSensitive(copy, "rows");
    cJSON *ids = cJSON_DetachItemFromObjectCaseSensitive(copy, "ids_per_example");
    char *txt = cJSON_PrintUnformatted(copy);
    int rc = txt ? gr_table_spec_from_json(txt, &pt->spec) : gr_seterr(GR_ENOMEM, "out of memory");
    if (rc) rc = gr_seterr(rc, "tables[%zu]: %s", i, gr_errmsg());
    if (!rc && rows && !(cJSON_IsNumber(rows) && rows->valuedouble >= 0 &&
                         rows->valuedouble < 1.8e19))
        rc = gr_seterr(GR_EINVAL, "table '%s': \"rows\" must be a number >= 0", pt->spec.name);
    if (!rc && ids && !(cJSON_IsNumber(ids) && ids->valuedouble >= 0 && ids->valuedouble < 1e9))
        rc = gr_seterr(GR_EINVAL, "table '%s': \"ids_per_example\" must be a number >= 0",
                       pt->spec.name);
    if (!rc) {
        pt->rows = rows ? (uint64_t)rows->valuedouble : 0;
        pt->ids_per_example = ids ? ids->valuedouble : 1;
    }
    free(txt);
    cJSON_Delete(rows);
    cJSON_Delete(ids);
    cJSON_Delete(copy);
    return rc;
}

static int number_field(cJSON *root, const char *key, double lo, double hi, double *out)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v) return GR_OK;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi))
        return gr_seterr(GR_EINVAL, "\"%s\" must be a number in [%g, %g]", key, lo, hi);
    *out = v->valuedouble;
    return GR_OK;
}

int plan_read_spec(const char *json, plan_input *in)
{
    cJSON *root = cJSON_Parse(json);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return gr_seterr(GR_EINVAL, "not a JSON object");
    }
    int rc = GR_OK;
    cJSON *tables = cJSON_GetObjectItemCaseSensitive(root, "tables");
    if (!cJSON_IsArray(tables) || cJSON_GetArraySize(tables) == 0)
        rc = gr_seterr(GR_EINVAL, "wants a non-empty \"tables\" array");
    else if (cJSON_GetArraySize(tables) > PLAN_MAX_TABLES)
        rc = gr_seterr(GR_EINVAL, "more than %d tables", PLAN_MAX_TABLES);
    cJSON *t;
    in->ntables = 0;
    if (rc) tables = NULL;
    cJSON_ArrayForEach(t, tables) {
        if ((rc = read_table(t, in->ntables, &in->tables[in->ntables]))) break;
        for (size_t j = 0; j < in->ntables; j++)
            if (!strcmp(in->tables[j].spec.name, in->tables[in->ntables].spec.name))
                rc = gr_seterr(GR_EINVAL, "table '%s' is listed twice",
                               in->tables[j].spec.name);
        if (rc) break;
        in->ntables++;
    }
    double w = in->workers, b = (double)in->batch, d = (double)in->dense_floats;
    if (!rc) rc = number_field(root, "examples_per_second", 0, 1e12, &in->examples_per_sec);
    if (!rc) rc = number_field(root, "workers", 1, 65536, &w);
    if (!rc) rc = number_field(root, "batch", 1, 1 << 24, &b);
    if (!rc) rc = number_field(root, "dense_params", 0, 1e12, &d);
    in->workers = (unsigned)w;
    in->batch = (uint64_t)b;
    in->dense_floats = (uint64_t)d;
    cJSON_Delete(root);
    return rc;
}

int plan_set_rows(plan_input *in, const char *list)
{
    static const gr_cli_opt rows_opt = {0, "rows-per-table", GR_CLI_NUM, NULL, 0, 1.8e19,
                                        NULL, NULL, NULL, ""};
    char err[256];
    gr_cli_value v;
    if (!strchr(list, '=')) {
        if (gr_cli_set_text(&rows_opt, list, &v, err, sizeof err))
            return gr_seterr(GR_EINVAL, "%s", err);
        for (size_t i = 0; i < in->ntables; i++) in->tables[i].rows = (uint64_t)v.d;
        return GR_OK;
    }
    char *copy = strdup(list), *save = NULL;
    if (!copy) return gr_seterr(GR_ENOMEM, "out of memory");
    int rc = GR_OK;
    for (char *item = strtok_r(copy, ",", &save); item && !rc; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (!eq) {
            rc = gr_seterr(GR_EINVAL, "--rows-per-table: '%s' is not NAME=N", item);
            break;
        }
        *eq = '\0';
        size_t i = 0;
        while (i < in->ntables && strcmp(in->tables[i].spec.name, item)) i++;
        if (i == in->ntables)
            rc = gr_seterr(GR_EINVAL, "--rows-per-table: no table named '%s'", item);
        else if (gr_cli_set_text(&rows_opt, eq + 1, &v, err, sizeof err))
            rc = gr_seterr(GR_EINVAL, "%s", err);
        else
            in->tables[i].rows = (uint64_t)v.d;
    }
    free(copy);
    return rc;
}

/* ---- the arithmetic ---- */

static bool sync_staged(int mode)
{
    return mode == GR_MODE_SYNC || mode == GR_MODE_SEMISYNC || mode == GR_MODE_SSP;
}

/* One shard's figures for S shards (keys spread evenly over slots, slots over shards). */
static int shard_figures(plan_input *in, unsigned S, plan_shard *sh)
{
    memset(sh, 0, sizeof *sh);
    double ids_bytes_in = 0, ids_bytes_out = 0, staged = 0;
    for (size_t i = 0; i < in->ntables; i++) {
        plan_table *t = &in->tables[i];
        uint64_t rows = (t->rows + S - 1) / S;
        int rc = gr_table_estimate_bytes(&t->spec, rows, &t->shard);
        if (rc) return rc;
        sh->rows += t->shard.rows;
        sh->table_bytes += t->shard.bytes;
        /* A full checkpoint stores per row its key, weights, optimizer state and metadata
         * (8 + payload + 8 bytes), in sections of up to 1 MiB with 56-byte headers. */
        double per_row = (double)t->shard.payload_bytes + 16;
        t->ckpt_bytes_shard = (uint64_t)((double)t->shard.rows * per_row * (1 + 56.0 / (1 << 20))) +
                              56 + 1024;
        sh->ckpt_bytes += t->ckpt_bytes_shard;
        double ids = in->examples_per_sec * t->ids_per_example / S, row = 4.0 * t->spec.dim;
        /* Pull: keys in, rows out; push: keys and gradients in (f32 on the wire). */
        ids_bytes_in += ids * (8 + 8 + row);
        ids_bytes_out += ids * row;
        /* Sync modes: every worker's step gradients for this shard wait for the step. */
        if (sync_staged(in->mode))
            staged += (double)in->workers * (double)in->batch * t->ids_per_example / S * (8 + row);
    }
    /* Dense parameters live on one shard: weights, Adam's two moments, and (every mode but
     * async) a step's worth of gradients from each worker. */
    double dense = (double)in->dense_floats * 4;
    sh->dense_bytes = (uint64_t)(dense * 3 + (in->mode != GR_MODE_ASYNC ? dense * in->workers : 0));
    sh->staging_bytes = (uint64_t)staged;
    sh->memory_bytes = sh->table_bytes + sh->staging_bytes + sh->dense_bytes;
    sh->request_bytes = (uint64_t)ceil((double)sh->memory_bytes * (1 + in->headroom));
    sh->restore_peak_bytes = sh->memory_bytes + sh->table_bytes;
    sh->net_in_bytes_per_sec = ids_bytes_in;
    sh->net_out_bytes_per_sec = ids_bytes_out;
    sh->ckpt_bytes += 64 + 32 + 56 + 1024; /* file header, trailer, END section */
    sh->ckpt_seconds = (double)sh->ckpt_bytes / in->disk_bytes_per_sec;
    return GR_OK;
}

static bool fits(plan_input *in, unsigned S, plan_shard *sh, int *rc)
{
    *rc = shard_figures(in, S, sh);
    return !*rc && sh->request_bytes <= in->machine_bytes;
}

int plan_compute(plan_input *in, plan_result *out)
{
    memset(out, 0, sizeof *out);
    int rc = GR_OK;
    unsigned S = in->shards;
    if (!S) {
        /* Memory per shard falls as S grows: double until it fits, then bisect for the fewest. */
        unsigned lo = 0, hi = 1;
        while (!fits(in, hi, &out->shard, &rc)) {
            if (rc) return rc;
            if (hi == 16384)
                return gr_seterr(GR_ECAPACITY, "even 16384 shards need %.1f GiB each, more than "
                                 "the %.1f GiB of a machine (--memory-per-shard)",
                                 out->shard.request_bytes / 1073741824.0,
                                 in->machine_bytes / 1073741824.0);
            lo = hi;
            hi = hi * 2 < 16384 ? hi * 2 : 16384;
        }
        while (hi - lo > 1) {
            unsigned mid = lo + (hi - lo) / 2;
            if (fits(in, mid, &out->shard, &rc)) hi = mid;
            else if (rc) return rc;
            else lo = mid;
        }
        S = hi;
    }
    if ((rc = shard_figures(in, S, &out->shard))) return rc;
    out->shards = S;
    for (size_t i = 0; i < in->ntables; i++) {
        int rc = gr_table_estimate_bytes(&in->tables[i].spec, in->tables[i].rows,
                                         &in->tables[i].whole);
        if (rc) return rc;
        out->cluster_rows += in->tables[i].shard.rows * S;
    }
    out->cluster_memory_bytes = out->shard.memory_bytes * S;
    out->cluster_ckpt_bytes = out->shard.ckpt_bytes * S;
    return GR_OK;
}

/* ---- output ---- */

char *plan_json(const plan_input *in, const plan_result *r)
{
    cJSON *j = cJSON_CreateObject();
    cJSON *inputs = cJSON_AddObjectToObject(j, "inputs");
    cJSON_AddNumberToObject(inputs, "examples_per_second", in->examples_per_sec);
    cJSON_AddStringToObject(inputs, "mode", gr_train_mode_name((gr_train_mode)in->mode));
    cJSON_AddNumberToObject(inputs, "workers", in->workers);
    cJSON_AddNumberToObject(inputs, "batch", (double)in->batch);
    cJSON_AddNumberToObject(inputs, "dense_params", (double)in->dense_floats);
    cJSON_AddNumberToObject(inputs, "memory_per_shard", (double)in->machine_bytes);
    cJSON_AddNumberToObject(inputs, "headroom", in->headroom);
    cJSON_AddNumberToObject(inputs, "disk_bytes_per_second", in->disk_bytes_per_sec);
    cJSON_AddNumberToObject(inputs, "cpus", in->cpus);
    cJSON *tables = cJSON_AddArrayToObject(j, "tables");
    for (size_t i = 0; i < in->ntables; i++) {
        const plan_table *t = &in->tables[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", t->spec.name);
        cJSON_AddNumberToObject(o, "dim", t->spec.dim);
        cJSON_AddStringToObject(o, "optimizer", gr_table_opt_name(t->spec.opt.kind));
        cJSON_AddStringToObject(o, "dtype", t->spec.dtype == GR_DTYPE_F16 ? "f16" : "f32");
        cJSON_AddNumberToObject(o, "rows", (double)t->whole.rows);
        cJSON_AddNumberToObject(o, "ids_per_example", t->ids_per_example);
        cJSON_AddNumberToObject(o, "row_bytes", (double)t->whole.row_bytes);
        cJSON_AddNumberToObject(o, "payload_bytes", (double)t->whole.payload_bytes);
        cJSON_AddNumberToObject(o, "bytes_per_row", t->shard.bytes_per_row);
        cJSON_AddNumberToObject(o, "rows_per_shard", (double)t->shard.rows);
        cJSON_AddNumberToObject(o, "bytes_per_shard", (double)t->shard.bytes);
        cJSON_AddNumberToObject(o, "checkpoint_bytes_per_shard", (double)t->ckpt_bytes_shard);
        cJSON_AddItemToArray(tables, o);
    }
    cJSON_AddNumberToObject(j, "shards", r->shards);
    const plan_shard *s = &r->shard;
    cJSON *ps = cJSON_AddObjectToObject(j, "per_shard");
    cJSON_AddNumberToObject(ps, "rows", (double)s->rows);
    cJSON_AddNumberToObject(ps, "table_bytes", (double)s->table_bytes);
    cJSON_AddNumberToObject(ps, "staging_bytes", (double)s->staging_bytes);
    cJSON_AddNumberToObject(ps, "dense_bytes", (double)s->dense_bytes);
    cJSON_AddNumberToObject(ps, "memory_bytes", (double)s->memory_bytes);
    cJSON_AddNumberToObject(ps, "memory_request_bytes", (double)s->request_bytes);
    cJSON_AddNumberToObject(ps, "restore_peak_bytes", (double)s->restore_peak_bytes);
    cJSON_AddNumberToObject(ps, "network_in_bytes_per_second", s->net_in_bytes_per_sec);
    cJSON_AddNumberToObject(ps, "network_out_bytes_per_second", s->net_out_bytes_per_sec);
    cJSON_AddNumberToObject(ps, "checkpoint_bytes", (double)s->ckpt_bytes);
    cJSON_AddNumberToObject(ps, "checkpoint_seconds", s->ckpt_seconds);
    cJSON *cl = cJSON_AddObjectToObject(j, "cluster");
    cJSON_AddNumberToObject(cl, "rows", (double)r->cluster_rows);
    cJSON_AddNumberToObject(cl, "memory_bytes", (double)r->cluster_memory_bytes);
    cJSON_AddNumberToObject(cl, "checkpoint_bytes", (double)r->cluster_ckpt_bytes);
    char *txt = cJSON_Print(j);
    cJSON_Delete(j);
    return txt;
}

static double gib(uint64_t b) { return (double)b / 1073741824.0; }

static void print_text(const plan_input *in, const plan_result *r)
{
    printf("tables (rows in the cluster, bytes per row by the table engine's accounting):\n");
    for (size_t i = 0; i < in->ntables; i++) {
        const plan_table *t = &in->tables[i];
        printf("  %-20s dim %4u %-15s %s  %14llu rows  %6.1f B/row  %5.2f ids/example\n",
               t->spec.name, t->spec.dim, gr_table_opt_name(t->spec.opt.kind),
               t->spec.dtype == GR_DTYPE_F16 ? "f16" : "f32", (unsigned long long)t->whole.rows,
               t->shard.bytes_per_row, t->ids_per_example);
    }
    const plan_shard *s = &r->shard;
    printf("shards: %u (machines of %.1f GiB, headroom %.0f%%, mode %s)\n", r->shards,
           gib(in->machine_bytes), in->headroom * 100, gr_train_mode_name((gr_train_mode)in->mode));
    printf("per shard: %llu rows, tables %.2f GiB + staging %.2f GiB + dense %.2f GiB = %.2f "
           "GiB; request %.2f GiB (a restore into a shard that holds its tables peaks at %.2f "
           "GiB)\n", (unsigned long long)s->rows, gib(s->table_bytes), gib(s->staging_bytes),
           gib(s->dense_bytes), gib(s->memory_bytes), gib(s->request_bytes),
           gib(s->restore_peak_bytes));
    printf("network per shard at %.0f examples/s: in %.1f MB/s, out %.1f MB/s\n",
           in->examples_per_sec, s->net_in_bytes_per_sec / 1e6, s->net_out_bytes_per_sec / 1e6);
    printf("checkpoint: %.2f GiB per shard (%.2f GiB in all), %.1f s at %.0f MiB/s\n",
           gib(s->ckpt_bytes), gib(r->cluster_ckpt_bytes), s->ckpt_seconds,
           in->disk_bytes_per_sec / 1048576.0);
}

int gr_cli_plan(int argc, char **argv)
{
    gr_cli_value v[PO_COUNT];
    gr_cli_parsed p;
    int exit_now = gr_cli_parse_or_exit(&plan_spec, argc, argv, v, &p);
    if (exit_now >= 0) {
        gr_cli_parsed_fini(&p);
        return exit_now;
    }
    int status = 2;
    char *text = NULL;
    plan_input *in = calloc(1, sizeof *in);
    plan_result r;
    if (!in) {
        fprintf(stderr, "granary plan: out of memory\n");
        goto out;
    }
    in->examples_per_sec = 100000;
    in->workers = 8;
    in->batch = 1024;
    if (!v[PO_TABLES].s) {
        fprintf(stderr, "granary plan: --tables SPEC.json is required (see granary plan --help)\n");
        goto out;
    }
    size_t len;
    if (gr_read_file(v[PO_TABLES].s, &text, &len) || plan_read_spec(text, in)) {
        fprintf(stderr, "granary plan: %s: %s\n", v[PO_TABLES].s, gr_errmsg());
        goto out;
    }
    if (v[PO_ROWS].s && plan_set_rows(in, v[PO_ROWS].s)) {
        fprintf(stderr, "granary plan: %s\n", gr_errmsg());
        goto out;
    }
    if (v[PO_QPS].given) in->examples_per_sec = v[PO_QPS].d;
    if (v[PO_WORKERS].given) in->workers = (unsigned)v[PO_WORKERS].i;
    if (v[PO_BATCH].given) in->batch = (uint64_t)v[PO_BATCH].i;
    gr_train_mode mode;
    gr_train_mode_parse(v[PO_MODE].s, &mode); /* one of the option's words */
    in->mode = (int)mode;
    in->machine_bytes = v[PO_MEMORY].u;
    in->headroom = v[PO_HEADROOM].d;
    in->shards = (unsigned)v[PO_SHARDS].i;
    in->disk_bytes_per_sec = (double)v[PO_DISK].u;
    in->cpus = (unsigned)v[PO_CPUS].i;
    status = 1;
    if (plan_compute(in, &r)) {
        fprintf(stderr, "granary plan: %s\n", gr_errmsg());
        goto out;
    }
    if (v[PO_JSON].b) {
        char *j = plan_json(in, &r);
        if (!j) goto out;
        printf("%s\n", j);
        free(j);
    } else {
        print_text(in, &r);
    }
    if (v[PO_EMIT].s && plan_emit_kustomize(in, &r, v[PO_EMIT].s, v[PO_BASE].s)) {
        fprintf(stderr, "granary plan: --emit-kustomize %s: %s\n", v[PO_EMIT].s, gr_errmsg());
        goto out;
    }
    status = 0;
out:
    free(text);
    free(in);
    gr_cli_parsed_fini(&p);
    return status;
}
