/* Connection I/O on one libevent loop thread (see conn.h for the contract, docs/server.md,
 * "Connections", for the life cycle and every deadline). The loop thread owns the listener,
 * the connection list, every fd registration and the read side of every connection; other
 * threads touch a connection only through srv_conn_write / srv_conn_done under its mutex, and
 * ask the loop for anything else by activating the connection's `kick` event. */
#include "server/conn.h"

#include "granary/core.h"

#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#define SOCK_BUF_BYTES (4 << 20)
#define RBUF_BYTES (64u << 10)         /* small frames arrive many to one recv */
#define READ_TURN_BYTES (8u << 20)      /* then let other connections have the loop */
#define LINGER_MS 1000u                 /* after a fatal error: flush, read and discard */
#define MAX_IOV 64
#define STEAL_MIN (64u << 10)           /* queue a large reply by taking its buffer, not copying */

typedef enum { C_OPEN, C_DRAIN, C_LINGER, C_CLOSED } conn_state;

typedef struct out_node {
    struct out_node *next;
    uint8_t *data;
    size_t len, off;
    uint64_t deadline_ns; /* the whole reply must be written by then */
} out_node;

struct srv_conn {
    srv_net *net;
    int fd;
    atomic_int refs; /* the loop's, one per delivered frame, one per srv_conn_get */
    char peer[64];

    /* ---- loop thread only ---- */
    struct event *rev, *wev, *kick;
    srv_conn *prev, *next;
    conn_state state;
    uint8_t *rbuf;
    size_t rpos, rlen;
    gr_proto_header h;
    bool have_header;       /* h is decoded; its budget is reserved once body != NULL */
    uint8_t *body;
    size_t body_got;
    bool reading;           /* rev is added */
    bool global_wait;       /* on the net's list of connections waiting for the global budget */
    srv_conn *gw_next;
    bool closed_reported, shut_wr;
    uint64_t accept_ns, frame_start_ns, last_rx_ns, linger_until_ns;
    bool authed;
    srv_conn_auth auth;

    /* ---- under mu ---- */
    pthread_mutex_t mu;
    bool broken;            /* a write failed: no more writes; the loop closes it */
    bool loop_gone;         /* the loop has closed the fd: no kicks, no writes */
    bool kick_on_done;      /* the loop waits for a request to end (paused or draining) */
    out_node *oq_head, *oq_tail;
    uint64_t oq_bytes;
    uint32_t inflight;
    uint64_t inflight_bytes;
    atomic_bool closing;    /* a fatal error reply was queued: read nothing more */
    atomic_bool drain_watch; /* draining: the loop wants to hear when a reference goes */
};

struct srv_net {
    srv_net_config cfg;
    srv_net_callbacks cb;
    srv_net_stats st;
    struct event_base *base;
    struct event *lev, *sweep, *budget_ev, *reap_ev, *ctl_ev;
    int listen_fd;
    struct event *ulev;       /* the AF_UNIX listener (cfg.unix_name), or NULL */
    int unix_fd;
    uint16_t port;
    pthread_t thread;
    bool running;
    srv_conn *conns;          /* loop thread only */
    srv_conn *gwait;          /* loop thread only */
    atomic_uint nglobal_wait; /* read by srv_conn_done */
    uint64_t accept_paused_until;
    pthread_mutex_t reap_mu;  /* guards reap (connections whose last reference is gone) */
    srv_conn *reap;
    pthread_mutex_t ctl_mu;   /* guards the stop requests and their acknowledgement */
    pthread_cond_t ctl_cv;
    bool want_stop_reading, stopped_reading, want_finish;
    char unix_name[100];      /* cfg.unix_name points here */
};

static void conn_pump(srv_conn *c);
static void conn_kill(srv_conn *c, const char *why);
static void read_cb(evutil_socket_t fd, short what, void *arg);

static uint64_t ms_ns(uint32_t ms) { return (uint64_t)ms * 1000000u; }

/* ---- references ---- */

