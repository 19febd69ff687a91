/* Internal to the server part: the gr_server struct, connections, the table registry and the
 * dispatcher's entry point. server.c owns threads and sockets, registry.c the tables,
 * dispatch.c joins proto to table (the only file that does). */
#ifndef GRANARY_SERVER_INT_H
#define GRANARY_SERVER_INT_H

#include "granary/server.h"
#include "server/conn.h"

#include <pthread.h>
#include <stdatomic.h>

/* One table or dense parameter. Reference counted so DROP_TABLE never frees a table a worker
 * is using: the registry holds one reference, every user takes one under the registry lock. */
typedef struct srv_entry {
    char name[GR_TABLE_NAME_MAX];
    uint32_t id;
    bool dense;
    uint64_t dense_size; /* floats (dense only) */
    uint32_t chunk;      /* floats per chunk row = the table's dim (dense only) */
    gr_table *table;
    atomic_int refs;
} srv_entry;

typedef struct srv_registry {
    pthread_rwlock_t lock;
    srv_entry **items;
    size_t n, cap;
    uint32_t max;
} srv_registry;

int srv_registry_init(srv_registry *r, uint32_t max);
void srv_registry_fini(srv_registry *r);
/* Finds a table (dense == false) by id, or by name (id ignored when name != NULL), and takes a
 * reference. NULL when absent. */
srv_entry *srv_registry_get(srv_registry *r, bool dense, const char *name, uint32_t id);
void srv_entry_put(srv_entry *e);
/* Adds a table or dense parameter built from spec; an equal existing one is *created = false. */
int srv_registry_add(srv_registry *r, const gr_table_spec *spec, bool dense, uint64_t dense_size,
                     bool *created);
/* Removes by name; GR_ENOENT when absent. */
int srv_registry_drop(srv_registry *r, bool dense, const char *name);
/* A snapshot of every entry with a reference taken on each; free with srv_registry_release. */
int srv_registry_snapshot(srv_registry *r, srv_entry ***out, size_t *n);
void srv_registry_release(srv_entry **items, size_t n);

/* Per-opcode request counters (atomic: workers and readers update them concurrently). */
typedef struct srv_op_stats {
    atomic_uint_fast64_t count, errors, keys, bytes_in, bytes_out;
} srv_op_stats;

typedef struct srv_sync srv_sync; /* sync.c: the shard's sync job and its parked acquires */

/* Where an opcode runs (server.c's table of operations, op_rows): on the connection loop
 * (short, never blocking), on the worker pool, answered or parked by the sync job, or on the
 * checkpoint thread. */
typedef enum srv_where {
    SRV_RUN_NONE, /* not an opcode */
    SRV_RUN_LOOP,
    SRV_RUN_POOL,
    SRV_RUN_PARKED,
    SRV_RUN_CKPT,
} srv_where;
srv_where srv_op_where(unsigned op);

struct gr_server {
    gr_server_config cfg;
    char host[256];
    uint8_t *secret;
    uint16_t port;
    int stop_pipe[2];   /* gr_server_request_stop writes here; gr_server_wait reads */
    bool owns[GR_SLOTS];
    srv_registry reg;
    srv_net *net;       /* conn.c: the connection loop */

    pthread_mutex_t q_mu; /* guards the work queue */
    pthread_cond_t q_cv;
    struct srv_job *q_head, *q_tail;
    size_t q_len;
    bool q_closed;

    pthread_t *workers;
    uint32_t nworkers;
    bool started, stopped;
    atomic_bool stopping;

    srv_op_stats ops[GR_PROTO_OP_LIMIT];
    atomic_uint_fast64_t bad_frames, auth_failures; /* beyond the loop's own counts */
    atomic_uint_fast64_t inflight;
    uint64_t start_ns;
    srv_sync *sync;
    struct srv_ckpt *ckpt; /* ckpt.c: checkpoint requests and their thread */
};

/* What a connection's state means to the dispatcher. */
typedef struct srv_conn_view {
    const char *peer;
} srv_conn_view;

