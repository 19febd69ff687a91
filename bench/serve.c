/* `granary bench serve`: the serving replica's predict path and its freshness.
 *
 * - Predict: a replica (in this process) holds a DLRM (dim 16) and the rows of every id of
 *   REQUESTS requests drawn from the data generator. `wrk` drives POST /v1/predict at
 *   saturation (batches of 1 and of 100 examples); then a paced client of our own (keep-alive
 *   connections, each request due at a fixed time, latency counted from when it was due, so a
 *   stall is not hidden) sends batch-1 requests at half the saturation rate: p50/p99 there.
 * - Baseline in the same run: the same model and rows with the rows in Redis (redis-server
 *   started here): an HTTP server of the same kind parses the same bodies, does one MGET of
 *   the request's ids, and runs the same forward pass. Measured the same way.
 * - Freshness: a training shard (in this process) publishing every 100 ms, then every
 *   1000 ms, a subscribed replica, a background "trainer" pushing gradients all the time, and a
 *   probe that pushes a fresh key and times until the replica returns its new row.
 *
 * The load generators (wrk, the paced client) are in bench/serve_load.c, the Redis helpers in
 * bench/redis.c. docs/benchmarks.md ("Serving") records the figures and the command. */
#include "bench/bench.h"
#include "bench/redis.h"
#include "bench/serve_load.h"
#include "cli/opts.h"
#include "granary/client.h"
#include "granary/http.h"
#include "granary/serve.h"
#include "granary/server.h"

#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define DIM 16
#define REQUESTS 400 /* distinct request bodies per batch size */

#define SERVE_BENCH_OPTIONS(X)                                                                 \
    X(SB_JSON, "json", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL, "print a final JSON line")     \
    X(SB_SECONDS, "seconds", GR_CLI_NUM, NULL, 1, 600, NULL, "S", "5",                          \
      "length of each load run")                                                               \
    X(SB_CONNS, "connections", GR_CLI_INT, NULL, 1, 1024, NULL, "C", "16",                      \
      "wrk connections at saturation")                                                         \
    X(SB_THREADS, "threads", GR_CLI_INT, NULL, 1, 256, NULL, "T", "4",                          \
      "HTTP handler threads of the replica and of the Redis-backed server")                   \
    X(SB_FRESH, "freshness-seconds", GR_CLI_NUM, NULL, 1, 600, NULL, "S", "6",                  \
      "length of each freshness run")                                                          \
    X(SB_CMP_PACE, "compare-pacers", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,                  \
      "also measure half saturation with the earlier paced client (4 blocking threads) and "      \
      "with the paced client in the other scheduling class (SCHED_FIFO, or ordinary with "       \
      "--pacer-fifo)")                                                                          \
    X(SB_PACER_OTHER, "pacer-other", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,                  \
      "run the paced client as an ordinary thread (the default)")                               \
    X(SB_PACER_FIFO, "pacer-fifo", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,                    \
      "run the paced client as SCHED_FIFO (it then preempts the server's threads on its core)")  \
    X(SB_SLICE, "slice-us", GR_CLI_INT, NULL, 0, 100000, NULL, "US", "0",                        \
      "time slice of the replica's and the Redis-backed server's handler threads (granary "     \
      "serve --slice-us); 0 = the kernel's default")                                           \
    X(SB_PACER_SLICE, "pacer-slice-us", GR_CLI_INT, NULL, 0, 100000, NULL, "US", "0",            \
      "time slice the paced client asks for; 0 = the kernel's default")                        \
    X(SB_ROUNDS, "rounds", GR_CLI_INT, NULL, 1, 16, NULL, "N", "3",                             \
      "saturation runs of batch 1, alternating replica and Redis-backed, and paced runs at half " \
      "saturation of each; medians reported")                                                    \
    X(SB_WRK_THREADS, "wrk-threads", GR_CLI_INT, NULL, 1, 64, NULL, "T", "2",                   \
      "wrk threads at saturation")                                                             \
    X(SB_COALESCE, "coalesce", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,                      \
      "the replica coalesces one-example predicts (granary serve --coalesce)")                 \
    X(SB_SKIP_PINNED, "skip-pinned", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,                \
      "skip the saturation rounds with wrk on a core of its own (the servers on the others)")   \
    X(SB_SAT_ONLY, "saturation-only", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,                 \
      "measure only the batch-1 saturation rounds (no batch 100, paced, binary or freshness)")