static void conn_free(srv_conn *c)
{
    for (out_node *o = c->oq_head, *nx; o; o = nx) {
        nx = o->next;
        free(o->data);
        free(o);
    }
    if (c->rev) event_free(c->rev);
    if (c->wev) event_free(c->wev);
    if (c->kick) event_free(c->kick);
    if (c->fd >= 0) close(c->fd);
    free(c->body);
    free(c->rbuf);
    /* A srv_conn_put that dropped the next-to-last reference may still hold mu. */
    pthread_mutex_lock(&c->mu);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void srv_conn_get(srv_conn *c) { atomic_fetch_add(&c->refs, 1); }

/* The last reference may go on any thread; events are freed on the loop thread. */
void srv_conn_put(srv_conn *c)
{
    srv_net *n = c->net;
    if (atomic_load(&c->drain_watch)) {
        /* Draining closes when only the loop's reference is left: tell it, under mu so the
         * loop cannot free c between the decrement and the kick. */
        pthread_mutex_lock(&c->mu);
        int v = atomic_fetch_sub(&c->refs, 1);
        if (v == 2 && !c->loop_gone) event_active(c->kick, EV_READ, 0);
        pthread_mutex_unlock(&c->mu);
        if (v != 1) return;
    } else if (atomic_fetch_sub(&c->refs, 1) != 1) {
        return;
    }
    pthread_mutex_lock(&n->reap_mu);
    c->next = n->reap;
    n->reap = c;
    pthread_mutex_unlock(&n->reap_mu);
    event_active(n->reap_ev, EV_READ, 0);
}

static void reap_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    srv_net *n = arg;
    pthread_mutex_lock(&n->reap_mu);
    srv_conn *list = n->reap;
    n->reap = NULL;
    pthread_mutex_unlock(&n->reap_mu);
    while (list) {
        srv_conn *c = list;
        list = c->next;
        conn_free(c);
    }
}

/* Asks the loop to look at c again. Caller holds c->mu. */
static void kick_locked(srv_conn *c)
{
    if (!c->loop_gone) event_active(c->kick, EV_READ, 0);
}

/* ---- accessors ---- */

const char *srv_conn_peer(const srv_conn *c) { return c->peer; }
srv_conn_auth *srv_conn_auth_state(srv_conn *c) { return &c->auth; }
bool srv_conn_authed(const srv_conn *c) { return c->authed; }
void srv_conn_set_authed(srv_conn *c) { c->authed = true; }

/* ---- budgets ---- */

void srv_conn_done(srv_conn *c, uint32_t body_len)
{
    srv_net *n = c->net;
    atomic_fetch_sub(&n->st.total_inflight_bytes, body_len);
    pthread_mutex_lock(&c->mu);
    c->inflight--;
    c->inflight_bytes -= body_len;
    if (c->kick_on_done) kick_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (atomic_load(&n->nglobal_wait) > 0) event_active(n->budget_ev, EV_READ, 0);
    srv_conn_put(c);
}

static void stop_reading_events(srv_conn *c)
{
    if (c->reading) {
        event_del(c->rev);
        c->reading = false;
    }
    c->frame_start_ns = 0; /* waiting on us, not on the peer */
}

/* Takes the in-flight budget for the decoded header's body: per connection (requests, their
 * bytes and the replies still queued; one larger frame is let through alone) and over all
 * connections. false = paused until a request ends or replies drain. */
static bool reserve(srv_conn *c)
{
    srv_net *n = c->net;
    uint32_t b = c->h.body_len;
    pthread_mutex_lock(&c->mu);
    bool busy = c->inflight > 0 && (c->inflight >= n->cfg.max_inflight ||
                                     c->inflight_bytes + c->oq_bytes + b > n->cfg.max_inflight_bytes);
    c->kick_on_done = busy;
    if (busy) {
        pthread_mutex_unlock(&c->mu);
        stop_reading_events(c);
        return false;
    }
    /* Only this thread adds to the total, so the check cannot race with another add. */
    uint64_t total = atomic_load(&n->st.total_inflight_bytes);
    if (total > 0 && total + b > n->cfg.max_total_inflight_bytes) {
        pthread_mutex_unlock(&c->mu);
        stop_reading_events(c);
        if (!c->global_wait) {
            c->global_wait = true;
            c->gw_next = n->gwait;
            n->gwait = c;
            atomic_fetch_add(&n->nglobal_wait, 1);
        }
        return false;
    }
    c->inflight++;
    c->inflight_bytes += b;
    atomic_fetch_add(&n->st.total_inflight_bytes, b);
    pthread_mutex_unlock(&c->mu);
    return true;
}

static void gwait_remove(srv_conn *c)
{
    if (!c->global_wait) return;
    srv_net *n = c->net;
    for (srv_conn **pp = &n->gwait; *pp; pp = &(*pp)->gw_next)
        if (*pp == c) {
            *pp = c->gw_next;
            break;
        }
    c->global_wait = false;
    atomic_fetch_sub(&n->nglobal_wait, 1);
}

static void budget_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    srv_net *n = arg;
    srv_conn *list = n->gwait;
    n->gwait = NULL;
    while (list) {
        srv_conn *c = list;
        list = c->gw_next;
        c->global_wait = false;
        atomic_fetch_sub(&n->nglobal_wait, 1);
        conn_pump(c);
    }
}

/* ---- writes ---- */

static void note_broken_locked(srv_conn *c)
{
    if (c->broken) return;
    c->broken = true;
    kick_locked(c);
}

