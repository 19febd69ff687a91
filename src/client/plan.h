/* Internal to the client part: the batch planner (plan.c). Pure code, no I/O, no threads, no
 * client: it turns a caller's batch into per-shard requests and back.
 *  1. cl_plan_tables: per table, dedup the keys (unless the caller says they are unique),
 *     link every occurrence of a key, and group the unique keys by owning shard.
 *  2. cl_plan_split (batch calls: split to fit each shard's limits) or cl_plan_per_shard (step
 *     pushes: exactly one request per shard): the requests, as pieces of tables.
 *  3. cl_plan_put_sections: a request's batch body (keys; for pushes the gradient slots), then
 *     cl_plan_sum_grads fills the slots with each key's gradients summed in occurrence order.
 *  4. cl_plan_scatter: a reply's rows to every occurrence of each key in the caller's rows.
 * Tested alone in tests/unit/client/test_plan.c. */
#ifndef GRANARY_CLIENT_PLAN_H
#define GRANARY_CLIENT_PLAN_H

#include "granary/client.h"
#include "granary/proto.h"

/* A run of one table's unique keys inside a request, in the order they are sent. */
typedef struct cl_piece {
    uint32_t bi;          /* batch (table) index */
    uint32_t count;       /* unique keys in this section */
    const uint32_t *uidx; /* their unique indices */
} cl_piece;

typedef struct cl_plan_req {
    uint32_t shard;
    uint32_t npieces, cap;
    cl_piece *pieces;
} cl_plan_req;

typedef struct cl_tbl {
    uint32_t table, dim;
    size_t n;
    bool unique;           /* the caller's keys are unique: unique index u is occurrence u */
    float *rows;           /* the caller's output (pull, push_pull) */
    const uint64_t *uniq;  /* unique keys (the caller's keys when unique); start call only */
    uint32_t nuniq;
    int32_t *first;        /* per unique key: its first occurrence (NULL when unique) */
    int32_t *next;         /* per occurrence: the next one of the same key, or -1 */
    uint32_t *inv;         /* per occurrence: its unique index (NULL when unique) */
    uint32_t *order;       /* unique indices grouped by shard */
    uint32_t *shard_start; /* nshards + 1 offsets into order */
    float **dst;           /* push: per unique key, its gradient slot in its request frame */
} cl_tbl;

typedef struct cl_plan {
    uint32_t nshards;
    size_t nb;
    cl_tbl *tb;
    void *arena;
    bool stream_rows; /* scatter with streaming stores (output far larger than caches) */
    cl_plan_req *reqs;
    size_t nreqs, reqcap;
    uint64_t keys_in, keys_sent; /* keys given, unique keys sent */
    uint32_t fail_shard;         /* cl_plan_split's GR_ETOOBIG: the shard whose limit it was */
} cl_plan;

/* Output larger than this is scattered with streaming stores: the rows would not stay in cache
 * anyway, and streaming skips reading every destination line before writing it (measured: the
 * scatter of a 27 MB pull output is most of the client's CPU). */
#define CL_STREAM_ROWS_BYTES (8u << 20)

/* Step 1. rows/grads: the op writes rows / reads gradients (checked non-NULL when n > 0).
 * A batch with GR_CLIENT_BATCH_UNIQUE skips the dedup: its keys are taken as they are.
 * GR_EINVAL (no tables, dim out of range, NULL arrays), GR_ETOOBIG (n over INT32_MAX / 2),
 * GR_ENOMEM. On failure call cl_plan_fini. */
int cl_plan_tables(cl_plan *p, uint32_t nshards, const gr_client_batch *b, size_t nb, bool rows,
                   bool grads);
/* Step 2, batch calls: each shard's unique keys in as few requests as fit its limits
 * (lims[shard]: keys, tables, body bytes of the request and, with reply_rows, of the reply).
 * Shards without keys get no request. GR_ETOOBIG when one row cannot fit a frame (fail_shard
 * says whose). */
int cl_plan_split(cl_plan *p, const gr_proto_limits *lims, gr_proto_layout layout,
                  bool reply_rows);
/* Step 2, step pushes: request s goes to shard s and holds all its keys (maybe none). */
int cl_plan_per_shard(cl_plan *p);
/* Bytes of request ri's batch body (batch head and sections) in a layout. */
size_t cl_plan_body_size(const cl_plan *p, size_t ri, gr_proto_layout layout);
/* Step 3: appends request ri's batch body to frame (reserve cl_plan_body_size first). With
 * GR_PROTO_KEYS_VALUES it records each key's gradient slot for cl_plan_sum_grads, so the frame
 * must not move until then. */
int cl_plan_put_sections(cl_plan *p, size_t ri, gr_proto_layout layout, gr_proto_buf *frame);
/* Step 3, pushes: every key's slot gets the sum of its gradients, in occurrence order.
 * GR_EINVAL (check.c's message: table, key, element) when a gradient is NaN or inf; the
 * frames must not be sent then. */
int cl_plan_sum_grads(cl_plan *p, const gr_client_batch *b);
/* Step 4: checks that reply holds request ri's sections (tables, dims, counts) and copies each
 * row to every occurrence of its key. GR_EPROTO when it does not match (nothing is promised
 * about the rows then). Safe to run for different requests of one plan at once. */
int cl_plan_scatter(const cl_plan *p, size_t ri, const gr_proto_batch *reply);
/* Step 4 for a reply read as it arrives (the client's readers): rows j0 .. j0 + count - 1 of
 * request ri's section k, to every occurrence of their keys; then cl_plan_scatter_end once
 * the reply is done. The caller has checked the section against the request. */
void cl_plan_scatter_rows(const cl_plan *p, size_t ri, uint32_t k, uint32_t j0, uint32_t count,
                          const float *vals);
void cl_plan_scatter_end(const cl_plan *p);
void cl_plan_fini(cl_plan *p);

#endif
