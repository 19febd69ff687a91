/* The HTTP server: libmicrohttpd, one daemon (one thread with its own epoll loop) per handler
 * thread, fed round-robin by an acceptor thread of ours; each request's body is gathered whole
 * (up to max_body) and handed to one handler that fills a gr_http_response.
 *
 * Why not libmicrohttpd's own thread pool: its workers race to accept() from one listening
 * socket, and a worker that wins takes up to ten connections in a row, so a client opening its
 * connections at once (wrk, a load balancer's pool) often lands all of them on one worker: 16
 * connections on 4 workers went all to one worker in 2 runs of 3 (docs/serving.md), and the
 * server then used one core whatever its thread count. Round-robin gives each thread its share
 * of the connections. */
#include "granary/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http/http_int.h"

typedef struct parked_list parked_list;

struct gr_http_server {
    struct MHD_Daemon **daemons; /* cfg.threads of them, each one thread */
    parked_list *parked;         /* one per daemon (coalescing, cfg.park) */
    unsigned ndaemons;
    int lfd;           /* the listening socket */
    int wake[2];       /* a pipe: a byte written stops the acceptor */
    pthread_t acceptor;
    bool acceptor_running;
    unsigned next;     /* the daemon that gets the next connection (the acceptor's own) */
    gr_http_config cfg;
    uint16_t port;
};

/* What we keep for one request between libmicrohttpd's calls. */
typedef struct pending {
    char *body;
    size_t len, cap;
    size_t hint; /* the declared Content-Length, 0 when none */
    int too_big;
    void *job;           /* parked (cfg.park): the job, until its reply */
    bool ran;            /* its job was run: the reply can go */
    parked_list *owner;  /* the list of the thread that parked it */
} pending;

/* The requests one daemon (one thread) parked and has not run yet. A daemon calls us only
 * from its own thread, so its list needs no lock. */
struct parked_list {
    pending **p;
    void **jobs;
    size_t n, cap;
};

/* Runs every job this thread parked (one call of cfg.run); their replies go when
 * libmicrohttpd calls for each again. */
static void run_parked(gr_http_server *s, parked_list *l)
{
    if (!l->n) return;
    for (size_t i = 0; i < l->n; i++) l->jobs[i] = l->p[i]->job;
    s->cfg.run(s->cfg.ctx, l->jobs, l->n);
    for (size_t i = 0; i < l->n; i++) l->p[i]->ran = true;
    l->n = 0;
}

/* A request whose connection went away while parked: out of its list (when not run yet). */
static void unpark(pending *p)
{
    parked_list *l = p->owner;
    if (!l || p->ran) return;
    for (size_t i = 0; i < l->n; i++)
        if (l->p[i] == p) {
            l->p[i] = l->p[--l->n];
            return;
        }
}

static enum MHD_Result send_response(struct MHD_Connection *conn, gr_http_response *resp)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        resp->body_len, resp->body ? resp->body : (void *)"",
        resp->body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(resp->body);
        return MHD_NO;
    }
    resp->body = NULL;
    if (resp->content_type[0])
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, resp->content_type);
    for (int i = 0; i < 2; i++) {
        if (!resp->extra_header[i][0]) continue; /* the usual case: no printf per request */
        char line[256];
        snprintf(line, sizeof line, "%s", resp->extra_header[i]);
        char *colon = strchr(line, ':');
        if (!colon) continue;
        *colon = '\0';
        const char *value = colon + 1;
        while (*value == ' ') value++;
        MHD_add_response_header(r, line, value);
    }
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)resp->status, r);
    MHD_destroy_response(r);
    return ret;
}

static void response_init(gr_http_response *resp)
{
    memset(resp, 0, sizeof *resp);
    resp->status = 200;
    memcpy(resp->content_type, "application/json", sizeof "application/json");
}

