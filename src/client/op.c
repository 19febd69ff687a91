/* Client operations and requests: an op's lifecycle (new, add requests, send, wait with
 * deadlines, result, free) and the completion every request calls exactly once. Which frames
 * an op carries and what its replies mean is the calling module's business. */
#include "client/op.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

gr_client_op *cl_op_new(gr_client *c, uint16_t opcode)
{
    gr_client_op *op = calloc(1, sizeof *op);
    if (!op) return NULL;
    op->cl = c;
    op->opcode = opcode;
    pthread_mutex_init(&op->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&op->cv, &ca);
    pthread_condattr_destroy(&ca);
    op->deadline_ns = gr_now_ns() + (uint64_t)c->link.cfg.request_timeout_ms * 1000000u;
    op->keep_frames = c->link.stale_fn != NULL;
    return op;
}

void cl_op_free(gr_client_op *op)
{
    if (!op) return;
    for (size_t i = 0; i < op->nreqs; i++) {
        cl_req *r = op->reqs[i];
        gr_proto_buf_fini(&r->frame);
        free(r->reply);
        free(r);
    }
    free(op->reqs);
    cl_plan_fini(&op->plan);
    pthread_mutex_destroy(&op->mu);
    pthread_cond_destroy(&op->cv);
    free(op);
}

/* A request's completion: records its result in the op and counts the op down. */
static void req_done(cl_req *r, int rc, const char *msg)
{
    gr_client_op *op = r->ctx;
    char tmp[sizeof r->msg];
    if (rc) snprintf(tmp, sizeof tmp, "%s", msg && *msg ? msg : gr_strerror(rc));
    pthread_mutex_lock(&op->mu);
    r->done = true;
    r->rc = rc;
    if (rc) {
        memcpy(r->msg, tmp, sizeof tmp);
        if (!op->err) {
            op->err = rc;
            snprintf(op->msg, sizeof op->msg, "shard %u (%s): %s", r->shard,
                     op->cl->conns[r->shard].addr, tmp);
        }
    }
    op->remaining--;
    if (op->remaining == 0 || (rc && op->fail_fast)) pthread_cond_broadcast(&op->cv);
    pthread_mutex_unlock(&op->mu); /* after this the waiter may free the op */
}

cl_req *cl_op_add_req(gr_client_op *op, uint32_t shard)
{
    if (op->nreqs == op->reqcap) {
        size_t cap = op->reqcap ? op->reqcap * 2 : 8;
        cl_req **r = realloc(op->reqs, cap * sizeof *r);
        if (!r) return NULL;
        op->reqs = r;
        op->reqcap = cap;
    }
    cl_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->ctx = op;
    r->on_done = req_done;
    r->shard = shard;
    r->opcode = op->opcode;
    r->id = atomic_fetch_add(&op->cl->link.next_id, 1);
    gr_proto_buf_init(&r->frame);
    op->reqs[op->nreqs++] = r;
    return r;
}

int cl_op_send(gr_client_op *op)
{
    gr_client *c = op->cl;
    op->remaining = (uint32_t)op->nreqs;
    if (op->nreqs == 0) return GR_OK;
    /* Connect everything needed first, so a dead shard fails the call before anything is
     * sent anywhere. */
    for (size_t i = 0; i < op->nreqs; i++) {
        cl_req *r = op->reqs[i];
        if (i > 0 && op->reqs[i - 1]->shard == r->shard) continue;
        int rc = cl_conn_ensure(&c->conns[r->shard]);
        if (rc) {
            op->remaining = 0;
            return rc;
        }
    }
    size_t sent = 0;
    int first_rc = 0;
    char first_msg[800] = "";
    for (size_t i = 0; i < op->nreqs; i++) {
        cl_req *r = op->reqs[i];
        cl_conn *k = &c->conns[r->shard];
        r->deadline_ns = op->deadline_ns;
        int rc = cl_conn_send(k, r);
        if (rc == GR_OK) {
            sent++;
        } else {
            if (!first_rc) {
                first_rc = rc;
                snprintf(first_msg, sizeof first_msg, "shard %u (%s): %s", r->shard, k->addr, r->msg);
            }
            req_done(r, rc, r->msg);
        }
        if (!op->keep_frames) gr_proto_buf_fini(&r->frame);
    }
    if (sent == 0) return gr_seterr(first_rc, "%s", first_msg);
    return GR_OK;
}

static void ts_from_mono(uint64_t ns, struct timespec *ts)
{
    ts->tv_sec = (time_t)(ns / 1000000000u);
    ts->tv_nsec = (long)(ns % 1000000000u);
}

#define STALE_ROUNDS_MAX 64

static int cl_op_wait_once(gr_client_op *op, int timeout_ms);

/* After every request finished: when the only failures are stale refusals and the caller's
 * hook says the layout was re-read, sends the refused requests again (with the client's epoch
 * now) and returns true; the op is then running again. */
