/* `granary stats --server HOST:PORT [--json]`: asks one shard for its stats (tables, rows,
 * memory, request counters) and prints them as a table or as the raw JSON. */
#include "cli/cli.h"
#include "cli/guard.h"
#include "cli/opts.h"
#include "granary/client.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double num(const cJSON *o, const char *k)
{
    return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

static const char *str(const cJSON *o, const char *k)
{
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
    return s ? s : "?";
}

static void human_bytes(double b, char *out, size_t cap)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    snprintf(out, cap, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

/* The sync job and the checkpoint counters (operations.md promises both in `stats`). */
static void print_sync_ckpt(const cJSON *root)
{
    const cJSON *sy = cJSON_GetObjectItemCaseSensitive(root, "sync");
    if (sy && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sy, "job")))
        printf("sync job: mode %s, %.0f workers, K %.0f, staleness %.0f; step %.0f, %.0f applied, "
               "%.0f dropped, %.0f waiting\n", str(sy, "mode"), num(sy, "workers"),
               num(sy, "aggregate"), num(sy, "staleness"), num(sy, "step"),
               num(sy, "applied_steps"), num(sy, "dropped"), num(sy, "waiting"));
    else if (sy)
        printf("sync job: none (%.0f installed since start, %.0f reset)\n", num(sy, "jobs"),
               num(sy, "resets"));
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(root, "ckpt");
    if (!ck) return;
    printf("checkpoints: %.0f saves (%.0f errors), %.0f commits (%.0f errors), %.0f loads (%.0f "
           "errors)%s\n", num(ck, "saves"), num(ck, "save_errors"), num(ck, "commits"),
           num(ck, "commit_errors"), num(ck, "loads"), num(ck, "load_errors"),
           cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ck, "running")) ? ", one running" : "");
    const cJSON *last = cJSON_GetObjectItemCaseSensitive(ck, "last_save");
    if (cJSON_IsObject(last)) {
        char b[32];
        human_bytes(num(last, "bytes"), b, sizeof b);
        printf("last save: %s (step %.0f, %s, %.0f rows, %s, %.2f s)\n", str(last, "name"),
               num(last, "step"), str(last, "kind"), num(last, "rows"), b, num(last, "seconds"));
    }
}

static void print_human(const cJSON *root)
{
    char mem[32];
    human_bytes(num(root, "memory_bytes"), mem, sizeof mem);
    printf("shard %.0f of %.0f  (%s, up %.0f s, %.0f worker threads)\n", num(root, "shard"),
           num(root, "shards"),
           str(root, "version"),
           num(root, "uptime_s"), num(root, "threads"));
    printf("connections %.0f now, %.0f total, %.0f refused; bad frames %.0f; auth failures %.0f\n",
           num(root, "connections"), num(root, "connections_total"),
           num(root, "connections_rejected"), num(root, "bad_frames"), num(root, "auth_failures"));
    printf("rows %.0f, memory %s, requests in flight %.0f (queued %.0f)\n", num(root, "rows"), mem,
           num(root, "inflight"), num(root, "queued"));
    print_sync_ckpt(root);
    printf("\n");
    const cJSON *t;
    printf("%-24s %6s %5s %14s %12s %14s %14s\n", "table", "id", "dim", "rows", "memory", "hits",
           "applies");
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(root, "tables"))
    {
        human_bytes(num(t, "bytes"), mem, sizeof mem);
        printf("%-24s %6.0f %5.0f %14.0f %12s %14.0f %14.0f\n",
               str(t, "name"), num(t, "id"),
               num(t, "dim"), num(t, "rows"), mem, num(t, "hits"), num(t, "applies"));
    }
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(root, "dense"))
    {
        human_bytes(num(t, "bytes"), mem, sizeof mem);
        printf("%-24s  dense %.0f floats, %s\n",
               str(t, "name"),
               num(t, "size"), mem);
    }
    printf("\n%-16s %12s %8s %14s %14s %14s\n", "request", "count", "errors", "keys", "bytes in",
           "bytes out");
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(root, "requests"))
    {
        if (num(t, "count") == 0 && num(t, "errors") == 0) continue;
        printf("%-16s %12.0f %8.0f %14.0f %14.0f %14.0f\n", t->string, num(t, "count"),
               num(t, "errors"), num(t, "keys"), num(t, "bytes_in"), num(t, "bytes_out"));
    }
}

/* Every option of `granary stats`, declared once (also the keys of --config FILE). */
#define STATS_OPTIONS(X)                                                                       \
    X(STO_SERVER, "server", GR_CLI_STR, "server", 0, 0, NULL, "HOST:PORT", NULL,                 \
      "the shard to ask; required")                                                           \
    X(STO_JSON, "json", GR_CLI_FLAG, "json", 0, 0, NULL, NULL, NULL, "print the raw JSON")      \
    X(STO_AUTH_FILE, "auth-file", GR_CLI_STR, "auth_file", 0, 0, NULL, "F", NULL,               \
      "the shard's shared secret")

enum { STATS_OPTIONS(GR_CLI_ENUM) STO_COUNT };
static const gr_cli_opt stats_opts[] = {STATS_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec stats_spec = {
    .command = "stats",
    .synopsis = "granary stats --server HOST:PORT [--json] [--auth-file F]",
    .opts = stats_opts,
    .n_opts = STO_COUNT,
    .config_section = "",
};

static int stats_run(const gr_cli_value *v)
{
    const char *server = v[STO_SERVER].s, *auth = v[STO_AUTH_FILE].s;
    bool json = v[STO_JSON].b;
    if (!server) {
        fprintf(stderr, "granary stats: --server HOST:PORT is required\n");
        return 2;
    }
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = server;
    cfg.auth_file = auth;
    cfg.any_shard = true;
    cfg.connect_timeout_ms = 3000;
    cfg.request_timeout_ms = 10000;
    gr_client *c;
    if (gr_client_create(&cfg, &c)) {
        fprintf(stderr, "granary stats: %s\n", gr_errmsg());
        gr_cli_explain_no_reply("stats", gr_errmsg());
        return 1;
    }
    char *txt = NULL;
    int rc = gr_client_stats(c, 0, &txt);
    gr_client_destroy(c);
    if (rc) {
        fprintf(stderr, "granary stats: %s\n", gr_errmsg());
        return 1;
    }
    if (json) {
        printf("%s\n", txt);
    } else {
        cJSON *root = cJSON_Parse(txt);
        if (!root) {
            fprintf(stderr, "granary stats: the server sent unreadable JSON\n");
            free(txt);
            return 1;
        }
        print_human(root);
        cJSON_Delete(root);
    }
    free(txt);
    return 0;
}

int gr_cli_stats(int argc, char **argv)
{
    gr_cli_value v[STO_COUNT];
    gr_cli_parsed p;
    int status = gr_cli_parse_or_exit(&stats_spec, argc, argv, v, &p);
    if (status < 0) status = stats_run(v);
    gr_cli_parsed_fini(&p);
    return status;
}