/* Offers a request to cfg.park; GR_HTTP_PARKED when it now waits in this thread's list. */
static int park_request(gr_http_server *s, struct MHD_Connection *conn, pending *p,
                        const gr_http_request *req, gr_http_response *resp)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_DAEMON);
    parked_list *l = NULL;
    for (unsigned i = 0; ci && i < s->ndaemons; i++)
        if (s->daemons[i] == ci->daemon) l = &s->parked[i];
    if (!l) return GR_HTTP_DECLINED;
    unsigned max = s->cfg.max_parked ? s->cfg.max_parked : 64;
    if (l->n >= max) run_parked(s, l); /* full: run what it holds now */
    if (l->cap < max) {
        pending **np = realloc(l->p, max * sizeof *np);
        if (np) l->p = np;
        void **nj = realloc(l->jobs, max * sizeof *nj);
        if (nj) l->jobs = nj;
        if (!np || !nj) return GR_HTTP_DECLINED; /* no memory to park: answer it alone */
        l->cap = max;
    }
    void *job = NULL;
    int how = s->cfg.park(s->cfg.ctx, req, resp, &job);
    if (how != GR_HTTP_PARKED) return how;
    p->job = job;
    p->ran = false;
    p->owner = l;
    l->p[l->n++] = p;
    return GR_HTTP_PARKED;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    gr_http_server *s = cls;
    pending *p = *con_cls;
    if (!p) {
        /* The daemon threads are libmicrohttpd's: each asks for its time slice at its first
         * request (a thread-local flag; one syscall per thread). */
        static _Thread_local bool slice_asked;
        if (s->cfg.slice_us && !slice_asked) {
            slice_asked = true;
            gr_thread_want_slice_us(s->cfg.slice_us, "http: a handler thread");
        }
        p = calloc(1, sizeof *p);
        if (!p) return MHD_NO;
        *con_cls = p;
        /* A declared length over the limit is refused before a byte of it is read. */
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
        if (cl && declared > s->cfg.max_body) {
            gr_http_response resp;
            response_init(&resp);
            gr_http_error(&resp, 413, "request body of %s bytes is over the limit of %zu",
                          cl, s->cfg.max_body);
            return send_response(conn, &resp);
        }
        /* The declared length: the body then fits in one allocation of its size (a small one
         * comes from the thread's cache; the old first 4 KiB went to the main heap). */
        p->hint = (size_t)declared;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (p->too_big || p->len + n > s->cfg.max_body) {
            p->too_big = 1; /* keep reading (and dropping) so the reply can be sent */
            return MHD_YES;
        }
        if (p->len + n + 1 > p->cap) {
            size_t cap = p->cap ? p->cap : p->hint >= p->len + n ? p->hint + 1 : 4096;
            while (cap < p->len + n + 1) cap *= 2;
            char *nb = realloc(p->body, cap);
            if (!nb) return MHD_NO;
            p->body = nb;
            p->cap = cap;
        }
        memcpy(p->body + p->len, upload_data, n);
        p->len += n;
        return MHD_YES;
    }
    gr_http_response resp;
    response_init(&resp);
    if (p->job) {
        /* Parked at the last pass: libmicrohttpd calls again for the response. The first of
         * this thread's parked requests to be called runs them all (those parked earlier in
         * this pass included). */
        if (!p->ran) run_parked(s, p->owner);
        void *job = p->job;
        p->job = NULL;
        p->ran = false;
        p->owner = NULL;
        s->cfg.reply(s->cfg.ctx, job, &resp);
        return send_response(conn, &resp);
    }
    if (p->too_big) {
        gr_http_error(&resp, 413, "request body is over the limit of %zu bytes", s->cfg.max_body);
    } else {
        gr_http_request req = {
            .method = method,
            .path = url,
            .body = p->body ? p->body : "",
            .body_len = p->len,
            .internal = conn,
        };
        if (p->body) p->body[p->len] = '\0';
        int how = GR_HTTP_DECLINED;
        if (s->cfg.park && (how = park_request(s, conn, p, &req, &resp)) == GR_HTTP_PARKED)
            return MHD_YES; /* no response yet: called again at the next pass */
        if (how == GR_HTTP_DECLINED) s->cfg.handler(s->cfg.ctx, &req, &resp);
    }
    return send_response(conn, &resp);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)conn, (void)toe;
    gr_http_server *s = cls;
    pending *p = *con_cls;
    if (p) {
        if (p->job) { /* the connection closed while its request was parked */
            unpark(p);
            s->cfg.reply(s->cfg.ctx, p->job, NULL);
        }
        free(p->body);
        free(p);
        *con_cls = NULL;
    }
}

/* Accepts each connection and hands it to the next daemon in turn (MHD_add_connection, which
 * wakes that daemon's thread and closes the socket itself when it refuses it). */
static void *acceptor_main(void *arg)
{
    gr_http_server *s = arg;
    struct pollfd pf[2] = {{.fd = s->lfd, .events = POLLIN}, {.fd = s->wake[0], .events = POLLIN}};
    for (;;) {
        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (pf[1].revents) break;
        struct sockaddr_storage a;
        socklen_t al = sizeof a;
        int fd = accept4(s->lfd, (struct sockaddr *)&a, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            /* Out of descriptors: the pending connection stays readable; do not spin on it. */
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) usleep(10000);
            continue;
        }
        /* A loopback peer (a local load balancer, a sidecar, the benchmark's client): no
         * pacing, as on the binary protocol's connections (core's sock.c): 0.93x the CPU per
         * request at saturation (bench serve, 3 alternating pairs). */
        gr_sock_unpaced_loopback(fd);
        MHD_add_connection(s->daemons[s->next++ % s->ndaemons], fd, (struct sockaddr *)&a, al);
    }
    return NULL;
}

/* The listening socket, bound and listening, non-blocking; -1 with errno. */
static int listen_on(const struct sockaddr_storage *addr, socklen_t len)
{
    int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    int one = 1;
    /* As libmicrohttpd sets them on the sockets it makes: a restarted server can bind at once,
     * and a v6 address is v6 only. */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (addr->ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, (const struct sockaddr *)addr, len) || listen(fd, SOMAXCONN)) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static void server_free(gr_http_server *s)
{
    if (s->acceptor_running) {
        ssize_t w = write(s->wake[1], "x", 1);
        (void)w;
        pthread_join(s->acceptor, NULL);
    }
    if (s->lfd >= 0) close(s->lfd);
    for (unsigned i = 0; i < s->ndaemons; i++)
        if (s->daemons[i]) MHD_stop_daemon(s->daemons[i]);
    if (s->wake[0] >= 0) close(s->wake[0]);
    if (s->wake[1] >= 0) close(s->wake[1]);
    free(s->daemons);
    for (unsigned i = 0; s->parked && i < s->cfg.threads; i++) {
        free(s->parked[i].p);
        free(s->parked[i].jobs);
    }
    free(s->parked);
    free(s);
}

