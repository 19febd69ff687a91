/* The shard daemon's threads and sockets: one accept thread, one blocking reader thread per
 * connection (decodes frames, runs the connection-state ops HELLO/AUTH/STATS inline, queues
 * the rest) and a pool of worker threads that run requests and write replies under the
 * connection's write lock. docs/server.md explains why this beats an event loop here and
 * gives the lock order. */
#include "server/server_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define SOCK_BUF_BYTES (4 << 20)
#define PREAUTH_MAX_BODY 4096           /* before authentication, frames stay tiny */
#define LINGER_DRAIN_MS 500              /* after a fatal error, read and discard this long */
#define WORKER_BUF_KEEP (64u << 20)      /* a worker keeps a reply buffer up to this size */

typedef struct srv_conn {
    gr_server *srv;
    int fd;
    atomic_int refs;           /* the reader's + one per queued or running job */
    pthread_mutex_t wlock;     /* serialises writes; guards dead */
    bool dead;                 /* no more writes (error sent, or the peer is gone) */
    pthread_mutex_t mu;        /* guards inflight, inflight_bytes */
    pthread_cond_t cv;
    uint32_t inflight;         /* requests read and not finished */
    uint64_t inflight_bytes;   /* their body bytes */
    bool hello_done, authed;
    uint8_t nonce[GR_PROTO_NONCE_SIZE];
    char peer[64];
    struct srv_conn *prev, *next; /* in srv->conns, under conn_mu */
} srv_conn;

typedef struct srv_job {
    struct srv_job *next;
    srv_conn *c;
    gr_proto_header h;
    uint8_t *body;
} srv_job;

/* Backpressure, taken before a request body is allocated: at most max_inflight requests and
 * max_inflight_bytes of bodies per connection (one bigger frame is let through alone). While
 * a connection is over budget its reader stops reading and TCP pushes back on that client. */
static void conn_acquire(srv_conn *c, uint32_t bytes)
{
    const gr_server_config *cfg = &c->srv->cfg;
    pthread_mutex_lock(&c->mu);
    while (c->inflight > 0 && (c->inflight >= cfg->max_inflight ||
                               c->inflight_bytes + bytes > cfg->max_inflight_bytes))
        pthread_cond_wait(&c->cv, &c->mu);
    c->inflight++;
    c->inflight_bytes += bytes;
    pthread_mutex_unlock(&c->mu);
}

static void conn_release(srv_conn *c, uint32_t bytes)
{
    pthread_mutex_lock(&c->mu);
    c->inflight--;
    c->inflight_bytes -= bytes;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
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
    cfg->send_timeout_ms = 30000;
    cfg->auth_timeout_ms = 10000;
}

static bool is_loopback(const char *host)
{
    if (!strcmp(host, "localhost") || !strcmp(host, "::1")) return true;
    struct in_addr a;
    if (inet_pton(AF_INET, host, &a) == 1) return (ntohl(a.s_addr) >> 24) == 127;
    return false;
}

static void set_timeout(int fd, int opt, uint32_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof tv);
}

static void tune_socket(int fd)
{
    int one = 1, buf = SOCK_BUF_BYTES;
    /* Replies are written whole; Nagle would only add latency to the last segment. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

/* Reads exactly n bytes. Returns n, 0 on EOF before any byte, or -1 (error, timeout, EOF
 * mid-way). */
static ssize_t read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, (char *)buf + got, n - got, 0);
        if (r > 0) {
            got += (size_t)r;
        } else if (r == 0) {
            return got == 0 ? 0 : -1;
        } else if (errno != EINTR) {
            return -1;
        }
    }
    return (ssize_t)n;
}

