/* Direct table operations: PULL and PUSH of one table's rows, and DENSE_PULL and DENSE_PUSH,
 * for a caller in this process
 * (the embedded cluster's own trainer, through its client's direct hooks), run on the
 * caller's thread without a frame, a socket or a hop to the worker pool. They check what a
 * PULL or PUSH request is checked for (the shard is started and not stopping, the fence, the
 * table exists, the dim, every key routed here, finite gradients), count into the same
 * per-opcode stats (requests, errors, keys) and wake the grow thread as a request does, so
 * `granary stats`, /metrics and the row memory ahead see them like any other. */
#include "server/server_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int srv_direct_admit(gr_server *s, uint16_t op)
{
    atomic_fetch_add(&s->ops[op].count, 1);
    int rc = GR_OK;
    if (!s->started || atomic_load(&s->stopping)) {
        rc = gr_seterr(GR_ESHUTDOWN, "shard %u is %s: %s refused", s->cfg.shard,
                       s->started ? "stopping" : "not started", gr_proto_op_name(op));
    } else {
        char msg[256];
        gr_proto_header h = {GR_PROTO_VERSION, GR_PROTO_REQUEST, op, 0, 0, 0, 0};
        int frc = srv_fence_check(s, srv_op_row_of(op), &h, msg, sizeof msg);
        if (frc) rc = gr_seterr(frc, "%s", msg);
    }
    if (rc) atomic_fetch_add(&s->ops[op].errors, 1);
    return rc;
}

/* Everything checked before the table is touched; a reference to the table on success. */
static srv_entry *direct_begin(gr_server *s, uint16_t op, uint32_t table, uint32_t dim,
                               const uint64_t *keys, size_t n, int *rc)
{
    const char *opname = gr_proto_op_name(op);
    if (!s) {
        *rc = gr_seterr(GR_EINVAL, "direct %s: no server", opname);
        return NULL;
    }
    if ((*rc = srv_direct_admit(s, op))) return NULL;
    if (n > UINT32_MAX) {
        *rc = gr_seterr(GR_ETOOBIG, "direct %s of %zu keys: at most %u", opname, n, UINT32_MAX);
        goto fail;
    }
    srv_entry *e = srv_registry_get(&s->reg, false, NULL, table);
    if (!e) {
        *rc = gr_seterr(GR_ENOENT, "no table with id %u on shard %u", table, s->cfg.shard);
        goto fail;
    }
    uint32_t have = gr_table_get_spec(e->table)->dim;
    if (have != dim) {
        *rc = gr_seterr(GR_EDIM, "table '%s' has dim %u, %s carried dim %u", e->name, have, opname,
                        dim);
        srv_entry_put(e);
        goto fail;
    }
    gr_proto_section sec = {0};
    sec.table = table;
    sec.dim = dim;
    sec.n = (uint32_t)n;
    sec.keys = keys;
    *rc = srv_check_routing(s, &sec);
    if (*rc) {
        srv_entry_put(e);
        goto fail;
    }
    atomic_fetch_add(&s->ops[op].keys, n);
    return e;
fail:
    atomic_fetch_add(&s->ops[op].errors, 1);
    return NULL;
}

static int direct_end(gr_server *s, uint16_t op, srv_entry *e, int rc)
{
    srv_entry_put(e);
    if (rc) atomic_fetch_add(&s->ops[op].errors, 1);
    srv_grow_kick(s); /* rows it created may have used up the memory handed out ahead */
    return rc;
}

int gr_server_direct_pull(gr_server *s, uint32_t table, uint32_t dim, const uint64_t *keys,
                          size_t n, float *rows, bool readonly)
{
    int rc;
    srv_entry *e = direct_begin(s, GR_OP_PULL, table, dim, keys, n, &rc);
    if (!e) return rc;
    rc = n ? gr_table_lookup(e->table, keys, n, rows, readonly ? GR_LOOKUP_READONLY : 0) : GR_OK;
    return direct_end(s, GR_OP_PULL, e, rc);
}

int gr_server_direct_push(gr_server *s, uint32_t table, uint32_t dim, const uint64_t *keys,
                          size_t n, const float *grads)
{
    int rc;
    srv_entry *e = direct_begin(s, GR_OP_PUSH, table, dim, keys, n, &rc);
    if (!e) return rc;
    rc = n ? gr_table_apply(e->table, keys, n, grads) : GR_OK; /* checks the gradients first */
    return direct_end(s, GR_OP_PUSH, e, rc);
}

/* The dense parameter `name` of n floats, with a reference, after the request checks. */
static srv_entry *direct_dense(gr_server *s, uint16_t op, const char *name, size_t n, int *rc)
{
    if (!s) {
        *rc = gr_seterr(GR_EINVAL, "direct %s: no server", gr_proto_op_name(op));
        return NULL;
    }
    if ((*rc = srv_direct_admit(s, op))) return NULL;
    srv_entry *e = NULL;
    if (!name || !*name || strlen(name) >= GR_TABLE_NAME_MAX) {
        *rc = gr_seterr(GR_EINVAL, "bad dense parameter name");
    } else if ((e = srv_get_dense(s, name, rc)) && e->dense_size != n) {
        *rc = gr_seterr(GR_EDIM, "dense parameter '%s' has %llu floats, %s carried %zu", name,
                        (unsigned long long)e->dense_size, gr_proto_op_name(op), n);
        srv_entry_put(e);
        e = NULL;
    }
    if (!e) {
        atomic_fetch_add(&s->ops[op].errors, 1);
        return NULL;
    }
    atomic_fetch_add(&s->ops[op].keys, n);
    return e;
}

int gr_server_direct_dense_pull(gr_server *s, const char *name, float *out, size_t n)
{
    int rc;
    srv_entry *e = direct_dense(s, GR_OP_DENSE_PULL, name, n, &rc);
    if (!e) return rc;
    /* The last chunk may run past the array: whole chunks into room, then n floats out. */
    float *room = n % e->chunk ? malloc((n / e->chunk + 1) * e->chunk * sizeof *room) : out;
    rc = room ? srv_dense_lookup(e, room)
              : gr_seterr(GR_ENOMEM, "cannot allocate a dense pull of %zu floats", n);
    if (room && room != out) {
        if (!rc) memcpy(out, room, n * sizeof *out);
        free(room);
    }
    return direct_end(s, GR_OP_DENSE_PULL, e, rc);
}

int gr_server_direct_dense_push(gr_server *s, const char *name, const float *grad, size_t n)
{
    int rc;
    srv_entry *e = direct_dense(s, GR_OP_DENSE_PUSH, name, n, &rc);
    if (!e) return rc;
    return direct_end(s, GR_OP_DENSE_PUSH, e, srv_dense_apply(e, grad));
}