size_t srv_conn_write(srv_conn *c, gr_proto_buf *out, bool may_take)
{
    size_t n = out->len, off = 0;
    pthread_mutex_lock(&c->mu);
    if (c->broken || c->loop_gone) {
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    if (!c->oq_head) {
        while (off < n) {
            ssize_t w = send(c->fd, out->data + off, n - off, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (w > 0) {
                off += (size_t)w;
            } else if (w < 0 && errno == EINTR) {
                continue;
            } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                break;
            } else {
                note_broken_locked(c);
                pthread_mutex_unlock(&c->mu);
                return 0;
            }
        }
        if (off == n) {
            pthread_mutex_unlock(&c->mu);
            return n;
        }
    }
    out_node *o = malloc(sizeof *o);
    uint8_t *data = NULL;
    if (o && may_take && n - off >= STEAL_MIN) {
        /* Hand the buffer over instead of copying megabytes; the caller gets an empty one. */
        data = out->data;
        o->off = off;
        o->len = n;
        out->data = NULL;
        out->len = out->cap = 0;
    } else if (o && (data = malloc(n - off))) {
        memcpy(data, out->data + off, n - off);
        o->off = 0;
        o->len = n - off;
    }
    if (!o || !data) {
        free(o);
        GR_LOGW("shard %u: %s: out of memory queueing a reply; closing", c->net->cfg.shard,
                c->peer);
        note_broken_locked(c);
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    o->data = data;
    o->next = NULL;
    o->deadline_ns = gr_now_ns() + ms_ns(c->net->cfg.send_timeout_ms);
    bool first = !c->oq_head;
    if (c->oq_tail) c->oq_tail->next = o;
    else c->oq_head = o;
    c->oq_tail = o;
    c->oq_bytes += o->len - o->off;
    if (first) kick_locked(c);
    pthread_mutex_unlock(&c->mu);
    return n;
}

void *srv_conn_ctx(const srv_conn *c) { return c->net->cb.ctx; }

void srv_conn_write_error(srv_conn *c, uint16_t op, uint64_t id, int rc, const char *msg,
                          bool fatal)
{
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    if (!gr_proto_put_error(&b, op, id, rc, msg)) srv_conn_write(c, &b, false);
    gr_proto_buf_fini(&b);
    if (fatal) {
        atomic_store(&c->closing, true);
        pthread_mutex_lock(&c->mu);
        kick_locked(c);
        pthread_mutex_unlock(&c->mu);
    }
}

/* Writes queued replies with one writev per turn; called by the loop when the socket can
 * take more. */
static void write_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    srv_conn *c = arg;
    pthread_mutex_lock(&c->mu);
    while (c->oq_head && !c->broken) {
        struct iovec iov[MAX_IOV];
        int k = 0;
        for (out_node *o = c->oq_head; o && k < MAX_IOV; o = o->next, k++) {
            iov[k].iov_base = o->data + o->off;
            iov[k].iov_len = o->len - o->off;
        }
        ssize_t w = writev(fd, iov, k);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) c->broken = true;
            break;
        }
        c->oq_bytes -= (uint64_t)w;
        size_t left = (size_t)w;
        while (left && c->oq_head) {
            out_node *o = c->oq_head;
            size_t room = o->len - o->off;
            if (left < room) {
                o->off += left;
                break;
            }
            left -= room;
            c->oq_head = o->next;
            if (!c->oq_head) c->oq_tail = NULL;
            free(o->data);
            free(o);
        }
    }
    if (!c->oq_head || c->broken) event_del(c->wev);
    pthread_mutex_unlock(&c->mu);
    conn_pump(c);
}

/* ---- reads ---- */

/* Ends the read side without a peer error: nothing more is read, c closes when its requests
 * are answered and written. */
static void enter_drain(srv_conn *c)
{
    stop_reading_events(c);
    gwait_remove(c);
    if (c->body) { /* a frame half read: its budget goes back */
        free(c->body);
        c->body = NULL;
        srv_conn_get(c); /* srv_conn_done drops a reference this frame never took */
        srv_conn_done(c, c->h.body_len);
    }
    c->have_header = false;
    c->state = C_DRAIN;
}

static void report_closed(srv_conn *c)
{
    if (c->closed_reported) return;
    c->closed_reported = true;
    if (c->net->cb.closed) c->net->cb.closed(c->net->cb.ctx, c);
}

/* A fatal error reply is queued: flush it, then half-close and discard input briefly so the
 * peer reads the error rather than a reset. */
static void enter_linger(srv_conn *c)
{
    if (c->state == C_OPEN) enter_drain(c);
    c->state = C_LINGER;
    c->linger_until_ns = gr_now_ns() + ms_ns(LINGER_MS);
    if (!c->reading) {
        event_add(c->rev, NULL);
        c->reading = true;
    }
    report_closed(c);
}

/* Fails the connection from the loop: error reply, then linger. */
static void conn_fail(srv_conn *c, int rc, const char *msg)
{
    GR_LOGW("shard %u: closing %s: %s", c->net->cfg.shard, c->peer, msg);
    srv_conn_write_error(c, 0, 0, rc, msg, true);
    enter_linger(c);
}

