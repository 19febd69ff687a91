/* Checkpoint calls through the servers (docs/checkpoints.md, "Through the servers"): save on
 * every shard then commit on shard 0, and load (resolved once on shard 0, then on every
 * shard). Their requests wait as long as the disks need, not the request timeout. */
#include "client/op.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An op of one request per listed shard with the same body, whose deadline is timeout_ms
 * (checkpoint requests take as long as the disk needs, not the request timeout). */
static int ckpt_run(gr_client *c, const uint32_t *shards, uint32_t n, uint16_t opcode,
                    const gr_proto_buf *body, uint32_t timeout_ms, gr_client_op **out)
{
    int rc = cl_op_run(c, shards, n, opcode, body, timeout_ms, out);
    if (!rc && (rc = cl_op_result(*out))) {
        cl_op_free(*out);
        *out = NULL;
    }
    return rc;
}

static gr_proto_strv strv(const char *s) { return (gr_proto_strv){s ? s : "", s ? (uint32_t)strlen(s) : 0}; }

int gr_client_ckpt_save(gr_client *c, const gr_client_ckpt_opts *o, gr_client_ckpt_info *info)
{
    gr_client_ckpt_info inf;
    memset(&inf, 0, sizeof inf);
    if (info) memset(info, 0, sizeof *info);
    if (!c || !o || !o->root || !*o->root)
        return gr_seterr(GR_EINVAL, "a checkpoint save needs a root directory");
    if (o->zstd_level < 0 || o->zstd_level > 19)
        return gr_seterr(GR_EINVAL, "zstd level %d is outside 0..19", o->zstd_level);
    uint32_t timeout = o->timeout_ms ? o->timeout_ms : 3600000u;
    double t0 = gr_now_s();
    snprintf(inf.name, sizeof inf.name, "step-%012llu", (unsigned long long)o->step);
    inf.step = o->step;
    uint32_t *shards = cl_all_shards(c);
    if (!shards) return gr_seterr(GR_ENOMEM, "out of memory");
    gr_proto_buf body;
    gr_proto_buf_init(&body);
    gr_proto_ckpt_save sv = {o->step, o->incremental ? GR_PROTO_CKPT_INCREMENTAL : 0,
                             o->zstd_level, o->full_every, strv(o->root), strv(inf.name),
                             strv(o->incremental ? o->parent : NULL)};
    int rc = gr_proto_put_ckpt_save(&body, &sv);
    gr_client_op *op = NULL;
    if (!rc) rc = ckpt_run(c, shards, c->link.nshards, GR_OP_CKPT_SAVE, &body, timeout, &op);
    free(shards);
    gr_proto_buf_fini(&body);
    if (rc) return rc;
    bool first = true;
    for (size_t i = 0; !rc && i < op->nreqs; i++) {
        gr_proto_ckpt_saved r;
        rc = gr_proto_decode_ckpt_saved(op->reqs[i]->reply, op->reqs[i]->reply_len, &r);
        if (rc) break;
        inf.delta |= r.kind == 1;
        inf.rows += r.rows;
        inf.bytes += r.bytes;
        inf.dense += r.ndense;
        double secs = (double)r.usec / 1e6;
        if (secs > inf.shard_seconds_max) inf.shard_seconds_max = secs;
        if (r.sync_job) {
            if (first) inf.sync_agree = true;
            else if (!inf.sync_job || r.sync_step != inf.sync_step) inf.sync_agree = false;
            if (r.sync_step > inf.sync_step) inf.sync_step = r.sync_step;
            inf.sync_job = true;
        } else if (inf.sync_job) {
            inf.sync_agree = false;
        }
        first = false;
    }
    cl_op_free(op);
    if (rc) return rc;
    if (o->same_step && !(inf.sync_job && inf.sync_agree))
        return gr_seterr(GR_ESTALE,
                         "%s: the shards were not all at one sync step (%s): not committed",
                         inf.name, inf.sync_job ? "they disagree" : "no sync job on some shard");
    /* Every shard's file is durable: now, and only now, the manifest. */
    gr_proto_buf_init(&body);
    gr_proto_ckpt_commit cm = {c->link.nshards, o->keep, strv(o->root), strv(inf.name),
                               strv(inf.delta ? o->parent : NULL), strv(o->meta)};
    uint32_t zero = 0;
    rc = gr_proto_put_ckpt_commit(&body, &cm);
    if (!rc) rc = ckpt_run(c, &zero, 1, GR_OP_CKPT_COMMIT, &body, timeout, &op);
    gr_proto_buf_fini(&body);
    if (rc) return rc;
    gr_proto_ckpt_committed cr;
    rc = gr_proto_decode_ckpt_committed(op->reqs[0]->reply, op->reqs[0]->reply_len, &cr);
    cl_op_free(op);
    if (rc) return rc;
    inf.deleted = cr.deleted;
    inf.seconds = gr_now_s() - t0;
    if (info) *info = inf;
    return GR_OK;
}

