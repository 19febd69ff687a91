/* `granary ckpt inspect|list|verify|reshard|export|latest|retain`: offline tools over checkpoint
 * directories (the format is in docs/checkpoints.md). Errors print the library's message,
 * which names the file and what is wrong, and exit 1. */
#include "cli/cli.h"
#include "cli/ckpt_show.h"
#include "cli/opts.h"
#include "granary/ckpt.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: granary ckpt inspect DIR|ROOT [--json]\n"
            "       granary ckpt list ROOT [--json]\n"
            "       granary ckpt verify DIR [--json] [--no-chain]\n"
            "       granary ckpt reshard DIR --shards N --out DIR2 [--zstd LEVEL]\n"
            "       granary ckpt export DIR --out DIR2 [--f16] [--zstd LEVEL]\n"
            "       granary ckpt latest ROOT|DIR [--json]\n"
            "       granary ckpt retain ROOT --keep N\n"
            "  inspect  manifest summary: kind, step, parent chain, tables, rows per table and shard;\n"
            "           the trainer's position and settings, the model, the dense parameters\n"
            "           (sizes, checksum, summary); a root shows its newest checkpoint\n"
            "  list     every checkpoint of a root: step, time, kind, size, complete or not\n"
            "  verify   read every byte of every file the manifest names (dense parts too) and\n"
            "           of the metadata beside it: sizes, checksums, every section, row counts;\n"
            "           a named file that is missing fails; follows the delta chain unless\n"
            "           --no-chain; exit 1 on failure\n"
            "  reshard  rewrite a checkpoint (its delta chain flattened) as N shards\n"
            "  export   a complete model for serving: embeddings (weights only, f16 on request),\n"
            "           dense parameters (f32), the model's kind and shapes; DIR may be a root\n"
            "  latest   print the newest complete checkpoint under ROOT (a checkpoint: itself)\n"
            "  retain   keep the newest N checkpoints under ROOT (and the chains they need)\n");
}

static int fail(const char *what, int rc, bool json)
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
    fprintf(stderr, "granary ckpt %s: %s\n", what, *gr_errmsg() ? gr_errmsg() : gr_strerror(rc));
    return 1;
}

static const char *opt_name(gr_opt_kind k)
{
    static const char *const n[] = {"sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl"};
    return (unsigned)k < 5 ? n[k] : "?";
}

