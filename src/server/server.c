/* The shard daemon: its lifecycle, its worker pool, and the table of operations that says
 * where each opcode runs. Connection I/O (accept, frame reading, deadlines, reply queues) is
 * conn.c's event loop; it hands every complete request frame to on_frame below, which looks
 * the opcode up in the table of operations (ops.c), checks what every request must pass
 * (known opcode, authentication, flag bits) and runs the row: on the loop, on the pool, or
 * handed to a module that answers later (sync_job.c parks acquires, ckpt.c runs checkpoints on
 * its thread). docs/server.md has the threads and the lock order. */
#include "server/server_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PREAUTH_MAX_BODY 4096           /* before authentication, frames stay tiny */
#define WORKER_BUF_KEEP (64u << 20)      /* a worker keeps a reply buffer up to this size */

typedef struct srv_job {
    struct srv_job *next;
    srv_conn *c;
    gr_proto_header h;
    uint8_t *body;
} srv_job;

/* ---- replies ---- */

/* Runs one request through its row's handler and writes its reply (or error). Used by the
 * workers and, for STATS, by the loop. */
static void run_request(gr_server *s, srv_conn *c, const srv_op_row *row,
                        const gr_proto_header *h, const uint8_t *body, gr_proto_buf *out)
{
    bool fatal = false, stop = false;
    out->len = 0;
    atomic_fetch_add(&s->ops[h->op].count, 1);
    gr_metric *latency = s->latency[h->op];
    uint64_t t0 = latency ? gr_now_ns() : 0;
    srv_req r = {s, h, body, h->body_len, out, 0, &fatal, &stop};
    int rc = row->handle(&r);
    if (rc) {
        out->len = 0; /* drop a half-written reply */
        atomic_fetch_add(&s->ops[h->op].errors, 1);
        if (fatal) {
            atomic_fetch_add(&s->bad_frames, 1);
            GR_LOGW("shard %u: closing %s: %s", s->cfg.shard, srv_conn_peer(c), gr_errmsg());
        }
        srv_conn_write_error(c, h->op, h->id, rc, gr_errmsg(), fatal);
        if (latency) gr_metric_observe(latency, (double)(gr_now_ns() - t0) * 1e-9);
        return;
    }
    /* The reply goes straight into the socket when it fits; only a backlog is queued (and
     * then the buffer itself is handed over, not copied). */
    size_t w = srv_conn_write(c, out, true);
    atomic_fetch_add(&s->ops[h->op].bytes_out, w);
    if (latency) gr_metric_observe(latency, (double)(gr_now_ns() - t0) * 1e-9);
    if (stop) gr_server_request_stop(s);
    /* After the reply: rows it created may have used up the memory handed out ahead. */
    if (h->op == GR_OP_PULL || h->op == GR_OP_PUSH || h->op == GR_OP_PUSH_PULL ||
        h->op == GR_OP_PUSH_STEP)
        srv_grow_kick(s);
}

/* ---- the worker pool ---- */