/* Runs one request that needs no connection state. Writes a complete response frame to out
 * and returns 0, or returns a negative gr_err (message in gr_errmsg()) and the caller writes
 * the error frame. *fatal is set when the body could not be decoded (the connection is then
 * closed after the error reply). *stop is set by SHUTDOWN. */
int srv_dispatch(gr_server *s, const gr_proto_header *h, const uint8_t *body, gr_proto_buf *out,
                 bool *fatal, bool *stop);

/* The STATS body (JSON); malloc'd. */
char *srv_stats_json(gr_server *s);

/* Creates a dense parameter from its JSON spec. */
int srv_dense_create_json(gr_server *s, const char *json, size_t len, bool *created);

/* server.c: replies sent after the request's own handler returned (parked SYNC_ACQUIREs,
 * checkpoints): never block; bytes_out of op is counted. */
void srv_conn_send(srv_conn *c, const void *frame, size_t n, unsigned op);
void srv_conn_send_error(srv_conn *c, uint16_t op, uint64_t id, int rc, const char *msg);

/* sync.c: the sync job (SYNC_CONFIG, SYNC_ACQUIRE, PUSH_STEP, SYNC_LEAVE, DENSE_SET).
 * create/destroy with the server; start with its threads; stop (after the worker pool has
 * drained) answers every parked acquire with GR_ESHUTDOWN. */
int srv_sync_create(gr_server *s);
int srv_sync_start(gr_server *s);
void srv_sync_stop(gr_server *s);
void srv_sync_destroy(gr_server *s);
/* SYNC_ACQUIRE, run by the connection's reader: replies now, or parks the request (holding a
 * reference on c) to be answered when the step may start, at its timeout, or at stop. Returns
 * an error for the caller to send; *fatal when the body does not decode. */
int srv_sync_acquire(gr_server *s, struct srv_conn *c, const gr_proto_header *h,
                     const uint8_t *body, bool *fatal);
/* The peer of c hung up: its parked acquires are dropped now (no reply, nobody reads it). */
void srv_sync_conn_closed(gr_server *s, srv_conn *c);
/* The other sync opcodes, run by the worker pool like any dispatch handler. */
int srv_sync_op(gr_server *s, const gr_proto_header *h, const uint8_t *body, gr_proto_buf *out,
                bool *fatal);
/* Adds the "sync" object to the STATS JSON (root is a cJSON object). */
void srv_sync_stats_json(gr_server *s, void *root);
/* The installed sync job's step G (checkpoints report it); false when no job is installed. */
bool srv_sync_step(gr_server *s, uint64_t *step);

/* registry.c: installs table t (ownership passes on success) under spec->name, replacing the
 * entry of that name and kind (users of the old one keep it until they release it) or adding
 * one. GR_EEXIST when a new sparse table's id is another table's. */
int srv_registry_replace(srv_registry *r, const gr_table_spec *spec, gr_table *t, bool dense,
                         uint64_t dense_size);

/* ckpt.c: CKPT_SAVE, CKPT_COMMIT and CKPT_LOAD run on the shard's checkpoint thread (started on
 * first use), so no pool thread or reader waits for the disk. srv_ckpt_op says whether an
 * opcode is one of them; submit takes body (always) and, once the body decodes, a reference on
 * c, and answers the request when it has run (or at once with an error) and returns 0; it
 * returns an error, answering nothing, when the body does not decode (the caller then fails
 * the connection). stop finishes the running request and refuses the queued ones. */
typedef struct srv_ckpt srv_ckpt;
bool srv_ckpt_op(unsigned op);
int srv_ckpt_create(gr_server *s);
int srv_ckpt_submit(gr_server *s, struct srv_conn *c, const gr_proto_header *h, uint8_t *body);
void srv_ckpt_stop(gr_server *s);
void srv_ckpt_destroy(gr_server *s);
/* Adds the "ckpt" object to the STATS JSON (root is a cJSON object). */
void srv_ckpt_stats_json(gr_server *s, void *root);

#endif