static int write_full(int fd, const void *buf, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t w = send(fd, (const char *)buf + done, n - done, MSG_NOSIGNAL);
        if (w > 0) {
            done += (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else {
            return -1;
        }
    }
    return 0;
}

static void conn_ref(srv_conn *c) { atomic_fetch_add(&c->refs, 1); }

static void conn_unref(srv_conn *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1) return;
    gr_server *s = c->srv;
    pthread_mutex_lock(&s->conn_mu);
    if (c->prev) c->prev->next = c->next;
    else s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    pthread_mutex_unlock(&s->conn_mu);
    close(c->fd);
    pthread_mutex_destroy(&c->wlock);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

/* Sends a whole frame unless the connection is dead; a failed write kills it. */
static void conn_send(srv_conn *c, const void *buf, size_t n, unsigned op)
{
    pthread_mutex_lock(&c->wlock);
    if (!c->dead) {
        if (write_full(c->fd, buf, n) != 0) {
            c->dead = true;
            /* The peer stopped reading or went away: wake the reader too. */
            shutdown(c->fd, SHUT_RDWR);
        } else if (op < GR_PROTO_OP_LIMIT) {
            atomic_fetch_add(&c->srv->ops[op].bytes_out, n);
        }
    }
    pthread_mutex_unlock(&c->wlock);
}

/* Sends an error reply, then closes our side for writing: the peer reads the error, then EOF. */
static void conn_fail(srv_conn *c, uint16_t op, uint64_t id, int rc, const char *msg)
{
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    int erc = gr_proto_put_error(&b, op, id, rc, msg);
    pthread_mutex_lock(&c->wlock);
    if (!c->dead) {
        if (!erc) (void)write_full(c->fd, b.data, b.len);
        c->dead = true;
        shutdown(c->fd, SHUT_WR);
    }
    pthread_mutex_unlock(&c->wlock);
    gr_proto_buf_fini(&b);
}

static void send_error(srv_conn *c, uint16_t op, uint64_t id, int rc, const char *msg)
{
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    if (!gr_proto_put_error(&b, op, id, rc, msg)) conn_send(c, b.data, b.len, op);
    gr_proto_buf_fini(&b);
}

void srv_conn_get(srv_conn *c) { conn_ref(c); }
void srv_conn_put(srv_conn *c) { conn_unref(c); }
void srv_conn_send(srv_conn *c, const void *frame, size_t n, unsigned op) { conn_send(c, frame, n, op); }
void srv_conn_send_error(srv_conn *c, uint16_t op, uint64_t id, int rc, const char *msg)
{
    send_error(c, op, id, rc, msg);
}

/* After a fatal error, read and discard what the peer still sends for a short while, so
 * closing the socket does not reset it before the peer has read our error reply. */
static void linger_drain(srv_conn *c)
{
    char junk[16384];
    uint64_t deadline = gr_now_ns() + (uint64_t)LINGER_DRAIN_MS * 1000000u;
    set_timeout(c->fd, SO_RCVTIMEO, 50);
    while (gr_now_ns() < deadline && !atomic_load(&c->srv->stopping)) {
        ssize_t r = recv(c->fd, junk, sizeof junk, 0);
        if (r == 0) break;
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) break;
    }
}

/* ---- the work queue ---- */

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

static void job_done(srv_job *j)
{
    srv_conn *c = j->c;
    uint32_t bytes = j->h.body_len;
    free(j->body);
    free(j);
    atomic_fetch_sub(&c->srv->inflight, 1);
    conn_release(c, bytes);
    conn_unref(c);
}

/* Runs one request and writes its reply. Used by workers and, for inline ops, readers. */
static void run_request(gr_server *s, srv_conn *c, const gr_proto_header *h, const uint8_t *body,
                        gr_proto_buf *out)
{
    bool fatal = false, stop = false;
    out->len = 0;
    atomic_fetch_add(&s->ops[h->op].count, 1);
    int rc = srv_dispatch(s, h, body, out, &fatal, &stop);
    if (rc) {
        atomic_fetch_add(&s->ops[h->op].errors, 1);
        if (fatal) {
            atomic_fetch_add(&s->bad_frames, 1);
            GR_LOGW("shard %u: closing %s: %s", s->cfg.shard, c->peer, gr_errmsg());
            conn_fail(c, h->op, h->id, rc, gr_errmsg());
        } else {
            send_error(c, h->op, h->id, rc, gr_errmsg());
        }
        return;
    }
    conn_send(c, out->data, out->len, h->op);
    if (stop) gr_server_request_stop(s);
}

