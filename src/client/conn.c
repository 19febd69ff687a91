/* Client connections: one TCP connection per shard with its own reader thread, which
 * completes requests as replies arrive (in any order, matched by request id) through each
 * request's own handler and completion, so nothing here calls the layers above. Connecting
 * runs the hello/auth handshake synchronously; a lost connection fails its pending requests
 * and is re-established with exponential backoff on the next send. */
#include "client/conn.h"

#include <ctype.h>
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
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define SOCK_BUF_BYTES (4 << 20)

#define UNIX_PREFIX "unix:@"
/* An abstract unix name fits sun_path after its leading NUL. */
#define UNIX_NAME_MAX (sizeof(((struct sockaddr_un *)0)->sun_path) - 1)

static bool is_unix_addr(const char *addr) { return !strncmp(addr, "unix:", 5); }

/* Splits "host:port" or "[v6]:port" into the connection's addr, host and port; "unix:@NAME"
 * (an abstract AF_UNIX address, a shard on this machine) keeps NAME as the host. */
static int parse_addr(const char *addr, char *out, size_t outcap, char *host, size_t hostcap,
                      char *port_out, size_t portcap)
{
    size_t n = strlen(addr);
    if (n == 0 || n >= outcap) return gr_seterr(GR_EINVAL, "bad server address '%s'", addr);
    if (is_unix_addr(addr)) {
        /* Only the prefix is read before it is known to be there ("unix:" alone is short). */
        bool prefixed = !strncmp(addr, UNIX_PREFIX, strlen(UNIX_PREFIX));
        const char *name = prefixed ? addr + strlen(UNIX_PREFIX) : "";
        size_t len = strlen(name);
        if (!prefixed || len == 0 || len > UNIX_NAME_MAX || len >= hostcap)
            return gr_seterr(GR_EINVAL,
                             "bad server address '%s' (want unix:@NAME, an abstract socket name "
                             "of 1..%zu bytes)",
                             addr, (size_t)UNIX_NAME_MAX);
        snprintf(host, hostcap, "%s", name);
        snprintf(port_out, portcap, "0");
        snprintf(out, outcap, "%s", addr);
        return GR_OK;
    }
    const char *colon;
    if (addr[0] == '[') { /* [v6]:port */
        const char *close = strchr(addr, ']');
        if (!close || close[1] != ':')
            return gr_seterr(GR_EINVAL, "bad server address '%s' (want [host]:port)", addr);
        if ((size_t)(close - addr - 1) >= hostcap)
            return gr_seterr(GR_EINVAL, "bad server address '%s'", addr);
        snprintf(host, hostcap, "%.*s", (int)(close - addr - 1), addr + 1);
        colon = close + 1;
    } else {
        colon = strrchr(addr, ':');
        if (!colon || colon == addr)
            return gr_seterr(GR_EINVAL, "bad server address '%s' (want host:port)", addr);
        if ((size_t)(colon - addr) >= hostcap)
            return gr_seterr(GR_EINVAL, "bad server address '%s'", addr);
        snprintf(host, hostcap, "%.*s", (int)(colon - addr), addr);
    }
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port <= 0 || port > 65535)
        return gr_seterr(GR_EINVAL, "bad port in server address '%s'", addr);
    snprintf(port_out, portcap, "%ld", port);
    snprintf(out, outcap, "%s", addr);
    return GR_OK;
}

int cl_conn_init(cl_conn *k, cl_link *link, uint32_t shard, const char *addr)
{
    memset(k, 0, sizeof *k);
    k->link = link;
    k->shard = shard;
    k->fd = -1;
    int rc = parse_addr(addr, k->addr, sizeof k->addr, k->host, sizeof k->host, k->port,
                        sizeof k->port);
    if (rc) return rc;
    pthread_mutex_init(&k->connect_mu, NULL);
    pthread_mutex_init(&k->wlock, NULL);
    pthread_mutex_init(&k->mu, NULL);
    return GR_OK;
}