static void linger_read(srv_conn *c)
{
    char junk[16384];
    for (;;) {
        ssize_t r = recv(c->fd, junk, sizeof junk, 0);
        if (r > 0) continue;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        conn_kill(c, NULL);
        return;
    }
}

/* The header in rbuf (at least GR_PROTO_HEADER_SIZE bytes, or fewer to check the magic) is
 * checked: false = the connection failed. */
static bool take_header(srv_conn *c)
{
    srv_net *n = c->net;
    gr_proto_limits lim = n->cfg.limits;
    if (n->cfg.auth_required && !c->authed) lim.max_body = n->cfg.preauth_max_body;
    size_t avail = c->rlen - c->rpos;
    gr_proto_header h;
    memset(&h, 0, sizeof h);
    int rc = gr_proto_header_decode(c->rbuf + c->rpos, avail < GR_PROTO_HEADER_SIZE ? avail
                                    : GR_PROTO_HEADER_SIZE, &lim, &h, NULL);
    if (rc == GR_EAGAIN && avail < GR_PROTO_HEADER_SIZE) return true; /* need more bytes */
    if (rc == GR_EAGAIN) rc = GR_OK; /* the body is not here yet: fine */
    if (!rc && h.kind != GR_PROTO_REQUEST)
        rc = gr_seterr(GR_EPROTO, "expected a request frame, got kind %u", h.kind);
    if (!rc && h.status < 0) /* requests carry a layout epoch there, never an error code */
        rc = gr_seterr(GR_EPROTO,
                       "a request's status field must be 0 or a layout epoch (1..%u), got %d",
                       GR_PROTO_EPOCH_MAX, h.status);
    if (rc) {
        atomic_fetch_add(&n->st.bad_frames, 1);
        GR_LOGW("shard %u: closing %s: %s", n->cfg.shard, c->peer, gr_errmsg());
        srv_conn_write_error(c, h.op, h.id, rc, gr_errmsg(), true);
        enter_linger(c);
        return false;
    }
    c->h = h;
    c->have_header = true;
    c->rpos += GR_PROTO_HEADER_SIZE;
    return true;
}

/* Hands the complete frame to the server. */
static void deliver(srv_conn *c)
{
    uint8_t *body = c->body;
    gr_proto_header h = c->h;
    c->body = NULL;
    c->have_header = false;
    srv_conn_get(c); /* the frame's reference, dropped by srv_conn_done */
    c->net->cb.frame(c->net->cb.ctx, c, &h, body);
}

/* Parses what rbuf holds: whole frames are delivered, a large body gets its own buffer.
 * Returns false when reading must stop (paused, closing, failed). */
static bool parse(srv_conn *c)
{
    for (;;) {
        if (atomic_load(&c->closing) || c->state != C_OPEN) return false;
        if (!c->have_header) {
            if (c->rpos == c->rlen) break;
            if (!take_header(c)) return false;
            if (!c->have_header) break;
        }
        if (!c->body) {
            if (!reserve(c)) return false;
            c->body = malloc(c->h.body_len ? c->h.body_len : 8);
            if (!c->body) {
                srv_conn_get(c);
                srv_conn_done(c, c->h.body_len);
                c->have_header = false;
                conn_fail(c, GR_ENOMEM, "server out of memory for a request body");
                return false;
            }
            c->body_got = 0;
        }
        size_t take = c->rlen - c->rpos;
        if (take > c->h.body_len - c->body_got) take = c->h.body_len - c->body_got;
        memcpy(c->body + c->body_got, c->rbuf + c->rpos, take);
        c->body_got += take;
        c->rpos += take;
        if (c->body_got < c->h.body_len) break;
        deliver(c);
    }
    if (c->rpos == c->rlen) c->rpos = c->rlen = 0;
    return true;
}

static void read_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    srv_conn *c = arg;
    if (c->state == C_LINGER) {
        linger_read(c);
        return;
    }
    size_t turn = 0;
    while (c->state == C_OPEN && c->reading && turn < READ_TURN_BYTES) {
        ssize_t r;
        bool direct = c->body && c->rpos == c->rlen;
        if (direct) { /* the rest of a large body goes straight to its buffer */
            r = recv(fd, c->body + c->body_got, c->h.body_len - c->body_got, 0);
        } else {
            if (c->rpos > 0) {
                memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
                c->rlen -= c->rpos;
                c->rpos = 0;
            }
            r = recv(fd, c->rbuf + c->rlen, RBUF_BYTES - c->rlen, 0);
        }
        if (r == 0) { /* the peer hung up: cancel what is parked for it, answer the rest */
            bool mid = c->have_header || c->rlen > c->rpos;
            enter_drain(c);
            report_closed(c);
            if (mid) conn_kill(c, NULL);
            else conn_pump(c);
            return;
        }
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            conn_kill(c, NULL);
            return;
        }
        turn += (size_t)r;
        uint64_t now = gr_now_ns();
        c->last_rx_ns = now;
        if (direct) c->body_got += (size_t)r;
        else c->rlen += (size_t)r;
        if (!c->frame_start_ns) c->frame_start_ns = now;
        if (direct && c->body_got == c->h.body_len) deliver(c);
        if (!parse(c)) break;
        if (!c->have_header && c->rpos == c->rlen) c->frame_start_ns = 0; /* between frames */
    }
}

