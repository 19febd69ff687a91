/* Batch calls: pull, push, push_pull and delete of keys. Each plans its batch (plan.c), sends
 * one request per planned piece of work, and its replies are scattered back by the reader
 * threads as they arrive. The client's time in each phase is counted (gr_client_stats_t). */
#include "client/op.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void count_ns(atomic_uint_fast64_t *ctr, uint64_t since)
{
    atomic_fetch_add_explicit(ctr, gr_thread_cpu_ns() - since, memory_order_relaxed);
}

/* A PULL or PUSH_PULL reply, read from the socket as it arrives (on the reader thread): its
 * headers must be exactly those of the request, and its rows go, as many as the scratch
 * buffer holds at a time, to every occurrence of their keys. The body never lands in memory
 * whole, so the kernel's copy and the scatter meet in cache. */
static int rows_stream(cl_req *r, const gr_proto_header *h, cl_body *body)
{
    gr_client_op *op = r->ctx;
    const cl_plan *p = &op->plan;
    const cl_plan_req *pr = &p->reqs[r->tag];
    uint64_t t0 = gr_thread_cpu_ns();
    size_t want_len = cl_plan_body_size(p, r->tag, GR_PROTO_VALUES);
    if (h->body_len != want_len)
        return gr_seterr(GR_EPROTO, "reply body of %u bytes does not match the request (%zu "
                         "bytes)", h->body_len, want_len);
    uint8_t want[16];
    gr_proto_batch_head_bytes(pr->npieces, want);
    int rc = cl_body_fill(body, 8);
    if (!rc && memcmp(want, cl_body_take(body, 8), 8))
        rc = gr_seterr(GR_EPROTO, "reply does not hold the %u tables of the request", pr->npieces);
    for (uint32_t k = 0; !rc && k < pr->npieces; k++) {
        const cl_piece *pc = &pr->pieces[k];
        const cl_tbl *t = &p->tb[pc->bi];
        gr_proto_section_head_bytes(t->table, t->dim, pc->count, want);
        rc = cl_body_fill(body, 16);
        if (!rc && memcmp(want, cl_body_take(body, 16), 16))
            rc = gr_seterr(GR_EPROTO, "reply section %u does not match the request", k);
        size_t rowb = (size_t)t->dim * sizeof(float);
        for (uint32_t j0 = 0; !rc && j0 < pc->count;) {
            rc = cl_body_fill(body, rowb);
            if (rc) break;
            size_t m = cl_body_avail(body) / rowb;
            if (m > pc->count - j0) m = pc->count - j0;
            /* Section bodies are multiples of 4 bytes, so the rows are float-aligned. */
            const float *rows = (const float *)(const void *)cl_body_take(body, m * rowb);
            cl_plan_scatter_rows(p, r->tag, k, j0, (uint32_t)m, rows);
            j0 += (uint32_t)m;
        }
        if (!rc && ((size_t)pc->count * t->dim) % 2) { /* padding to 8 bytes, zero */
            uint32_t pad = 1;
            rc = cl_body_fill(body, 4);
            if (!rc) memcpy(&pad, cl_body_take(body, 4), 4);
            if (!rc && pad) rc = gr_seterr(GR_EPROTO, "reply section %u has nonzero padding", k);
        }
    }
    cl_plan_scatter_end(p);
    uint64_t spent = gr_thread_cpu_ns() - t0;
    atomic_fetch_add_explicit(&op->cl->scatter_ns, spent > body->read_ns ? spent - body->read_ns : 0,
                              memory_order_relaxed);
    return rc;
}

static int push_reply(cl_req *r, const gr_proto_header *h, uint8_t *body, bool *fatal)
{
    (void)r;
    (void)body;
    if (h->body_len != 0) {
        *fatal = true;
        return gr_seterr(GR_EPROTO, "push reply carries a body");
    }
    return GR_OK;
}

/* Plans b into op's requests and builds their frames: keys, and summed gradients with push. */
static int plan_batch(gr_client_op *op, const gr_client_batch *b, size_t nb, bool rows, bool push,
                      uint16_t wflags)
{
    gr_client *c = op->cl;
    gr_proto_layout layout = push ? GR_PROTO_KEYS_VALUES : GR_PROTO_KEYS;
    uint64_t t0 = gr_thread_cpu_ns();
    int rc = cl_plan_tables(&op->plan, c->link.nshards, b, nb, rows, push);
    count_ns(&c->plan_ns, t0);
    if (rc) return rc;
    atomic_fetch_add(&c->keys_in, op->plan.keys_in);
    atomic_fetch_add(&c->keys_sent, op->plan.keys_sent);
    t0 = gr_thread_cpu_ns();
    gr_proto_limits *lims = malloc(c->link.nshards * sizeof *lims);
    if (!lims) return gr_seterr(GR_ENOMEM, "out of memory");
    for (uint32_t s = 0; s < c->link.nshards; s++) lims[s] = c->conns[s].limits;
    rc = cl_plan_split(&op->plan, lims, layout, rows);
    free(lims);
    if (rc == GR_ETOOBIG) { /* name the shard by its address, as every other error does */
        char m[256];
        snprintf(m, sizeof m, "%s", gr_errmsg());
        return gr_seterr(rc, "shard %u (%s): %s", op->plan.fail_shard,
                         c->conns[op->plan.fail_shard].addr, m);
    }
    if (rc) return rc;
    cl_reply_fn handler = op->opcode == GR_OP_PUSH ? push_reply : NULL;
    for (size_t i = 0; !rc && i < op->plan.nreqs; i++) {
        cl_req *r = cl_op_add_req(op, op->plan.reqs[i].shard);
        if (!r) return gr_seterr(GR_ENOMEM, "out of memory");
        r->tag = (uint32_t)i;
        r->on_reply = handler;
        if (rows) r->on_stream = rows_stream;
        rc = gr_proto_buf_reserve(&r->frame, GR_PROTO_HEADER_SIZE +
                                                 cl_plan_body_size(&op->plan, i, layout));
        if (!rc) rc = gr_proto_begin(&r->frame, GR_PROTO_REQUEST, op->opcode, wflags, 0, r->id);
        if (!rc) rc = cl_plan_put_sections(&op->plan, i, layout, &r->frame);
        if (!rc) rc = gr_proto_end(&r->frame, 0);
    }
    if (!rc && push) rc = cl_plan_sum_grads(&op->plan, b); /* refuses non-finite gradients */
    count_ns(&c->frame_ns, t0);
    return rc;
}

