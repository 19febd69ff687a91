/* `granary server`: runs one parameter-server shard until SIGTERM/SIGINT or a SHUTDOWN
 * request, then drains in-flight requests and exits 0. Prints "listening on HOST:PORT" on
 * stdout once it accepts connections (with --listen HOST:0 this is how callers learn the
 * port). */
#include "cli/cli.h"
#include "cli/opts.h"
#include "granary/coord.h"
#include "granary/metrics.h"
#include "granary/server.h"

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

/* Every option of `granary server`, declared once; the "server" object of --config FILE
 * takes the same options by their config key. */
#define SERVER_OPTIONS(X)                                                                      \
    X(SO_LISTEN, "listen", GR_CLI_STR, "listen", 0, 0, NULL, "HOST:PORT", NULL,                 \
      "address to serve (PORT 0 = any free port; printed on stdout); required")                \
    X(SO_SHARD, "shard", GR_CLI_INT, "shard", 0, 16383, NULL, "I", "0",                          \
      "serve shard I of the --shards (below --shards)")                                        \
    X(SO_SHARDS, "shards", GR_CLI_INT, "shards", 1, 16384, NULL, "N", "1", "shards in the cluster") \
    X(SO_THREADS, "threads", GR_CLI_INT, "threads", 0, 4096, NULL, "T", "0",                     \
      "worker threads (0 = one per online CPU)")                                               \
    X(SO_AUTH_FILE, "auth-file", GR_CLI_STR, "auth_file", 0, 0, NULL, "F", NULL,                \
      "require HMAC-SHA256 challenge-response with the secret in F")                           \
    X(SO_INSECURE, "insecure", GR_CLI_FLAG, "insecure", 0, 0, NULL, NULL, NULL,                  \
      "allow a non-loopback address without --auth-file")                                      \
    X(SO_CKPT_ROOT, "ckpt-root", GR_CLI_STR, "ckpt_root", 0, 0, NULL, "DIR", NULL,              \
      "checkpoint requests may only name directories under DIR (given relative\n"              \
      "to it, no '..', no symlink out of it); default: the working directory")                                   \
    X(SO_MAX_CONNECTIONS, "max-connections", GR_CLI_INT, "max_connections", 1, 1048576, NULL,  \
      "N", NULL, "connections served at once; more are refused (default 256)")                \
    X(SO_MAX_BODY, "max-body", GR_CLI_SIZE, "max_body", 1, 4294967295.0, NULL, NULL, NULL,      \
      "bytes per request frame (default 256M)")                                                \
    X(SO_MAX_KEYS, "max-keys", GR_CLI_INT, "max_keys", 1, 4294967295.0, NULL, NULL, NULL,       \
      "keys per request (default 4M)")                                                         \
    X(SO_MAX_TABLES, "max-tables", GR_CLI_INT, "max_tables", 1, 4294967295.0, NULL, NULL, NULL, \
      "tables and dense parameters per shard (default 1024)")                                  \
    X(SO_MAX_INFLIGHT_BYTES, "max-inflight-bytes", GR_CLI_SIZE, "max_inflight_bytes", 1,         \
      1099511627776.0, NULL, NULL, NULL,                                                       \
      "request bodies held per connection (default 1G)")                                      \
    X(SO_MAX_TOTAL_INFLIGHT_BYTES, "max-total-inflight-bytes", GR_CLI_SIZE,                    \
      "max_total_inflight_bytes", 1, 1099511627776.0, NULL, NULL, NULL,                        \
      "request bodies held over all connections; a connection whose next body\n"               \
      "would pass it is not read until others finish (default 4G)")                           \
    X(SO_SEND_TIMEOUT, "send-timeout", GR_CLI_INT, "send_timeout_ms", 1, 86400000, NULL, "MS",  \
      NULL, "a queued reply not read by the peer within MS drops the connection\n"             \
      "and its queued replies (default 30000)")                                               \
    X(SO_FRAME_TIMEOUT, "frame-timeout", GR_CLI_INT, "frame_timeout_ms", 1, 86400000, NULL,     \
      "MS", NULL, "a frame, once started, must be complete within MS (default 60000)")         \
    X(SO_AUTH_TIMEOUT, "auth-timeout", GR_CLI_INT, "auth_timeout_ms", 1, 86400000, NULL, "MS",  \
      NULL, "with --auth-file, authenticate within MS of connecting (default 10000)")          \
    X(SO_IDLE_TIMEOUT, "idle-timeout", GR_CLI_INT, "idle_timeout_ms", 0, 86400000, NULL, "MS",  \
      NULL, "close a connection with nothing in flight, silent for MS\n"                       \
      "(default 900000; 0 = never)")                                                           \
    X(SO_COORD, "coord", GR_CLI_STR, "coord", 0, 0, NULL, "zk://HOSTS/PATH", NULL,             \
      "join the job at PATH: take a free shard index from its layout (--shards\n"              \
      "creates the layout when there is none), or wait as a standby")                          \
    X(SO_STANDBY, "standby", GR_CLI_FLAG, "standby", 0, 0, NULL, NULL, NULL,                   \
      "with --coord: only take over the index of a shard that was lost")                      \
    X(SO_JOB_CKPT, "ckpt-dir", GR_CLI_STR, "ckpt_dir", 0, 0, NULL, "DIR", NULL,                \
      "with --coord: the job's checkpoint root (as granary train --ckpt-dir names\n"          \
      "it, under --ckpt-root): a taken-over index is restored from its newest\n"               \
      "checkpoint")                                                                           \
    X(SO_SESSION, "session-timeout", GR_CLI_INT, "session_timeout_ms", 1000, 600000, NULL,     \
      "MS", "4000", "with --coord: the coordinator session timeout (a silent shard is\n"      \
      "declared lost after this)")                                                            \
    X(SO_PUBLISH_INTERVAL, "publish-interval", GR_CLI_INT, "publish_interval_ms", 0, 86400000,   \
      NULL, "MS", "0", "every MS publish changed rows and dense parameters to subscribed\n"      \
      "serving replicas (granary serve --from; 0 = never)")                                     \
    X(SO_METRICS, "metrics", GR_CLI_STR, "metrics", 0, 0, NULL, "HOST:PORT", NULL,               \
      "serve Prometheus /metrics and /healthz here (docs/operations.md)")