/* ---- the connection's state, re-evaluated on the loop ---- */

static void kick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    conn_pump(arg);
}

static void conn_pump(srv_conn *c)
{
    if (c->state == C_CLOSED) return;
    pthread_mutex_lock(&c->mu);
    bool broken = c->broken, queued = c->oq_head != NULL;
    uint32_t inflight = c->inflight;
    pthread_mutex_unlock(&c->mu);
    if (broken) {
        conn_kill(c, NULL);
        return;
    }
    if (queued && !event_pending(c->wev, EV_WRITE, NULL)) event_add(c->wev, NULL);
    if (atomic_load(&c->closing) && c->state != C_LINGER) enter_linger(c);
    if (c->state == C_LINGER) {
        if (!queued && !c->shut_wr) {
            shutdown(c->fd, SHUT_WR);
            c->shut_wr = true;
        }
        return;
    }
    if (c->state == C_DRAIN) {
        /* Requests still running or parked hold references; the last one kicks us. */
        atomic_store(&c->drain_watch, true);
        if (inflight == 0 && !queued && atomic_load(&c->refs) == 1) conn_kill(c, NULL);
        return;
    }
    /* Open and paused: try the budget again, then go on with what rbuf holds. */
    if (!c->reading && !c->global_wait) {
        if (c->have_header && !c->body && !reserve(c)) return;
        c->reading = true;
        event_add(c->rev, NULL);
        if (c->have_header || c->rlen > c->rpos) c->frame_start_ns = gr_now_ns();
        if (c->have_header && !c->body) {
            /* reserve() succeeded: parse() allocates the body next, without reserving again */
            c->body = malloc(c->h.body_len ? c->h.body_len : 8);
            if (!c->body) {
                srv_conn_get(c);
                srv_conn_done(c, c->h.body_len);
                c->have_header = false;
                conn_fail(c, GR_ENOMEM, "server out of memory for a request body");
                return;
            }
            c->body_got = 0;
        }
        if (parse(c) && !c->have_header && c->rpos == c->rlen) c->frame_start_ns = 0;
    }
}

/* Closes the fd and takes c off the loop; queued replies are freed. why: a log line. */
static void conn_kill(srv_conn *c, const char *why)
{
    srv_net *n = c->net;
    if (c->state == C_CLOSED) return;
    if (why) GR_LOGW("shard %u: closing %s: %s", n->cfg.shard, c->peer, why);
    if (c->state == C_OPEN) enter_drain(c);
    /* At a stop the server answers what is parked itself; otherwise cancel it now. */
    if (!n->stopped_reading) report_closed(c);
    c->state = C_CLOSED;
    event_del(c->rev);
    event_del(c->wev);
    event_del(c->kick);
    pthread_mutex_lock(&c->mu);
    c->loop_gone = true;
    c->broken = true;
    for (out_node *o = c->oq_head, *nx; o; o = nx) {
        nx = o->next;
        free(o->data);
        free(o);
    }
    c->oq_head = c->oq_tail = NULL;
    c->oq_bytes = 0;
    close(c->fd);
    c->fd = -1;
    pthread_mutex_unlock(&c->mu);
    if (c->prev) c->prev->next = c->next;
    else n->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    atomic_fetch_sub(&n->st.nconns, 1);
    srv_conn_put(c); /* the loop's reference */
    if (n->want_finish && !n->conns) event_base_loopbreak(n->base);
}

/* ---- deadlines ---- */