static void human_bytes(uint64_t b, char *buf, size_t cap)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 4) {
        v /= 1024;
        i++;
    }
    snprintf(buf, cap, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

/* The chain names, newest first, as far as the manifests can be read. */
static cJSON *chain_names(const char *dir, const gr_ckpt_manifest *m, char *text, size_t cap)
{
    cJSON *a = cJSON_CreateArray();
    size_t used = 0;
    text[0] = '\0';
    char root[4096];
    snprintf(root, sizeof root, "%s", dir);
    char *slash = strrchr(root, '/');
    while (slash && slash[1] == '\0' && slash > root) { /* trailing slashes */
        *slash = '\0';
        slash = strrchr(root, '/');
    }
    if (slash) *slash = '\0';
    else snprintf(root, sizeof root, ".");
    char parent[GR_CKPT_NAME_MAX];
    snprintf(parent, sizeof parent, "%s", m->parent);
    for (int depth = 0; parent[0] && depth < GR_CKPT_CHAIN_MAX; depth++) {
        cJSON_AddItemToArray(a, cJSON_CreateString(parent));
        used += (size_t)snprintf(text + used, used < cap ? cap - used : 0, "%s%s",
                                 used ? " <- " : "", parent);
        char pd[4200];
        snprintf(pd, sizeof pd, "%s/%s", root, parent);
        gr_ckpt_manifest *pm;
        if (gr_ckpt_manifest_read(pd, &pm) != GR_OK) {
            used += (size_t)snprintf(text + used, used < cap ? cap - used : 0, " (MISSING: %s)",
                                     gr_errmsg());
            break;
        }
        snprintf(parent, sizeof parent, "%s", pm->parent);
        gr_ckpt_manifest_destroy(pm);
    }
    return a;
}

static int cmd_inspect(const char *path, bool json)
{
    /* A root shows its newest checkpoint, as --resume would take it. */
    char dir[4096];
    int rc = gr_ckpt_resolve(path, dir, sizeof dir);
    if (rc != GR_OK) return fail("inspect", rc, json);
    gr_ckpt_manifest *m;
    rc = gr_ckpt_manifest_read(dir, &m);
    if (rc != GR_OK) return fail("inspect", rc, json);
    char chain_text[2048];
    cJSON *chain = chain_names(dir, m, chain_text, sizeof chain_text);
    uint64_t bytes = 0;
    for (uint32_t f = 0; f < m->map.shards; f++) bytes += m->files[f].size;
    if (json) {
        char *mj = gr_ckpt_manifest_to_json(m);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "ok", 1);
        cJSON_AddStringToObject(o, "dir", dir);
        cJSON_AddNumberToObject(o, "bytes", (double)bytes);
        cJSON_AddItemToObject(o, "parents", chain);
        cJSON_AddItemToObject(o, "manifest", mj ? cJSON_Parse(mj) : cJSON_CreateNull());
        free(mj);
        gr_ckpt_manifest_destroy(m);
        if ((rc = ckpt_show_model(dir, o)) != GR_OK) {
            cJSON_Delete(o);
            return fail("inspect", rc, json);
        }
        char *s = cJSON_PrintUnformatted(o);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(o);
        return 0;
    }
    cJSON_Delete(chain);
    char hb[32];
    human_bytes(bytes, hb, sizeof hb);
    printf("checkpoint  %s\n", dir);
    printf("kind        %s%s\n", gr_ckpt_kind_name(m->kind),
           m->kind == GR_CKPT_EXPORT ? (m->weights_f16 ? " (f16 weights)" : " (f32 weights)") : "");
    printf("step        %" PRIu64 "\n", m->step);
    printf("created     %" PRIu64 " (unix seconds)\n", m->created);
    printf("parents     %s\n", m->parent[0] ? chain_text : "(none)");
    printf("shards      %u\n", m->map.shards);
    printf("compression %s\n", m->compression);
    printf("size        %s (%" PRIu64 " bytes)\n", hb, bytes);
    printf("tables      %zu\n", m->ntables);
    for (size_t t = 0; t < m->ntables; t++) {
        const gr_table_spec *s = &m->tables[t];
        uint64_t rows = 0, keys = 0;
        for (uint32_t f = 0; f < m->map.shards; f++) {
            rows += m->files[f].rows[t];
            keys += m->files[f].keys[t];
        }
        printf("  %-20s id %-4u dim %-4u %s  %-15s rows %" PRIu64, s->name, s->id, s->dim,
               s->dtype == GR_DTYPE_F16 ? "f16" : "f32", opt_name(s->opt.kind), rows);
        if (m->kind == GR_CKPT_DELTA) printf("  live keys %" PRIu64, keys);
        printf("\n");
    }
    printf("rows per table and shard:\n  %-8s %-6s %12s", "shard", "kind", "bytes");
    for (size_t t = 0; t < m->ntables; t++) printf(" %14.14s", m->tables[t].name);
    printf("\n");
    for (uint32_t f = 0; f < m->map.shards; f++) {
        const gr_ckpt_manifest_file *fi = &m->files[f];
        printf("  %-8u %-6s %12" PRIu64, f, gr_ckpt_kind_name(fi->kind), fi->size);
        for (size_t t = 0; t < m->ntables; t++) printf(" %14" PRIu64, fi->rows[t]);
        printf("\n");
    }
    gr_ckpt_manifest_destroy(m);
    fflush(stdout);
    rc = ckpt_show_model(dir, NULL);
    return rc != GR_OK ? fail("inspect", rc, json) : 0;
}