int cl_conn_set_addr(cl_conn *k, const char *addr)
{
    char a[sizeof k->addr], h[sizeof k->host], p[sizeof k->port];
    int rc = parse_addr(addr, a, sizeof a, h, sizeof h, p, sizeof p);
    if (rc) return rc;
    /* Lock order as everywhere: connect_mu, wlock, mu. The reader sees the shutdown, fails
     * whatever is pending and exits; the next cl_conn_ensure connects to the new address. */
    pthread_mutex_lock(&k->connect_mu);
    pthread_mutex_lock(&k->wlock);
    pthread_mutex_lock(&k->mu);
    memcpy(k->addr, a, sizeof a);
    memcpy(k->host, h, sizeof h);
    memcpy(k->port, p, sizeof p);
    k->broken = true;
    if (k->fd >= 0) shutdown(k->fd, SHUT_RDWR);
    pthread_mutex_unlock(&k->mu);
    pthread_mutex_unlock(&k->wlock);
    pthread_mutex_unlock(&k->connect_mu);
    return GR_OK;
}

static void set_timeout(int fd, int opt, uint64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof tv);
}

void cl_conn_fini(cl_conn *k)
{
    pthread_mutex_lock(&k->mu);
    if (k->fd >= 0) shutdown(k->fd, SHUT_RDWR);
    pthread_mutex_unlock(&k->mu);
    if (k->reader_live) pthread_join(k->reader, NULL);
    if (k->fd >= 0) close(k->fd);
    k->fd = -1;
    free(k->rbuf);
    free(k->sbuf);
    pthread_mutex_destroy(&k->connect_mu);
    pthread_mutex_destroy(&k->wlock);
    pthread_mutex_destroy(&k->mu);
}

static int write_full(int fd, const void *buf, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t w = send(fd, (const char *)buf + done, n - done, MSG_NOSIGNAL);
        if (w > 0) done += (size_t)w;
        else if (w < 0 && errno == EINTR) continue;
        else return -1;
    }
    return 0;
}

/* Returns n, 0 on a clean EOF before any byte, -1 on error or timeout. */
static ssize_t read_full(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, (char *)buf + got, n - got, 0);
        if (r > 0) got += (size_t)r;
        else if (r == 0) return got ? -1 : 0;
        else if (errno != EINTR) return -1;
    }
    return (ssize_t)n;
}

/* ---- connect and handshake ---- */

/* Connects to an abstract AF_UNIX name. A local connect completes or fails at once; without
 * blocking, a full listen backlog is EAGAIN (retried with backoff) instead of a wait with no
 * deadline. */
static int connect_unix(cl_conn *k, int *out)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t len = strlen(k->host);
    memcpy(sa.sun_path + 1, k->host, len); /* sun_path[0] = 0: abstract */
    socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return gr_seterr(GR_ECONN, "cannot create a unix socket: %s", strerror(errno));
    int rc;
    do rc = connect(fd, (struct sockaddr *)&sa, sl);
    while (rc != 0 && errno == EINTR);
    if (rc != 0) {
        char why[128];
        snprintf(why, sizeof why, "%s", strerror(errno));
        why[0] = (char)tolower((unsigned char)why[0]);
        int err = errno;
        close(fd);
        return gr_seterr(err == EAGAIN ? GR_EBUSY : GR_ECONN, "%s", why);
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    /* The sender's buffer bounds a unix stream (the receiver has none of its own). */
    int buf = SOCK_BUF_BYTES;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    *out = fd;
    return GR_OK;
}