static void *worker_main(void *arg)
{
    gr_server *s = arg;
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
        run_request(s, j->c, &j->h, j->body, &out);
        job_done(j);
        if (out.cap > WORKER_BUF_KEEP) gr_proto_buf_fini(&out);
    }
    gr_proto_buf_fini(&out);
    return NULL;
}

/* ---- connection state ops (run by the reader, in frame order) ---- */

static int do_hello(srv_conn *c, const gr_proto_header *h)
{
    gr_server *s = c->srv;
    gr_proto_hello hello;
    memset(&hello, 0, sizeof hello);
    hello.shard = s->cfg.shard;
    hello.shards = s->cfg.shards;
    hello.auth_required = s->secret ? 1 : 0;
    hello.limits = s->cfg.limits;
    snprintf(hello.server_version, sizeof hello.server_version, "granary %s", GR_VERSION_STRING);
    int rc = gr_proto_random(c->nonce, sizeof c->nonce);
    if (rc) return rc;
    memcpy(hello.nonce, c->nonce, sizeof c->nonce);
    c->hello_done = true;
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    rc = gr_proto_begin(&b, GR_PROTO_RESPONSE, GR_OP_HELLO, 0, 0, h->id);
    if (!rc) rc = gr_proto_put_hello(&b, &hello);
    if (!rc) rc = gr_proto_end(&b, 0);
    if (!rc) conn_send(c, b.data, b.len, GR_OP_HELLO);
    gr_proto_buf_fini(&b);
    return rc;
}

/* Checks the client's proof and answers with the server's own: HMAC(secret, client nonce ||
 * hello nonce), so the client knows the server holds the secret too. Returns 0 when the
 * connection is now authenticated; an error leaves the caller to fail the connection. */
static int do_auth(srv_conn *c, const gr_proto_header *h, const uint8_t *body)
{
    gr_server *s = c->srv;
    uint8_t cnonce[GR_PROTO_NONCE_SIZE], mac[GR_PROTO_MAC_SIZE], want[GR_PROTO_MAC_SIZE];
    int rc = gr_proto_decode_auth(body, h->body_len, cnonce, mac);
    if (rc) return rc;
    if (!s->secret) return gr_seterr(GR_EAUTH, "this server does not use authentication");
    if (!c->hello_done) return gr_seterr(GR_EAUTH, "auth must follow hello (no nonce issued yet)");
    rc = gr_proto_auth_mac(s->secret, s->cfg.secret_len, c->nonce, cnonce, want);
    if (rc) return rc;
    if (CRYPTO_memcmp(want, mac, sizeof mac) != 0)
        return gr_seterr(GR_EAUTH, "authentication failed: the client's proof does not match "
                         "this server's secret");
    uint8_t proof[GR_PROTO_MAC_SIZE];
    rc = gr_proto_auth_mac(s->secret, s->cfg.secret_len, cnonce, c->nonce, proof);
    if (rc) return rc;
    /* Each nonce proves one login only. */
    c->hello_done = false;
    c->authed = true;
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    rc = gr_proto_begin(&b, GR_PROTO_RESPONSE, GR_OP_AUTH, 0, 0, h->id);
    if (!rc) rc = gr_proto_put_bytes(&b, proof, sizeof proof);
    if (!rc) rc = gr_proto_end(&b, 0);
    if (!rc) conn_send(c, b.data, b.len, GR_OP_AUTH);
    gr_proto_buf_fini(&b);
    return rc;
}

