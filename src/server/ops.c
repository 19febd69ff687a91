/* The table of operations: for every opcode, where it runs, which header flag bits it accepts
 * (all others must be 0), whether it is allowed before authentication, and its handler. A new
 * opcode is one row here, its handler, and its line in GR_PROTO_OPS (include/granary/proto.h).
 *
 * Where:
 *   LOOP    run by the connection loop as the frame arrives (short, never blocking: HELLO,
 *           AUTH, STATS, which must answer even while the pool is busy);
 *   POOL    queued to the worker pool (everything that touches tables);
 *   PARKED  answered at once or parked until its step may start (sync_job.c) or until the
 *           next publication (publish.c), on the loop;
 *   CKPT    handed to the checkpoint thread (ckpt.c), on the loop.
 * A row has `handle` (builds the reply into a buffer; server.c writes it) or `take` (owns the
 * body and answers by itself, now or later). A POOL row with `inline` runs small requests on
 * the loop instead. The fence column says what a coordination fence stops (fence.c): a shard
 * that lost its coordinator session must still answer the handshake, stats and shutdown. */
#include "server/server_int.h"

/* A pull of up to ~2000 keys (16 KiB of body) is looked up by the loop thread that decoded
 * it: handing it to a worker would cost a wake-up that is a large part of its latency, while
 * its lookup is short enough not to hold other connections up noticeably. */
#define INLINE_PULL_BODY (16u << 10)

static const srv_op_row rows[GR_PROTO_OP_LIMIT] = {
    /*                       where            fence             flags                preauth inline handle  take */
    [GR_OP_HELLO] =          {SRV_RUN_LOOP, SRV_FENCE_NEVER,   0,                   true, 0,  NULL,   srv_session_hello},
    [GR_OP_AUTH] =           {SRV_RUN_LOOP, SRV_FENCE_NEVER,   0,                   true, 0,  NULL,   srv_session_auth},
    [GR_OP_STATS] =          {SRV_RUN_LOOP, SRV_FENCE_NEVER,   0,                   false, 0, srv_stats_op, NULL},
    [GR_OP_CREATE_TABLE] =   {SRV_RUN_POOL, SRV_FENCE_WRITE,   0,                   false, 0, srv_op_create_table, NULL},
    [GR_OP_DESCRIBE_TABLE] = {SRV_RUN_POOL, SRV_FENCE_READ,    0,                   false, 0, srv_op_describe, NULL},
    [GR_OP_DROP_TABLE] =     {SRV_RUN_POOL, SRV_FENCE_WRITE,   0,                   false, 0, srv_op_drop_table, NULL},
    [GR_OP_PULL] =           {SRV_RUN_POOL, SRV_FENCE_READ,    GR_PROTO_F_READONLY, false, INLINE_PULL_BODY, srv_op_pull, NULL},
    [GR_OP_PUSH] =           {SRV_RUN_POOL, SRV_FENCE_WRITE,   0,                   false, 0, srv_op_push, NULL},
    [GR_OP_PUSH_PULL] =      {SRV_RUN_POOL, SRV_FENCE_WRITE,   0,                   false, 0, srv_op_push_pull, NULL},
    [GR_OP_DENSE_CREATE] =   {SRV_RUN_POOL, SRV_FENCE_WRITE,   0,                   false, 0, srv_op_dense_create, NULL},
    [GR_OP_DENSE_PULL] =     {SRV_RUN_POOL, SRV_FENCE_READ,    0,                   false, 0, srv_op_dense_pull, NULL},
    [GR_OP_DENSE_PUSH] =     {SRV_RUN_POOL, SRV_FENCE_WRITE,   0,                   false, 0, srv_op_dense_push, NULL},
    [GR_OP_DELETE] =         {SRV_RUN_POOL, SRV_FENCE_WRITE,   0,                   false, 0, srv_op_delete, NULL},
    [GR_OP_EVICT] =          {SRV_RUN_POOL, SRV_FENCE_WRITE,   0,                   false, 0, srv_op_evict, NULL},
    [GR_OP_SHUTDOWN] =       {SRV_RUN_POOL, SRV_FENCE_NEVER,   0,                   false, 0, srv_op_shutdown, NULL},
    [GR_OP_SYNC_CONFIG] =    {SRV_RUN_POOL, SRV_FENCE_WRITE,   0,                   false, 0, srv_op_sync_config, NULL},
    [GR_OP_SYNC_ACQUIRE] =   {SRV_RUN_PARKED, SRV_FENCE_WRITE, 0,                   false, 0, NULL,   srv_sync_acquire_take},
    [GR_OP_PUSH_STEP] =      {SRV_RUN_POOL, SRV_FENCE_WRITE,   0,                   false, 0, srv_op_push_step, NULL},
    [GR_OP_SYNC_LEAVE] =     {SRV_RUN_POOL, SRV_FENCE_WRITE,   0,                   false, 0, srv_op_sync_leave, NULL},
    [GR_OP_DENSE_SET] =      {SRV_RUN_POOL, SRV_FENCE_WRITE,   0,                   false, 0, srv_op_dense_set, NULL},
    [GR_OP_SUBSCRIBE] =      {SRV_RUN_PARKED, SRV_FENCE_READ,  0,                   false, 0, NULL,   srv_publish_subscribe_take},
    [GR_OP_PREDICT] =        {SRV_RUN_LOOP, SRV_FENCE_WRITE,   0,                   false, 0, srv_op_replica_only, NULL},
    [GR_OP_LOOKUP] =         {SRV_RUN_LOOP, SRV_FENCE_WRITE,   0,                   false, 0, srv_op_replica_only, NULL},
    [GR_OP_CKPT_SAVE] =      {SRV_RUN_CKPT, SRV_FENCE_WRITE,   0,                   false, 0, NULL,   srv_ckpt_take},
    [GR_OP_CKPT_COMMIT] =    {SRV_RUN_CKPT, SRV_FENCE_WRITE,   0,                   false, 0, NULL,   srv_ckpt_take},
    [GR_OP_CKPT_LOAD] =      {SRV_RUN_CKPT, SRV_FENCE_WRITE,   0,                   false, 0, NULL,   srv_ckpt_take},
};

const srv_op_row *srv_op_row_of(unsigned op)
{
    if (op >= GR_PROTO_OP_LIMIT || rows[op].where == SRV_RUN_NONE) return NULL;
    return &rows[op];
}
