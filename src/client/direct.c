/* Direct shards: batch calls run by function call on shards in this process (the embedded
 * cluster's, gr_client_direct) instead of frames over their sockets. The plan is the same
 * (plan.c: dedup, routing, unique keys grouped by shard); each table's keys of each shard go
 * to the hook in plan order, gradients summed per key in occurrence order as the frames carry
 * them, and pulled rows are copied to every occurrence as a reply's would be. So the tables
 * see exactly the calls a request would make, and results are bitwise the socket path's. */
#include "client/check.h"
#include "client/op.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gr_client_set_direct(gr_client *c, const gr_client_direct *d)
{
    if (!c) return gr_seterr(GR_EINVAL, "gr_client_set_direct: no client");
    if (!d) {
        c->direct_on = false;
        memset(&c->direct, 0, sizeof c->direct);
        return GR_OK;
    }
    if (!d->pull || !d->push)
        return gr_seterr(GR_EINVAL, "direct shards need both a pull and a push hook");
    if (d->shards != c->link.nshards)
        return gr_seterr(GR_EINVAL, "direct hooks for %u shards, the client has %u", d->shards,
                         c->link.nshards);
    c->direct = *d;
    c->direct_on = true;
    return GR_OK;
}

bool cl_direct_usable(const gr_client *c)
{
    /* A coordinated client routes by a layout that may change under it: the socket path,
     * whose refusals it knows how to follow. */
    return c->direct_on && !c->link.stale_fn &&
           atomic_load(&((gr_client *)c)->link.epoch) == 0;
}

/* Table t's gradients summed per unique key (unique index order), into sums; the caller's
 * own rows when its keys are unique (no copy). */
static const float *summed_grads(const cl_tbl *t, const float *g, float **sums)
{
    *sums = NULL;
    if (t->unique) return g;
    size_t dim = t->dim;
    float *s = malloc((size_t)t->nuniq * dim * sizeof *s);
    if (!s) return NULL;
    uint32_t fresh = 0;
    for (size_t i = 0; i < t->n; i++) {
        const float *src = g + i * dim;
        uint32_t u = t->inv[i];
        float *dst = s + (size_t)u * dim;
        if (u == fresh) {
            fresh++;
            memcpy(dst, src, dim * sizeof *dst);
        } else {
            for (size_t d = 0; d < dim; d++) dst[d] += src[d];
        }
    }
    *sums = s;
    return s;
}

/* "shard S (ADDR): msg" as every socket error names its shard. */
static int name_shard(gr_client *c, uint32_t s, int rc)
{
    char msg[700];
    snprintf(msg, sizeof msg, "%s", gr_errmsg());
    return gr_seterr(rc, "shard %u (%s): %s", s, c->conns[s].addr, msg);
}

/* Shard s's part of table t, in plan order: its unique keys and, with gs (per unique index),
 * their gradients, gathered into keys and grads; the count. When the table's keys all go to
 * s, the plan's order is the identity (a stable sort), so *kp and *gp point at t's own arrays
 * and nothing is copied. */
static size_t shard_part(const cl_tbl *t, uint32_t s, const float *gs, uint64_t *keys,
                         float *grads, const uint64_t **kp, const float **gp)
{
    const uint32_t *uidx = t->order + t->shard_start[s];
    size_t m = t->shard_start[s + 1] - t->shard_start[s], dim = t->dim;
    if (m == t->nuniq) {
        *kp = t->uniq;
        *gp = gs;
        return m;
    }
    for (size_t j = 0; j < m; j++) keys[j] = t->uniq[uidx[j]];
    for (size_t j = 0; gs && j < m; j++)
        memcpy(grads + j * dim, gs + (size_t)uidx[j] * dim, dim * sizeof(float));
    *kp = keys;
    *gp = grads;
    return m;
}

