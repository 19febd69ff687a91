/* Control calls: tables (create, drop, describe, evict), dense parameters (create, pull, push,
 * set, and their async forms), stats and shutdown. Each is one op of small requests (op.c);
 * replies are read after the wait, except the async dense pull's, which lands in the caller's
 * output as it arrives. */
#include "client/op.h"
#include "client/check.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ctl_all_str(gr_client *c, uint16_t opcode, const char *str, gr_client_op **op)
{
    gr_proto_buf body;
    gr_proto_buf_init(&body);
    uint32_t *shards = cl_all_shards(c);
    int rc = shards ? GR_OK : gr_seterr(GR_ENOMEM, "out of memory");
    if (!rc && str) rc = gr_proto_put_str(&body, str, strlen(str));
    if (!rc) rc = cl_op_run(c, shards, c->link.nshards, opcode, &body, 0, op);
    free(shards);
    gr_proto_buf_fini(&body);
    return rc;
}

/* When every shard failed with GR_ENOENT the result is GR_ENOENT; otherwise the first other
 * error, or 0. */
static int all_or_enoent(gr_client_op *op, size_t *found)
{
    size_t ok = 0;
    for (size_t i = 0; i < op->nreqs; i++) {
        cl_req *r = op->reqs[i];
        if (r->rc == 0) ok++;
        else if (r->rc != GR_ENOENT)
            return gr_seterr(r->rc, "shard %u (%s): %s", r->shard, op->cl->conns[r->shard].addr,
                             r->msg);
    }
    if (found) *found = ok;
    if (ok == 0 && op->nreqs) return gr_seterr(GR_ENOENT, "%s", op->reqs[0]->msg);
    return GR_OK;
}

int gr_client_create_table(gr_client *c, const char *spec_json)
{
    if (!spec_json) return gr_seterr(GR_EINVAL, "NULL table spec");
    gr_client_op *op;
    int rc = ctl_all_str(c, GR_OP_CREATE_TABLE, spec_json, &op);
    if (rc) return rc;
    rc = cl_op_result(op);
    cl_op_free(op);
    return rc;
}

int gr_client_drop_table(gr_client *c, const char *name)
{
    if (!name || !*name) return gr_seterr(GR_EINVAL, "empty table name");
    gr_client_op *op;
    int rc = ctl_all_str(c, GR_OP_DROP_TABLE, name, &op);
    if (rc) return rc;
    rc = all_or_enoent(op, NULL);
    cl_op_free(op);
    return rc;
}

static cJSON *reply_json(const cl_req *r)
{
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    lim.max_string = UINT32_MAX;
    const char *s = NULL;
    uint32_t n = 0;
    if (gr_proto_decode_str(r->reply, r->reply_len, &lim, &s, &n)) return NULL;
    return cJSON_ParseWithLength(s, n);
}

int gr_client_describe_table(gr_client *c, const char *name, char **json)
{
    if (!name || !*name || !json) return gr_seterr(GR_EINVAL, "describe needs a name and an output");
    *json = NULL;
    gr_client_op *op;
    int rc = ctl_all_str(c, GR_OP_DESCRIBE_TABLE, name, &op);
    if (rc) return rc;
    rc = all_or_enoent(op, NULL);
    cJSON *out = rc ? NULL : cJSON_CreateObject();
    cJSON *shards = out ? cJSON_AddArrayToObject(out, "shards") : NULL;
    double rows = 0, bytes = 0;
    bool have_spec = false;
    for (size_t i = 0; !rc && i < op->nreqs; i++) {
        cl_req *r = op->reqs[i];
        if (r->rc) continue;
        cJSON *root = reply_json(r);
        cJSON *ent = NULL;
        const char *arrays[] = {"tables", "dense"};
        for (int a = 0; a < 2 && !ent; a++) {
            cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, arrays[a]);
            cJSON *it;
            cJSON_ArrayForEach(it, arr)
            {
                cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "spec");
                cJSON *nm = cJSON_GetObjectItemCaseSensitive(sp, "name");
                if (cJSON_IsString(nm) && !strcmp(nm->valuestring, name)) {
                    ent = it;
                    break;
                }
            }
        }
        if (!ent) {
            cJSON_Delete(root);
            rc = gr_seterr(GR_EPROTO, "shard %u (%s): describe reply does not hold '%s'", r->shard,
                           c->conns[r->shard].addr, name);
            break;
        }
        double sr = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(ent, "rows"));
        double sb = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(ent, "bytes"));
        rows += sr;
        bytes += sb;
        if (!have_spec) {
            cJSON_AddItemToObject(out, "spec",
                                  cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(ent, "spec"), 1));
            cJSON *size = cJSON_GetObjectItemCaseSensitive(ent, "size");
            if (cJSON_IsNumber(size)) cJSON_AddNumberToObject(out, "size", size->valuedouble);
            have_spec = true;
        }
        cJSON *sh = cJSON_CreateObject();
        cJSON_AddNumberToObject(sh, "shard", r->shard);
        cJSON_AddNumberToObject(sh, "rows", sr);
        cJSON_AddNumberToObject(sh, "bytes", sb);
        cJSON_AddItemToArray(shards, sh);
        cJSON_Delete(root);
    }
    cl_op_free(op);
    if (!rc) {
        cJSON_AddNumberToObject(out, "rows", rows);
        cJSON_AddNumberToObject(out, "bytes", bytes);
        *json = cJSON_PrintUnformatted(out);
        if (!*json) rc = gr_seterr(GR_ENOMEM, "out of memory");
    }
    cJSON_Delete(out);
    return rc;
}