static int connect_fd(cl_conn *k, uint64_t deadline, int *out)
{
    if (is_unix_addr(k->addr)) return connect_unix(k, out);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int gai = getaddrinfo(k->host, k->port, &hints, &res);
    if (gai != 0) return gr_seterr(GR_ECONN, "cannot resolve %s: %s", k->host, gai_strerror(gai));
    int err = ECONNREFUSED;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            uint64_t now = gr_now_ns();
            int left = now >= deadline ? 0 : (int)((deadline - now) / 1000000) + 1;
            struct pollfd p = {fd, POLLOUT, 0};
            int pr = poll(&p, 1, left);
            if (pr == 1) {
                int soerr = 0;
                socklen_t sl = sizeof soerr;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
                rc = soerr ? -1 : 0;
                errno = soerr;
            } else {
                rc = -1;
                errno = ETIMEDOUT;
            }
        }
        if (rc == 0) {
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
            int one = 1, buf = SOCK_BUF_BYTES;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
            gr_sock_unpaced_loopback(fd); /* core.h: no pacing on loopback */
            freeaddrinfo(res);
            *out = fd;
            return GR_OK;
        }
        err = errno;
        close(fd);
    }
    freeaddrinfo(res);
    /* "connection refused", as the rest of the message is lower case. */
    char why[128];
    snprintf(why, sizeof why, "%s", strerror(err));
    why[0] = (char)tolower((unsigned char)why[0]);
    return gr_seterr(err == ETIMEDOUT ? GR_ETIMEDOUT : GR_ECONN, "%s", why);
}

/* The error for a peer whose first reply bytes are not a granary frame (a web server, a
 * database, a port mixed up), quoting the start of its reply's first line. */
static int not_granary(const uint8_t *b, size_t n)
{
    char first[48];
    size_t m = 0;
    for (size_t i = 0; i < n && m + 1 < sizeof first && b[i] != '\r' && b[i] != '\n'; i++)
        first[m++] = b[i] >= 32 && b[i] < 127 ? (char)b[i] : '?';
    first[m] = '\0';
    bool http = n >= 5 && !memcmp(b, "HTTP/", 5);
    return gr_seterr(GR_EPROTO, "not a granary server: it answered %s\"%s\"%s",
                     http ? "in HTTP: " : "", first, http ? " (is this the HTTP port?)" : "");
}

/* Reads one whole frame synchronously (handshake only). *body is malloc'd. */
static int read_frame(cl_conn *k, int fd, gr_proto_header *h, uint8_t **body)
{
    uint8_t hb[GR_PROTO_HEADER_SIZE];
    size_t got = 0;
    ssize_t r = 1;
    /* Byte by byte count: a peer that is no granary server often sends a reply shorter than a
     * header and closes; what it sent tells the user what it is. */
    while (got < sizeof hb) {
        r = recv(fd, hb + got, sizeof hb - got, 0);
        if (r > 0) got += (size_t)r;
        else if (r < 0 && errno == EINTR) continue;
        else break;
        if (hb[0] != GR_PROTO_MAGIC0 || (got >= 2 && hb[1] != GR_PROTO_MAGIC1)) break;
    }
    if (got > 0 && (hb[0] != GR_PROTO_MAGIC0 || (got >= 2 && hb[1] != GR_PROTO_MAGIC1))) {
        /* Read a little more of it for the message (it is short-lived: the timeout holds). */
        uint8_t more[64];
        memcpy(more, hb, got);
        ssize_t x = got < sizeof more ? recv(fd, more + got, sizeof more - got, MSG_DONTWAIT) : 0;
        return not_granary(more, got + (x > 0 ? (size_t)x : 0));
    }
    if (got < sizeof hb)
        return gr_seterr(GR_ECONN, "%s", r == 0 && got == 0 ? "connection closed during the handshake"
                                                : "no reply to the handshake (timed out or reset)");
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    lim.max_body = 1u << 20;
    int rc = gr_proto_header_decode(hb, sizeof hb, &lim, h, NULL);
    if (rc != GR_OK && rc != GR_EAGAIN) return rc;
    if (h->kind != GR_PROTO_RESPONSE) return gr_seterr(GR_EPROTO, "server sent a request frame");
    *body = malloc(h->body_len ? h->body_len : 8);
    if (!*body) return gr_seterr(GR_ENOMEM, "out of memory");
    if (h->body_len && read_full(fd, *body, h->body_len) != (ssize_t)h->body_len) {
        free(*body);
        *body = NULL;
        return gr_seterr(GR_ECONN, "connection closed during the handshake");
    }
    (void)k;
    return GR_OK;
}