/* One CKPT_LOAD round: to shard 0 only (resolve) or to every shard. */
static int ckpt_load_round(gr_client *c, const char *root, const char *name, bool resolve,
                           gr_client_ckpt_loaded *out)
{
    uint32_t *shards = cl_all_shards(c);
    if (!shards) return gr_seterr(GR_ENOMEM, "out of memory");
    gr_proto_buf body;
    gr_proto_buf_init(&body);
    gr_proto_ckpt_load ld = {resolve ? GR_PROTO_CKPT_RESOLVE : 0, strv(root), strv(name)};
    int rc = gr_proto_put_ckpt_load(&body, &ld);
    gr_client_op *op = NULL;
    if (!rc) rc = ckpt_run(c, shards, resolve ? 1 : c->link.nshards, GR_OP_CKPT_LOAD, &body, 3600000u, &op);
    free(shards);
    gr_proto_buf_fini(&body);
    if (rc) return rc;
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    lim.max_string = UINT32_MAX;
    out->rows = 0;
    for (size_t i = 0; !rc && i < op->nreqs; i++) {
        gr_proto_ckpt_loaded r;
        rc = gr_proto_decode_ckpt_loaded(op->reqs[i]->reply, op->reqs[i]->reply_len, &lim, &r);
        if (rc) break;
        out->rows += r.rows_loaded;
        if (i > 0) continue;
        if (r.name.n >= sizeof out->name) {
            rc = gr_seterr(GR_EPROTO, "checkpoint name of %u bytes is too long", r.name.n);
            break;
        }
        memcpy(out->name, r.name.p, r.name.n);
        out->name[r.name.n] = '\0';
        out->step = r.step;
        out->shards = r.shards;
        free(out->meta);
        out->meta = NULL;
        if (r.meta.n) {
            out->meta = strndup(r.meta.p, r.meta.n);
            if (!out->meta) rc = gr_seterr(GR_ENOMEM, "out of memory");
        }
    }
    cl_op_free(op);
    return rc;
}

int gr_client_ckpt_load(gr_client *c, const char *root, const char *name, bool resolve_only,
                        gr_client_ckpt_loaded *out)
{
    if (!out) return gr_seterr(GR_EINVAL, "gr_client_ckpt_load: NULL output");
    memset(out, 0, sizeof *out);
    if (!c || !root || !*root) return gr_seterr(GR_EINVAL, "a checkpoint load needs a root directory");
    double t0 = gr_now_s();
    /* Resolve once, on shard 0, so every shard loads the same checkpoint even if a newer one
     * is committed meanwhile. */
    int rc = ckpt_load_round(c, root, name, true, out);
    if (!rc && !resolve_only) {
        char nm[64];
        snprintf(nm, sizeof nm, "%s", out->name);
        /* A root that is itself a checkpoint is named by its own path. */
        bool self = !name || !*name;
        if (self) {
            size_t rl = strlen(root), nl = strlen(nm);
            while (rl > 1 && root[rl - 1] == '/') rl--;
            self = rl >= nl && !memcmp(root + rl - nl, nm, nl) &&
                   (rl == nl || root[rl - nl - 1] == '/');
        }
        rc = ckpt_load_round(c, root, self ? NULL : nm, false, out);
    }
    if (rc) {
        free(out->meta);
        out->meta = NULL;
        return rc;
    }
    out->seconds = gr_now_s() - t0;
    return GR_OK;
}