/* One table's part of the batch, shard by shard. */
static int run_table(gr_client *c, const cl_tbl *t, const float *g, bool rows, bool push,
                     bool readonly)
{
    const gr_client_direct *d = &c->direct;
    size_t dim = t->dim, rowb = dim * sizeof(float), most = 0;
    for (uint32_t s = 0; s < d->shards; s++) {
        size_t m = t->shard_start[s + 1] - t->shard_start[s];
        if (m > most) most = m;
    }
    if (most == 0) return GR_OK;
    float *sums = NULL;
    const float *gs = push ? summed_grads(t, g, &sums) : NULL;
    uint64_t *keys = malloc(most * sizeof *keys);
    float *buf = malloc(most * rowb);
    int rc = GR_OK;
    if ((push && !gs) || !keys || !buf)
        rc = gr_seterr(GR_ENOMEM, "cannot allocate a direct batch of %zu keys", most);
    for (uint32_t s = 0; !rc && s < d->shards; s++) {
        const uint64_t *k;
        const float *gp;
        size_t m = shard_part(t, s, gs, keys, buf, &k, &gp);
        if (m == 0) continue;
        if (push) {
            atomic_fetch_add_explicit(&c->direct_calls, 1, memory_order_relaxed);
            rc = d->push(d->ctx, s, t->table, t->dim, k, m, gp);
        }
        if (!rc && rows) {
            /* Unique keys all on this shard: the rows land in the caller's array at once. */
            bool in_place = t->unique && k == t->uniq;
            atomic_fetch_add_explicit(&c->direct_calls, 1, memory_order_relaxed);
            rc = d->pull(d->ctx, s, t->table, t->dim, k, m, in_place ? t->rows : buf, readonly);
            const uint32_t *uidx = t->order + t->shard_start[s];
            for (size_t j = 0; !rc && !in_place && j < m; j++) {
                const float *src = buf + j * dim;
                if (t->unique) {
                    memcpy(t->rows + (size_t)uidx[j] * dim, src, rowb);
                    continue;
                }
                for (int32_t i = t->first[uidx[j]]; i >= 0; i = t->next[i])
                    memcpy(t->rows + (size_t)i * dim, src, rowb);
            }
        }
        if (rc) rc = name_shard(c, s, rc);
    }
    free(keys);
    free(buf);
    free(sums);
    return rc;
}

int cl_direct_run(gr_client_op *op, const gr_client_batch *b, bool rows, bool push,
                  bool readonly)
{
    gr_client *c = op->cl;
    uint64_t t0 = gr_thread_cpu_ns();
    /* Every gradient is checked before any is applied: a push refused for one value changes
     * nothing anywhere, as on the socket path. */
    int rc = push ? cl_check_grads(b, op->plan.nb) : GR_OK;
    for (size_t bi = 0; !rc && bi < op->plan.nb; bi++)
        rc = run_table(c, &op->plan.tb[bi], push ? b[bi].grads : NULL, rows, push, readonly);
    atomic_fetch_add_explicit(&c->direct_ns, gr_thread_cpu_ns() - t0, memory_order_relaxed);
    return rc;
}

/* An op that is already complete (remaining 0, no requests): what a direct start returns. */
static int done_op(gr_client *c, uint16_t opcode, gr_client_op **op)
{
    *op = cl_op_new(c, opcode);
    return *op ? GR_OK : gr_seterr(GR_ENOMEM, "cannot allocate an operation");
}

bool cl_direct_has(const gr_client *c, uint16_t opcode)
{
    if (!cl_direct_usable(c)) return false;
    switch (opcode) {
    case GR_OP_SYNC_ACQUIRE:
        return c->direct.acquire != NULL;
    case GR_OP_PUSH_STEP:
        return c->direct.push_step != NULL;
    case GR_OP_DENSE_PULL:
        return c->direct.dense_pull != NULL;
    case GR_OP_DENSE_PUSH:
        return c->direct.dense_push != NULL;
    default:
        return false;
    }
}

int cl_direct_acquire(gr_client *c, uint32_t worker, const uint64_t *want, uint32_t timeout_ms,
                      uint64_t *tags, uint64_t *current, gr_client_op **op)
{
    uint64_t t0 = gr_thread_cpu_ns();
    int rc = GR_OK;
    /* One shard after the other: the step starts once every shard says so, in any order. */
    for (uint32_t s = 0; !rc && s < c->link.nshards; s++) {
        uint64_t cur = 0;
        atomic_fetch_add_explicit(&c->direct_calls, 1, memory_order_relaxed);
        rc = c->direct.acquire(c->direct.ctx, s, worker, want[s], timeout_ms, &tags[s], &cur);
        if (rc) rc = name_shard(c, s, rc);
        else if (current) current[s] = cur;
    }
    atomic_fetch_add_explicit(&c->direct_ns, gr_thread_cpu_ns() - t0, memory_order_relaxed);
    return rc ? rc : done_op(c, GR_OP_SYNC_ACQUIRE, op);
}

