/* Internal to the server part: the gr_server struct, the table of operations and the handler
 * contract, the module interface, the table registry. docs/server.md has a line on each file:
 * conn.c owns sockets, server.c the life cycle and the pool, ops.c says where each opcode
 * runs, dispatch.c joins proto to table (the only file that does). */
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
    uint64_t huge_rows; /* gr_server_config.huge_rows: each new sparse table's (0 = all huge) */
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

typedef struct srv_sync srv_sync; /* sync_job.c: the shard's sync job and its parked acquires */

/* One request as a pool handler sees it. A handler decodes body, checks it, runs it and writes
 * the whole response frame to out (from out->len on) and returns 0; or returns a negative
 * gr_err (message in gr_errmsg()) and the caller writes the error. It sets *fatal when the
 * body could not be decoded (the connection is closed after the error), *stop for SHUTDOWN. */
typedef struct srv_req {
    gr_server *s;
    const gr_proto_header *h;
    const uint8_t *body;
    size_t len;
    gr_proto_buf *out;
    size_t start; /* offset of the response frame in out */
    bool *fatal, *stop;
} srv_req;
typedef int (*srv_handle_fn)(srv_req *r);
/* A handler that owns body and answers by itself, now or later (it holds a reference on c
 * for later). Runs on the connection loop: it must not block. */
typedef void (*srv_take_fn)(gr_server *s, srv_conn *c, const gr_proto_header *h, uint8_t *body);

/* Where an opcode runs (ops.c explains each). */
typedef enum srv_where {
    SRV_RUN_NONE, /* not an opcode */
    SRV_RUN_LOOP,
    SRV_RUN_POOL,
    SRV_RUN_PARKED,
    SRV_RUN_CKPT,
} srv_where;

/* What a coordination fence (fence.c) stops: NEVER for the handshake, stats and shutdown,
 * which a fenced shard must still answer; WRITE for everything that changes tables, the sync
 * job or checkpoint files; READ for pulls, which only a full fence stops. Every fenced row is
 * also checked against the shard's layout epoch. */
typedef enum srv_fence_class { SRV_FENCE_NEVER, SRV_FENCE_WRITE, SRV_FENCE_READ } srv_fence_class;

/* ops.c: the table of operations, one row per opcode. */
typedef struct srv_op_row {
    srv_where where;
    srv_fence_class fence;
    uint16_t flags;       /* header flag bits this opcode accepts; the others must be 0 */
    bool preauth;         /* allowed before authentication */
    uint32_t inline_body; /* POOL rows: a body of at most this many bytes runs on the loop
                             instead (no thread hop for a small pull); 0 = never */
    srv_handle_fn handle; /* builds the reply (LOOP, POOL) */
    srv_take_fn take;     /* or answers by itself (LOOP, PARKED, CKPT) */
} srv_op_row;
/* The row of op; NULL when op is not a request this server knows. */
const srv_op_row *srv_op_row_of(unsigned op);

/* A part with its own state (and maybe threads) that plugs into the shard's life cycle: the
 * sync job (sync_job.c) and checkpoints (ckpt.c). server.c walks srv_modules to create, start,
 * stop (after the worker pool drained: answer whatever is still parked or queued), destroy,
 * and to tell each about a peer that hung up; stats.c walks it for the STATS JSON. */
typedef struct srv_module {
    const char *name;
    int (*create)(gr_server *s);
    int (*start)(gr_server *s); /* NULL: nothing to start */
    void (*stop)(gr_server *s);
    void (*destroy)(gr_server *s);
    void (*stats_json)(gr_server *s, void *root); /* adds its object to the cJSON root */
    void (*conn_closed)(gr_server *s, srv_conn *c); /* NULL: holds nothing per connection */
} srv_module;
extern const srv_module srv_sync_module, srv_ckpt_module, srv_publish_module, srv_grow_module;
extern const srv_module *const srv_modules[];
extern const size_t srv_nmodules;

