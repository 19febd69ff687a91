/* Step calls of the sync modes (docs/sync.md): install a job, acquire a step from every shard,
 * push a step's gradients (one frame per shard, planned by plan.c), leave. Acquire and step
 * push replies land in the caller's tags and outcomes as they arrive. */
#include "client/op.h"
#include "client/check.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/* A SYNC_ACQUIRE reply (tag, current step) or a PUSH_STEP reply (outcome, step), per shard. */
static int pair_reply(cl_req *r, const gr_proto_header *h, uint8_t *body, bool *fatal)
{
    gr_client_op *op = r->ctx;
    uint64_t a, b;
    int rc = gr_proto_decode_pair(body, h->body_len, &a, &b);
    if (rc) {
        *fatal = true;
        return rc;
    }
    if (r->opcode == GR_OP_SYNC_ACQUIRE) {
        if (op->tags_out) op->tags_out[r->shard] = a;
        if (op->cur_out) op->cur_out[r->shard] = b;
    } else if (op->outcomes_out) {
        op->outcomes_out[r->shard] = (uint32_t)a;
    }
    return GR_OK;
}

int gr_client_sync_configure(gr_client *c, const gr_client_sync_config *cfg, unsigned flags,
                             uint64_t *step)
{
    return gr_client_sync_configure_owned(c, cfg, NULL, flags, step);
}

int gr_client_sync_configure_owned(gr_client *c, const gr_client_sync_config *cfg,
                                   const gr_client_sync_owner *owner, unsigned flags,
                                   uint64_t *step)
{
    if (!cfg && !(flags & GR_CLIENT_SYNC_CLEAR)) return gr_seterr(GR_EINVAL, "NULL sync config");
    gr_proto_sync_config pc;
    memset(&pc, 0, sizeof pc);
    if (cfg) {
        pc.mode = cfg->mode;
        pc.workers = cfg->workers;
        pc.aggregate = cfg->aggregate;
        pc.staleness = cfg->staleness;
        pc.dense_lag = cfg->dense_lag;
    }
    if (owner && owner->id) {
        pc.owner = owner->id;
        pc.started_ms = owner->started_ms;
        if (owner->label && strlen(owner->label) > GR_PROTO_SYNC_LABEL_MAX)
            return gr_seterr(GR_EINVAL, "sync job label longer than %d bytes",
                             GR_PROTO_SYNC_LABEL_MAX);
        if (owner->label) snprintf(pc.label, sizeof pc.label, "%s", owner->label);
    }
    pc.flags = (flags & GR_CLIENT_SYNC_RESET ? GR_PROTO_SYNC_RESET : 0) |
               (flags & GR_CLIENT_SYNC_CLEAR ? GR_PROTO_SYNC_CLEAR : 0);
    gr_proto_buf body;
    gr_proto_buf_init(&body);
    if (flags & GR_CLIENT_SYNC_LIVE) {
        int rc = gr_proto_put_sync_config(&body, &pc);
        for (uint32_t s = 0; !rc && s < c->link.nshards; s++) {
            bool up = cl_conn_is_up(&c->conns[s]);
            gr_client_op *op = NULL;
            if (up && cl_op_run(c, &s, 1, GR_OP_SYNC_CONFIG, &body, 0, &op) == GR_OK) cl_op_free(op);
        }
        gr_proto_buf_fini(&body);
        gr_clearerr();
        if (step) *step = 0;
        return GR_OK;
    }
    uint32_t *shards = cl_all_shards(c);
    int rc = shards ? gr_proto_put_sync_config(&body, &pc) : gr_seterr(GR_ENOMEM, "out of memory");
    gr_client_op *op = NULL;
    if (!rc) rc = cl_op_run(c, shards, c->link.nshards, GR_OP_SYNC_CONFIG, &body, 0, &op);
    free(shards);
    gr_proto_buf_fini(&body);
    if (rc) return rc;
    rc = cl_op_result(op);
    uint64_t top = 0;
    for (size_t i = 0; !rc && i < op->nreqs; i++) {
        uint64_t res = 0, g = 0;
        rc = gr_proto_decode_pair(op->reqs[i]->reply, op->reqs[i]->reply_len, &res, &g);
        if (g > top) top = g;
    }
    cl_op_free(op);
    if (!rc && step) *step = top;
    return rc;
}