static int cmd_verify(const char *dir, bool json, bool chain)
{
    gr_ckpt_verify_stats st;
    double t0 = gr_now_s();
    int rc = gr_ckpt_verify(dir, chain, &st);
    if (rc != GR_OK) return fail("verify", rc, json);
    double secs = gr_now_s() - t0;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "ok", 1);
        cJSON_AddStringToObject(o, "dir", dir);
        cJSON_AddNumberToObject(o, "checkpoints", st.checkpoints);
        cJSON_AddNumberToObject(o, "files", st.files);
        cJSON_AddNumberToObject(o, "bytes", (double)st.bytes);
        cJSON_AddNumberToObject(o, "sections", (double)st.sections);
        cJSON_AddNumberToObject(o, "rows", (double)st.rows);
        cJSON_AddNumberToObject(o, "keys", (double)st.keys);
        cJSON_AddNumberToObject(o, "seconds", secs);
        char *s = cJSON_PrintUnformatted(o);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(o);
    } else {
        printf("ok: %s: %u checkpoint(s), %u file(s), %" PRIu64 " bytes, %" PRIu64
               " sections, %" PRIu64 " rows, %" PRIu64 " live keys verified in %.2f s\n",
               dir, st.checkpoints, st.files, st.bytes, st.sections, st.rows, st.keys, secs);
    }
    return 0;
}

/* Every option of `granary ckpt`, declared once; each subcommand uses the ones it names. */
#define CKPT_OPTIONS(X)                                                                        \
    X(CO_JSON, "json", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL, "print the result as JSON")   \
    X(CO_NO_CHAIN, "no-chain", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,                        \
      "verify: this checkpoint only, not the deltas' parents")                                \
    X(CO_F16, "f16", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL, "export: weights as f16")       \
    X(CO_SHARDS, "shards", GR_CLI_INT, NULL, 1, 4294967295.0, NULL, "N", NULL,                  \
      "reshard: shards to write")                                                              \
    X(CO_OUT, "out", GR_CLI_STR, NULL, 0, 0, NULL, "DIR2", NULL, "reshard, export: output directory") \
    X(CO_ZSTD, "zstd", GR_CLI_INT, NULL, 0, 19, NULL, "LEVEL", "0",                             \
      "reshard, export: compress sections (0 = raw)")                                         \
    X(CO_KEEP, "keep", GR_CLI_INT, NULL, 0, 4294967295.0, NULL, "N", NULL,                      \
      "retain: checkpoints to keep")

enum { CKPT_OPTIONS(GR_CLI_ENUM) CO_COUNT };
static const gr_cli_opt ckpt_opts[] = {CKPT_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec ckpt_spec = {
    .command = "ckpt",
    .synopsis = "granary ckpt inspect|list|verify|reshard|export|latest|retain DIR [options]",
    .opts = ckpt_opts,
    .n_opts = CO_COUNT,
    .max_args = 1,
};

static int ckpt_run(const char *sub, const gr_cli_value *v, const char *dir);

int gr_cli_ckpt(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        if (argc >= 2) gr_cli_help_options(&ckpt_spec, stdout);
        return argc < 2 ? 2 : 0;
    }
    /* argv[1] is the subcommand: the options and the directory follow it. */
    gr_cli_value v[CO_COUNT];
    gr_cli_parsed p;
    int status = gr_cli_parse_or_exit(&ckpt_spec, argc - 1, argv + 1, v, &p);
    if (status < 0) status = ckpt_run(argv[1], v, p.n_args ? p.args[0] : NULL);
    gr_cli_parsed_fini(&p);
    return status;
}