int gr_client_evict(gr_client *c, const char *name, uint64_t *evicted)
{
    gr_client_op *op;
    int rc = ctl_all_str(c, GR_OP_EVICT, name ? name : "", &op);
    if (rc) return rc;
    rc = cl_op_result(op);
    uint64_t total = 0;
    for (size_t i = 0; !rc && i < op->nreqs; i++) {
        uint64_t v[1] = {0};
        uint32_t cnt = 0;
        rc = gr_proto_decode_u64s(op->reqs[i]->reply, op->reqs[i]->reply_len, 1, v, &cnt);
        total += v[0];
    }
    cl_op_free(op);
    if (!rc && evicted) *evicted = total;
    return rc;
}

int gr_client_dense_create(gr_client *c, const char *spec_json)
{
    if (!spec_json) return gr_seterr(GR_EINVAL, "NULL dense spec");
    cJSON *root = cJSON_Parse(spec_json);
    cJSON *nm = root ? cJSON_GetObjectItemCaseSensitive(root, "name") : NULL;
    if (!cJSON_IsString(nm) || cl_check_dense_name(nm->valuestring)) {
        cJSON_Delete(root);
        return gr_seterr(GR_EINVAL, "dense spec needs a \"name\" of 1..63 bytes");
    }
    uint32_t shard = cl_dense_owner(c, nm->valuestring);
    cJSON_Delete(root);
    gr_proto_buf body;
    gr_proto_buf_init(&body);
    int rc = gr_proto_put_str(&body, spec_json, strlen(spec_json));
    gr_client_op *op = NULL;
    if (!rc) rc = cl_op_run(c, &shard, 1, GR_OP_DENSE_CREATE, &body, 0, &op);
    gr_proto_buf_fini(&body);
    if (rc) return rc;
    rc = cl_op_result(op);
    cl_op_free(op);
    return rc;
}

int gr_client_dense_pull(gr_client *c, const char *name, float *out, size_t n)
{
    int rc = cl_check_dense_name(name);
    if (rc) return rc;
    if (n && !out) return gr_seterr(GR_EINVAL, "NULL output");
    if (cl_direct_has(c, GR_OP_DENSE_PULL)) return cl_direct_dense_pull(c, name, out, n);
    uint32_t shard = cl_dense_owner(c, name);
    gr_proto_buf body;
    gr_proto_buf_init(&body);
    rc = gr_proto_put_str(&body, name, strlen(name));
    gr_client_op *op = NULL;
    if (!rc) rc = cl_op_run(c, &shard, 1, GR_OP_DENSE_PULL, &body, 0, &op);
    gr_proto_buf_fini(&body);
    if (rc) return rc;
    rc = cl_op_result(op);
    if (!rc) {
        uint64_t size = 0;
        const float *vals = NULL;
        rc = gr_proto_decode_dense_values(op->reqs[0]->reply, op->reqs[0]->reply_len, &size, &vals);
        if (!rc && size != n)
            rc = gr_seterr(GR_EDIM, "dense parameter '%s' has %llu floats, the caller expected %zu",
                           name, (unsigned long long)size, n);
        if (!rc && n) memcpy(out, vals, n * sizeof *out);
    }
    cl_op_free(op);
    return rc;
}

