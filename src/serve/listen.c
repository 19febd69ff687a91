/* The replica's binary protocol: the shards' frame format (proto.h) on a port of its own, for
 * callers that want less overhead than HTTP. It answers HELLO (shard 0 of 1, no auth), PREDICT
 * and LOOKUP; any other opcode gets an error reply and the connection stays open; a frame that
 * breaks the framing closes its connection only. One thread per connection (at most
 * MAX_CONNS): a replica has few, long-lived callers, and every request is short. */
#include "serve/serve_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_CONNS 256

struct sv_listen {
    gr_serve *s;
    int fd;
    uint16_t port;
    pthread_t accept_thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stopping;
    int nconns;
    int conn_fds[MAX_CONNS];
    gr_proto_limits lim;
};

typedef struct conn_arg {
    sv_listen *l;
    int fd;
    int slot;
} conn_arg;

static int write_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n)
{
    uint8_t *b = p;
    while (n) {
        ssize_t k = recv(fd, b, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static int send_error(int fd, uint16_t op, uint64_t id, int rc, const char *msg)
{
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    int e = gr_proto_begin(&b, GR_PROTO_RESPONSE, op, 0, rc, id);
    if (!e) e = gr_proto_put_str(&b, msg, strnlen(msg, 4000));
    if (!e) e = gr_proto_end(&b, 0);
    int w = e ? -1 : write_all(fd, b.data, b.len);
    gr_proto_buf_fini(&b);
    return w;
}

/* Builds the reply to one request into out; 0, or an error for send_error. */
static int answer(sv_listen *l, const gr_proto_header *h, const uint8_t *body, gr_proto_buf *out)
{
    gr_serve *s = l->s;
    int rc;
    if (h->op == GR_OP_HELLO) {
        gr_proto_hello hello = {.shard = 0, .shards = 1, .limits = l->lim};
        snprintf(hello.server_version, sizeof hello.server_version, "granary-serve");
        rc = gr_proto_begin(out, GR_PROTO_RESPONSE, h->op, 0, 0, h->id);
        if (!rc) rc = gr_proto_put_hello(out, &hello);
        return rc ? rc : gr_proto_end(out, 0);
    }
    if (h->op == GR_OP_PREDICT) {
        gr_proto_predict q;
        if ((rc = gr_proto_decode_predict(body, h->body_len, &l->lim, &q))) return rc;
        if (q.ndense != GR_CRITEO_DENSE || q.nsparse != GR_CRITEO_SPARSE)
            return gr_seterr(GR_EINVAL, "predict carries %u dense and %u sparse features per "
                             "example, the model takes %d and %d", q.ndense, q.nsparse,
                             GR_CRITEO_DENSE, GR_CRITEO_SPARSE);
        float *probs = malloc(q.n * sizeof *probs);
        if (!probs) return gr_seterr(GR_ENOMEM, "out of memory for %u scores", q.n);
        uint64_t ver = 0;
        rc = gr_serve_predict(s, q.n, q.dense, q.ids, probs, &ver);
        if (!rc) rc = gr_proto_begin(out, GR_PROTO_RESPONSE, h->op, 0, 0, h->id);
        if (!rc) rc = gr_proto_put_predict_reply(out, ver, probs, q.n);
        if (!rc) rc = gr_proto_end(out, 0);
        free(probs);
        return rc;
    }
    if (h->op == GR_OP_LOOKUP) {
        gr_proto_batch bt;
        if ((rc = gr_proto_decode_batch(body, h->body_len, GR_PROTO_KEYS, &l->lim, &bt))) return rc;
        for (uint32_t i = 0; i < bt.ntables && !rc; i++) {
            sv_table *t = sv_find_table(s, bt.sections[i].table);
            if (!t) rc = gr_seterr(GR_ENOENT, "the replica has no table with id %u", bt.sections[i].table);
            else if (t->dim != bt.sections[i].dim)
                rc = gr_seterr(GR_EDIM, "table '%s' has dim %u, lookup carried dim %u", t->name,
                               t->dim, bt.sections[i].dim);
        }
        if (!rc) rc = gr_proto_begin(out, GR_PROTO_RESPONSE, h->op, 0, 0, h->id);
        if (!rc) rc = gr_proto_put_batch_head(out, bt.ntables);
        for (uint32_t i = 0; i < bt.ntables && !rc; i++) {
            const gr_proto_section *sec = &bt.sections[i];
            float *vals;
            rc = gr_proto_put_section(out, GR_PROTO_VALUES, sec->table, sec->dim, sec->n, NULL, &vals);
            if (!rc) rc = gr_serve_lookup(s, sec->table, sec->keys, sec->n, vals, NULL);
        }
        if (!rc) rc = gr_proto_end(out, 0);
        gr_proto_batch_fini(&bt);
        return rc;
    }
    const char *name = gr_proto_op_name(h->op);
    return gr_seterr(GR_EPROTO, "a serving replica does not answer %s (opcode %u): it answers "
                     "hello, predict and lookup", name ? name : "this opcode", h->op);
}

static void *conn_main(void *arg)
{
    conn_arg *a = arg;
    sv_listen *l = a->l;
    int fd = a->fd;
    /* A connection's thread answers its requests: the same short slice as HTTP handlers. */
    gr_thread_want_slice_us(l->s->cfg.slice_us, "serve: a connection's thread");
    uint8_t hb[GR_PROTO_HEADER_SIZE];
    gr_proto_buf out;
    gr_proto_buf_init(&out);
    for (;;) {
        if (read_all(fd, hb, sizeof hb)) break;
        gr_proto_header h = {0};
        size_t need = 0;
        int rc = gr_proto_header_decode(hb, sizeof hb, &l->lim, &h, &need);
        if (rc != GR_OK && rc != GR_EAGAIN) { /* bad framing: say why, then close */
            send_error(fd, h.op, h.id, rc, gr_errmsg());
            break;
        }
        uint8_t *body = malloc(h.body_len ? h.body_len : 1);
        if (!body || read_all(fd, body, h.body_len)) {
            free(body);
            break;
        }
        out.len = 0;
        rc = h.kind == GR_PROTO_REQUEST ? answer(l, &h, body, &out)
                                        : gr_seterr(GR_EPROTO, "expected a request frame");
        free(body);
        int w = rc ? send_error(fd, h.op, h.id, rc, gr_errmsg()) : write_all(fd, out.data, out.len);
        if (w) break;
    }
    gr_proto_buf_fini(&out);
    /* Closed under mu so that the stopper never shuts down a reused descriptor. */
    pthread_mutex_lock(&l->mu);
    close(fd);
    l->conn_fds[a->slot] = -1;
    l->nconns--;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    free(a);
    return NULL;
}

static void *accept_main(void *arg)
{
    sv_listen *l = arg;
    for (;;) {
        struct pollfd pf = {l->fd, POLLIN, 0};
        int pr = poll(&pf, 1, 100);
        pthread_mutex_lock(&l->mu);
        bool stop = l->stopping;
        pthread_mutex_unlock(&l->mu);
        if (stop) break;
        if (pr <= 0) continue;
        int fd = accept(l->fd, NULL, NULL);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        pthread_mutex_lock(&l->mu);
        int slot = -1;
        for (int i = 0; i < MAX_CONNS && slot < 0; i++)
            if (l->conn_fds[i] < 0) slot = i;
        conn_arg *a = slot >= 0 ? malloc(sizeof *a) : NULL;
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (a) {
            *a = (conn_arg){l, fd, slot};
            l->conn_fds[slot] = fd;
            l->nconns++;
            if (pthread_create(&th, &at, conn_main, a)) {
                l->conn_fds[slot] = -1;
                l->nconns--;
                free(a);
                a = NULL;
            }
        }
        pthread_attr_destroy(&at);
        pthread_mutex_unlock(&l->mu);
        if (!a) {
            send_error(fd, GR_OP_HELLO, 0, GR_EBUSY, "the replica has too many connections");
            close(fd);
        }
    }
    return NULL;
}

static int bind_addr(const char *addr, int *fd_out, uint16_t *port_out)
{
    char host[256];
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host)
        return gr_seterr(GR_EINVAL, "listen address '%s' is not HOST:PORT", addr);
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &ai) || !ai)
        return gr_seterr(GR_EINVAL, "listen address '%s' does not resolve", addr);
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 128)) {
        int e = errno;
        if (fd >= 0) close(fd);
        freeaddrinfo(ai);
        return gr_seterr(GR_EIO, "cannot listen on %s: %s", addr, strerror(e));
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return GR_OK;
}