static void sweep_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    srv_net *n = arg;
    const srv_net_config *cfg = &n->cfg;
    uint64_t now = gr_now_ns();
    char msg[160];
    if (n->accept_paused_until && now >= n->accept_paused_until) {
        n->accept_paused_until = 0;
        if (n->lev) event_add(n->lev, NULL);
        if (n->ulev) event_add(n->ulev, NULL);
    }
    /* Same for a budget released just before a connection joined the global wait list. */
    if (n->gwait) budget_cb(-1, 0, n);
    for (srv_conn *c = n->conns, *nx; c; c = nx) {
        nx = c->next;
        pthread_mutex_lock(&c->mu);
        uint64_t head_deadline = c->oq_head ? c->oq_head->deadline_ns : 0;
        /* Only the loop's reference: nothing running, parked or queued for c. */
        bool idle = c->inflight == 0 && !c->oq_head && atomic_load(&c->refs) == 1;
        pthread_mutex_unlock(&c->mu);
        if (head_deadline && now > head_deadline) {
            atomic_fetch_add(&n->st.dropped_slow, 1);
            snprintf(msg, sizeof msg, "a reply was not read within %u ms (the peer stopped "
                     "reading); dropping the connection and its queued replies",
                     cfg->send_timeout_ms);
            conn_kill(c, msg);
            continue;
        }
        if (c->state == C_LINGER) {
            if (now > c->linger_until_ns) conn_kill(c, NULL);
            continue;
        }
        if (c->state == C_DRAIN) {
            /* The last request's kick can race with the start of the drain (srv_conn_put
             * reads drain_watch before the loop sets it): look again here. */
            conn_pump(c);
            continue;
        }
        if (c->state != C_OPEN) continue;
        if (cfg->auth_required && !c->authed && now > c->accept_ns + ms_ns(cfg->auth_timeout_ms)) {
            atomic_fetch_add(&n->st.reaped, 1);
            snprintf(msg, sizeof msg, "authentication not completed within %u ms of connecting",
                     cfg->auth_timeout_ms);
            conn_fail(c, GR_EAUTH, msg);
        } else if (c->frame_start_ns && now > c->frame_start_ns + ms_ns(cfg->frame_timeout_ms)) {
            atomic_fetch_add(&n->st.reaped, 1);
            snprintf(msg, sizeof msg, "a frame was started but not completed within %u ms",
                     cfg->frame_timeout_ms);
            conn_fail(c, GR_ETIMEDOUT, msg);
        } else if (cfg->idle_timeout_ms && idle && !c->frame_start_ns && c->reading &&
                   now > c->last_rx_ns + ms_ns(cfg->idle_timeout_ms)) {
            atomic_fetch_add(&n->st.reaped, 1);
            GR_LOGI("shard %u: closing %s: idle for %u ms", cfg->shard, c->peer,
                    cfg->idle_timeout_ms);
            enter_drain(c);
            conn_kill(c, NULL);
        }
    }
}

/* ---- accept ---- */

static void tune_socket(int fd, bool tcp)
{
    int one = 1, buf = SOCK_BUF_BYTES;
    /* Replies are written whole; Nagle would only add latency to the last segment. */
    if (tcp) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    gr_sock_unpaced_loopback(fd); /* core.h: no pacing on loopback */
}

static void reject(srv_net *n, int fd, int rc, const char *msg)
{
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    if (!gr_proto_put_error(&b, 0, 0, rc, msg))
        (void)send(fd, b.data, b.len, MSG_DONTWAIT | MSG_NOSIGNAL);
    gr_proto_buf_fini(&b);
    atomic_fetch_add(&n->st.conns_rejected, 1);
    shutdown(fd, SHUT_WR);
    close(fd);
}

static srv_conn *conn_new(srv_net *n, int fd, const char *peer)
{
    srv_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->net = n;
    c->fd = fd;
    atomic_init(&c->refs, 1);
    atomic_init(&c->closing, false);
    atomic_init(&c->drain_watch, false);
    pthread_mutex_init(&c->mu, NULL);
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    c->rbuf = malloc(RBUF_BYTES);
    c->rev = event_new(n->base, fd, EV_READ | EV_PERSIST, read_cb, c);
    c->wev = event_new(n->base, fd, EV_WRITE | EV_PERSIST, write_cb, c);
    c->kick = event_new(n->base, -1, 0, kick_cb, c);
    if (!c->rbuf || !c->rev || !c->wev || !c->kick) {
        c->fd = -1;
        conn_free(c);
        return NULL;
    }
    c->accept_ns = c->last_rx_ns = gr_now_ns();
    return c;
}

