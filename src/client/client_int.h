/* Internal to the client part: connections (conn.c) and operations (client.c).
 * An operation (gr_client_op) is a set of requests (cl_req), one or more per shard; each
 * request is owned by exactly one party at a time: the sender until it is registered in its
 * connection's pending list, then whoever removes it from that list (the connection's reader
 * on a reply, the reader on a connection failure, or a waiter cancelling at the deadline) —
 * that party completes it, exactly once. */
#ifndef GRANARY_CLIENT_INT_H
#define GRANARY_CLIENT_INT_H

#include "granary/client.h"
#include "granary/proto.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct cl_piece {
    uint32_t bi;          /* batch (table) index in the op */
    uint32_t count;       /* unique keys in this section */
    const uint32_t *uidx; /* their unique indices, in the order sent */
} cl_piece;

typedef struct cl_req {
    struct cl_req *next; /* pending list of its connection */
    uint64_t id;
    struct gr_client_op *op;
    uint32_t shard;
    uint16_t opcode;
    uint16_t flags;
    cl_piece *pieces;
    uint32_t npieces;
    gr_proto_buf frame;
    /* Result, written by whoever completes the request. */
    bool done;
    int rc;
    char msg[320];
    uint8_t *reply; /* control ops: the reply body (malloc'd) */
    size_t reply_len;
} cl_req;

typedef struct cl_conn {
    struct gr_client *cl;
    uint32_t shard;
    char addr[300];  /* "host:port" */
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
} cl_conn;

struct gr_client {
    gr_client_config cfg;
    uint8_t *secret;
    size_t secret_len;
    uint32_t nshards;
    cl_conn *conns;
    atomic_uint_fast64_t next_id;
    atomic_uint_fast64_t requests, bytes_sent, bytes_received, keys_in, keys_sent, reconnects;
};

/* conn.c */
int cl_conn_init(cl_conn *k, gr_client *cl, uint32_t shard, const char *addr);
void cl_conn_fini(cl_conn *k);
/* Connects (with backoff up to the connect timeout) unless already connected. */
int cl_conn_ensure(cl_conn *k);
/* Registers r as pending and writes its frame. 0: the request now belongs to the connection
 * machinery and will be completed exactly once. Negative: it was not sent (the caller still
 * owns it; r->msg says why). */
int cl_conn_send(cl_conn *k, cl_req *r);
/* Removes r from the pending list if it is still there; true when this call took it. */
bool cl_conn_claim(cl_conn *k, cl_req *r);

/* client.c: completes a request (sets its result, counts the op down). */
void cl_req_complete(cl_req *r, int rc, const char *msg);
/* client.c: handles a reply body for r (already claimed); returns 0 or an error with a
 * message (which is then the request's result). fatal is set when the reply itself is
 * malformed (the connection is then dropped). */
int cl_req_handle_reply(cl_req *r, const gr_proto_header *h, uint8_t *body, bool *fatal);

#endif