static bool resend_stale(gr_client_op *op)
{
    gr_client *c = op->cl;
    if (!op->keep_frames || !c->link.stale_fn || op->stale_rounds >= STALE_ROUNDS_MAX)
        return false;
    cl_req *first = NULL;
    uint32_t n = 0;
    for (size_t i = 0; i < op->nreqs; i++) {
        cl_req *r = op->reqs[i];
        if (!r->rc) continue;
        if (r->rc != GR_ESTALE || !r->frame.len) return false;
        if (!first) first = r;
        n++;
    }
    if (!first || gr_now_ns() >= op->deadline_ns) return false;
    op->stale_rounds++;
    if (c->link.stale_fn(c->link.stale_ctx, c, first->shard, first->epoch, first->msg) != 0)
        return false;
    if (gr_now_ns() >= op->deadline_ns) return false;
    pthread_mutex_lock(&op->mu);
    op->err = 0;
    op->msg[0] = '\0';
    op->remaining = n;
    for (size_t i = 0; i < op->nreqs; i++) {
        cl_req *r = op->reqs[i];
        if (!r->rc) continue;
        r->done = false;
        r->rc = 0;
        r->msg[0] = '\0';
    }
    pthread_mutex_unlock(&op->mu);
    for (size_t i = 0; i < op->nreqs; i++) {
        cl_req *r = op->reqs[i];
        if (r->done || !r->frame.len) continue; /* answered, or not kept */
        cl_conn *k = &c->conns[r->shard];
        int rc = cl_conn_ensure(k);
        if (rc) snprintf(r->msg, sizeof r->msg, "%s", gr_errmsg());
        else rc = cl_conn_send(k, r);
        if (rc) req_done(r, rc, r->msg);
    }
    return true;
}

int cl_op_wait(gr_client_op *op, int timeout_ms)
{
    for (;;) {
        int rc = cl_op_wait_once(op, timeout_ms);
        if (rc || !op->err || !resend_stale(op)) return rc;
    }
}

static int cl_op_wait_once(gr_client_op *op, int timeout_ms)
{
    uint64_t until = op->deadline_ns;
    bool caller_limit = false;
    if (timeout_ms >= 0) {
        uint64_t t = gr_now_ns() + (uint64_t)timeout_ms * 1000000u;
        if (t < until) {
            until = t;
            caller_limit = true;
        }
    }
    pthread_mutex_lock(&op->mu);
    while (op->remaining > 0 && !(op->fail_fast && op->err) && gr_now_ns() < until) {
        struct timespec ts;
        ts_from_mono(until, &ts);
        pthread_cond_timedwait(&op->cv, &op->mu, &ts);
    }
    bool done = op->remaining == 0, failed = op->fail_fast && op->err;
    pthread_mutex_unlock(&op->mu);
    if (done) return GR_OK;
    if (caller_limit && !failed) return GR_EAGAIN;
    char msg[96];
    if (failed)
        snprintf(msg, sizeof msg, "cancelled: another shard's part of this operation failed");
    else
        snprintf(msg, sizeof msg, "no reply within %u ms (the request timeout)",
                 op->cl->link.cfg.request_timeout_ms);
    for (size_t i = 0; i < op->nreqs; i++) {
        cl_req *r = op->reqs[i];
        if (cl_conn_claim(&op->cl->conns[r->shard], r)) req_done(r, GR_ETIMEDOUT, msg);
    }
    /* Requests a reader already took are being finished right now; wait for them. */
    pthread_mutex_lock(&op->mu);
    while (op->remaining > 0) pthread_cond_wait(&op->cv, &op->mu);
    pthread_mutex_unlock(&op->mu);
    return GR_OK;
}

int cl_op_result(gr_client_op *op)
{
    int rc = op->err;
    if (rc) gr_seterr(rc, "%s", op->msg);
    return rc;
}

int gr_client_wait(gr_client_op *op, int timeout_ms)
{
    if (!op) return gr_seterr(GR_EINVAL, "gr_client_wait: NULL operation");
    int rc = cl_op_wait(op, timeout_ms);
    if (rc == GR_EAGAIN) return rc;
    rc = cl_op_result(op);
    cl_op_free(op);
    return rc;
}

int cl_op_run(gr_client *c, const uint32_t *shards, uint32_t n, uint16_t opcode,
              const gr_proto_buf *body, uint32_t timeout_ms, gr_client_op **out)
{
    *out = NULL;
    gr_client_op *op = cl_op_new(c, opcode);
    if (!op) return gr_seterr(GR_ENOMEM, "cannot allocate an operation");
    if (timeout_ms) op->deadline_ns = gr_now_ns() + (uint64_t)timeout_ms * 1000000u;
    int rc = GR_OK;
    for (uint32_t i = 0; i < n && !rc; i++) {
        cl_req *r = cl_op_add_req(op, shards[i]);
        if (!r) {
            rc = gr_seterr(GR_ENOMEM, "out of memory");
            break;
        }
        rc = gr_proto_begin(&r->frame, GR_PROTO_REQUEST, opcode, 0, 0, r->id);
        if (!rc && body && body->len) {
            rc = gr_proto_buf_reserve(&r->frame, body->len);
            if (!rc) {
                memcpy(r->frame.data + r->frame.len, body->data, body->len);
                r->frame.len += body->len;
            }
        }
        if (!rc) rc = gr_proto_end(&r->frame, 0);
    }
    if (!rc) rc = cl_op_send(op);
    if (rc) {
        cl_op_free(op);
        return rc;
    }
    cl_op_wait(op, -1);
    *out = op;
    return GR_OK;
}

uint32_t *cl_all_shards(const gr_client *c)
{
    uint32_t *s = calloc(c->link.nshards ? c->link.nshards : 1, sizeof *s);
    if (s)
        for (uint32_t i = 0; i < c->link.nshards; i++) s[i] = i;
    return s;
}
