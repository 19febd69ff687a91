/* `granary serve`: a serving replica (docs/serving.md). Loads the saved model in --model DIR
 * (or takes the model's shapes from --kind/--dim/--bottom/--top and everything else from the
 * shards), subscribes to the training shards in --from, and answers HTTP on --http and the
 * binary protocol on --listen until SIGTERM/SIGINT; then exits 0. Prints "http on HOST:PORT"
 * and "listening on HOST:PORT" on stdout once serving (with port 0 this is how callers learn
 * the ports). */
#include "cli/cli.h"
#include "cli/opts.h"
#include "granary/serve.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SERVE_OPTIONS(X)                                                                       \
    X(SV_MODEL, "model", GR_CLI_STR, "model", 0, 0, NULL, "DIR", NULL,                         \
      "saved model: a checkpoint root (its newest checkpoint), one checkpoint\n"              \
      "or an export")                                                                          \
    X(SV_FROM, "from", GR_CLI_STR, "from", 0, 0, NULL, "HOST:PORT,...", NULL,                  \
      "training shards to subscribe to (started with --publish-interval);\n"                  \
      "without it the model is served as loaded")                                              \
    X(SV_AUTH_FILE, "auth-file", GR_CLI_STR, "auth_file", 0, 0, NULL, "F", NULL,               \
      "the training shards' shared secret")                                                    \
    X(SV_HTTP, "http", GR_CLI_STR, "http", 0, 0, NULL, "HOST:PORT", NULL,                      \
      "HTTP/JSON API address (PORT 0 = any free port; printed on stdout)")                    \
    X(SV_LISTEN, "listen", GR_CLI_STR, "listen", 0, 0, NULL, "HOST:PORT", NULL,                \
      "binary protocol address (predict, lookup; printed on stdout)")                         \
    X(SV_THREADS, "threads", GR_CLI_INT, "threads", 1, 1024, NULL, "T", "4",                   \
      "HTTP handler threads")                                                                  \
    X(SV_SLICE, "slice-us", GR_CLI_INT, "slice_us", 0, 100000, NULL, "US", "0",                \
      "time slice the handler threads ask the kernel for (Linux 6.12+: a thread with a short\n"\
      "slice runs ahead of threads on the default, 1.4 ms on 2 cores); 0 = the default")          \
    X(SV_F16, "f16", GR_CLI_FLAG, "f16", 0, 0, NULL, NULL, NULL,                               \
      "ask the shards for rows as half floats (half the bytes)")                              \
    X(SV_POLL_WAIT, "poll-wait", GR_CLI_INT, "poll_wait_ms", 1, 60000, NULL, "MS", "1000",     \
      "longest a subscription poll waits at a shard for news")                                 \
    X(SV_MAX_BODY, "max-body", GR_CLI_SIZE, "max_body", 1024, 1073741824.0, NULL, NULL, "8M",   \
      "bytes per request body (larger: 413)")                                                  \
    X(SV_CONN_MEMORY, "conn-memory", GR_CLI_SIZE, "conn_memory", 4096, 1073741824.0, NULL, NULL,\
      "8k", "HTTP: memory per connection, where a request's headers must fit (larger: 431)")    \
    X(SV_COALESCE, "coalesce", GR_CLI_FLAG, "coalesce", 0, 0, NULL, NULL, NULL,                \
      "HTTP: score the one-example predicts a handler thread reads together in one pass\n"     \
      "over the weights (each score the same bits as alone)")                                  \
    X(SV_MAX_BATCH, "max-batch", GR_CLI_INT, "max_batch", 1, 1000000, NULL, "N", "10000",      \
      "examples per predict request")                                                          \
    X(SV_KIND, "kind", GR_CLI_CHOICE, "kind", 0, 0, "lr|dlrm", NULL, "dlrm",                   \
      "without --model: the model kind (shapes as granary train's)")                          \
    X(SV_DIM, "dim", GR_CLI_INT, "dim", 1, 1024, NULL, "D", "16", "without --model: DLRM dim") \
    X(SV_BOTTOM, "bottom", GR_CLI_STR, "bottom", 0, 0, NULL, "LIST", "64,32",                  \
      "without --model: DLRM bottom hidden sizes")                                             \
    X(SV_TOP, "top", GR_CLI_STR, "top", 0, 0, NULL, "LIST", "128,64",                          \
      "without --model: DLRM top hidden sizes")