int cl_direct_push_step(gr_client_op *o, uint32_t worker, const uint64_t *tags,
                        const gr_client_batch *b, size_t nb, const gr_client_dense_grad *d,
                        size_t nd, uint32_t *outcomes)
{
    gr_client *c = o->cl;
    cl_plan *p = &o->plan;
    uint64_t t0 = gr_thread_cpu_ns();
    int rc = nb ? cl_check_grads(b, nb) : GR_OK;
    float **sums = calloc(nb ? nb : 1, sizeof *sums);
    const float **gs = calloc(nb ? nb : 1, sizeof *gs);
    gr_client_batch *part = calloc(nb ? nb : 1, sizeof *part);
    gr_client_dense_grad *mine = calloc(nd ? nd : 1, sizeof *mine);
    uint64_t **keys = calloc(nb ? nb : 1, sizeof *keys);
    float **grads = calloc(nb ? nb : 1, sizeof *grads);
    if (!rc && (!sums || !gs || !part || !mine || !keys || !grads))
        rc = gr_seterr(GR_ENOMEM, "out of memory for a direct step push");
    for (size_t bi = 0; !rc && bi < nb; bi++) {
        const cl_tbl *t = &p->tb[bi];
        size_t most = 0;
        for (uint32_t s = 0; s < c->link.nshards; s++) {
            size_t m = t->shard_start[s + 1] - t->shard_start[s];
            if (m > most) most = m;
        }
        gs[bi] = summed_grads(t, b[bi].grads, &sums[bi]);
        keys[bi] = malloc((most ? most : 1) * sizeof **keys);
        grads[bi] = malloc((most ? most : 1) * t->dim * sizeof **grads);
        if ((t->n && !gs[bi]) || !keys[bi] || !grads[bi])
            rc = gr_seterr(GR_ENOMEM, "out of memory for a direct step push");
    }
    /* Every shard gets its call, rows or not: each one's step advances with it. */
    for (uint32_t s = 0; !rc && s < c->link.nshards; s++) {
        size_t np = 0, nm = 0;
        for (size_t bi = 0; bi < nb; bi++) {
            const cl_tbl *t = &p->tb[bi];
            const uint64_t *k;
            const float *gp;
            size_t m = shard_part(t, s, gs[bi], keys[bi], grads[bi], &k, &gp);
            if (m == 0) continue;
            part[np++] = (gr_client_batch){.table = t->table, .dim = t->dim, .n = m, .keys = k,
                                           .grads = gp, .flags = GR_CLIENT_BATCH_UNIQUE};
        }
        for (size_t i = 0; i < nd; i++)
            if (cl_dense_owner(c, d[i].name) == s) mine[nm++] = d[i];
        uint32_t oc = 0;
        atomic_fetch_add_explicit(&c->direct_calls, 1, memory_order_relaxed);
        rc = c->direct.push_step(c->direct.ctx, s, worker, tags[s], part, np, mine, nm, &oc);
        if (rc) rc = name_shard(c, s, rc);
        else if (outcomes) outcomes[s] = oc;
    }
    for (size_t bi = 0; bi < nb; bi++) {
        if (sums) free(sums[bi]);
        if (keys) free(keys[bi]);
        if (grads) free(grads[bi]);
    }
    free(sums);
    free(gs);
    free(part);
    free(mine);
    free(keys);
    free(grads);
    atomic_fetch_add_explicit(&c->direct_ns, gr_thread_cpu_ns() - t0, memory_order_relaxed);
    return rc;
}

int cl_direct_dense_pull(gr_client *c, const char *name, float *out, size_t n)
{
    uint32_t s = cl_dense_owner(c, name);
    atomic_fetch_add_explicit(&c->direct_calls, 1, memory_order_relaxed);
    int rc = c->direct.dense_pull(c->direct.ctx, s, name, out, n);
    return rc ? name_shard(c, s, rc) : GR_OK;
}

int cl_direct_dense_push(gr_client *c, const char *name, const float *grad, size_t n)
{
    uint32_t s = cl_dense_owner(c, name);
    atomic_fetch_add_explicit(&c->direct_calls, 1, memory_order_relaxed);
    int rc = c->direct.dense_push(c->direct.ctx, s, name, grad, n);
    return rc ? name_shard(c, s, rc) : GR_OK;
}

int cl_direct_done_op(gr_client *c, uint16_t opcode, gr_client_op **op)
{
    return done_op(c, opcode, op);
}