struct gr_server {
    gr_server_config cfg;
    char host[256];
    uint8_t *secret;
    uint16_t port;
    char local_addr[64]; /* "unix:@granary-PID-N" with cfg.local_socket, else "" */
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
    struct srv_publish *publish; /* publish.c: publications to serving replicas */
    struct srv_grow *grow; /* grow.c: row memory ahead of growing tables (NULL: off) */
    atomic_uint epoch;     /* fence.c: the layout epoch this shard serves (0: not coordinated) */
    atomic_int fence;      /* fence.c: a gr_server_fence */
    atomic_uint_fast64_t lease_ns; /* fence.c: past this monotonic time, fenced (0: no lease) */
    _Atomic(struct gr_server_join *) join; /* join.c: set while the shard is in a coordinated job */
    /* metrics.c: cfg.metrics's series of this shard: request latency per opcode (observed by
     * run_request; NULL without a registry), and whether the collector is installed. */
    gr_metric *latency[GR_PROTO_OP_LIMIT];
    struct srv_metrics *mx; /* the mirrored families (metrics.c) */
    bool metrics_on;
};

/* grow.c: a table operation ran; wakes the grow thread (no-op without one). */
void srv_grow_kick(gr_server *s);

/* fence.c: "epoch", "fence" and, in a coordinated job, the join's "coord" object, into the
 * STATS JSON root (a cJSON *). */
void srv_fence_stats_json(gr_server *s, void *root);
/* join.c: the join's object. */
void srv_join_stats_json(struct gr_server_join *j, void *obj);

/* fence.c: the epoch and fence checks of a request with a usable row, on the loop before it
 * runs. 0, or GR_ESTALE with msg (cap bytes) saying why; nothing has run. */
int srv_fence_check(gr_server *s, const srv_op_row *row, const gr_proto_header *h, char *msg,
                    size_t cap);

/* checks.c: what every handler checks before it changes anything. Keys of sec owned by this
 * shard (GR_ESTALE names the first stray key); a dense parameter looked up with a reference
 * taken (NULL with *rc GR_ESTALE when another shard owns it, GR_ENOENT when absent); the index
 * of the first value that is not finite (n when all are), and that as a GR_EINVAL naming
 * what. */
int srv_check_routing(const gr_server *s, const gr_proto_section *sec);
srv_entry *srv_get_dense(gr_server *s, const char *name, int *rc);
size_t srv_first_nonfinite(const float *v, size_t n);
int srv_check_finite(const float *v, size_t n, const char *what);

/* dispatch.c: a dense parameter's values through its chunk rows: all of them into room
 * (chunks x chunk floats, the last chunk's padding included), and a gradient of its
 * dense_size floats applied by its optimizer (the last chunk padded with zeros). */
int srv_dense_lookup(srv_entry *e, float *room);
int srv_dense_apply(srv_entry *e, const float *grad);

/* direct.c: what a direct call is checked for before it runs, as a request is on the loop:
 * counted as a request of op, the shard started and not stopping (GR_ESHUTDOWN), its fence
 * (GR_ESTALE); a refusal is counted as an error. */
int srv_direct_admit(gr_server *s, uint16_t op);

/* stats.c: the STATS document (a cJSON object to delete; NULL when out of memory), its text
 * (the STATS body, malloc'd) and the STATS handler. */
void *srv_stats_build(gr_server *s);
char *srv_stats_json(gr_server *s);
int srv_stats_op(srv_req *r);

/* metrics.c: declares the shard's series in cfg.metrics (no-op without one) and installs the
 * collector that copies the STATS document into them at each scrape (started servers only);
 * fini removes it (before the connection loop goes away). */
int srv_metrics_init(gr_server *s);
int srv_metrics_attach(gr_server *s);
void srv_metrics_fini(gr_server *s);

/* session.c: HELLO and AUTH (take handlers, on the loop). */
void srv_session_hello(gr_server *s, srv_conn *c, const gr_proto_header *h, uint8_t *body);
void srv_session_auth(gr_server *s, srv_conn *c, const gr_proto_header *h, uint8_t *body);