void cl_error_text(const uint8_t *body, size_t len, char *out, size_t cap)
{
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    const char *s = NULL;
    uint32_t n = 0;
    if (gr_proto_decode_str(body, len, &lim, &s, &n) == GR_OK)
        snprintf(out, cap, "%.*s", (int)n, s);
    else
        snprintf(out, cap, "(unreadable error message)");
}

/* Sends a frame and reads its reply; a server error becomes this call's error. */
static int roundtrip(cl_conn *k, int fd, gr_proto_buf *b, uint16_t op, gr_proto_header *h,
                     uint8_t **body)
{
    if (write_full(fd, b->data, b->len) != 0)
        return gr_seterr(GR_ECONN, "cannot send %s: %s", gr_proto_op_name(op), strerror(errno));
    int rc = read_frame(k, fd, h, body);
    if (rc) return rc;
    if (h->status < 0) {
        char msg[256];
        cl_error_text(*body, h->body_len, msg, sizeof msg);
        free(*body);
        *body = NULL;
        return gr_seterr(h->status, "%s", msg);
    }
    if (h->op != op) {
        free(*body);
        *body = NULL;
        return gr_seterr(GR_EPROTO, "expected a %s reply, got opcode %u", gr_proto_op_name(op), h->op);
    }
    return GR_OK;
}

static int handshake(cl_conn *k, int fd)
{
    cl_link *cl = k->link;
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    uint64_t id = atomic_fetch_add(&cl->next_id, 1);
    int rc = gr_proto_begin(&b, GR_PROTO_REQUEST, GR_OP_HELLO, 0, 0, id);
    if (!rc) rc = gr_proto_put_str(&b, "granary-client", 14);
    if (!rc) rc = gr_proto_end(&b, 0);
    gr_proto_header h;
    uint8_t *body = NULL;
    if (!rc) rc = roundtrip(k, fd, &b, GR_OP_HELLO, &h, &body);
    gr_proto_hello hello;
    if (!rc) rc = gr_proto_decode_hello(body, h.body_len, &hello);
    free(body);
    body = NULL;
    if (rc) goto out;
    if (!cl->cfg.any_shard && (hello.shard != k->shard || hello.shards != cl->nshards)) {
        rc = gr_seterr(GR_EINVAL,
                       "server says it is shard %u of %u, but the server list has it as shard %u "
                       "of %u",
                       hello.shard, hello.shards, k->shard, cl->nshards);
        goto out;
    }
    k->limits = hello.limits;
    if (hello.limits.max_body < 4096 || hello.limits.max_keys == 0 || hello.limits.max_tables == 0) {
        rc = gr_seterr(GR_EPROTO, "server announced unusable limits");
        goto out;
    }
    if (hello.auth_required) {
        if (!cl->secret) {
            rc = gr_seterr(GR_EAUTH, "the server requires authentication: give an auth file");
            goto out;
        }
        uint8_t cnonce[GR_PROTO_NONCE_SIZE], mac[GR_PROTO_MAC_SIZE], want[GR_PROTO_MAC_SIZE];
        rc = gr_proto_random(cnonce, sizeof cnonce);
        if (!rc) rc = gr_proto_auth_mac(cl->secret, cl->secret_len, hello.nonce, cnonce, mac);
        b.len = 0;
        id = atomic_fetch_add(&cl->next_id, 1);
        if (!rc) rc = gr_proto_begin(&b, GR_PROTO_REQUEST, GR_OP_AUTH, 0, 0, id);
        if (!rc) rc = gr_proto_put_bytes(&b, cnonce, sizeof cnonce);
        if (!rc) rc = gr_proto_put_bytes(&b, mac, sizeof mac);
        if (!rc) rc = gr_proto_end(&b, 0);
        if (!rc) rc = roundtrip(k, fd, &b, GR_OP_AUTH, &h, &body);
        if (rc) goto out;
        /* The server proves it holds the secret too. */
        rc = gr_proto_auth_mac(cl->secret, cl->secret_len, cnonce, hello.nonce, want);
        if (!rc && (h.body_len != GR_PROTO_MAC_SIZE || CRYPTO_memcmp(body, want, sizeof want) != 0))
            rc = gr_seterr(GR_EAUTH, "the server could not prove it holds the shared secret");
        free(body);
    }
out:
    gr_proto_buf_fini(&b);
    return rc;
}