static int ckpt_run(const char *sub, const gr_cli_value *v, const char *dir)
{
    const char *out = v[CO_OUT].s;
    bool json = v[CO_JSON].b, no_chain = v[CO_NO_CHAIN].b, f16 = v[CO_F16].b;
    uint32_t shards = (uint32_t)v[CO_SHARDS].i, keep = (uint32_t)v[CO_KEEP].i;
    uint32_t zstd = (uint32_t)v[CO_ZSTD].i;
    bool have_keep = v[CO_KEEP].given;
    if (!dir) {
        fprintf(stderr, "granary ckpt %s: a directory is required\n", sub);
        usage(stderr);
        return 2;
    }
    if (!strcmp(sub, "inspect")) return cmd_inspect(dir, json);
    if (!strcmp(sub, "verify")) return cmd_verify(dir, json, !no_chain);
    if (!strcmp(sub, "reshard")) {
        if (!shards || !out) {
            fprintf(stderr, "granary ckpt reshard: --shards N and --out DIR2 are required\n");
            return 2;
        }
        double t0 = gr_now_s();
        int rc = gr_ckpt_reshard(dir, out, shards, (int)zstd);
        if (rc != GR_OK) return fail("reshard", rc, json);
        printf("%s: rewritten as %u shard(s) in %.2f s\n", out, shards, gr_now_s() - t0);
        return 0;
    }
    if (!strcmp(sub, "export")) {
        if (!out) {
            fprintf(stderr, "granary ckpt export: --out DIR2 is required\n");
            return 2;
        }
        gr_ckpt_export_info ei;
        int rc = gr_ckpt_export_dir(dir, out, f16, (int)zstd, &ei);
        if (rc != GR_OK) return fail("export", rc, json);
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddBoolToObject(o, "ok", 1);
            cJSON_AddStringToObject(o, "dir", out);
            cJSON_AddNumberToObject(o, "step", (double)ei.step);
            cJSON_AddNumberToObject(o, "rows", (double)ei.rows);
            cJSON_AddNumberToObject(o, "bytes", (double)ei.bytes);
            cJSON_AddNumberToObject(o, "dense", ei.dense);
            cJSON_AddNumberToObject(o, "dense_floats", (double)ei.dense_floats);
            cJSON_AddBoolToObject(o, "model", ei.has_meta);
            cJSON_AddStringToObject(o, "weights", f16 ? "f16" : "f32");
            char *s = cJSON_PrintUnformatted(o);
            printf("%s\n", s);
            free(s);
            cJSON_Delete(o);
        } else {
            printf("%s: %" PRIu64 " rows, %" PRIu64 " bytes (%s weights); %u dense parameter(s), "
                   "%" PRIu64 " floats (f32); %s\n", out, ei.rows, ei.bytes, f16 ? "f16" : "f32",
                   ei.dense, ei.dense_floats,
                   ei.has_meta ? "model settings included" : "no model settings (not written by "
                                                             "granary train)");
        }
        return 0;
    }
    if (!strcmp(sub, "latest")) {
        /* A root (its newest complete checkpoint) or one checkpoint (itself), as --resume. */
        char path[4096];
        gr_ckpt_manifest *m;
        int rc = gr_ckpt_resolve(dir, path, sizeof path);
        if (rc == GR_OK) rc = gr_ckpt_manifest_read(path, &m);
        if (rc != GR_OK) return fail("latest", rc, json);
        uint64_t step = m->step;
        gr_ckpt_manifest_destroy(m);
        const char *slash = strrchr(path, '/');
        const char *name = slash && slash[1] ? slash + 1 : path;
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddBoolToObject(o, "ok", 1);
            cJSON_AddStringToObject(o, "name", name);
            cJSON_AddNumberToObject(o, "step", (double)step);
            cJSON_AddStringToObject(o, "dir", path);
            char *s = cJSON_PrintUnformatted(o);
            printf("%s\n", s);
            free(s);
            cJSON_Delete(o);
        } else {
            printf("%s\n", path);
        }
        return 0;
    }
    if (!strcmp(sub, "list")) {
        int rc = ckpt_list(dir, json);
        return rc != GR_OK ? fail("list", rc, json) : 0;
    }
    if (!strcmp(sub, "retain")) {
        if (!have_keep) {
            fprintf(stderr, "granary ckpt retain: --keep N is required\n");
            return 2;
        }
        uint32_t deleted;
        int rc = gr_ckpt_retain(dir, keep, &deleted);
        if (rc != GR_OK) return fail("retain", rc, json);
        printf("%s: %u checkpoint(s) deleted\n", dir, deleted);
        return 0;
    }
    fprintf(stderr, "granary ckpt: unknown subcommand '%s'\n", sub);
    usage(stderr);
    return 2;
}