int gr_client_sync_acquire_start(gr_client *c, uint32_t worker, const uint64_t *want,
                                 uint32_t timeout_ms, uint64_t *tags, uint64_t *current,
                                 gr_client_op **op)
{
    if (!op) return gr_seterr(GR_EINVAL, "no place for the operation handle");
    *op = NULL;
    if (!want || !tags) return gr_seterr(GR_EINVAL, "acquire needs want and tags arrays");
    if (cl_direct_has(c, GR_OP_SYNC_ACQUIRE))
        return cl_direct_acquire(c, worker, want, timeout_ms, tags, current, op);
    gr_client_op *o = cl_op_new(c, GR_OP_SYNC_ACQUIRE);
    if (!o) return gr_seterr(GR_ENOMEM, "cannot allocate an operation");
    /* The shard may hold the request for timeout_ms: the op's own deadline comes after. */
    o->deadline_ns += (uint64_t)timeout_ms * 1000000u;
    o->fail_fast = true;
    o->tags_out = tags;
    o->cur_out = current;
    int rc = GR_OK;
    for (uint32_t s = 0; s < c->link.nshards && !rc; s++) {
        cl_req *r = cl_op_add_req(o, s);
        if (!r) {
            rc = gr_seterr(GR_ENOMEM, "out of memory");
            break;
        }
        gr_proto_sync_acquire a = {worker, timeout_ms, want[s]};
        r->on_reply = pair_reply;
        rc = gr_proto_begin(&r->frame, GR_PROTO_REQUEST, GR_OP_SYNC_ACQUIRE, 0, 0, r->id);
        if (!rc) rc = gr_proto_put_sync_acquire(&r->frame, &a);
        if (!rc) rc = gr_proto_end(&r->frame, 0);
    }
    if (!rc) rc = cl_op_send(o);
    if (rc) {
        cl_op_free(o);
        return rc;
    }
    *op = o;
    return GR_OK;
}

int gr_client_sync_acquire(gr_client *c, uint32_t worker, const uint64_t *want,
                           uint32_t timeout_ms, uint64_t *tags, uint64_t *step)
{
    gr_client_op *op;
    int rc = gr_client_sync_acquire_start(c, worker, want, timeout_ms, tags, NULL, &op);
    if (!rc) rc = gr_client_wait(op, -1);
    if (!rc && step) {
        uint64_t m = UINT64_MAX;
        for (uint32_t s = 0; s < c->link.nshards; s++)
            if (tags[s] < m) m = tags[s];
        *step = m;
    }
    return rc;
}