static void *reader_main(void *arg)
{
    srv_conn *c = arg;
    gr_server *s = c->srv;
    uint8_t hb[GR_PROTO_HEADER_SIZE];
    gr_proto_buf out;
    gr_proto_buf_init(&out);
    bool fatal = false;
    for (;;) {
        ssize_t r = read_full(c->fd, hb, sizeof hb);
        if (r <= 0) break; /* EOF, timeout, shutdown(SHUT_RD) at stop */
        gr_proto_limits lim = s->cfg.limits;
        if (s->secret && !c->authed) lim.max_body = PREAUTH_MAX_BODY;
        gr_proto_header h;
        memset(&h, 0, sizeof h);
        size_t need = 0;
        int rc = gr_proto_header_decode(hb, sizeof hb, &lim, &h, &need);
        if (rc == GR_OK || rc == GR_EAGAIN) {
            if (h.kind != GR_PROTO_REQUEST)
                rc = gr_seterr(GR_EPROTO, "expected a request frame, got kind %u", h.kind);
            else
                rc = GR_OK;
        }
        if (rc) {
            atomic_fetch_add(&s->bad_frames, 1);
            GR_LOGW("shard %u: closing %s: %s", s->cfg.shard, c->peer, gr_errmsg());
            conn_fail(c, h.op, h.id, rc, gr_errmsg());
            fatal = true;
            break;
        }
        /* The size limit was checked above; the connection's budget is taken here, both before
         * the allocation. Every path below either queues the request (the worker releases the
         * budget) or releases it. */
        conn_acquire(c, h.body_len);
        uint8_t *body = malloc(h.body_len ? h.body_len : 8);
        if (!body) {
            conn_release(c, h.body_len);
            conn_fail(c, h.op, h.id, GR_ENOMEM, "server out of memory for a request body");
            fatal = true;
            break;
        }
        if (h.body_len && read_full(c->fd, body, h.body_len) != (ssize_t)h.body_len) {
            conn_release(c, h.body_len);
            free(body);
            break;
        }
        if (!gr_proto_op_name(h.op) || h.op == GR_OP_HELLO || h.op == GR_OP_AUTH ||
            h.op == GR_OP_STATS || h.op == GR_OP_SYNC_ACQUIRE || srv_ckpt_op(h.op) ||
            (s->secret && !c->authed))
            conn_release(c, h.body_len); /* handled right here, not queued */
        if (h.op < GR_PROTO_OP_LIMIT)
            atomic_fetch_add(&s->ops[h.op].bytes_in, GR_PROTO_HEADER_SIZE + (uint64_t)h.body_len);
        if (!gr_proto_op_name(h.op)) {
            /* Framing is intact: say so and keep serving this client. */
            send_error(c, h.op, h.id, GR_EPROTO, "unknown opcode");
            free(body);
            continue;
        }
        if (h.op == GR_OP_HELLO) {
            atomic_fetch_add(&s->ops[h.op].count, 1);
            rc = do_hello(c, &h);
            free(body);
            if (rc) {
                conn_fail(c, h.op, h.id, rc, gr_errmsg());
                fatal = true;
                break;
            }
            continue;
        }
        if (h.op == GR_OP_AUTH) {
            atomic_fetch_add(&s->ops[h.op].count, 1);
            rc = do_auth(c, &h, body);
            free(body);
            if (rc) {
                atomic_fetch_add(&s->auth_failures, 1);
                atomic_fetch_add(&s->ops[h.op].errors, 1);
                GR_LOGW("shard %u: %s: %s", s->cfg.shard, c->peer, gr_errmsg());
                conn_fail(c, h.op, h.id, rc, gr_errmsg());
                fatal = true;
                break;
            }
            set_timeout(c->fd, SO_RCVTIMEO, 0);
            continue;
        }
        if (s->secret && !c->authed) {
            atomic_fetch_add(&s->auth_failures, 1);
            free(body);
            conn_fail(c, h.op, h.id, GR_EAUTH,
                      "authentication required: this server runs with --auth-file; send hello "
                      "and auth first");
            fatal = true;
            break;
        }
        if (h.op == GR_OP_SYNC_ACQUIRE) {
            /* Inline and never blocking: answered now or parked in sync.c, so waiting workers
             * hold no pool thread (docs/server.md). */
            atomic_fetch_add(&s->ops[h.op].count, 1);
            bool bad = false;
            rc = srv_sync_acquire(s, c, &h, body, &bad);
            free(body);
            if (rc) {
                atomic_fetch_add(&s->ops[h.op].errors, 1);
                if (bad) {
                    atomic_fetch_add(&s->bad_frames, 1);
                    conn_fail(c, h.op, h.id, rc, gr_errmsg());
                    fatal = true;
                    break;
                }
                send_error(c, h.op, h.id, rc, gr_errmsg());
            }
            continue;
        }
        if (srv_ckpt_op(h.op)) {
            /* Checkpoint requests wait for the disk: the shard's checkpoint thread runs them
             * (src/server/ckpt.c) and answers later, holding a reference on c. */
            atomic_fetch_add(&s->ops[h.op].count, 1);
            rc = srv_ckpt_submit(s, c, &h, body);
            if (rc) { /* the body does not decode */
                atomic_fetch_add(&s->ops[h.op].errors, 1);
                atomic_fetch_add(&s->bad_frames, 1);
                conn_fail(c, h.op, h.id, rc, gr_errmsg());
                fatal = true;
                break;
            }
            continue;
        }
        if (h.op == GR_OP_STATS) {
            /* Inline, so stats answer even while workers are busy (and show the queue). */
            run_request(s, c, &h, body, &out);
            free(body);
            continue;
        }
        srv_job *j = malloc(sizeof *j);
        if (!j) {
            free(body);
            conn_release(c, h.body_len);
            send_error(c, h.op, h.id, GR_ENOMEM, "server out of memory for a request");
            continue;
        }
        j->c = c;
        j->h = h;
        j->body = body;
        conn_ref(c);
        atomic_fetch_add(&s->inflight, 1);
        queue_push(s, j);
    }
    if (fatal) linger_drain(c);
    gr_proto_buf_fini(&out);
    /* Drop our reference before announcing the exit: once nconns reaches 0 a stop may free
     * the server, and conn_unref may still need it (the connection list). */
    conn_unref(c);
    pthread_mutex_lock(&s->conn_mu);
    if (s->nexited == s->capexited) {
        size_t cap = s->capexited ? s->capexited * 2 : 16;
        pthread_t *e = realloc(s->exited, cap * sizeof *e);
        if (e) {
            s->exited = e;
            s->capexited = cap;
        }
    }
    if (s->nexited < s->capexited) s->exited[s->nexited++] = pthread_self();
    else pthread_detach(pthread_self()); /* out of memory: let it clean up alone */
    s->nconns--;
    pthread_cond_broadcast(&s->conn_cv);
    pthread_mutex_unlock(&s->conn_mu);
    return NULL;
}