/* dispatch.c: the handlers that join proto to table. */
int srv_op_create_table(srv_req *r);
int srv_op_describe(srv_req *r);
int srv_op_drop_table(srv_req *r);
int srv_op_pull(srv_req *r);
int srv_op_push(srv_req *r);
int srv_op_push_pull(srv_req *r);
int srv_op_dense_create(srv_req *r);
int srv_op_dense_pull(srv_req *r);
int srv_op_dense_push(srv_req *r);
int srv_op_delete(srv_req *r);
int srv_op_evict(srv_req *r);
int srv_op_shutdown(srv_req *r);
/* Creates a dense parameter from its JSON spec. */
int srv_dense_create_json(gr_server *s, const char *json, size_t len, bool *created);

/* reply.c: replies sent after the request's own handler returned (parked SYNC_ACQUIREs,
 * checkpoints): never block; bytes_out of op is counted. */
void srv_conn_send(srv_conn *c, const void *frame, size_t n, unsigned op);
void srv_conn_send_error(srv_conn *c, uint16_t op, uint64_t id, int rc, const char *msg);

/* sync_job.c: the sync job (module srv_sync_module). SYNC_ACQUIRE is answered now or parked
 * (holding a reference on c) until the step may start, its timeout, or stop; a peer that
 * hangs up drops its parked acquires. */
void srv_sync_acquire_take(gr_server *s, srv_conn *c, const gr_proto_header *h, uint8_t *body);
int srv_op_sync_config(srv_req *r);
int srv_op_push_step(srv_req *r);
int srv_op_sync_leave(srv_req *r);
int srv_op_dense_set(srv_req *r);
/* The installed sync job's step G (checkpoints report it); false when no job is installed. */
bool srv_sync_step(gr_server *s, uint64_t *step);
/* The installed sync job's mode (a gr_sync_mode); false when no job is installed. */
bool srv_sync_mode(gr_server *s, uint32_t *mode);

/* registry.c: installs table t (ownership passes on success) under spec->name, replacing the
 * entry of that name and kind (users of the old one keep it until they release it) or adding
 * one. GR_EEXIST when a new sparse table's id is another table's. */
int srv_registry_replace(srv_registry *r, const gr_table_spec *spec, gr_table *t, bool dense,
                         uint64_t dense_size);

/* ckpt.c: CKPT_SAVE, CKPT_COMMIT and CKPT_LOAD run on the shard's checkpoint thread
 * (module srv_ckpt_module, started on first use), so no pool thread or loop waits for the
 * disk. take answers at once when the request is refused (and closes the connection when the
 * body does not decode), otherwise when it has run, holding a reference on c meanwhile. */
typedef struct srv_ckpt srv_ckpt;
void srv_ckpt_take(gr_server *s, srv_conn *c, const gr_proto_header *h, uint8_t *body);
/* A standby's warm tables (docs/coord.md, "Warm standby"; warm.c prepares them).
 * srv_ckpt_resolve: a checkpoint root as CKPT_LOAD resolves it (out: at least 4096 bytes).
 * srv_ckpt_warm_set: replaces the set (the server owns `tables`, a malloc'd array, from now;
 * the old set is destroyed; NULL, 0 releases it). srv_ckpt_warm_take: removes and returns a
 * warm table whose spec equals `spec`, or NULL; CKPT_LOAD's new tables come from it first. */
int srv_ckpt_resolve(gr_server *s, const char *root, char *out, size_t cap);
void srv_ckpt_warm_set(gr_server *s, gr_table **tables, size_t n);
gr_table *srv_ckpt_warm_take(gr_server *s, const gr_table_spec *spec);
uint32_t srv_ckpt_warm_adopted(gr_server *s);

/* publish.c: SUBSCRIBE is parked (holding a reference on c) until the shard's next publication
 * or the request's wait runs out; the publisher thread answers it (module srv_publish_module). */
void srv_publish_subscribe_take(gr_server *s, srv_conn *c, const gr_proto_header *h, uint8_t *body);
/* PREDICT and LOOKUP are the replicas' (granary serve): a shard says so. */
int srv_op_replica_only(srv_req *r);

#endif