int gr_http_start(const gr_http_config *cfg, gr_http_server **out)
{
    *out = NULL;
    if (!cfg || !cfg->handler || !cfg->listen)
        return gr_seterr(GR_EINVAL, "http: a listen address and a handler are required");
    if (cfg->conn_memory && cfg->conn_memory < 4096)
        return gr_seterr(GR_EINVAL, "http: a connection's memory is at least 4 KiB, not %zu bytes",
                         cfg->conn_memory);
    if ((cfg->park || cfg->run || cfg->reply) && !(cfg->park && cfg->run && cfg->reply))
        return gr_seterr(GR_EINVAL, "http: coalescing needs park, run and reply together");
    if (cfg->slice_us && (cfg->slice_us < 100 || cfg->slice_us > 100000))
        return gr_seterr(GR_EINVAL, "http: a time slice is 100 to 100000 us, not %u",
                         cfg->slice_us);
    struct sockaddr_storage addr;
    socklen_t addr_len;
    int rc = gr_http_resolve(cfg->listen, 1, &addr, &addr_len);
    if (rc) return rc;
    gr_http_server *s = calloc(1, sizeof *s);
    if (!s) return gr_seterr(GR_ENOMEM, "http: out of memory");
    s->lfd = s->wake[0] = s->wake[1] = -1;
    s->cfg = *cfg;
    if (!s->cfg.threads) s->cfg.threads = 1;
    if (!s->cfg.max_body) s->cfg.max_body = 1u << 20;
    if (!s->cfg.timeout_s) s->cfg.timeout_s = 30;
    s->lfd = listen_on(&addr, addr_len);
    if (s->lfd < 0) {
        server_free(s);
        return gr_seterr(GR_EIO, "http: cannot listen on %s (in use, or not an address of "
                                 "this machine)", cfg->listen);
    }
    struct sockaddr_storage bound;
    socklen_t bl = sizeof bound;
    if (!getsockname(s->lfd, (struct sockaddr *)&bound, &bl))
        s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                   : ((struct sockaddr_in *)&bound)->sin_port);
    s->daemons = calloc(s->cfg.threads, sizeof *s->daemons);
    s->parked = calloc(s->cfg.threads, sizeof *s->parked);
    if (!s->daemons || !s->parked || pipe2(s->wake, O_CLOEXEC)) {
        server_free(s);
        return gr_seterr(GR_ENOMEM, "http: out of memory or descriptors");
    }
    /* Each daemon: one thread, its own epoll set, no listening socket (the acceptor feeds it;
     * MHD_USE_ITC lets another thread's MHD_add_connection wake it). */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ITC |
                     MHD_USE_NO_LISTEN_SOCKET;
    if (addr.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    for (unsigned i = 0; i < s->cfg.threads; i++) {
        /* The pool's size only when asked: libmicrohttpd zeroes the whole pool when a
         * kept-alive connection starts its next request (its default 32 KiB: 2.6 % of a
         * replica's CPU per one-example request, perf, bench serve). */
        s->daemons[i] = MHD_start_daemon(
            flags, 0, NULL, NULL, on_request, s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
            MHD_OPTION_CONNECTION_TIMEOUT, s->cfg.timeout_s,
            s->cfg.conn_memory ? MHD_OPTION_CONNECTION_MEMORY_LIMIT : MHD_OPTION_END,
            s->cfg.conn_memory, MHD_OPTION_END);
        s->ndaemons = i + 1;
        if (!s->daemons[i]) {
            server_free(s);
            return gr_seterr(GR_EIO, "http: cannot start the server thread %u of %u for %s", i + 1,
                             cfg->threads ? cfg->threads : 1, cfg->listen);
        }
    }
    if (pthread_create(&s->acceptor, NULL, acceptor_main, s)) {
        server_free(s);
        return gr_seterr(GR_EIO, "http: cannot start the accepting thread for %s", cfg->listen);
    }
    s->acceptor_running = true;
    *out = s;
    return 0;
}

uint16_t gr_http_port(const gr_http_server *s) { return s ? s->port : 0; }

/* Stops accepting first, then each daemon (which waits for its handlers in flight). */
void gr_http_stop(gr_http_server *s)
{
    if (!s) return;
    server_free(s);
}

const char *gr_http_header(const gr_http_request *req, const char *name)
{
    return MHD_lookup_connection_value(req->internal, MHD_HEADER_KIND, name);
}

const char *gr_http_query(const gr_http_request *req, const char *name)
{
    return MHD_lookup_connection_value(req->internal, MHD_GET_ARGUMENT_KIND, name);
}