/* ---- accept ---- */

static void reject_conn(gr_server *s, int fd, int rc, const char *msg)
{
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    if (!gr_proto_put_error(&b, 0, 0, rc, msg)) (void)write_full(fd, b.data, b.len);
    gr_proto_buf_fini(&b);
    atomic_fetch_add(&s->conns_rejected, 1);
    shutdown(fd, SHUT_WR);
    close(fd);
}

/* Joins the reader threads that have exited. */
static void reap_readers(gr_server *s)
{
    pthread_mutex_lock(&s->conn_mu);
    size_t n = s->nexited;
    pthread_t *t = n ? malloc(n * sizeof *t) : NULL;
    if (t) {
        memcpy(t, s->exited, n * sizeof *t);
        s->nexited = 0;
    }
    pthread_mutex_unlock(&s->conn_mu);
    for (size_t i = 0; t && i < n; i++) pthread_join(t[i], NULL);
    free(t);
}

static void *accept_main(void *arg)
{
    gr_server *s = arg;
    for (;;) {
        reap_readers(s);
        struct pollfd p[2] = {{s->listen_fd, POLLIN, 0}, {s->accept_pipe[0], POLLIN, 0}};
        int pr = poll(p, 2, -1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0 || (p[1].revents & POLLIN) || atomic_load(&s->stopping)) break;
        if (!(p[0].revents & POLLIN)) continue;
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) gr_sleep_ms(10); /* do not spin */
            continue;
        }
        char peer[64] = "?";
        char hostbuf[48], portbuf[8];
        if (getnameinfo((struct sockaddr *)&sa, sl, hostbuf, sizeof hostbuf, portbuf,
                        sizeof portbuf, NI_NUMERICHOST | NI_NUMERICSERV) == 0)
            snprintf(peer, sizeof peer, "%s:%s", hostbuf, portbuf);
        pthread_mutex_lock(&s->conn_mu);
        bool full = s->nconns >= s->cfg.max_connections;
        pthread_mutex_unlock(&s->conn_mu);
        if (full) {
            char msg[128];
            snprintf(msg, sizeof msg, "shard %u has %u connections (the limit); try later",
                     s->cfg.shard, s->cfg.max_connections);
            GR_LOGW("shard %u: refusing %s: %s", s->cfg.shard, peer, msg);
            reject_conn(s, fd, GR_EBUSY, msg);
            continue;
        }
        tune_socket(fd);
        set_timeout(fd, SO_SNDTIMEO, s->cfg.send_timeout_ms);
        if (s->secret) set_timeout(fd, SO_RCVTIMEO, s->cfg.auth_timeout_ms);
        srv_conn *c = calloc(1, sizeof *c);
        if (!c) {
            reject_conn(s, fd, GR_ENOMEM, "server out of memory");
            continue;
        }
        c->srv = s;
        c->fd = fd;
        atomic_init(&c->refs, 1);
        pthread_mutex_init(&c->wlock, NULL);
        pthread_mutex_init(&c->mu, NULL);
        pthread_cond_init(&c->cv, NULL);
        snprintf(c->peer, sizeof c->peer, "%s", peer);
        pthread_mutex_lock(&s->conn_mu);
        c->next = s->conns;
        if (s->conns) s->conns->prev = c;
        s->conns = c;
        s->nconns++;
        pthread_mutex_unlock(&s->conn_mu);
        atomic_fetch_add(&s->conns_total, 1);
        pthread_t th;
        if (pthread_create(&th, NULL, reader_main, c) != 0) {
            pthread_mutex_lock(&s->conn_mu);
            s->nconns--;
            pthread_mutex_unlock(&s->conn_mu);
            conn_fail(c, 0, 0, GR_EBUSY, "server cannot start a connection thread");
            conn_unref(c);
        }
        GR_LOGD("shard %u: connection from %s", s->cfg.shard, peer);
    }
    return NULL;
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
    gr_server *s = calloc(1, sizeof *s);
    if (!s) return gr_seterr(GR_ENOMEM, "cannot allocate a server");
    s->cfg = c;
    snprintf(s->host, sizeof s->host, "%s", c.host);
    s->cfg.host = s->host;
    s->listen_fd = -1;
    s->stop_pipe[0] = s->stop_pipe[1] = s->accept_pipe[0] = s->accept_pipe[1] = -1;
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
    if (!rc && (rc = srv_sync_create(s))) srv_registry_fini(&s->reg);
    if (!rc && (rc = srv_ckpt_create(s))) {
        srv_sync_destroy(s);
        srv_registry_fini(&s->reg);
    }
    if (rc) {
        free(s->secret);
        free(s);
        return rc;
    }
    pthread_mutex_init(&s->conn_mu, NULL);
    pthread_cond_init(&s->conn_cv, NULL);
    pthread_mutex_init(&s->q_mu, NULL);
    pthread_cond_init(&s->q_cv, NULL);
    if (pipe2(s->stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0 ||
        pipe2(s->accept_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        gr_server_destroy(s);
        return gr_seterr(GR_EIO, "cannot create pipes: %s", strerror(errno));
    }
    s->start_ns = gr_now_ns();
    *out = s;
    return GR_OK;
}

static int listen_on(gr_server *s)
{
    char port[8];
    snprintf(port, sizeof port, "%u", s->cfg.port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gai = getaddrinfo(s->host, port, &hints, &res);
    if (gai != 0)
        return gr_seterr(GR_EINVAL, "cannot resolve listen address %s: %s", s->host,
                         gai_strerror(gai));
    int err = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 128) == 0) {
            struct sockaddr_storage sa;
            socklen_t sl = sizeof sa;
            getsockname(fd, (struct sockaddr *)&sa, &sl);
            s->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                     : ((struct sockaddr_in *)&sa)->sin_port);
            s->listen_fd = fd;
            freeaddrinfo(res);
            return GR_OK;
        }
        err = errno;
        close(fd);
    }
    freeaddrinfo(res);
    return gr_seterr(GR_EIO, "cannot listen on %s:%u: %s", s->host, s->cfg.port, strerror(err));
}