int gr_client_push_step_start(gr_client *c, uint32_t worker, const uint64_t *tags,
                              const gr_client_batch *b, size_t nb, const gr_client_dense_grad *d,
                              size_t nd, uint32_t *outcomes, gr_client_op **op)
{
    if (!op) return gr_seterr(GR_EINVAL, "no place for the operation handle");
    *op = NULL;
    if (!tags) return gr_seterr(GR_EINVAL, "push_step needs the tags from acquire");
    if ((nb && !b) || (nd && !d)) return gr_seterr(GR_EINVAL, "NULL tables or dense gradients");
    /* Sparse gradients are checked while they are summed (cl_plan_sum_grads), before any send. */
    if (cl_check_dense_grads(d, nd)) return GR_EINVAL;
    for (size_t i = 0; i < nd; i++) {
        int rc = cl_check_dense_name(d[i].name);
        if (rc) return rc;
        if (d[i].n && !d[i].grad) return gr_seterr(GR_EINVAL, "dense gradient '%s' is NULL", d[i].name);
    }
    gr_client_op *o = cl_op_new(c, GR_OP_PUSH_STEP);
    if (!o) return gr_seterr(GR_ENOMEM, "cannot allocate an operation");
    o->outcomes_out = outcomes;
    cl_plan *p = &o->plan;
    uint64_t t0 = gr_thread_cpu_ns();
    int rc = nb ? cl_plan_tables(p, c->link.nshards, b, nb, false, true) : GR_OK;
    atomic_fetch_add_explicit(&c->plan_ns, gr_thread_cpu_ns() - t0, memory_order_relaxed);
    t0 = gr_thread_cpu_ns();
    if (!rc) {
        atomic_fetch_add(&c->keys_in, p->keys_in);
        atomic_fetch_add(&c->keys_sent, p->keys_sent);
        p->nshards = c->link.nshards;
        if (cl_direct_has(c, GR_OP_PUSH_STEP)) { /* done by the time this returns */
            rc = cl_direct_push_step(o, worker, tags, b, nb, d, nd, outcomes);
            if (rc) {
                cl_op_free(o);
                return rc;
            }
            *op = o;
            return GR_OK;
        }
        rc = cl_plan_per_shard(p); /* a step is one frame per shard, never split */
    }
    uint32_t *dshard = calloc(nd ? nd : 1, sizeof *dshard);
    if (!rc && !dshard) rc = gr_seterr(GR_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < nd; i++) dshard[i] = cl_dense_owner(c, d[i].name);
    for (uint32_t s = 0; s < c->link.nshards && !rc; s++) {
        const gr_proto_limits *lim = &c->conns[s].limits;
        const cl_plan_req *pr = &p->reqs[s];
        cl_req *r = cl_op_add_req(o, s);
        if (!r) {
            rc = gr_seterr(GR_ENOMEM, "out of memory");
            break;
        }
        r->on_reply = pair_reply;
        uint32_t ndense = 0;
        uint64_t keys = 0;
        for (uint32_t k = 0; k < pr->npieces; k++) keys += pr->pieces[k].count;
        size_t blen = pr->npieces ? cl_plan_body_size(p, s, GR_PROTO_KEYS_VALUES) : 0;
        size_t size = GR_PROTO_HEADER_SIZE + 24 + blen;
        for (size_t i = 0; i < nd; i++)
            if (dshard[i] == s) {
                ndense++;
                size += 8 + ((strlen(d[i].name) + 4 + 7) & ~(size_t)7) + ((d[i].n * 4 + 7) & ~(size_t)7);
            }
        if (size - GR_PROTO_HEADER_SIZE > lim->max_body || keys > lim->max_keys ||
            pr->npieces > lim->max_tables || ndense > lim->max_tables) {
            rc = gr_seterr(GR_ETOOBIG,
                           "shard %u (%s): a step push of %llu keys and %zu bytes does not fit "
                           "the shard's limits (%u keys, %u bytes, %u tables): use smaller batches",
                           s, c->conns[s].addr, (unsigned long long)keys, size, lim->max_keys,
                           lim->max_body, lim->max_tables);
            break;
        }
        rc = gr_proto_buf_reserve(&r->frame, size);
        if (!rc) rc = gr_proto_begin(&r->frame, GR_PROTO_REQUEST, GR_OP_PUSH_STEP, 0, 0, r->id);
        if (!rc) rc = gr_proto_put_push_step_head(&r->frame, worker, ndense, tags[s], blen);
        if (!rc && pr->npieces) rc = cl_plan_put_sections(p, s, GR_PROTO_KEYS_VALUES, &r->frame);
        for (size_t i = 0; !rc && i < nd; i++)
            if (dshard[i] == s) rc = gr_proto_put_dense_part(&r->frame, d[i].name, d[i].grad, d[i].n);
        if (!rc) rc = gr_proto_end(&r->frame, 0);
    }
    free(dshard);
    if (!rc && nb) rc = cl_plan_sum_grads(p, b);
    atomic_fetch_add_explicit(&c->frame_ns, gr_thread_cpu_ns() - t0, memory_order_relaxed);
    if (!rc) rc = cl_op_send(o);
    if (rc) {
        cl_op_free(o);
        return rc;
    }
    *op = o;
    return GR_OK;
}

int gr_client_push_step(gr_client *c, uint32_t worker, const uint64_t *tags,
                        const gr_client_batch *b, size_t nb, const gr_client_dense_grad *d,
                        size_t nd, uint32_t *outcomes)
{
    gr_client_op *op;
    int rc = gr_client_push_step_start(c, worker, tags, b, nb, d, nd, outcomes, &op);
    return rc ? rc : gr_client_wait(op, -1);
}

int gr_client_sync_leave(gr_client *c, uint32_t worker)
{
    gr_proto_buf body;
    gr_proto_buf_init(&body);
    uint32_t *shards = cl_all_shards(c);
    int rc = shards ? gr_proto_put_u32(&body, worker) : gr_seterr(GR_ENOMEM, "out of memory");
    if (!rc) rc = gr_proto_put_u32(&body, 0);
    gr_client_op *op = NULL;
    if (!rc) rc = cl_op_run(c, shards, c->link.nshards, GR_OP_SYNC_LEAVE, &body, 0, &op);
    free(shards);
    gr_proto_buf_fini(&body);
    if (rc) return rc;
    rc = cl_op_result(op);
    cl_op_free(op);
    return rc;
}