/* ---- the reader thread ---- */

/* Marks the connection broken before the reader completes the request whose reply broke it:
 * its caller may send again at once, and must then reconnect rather than queue behind a
 * connection that is about to fail everything pending on it. */
static void mark_broken(cl_conn *k)
{
    pthread_mutex_lock(&k->mu);
    k->broken = true;
    if (k->fd >= 0) shutdown(k->fd, SHUT_RDWR);
    pthread_mutex_unlock(&k->mu);
}

static void fail_pending(cl_conn *k, const char *why)
{
    pthread_mutex_lock(&k->mu);
    k->broken = true;
    if (k->fd >= 0) shutdown(k->fd, SHUT_RDWR);
    cl_req *list = k->pending;
    k->pending = NULL;
    pthread_mutex_unlock(&k->mu);
    char msg[320];
    snprintf(msg, sizeof msg, "connection lost: %s", why);
    while (list) {
        cl_req *next = list->next;
        list->on_done(list, GR_ECONN, msg);
        list = next;
    }
}

/* Takes request id off the pending list; with stream_only, only when it streams its reply
 * (others are taken after their body is read, so a waiter can still cancel them meanwhile). */
static cl_req *take_pending(cl_conn *k, uint64_t id, bool stream_only)
{
    pthread_mutex_lock(&k->mu);
    cl_req **pp = &k->pending;
    while (*pp && (*pp)->id != id) pp = &(*pp)->next;
    cl_req *r = *pp;
    if (r && stream_only && !r->on_stream) r = NULL;
    if (r) *pp = r->next;
    pthread_mutex_unlock(&k->mu);
    return r;
}

int cl_body_fill(cl_body *b, size_t n)
{
    if (b->failed) return gr_seterr(GR_ECONN, "the reply stream already failed");
    size_t avail = b->end - b->pos;
    if (avail >= n) return GR_OK;
    if (n - avail > b->left || n > b->scratch_cap) {
        b->failed = true;
        return gr_seterr(GR_EPROTO, "read of %zu bytes past the reply body (%zu left)", n,
                         avail + b->left);
    }
    /* What is left of the buffer is less than n bytes: move it to the front, then receive as
     * much as the buffer holds in as few calls as the socket allows. */
    if (b->pos) {
        memmove(b->scratch, b->scratch + b->pos, avail);
        b->pos = 0;
        b->end = avail;
    }
    uint64_t t0 = gr_thread_cpu_ns();
    int rc = GR_OK;
    while (b->end < n) {
        size_t room = b->scratch_cap - b->end;
        ssize_t r = recv(b->fd, b->scratch + b->end, room < b->left ? room : b->left, MSG_DONTWAIT);
        if (r > 0) {
            b->end += (size_t)r;
            b->left -= (size_t)r;
            continue;
        }
        if (r == 0) {
            rc = gr_seterr(GR_ECONN, "connection closed in the middle of a reply");
            break;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            rc = gr_seterr(GR_ECONN, "%s", strerror(errno));
            break;
        }
        uint64_t now = gr_now_ns();
        if (now >= b->deadline_ns) {
            rc = gr_seterr(GR_ETIMEDOUT, "the reply stalled past the request's deadline");
            break;
        }
        struct pollfd pf = {b->fd, POLLIN, 0};
        poll(&pf, 1, (int)((b->deadline_ns - now) / 1000000u) + 1);
    }
    b->read_ns += gr_thread_cpu_ns() - t0;
    if (rc) b->failed = true;
    return rc;
}