enum { SERVER_OPTIONS(GR_CLI_ENUM) SO_COUNT };
static const gr_cli_opt server_opts[] = {SERVER_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec server_spec = {
    .command = "server",
    .synopsis = "granary server --listen HOST:PORT [--shard I --shards N] [options]\n"
                "       granary server --coord zk://HOSTS/PATH [--listen HOST:PORT] [--standby]",
    .opts = server_opts,
    .n_opts = SO_COUNT,
    .config_section = "server",
    .epilog = "--config FILE is JSON {\"tables\":[spec...],\"dense\":[...],\"server\":{options}}\n"
              "(docs/table.md has the table specs, docs/server.md the rest).\n",
};

static bool server_health(void *ctx, char *why, size_t whycap)
{
    return gr_server_healthy(ctx, why, whycap);
}

static int split_listen(const char *s, char *host, size_t hcap, uint16_t *port_out)
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
    /* The port goes through the option checker like every number the cli reads. */
    static const gr_cli_opt port = {0, "listen", GR_CLI_INT, NULL, 0, 65535, NULL, NULL, NULL, ""};
    gr_cli_value v;
    char err[256];
    if (gr_cli_set_text(&port, colon + 1, &v, err, sizeof err)) return -1;
    *port_out = (uint16_t)v.i;
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

int gr_cli_server(int argc, char **argv)
{
    gr_cli_value v[SO_COUNT];
    gr_cli_parsed p;
    int exit_now = gr_cli_parse_or_exit(&server_spec, argc, argv, v, &p);
    if (exit_now >= 0) {
        gr_cli_parsed_fini(&p);
        return exit_now;
    }
    int status = 1;
    char *secret = NULL;
    gr_server *srv = NULL;
    gr_metrics *metrics = NULL;
    gr_metrics_http *metrics_http = NULL;
    gr_server_config cfg;
    gr_server_config_default(&cfg);
    char host[256];
    gr_coord *coord = NULL;
    gr_server_join *join = NULL;
    const char *listen = v[SO_LISTEN].s;
    if (!listen && v[SO_COORD].s) listen = "127.0.0.1:0"; /* the layout tells workers the port */
    if (v[SO_COORD].s && v[SO_SHARD].given) {
        fprintf(stderr, "granary server: --shard is taken from the job's layout with --coord\n");
        status = 2;
        goto out;
    }
    if (!v[SO_COORD].s && (v[SO_STANDBY].b || v[SO_JOB_CKPT].s)) {
        fprintf(stderr, "granary server: --standby and --ckpt-dir need --coord\n");
        status = 2;
        goto out;
    }
    if (!listen) {
        fprintf(stderr, "granary server: --listen HOST:PORT is required\n");
        status = 2;
        goto out;
    }
    if (split_listen(listen, host, sizeof host, &cfg.port)) {
        fprintf(stderr, "granary server: bad --listen '%s' (want HOST:PORT)\n", listen);
        status = 2;
        goto out;
    }
    cfg.host = host;
    cfg.shard = v[SO_COORD].s ? 0 : (uint32_t)v[SO_SHARD].i; /* --coord: assigned later */
    cfg.shards = v[SO_COORD].s ? 1 : (uint32_t)v[SO_SHARDS].i;
    cfg.threads = (uint32_t)v[SO_THREADS].i;
    if (v[SO_MAX_CONNECTIONS].given) cfg.max_connections = (uint32_t)v[SO_MAX_CONNECTIONS].i;
    if (v[SO_MAX_KEYS].given) cfg.limits.max_keys = (uint32_t)v[SO_MAX_KEYS].i;
    if (v[SO_MAX_TABLES].given) cfg.max_tables = (uint32_t)v[SO_MAX_TABLES].i;
    if (v[SO_MAX_INFLIGHT_BYTES].given) cfg.max_inflight_bytes = v[SO_MAX_INFLIGHT_BYTES].u;
    if (v[SO_MAX_BODY].given) cfg.limits.max_body = (uint32_t)v[SO_MAX_BODY].u;
    if (v[SO_MAX_TOTAL_INFLIGHT_BYTES].given)
        cfg.max_total_inflight_bytes = v[SO_MAX_TOTAL_INFLIGHT_BYTES].u;
    if (v[SO_SEND_TIMEOUT].given) cfg.send_timeout_ms = (uint32_t)v[SO_SEND_TIMEOUT].i;
    if (v[SO_FRAME_TIMEOUT].given) cfg.frame_timeout_ms = (uint32_t)v[SO_FRAME_TIMEOUT].i;
    if (v[SO_AUTH_TIMEOUT].given) cfg.auth_timeout_ms = (uint32_t)v[SO_AUTH_TIMEOUT].i;
    if (v[SO_IDLE_TIMEOUT].given)
        cfg.idle_timeout_ms = v[SO_IDLE_TIMEOUT].i ? (uint32_t)v[SO_IDLE_TIMEOUT].i : UINT32_MAX;
    cfg.insecure = v[SO_INSECURE].b;
    cfg.publish_interval_ms = (uint32_t)v[SO_PUBLISH_INTERVAL].i;
    /* Never "any path": without --ckpt-root, checkpoints stay under the working directory. */
    cfg.ckpt_root = v[SO_CKPT_ROOT].s && *v[SO_CKPT_ROOT].s ? v[SO_CKPT_ROOT].s : ".";
    if (v[SO_AUTH_FILE].s) {
        size_t n;
        if (read_secret(v[SO_AUTH_FILE].s, &secret, &n)) goto out;
        cfg.secret = (const uint8_t *)secret;
        cfg.secret_len = n;
    }
    if (v[SO_METRICS].s) {
        if (gr_metrics_create(&metrics) || gr_metrics_add_process(metrics)) {
            fprintf(stderr, "granary server: %s\n", gr_errmsg());
            goto out;
        }
        cfg.metrics = metrics;
    }
    if (gr_server_create(&cfg, &srv)) {
        fprintf(stderr, "granary server: %s\n", gr_errmsg());
        status = 2;
        goto out;
    }
    if (p.config_text && gr_server_load_config(srv, p.config_text)) {
        fprintf(stderr, "granary server: config %s: %s\n", p.config_path, gr_errmsg());
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
    if (v[SO_COORD].s) {
        gr_coord_options co;
        gr_coord_options_default(&co);
        co.session_timeout_ms = (uint32_t)v[SO_SESSION].i;
        char addr[300];
        snprintf(addr, sizeof addr, "%s:%u", host, gr_server_port(srv));
        gr_server_join_opts jo = {addr, v[SO_SHARDS].given ? (uint32_t)v[SO_SHARDS].i : 0,
                                  v[SO_STANDBY].b, v[SO_JOB_CKPT].s, co.session_timeout_ms};
        if (gr_coord_open(v[SO_COORD].s, &co, &coord) ||
            gr_server_join_start(srv, coord, &jo, &join)) {
            fprintf(stderr, "granary server: --coord %s: %s\n", v[SO_COORD].s, gr_errmsg());
            gr_server_stop(srv);
            goto out;
        }
    }
    if (metrics && gr_metrics_http_start(metrics, v[SO_METRICS].s, server_health, srv,
                                         &metrics_http)) {
        fprintf(stderr, "granary server: %s\n", gr_errmsg());
        gr_server_stop(srv);
        g_server = NULL;
        status = 2;
        goto out;
    }
    printf("listening on %s:%u\n", host, gr_server_port(srv));
    if (metrics_http) printf("metrics on port %u\n", gr_metrics_http_port(metrics_http));
    fflush(stdout);
    gr_server_wait(srv, -1);
    GR_LOGI("shard %u: stopping: draining in-flight requests", gr_server_shard(srv));
    bool replaced = join && gr_server_join_replaced(join);
    gr_server_stop(srv);
    g_server = NULL;
    status = replaced ? 3 : 0;
out:
    gr_metrics_http_stop(metrics_http);
    gr_server_join_stop(join);
    gr_coord_close(coord); /* no coordinator callback runs after this */
    gr_server_join_destroy(join);
    gr_server_destroy(srv);
    gr_metrics_destroy(metrics);
    if (secret) memset(secret, 0, strlen(secret));
    free(secret);
    gr_cli_parsed_fini(&p);
    return status;
}