static void queue_push(gr_server *s, srv_job *j)
{
    pthread_mutex_lock(&s->q_mu);
    j->next = NULL;
    if (s->q_tail) s->q_tail->next = j;
    else s->q_head = j;
    s->q_tail = j;
    s->q_len++;
    pthread_cond_signal(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
}

static void *worker_main(void *arg)
{
    gr_server *s = arg;
    gr_thread_want_slice_us(s->cfg.slice_us, "server: a worker");
    gr_proto_buf out;
    gr_proto_buf_init(&out);
    for (;;) {
        pthread_mutex_lock(&s->q_mu);
        while (!s->q_head && !s->q_closed) pthread_cond_wait(&s->q_cv, &s->q_mu);
        srv_job *j = s->q_head;
        if (j) {
            s->q_head = j->next;
            if (!s->q_head) s->q_tail = NULL;
            s->q_len--;
        }
        pthread_mutex_unlock(&s->q_mu);
        if (!j) break; /* closed and drained */
        run_request(s, j->c, srv_op_row_of(j->h.op), &j->h, j->body, &out);
        free(j->body);
        atomic_fetch_sub(&s->inflight, 1);
        srv_conn_done(j->c, j->h.body_len);
        free(j);
        if (out.cap > WORKER_BUF_KEEP) gr_proto_buf_fini(&out);
    }
    gr_proto_buf_fini(&out);
    return NULL;
}

/* ---- operations run on the loop (short, never blocking; they own body) ---- */

/* conn.c's frame callback (loop thread): the checks every request passes, then the row. */
static void on_frame(void *ctx, srv_conn *c, const gr_proto_header *h, uint8_t *body)
{
    gr_server *s = ctx;
    const srv_op_row *row = srv_op_row_of(h->op);
    bool authed = !s->secret || srv_conn_authed(c);
    if (h->op < GR_PROTO_OP_LIMIT)
        atomic_fetch_add(&s->ops[h->op].bytes_in, GR_PROTO_HEADER_SIZE + (uint64_t)h->body_len);
    char msg[200];
    int rc = GR_OK;
    bool fatal = false;
    if (!row) {
        /* Framing is intact: say so; a peer that has not authenticated is cut off. */
        rc = GR_EPROTO;
        fatal = !authed;
        snprintf(msg, sizeof msg, "unknown opcode %u%s", h->op,
                 fatal ? " before authentication" : "");
        if (fatal) atomic_fetch_add(&s->auth_failures, 1);
    } else if (!authed && !row->preauth) {
        rc = GR_EAUTH;
        fatal = true;
        atomic_fetch_add(&s->auth_failures, 1);
        snprintf(msg, sizeof msg, "authentication required: this server runs with --auth-file; "
                 "send hello and auth first");
    } else if (h->flags & ~row->flags) {
        rc = GR_EPROTO;
        atomic_fetch_add(&s->ops[h->op].errors, 1);
        snprintf(msg, sizeof msg, "header flag bits 0x%x are not defined for %s (must be 0)",
                 h->flags & ~row->flags, gr_proto_op_name(h->op));
    } else if ((rc = srv_fence_check(s, row, h, msg, sizeof msg))) {
        atomic_fetch_add(&s->ops[h->op].errors, 1);
    }
    if (rc) {
        if (fatal) GR_LOGW("shard %u: closing %s: %s", s->cfg.shard, srv_conn_peer(c), msg);
        free(body);
        srv_conn_write_error(c, h->op, h->id, rc, msg, fatal);
        srv_conn_done(c, h->body_len);
        return;
    }
    if (row->take) { /* it answers by itself, now or later */
        atomic_fetch_add(&s->ops[h->op].count, 1);
        row->take(s, c, h, body);
        srv_conn_done(c, h->body_len);
        return;
    }
    if (row->where == SRV_RUN_LOOP || (row->inline_body && h->body_len <= row->inline_body)) {
        gr_proto_buf out;
        gr_proto_buf_init(&out);
        run_request(s, c, row, h, body, &out);
        gr_proto_buf_fini(&out);
        free(body);
        srv_conn_done(c, h->body_len);
        return;
    }
    srv_job *j = malloc(sizeof *j);
    if (!j) {
        free(body);
        srv_conn_write_error(c, h->op, h->id, GR_ENOMEM, "server out of memory for a request",
                             false);
        srv_conn_done(c, h->body_len);
        return;
    }
    j->c = c; /* the frame's reference and budget travel with the job */
    j->h = *h;
    j->body = body;
    atomic_fetch_add(&s->inflight, 1);
    queue_push(s, j);
}

/* conn.c's close callback: a peer that hung up cancels what is parked for it. */
static void on_closed(void *ctx, srv_conn *c)
{
    for (size_t m = 0; m < srv_nmodules; m++)
        if (srv_modules[m]->conn_closed) srv_modules[m]->conn_closed(ctx, c);
}

/* ---- helpers ---- */

void gr_server_config_default(gr_server_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->host = "127.0.0.1";
    cfg->shards = 1;
    gr_proto_limits_default(&cfg->limits);
    cfg->max_connections = 256;
    cfg->max_tables = 1024;
    cfg->max_inflight = 256;
    cfg->max_inflight_bytes = 1ull << 30;
    cfg->max_total_inflight_bytes = 4ull << 30;
    cfg->send_timeout_ms = 30000;
    cfg->auth_timeout_ms = 10000;
    cfg->frame_timeout_ms = 60000;
    cfg->idle_timeout_ms = 900000;
}

static bool is_loopback(const char *host)
{
    if (!strcmp(host, "localhost") || !strcmp(host, "::1")) return true;
    struct in_addr a;
    if (inet_pton(AF_INET, host, &a) == 1) return (ntohl(a.s_addr) >> 24) == 127;
    return false;
}

/* ---- lifecycle ---- */

int gr_server_create(const gr_server_config *cfg, gr_server **out)
{
    *out = NULL;
    gr_server_config c = *cfg;
    gr_proto_limits def;
    gr_proto_limits_default(&def);
    if (!c.limits.max_body) c.limits.max_body = def.max_body;
    if (!c.limits.max_keys) c.limits.max_keys = def.max_keys;
    if (!c.limits.max_tables) c.limits.max_tables = def.max_tables;
    if (!c.limits.max_string) c.limits.max_string = def.max_string;
    if (!c.max_connections) c.max_connections = 256;
    if (!c.max_tables) c.max_tables = 1024;
    if (!c.max_inflight) c.max_inflight = 256;
    if (!c.max_inflight_bytes) c.max_inflight_bytes = 1ull << 30;
    if (!c.send_timeout_ms) c.send_timeout_ms = 30000;
    if (!c.auth_timeout_ms) c.auth_timeout_ms = 10000;
    if (!c.frame_timeout_ms) c.frame_timeout_ms = 60000;
    if (!c.idle_timeout_ms) c.idle_timeout_ms = 900000;
    if (!c.max_total_inflight_bytes) c.max_total_inflight_bytes = 4ull << 30;
    if (!c.host || !*c.host) c.host = "127.0.0.1";
    if (c.shards == 0 || c.shards > GR_SLOTS)
        return gr_seterr(GR_EINVAL, "shards must be 1..%u, got %u", GR_SLOTS, c.shards);
    if (c.shard >= c.shards)
        return gr_seterr(GR_EINVAL, "shard %u is out of range for %u shards", c.shard, c.shards);
    if (c.limits.max_body < 4096)
        return gr_seterr(GR_EINVAL, "max_body must be at least 4096 bytes");
    if (strlen(c.host) >= 256) return gr_seterr(GR_EINVAL, "listen host name is too long");
    if (c.secret && c.secret_len == 0) return gr_seterr(GR_EINVAL, "the auth secret is empty");
    if (!c.secret && !c.insecure && !is_loopback(c.host))
        return gr_seterr(GR_EINVAL,
                         "refusing to listen on %s without authentication: give --auth-file, "
                         "or --insecure to accept unauthenticated clients from the network",
                         c.host);
    if (c.threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        c.threads = n > 0 ? (uint32_t)n : 2;
    }
    if (c.threads > 256) return gr_seterr(GR_EINVAL, "threads must be 1..256, got %u", c.threads);
    if (c.populate_ahead > (1ull << 30))
        return gr_seterr(GR_EINVAL, "populate_ahead must be at most 1 GiB, got %llu bytes",
                         (unsigned long long)c.populate_ahead);
    if (c.slice_us && (c.slice_us < 100 || c.slice_us > 100000))
        return gr_seterr(GR_EINVAL, "slice_us must be 0 (the kernel's default) or 100..100000, "
                         "got %u", c.slice_us);
    gr_server *s = calloc(1, sizeof *s);
    if (!s) return gr_seterr(GR_ENOMEM, "cannot allocate a server");
    s->cfg = c;
    snprintf(s->host, sizeof s->host, "%s", c.host);
    s->cfg.host = s->host;
    s->stop_pipe[0] = s->stop_pipe[1] = -1;
    if (c.secret) {
        s->secret = malloc(c.secret_len);
        if (!s->secret) {
            free(s);
            return gr_seterr(GR_ENOMEM, "cannot copy the secret");
        }
        memcpy(s->secret, c.secret, c.secret_len);
        s->cfg.secret = s->secret;
    }
    for (uint32_t slot = 0; slot < GR_SLOTS; slot++)
        s->owns[slot] = gr_proto_default_shard(slot, c.shards) == c.shard;
    int rc = srv_registry_init(&s->reg, c.max_tables);
    s->reg.huge_rows = c.huge_rows;
    bool reg_ok = rc == GR_OK;
    size_t made = 0;
    while (!rc && made < srv_nmodules && !(rc = srv_modules[made]->create(s))) made++;
    if (rc) {
        while (made > 0) srv_modules[--made]->destroy(s);
        if (reg_ok) srv_registry_fini(&s->reg);
        free(s->secret);
        free(s);
        return rc;
    }
    pthread_mutex_init(&s->q_mu, NULL);
    pthread_cond_init(&s->q_cv, NULL);
    if (pipe2(s->stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        gr_server_destroy(s);
        return gr_seterr(GR_EIO, "cannot create pipes: %s", strerror(errno));
    }
    if ((rc = srv_metrics_init(s))) {
        gr_server_destroy(s);
        return rc;
    }
    s->start_ns = gr_now_ns();
    *out = s;
    return GR_OK;
}

static int start_net(gr_server *s)
{
    srv_net_config nc;
    memset(&nc, 0, sizeof nc);
    nc.limits = s->cfg.limits;
    nc.preauth_max_body = PREAUTH_MAX_BODY;
    nc.auth_required = s->secret != NULL;
    nc.max_connections = s->cfg.max_connections;
    nc.max_inflight = s->cfg.max_inflight;
    nc.max_inflight_bytes = s->cfg.max_inflight_bytes;
    nc.max_total_inflight_bytes = s->cfg.max_total_inflight_bytes;
    nc.send_timeout_ms = s->cfg.send_timeout_ms;
    nc.frame_timeout_ms = s->cfg.frame_timeout_ms;
    nc.auth_timeout_ms = s->cfg.auth_timeout_ms;
    nc.idle_timeout_ms = s->cfg.idle_timeout_ms == UINT32_MAX ? 0 : s->cfg.idle_timeout_ms;
    nc.shard = s->cfg.shard;
    nc.slice_us = s->cfg.slice_us;
    if (s->cfg.local_socket) {
        /* Unique on this machine: the pid, and a counter for the shards of this process. */
        static atomic_uint seq;
        snprintf(s->local_addr, sizeof s->local_addr, "unix:@granary-%ld-%u", (long)getpid(),
                 atomic_fetch_add(&seq, 1));
        nc.unix_name = s->local_addr + strlen("unix:@");
    }
    srv_net_callbacks cb = {s, on_frame, on_closed};
    int rc = srv_net_create(&nc, &cb, s->host, s->cfg.port, &s->net);
    if (rc) return rc;
    s->port = srv_net_port(s->net);
    return GR_OK;
}

int gr_server_start(gr_server *s)
{
    if (s->started) return gr_seterr(GR_EINVAL, "server already started");
    int rc = start_net(s);
    if (rc) return rc;
    s->workers = calloc(s->cfg.threads, sizeof *s->workers);
    if (!s->workers) return gr_seterr(GR_ENOMEM, "cannot allocate worker threads");
    for (uint32_t i = 0; i < s->cfg.threads; i++) {
        if (pthread_create(&s->workers[i], NULL, worker_main, s) != 0) break;
        s->nworkers++;
    }
    if (s->nworkers == 0 || srv_net_start(s->net) != GR_OK) {
        pthread_mutex_lock(&s->q_mu);
        s->q_closed = true;
        pthread_cond_broadcast(&s->q_cv);
        pthread_mutex_unlock(&s->q_mu);
        for (uint32_t i = 0; i < s->nworkers; i++) pthread_join(s->workers[i], NULL);
        s->nworkers = 0;
        return gr_seterr(GR_EINTERNAL, "cannot start server threads");
    }
    s->started = true;
    if (srv_metrics_attach(s) != GR_OK)
        GR_LOGW("shard %u: metrics: %s", s->cfg.shard, gr_errmsg());
    for (size_t m = 0; m < srv_nmodules; m++)
        if (srv_modules[m]->start && srv_modules[m]->start(s) != GR_OK)
            GR_LOGW("shard %u: %s: %s", s->cfg.shard, srv_modules[m]->name, gr_errmsg());
    GR_LOGI("shard %u of %u listening on %s:%u (%u worker threads%s)", s->cfg.shard, s->cfg.shards,
            s->host, s->port, s->nworkers, s->secret ? ", auth required" : "");
    return GR_OK;
}

uint16_t gr_server_port(const gr_server *s) { return s->port; }
const char *gr_server_local_addr(const gr_server *s) { return s->local_addr[0] ? s->local_addr : NULL; }
uint32_t gr_server_shard(const gr_server *s) { return s->cfg.shard; }
uint32_t gr_server_shards(const gr_server *s) { return s->cfg.shards; }
bool gr_server_owns_slot(const gr_server *s, uint32_t slot) { return slot < GR_SLOTS && s->owns[slot]; }

void gr_server_request_stop(gr_server *s)
{
    char b = 1;
    ssize_t w = write(s->stop_pipe[1], &b, 1); /* full pipe = already requested */
    (void)w;
}

int gr_server_wait(gr_server *s, int timeout_ms)
{
    struct pollfd p = {s->stop_pipe[0], POLLIN, 0};
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : gr_now_ns() + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        int left = -1;
        if (timeout_ms >= 0) {
            uint64_t now = gr_now_ns();
            if (now >= deadline) return GR_ETIMEDOUT;
            left = (int)((deadline - now + 999999) / 1000000);
        }
        int r = poll(&p, 1, left);
        if (r > 0) return GR_OK;
        if (r == 0) return GR_ETIMEDOUT;
        if (errno != EINTR) return gr_seterr(GR_EIO, "poll: %s", strerror(errno));
    }
}

int gr_server_stop(gr_server *s)
{
    if (!s->started || s->stopped) return GR_OK;
    atomic_store(&s->stopping, true);
    /* Stop accepting and reading: every frame read so far is already queued, parked or at
     * the checkpoint thread, and will be answered. */
    srv_net_stop_reading(s->net);
    /* Drain: workers finish the queue, then exit. */
    pthread_mutex_lock(&s->q_mu);
    s->q_closed = true;
    pthread_cond_broadcast(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
    for (uint32_t i = 0; i < s->nworkers; i++) pthread_join(s->workers[i], NULL);
    s->nworkers = 0;
    /* Modules answer what they still hold: parked acquires can never be satisfied now; a
     * checkpoint request already running finishes and queued ones are refused. */
    for (size_t m = srv_nmodules; m > 0; m--) srv_modules[m - 1]->stop(s);
    /* Every reply is written (or its connection dropped by the send deadline); close. */
    srv_net_stop(s->net);
    s->stopped = true;
    GR_LOGI("shard %u stopped", s->cfg.shard);
    return GR_OK;
}

void gr_server_destroy(gr_server *s)
{
    if (!s) return;
    srv_metrics_fini(s); /* the collector reads the connection loop's counters */
    gr_server_stop(s);
    srv_net_destroy(s->net);
    free(s->workers);
    for (size_t m = srv_nmodules; m > 0; m--) srv_modules[m - 1]->destroy(s);
    srv_registry_fini(&s->reg);
    for (int i = 0; i < 2; i++)
        if (s->stop_pipe[i] >= 0) close(s->stop_pipe[i]);
    pthread_mutex_destroy(&s->q_mu);
    pthread_cond_destroy(&s->q_cv);
    if (s->secret) OPENSSL_cleanse(s->secret, s->cfg.secret_len);
    free(s->secret);
    free(s);
}

bool gr_server_healthy(const gr_server *s, char *why, size_t whycap)
{
    const char *bad = !s                         ? "no server"
                      : !s->started              ? "not started"
                      : atomic_load(&s->stopping) ? "stopping"
                                                 : NULL;
    if (bad && why && whycap) snprintf(why, whycap, "%s", bad);
    return !bad;
}

/* ---- tables ---- */

int gr_server_create_table(gr_server *s, const gr_table_spec *spec, bool *created)
{
    return srv_registry_add(&s->reg, spec, false, 0, created);
}

int gr_server_foreach_table(gr_server *s, gr_server_table_fn fn, void *ctx)
{
    srv_entry **items;
    size_t n;
    int rc = srv_registry_snapshot(&s->reg, &items, &n);
    if (rc) return rc;
    for (size_t i = 0; i < n && !rc; i++)
        if (!items[i]->dense) rc = fn(ctx, items[i]->name, items[i]->table);
    srv_registry_release(items, n);
    return rc;
}

/* The --config document: {"tables":[spec, ...], "dense":[dense spec, ...], "server":{...}}.
 * "server" holds options for the command line tool and is ignored here; a dense parameter
 * is created only on the shard that owns it, so every shard can load the same file. */
#include <cjson/cJSON.h>

int gr_server_load_config(gr_server *s, const char *json)
{
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return gr_seterr(GR_EINVAL, "config is not a JSON object");
    }
    int rc = GR_OK;
    for (cJSON *it = root->child; it && !rc; it = it->next) {
        if (!strcmp(it->string, "server")) continue;
        bool dense = !strcmp(it->string, "dense");
        if (!dense && strcmp(it->string, "tables")) {
            rc = gr_seterr(GR_EINVAL, "config: unknown field \"%s\" (expected tables, dense, server)",
                           it->string);
            break;
        }
        if (!cJSON_IsArray(it)) {
            rc = gr_seterr(GR_EINVAL, "config: \"%s\" must be an array", it->string);
            break;
        }
        for (cJSON *e = it->child; e && !rc; e = e->next) {
            char *txt = cJSON_PrintUnformatted(e);
            if (!txt) {
                rc = gr_seterr(GR_ENOMEM, "config: cannot format an entry");
                break;
            }
            if (dense) {
                cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
                if (cJSON_IsString(nm) &&
                    !s->owns[gr_proto_dense_slot(nm->valuestring, strlen(nm->valuestring))]) {
                    free(txt);
                    continue; /* another shard's */
                }
                rc = srv_dense_create_json(s, txt, strlen(txt), NULL);
            } else {
                gr_table_spec spec;
                rc = gr_table_spec_from_json(txt, &spec);
                if (!rc) rc = srv_registry_add(&s->reg, &spec, false, 0, NULL);
            }
            free(txt);
        }
    }
    cJSON_Delete(root);
    return rc;
}
