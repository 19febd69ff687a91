/* Internal to the client part: the client instance and its operations (op.c). An operation
 * (gr_client_op) is a set of requests, one or more per shard, started together and waited on
 * together; each request completes into its op through op.c's completion, and the reply
 * handler that the calling module (batch.c, control.c, step.c, ckpt.c) gave it. Those modules
 * use this one and the planner; none of them calls another. */
#ifndef GRANARY_CLIENT_OP_H
#define GRANARY_CLIENT_OP_H

#include "client/conn.h"
#include "client/plan.h"

struct gr_client {
    cl_link link; /* settings and counters the connections share */
    cl_conn *conns;
    atomic_uint_fast64_t keys_in, keys_sent;
    atomic_uint_fast64_t plan_ns, frame_ns, scatter_ns;
    /* direct.c: the hooks (direct_on: installed), and their counters. */
    gr_client_direct direct;
    bool direct_on;
    atomic_uint_fast64_t direct_calls, direct_ns;
};

struct gr_client_op {
    gr_client *cl;
    uint16_t opcode;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t remaining;
    int err;
    char msg[800];
    uint64_t deadline_ns;
    cl_req **reqs;
    size_t nreqs, reqcap;
    /* The first failed request ends the op (the others are cancelled): an acquire must not
     * wait out other shards' long holds once one shard is gone. */
    bool fail_fast;
    /* A stale hook is installed: frames are kept after sending, so requests refused as stale
     * can be sent again (op.c); rounds of that so far. */
    bool keep_frames;
    uint32_t stale_rounds;
    /* Where reply handlers put results (the op is freed by the wait): */
    cl_plan plan;           /* batch calls: the plan their replies scatter by */
    float *dense_out;       /* async DENSE_PULL */
    size_t dense_n;
    uint64_t *tags_out;     /* SYNC_ACQUIRE, per shard */
    uint64_t *cur_out;
    uint32_t *outcomes_out; /* PUSH_STEP, per shard */
};

/* direct.c: whether a batch call goes through the direct hooks, and the call itself: runs a
 * planned batch (cl_plan_tables done) to completion on this thread. */
bool cl_direct_usable(const gr_client *c);
int cl_direct_run(gr_client_op *op, const gr_client_batch *b, bool rows, bool push,
                  bool readonly);
/* Whether opcode's optional hook is installed (and direct calls are usable). */
bool cl_direct_has(const gr_client *c, uint16_t opcode);
/* The sync and dense calls by direct hook; the first two return a completed op in *op (the
 * push_step one fills the op it is given, whose plan is made). */
int cl_direct_acquire(gr_client *c, uint32_t worker, const uint64_t *want, uint32_t timeout_ms,
                      uint64_t *tags, uint64_t *current, gr_client_op **op);
int cl_direct_push_step(gr_client_op *o, uint32_t worker, const uint64_t *tags,
                        const gr_client_batch *b, size_t nb, const gr_client_dense_grad *d,
                        size_t nd, uint32_t *outcomes);
int cl_direct_dense_pull(gr_client *c, const char *name, float *out, size_t n);
int cl_direct_dense_push(gr_client *c, const char *name, const float *grad, size_t n);
int cl_direct_done_op(gr_client *c, uint16_t opcode, gr_client_op **op);

/* A new op whose deadline is the request timeout from now; NULL when out of memory. */
gr_client_op *cl_op_new(gr_client *c, uint16_t opcode);
/* Frees the op, its requests and its plan. NULL is a no-op. */
void cl_op_free(gr_client_op *op);
/* Adds a request to shard with a fresh id and an empty frame; on_reply NULL (the body is kept
 * in r->reply). NULL when out of memory. */
cl_req *cl_op_add_req(gr_client_op *op, uint32_t shard);
/* Sends every request. 0 when at least one was sent (the op must be waited on); otherwise
 * every request has been completed with its error and the first is returned. */
int cl_op_send(gr_client_op *op);
/* Waits for completion (0) or the caller's timeout (GR_EAGAIN); at the op's deadline the
 * requests still outstanding are cancelled with GR_ETIMEDOUT. The op stays allocated. */
int cl_op_wait(gr_client_op *op, int timeout_ms);
/* The op's result: 0 or its first error (with the message set on this thread). */
int cl_op_result(gr_client_op *op);
/* Sends the same body (NULL: none) to each listed shard and waits for every reply; timeout_ms
 * 0 keeps the request timeout. The op is returned for the caller to read per-shard results
 * (r->rc, r->reply), then cl_op_free. */
int cl_op_run(gr_client *c, const uint32_t *shards, uint32_t n, uint16_t opcode,
              const gr_proto_buf *body, uint32_t timeout_ms, gr_client_op **out);
/* [0, 1, ..., nshards - 1], malloc'd; NULL when out of memory. */
uint32_t *cl_all_shards(const gr_client *c);

/* The shard that owns a dense parameter. */
static inline uint32_t cl_dense_owner(const gr_client *c, const char *name)
{
    return c->link.nshards == 1
               ? 0
               : gr_slot_shard(gr_proto_dense_slot(name, __builtin_strlen(name)), c->link.nshards);
}

/* Dense parameter names are 1..63 bytes. */
static inline int cl_check_dense_name(const char *name)
{
    if (!name || !*name || __builtin_strlen(name) >= 64)
        return gr_seterr(GR_EINVAL, "dense parameter names are 1..63 bytes");
    return GR_OK;
}

#endif
