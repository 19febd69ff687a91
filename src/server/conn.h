/* The shard's connection I/O: one event-loop thread (libevent) accepts connections, reads
 * frames without blocking, enforces every per-connection deadline and budget, and flushes
 * replies that did not fit in the socket. It knows nothing of opcodes or tables: a complete,
 * header-checked request frame is handed to the `frame` callback, and a peer that hung up is
 * reported to `closed`; it calls nothing else of the server (docs/server.md, "Connections").
 *
 * Replies are written by whichever thread finishes a request (srv_conn_send): straight into
 * the socket without blocking when nothing is queued before it (no thread hop), otherwise
 * queued and written by the loop with writev. No thread ever blocks on a peer's socket. */
#ifndef GRANARY_SERVER_CONN_H
#define GRANARY_SERVER_CONN_H

#include "granary/proto.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct srv_conn srv_conn;
typedef struct srv_net srv_net;

typedef struct srv_net_config {
    gr_proto_limits limits;      /* header checks (max_body) once authenticated */
    uint32_t preauth_max_body;   /* body limit before authentication (auth_required only) */
    bool auth_required;
    uint32_t max_connections;
    uint32_t max_inflight;       /* requests read and not done, per connection */
    uint64_t max_inflight_bytes; /* their bodies + queued reply bytes, per connection */
    uint64_t max_total_inflight_bytes; /* request bodies in flight over all connections */
    uint32_t send_timeout_ms;    /* a queued reply must be written within this */
    uint32_t frame_timeout_ms;   /* a started frame must be complete within this */
    uint32_t auth_timeout_ms;    /* from accept to authenticated (auth_required only) */
    uint32_t idle_timeout_ms;    /* nothing in flight and nothing received: close; 0 = never */
    unsigned shard;              /* for log lines */
    /* Also listen on this abstract AF_UNIX name ("@name"; no file): clients on this machine
     * skip the TCP stack. NULL = TCP only. Copied by srv_net_create. */
    const char *unix_name;
    uint32_t slice_us;           /* the loop thread's time slice; 0 = the kernel's default */
} srv_net_config;

/* The net's counters, read by STATS. */
typedef struct srv_net_stats {
    atomic_uint_fast64_t conns_total, conns_rejected, bad_frames, reaped, dropped_slow;
    atomic_uint_fast64_t total_inflight_bytes;
    atomic_uint nconns;
} srv_net_stats;

typedef struct srv_net_callbacks {
    void *ctx;
    /* A whole request frame: header checked against the limits (kind, version, size, status
     * 0); body is malloc'd (never NULL) and owned by the callee. Runs on the loop thread and
     * must not block. The request holds one in-flight slot and a reference on c until the
     * callee calls srv_conn_done(c, h->body_len) exactly once. */
    void (*frame)(void *ctx, srv_conn *c, const gr_proto_header *h, uint8_t *body);
    /* The peer hung up or the connection was dropped (not at a server stop): whatever is
     * parked for c should be cancelled now (its srv_conn_done still follows). Loop thread. */
    void (*closed)(void *ctx, srv_conn *c);
} srv_net_callbacks;

/* Binds host:port (0 = any free port) and creates the net, not yet running. */
int srv_net_create(const srv_net_config *cfg, const srv_net_callbacks *cb, const char *host,
                   uint16_t port, srv_net **out);
uint16_t srv_net_port(const srv_net *n);
srv_net_stats *srv_net_counters(srv_net *n);
/* Starts the loop thread. */
int srv_net_start(srv_net *n);
/* Stops accepting and reading (no frame is delivered after this returns); requests already
 * delivered are still answered. */
void srv_net_stop_reading(srv_net *n);
/* Waits until every connection has no request in flight and no reply queued (or has been
 * dropped by its send deadline), closes them all and joins the loop thread. */
void srv_net_stop(srv_net *n);
/* Frees a stopped (or never started) net. NULL is a no-op. */
void srv_net_destroy(srv_net *n);

/* Per-connection authentication state, kept by the server's HELLO/AUTH handlers. */
typedef struct srv_conn_auth {
    bool hello_done;
    uint8_t nonce[GR_PROTO_NONCE_SIZE];
} srv_conn_auth;

const char *srv_conn_peer(const srv_conn *c);
srv_conn_auth *srv_conn_auth_state(srv_conn *c);
bool srv_conn_authed(const srv_conn *c);
/* Marks c authenticated: the full body limit applies, the auth deadline no longer does. */
void srv_conn_set_authed(srv_conn *c);

/* References: a parked request or a job keeps c alive (the frame's own reference lasts until
 * srv_conn_done). Any thread. */
void srv_conn_get(srv_conn *c);
void srv_conn_put(srv_conn *c);
/* Ends a delivered request: frees its in-flight slot and budget, drops its reference. */
void srv_conn_done(srv_conn *c, uint32_t body_len);

/* Sends one whole frame (out->data, out->len); never blocks. What the socket does not take now
 * is queued and written by the loop; with may_take, out->data is taken over instead of copied
 * when that saves a large copy (out is then left empty). A dead connection drops the frame.
 * Returns the bytes accepted (out->len, or 0 when dropped). Any thread. */
size_t srv_conn_write(srv_conn *c, gr_proto_buf *out, bool may_take);
/* Sends an error reply. fatal: then close the connection once it is written (the peer did
 * not speak the protocol); reading stops at once. */
void srv_conn_write_error(srv_conn *c, uint16_t op, uint64_t id, int rc, const char *msg,
                          bool fatal);
/* The callbacks' ctx (the server), for code that holds only a connection. */
void *srv_conn_ctx(const srv_conn *c);

#endif