static int batch_start(gr_client *c, uint16_t opcode, const gr_client_batch *b, size_t nb,
                       unsigned flags, gr_client_op **out)
{
    if (!out) return gr_seterr(GR_EINVAL, "no place for the operation handle");
    *out = NULL;
    bool push = opcode == GR_OP_PUSH || opcode == GR_OP_PUSH_PULL;
    bool rows = opcode == GR_OP_PULL || opcode == GR_OP_PUSH_PULL;
    gr_client_op *op = cl_op_new(c, opcode);
    if (!op) return gr_seterr(GR_ENOMEM, "cannot allocate an operation");
    uint16_t wflags = (opcode == GR_OP_PULL && (flags & GR_CLIENT_READONLY)) ? GR_PROTO_F_READONLY : 0;
    if (cl_direct_usable(c)) { /* shards in this process: done by the time this returns */
        uint64_t t0 = gr_thread_cpu_ns();
        int rc = cl_plan_tables(&op->plan, c->link.nshards, b, nb, rows, push);
        count_ns(&c->plan_ns, t0);
        if (!rc) {
            atomic_fetch_add(&c->keys_in, op->plan.keys_in);
            atomic_fetch_add(&c->keys_sent, op->plan.keys_sent);
            rc = cl_direct_run(op, b, rows, push, wflags != 0);
        }
        if (rc) {
            cl_op_free(op);
            return rc;
        }
        *out = op;
        return GR_OK;
    }
    int rc = plan_batch(op, b, nb, rows, push, wflags);
    if (!rc) rc = cl_op_send(op);
    if (rc) {
        cl_op_free(op);
        return rc;
    }
    *out = op;
    return GR_OK;
}

int gr_client_pull_start(gr_client *c, const gr_client_batch *b, size_t nb, unsigned flags,
                         gr_client_op **op)
{
    return batch_start(c, GR_OP_PULL, b, nb, flags, op);
}

int gr_client_push_start(gr_client *c, const gr_client_batch *b, size_t nb, gr_client_op **op)
{
    if (op) *op = NULL;
    return batch_start(c, GR_OP_PUSH, b, nb, 0, op); /* gradients checked while summed */
}

int gr_client_push_pull_start(gr_client *c, const gr_client_batch *b, size_t nb,
                              gr_client_op **op)
{
    if (op) *op = NULL;
    return batch_start(c, GR_OP_PUSH_PULL, b, nb, 0, op); /* gradients checked while summed */
}

int gr_client_pull_many(gr_client *c, const gr_client_batch *b, size_t nb, unsigned flags)
{
    gr_client_op *op;
    int rc = gr_client_pull_start(c, b, nb, flags, &op);
    return rc ? rc : gr_client_wait(op, -1);
}

int gr_client_push_many(gr_client *c, const gr_client_batch *b, size_t nb)
{
    gr_client_op *op;
    int rc = gr_client_push_start(c, b, nb, &op);
    return rc ? rc : gr_client_wait(op, -1);
}

int gr_client_push_pull_many(gr_client *c, const gr_client_batch *b, size_t nb)
{
    gr_client_op *op;
    int rc = gr_client_push_pull_start(c, b, nb, &op);
    return rc ? rc : gr_client_wait(op, -1);
}

int gr_client_pull(gr_client *c, uint32_t table, uint32_t dim, const uint64_t *keys, size_t n,
                   float *rows)
{
    gr_client_batch b = {table, dim, n, keys, rows, NULL, 0};
    return gr_client_pull_many(c, &b, 1, 0);
}

int gr_client_push(gr_client *c, uint32_t table, uint32_t dim, const uint64_t *keys, size_t n,
                   const float *grads)
{
    gr_client_batch b = {table, dim, n, keys, NULL, grads, 0};
    return gr_client_push_many(c, &b, 1);
}

int gr_client_delete(gr_client *c, uint32_t table, uint32_t dim, const uint64_t *keys, size_t n,
                     uint64_t *deleted)
{
    gr_client_batch b = {table, dim, n, keys, NULL, NULL, 0};
    gr_client_op *op = cl_op_new(c, GR_OP_DELETE);
    if (!op) return gr_seterr(GR_ENOMEM, "cannot allocate an operation");
    int rc = plan_batch(op, &b, 1, false, false, 0);
    if (!rc) rc = cl_op_send(op);
    if (!rc) {
        cl_op_wait(op, -1);
        rc = cl_op_result(op);
    }
    uint64_t total = 0;
    for (size_t i = 0; !rc && i < op->nreqs; i++) {
        uint64_t v[1];
        uint32_t cnt = 0;
        rc = gr_proto_decode_u64s(op->reqs[i]->reply, op->reqs[i]->reply_len, 1, v, &cnt);
        if (!rc && cnt == 1) total += v[0];
    }
    cl_op_free(op);
    if (!rc && deleted) *deleted = total;
    return rc;
}
