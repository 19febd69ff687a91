/* Internal to the client part: one connection per shard (conn.c), and the request it carries.
 * This is the bottom of the client: it knows frames and sockets, and nothing about operations,
 * batches or what a reply means. A request brings its own reply handler and completion, so
 * the reader thread finishes it without calling anything above this module.
 *
 * Ownership: a request belongs to its sender until cl_conn_send registers it in the
 * connection's pending list, then to whoever removes it from that list (the reader on a reply
 * or a connection failure, or a waiter cancelling at its deadline with cl_conn_claim); that
 * party calls its on_done exactly once. */
#ifndef GRANARY_CLIENT_CONN_H
#define GRANARY_CLIENT_CONN_H

#include "granary/client.h"
#include "granary/proto.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct cl_req cl_req;

/* Decodes a successful reply (status >= 0, opcode already checked) into the request's
 * destination. Returns 0 or an error with a message, which becomes the request's result;
 * *fatal when the reply itself is malformed (the connection is then dropped). NULL: the reply
 * body is kept in r->reply for the caller to read after the wait. */
typedef int (*cl_reply_fn)(cl_req *r, const gr_proto_header *h, uint8_t *body, bool *fatal);
/* Records the request's result (rc, and a message when rc < 0). Called exactly once. */
typedef void (*cl_done_fn)(cl_req *r, int rc, const char *msg);

/* A successful reply's body still in the socket, for a handler that consumes it as it arrives
 * (a pull scatters rows from a cache-sized scratch buffer instead of first landing the whole
 * body in memory). The body is received into the scratch buffer as much at a time as it holds
 * (never past the body's end), and the handler takes its pieces from there: the small
 * headers cost no system call of their own. */
typedef struct cl_body {
    int fd;
    size_t left;          /* body bytes not received from the socket yet */
    uint64_t deadline_ns; /* the request's deadline: a body that stalls past it fails */
    uint8_t *scratch;     /* the connection's scratch buffer, 8-byte aligned */
    size_t scratch_cap;
    size_t pos, end;      /* scratch[pos, end): received and not taken yet */
    uint64_t read_ns;     /* CPU time spent in receives */
    bool failed;          /* a receive failed: the stream is broken */
} cl_body;
/* Makes at least n (<= scratch_cap) bytes available (cl_body_avail), receiving as many more
 * as fit. GR_ECONN when the connection fails, GR_ETIMEDOUT past the deadline, GR_EPROTO past
 * the body's end; then the body is failed. */
int cl_body_fill(cl_body *b, size_t n);
/* Bytes received and not taken yet. */
static inline size_t cl_body_avail(const cl_body *b) { return b->end - b->pos; }
/* The next n (<= cl_body_avail) bytes, taken: valid until the next cl_body_fill. The pointer
 * is 4-byte aligned when every piece taken so far was a multiple of 4 bytes. */
static inline const uint8_t *cl_body_take(cl_body *b, size_t n)
{
    const uint8_t *p = b->scratch + b->pos;
    b->pos += n;
    return p;
}
/* Consumes a successful reply (status >= 0, opcode checked) from the socket: it must read the
 * whole body or fail; any failure drops the connection (the stream is mid-frame). */
typedef int (*cl_stream_fn)(cl_req *r, const gr_proto_header *h, cl_body *body);

struct cl_req {
    cl_req *next; /* pending list of its connection */
    uint64_t id;
    uint32_t shard;
    uint32_t tag; /* the builder's own index (a batch plan's request number) */
    uint16_t opcode;
    uint32_t epoch; /* the layout epoch cl_conn_send stamped on the frame */
    gr_proto_buf frame;
    cl_reply_fn on_reply;
    cl_stream_fn on_stream; /* when set, used instead of on_reply */
    cl_done_fn on_done;
    uint64_t deadline_ns;   /* when a streamed reply must have arrived (monotonic) */
    void *ctx; /* the operation it belongs to */
    /* Result, written by whoever completes the request. */
    bool done;
    int rc;
    char msg[320];
    uint8_t *reply; /* on_reply NULL: the reply body (malloc'd) */
    size_t reply_len;
};

/* What every connection of one client shares: its settings and counters. */
typedef struct cl_link {
    gr_client_config cfg; /* timeouts, any_shard */
    uint8_t *secret;
    size_t secret_len;
    uint32_t nshards;
    atomic_uint epoch; /* stamped on every request at send (0: not coordinated) */
    /* Called on a waiting thread when requests were refused as stale (op.c); NULL: none. Set
     * before the client is shared between threads. */
    gr_client_stale_fn stale_fn;
    void *stale_ctx;
    atomic_uint_fast64_t next_id;
    atomic_uint_fast64_t requests, bytes_sent, bytes_received, reconnects;
    atomic_uint_fast64_t send_ns, recv_ns; /* time in frame writes and reply-body reads */
} cl_link;

typedef struct cl_conn {
    cl_link *link;
    uint32_t shard;
    char addr[300]; /* "host:port" */
    char host[256];
    char port[8];
    pthread_mutex_t connect_mu; /* serialises (re)connects; taken before mu and wlock */
    pthread_mutex_t wlock;      /* serialises frame writes; taken before mu */
    pthread_mutex_t mu;         /* guards fd, broken, pending */
    int fd;
    bool broken;      /* the reader saw an error: reconnect before the next send */
    bool reader_live; /* a reader thread exists (joinable) */
    bool ever_connected;
    pthread_t reader;
    cl_req *pending;
    gr_proto_limits limits; /* the server's, from hello */
    char server_error[256]; /* an id-0 error frame from the server (e.g. connection refused) */
    uint8_t *rbuf;          /* the reader's body buffer */
    size_t rcap;
    uint8_t *sbuf;          /* the reader's scratch for streamed replies (CL_SCRATCH_BYTES) */
} cl_conn;

/* Streamed replies pass through this much at a time: small enough to stay in L2 between the
 * kernel's copy and the scatter that reads it. */
#define CL_SCRATCH_BYTES (256u << 10)

int cl_conn_init(cl_conn *k, cl_link *link, uint32_t shard, const char *addr);
void cl_conn_fini(cl_conn *k);
/* Points the connection at another "host:port": closes the current socket (the reader fails
 * what is pending) so the next cl_conn_ensure connects there. */
int cl_conn_set_addr(cl_conn *k, const char *addr);
/* Connects (with backoff up to the connect timeout) unless already connected. */
int cl_conn_ensure(cl_conn *k);
/* True when the connection is up right now (no connect attempted). */
bool cl_conn_is_up(cl_conn *k);
/* Registers r as pending, stamps the link's epoch on its frame and writes it. 0: the request now belongs to the connection
 * machinery and will be completed exactly once. Negative: it was not sent (the caller still
 * owns it; r->msg says why). */
int cl_conn_send(cl_conn *k, cl_req *r);
/* Removes r from the pending list if it is still there; true when this call took it. */
bool cl_conn_claim(cl_conn *k, cl_req *r);
/* The message of an error frame's body, or a placeholder. */
void cl_error_text(const uint8_t *body, size_t len, char *out, size_t cap);

#endif