int gr_server_start(gr_server *s)
{
    if (s->started) return gr_seterr(GR_EINVAL, "server already started");
    int rc = listen_on(s);
    if (rc) return rc;
    s->workers = calloc(s->cfg.threads, sizeof *s->workers);
    if (!s->workers) return gr_seterr(GR_ENOMEM, "cannot allocate worker threads");
    for (uint32_t i = 0; i < s->cfg.threads; i++) {
        if (pthread_create(&s->workers[i], NULL, worker_main, s) != 0) break;
        s->nworkers++;
    }
    if (s->nworkers == 0 || pthread_create(&s->acceptor, NULL, accept_main, s) != 0) {
        pthread_mutex_lock(&s->q_mu);
        s->q_closed = true;
        pthread_cond_broadcast(&s->q_cv);
        pthread_mutex_unlock(&s->q_mu);
        for (uint32_t i = 0; i < s->nworkers; i++) pthread_join(s->workers[i], NULL);
        s->nworkers = 0;
        return gr_seterr(GR_EINTERNAL, "cannot start server threads");
    }
    s->started = true;
    if (srv_sync_start(s) != GR_OK) GR_LOGW("shard %u: %s (acquire timeouts will not fire)", s->cfg.shard, gr_errmsg());
    GR_LOGI("shard %u of %u listening on %s:%u (%u worker threads%s)", s->cfg.shard, s->cfg.shards,
            s->host, s->port, s->nworkers, s->secret ? ", auth required" : "");
    return GR_OK;
}

