/* `granary server`: runs one parameter-server shard until SIGTERM/SIGINT or a SHUTDOWN
 * request, then drains in-flight requests and exits 0. Prints "listening on HOST:PORT" on
 * stdout once it accepts connections (with --listen HOST:0 this is how callers learn the
 * port). */
#include "cli/cli.h"
#include "granary/server.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static gr_server *g_server; /* for the signal handler only */

static void on_signal(int sig)
{
    (void)sig;
    if (g_server) gr_server_request_stop(g_server);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: granary server --listen HOST:PORT [--shard I --shards N] [--threads T]\n"
            "                      [--auth-file F] [--insecure] [--config FILE]\n"
            "                      [--max-connections N] [--max-body SIZE] [--max-keys N]\n"
            "                      [--max-tables N] [--max-inflight-bytes SIZE] [--ckpt-root DIR]\n"
            "                      [--max-total-inflight-bytes SIZE] [--send-timeout MS]\n"
            "                      [--frame-timeout MS] [--auth-timeout MS] [--idle-timeout MS]\n"
            "  --listen HOST:PORT  address to serve (PORT 0 = any free port; printed on stdout)\n"
            "  --shard I --shards N  serve shard I of N (default 0 of 1)\n"
            "  --threads T         worker threads (default: CPUs)\n"
            "  --auth-file F       require HMAC-SHA256 challenge-response with the secret in F\n"
            "  --insecure          allow a non-loopback address without --auth-file\n"
            "  --ckpt-root DIR     checkpoint requests may only name directories under DIR (given\n"
            "                      relative to it); without it any path this process can write\n"
            "  --config FILE       JSON {\"tables\":[spec...],\"dense\":[...],\"server\":{options}}\n"
            "                      (server options: listen, shard, shards, threads, auth_file,\n"
            "                      insecure, max_connections, max_body, max_keys, max_tables,\n"
            "                      ckpt_root;\n"
            "                      flags win)\n"
            "  limits: --max-connections (default 256), --max-body bytes per frame (256M),\n"
            "          --max-keys per request (4M), --max-tables per shard (1024),\n"
            "          --max-inflight-bytes of request bodies held per connection (1G),\n"
            "          --max-total-inflight-bytes of request bodies over all connections (4G)\n"
            "  deadlines (ms): --send-timeout a queued reply must be read by the peer (30000),\n"
            "          --frame-timeout a started frame must be complete (60000),\n"
            "          --auth-timeout from connect to authenticated, with --auth-file (10000),\n"
            "          --idle-timeout a connection with nothing in flight may stay silent\n"
            "          (900000; 0 = never)\n");
}

static int split_listen(const char *s, char *host, size_t hcap, uint16_t *port)
{
    const char *colon = strrchr(s, ':');
    if (!colon) return -1;
    const char *h = s, *he = colon;
    if (*h == '[' && he > h && he[-1] == ']') {
        h++;
        he--;
    }
    if ((size_t)(he - h) >= hcap) return -1;
    memcpy(host, h, (size_t)(he - h));
    host[he - h] = '\0';
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 0 || p > 65535 || colon[1] == '\0') return -1;
    *port = (uint16_t)p;
    return 0;
}

static int read_secret(const char *path, char **out, size_t *len)
{
    size_t n;
    if (gr_read_file(path, out, &n)) {
        fprintf(stderr, "granary server: cannot read auth file: %s\n", gr_errmsg());
        return -1;
    }
    while (n > 0 && isspace((unsigned char)(*out)[n - 1])) n--;
    if (n == 0) {
        fprintf(stderr, "granary server: auth file %s is empty\n", path);
        free(*out);
        *out = NULL;
        return -1;
    }
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 077))
        GR_LOGW("auth file %s is readable by other users; chmod 600 it", path);
    *len = n;
    return 0;
}

typedef struct opts {
    const char *listen, *auth_file, *config;
    long shard, shards, threads, max_conns, max_keys, max_tables;
    uint64_t max_body, max_inflight_bytes, max_total_inflight_bytes;
    long send_timeout, frame_timeout, auth_timeout, idle_timeout; /* ms; -1 = default */
    int insecure;
    const char *ckpt_root;
} opts;