int sv_listen_start(gr_serve *s, const char *addr, sv_listen **out)
{
    *out = NULL;
    sv_listen *l = calloc(1, sizeof *l);
    if (!l) return gr_seterr(GR_ENOMEM, "out of memory for the listener");
    l->s = s;
    gr_proto_limits_default(&l->lim);
    l->lim.max_body = (uint32_t)s->cfg.max_body;
    for (int i = 0; i < MAX_CONNS; i++) l->conn_fds[i] = -1;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    int rc = bind_addr(addr, &l->fd, &l->port);
    if (!rc && pthread_create(&l->accept_thread, NULL, accept_main, l)) {
        close(l->fd);
        rc = gr_seterr(GR_EINTERNAL, "cannot start the listener thread");
    }
    if (rc) {
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
        free(l);
        return rc;
    }
    *out = l;
    return GR_OK;
}

uint16_t sv_listen_port(const sv_listen *l) { return l->port; }

void sv_listen_stop(sv_listen *l)
{
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->stopping = true;
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->accept_thread, NULL);
    close(l->fd);
    /* Wake every connection thread (shutdown makes its blocking read return) and wait. */
    pthread_mutex_lock(&l->mu);
    for (int i = 0; i < MAX_CONNS; i++)
        if (l->conn_fds[i] >= 0) shutdown(l->conn_fds[i], SHUT_RDWR);
    while (l->nconns) pthread_cond_wait(&l->cv, &l->mu);
    pthread_mutex_unlock(&l->mu);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
}