uint16_t gr_server_port(const gr_server *s) { return s->port; }
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
    char b = 1;
    ssize_t w = write(s->accept_pipe[1], &b, 1);
    (void)w;
    pthread_join(s->acceptor, NULL);
    close(s->listen_fd);
    s->listen_fd = -1;
    /* Stop reading new requests: blocked readers see EOF and exit; every frame read so far is
     * already queued and will be answered. */
    pthread_mutex_lock(&s->conn_mu);
    for (srv_conn *c = s->conns; c; c = c->next) shutdown(c->fd, SHUT_RD);
    while (s->nconns > 0) pthread_cond_wait(&s->conn_cv, &s->conn_mu);
    pthread_mutex_unlock(&s->conn_mu);
    reap_readers(s);
    /* Drain: workers finish the queue, then exit. */
    pthread_mutex_lock(&s->q_mu);
    s->q_closed = true;
    pthread_cond_broadcast(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
    for (uint32_t i = 0; i < s->nworkers; i++) pthread_join(s->workers[i], NULL);
    s->nworkers = 0;
    /* Acquires still parked now can never be satisfied: answer them. */
    srv_sync_stop(s);
    /* A checkpoint request already running finishes; queued ones are refused. */
    srv_ckpt_stop(s);
    s->stopped = true;
    GR_LOGI("shard %u stopped", s->cfg.shard);
    return GR_OK;
}

void gr_server_destroy(gr_server *s)
{
    if (!s) return;
    gr_server_stop(s);
    free(s->workers);
    free(s->exited);
    srv_ckpt_destroy(s);
    srv_sync_destroy(s);
    srv_registry_fini(&s->reg);
    for (int i = 0; i < 2; i++) {
        if (s->stop_pipe[i] >= 0) close(s->stop_pipe[i]);
        if (s->accept_pipe[i] >= 0) close(s->accept_pipe[i]);
    }
    if (s->listen_fd >= 0) close(s->listen_fd);
    pthread_mutex_destroy(&s->conn_mu);
    pthread_cond_destroy(&s->conn_cv);
    pthread_mutex_destroy(&s->q_mu);
    pthread_cond_destroy(&s->q_cv);
    if (s->secret) OPENSSL_cleanse(s->secret, s->cfg.secret_len);
    free(s->secret);
    free(s);
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