/* Options from the config file's "server" object fill whatever the flags left unset. */
static int config_options(cJSON *srv, opts *o)
{
    for (cJSON *it = srv ? srv->child : NULL; it; it = it->next) {
        const char *k = it->string;
        if (!strcmp(k, "listen") && cJSON_IsString(it)) {
            if (!o->listen) o->listen = it->valuestring;
        } else if (!strcmp(k, "auth_file") && cJSON_IsString(it)) {
            if (!o->auth_file) o->auth_file = it->valuestring;
        } else if (!strcmp(k, "ckpt_root") && cJSON_IsString(it)) {
            if (!o->ckpt_root) o->ckpt_root = it->valuestring;
        } else if (!strcmp(k, "insecure") && cJSON_IsBool(it)) {
            if (o->insecure < 0) o->insecure = cJSON_IsTrue(it);
        } else if (cJSON_IsNumber(it) && !strcmp(k, "shard")) {
            if (o->shard < 0) o->shard = (long)it->valuedouble;
        } else if (cJSON_IsNumber(it) && !strcmp(k, "shards")) {
            if (o->shards < 0) o->shards = (long)it->valuedouble;
        } else if (cJSON_IsNumber(it) && !strcmp(k, "threads")) {
            if (o->threads < 0) o->threads = (long)it->valuedouble;
        } else if (cJSON_IsNumber(it) && !strcmp(k, "max_connections")) {
            if (o->max_conns < 0) o->max_conns = (long)it->valuedouble;
        } else if (cJSON_IsNumber(it) && !strcmp(k, "max_keys")) {
            if (o->max_keys < 0) o->max_keys = (long)it->valuedouble;
        } else if (cJSON_IsNumber(it) && !strcmp(k, "max_tables")) {
            if (o->max_tables < 0) o->max_tables = (long)it->valuedouble;
        } else if (!strcmp(k, "max_body") && (cJSON_IsNumber(it) || cJSON_IsString(it))) {
            if (!o->max_body) {
                if (cJSON_IsNumber(it)) o->max_body = (uint64_t)it->valuedouble;
                else if (gr_parse_size(it->valuestring, &o->max_body)) return -1;
            }
        } else {
            fprintf(stderr, "granary server: config: unknown or mistyped server option \"%s\"\n", k);
            return -1;
        }
    }
    return 0;
}