int gr_client_dense_push(gr_client *c, const char *name, const float *grad, size_t n)
{
    int rc = cl_check_dense_name(name);
    if (rc) return rc;
    if (n && !grad) return gr_seterr(GR_EINVAL, "NULL gradient");
    if (cl_check_dense_grads(&(gr_client_dense_grad){name, grad, n}, 1)) return GR_EINVAL;
    if (cl_direct_has(c, GR_OP_DENSE_PUSH)) return cl_direct_dense_push(c, name, grad, n);
    uint32_t shard = cl_dense_owner(c, name);
    gr_proto_buf body;
    gr_proto_buf_init(&body);
    rc = gr_proto_put_str(&body, name, strlen(name));
    if (!rc) rc = gr_proto_put_u64(&body, n);
    if (!rc) rc = gr_proto_put_bytes(&body, grad, n * sizeof *grad);
    gr_client_op *op = NULL;
    if (!rc) rc = cl_op_run(c, &shard, 1, GR_OP_DENSE_PUSH, &body, 0, &op);
    gr_proto_buf_fini(&body);
    if (rc) return rc;
    rc = cl_op_result(op);
    cl_op_free(op);
    return rc;
}

int gr_client_stats(gr_client *c, uint32_t shard, char **json)
{
    if (!json || shard >= c->link.nshards) return gr_seterr(GR_EINVAL, "no shard %u", shard);
    *json = NULL;
    gr_client_op *op;
    int rc = cl_op_run(c, &shard, 1, GR_OP_STATS, NULL, 0, &op);
    if (rc) return rc;
    rc = cl_op_result(op);
    if (!rc) {
        gr_proto_limits lim;
        gr_proto_limits_default(&lim);
        lim.max_string = UINT32_MAX;
        const char *s = NULL;
        uint32_t n = 0;
        rc = gr_proto_decode_str(op->reqs[0]->reply, op->reqs[0]->reply_len, &lim, &s, &n);
        if (!rc) {
            *json = strndup(s, n);
            if (!*json) rc = gr_seterr(GR_ENOMEM, "out of memory");
        }
    }
    cl_op_free(op);
    return rc;
}

int gr_client_call(gr_client *c, uint32_t shard, uint16_t opcode, const void *body, size_t len,
                   uint32_t timeout_ms, void **reply, size_t *reply_len)
{
    *reply = NULL;
    *reply_len = 0;
    if (shard >= c->link.nshards) return gr_seterr(GR_EINVAL, "no shard %u", shard);
    gr_proto_buf b = {(uint8_t *)body, len, len};
    gr_client_op *op;
    int rc = cl_op_run(c, &shard, 1, opcode, len ? &b : NULL, timeout_ms, &op);
    if (rc) return rc;
    rc = cl_op_result(op);
    if (!rc) {
        *reply = op->reqs[0]->reply;
        *reply_len = op->reqs[0]->reply_len;
        op->reqs[0]->reply = NULL;
    }
    cl_op_free(op);
    return rc;
}

int gr_client_shutdown(gr_client *c, int shard)
{
    if (shard >= (int)c->link.nshards) return gr_seterr(GR_EINVAL, "no shard %d", shard);
    uint32_t n = shard < 0 ? c->link.nshards : 1;
    uint32_t *shards = calloc(n, sizeof *shards);
    if (!shards) return gr_seterr(GR_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < n; i++) shards[i] = shard < 0 ? i : (uint32_t)shard;
    gr_client_op *op;
    int rc = cl_op_run(c, shards, n, GR_OP_SHUTDOWN, NULL, 0, &op);
    free(shards);
    if (rc) return rc;
    rc = cl_op_result(op);
    cl_op_free(op);
    return rc;
}

/* ---- async dense pull, dense set ---- */