/* The result of a reply to r: the shard's error, a protocol error, or what r's handler makes
 * of the body. */
static int reply_result(cl_req *r, const gr_proto_header *h, uint8_t *body, bool *fatal)
{
    *fatal = false;
    if (h->status < 0) {
        char msg[300];
        cl_error_text(body, h->body_len, msg, sizeof msg);
        return gr_seterr(h->status, "%s", msg);
    }
    if (h->op != r->opcode) {
        *fatal = true;
        return gr_seterr(GR_EPROTO, "reply opcode %u does not match request opcode %u", h->op,
                         r->opcode);
    }
    if (r->on_reply) return r->on_reply(r, h, body, fatal);
    r->reply = malloc(h->body_len ? h->body_len : 8);
    if (!r->reply) return gr_seterr(GR_ENOMEM, "out of memory for a %u-byte reply", h->body_len);
    memcpy(r->reply, body, h->body_len);
    r->reply_len = h->body_len;
    return GR_OK;
}

static void *reader_main(void *arg)
{
    cl_conn *k = arg;
    cl_link *cl = k->link;
    gr_thread_want_slice_us(cl->cfg.slice_us, "client: a reader");
    int fd = k->fd; /* stable while this reader lives: only a reconnect, after joining us,
                       replaces it */
    char why[300] = "closed by the server";
    for (;;) {
        uint8_t hb[GR_PROTO_HEADER_SIZE];
        ssize_t r = read_full(fd, hb, sizeof hb);
        if (r <= 0) {
            if (r < 0) snprintf(why, sizeof why, "%s", strerror(errno ? errno : ECONNRESET));
            break;
        }
        gr_proto_header h;
        /* Replies other than rows (stats, describe) are not bounded by the server's request
         * limit; accept up to 64 MiB or that limit, whichever is larger. */
        gr_proto_limits rl = k->limits;
        if (rl.max_body < (64u << 20)) rl.max_body = 64u << 20;
        int rc = gr_proto_header_decode(hb, sizeof hb, &rl, &h, NULL);
        if (rc != GR_OK && rc != GR_EAGAIN) {
            snprintf(why, sizeof why, "bad reply frame: %s", gr_errmsg());
            break;
        }
        if (h.kind != GR_PROTO_RESPONSE) {
            snprintf(why, sizeof why, "server sent a request frame");
            break;
        }
        cl_req *req = h.id && h.status >= 0 ? take_pending(k, h.id, true) : NULL;
        if (req && h.op == req->opcode) {
            /* Streamed: the handler reads the body itself, straight from the socket. */
            if (!k->sbuf && !(k->sbuf = malloc(CL_SCRATCH_BYTES))) {
                req->on_done(req, GR_ENOMEM, "out of memory for the reply scratch buffer");
                snprintf(why, sizeof why, "out of memory for the reply scratch buffer");
                break;
            }
            cl_body b = {fd, h.body_len, req->deadline_ns, k->sbuf, CL_SCRATCH_BYTES, 0, 0, 0,
                         false};
            rc = req->on_stream(req, &h, &b);
            if (!rc && (b.left || cl_body_avail(&b)))
                rc = gr_seterr(GR_EPROTO, "reply handler left %zu bytes of the body",
                               b.left + cl_body_avail(&b));
            atomic_fetch_add_explicit(&cl->recv_ns, b.read_ns, memory_order_relaxed);
            atomic_fetch_add(&cl->bytes_received,
                             GR_PROTO_HEADER_SIZE + (uint64_t)(h.body_len - b.left));
            if (rc) { /* the stream stopped mid-frame: this connection is done */
                snprintf(why, sizeof why, "%s", gr_errmsg());
                mark_broken(k);
            }
            req->on_done(req, rc, rc ? gr_errmsg() : NULL);
            if (rc) break;
            continue;
        }
        if (req) { /* a streamed request answered with another opcode: malformed */
            rc = gr_seterr(GR_EPROTO, "reply opcode %u does not match request opcode %u", h.op,
                           req->opcode);
            snprintf(why, sizeof why, "malformed reply");
            mark_broken(k);
            req->on_done(req, rc, gr_errmsg());
            break;
        }
        if (h.body_len + (size_t)8 > k->rcap) {
            size_t cap = h.body_len + (size_t)8;
            free(k->rbuf);
            k->rbuf = malloc(cap);
            k->rcap = k->rbuf ? cap : 0;
            if (!k->rbuf) {
                snprintf(why, sizeof why, "out of memory for a %u-byte reply", h.body_len);
                break;
            }
        }
        uint64_t t0 = gr_thread_cpu_ns();
        if (h.body_len && read_full(fd, k->rbuf, h.body_len) != (ssize_t)h.body_len) {
            snprintf(why, sizeof why, "connection closed in the middle of a reply");
            break;
        }
        atomic_fetch_add_explicit(&cl->recv_ns, gr_thread_cpu_ns() - t0, memory_order_relaxed);
        atomic_fetch_add(&cl->bytes_received, GR_PROTO_HEADER_SIZE + (uint64_t)h.body_len);
        req = h.id ? take_pending(k, h.id, false) : NULL;
        if (!req) {
            if (h.status < 0 && h.id == 0) {
                /* A connection-level error (limit reached, bad frame): the close follows. */
                char msg[256];
                cl_error_text(k->rbuf, h.body_len, msg, sizeof msg);
                snprintf(why, sizeof why, "%s", msg);
            }
            continue; /* a reply to a request that timed out and was cancelled */
        }
        bool fatal = false;
        rc = reply_result(req, &h, k->rbuf, &fatal);
        if (fatal) mark_broken(k);
        req->on_done(req, rc, rc ? gr_errmsg() : NULL);
        if (fatal) {
            snprintf(why, sizeof why, "malformed reply");
            break;
        }
    }
    fail_pending(k, why);
    return NULL;
}