static void accept_cb(evutil_socket_t lfd, short what, void *arg)
{
    (void)what;
    srv_net *n = arg;
    for (int i = 0; i < 64; i++) {
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        int fd = accept4(lfd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* Out of descriptors: stop accepting for a moment rather than spin. */
                if (n->lev) event_del(n->lev);
                if (n->ulev) event_del(n->ulev);
                n->accept_paused_until = gr_now_ns() + ms_ns(100);
            }
            return;
        }
        char peer[64] = "?", hostbuf[48], portbuf[8];
        bool tcp = lfd != n->unix_fd;
        if (!tcp) /* an abstract unix peer has no name of its own: say which listener */
            snprintf(peer, sizeof peer, "unix:@%.40s", n->cfg.unix_name);
        else if (getnameinfo((struct sockaddr *)&sa, sl, hostbuf, sizeof hostbuf, portbuf,
                        sizeof portbuf, NI_NUMERICHOST | NI_NUMERICSERV) == 0)
            snprintf(peer, sizeof peer, "%s:%s", hostbuf, portbuf);
        if (atomic_load(&n->st.nconns) >= n->cfg.max_connections) {
            char msg[128];
            snprintf(msg, sizeof msg, "shard %u has %u connections (the limit); try later",
                     n->cfg.shard, n->cfg.max_connections);
            GR_LOGW("shard %u: refusing %s: %s", n->cfg.shard, peer, msg);
            reject(n, fd, GR_EBUSY, msg);
            continue;
        }
        tune_socket(fd, tcp);
        srv_conn *c = conn_new(n, fd, peer);
        if (!c) {
            reject(n, fd, GR_ENOMEM, "server out of memory");
            continue;
        }
        c->next = n->conns;
        if (n->conns) n->conns->prev = c;
        n->conns = c;
        atomic_fetch_add(&n->st.nconns, 1);
        atomic_fetch_add(&n->st.conns_total, 1);
        c->reading = true;
        event_add(c->rev, NULL);
        GR_LOGD("shard %u: connection from %s", n->cfg.shard, peer);
    }
}

/* ---- stop requests, carried to the loop ---- */

static void ctl_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    srv_net *n = arg;
    pthread_mutex_lock(&n->ctl_mu);
    bool stop_reading = n->want_stop_reading && !n->stopped_reading;
    bool finish = n->want_finish;
    pthread_mutex_unlock(&n->ctl_mu);
    if (stop_reading) {
        if (n->lev) {
            event_free(n->lev);
            n->lev = NULL;
        }
        close(n->listen_fd);
        n->listen_fd = -1;
        if (n->ulev) {
            event_free(n->ulev);
            n->ulev = NULL;
        }
        if (n->unix_fd >= 0) close(n->unix_fd);
        n->unix_fd = -1;
        for (srv_conn *c = n->conns; c; c = c->next)
            if (c->state == C_OPEN) enter_drain(c);
        pthread_mutex_lock(&n->ctl_mu);
        n->stopped_reading = true;
        pthread_cond_broadcast(&n->ctl_cv);
        pthread_mutex_unlock(&n->ctl_mu);
    }
    if (finish) {
        for (srv_conn *c = n->conns, *nx; c; c = nx) {
            nx = c->next;
            conn_pump(c);
        }
        if (!n->conns) event_base_loopbreak(n->base);
    }
}

static void *loop_main(void *arg)
{
    srv_net *n = arg;
    gr_thread_want_slice_us(n->cfg.slice_us, "server: the connection loop");
    event_base_dispatch(n->base);
    return NULL;
}

/* ---- lifecycle ---- */

static pthread_once_t evthread_once = PTHREAD_ONCE_INIT;
static void evthread_init(void) { evthread_use_pthreads(); }

static int listen_on(srv_net *n, const char *host, uint16_t port)
{
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gai = getaddrinfo(host, ps, &hints, &res);
    if (gai != 0)
        return gr_seterr(GR_EINVAL, "cannot resolve listen address %s: %s", host,
                         gai_strerror(gai));
    int err = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                        ai->ai_protocol);
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
            n->port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                     : ((struct sockaddr_in *)&sa)->sin_port);
            n->listen_fd = fd;
            freeaddrinfo(res);
            return GR_OK;
        }
        err = errno;
        close(fd);
    }
    freeaddrinfo(res);
    return gr_seterr(GR_EIO, "cannot listen on %s:%u: %s", host, port, strerror(err));
}

/* The abstract AF_UNIX listener for clients on this machine (the embedded cluster's own
 * trainer): the same protocol without the TCP stack. Abstract names need no file and vanish
 * with the socket. */
static int listen_unix(srv_net *n, const char *name)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t len = strlen(name);
    if (len == 0 || len + 1 > sizeof sa.sun_path)
        return gr_seterr(GR_EINVAL, "unix socket name '%s' is empty or too long", name);
    memcpy(sa.sun_path + 1, name, len); /* sun_path[0] = 0: abstract */
    socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return gr_seterr(GR_EIO, "cannot create a unix socket: %s", strerror(errno));
    if (bind(fd, (struct sockaddr *)&sa, sl) != 0 || listen(fd, 128) != 0) {
        int err = errno;
        close(fd);
        return gr_seterr(GR_EIO, "cannot listen on unix:@%s: %s", name, strerror(err));
    }
    n->unix_fd = fd;
    return GR_OK;
}

static uint32_t sweep_ms(const srv_net_config *cfg)
{
    uint32_t m = cfg->send_timeout_ms;
    if (cfg->frame_timeout_ms < m) m = cfg->frame_timeout_ms;
    if (cfg->auth_required && cfg->auth_timeout_ms < m) m = cfg->auth_timeout_ms;
    if (cfg->idle_timeout_ms && cfg->idle_timeout_ms < m) m = cfg->idle_timeout_ms;
    m /= 10;
    return m < 5 ? 5 : m > 100 ? 100 : m;
}