enum { SERVE_OPTIONS(GR_CLI_ENUM) SV_COUNT };
static const gr_cli_opt serve_opts[] = {SERVE_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec serve_spec = {
    .command = "serve",
    .synopsis = "granary serve [--model DIR] [--from HOST:PORT,...] --http HOST:PORT "
                "[--listen HOST:PORT] [options]",
    .opts = serve_opts,
    .n_opts = SV_COUNT,
    .config_section = "serve",
    .epilog = "HTTP: POST /v1/predict, POST /v1/lookup, GET /v1/model, GET /healthz, GET /metrics\n"
              "(docs/serving.md).\n",
};

static volatile sig_atomic_t g_stop;
static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

int gr_cli_serve(int argc, char **argv)
{
    gr_cli_value v[SV_COUNT];
    gr_cli_parsed p;
    int exit_now = gr_cli_parse_or_exit(&serve_spec, argc, argv, v, &p);
    if (exit_now >= 0) {
        gr_cli_parsed_fini(&p);
        return exit_now;
    }
    int status = 2;
    gr_serve *s = NULL;
    gr_serve_config cfg;
    gr_serve_config_default(&cfg);
    gr_model_config mc;
    gr_model_config_default(&mc, v[SV_KIND].i == 0 ? GR_MODEL_LR : GR_MODEL_DLRM);
    if (mc.kind == GR_MODEL_DLRM) {
        mc.dim = (uint32_t)v[SV_DIM].i;
        if (gr_model_parse_layers(v[SV_BOTTOM].s, mc.bottom, &mc.n_bottom) ||
            gr_model_parse_layers(v[SV_TOP].s, mc.top, &mc.n_top)) {
            fprintf(stderr, "granary serve: --bottom/--top: %s\n", gr_errmsg());
            goto out;
        }
    }
    if (!v[SV_HTTP].s && !v[SV_LISTEN].s) {
        fprintf(stderr, "granary serve: give --http HOST:PORT and/or --listen HOST:PORT\n");
        goto out;
    }
    if (v[SV_FROM].s && !strncmp(v[SV_FROM].s, "zk://", 5)) {
        fprintf(stderr, "granary serve: --from zk://...: a replica does not read a ZooKeeper "
                        "layout yet; give the shards as HOST:PORT,...\n");
        goto out;
    }
    if (!v[SV_MODEL].s && !v[SV_FROM].s) {
        fprintf(stderr, "granary serve: give --model DIR (a saved model) and/or --from "
                        "HOST:PORT,... (training shards)\n");
        goto out;
    }
    cfg.model_dir = v[SV_MODEL].s;
    cfg.model = v[SV_MODEL].s ? NULL : &mc;
    cfg.from = v[SV_FROM].s;
    cfg.auth_file = v[SV_AUTH_FILE].s;
    cfg.http = v[SV_HTTP].s;
    cfg.listen = v[SV_LISTEN].s;
    cfg.threads = (unsigned)v[SV_THREADS].i;
    cfg.slice_us = (unsigned)v[SV_SLICE].i;
    cfg.conn_memory = (size_t)v[SV_CONN_MEMORY].u;
    cfg.f16 = v[SV_F16].b;
    cfg.poll_wait_ms = (uint32_t)v[SV_POLL_WAIT].i;
    cfg.max_body = (size_t)v[SV_MAX_BODY].u;
    cfg.max_batch = (uint32_t)v[SV_MAX_BATCH].i;
    cfg.coalesce = v[SV_COALESCE].b;
    status = 1;
    if (gr_serve_create(&cfg, &s) || gr_serve_start(s)) {
        fprintf(stderr, "granary serve: %s\n", gr_errmsg());
        goto out;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    if (cfg.http) {
        const char *c = strrchr(cfg.http, ':');
        printf("http on %.*s:%u\n", (int)(c - cfg.http), cfg.http, gr_serve_http_port(s));
    }
    if (cfg.listen) {
        const char *c = strrchr(cfg.listen, ':');
        printf("listening on %.*s:%u\n", (int)(c - cfg.listen), cfg.listen, gr_serve_port(s));
    }
    fflush(stdout);
    while (!g_stop) usleep(50000);
    GR_LOGI("replica: stopping");
    status = 0;
out:
    gr_serve_destroy(s);
    gr_cli_parsed_fini(&p);
    return status;
}

/* The option table, for the controller's checks of job arguments (cli/job_args.c). */
const gr_cli_spec *gr_cli_serve_spec(void);
const gr_cli_spec *gr_cli_serve_spec(void) { return &serve_spec; }