int gr_cli_server(int argc, char **argv)
{
    opts o = {NULL, NULL, NULL, -1, -1, -1, -1, -1, -1, 0, 0, 0, -1, -1, -1, -1, -1, NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--insecure")) {
            o.insecure = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "granary server: %s needs a value (see --help)\n", a);
            return 2;
        }
        char *end = NULL;
        if (!strcmp(a, "--listen")) o.listen = v;
        else if (!strcmp(a, "--auth-file")) o.auth_file = v;
        else if (!strcmp(a, "--config")) o.config = v;
        else if (!strcmp(a, "--ckpt-root")) o.ckpt_root = v;
        else if (!strcmp(a, "--shard")) o.shard = strtol(v, &end, 10);
        else if (!strcmp(a, "--shards")) o.shards = strtol(v, &end, 10);
        else if (!strcmp(a, "--threads")) o.threads = strtol(v, &end, 10);
        else if (!strcmp(a, "--max-connections")) o.max_conns = strtol(v, &end, 10);
        else if (!strcmp(a, "--max-keys")) o.max_keys = strtol(v, &end, 10);
        else if (!strcmp(a, "--max-tables")) o.max_tables = strtol(v, &end, 10);
        else if (!strcmp(a, "--send-timeout")) o.send_timeout = strtol(v, &end, 10);
        else if (!strcmp(a, "--frame-timeout")) o.frame_timeout = strtol(v, &end, 10);
        else if (!strcmp(a, "--auth-timeout")) o.auth_timeout = strtol(v, &end, 10);
        else if (!strcmp(a, "--idle-timeout")) o.idle_timeout = strtol(v, &end, 10);
        else if (!strcmp(a, "--max-total-inflight-bytes")) {
            if (gr_parse_size(v, &o.max_total_inflight_bytes) || !o.max_total_inflight_bytes) {
                fprintf(stderr, "granary server: bad --max-total-inflight-bytes '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--max-inflight-bytes")) {
            if (gr_parse_size(v, &o.max_inflight_bytes) || !o.max_inflight_bytes) {
                fprintf(stderr, "granary server: bad --max-inflight-bytes '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--max-body")) {
            if (gr_parse_size(v, &o.max_body)) {
                fprintf(stderr, "granary server: bad --max-body '%s'\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "granary server: unknown option %s (see --help)\n", a);
            return 2;
        }
        if (end && (*end || end == v)) {
            fprintf(stderr, "granary server: %s needs a number, got '%s'\n", a, v);
            return 2;
        }
        i++;
    }
    char *config_txt = NULL;
    cJSON *config = NULL;
    if (o.config) {
        if (gr_read_file(o.config, &config_txt, NULL)) {
            fprintf(stderr, "granary server: %s\n", gr_errmsg());
            return 1;
        }
        config = cJSON_Parse(config_txt);
        if (!cJSON_IsObject(config)) {
            fprintf(stderr, "granary server: %s is not a JSON object\n", o.config);
            cJSON_Delete(config);
            free(config_txt);
            return 1;
        }
        if (config_options(cJSON_GetObjectItemCaseSensitive(config, "server"), &o)) {
            cJSON_Delete(config);
            free(config_txt);
            return 2;
        }
    }
    int status = 1;
    char *secret = NULL;
    gr_server *srv = NULL;
    gr_server_config cfg;
    gr_server_config_default(&cfg);
    char host[256];
    if (!o.listen) {
        fprintf(stderr, "granary server: --listen HOST:PORT is required\n");
        status = 2;
        goto out;
    }
    if (split_listen(o.listen, host, sizeof host, &cfg.port)) {
        fprintf(stderr, "granary server: bad --listen '%s' (want HOST:PORT)\n", o.listen);
        status = 2;
        goto out;
    }
    cfg.host = host;
    if (o.shard >= 0) cfg.shard = (uint32_t)o.shard;
    if (o.shards >= 0) cfg.shards = (uint32_t)o.shards;
    if (o.threads >= 0) cfg.threads = (uint32_t)o.threads;
    if (o.max_conns > 0) cfg.max_connections = (uint32_t)o.max_conns;
    if (o.max_keys > 0) cfg.limits.max_keys = (uint32_t)o.max_keys;
    if (o.max_tables > 0) cfg.max_tables = (uint32_t)o.max_tables;
    if (o.max_inflight_bytes) cfg.max_inflight_bytes = o.max_inflight_bytes;
    if (o.max_total_inflight_bytes) cfg.max_total_inflight_bytes = o.max_total_inflight_bytes;
    {
        /* Deadlines in ms: 1 ms .. 1 day; --idle-timeout 0 turns idle reaping off. */
        const struct { const char *flag; long v; uint32_t *dst; bool zero_ok; } dl[] = {
            {"--send-timeout", o.send_timeout, &cfg.send_timeout_ms, false},
            {"--frame-timeout", o.frame_timeout, &cfg.frame_timeout_ms, false},
            {"--auth-timeout", o.auth_timeout, &cfg.auth_timeout_ms, false},
            {"--idle-timeout", o.idle_timeout, &cfg.idle_timeout_ms, true},
        };
        for (size_t k = 0; k < sizeof dl / sizeof dl[0]; k++) {
            if (dl[k].v == -1) continue;
            if (dl[k].v < (dl[k].zero_ok ? 0 : 1) || dl[k].v > 86400000L) {
                fprintf(stderr, "granary server: %s must be %s..86400000 ms, got %ld\n",
                        dl[k].flag, dl[k].zero_ok ? "0" : "1", dl[k].v);
                status = 2;
                goto out;
            }
            *dl[k].dst = dl[k].v == 0 ? UINT32_MAX : (uint32_t)dl[k].v;
        }
    }
    if (o.max_body) {
        if (o.max_body > UINT32_MAX) {
            fprintf(stderr, "granary server: --max-body must be below 4G\n");
            goto out;
        }
        cfg.limits.max_body = (uint32_t)o.max_body;
    }
    cfg.insecure = o.insecure > 0;
    cfg.ckpt_root = o.ckpt_root;
    if (o.auth_file) {
        size_t n;
        if (read_secret(o.auth_file, &secret, &n)) goto out;
        cfg.secret = (const uint8_t *)secret;
        cfg.secret_len = n;
    }
    if (gr_server_create(&cfg, &srv)) {
        fprintf(stderr, "granary server: %s\n", gr_errmsg());
        status = 2;
        goto out;
    }
    if (config_txt && gr_server_load_config(srv, config_txt)) {
        fprintf(stderr, "granary server: config %s: %s\n", o.config, gr_errmsg());
        goto out;
    }
    if (gr_server_start(srv)) {
        fprintf(stderr, "granary server: %s\n", gr_errmsg());
        goto out;
    }
    /* Request and reply buffers are megabytes each and are allocated per request: keep freed
     * memory in the heap for the next one instead of returning it to the kernel and paying
     * page faults to get it back (measured: ~5% of the CPU of a pull). */
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    g_server = srv;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    printf("listening on %s:%u\n", host, gr_server_port(srv));
    fflush(stdout);
    gr_server_wait(srv, -1);
    GR_LOGI("shard %u: stopping: draining in-flight requests", cfg.shard);
    gr_server_stop(srv);
    g_server = NULL;
    status = 0;
out:
    gr_server_destroy(srv);
    if (secret) memset(secret, 0, strlen(secret));
    free(secret);
    cJSON_Delete(config);
    free(config_txt);
    return status;
}