/* ---- connect with backoff ---- */

static void close_old_locked(cl_conn *k)
{
    if (k->reader_live) {
        pthread_join(k->reader, NULL);
        k->reader_live = false;
    }
    if (k->fd >= 0) {
        pthread_mutex_lock(&k->wlock); /* no writer is mid-frame on the old socket */
        pthread_mutex_lock(&k->mu);
        close(k->fd);
        k->fd = -1;
        pthread_mutex_unlock(&k->mu);
        pthread_mutex_unlock(&k->wlock);
    }
}

static bool retryable(int rc) { return rc == GR_ECONN || rc == GR_ETIMEDOUT || rc == GR_EBUSY; }

int cl_conn_ensure(cl_conn *k)
{
    cl_link *cl = k->link;
    pthread_mutex_lock(&k->connect_mu);
    pthread_mutex_lock(&k->mu);
    bool ok = k->fd >= 0 && !k->broken;
    pthread_mutex_unlock(&k->mu);
    if (ok) {
        pthread_mutex_unlock(&k->connect_mu);
        return GR_OK;
    }
    close_old_locked(k);
    uint64_t start = gr_now_ns();
    uint64_t deadline = start + (uint64_t)cl->cfg.connect_timeout_ms * 1000000u;
    uint32_t backoff = cl->cfg.backoff_initial_ms;
    int rc, attempts = 0, fd = -1;
    for (;;) {
        attempts++;
        fd = -1;
        rc = connect_fd(k, deadline, &fd);
        if (!rc) {
            uint64_t now = gr_now_ns();
            set_timeout(fd, SO_RCVTIMEO, now < deadline ? (deadline - now) / 1000000 + 1 : 1);
            set_timeout(fd, SO_SNDTIMEO, cl->cfg.request_timeout_ms);
            rc = handshake(k, fd);
            if (rc) {
                close(fd);
                fd = -1;
            }
        }
        if (!rc || !retryable(rc)) break;
        uint64_t now = gr_now_ns();
        if (now + (uint64_t)backoff * 1000000u >= deadline) break;
        gr_sleep_ms(backoff);
        backoff = backoff * 2 > cl->cfg.backoff_max_ms ? cl->cfg.backoff_max_ms : backoff * 2;
    }
    if (rc) {
        char msg[300];
        snprintf(msg, sizeof msg, "%s", gr_errmsg());
        uint64_t ms = (gr_now_ns() - start) / 1000000u;
        pthread_mutex_unlock(&k->connect_mu);
        if (attempts > 1)
            return gr_seterr(rc, "shard %u (%s): %s (gave up after %d attempts in %llu ms)",
                             k->shard, k->addr, msg, attempts, (unsigned long long)ms);
        return gr_seterr(rc, "shard %u (%s): %s", k->shard, k->addr, msg);
    }
    set_timeout(fd, SO_RCVTIMEO, 0); /* the reader waits as long as replies take */
    pthread_mutex_lock(&k->mu);
    k->fd = fd;
    k->broken = false;
    k->server_error[0] = '\0';
    pthread_mutex_unlock(&k->mu);
    if (pthread_create(&k->reader, NULL, reader_main, k) != 0) {
        pthread_mutex_lock(&k->mu);
        close(k->fd);
        k->fd = -1;
        pthread_mutex_unlock(&k->mu);
        pthread_mutex_unlock(&k->connect_mu);
        return gr_seterr(GR_EINTERNAL, "shard %u (%s): cannot start a reader thread", k->shard,
                         k->addr);
    }
    k->reader_live = true;
    if (k->ever_connected) atomic_fetch_add(&cl->reconnects, 1);
    k->ever_connected = true;
    pthread_mutex_unlock(&k->connect_mu);
    return GR_OK;
}