int srv_net_create(const srv_net_config *cfg, const srv_net_callbacks *cb, const char *host,
                   uint16_t port, srv_net **out)
{
    *out = NULL;
    pthread_once(&evthread_once, evthread_init);
    srv_net *n = calloc(1, sizeof *n);
    if (!n) return gr_seterr(GR_ENOMEM, "cannot allocate the connection loop");
    n->cfg = *cfg;
    n->cb = *cb;
    n->listen_fd = -1;
    n->unix_fd = -1;
    n->cfg.unix_name = NULL; /* the caller's string: only used during create */
    pthread_mutex_init(&n->reap_mu, NULL);
    pthread_mutex_init(&n->ctl_mu, NULL);
    pthread_cond_init(&n->ctl_cv, NULL);
    int rc = listen_on(n, host, port);
    if (!rc && cfg->unix_name) {
        snprintf(n->unix_name, sizeof n->unix_name, "%s", cfg->unix_name);
        n->cfg.unix_name = n->unix_name;
        rc = listen_unix(n, n->unix_name);
    }
    if (rc) {
        srv_net_destroy(n);
        return rc;
    }
    n->base = event_base_new();
    if (n->base) {
        n->lev = event_new(n->base, n->listen_fd, EV_READ | EV_PERSIST, accept_cb, n);
        if (n->unix_fd >= 0)
            n->ulev = event_new(n->base, n->unix_fd, EV_READ | EV_PERSIST, accept_cb, n);
        n->sweep = event_new(n->base, -1, EV_PERSIST, sweep_cb, n);
        n->budget_ev = event_new(n->base, -1, 0, budget_cb, n);
        n->reap_ev = event_new(n->base, -1, 0, reap_cb, n);
        n->ctl_ev = event_new(n->base, -1, 0, ctl_cb, n);
    }
    if (!n->base || !n->lev || !n->sweep || !n->budget_ev || !n->reap_ev || !n->ctl_ev ||
        (n->unix_fd >= 0 && !n->ulev)) {
        srv_net_destroy(n);
        return gr_seterr(GR_ENOMEM, "cannot create the connection event loop");
    }
    uint32_t ms = sweep_ms(cfg);
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    event_add(n->lev, NULL);
    if (n->ulev) event_add(n->ulev, NULL);
    event_add(n->sweep, &tv);
    *out = n;
    return GR_OK;
}

uint16_t srv_net_port(const srv_net *n) { return n->port; }
srv_net_stats *srv_net_counters(srv_net *n) { return &n->st; }

int srv_net_start(srv_net *n)
{
    if (pthread_create(&n->thread, NULL, loop_main, n) != 0)
        return gr_seterr(GR_EINTERNAL, "cannot start the connection thread");
    n->running = true;
    return GR_OK;
}

void srv_net_stop_reading(srv_net *n)
{
    if (!n->running) return;
    pthread_mutex_lock(&n->ctl_mu);
    n->want_stop_reading = true;
    event_active(n->ctl_ev, EV_READ, 0);
    while (!n->stopped_reading) pthread_cond_wait(&n->ctl_cv, &n->ctl_mu);
    pthread_mutex_unlock(&n->ctl_mu);
}

void srv_net_stop(srv_net *n)
{
    if (!n->running) return;
    srv_net_stop_reading(n);
    pthread_mutex_lock(&n->ctl_mu);
    n->want_finish = true;
    pthread_mutex_unlock(&n->ctl_mu);
    event_active(n->ctl_ev, EV_READ, 0);
    pthread_join(n->thread, NULL);
    n->running = false;
    reap_cb(-1, 0, n);
}

void srv_net_destroy(srv_net *n)
{
    if (!n) return;
    srv_net_stop(n);
    /* Connections still open (never started, or a stop that did not run) go here. */
    for (srv_conn *c = n->conns, *nx; c; c = nx) {
        nx = c->next;
        conn_free(c);
    }
    reap_cb(-1, 0, n);
    if (n->lev) event_free(n->lev);
    if (n->ulev) event_free(n->ulev);
    if (n->sweep) event_free(n->sweep);
    if (n->budget_ev) event_free(n->budget_ev);
    if (n->reap_ev) event_free(n->reap_ev);
    if (n->ctl_ev) event_free(n->ctl_ev);
    if (n->base) event_base_free(n->base);
    if (n->listen_fd >= 0) close(n->listen_fd);
    if (n->unix_fd >= 0) close(n->unix_fd);
    pthread_mutex_destroy(&n->reap_mu);
    pthread_mutex_destroy(&n->ctl_mu);
    pthread_cond_destroy(&n->ctl_cv);
    free(n);
}