/* An async DENSE_PULL reply: the values straight into the caller's output. */
static int dense_values_reply(cl_req *r, const gr_proto_header *h, uint8_t *body, bool *fatal)
{
    gr_client_op *op = r->ctx;
    uint64_t size = 0;
    const float *vals = NULL;
    int rc = gr_proto_decode_dense_values(body, h->body_len, &size, &vals);
    if (rc) {
        *fatal = true;
        return rc;
    }
    if (size != op->dense_n)
        return gr_seterr(GR_EDIM, "dense parameter has %llu floats, the caller expected %zu",
                         (unsigned long long)size, op->dense_n);
    memcpy(op->dense_out, vals, size * sizeof(float));
    return GR_OK;
}

/* Builds a one-request op to the owner of a dense parameter: body = str name [+ u64 n +
 * floats]. */
static int dense_op(gr_client *c, uint16_t opcode, const char *name, const float *vals, size_t n,
                    gr_client_op **out)
{
    *out = NULL;
    int rc = cl_check_dense_name(name);
    if (rc) return rc;
    gr_client_op *op = cl_op_new(c, opcode);
    if (!op) return gr_seterr(GR_ENOMEM, "cannot allocate an operation");
    cl_req *r = cl_op_add_req(op, cl_dense_owner(c, name));
    rc = r ? gr_proto_begin(&r->frame, GR_PROTO_REQUEST, opcode, 0, 0, r->id)
           : gr_seterr(GR_ENOMEM, "out of memory");
    if (!rc) rc = gr_proto_put_str(&r->frame, name, strlen(name));
    if (!rc && vals) rc = gr_proto_put_u64(&r->frame, n);
    if (!rc && vals) rc = gr_proto_put_bytes(&r->frame, vals, n * sizeof *vals);
    if (!rc) rc = gr_proto_end(&r->frame, 0);
    if (rc) {
        cl_op_free(op);
        return rc;
    }
    *out = op;
    return GR_OK;
}

int gr_client_dense_pull_start(gr_client *c, const char *name, float *out, size_t n,
                               gr_client_op **op)
{
    if (!op) return gr_seterr(GR_EINVAL, "no place for the operation handle");
    *op = NULL;
    if (n && !out) return gr_seterr(GR_EINVAL, "NULL output");
    if (cl_direct_has(c, GR_OP_DENSE_PULL)) { /* done by the time this returns */
        int rc = cl_check_dense_name(name);
        if (!rc) rc = cl_direct_dense_pull(c, name, out, n);
        return rc ? rc : cl_direct_done_op(c, GR_OP_DENSE_PULL, op);
    }
    gr_client_op *o;
    int rc = dense_op(c, GR_OP_DENSE_PULL, name, NULL, 0, &o);
    if (rc) return rc;
    o->dense_out = out;
    o->dense_n = n;
    o->reqs[0]->on_reply = dense_values_reply;
    rc = cl_op_send(o);
    if (rc) {
        cl_op_free(o);
        return rc;
    }
    *op = o;
    return GR_OK;
}

int gr_client_dense_push_start(gr_client *c, const char *name, const float *grad, size_t n,
                               gr_client_op **op)
{
    if (!op) return gr_seterr(GR_EINVAL, "no place for the operation handle");
    *op = NULL;
    if (!grad || !n) return gr_seterr(GR_EINVAL, "dense push needs a gradient");
    if (cl_check_dense_grads(&(gr_client_dense_grad){name, grad, n}, 1)) return GR_EINVAL;
    if (cl_direct_has(c, GR_OP_DENSE_PUSH)) { /* done by the time this returns */
        int rc = cl_check_dense_name(name);
        if (!rc) rc = cl_direct_dense_push(c, name, grad, n);
        return rc ? rc : cl_direct_done_op(c, GR_OP_DENSE_PUSH, op);
    }
    gr_client_op *o;
    int rc = dense_op(c, GR_OP_DENSE_PUSH, name, grad, n, &o);
    if (rc) return rc;
    rc = cl_op_send(o);
    if (rc) {
        cl_op_free(o);
        return rc;
    }
    *op = o;
    return GR_OK;
}

int gr_client_dense_set(gr_client *c, const char *name, const float *values, size_t n)
{
    if (!values || !n) return gr_seterr(GR_EINVAL, "dense_set needs values");
    gr_client_op *op;
    int rc = dense_op(c, GR_OP_DENSE_SET, name, values, n, &op);
    if (rc) return rc;
    rc = cl_op_send(op);
    if (!rc) {
        cl_op_wait(op, -1);
        rc = cl_op_result(op);
    }
    cl_op_free(op);
    return rc;
}