bool cl_conn_is_up(cl_conn *k)
{
    pthread_mutex_lock(&k->mu);
    bool up = k->fd >= 0 && !k->broken;
    pthread_mutex_unlock(&k->mu);
    return up;
}

bool cl_conn_claim(cl_conn *k, cl_req *r)
{
    pthread_mutex_lock(&k->mu);
    cl_req **pp = &k->pending;
    while (*pp && *pp != r) pp = &(*pp)->next;
    bool found = *pp != NULL;
    if (found) *pp = r->next;
    pthread_mutex_unlock(&k->mu);
    return found;
}

int cl_conn_send(cl_conn *k, cl_req *r)
{
    pthread_mutex_lock(&k->wlock);
    pthread_mutex_lock(&k->mu);
    if (k->fd < 0 || k->broken) {
        pthread_mutex_unlock(&k->mu);
        pthread_mutex_unlock(&k->wlock);
        snprintf(r->msg, sizeof r->msg, "not connected");
        return GR_ECONN;
    }
    int fd = k->fd;
    r->epoch = atomic_load(&k->link->epoch);
    gr_proto_stamp_epoch(r->frame.data, r->epoch);
    r->next = k->pending;
    k->pending = r;
    pthread_mutex_unlock(&k->mu);
    uint64_t t0 = gr_thread_cpu_ns();
    int w = write_full(fd, r->frame.data, r->frame.len);
    int err = errno;
    atomic_fetch_add_explicit(&k->link->send_ns, gr_thread_cpu_ns() - t0, memory_order_relaxed);
    if (w != 0) {
        /* A partial frame corrupts the stream: drop the connection; the reader fails the
         * other pending requests. */
        shutdown(fd, SHUT_RDWR);
    }
    pthread_mutex_unlock(&k->wlock);
    if (w == 0) {
        atomic_fetch_add(&k->link->requests, 1);
        atomic_fetch_add(&k->link->bytes_sent, r->frame.len);
        return GR_OK;
    }
    if (!cl_conn_claim(k, r)) return GR_OK; /* the reader already failed it */
    snprintf(r->msg, sizeof r->msg, "cannot send: %s", strerror(err));
    return GR_ECONN;
}