enum { SERVE_BENCH_OPTIONS(GR_CLI_ENUM) SB_COUNT };
static const gr_cli_opt serve_bench_opts[] = {SERVE_BENCH_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec serve_bench_spec = {
    .command = "bench serve",
    .synopsis = "granary bench serve [--json] [--seconds S] [--connections C] [--threads T] "
                "[--rounds N] [--wrk-threads T] [--saturation-only] [--skip-pinned] [--coalesce] "
                "[--compare-pacers] [--pacer-other] "
                "[--pacer-fifo]",
    .opts = serve_bench_opts,
    .n_opts = SB_COUNT,
    .config_section = NULL,
};

/* ---- request bodies ---- */


/* REQUESTS bodies of `batch` lines each ({"lines": [...]}) from the generator; every id they
 * use goes to ids (for loading rows). */
static void make_bodies(gr_datagen_stream *g, unsigned batch, bodies *out, uint64_t **ids, size_t *nids,
                        size_t *capids)
{
    out->n = REQUESTS;
    out->b = calloc(REQUESTS, sizeof *out->b);
    out->len = calloc(REQUESTS, sizeof *out->len);
    char row[GR_DATAGEN_ROW_MAX];
    for (size_t r = 0; r < REQUESTS; r++) {
        size_t cap = 64 + (size_t)batch * (GR_DATAGEN_ROW_MAX + 64), n = 0;
        char *b = malloc(cap);
        n += (size_t)snprintf(b + n, cap - n, "{\"lines\":[");
        for (unsigned i = 0; i < batch; i++) {
            size_t len = gr_datagen_stream_next(g, row, NULL, NULL);
            float label, dense[GR_CRITEO_DENSE];
            uint64_t fid[GR_CRITEO_SPARSE];
            gr_criteo_parse_line(row, len - 1, &label, dense, fid);
            if (*nids + GR_CRITEO_SPARSE > *capids) {
                *capids = *capids ? *capids * 2 : 65536;
                *ids = realloc(*ids, *capids * sizeof **ids);
            }
            memcpy(*ids + *nids, fid, sizeof fid);
            *nids += GR_CRITEO_SPARSE;
            /* Without the label, tabs as JSON escapes. */
            n += (size_t)snprintf(b + n, cap - n, "%s\"", i ? "," : "");
            for (size_t k = 2; k < len - 1; k++) {
                if (row[k] == '\t') b[n++] = '\\', b[n++] = 't';
                else b[n++] = row[k];
            }
            b[n++] = '"';
        }
        n += (size_t)snprintf(b + n, cap - n, "]}");
        out->b[r] = b;
        out->len[r] = n;
    }
}

static void bodies_free(bodies *b)
{
    for (size_t i = 0; i < b->n; i++) free(b->b[i]);
    free(b->b);
    free(b->len);
}

/* ---- the binary protocol: closed-loop PREDICT of one example per request ---- */

typedef struct binload {
    uint16_t port;
    double secs;
    const float *dense;   /* REQUESTS examples */
    const uint64_t *ids;
    atomic_ullong done, errors;
} binload;

static void *bin_main(void *arg)
{
    binload *b = arg;
    int fd = gr_bench_tcp_connect(b->port);
    gr_proto_buf out;
    gr_proto_buf_init(&out);
    uint8_t *reply = malloc(1 << 16);
    double end = sl_now_s() + b->secs;
    for (uint64_t k = 0; fd >= 0 && sl_now_s() < end; k++) {
        size_t i = k % REQUESTS;
        gr_proto_predict q = {.n = 1, .ndense = GR_CRITEO_DENSE, .nsparse = GR_CRITEO_SPARSE,
                              .dense = b->dense + i * GR_CRITEO_DENSE,
                              .ids = b->ids + i * GR_CRITEO_SPARSE};
        out.len = 0;
        if (gr_proto_begin(&out, GR_PROTO_REQUEST, GR_OP_PREDICT, 0, 0, k) ||
            gr_proto_put_predict(&out, &q) || gr_proto_end(&out, 0) || sl_send_all(fd, (char *)out.data, out.len))
            break;
        size_t got = 0, need = GR_PROTO_HEADER_SIZE;
        gr_proto_header h = {0};
        while (got < need) {
            ssize_t r = recv(fd, reply + got, need - got, 0);
            if (r <= 0) break;
            got += (size_t)r;
            if (got == GR_PROTO_HEADER_SIZE && need == GR_PROTO_HEADER_SIZE) {
                gr_proto_limits lim;
                gr_proto_limits_default(&lim);
                int hr = gr_proto_header_decode(reply, got, &lim, &h, NULL);
                if (hr != GR_OK && hr != GR_EAGAIN) break;
                need += h.body_len;
            }
        }
        if (got < need) break;
        if (h.status) atomic_fetch_add(&b->errors, 1);
        else atomic_fetch_add(&b->done, 1);
    }
    if (fd >= 0) close(fd);
    gr_proto_buf_fini(&out);
    free(reply);
    return NULL;
}

/* Requests/s of `conns` connections each sending the next PREDICT as soon as the last one is
 * answered. */
static double run_binary(uint16_t port, const bodies *b1, unsigned conns, double secs)
{
    float *dense = malloc(REQUESTS * GR_CRITEO_DENSE * sizeof *dense);
    uint64_t *ids = malloc(REQUESTS * GR_CRITEO_SPARSE * sizeof *ids);
    for (size_t i = 0; i < REQUESTS; i++) {
        size_t n;
        float *d;
        uint64_t *x;
        char err[128];
        if (gr_serve_parse_predict(b1->b[i], b1->len[i], 1, &n, &d, &x, err, sizeof err)) continue;
        memcpy(dense + i * GR_CRITEO_DENSE, d, GR_CRITEO_DENSE * sizeof *d);
        memcpy(ids + i * GR_CRITEO_SPARSE, x, GR_CRITEO_SPARSE * sizeof *x);
        free(d), free(x);
    }
    binload b = {.port = port, .secs = secs, .dense = dense, .ids = ids};
    pthread_t th[64];
    if (conns > 64) conns = 64;
    double t0 = sl_now_s();
    for (unsigned i = 0; i < conns; i++) pthread_create(&th[i], NULL, bin_main, &b);
    for (unsigned i = 0; i < conns; i++) pthread_join(th[i], NULL);
    double dt = sl_now_s() - t0;
    free(dense), free(ids);
    return atomic_load(&b.errors) ? NAN : (double)atomic_load(&b.done) / dt;
}

/* ---- the Redis-backed baseline ---- */

/* A pooled connection to redis-server: the shared reader plus a free-list link. */
typedef struct rconn {
    gr_redis_conn c;
    struct rconn *next;
} rconn;

typedef struct redis_srv {
    uint16_t redis_port;
    gr_model *m;
    float *params;
    gr_model_prepared *prep; /* as the replica prepares each dense version */
    pthread_mutex_t mu; /* the free lists */
    rconn *conns;
    gr_model_ws **ws;
    size_t nws, capws;
    uint32_t max_batch;
} redis_srv;

static rconn *conn_take(redis_srv *rs)
{
    pthread_mutex_lock(&rs->mu);
    rconn *r = rs->conns;
    if (r) rs->conns = r->next;
    pthread_mutex_unlock(&rs->mu);
    if (r) return r;
    r = calloc(1, sizeof *r);
    r->c.fd = gr_bench_tcp_connect(rs->redis_port);
    r->c.cap = 1 << 22;
    r->c.buf = malloc(r->c.cap);
    return r;
}

static void conn_give(redis_srv *rs, rconn *r)
{
    pthread_mutex_lock(&rs->mu);
    r->next = rs->conns;
    rs->conns = r;
    pthread_mutex_unlock(&rs->mu);
}

static gr_model_ws *ws_take(redis_srv *rs)
{
    pthread_mutex_lock(&rs->mu);
    gr_model_ws *w = rs->nws ? rs->ws[--rs->nws] : NULL;
    pthread_mutex_unlock(&rs->mu);
    if (!w) gr_model_ws_create(rs->m, &w);
    return w;
}

static void ws_give(redis_srv *rs, gr_model_ws *w)
{
    pthread_mutex_lock(&rs->mu);
    if (rs->nws == rs->capws) {
        rs->capws = rs->capws ? rs->capws * 2 : 16;
        rs->ws = realloc(rs->ws, rs->capws * sizeof *rs->ws);
    }
    rs->ws[rs->nws++] = w;
    pthread_mutex_unlock(&rs->mu);
}

/* The same request as the replica's /v1/predict: parse, one MGET of the unique ids, the same
 * forward pass, the same reply. */
static void redis_handle(void *ctx, const gr_http_request *req, gr_http_response *resp)
{
    redis_srv *rs = ctx;
    size_t n;
    float *dense;
    uint64_t *ids;
    char err[256];
    if (gr_serve_parse_predict(req->body, req->body_len, rs->max_batch, &n, &dense, &ids, err,
                               sizeof err)) {
        gr_http_error(resp, 400, "%s", err);
        return;
    }
    size_t occ = n * GR_CRITEO_SPARSE;
    uint64_t *uniq = malloc(occ * sizeof *uniq);
    uint32_t *inv = malloc(occ * sizeof *inv);
    gr_dedup_scratch ds = {0};
    long nu = gr_dedup(ids, occ, uniq, inv, &ds);
    gr_dedup_scratch_fini(&ds);
    float *rows = calloc((size_t)(nu > 0 ? nu : 1) * DIM, sizeof *rows);
    float *emb = malloc(occ * DIM * sizeof *emb), *probs = malloc(n * sizeof *probs);
    /* One MGET of the request's unique ids. */
    size_t cap = 64 + (size_t)nu * 48, len = 0;
    char *cmd = malloc(cap);
    len += (size_t)snprintf(cmd + len, cap - len, "*%ld\r\n$4\r\nMGET\r\n", nu + 1);
    for (long i = 0; i < nu; i++) {
        char key[24];
        int kn = snprintf(key, sizeof key, "%llx", (unsigned long long)uniq[i]);
        len += (size_t)snprintf(cmd + len, cap - len, "$%d\r\n%s\r\n", kn, key);
    }
    rconn *r = conn_take(rs);
    bool ok = r->c.fd >= 0 && gr_redis_send(r->c.fd, cmd, len) == 0;
    char *l = ok ? gr_redis_line(&r->c) : NULL;
    ok = l && l[0] == '*' && atol(l + 1) == nu;
    for (long i = 0; ok && i < nu; i++) {
        l = gr_redis_line(&r->c);
        if (!l || l[0] != '$') ok = false;
        else if (atol(l + 1) == DIM * 4)
            ok = gr_redis_read(&r->c, rows + (size_t)i * DIM, DIM * 4) == 0 && gr_redis_line(&r->c);
        else if (atol(l + 1) >= 0) ok = false; /* missing keys ($-1) read zeros */
    }
    if (ok) conn_give(rs, r);
    else {
        if (r->c.fd >= 0) close(r->c.fd);
        free(r->c.buf);
        free(r);
    }
    if (ok) {
        for (size_t i = 0; i < occ; i++) memcpy(emb + i * DIM, rows + (size_t)inv[i] * DIM, DIM * 4);
        gr_model_ws *w = ws_take(rs);
        ok = gr_model_predict_prepared(rs->m, w, rs->params, rs->prep, n, dense, emb, probs) == 0;
        ws_give(rs, w);
    }
    if (!ok) {
        gr_http_error(resp, 502, "redis MGET failed");
    } else {
        /* The replica's own float formatter: the two servers differ only in where the rows
         * come from. */
        size_t rcap = 64 + n * (GR_SERVE_FLOAT_CHARS + 1), rn = 0;
        char *out = malloc(rcap);
        rn += (size_t)snprintf(out + rn, rcap - rn, "{\"predictions\":[");
        for (size_t i = 0; i < n; i++) {
            if (i) out[rn++] = ',';
            rn += gr_serve_format_float(probs[i], out + rn);
        }
        rn += (size_t)snprintf(out + rn, rcap - rn, "],\"model_version\":0}");
        gr_http_take(resp, 200, "application/json", out, rn);
    }
    free(cmd), free(uniq), free(inv), free(rows), free(emb), free(probs), free(dense), free(ids);
}

/* MSET of every row, 1000 keys per command. */
static int redis_load(uint16_t port, const uint64_t *ids, size_t n, const float *rows)
{
    int fd = gr_bench_tcp_connect(port);
    if (fd < 0) return -1;
    gr_redis_conn r = {fd, malloc(1 << 20), 0, 0, 1 << 20};
    size_t cap = 1000 * (DIM * 4 + 64) + 64;
    char *cmd = malloc(cap);
    int rc = 0;
    for (size_t lo = 0; lo < n && !rc; lo += 1000) {
        size_t hi = lo + 1000 < n ? lo + 1000 : n, len = 0;
        len += (size_t)snprintf(cmd + len, cap - len, "*%zu\r\n$4\r\nMSET\r\n", 2 * (hi - lo) + 1);
        for (size_t i = lo; i < hi; i++) {
            char key[24];
            int kn = snprintf(key, sizeof key, "%llx", (unsigned long long)ids[i]);
            len += (size_t)snprintf(cmd + len, cap - len, "$%d\r\n%s\r\n$%d\r\n", kn, key, DIM * 4);
            memcpy(cmd + len, rows + i * DIM, DIM * 4);
            len += DIM * 4;
            len += (size_t)snprintf(cmd + len, cap - len, "\r\n");
        }
        char *l;
        rc = gr_redis_send(fd, cmd, len) || !(l = gr_redis_line(&r)) || strcmp(l, "+OK") ? -1 : 0;
    }
    free(cmd);
    free(r.buf);
    close(fd);
    return rc;
}

/* ---- freshness ---- */

typedef struct fresh {
    gr_client *c;
    atomic_bool stop;
} fresh;

/* The background trainer: batches of 512 random rows pushed back to back. */
static void *trainer_main(void *arg)
{
    fresh *f = arg;
    uint64_t keys[512];
    float grads[512 * DIM];
    gr_rng r;
    gr_rng_seed(&r, 5);
    for (size_t i = 0; i < 512 * DIM; i++) grads[i] = 0.001f;
    while (!atomic_load(&f->stop)) {
        for (int i = 0; i < 512; i++) keys[i] = gr_rng_next(&r) % 1000000;
        if (gr_client_push(f->c, GR_TRAIN_EMB_TABLE, DIM, keys, 512, grads)) usleep(1000);
        usleep(2000);
    }
    return NULL;
}

typedef struct probe_t {
    uint64_t key;
    float want;
    double t;
    bool live;
} probe_t;

/* Freshness at one publish interval: ms from a probe's push returning (the row updated on the
 * shard) to the replica returning the new row; *n samples. */
static int run_freshness(uint32_t interval_ms, double secs, double *p50, double *p99, size_t *nout)
{
    *p50 = *p99 = NAN;
    *nout = 0;
    gr_server_config sc;
    gr_server_config_default(&sc);
    sc.threads = 2;
    sc.publish_interval_ms = interval_ms;
    gr_server *srv = NULL;
    if (gr_server_create(&sc, &srv) || gr_server_start(srv)) return -1;
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", gr_server_port(srv));
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = addr;
    fresh f = {0};
    gr_client *probe = NULL;
    gr_serve *rep = NULL;
    int rc = gr_client_create(&cc, &f.c);
    if (!rc) rc = gr_client_create(&cc, &probe);
    char spec[160];
    snprintf(spec, sizeof spec, "{\"name\":\"emb\",\"id\":%u,\"dim\":%u,\"optimizer\":{\"kind\":\"sgd\",\"lr\":1}}",
             GR_TRAIN_EMB_TABLE, DIM);
    if (!rc) rc = gr_client_create_table(f.c, spec);
    gr_model_config mc;
    gr_model_config_default(&mc, GR_MODEL_DLRM);
    gr_serve_config cfg;
    gr_serve_config_default(&cfg);
    cfg.model = &mc;
    cfg.from = addr;
    if (!rc) rc = gr_serve_create(&cfg, &rep);
    if (!rc) rc = gr_serve_start(rep);
    pthread_t th;
    bool started = !rc && pthread_create(&th, NULL, trainer_main, &f) == 0;
    /* Let the replica take its first snapshot before probing. */
    for (int i = 0; !rc && i < 200; i++) {
        gr_serve_stats st;
        gr_serve_get_stats(rep, &st);
        if (st.publications) break;
        usleep(20000);
    }
    enum { PENDING = 64 };
    probe_t pend[PENDING] = {{0}};
    double *lat = malloc(100000 * sizeof *lat);
    size_t n = 0;
    uint64_t next_key = 1ull << 40;
    double t_end = sl_now_s() + secs, next_probe = sl_now_s();
    while (!rc && sl_now_s() < t_end + 3.0 * interval_ms / 1000.0) {
        double now = sl_now_s();
        if (now < t_end && now >= next_probe) {
            for (int i = 0; i < PENDING; i++)
                if (!pend[i].live) {
                    float g[DIM];
                    for (int k = 0; k < DIM; k++) g[k] = -1.0f - (float)(next_key % 1000);
                    uint64_t key = next_key++;
                    if (gr_client_push(probe, GR_TRAIN_EMB_TABLE, DIM, &key, 1, g)) break;
                    pend[i] = (probe_t){key, -g[0], sl_now_s(), true};
                    break;
                }
            next_probe = now + 0.02;
        }
        for (int i = 0; i < PENDING; i++) {
            if (!pend[i].live) continue;
            float row[DIM];
            bool found;
            gr_serve_lookup(rep, GR_TRAIN_EMB_TABLE, &pend[i].key, 1, row, &found);
            if (found && row[0] == pend[i].want) {
                if (n < 100000) lat[n++] = (sl_now_s() - pend[i].t) * 1e3;
                pend[i].live = false;
            }
        }
        usleep(200);
    }
    atomic_store(&f.stop, true);
    if (started) pthread_join(th, NULL);
    if (n) {
        *p50 = sl_pct(lat, n, 0.5);
        *p99 = sl_pct(lat, n, 0.99);
    }
    *nout = n;
    free(lat);
    gr_serve_destroy(rep);
    gr_client_destroy(probe);
    gr_client_destroy(f.c);
    gr_server_destroy(srv);
    return rc;
}

/* ---- the run ---- */

static void print_load(const char *what, const load *l)
{
    printf("  %-44s %9.0f req/s  p50 %7.3f ms  p99 %7.3f ms  (%llu requests, %llu errors)\n", what,
           l->qps, l->p50_ms, l->p99_ms, (unsigned long long)l->requests,
           (unsigned long long)l->errors);
}

/* The paced client `rounds` times at the same rate: *out holds the medians of the rounds, field
 * by field (the p99 is the median round's), and every round's latencies pooled; p99s[0][k] and
 * p99s[1][k] are round k's p99 and the steal during it. One round's p99 is at the mercy of
 * the hypervisor: 5 s with 1.8 s of steal gave 24 ms where the rounds without gave 0.3-1.4 ms
 * (docs/serving.md). */
static void run_paced_rounds(const char *what, uint16_t port, const bodies *b, double rate,
                             double secs, bool fifo, unsigned rounds, load *out, double p99s[2][16])
{
    load r[16] = {0};
    for (unsigned k = 0; k < rounds; k++) {
        fprintf(stderr, "bench serve: round %u/%u: %s (%.0f req/s)\n", k + 1, rounds, what, rate);
        sl_run_paced(port, b, rate, secs, fifo, &r[k]);
        p99s[0][k] = r[k].p99_ms;
        p99s[1][k] = r[k].steal_ms;
        fprintf(stderr, "bench serve: round %u/%u: p99 %.3f ms, steal %.1f ms\n", k + 1, rounds,
                r[k].p99_ms, r[k].steal_ms);
    }
    sl_load_median(r, rounds, out);
    for (unsigned k = 0; k < rounds; k++) sl_load_free(&r[k]);
}

static void json_list(const char *key, const double *v, unsigned n)
{
    printf("\"%s\":[", key);
    for (unsigned i = 0; i < n; i++) printf(isfinite(v[i]) ? "%s%.3f" : "%snull", i ? "," : "", v[i]);
    printf("],");
}

static void json_num(const char *key, double v, bool comma)
{
    if (isnan(v)) printf("\"%s\":null%s", key, comma ? "," : "");
    else printf("\"%s\":%.4f%s", key, v, comma ? "," : "");
}

/* Requests per coalesced run between two readings of the replica's stats; NAN for none. */
static double mean_run(const gr_serve_stats *a, const gr_serve_stats *b)
{
    uint64_t runs = b->coalesced_runs - a->coalesced_runs;
    return runs ? (double)(b->coalesced_requests - a->coalesced_requests) / (double)runs : NAN;
}

int gr_bench_serve(int argc, char **argv)
{
    gr_cli_value v[SB_COUNT];
    gr_cli_parsed parsed;
    int exit_now = gr_cli_parse_or_exit(&serve_bench_spec, argc, argv, v, &parsed);
    gr_cli_parsed_fini(&parsed);
    if (exit_now >= 0) return exit_now;
    double secs = v[SB_SECONDS].d, fsecs = v[SB_FRESH].d;
    unsigned conns = (unsigned)v[SB_CONNS].i, threads = (unsigned)v[SB_THREADS].i;
    unsigned rounds = (unsigned)v[SB_ROUNDS].i, wrk_threads = (unsigned)v[SB_WRK_THREADS].i;
    /* The paced client runs as an ordinary thread unless asked: as SCHED_FIFO it preempts the
     * server's threads on its core, which a client on another machine never does. */
    bool pacer_fifo = v[SB_PACER_FIFO].b && !v[SB_PACER_OTHER].b;
    signal(SIGPIPE, SIG_IGN);

    /* The model and its rows. */
    gr_model_config mc;
    gr_model_config_default(&mc, GR_MODEL_DLRM);
    gr_serve_config cfg;
    gr_serve_config_default(&cfg);
    cfg.model = &mc;
    cfg.http = "127.0.0.1:0";
    cfg.listen = "127.0.0.1:0";
    cfg.threads = threads;
    cfg.slice_us = (unsigned)v[SB_SLICE].i;
    cfg.coalesce = v[SB_COALESCE].b;
    sl_set_pacer_slice((unsigned)v[SB_PACER_SLICE].i);
    gr_serve *rep = NULL;
    if (gr_serve_create(&cfg, &rep) || gr_serve_start(rep)) {
        fprintf(stderr, "granary bench serve: %s\n", gr_errmsg());
        gr_serve_destroy(rep);
        return 1;
    }
    const gr_model *m = gr_serve_model(rep);
    size_t np = gr_model_dense_size(m);
    float *params = malloc(np * sizeof *params);
    gr_model_init_dense(m, params);
    gr_serve_set_dense(rep, params, np, 1);
    gr_datagen_stream *g;
    gr_datagen_stream_create(3, 0, &g);
    bodies b1 = {0}, b100 = {0};
    uint64_t *ids = NULL;
    size_t nids = 0, capids = 0;
    make_bodies(g, 1, &b1, &ids, &nids, &capids);
    make_bodies(g, 100, &b100, &ids, &nids, &capids);
    gr_datagen_stream_destroy(g);
    gr_dedup_scratch ds = {0};
    uint64_t *uniq = malloc(nids * sizeof *uniq);
    uint32_t *inv = malloc(nids * sizeof *inv);
    long nu = gr_dedup(ids, nids, uniq, inv, &ds);
    gr_dedup_scratch_fini(&ds);
    float *rows = malloc((size_t)nu * DIM * sizeof *rows);
    gr_rng r;
    gr_rng_seed(&r, 9);
    for (size_t i = 0; i < (size_t)nu * DIM; i++) rows[i] = (float)(gr_rng_uniform(&r) * 0.1 - 0.05);
    gr_serve_put_rows(rep, GR_TRAIN_EMB_TABLE, DIM, uniq, (size_t)nu, rows, 1);
    fprintf(stderr, "bench serve: DLRM dim %u, %ld rows; %u requests each of batch 1 and 100\n", DIM,
            nu, REQUESTS);

    char s1[64] = "/tmp/granary-bench-serve-1-XXXXXX", s100[64] = "/tmp/granary-bench-serve-100-XXXXXX";
    int f1 = mkstemp(s1), f100 = mkstemp(s100);
    if (f1 >= 0) close(f1);
    if (f100 >= 0) close(f100);
    bool have_wrk = sl_write_script(s1, &b1) == 0 && sl_write_script(s100, &b100) == 0 &&
                    system("wrk --version >/dev/null 2>&1") != 127 * 256;
    load sat = {NAN, NAN, NAN, 0, 0, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, false, false, NULL, 0}, fixed = sat, sat100 = sat, rsat = sat, rfixed = sat,
         fixed_threads = sat, fixed_other = sat;
    double fixed_p99s[2][16], rfixed_p99s[2][16]; /* each paced round's p99 and steal */
    for (unsigned k = 0; k < 16; k++)
        fixed_p99s[0][k] = fixed_p99s[1][k] = rfixed_p99s[0][k] = rfixed_p99s[1][k] = NAN;
    load psat = sat, prsat = sat; /* the rounds with wrk on a CPU of its own */
    int client_cpu = -1;
    double coalesced = NAN, pcoalesced = NAN; /* requests per coalesced run, mean */
    uint16_t hp = gr_serve_http_port(rep);
    if (!have_wrk) fprintf(stderr, "bench serve: wrk not found; predict figures skipped\n");
    /* The Redis-backed baseline, started before anything is measured so that the saturation
     * runs of the two servers can alternate (--rounds): a slow stretch of the shared machine
     * then falls on both, not on one. */
    uint16_t rport = 0;
    pid_t rpid = have_wrk ? gr_redis_start(&rport) : -1;
    redis_srv rs = {.redis_port = rport, .m = (gr_model *)m, .params = params, .max_batch = 10000};
    pthread_mutex_init(&rs.mu, NULL);
    gr_http_server *hs = NULL;
    if (rpid > 0 && redis_load(rport, uniq, (size_t)nu, rows) == 0) {
        gr_model_prepare(m, params, &rs.prep); /* the replica's forward pass, fast path included */
        /* The replica's HTTP settings (its connection memory too: gr_serve_config_default). */
        gr_http_config hc = {.listen = "127.0.0.1:0", .threads = threads, .max_body = 8u << 20,
                             .slice_us = cfg.slice_us, .conn_memory = cfg.conn_memory,
                             .handler = redis_handle, .ctx = &rs};
        if (gr_http_start(&hc, &hs)) hs = NULL;
    }
    if (have_wrk && !hs) fprintf(stderr, "bench serve: redis-server not available; the baseline is skipped\n");
    if (have_wrk) {
        load sr[16], rr[16];
        gr_serve_stats c0, c1;
        gr_serve_get_stats(rep, &c0);
        for (unsigned k = 0; k < rounds; k++) {
            fprintf(stderr, "bench serve: round %u/%u: replica, wrk at saturation (%u threads, %u "
                    "connections, %.0f s)\n", k + 1, rounds, wrk_threads, conns, secs);
            sl_run_wrk(hp, s1, wrk_threads, conns, secs, 0, &sr[k]);
            rr[k] = sat;
            if (!hs) continue;
            fprintf(stderr, "bench serve: round %u/%u: Redis-backed, wrk at saturation\n", k + 1, rounds);
            sl_run_wrk(gr_http_port(hs), s1, wrk_threads, conns, secs, rpid, &rr[k]);
            fprintf(stderr, "bench serve: round %u/%u: %.0f / %.0f req/s = %.2fx; CPU per request "
                    "%.1f + wrk %.1f us / %.1f + wrk %.1f us\n", k + 1, rounds, sr[k].qps, rr[k].qps,
                    sr[k].qps / rr[k].qps, sr[k].cpu_us, sr[k].gen_cpu_us,
                    rr[k].cpu_us + rr[k].helper_cpu_us, rr[k].gen_cpu_us);
        }
        sl_load_median(sr, rounds, &sat);
        if (hs) sl_load_median(rr, rounds, &rsat);
        gr_serve_get_stats(rep, &c1);
        coalesced = mean_run(&c0, &c1);
        c0 = c1;
        /* The same rounds with the client off the servers' cores: wrk on the last CPU, every
         * thread of this process (both HTTP servers) and redis-server on the others. On the
         * shared cores above wrk takes 40 % of the box's CPU at the replica's rate, and what
         * it takes is the servers' (docs/serving.md, "Where the client runs"). */
        cpu_set_t all, servers;
        if (hs && !v[SB_SKIP_PINNED].b && sched_getaffinity(0, sizeof all, &all) == 0 &&
            sl_split_cpus(&all, &servers, &client_cpu) == 0) {
            if (sl_pin_threads(getpid(), &servers) < 0 || sl_pin_threads(rpid, &servers) < 0) {
                fprintf(stderr, "bench serve: cannot pin the servers' threads; pinned rounds skipped\n");
                client_cpu = -1;
            }
            sl_set_wrk_cpu(client_cpu);
            for (unsigned k = 0; client_cpu >= 0 && k < rounds; k++) {
                fprintf(stderr, "bench serve: pinned round %u/%u: replica, wrk on CPU %d\n", k + 1,
                        rounds, client_cpu);
                sl_run_wrk(hp, s1, wrk_threads, conns, secs, 0, &sr[k]);
                fprintf(stderr, "bench serve: pinned round %u/%u: Redis-backed\n", k + 1, rounds);
                sl_run_wrk(gr_http_port(hs), s1, wrk_threads, conns, secs, rpid, &rr[k]);
                fprintf(stderr, "bench serve: pinned round %u/%u: %.0f / %.0f req/s = %.2fx\n",
                        k + 1, rounds, sr[k].qps, rr[k].qps, sr[k].qps / rr[k].qps);
            }
            sl_set_wrk_cpu(-1);
            sl_pin_threads(getpid(), &all);
            sl_pin_threads(rpid, &all);
            gr_serve_get_stats(rep, &c1);
            pcoalesced = mean_run(&c0, &c1);
            if (client_cpu >= 0) {
                sl_load_median(sr, rounds, &psat);
                sl_load_median(rr, rounds, &prsat);
            }
        }
        if (!v[SB_SAT_ONLY].b) {
            sl_run_wrk(hp, s100, wrk_threads, conns, secs, 0, &sat100);
            run_paced_rounds("replica, paced at half saturation", hp, &b1, sat.qps / 2, secs,
                             pacer_fifo, rounds, &fixed, fixed_p99s);
            if (v[SB_CMP_PACE].b) {
                fprintf(stderr, "bench serve: replica, the same rate from the paced client %s\n",
                        pacer_fifo ? "as an ordinary thread" : "as SCHED_FIFO");
                sl_run_paced(hp, &b1, sat.qps / 2, secs, !pacer_fifo, &fixed_other);
                fprintf(stderr, "bench serve: replica, the same rate from 4 blocking threads\n");
                sl_run_paced_threads(hp, &b1, sat.qps / 2, secs, &fixed_threads);
            }
            if (hs) {
                run_paced_rounds("Redis-backed, paced at half its saturation", gr_http_port(hs), &b1,
                                 rsat.qps / 2, secs, pacer_fifo, rounds, &rfixed, rfixed_p99s);
            }
        }
    }
    double bin_qps = NAN;
    if (!v[SB_SAT_ONLY].b) {
        fprintf(stderr, "bench serve: replica, binary PREDICT, %u connections closed-loop\n", threads);
        bin_qps = run_binary(gr_serve_port(rep), &b1, threads, secs);
    }
    bool hs_used = hs != NULL;
    gr_http_stop(hs);
    while (rs.conns) {
        rconn *c = rs.conns;
        rs.conns = c->next;
        close(c->c.fd);
        free(c->c.buf);
        free(c);
    }
    for (size_t i = 0; i < rs.nws; i++) gr_model_ws_destroy(rs.ws[i]);
    free(rs.ws);
    gr_model_prepared_destroy(rs.prep);
    pthread_mutex_destroy(&rs.mu);
    gr_redis_stop(rpid);
    gr_serve_destroy(rep);
    unlink(s1);
    unlink(s100);

    double f100p50 = NAN, f100p99 = NAN, f1000p50 = NAN, f1000p99 = NAN;
    size_t n100 = 0, n1000 = 0;
    if (!v[SB_SAT_ONLY].b) {
        fprintf(stderr, "bench serve: freshness while training (publish every 100 ms, then 1000 ms)\n");
        run_freshness(100, fsecs, &f100p50, &f100p99, &n100);
        run_freshness(1000, fsecs * 2, &f1000p50, &f1000p99, &n1000);
    }

    printf("bench serve: predict over HTTP (DLRM dim %u, model in memory)\n", DIM);
    print_load("replica, batch 1, saturation (wrk)", &sat);
    print_load("replica, batch 1, half saturation (paced)", &fixed);
    printf("  %-44s late p99 %7.3f ms, reply p99 %7.3f ms, client CPU %.1f us/request\n",
           "  of which: sent", fixed.late_p99_ms, fixed.service_p99_ms, fixed.gen_cpu_us);
    printf("  %-44s waiting for a free connection p99 %.3f ms, the client's own p99 %.3f ms\n",
           "  of which: late", fixed.conn_wait_p99_ms, fixed.own_late_p99_ms);
    printf("  %-44s %s, %s slice; run-queue wait %.1f ms, steal %.1f ms, timer wakeups p99 "
           "%.3f ms late\n", "  the paced client", fixed.fifo ? "SCHED_FIFO" : "SCHED_OTHER",
           fixed.slice ? "a short" : "the default", fixed.runq_ms, fixed.steal_ms,
           fixed.wake_late_p99_ms);
    if (v[SB_CMP_PACE].b) {
        print_load(fixed_other.fifo ? "replica, batch 1, half saturation (SCHED_FIFO)"
                                    : "replica, batch 1, half saturation (ordinary)",
                   &fixed_other);
        printf("  %-44s late p99 %7.3f ms (own %.3f), reply p99 %7.3f ms; run-queue wait %.1f ms, "
               "steal %.1f ms\n", "  of which: sent", fixed_other.late_p99_ms,
               fixed_other.own_late_p99_ms, fixed_other.service_p99_ms, fixed_other.runq_ms,
               fixed_other.steal_ms);
    }
    if (v[SB_CMP_PACE].b) {
        print_load("replica, batch 1, half saturation (4 threads)", &fixed_threads);
        printf("  %-44s client CPU %.1f us/request\n", "", fixed_threads.gen_cpu_us);
    }
    print_load("replica, batch 100, saturation (wrk)", &sat100);
    print_load("Redis-backed, batch 1, saturation (wrk)", &rsat);
    print_load("Redis-backed, batch 1, half its saturation", &rfixed);
    printf("  replica, batch 1, binary PREDICT (%u conns)    %9.0f req/s\n", threads, bin_qps);
    printf("  replica / Redis-backed throughput        %9.2fx\n", sat.qps / rsat.qps);
    printf("  one-example predicts per coalesced run at saturation: %.2f (pinned %.2f)\n",
           coalesced, pcoalesced);
    printf("  CPU per request at saturation: replica %.1f us, Redis-backed %.1f us (server) + %.1f us "
           "(redis-server); wrk %.1f / %.1f us\n", sat.cpu_us, rsat.cpu_us, rsat.helper_cpu_us,
           sat.gen_cpu_us, rsat.gen_cpu_us);
    if (client_cpu >= 0) {
        printf("  wrk on CPU %d, the servers on the others:\n", client_cpu);
        print_load("replica, batch 1, saturation (wrk pinned)", &psat);
        print_load("Redis-backed, batch 1, saturation (pinned)", &prsat);
        printf("  replica / Redis-backed throughput, pinned %9.2fx; CPU per request %.1f / %.1f us\n",
               psat.qps / prsat.qps, psat.cpu_us, prsat.cpu_us + prsat.helper_cpu_us);
    }
    printf("  freshness, publish 100 ms:  p50 %7.1f ms  p99 %7.1f ms (%zu probes)\n", f100p50,
           f100p99, n100);
    printf("  freshness, publish 1000 ms: p50 %7.1f ms  p99 %7.1f ms (%zu probes)\n", f1000p50,
           f1000p99, n1000);
    if (v[SB_JSON].b) {
        printf("{\"bench\":\"serve\",");
        json_num("predict_qps", sat.qps, true);
        json_num("predict_p50_ms", fixed.p50_ms, true);
        json_num("predict_p99_ms", fixed.p99_ms, true);
        json_num("predict_p99_pooled_ms", sl_pct(fixed.lat, fixed.nlat, 0.99), true);
        if (!v[SB_SAT_ONLY].b && have_wrk) {
            json_list("predict_p99_rounds_ms", fixed_p99s[0], rounds);
            json_list("predict_steal_rounds_ms", fixed_p99s[1], rounds);
        }
        json_num("predict_rate", fixed.qps, true);
        json_num("predict_pacer_cpu_us", fixed.gen_cpu_us, true);
        json_num("predict_send_late_p99_ms", fixed.late_p99_ms, true);
        json_num("predict_service_p99_ms", fixed.service_p99_ms, true);
        json_num("redis_predict_send_late_p99_ms", rfixed.late_p99_ms, true);
        json_num("redis_predict_service_p99_ms", rfixed.service_p99_ms, true);
        printf("\"predict_pacer_fifo\":%d,", fixed.fifo ? 1 : 0);
        printf("\"predict_pacer_slice\":%d,", fixed.slice ? 1 : 0);
        json_num("predict_pacer_runq_ms", fixed.runq_ms, true);
        json_num("predict_steal_ms", fixed.steal_ms, true);
        json_num("predict_pacer_wake_late_p99_ms", fixed.wake_late_p99_ms, true);
        json_num("predict_send_late_max_ms", fixed.late_max_ms, true);
        json_num("predict_conn_wait_p99_ms", fixed.conn_wait_p99_ms, true);
        json_num("predict_client_late_p99_ms", fixed.own_late_p99_ms, true);
        json_num("redis_predict_conn_wait_p99_ms", rfixed.conn_wait_p99_ms, true);
        json_num("redis_predict_client_late_p99_ms", rfixed.own_late_p99_ms, true);
        json_num("redis_predict_pacer_runq_ms", rfixed.runq_ms, true);
        json_num("redis_predict_steal_ms", rfixed.steal_ms, true);
        if (v[SB_CMP_PACE].b) {
            json_num("predict_threads_p50_ms", fixed_threads.p50_ms, true);
            json_num("predict_threads_p99_ms", fixed_threads.p99_ms, true);
            json_num("predict_threads_pacer_cpu_us", fixed_threads.gen_cpu_us, true);
            printf("\"predict_other_fifo\":%d,", fixed_other.fifo ? 1 : 0);
            json_num("predict_other_p50_ms", fixed_other.p50_ms, true);
            json_num("predict_other_p99_ms", fixed_other.p99_ms, true);
            json_num("predict_other_send_late_p99_ms", fixed_other.late_p99_ms, true);
            json_num("predict_other_service_p99_ms", fixed_other.service_p99_ms, true);
            json_num("predict_other_pacer_runq_ms", fixed_other.runq_ms, true);
            json_num("predict_other_client_late_p99_ms", fixed_other.own_late_p99_ms, true);
            json_num("predict_other_steal_ms", fixed_other.steal_ms, true);
        }
        json_num("predict_sat_p50_ms", sat.p50_ms, true);
        json_num("predict_sat_p99_ms", sat.p99_ms, true);
        json_num("predict_batch100_qps", sat100.qps, true);
        json_num("predict_batch100_examples_per_sec", sat100.qps * 100, true);
        json_num("predict_batch100_p99_ms", sat100.p99_ms, true);
        json_num("redis_predict_qps", rsat.qps, true);
        json_num("redis_predict_p50_ms", rfixed.p50_ms, true);
        json_num("redis_predict_p99_ms", rfixed.p99_ms, true);
        json_num("redis_predict_p99_pooled_ms", sl_pct(rfixed.lat, rfixed.nlat, 0.99), true);
        if (!v[SB_SAT_ONLY].b && hs_used) {
            json_list("redis_predict_p99_rounds_ms", rfixed_p99s[0], rounds);
            json_list("redis_predict_steal_rounds_ms", rfixed_p99s[1], rounds);
        }
        json_num("redis_predict_sat_p99_ms", rsat.p99_ms, true);
        json_num("qps_vs_redis", sat.qps / rsat.qps, true);
        json_num("predict_binary_qps", bin_qps, true);
        json_num("predict_cpu_us", sat.cpu_us, true);
        json_num("predict_coalesced_batch", coalesced, true);
        json_num("pinned_predict_coalesced_batch", pcoalesced, true);
        json_num("predict_wrk_cpu_us", sat.gen_cpu_us, true);
        json_num("redis_predict_cpu_us", rsat.cpu_us + rsat.helper_cpu_us, true);
        json_num("redis_server_cpu_us", rsat.helper_cpu_us, true);
        json_num("redis_predict_wrk_cpu_us", rsat.gen_cpu_us, true);
        json_num("cpu_vs_redis", (rsat.cpu_us + rsat.helper_cpu_us) / sat.cpu_us, true);
        printf("\"client_cpu\":%d,", client_cpu);
        json_num("pinned_predict_qps", psat.qps, true);
        json_num("pinned_redis_predict_qps", prsat.qps, true);
        json_num("pinned_qps_vs_redis", psat.qps / prsat.qps, true);
        json_num("pinned_predict_cpu_us", psat.cpu_us, true);
        json_num("pinned_redis_predict_cpu_us", prsat.cpu_us + prsat.helper_cpu_us, true);
        json_num("pinned_predict_p99_ms", psat.p99_ms, true);
        json_num("pinned_redis_predict_p99_ms", prsat.p99_ms, true);
        json_num("freshness_p50_ms", f100p50, true);
        json_num("freshness_p99_ms", f100p99, true);
        printf("\"publish_interval_ms\":100,");
        json_num("freshness_1000_p50_ms", f1000p50, true);
        json_num("freshness_1000_p99_ms", f1000p99, true);
        printf("\"connections\":%u,\"threads\":%u,\"slice_us\":%u,\"pacer_slice_us\":%u,"
               "\"wrk_threads\":%u,\"rounds\":%u,\"seconds\":%.0f,\"coalesce\":%d}\n",
               conns, threads, cfg.slice_us, (unsigned)v[SB_PACER_SLICE].i, wrk_threads, rounds, secs,
               cfg.coalesce ? 1 : 0);
    }
    sl_load_free(&fixed);
    sl_load_free(&rfixed);
    sl_load_free(&fixed_other);
    bodies_free(&b1);
    bodies_free(&b100);
    free(ids), free(uniq), free(inv), free(rows), free(params);
    return 0;
}
