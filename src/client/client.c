/* Client operations: configuration, batch calls (dedup, routing by slot, one request per shard
 * split to fit the server's limits, scatter of replies to every occurrence), waiting with
 * deadlines, and the control calls (tables, dense parameters, stats, shutdown). */
#include "client/client_int.h"

#include <cjson/cJSON.h>
#include <openssl/crypto.h>
#include <ctype.h>
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef struct cl_tbl {
    uint32_t table, dim;
    size_t n;
    float *rows;
    uint64_t *uniq;
    uint32_t nuniq;
    int32_t *first;  /* per unique key: its first occurrence */
    int32_t *next;   /* per occurrence: the next occurrence of the same key, or -1 */
    uint32_t *order; /* unique indices grouped by shard */
    uint32_t *shard_start; /* nshards + 1 offsets into order */
    uint32_t *inv;   /* per occurrence: its unique index */
    float **dst;     /* push: per unique key, its gradient row in the request frame */
} cl_tbl;

struct gr_client_op {
    gr_client *cl;
    uint16_t opcode;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t remaining;
    int err;
    char msg[800];
    uint64_t deadline_ns;
    cl_tbl *tb;
    size_t nb;
    void *arena;
    cl_req **reqs;
    size_t nreqs, reqcap;
    bool stream_rows; /* scatter with non-temporal stores (the output is far larger than caches) */
    /* Results decoded by the reader as replies arrive (the op is freed by the wait): */
    float *dense_out;       /* async DENSE_PULL */
    size_t dense_n;
    uint64_t *tags_out;     /* SYNC_ACQUIRE, per shard */
    uint64_t *cur_out;
    uint32_t *outcomes_out; /* PUSH_STEP, per shard */
    /* The first failed request ends the op (the others are cancelled): an acquire must not
     * wait out other shards' long holds once one shard is gone. */
    bool fail_fast;
};

/* Output larger than this is scattered with streaming stores: the rows would not stay in cache
 * anyway, and streaming skips reading every destination line before writing it (measured: the
 * scatter of a 27 MB pull output is most of the client's CPU). */
#define STREAM_ROWS_BYTES (8u << 20)

/* ---- configuration ---- */

void gr_client_config_default(gr_client_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->connect_timeout_ms = 5000;
    cfg->request_timeout_ms = 30000;
    cfg->backoff_initial_ms = 10;
    cfg->backoff_max_ms = 500;
}

static int read_secret(const char *path, uint8_t **out, size_t *len)
{
    char *buf;
    size_t n;
    int rc = gr_read_file(path, &buf, &n);
    if (rc) return gr_seterr(rc, "cannot read the auth file: %s", gr_errmsg());
    while (n > 0 && isspace((unsigned char)buf[n - 1])) n--;
    if (n == 0) {
        free(buf);
        return gr_seterr(GR_EINVAL, "auth file %s is empty", path);
    }
    *out = (uint8_t *)buf;
    *len = n;
    return GR_OK;
}

static int add_shards_from_list(gr_client *c, const char *list)
{
    char *copy = strdup(list);
    if (!copy) return gr_seterr(GR_ENOMEM, "out of memory");
    uint32_t n = 1;
    for (const char *p = list; *p; p++) n += *p == ',';
    if (n > GR_SLOTS) {
        free(copy);
        return gr_seterr(GR_EINVAL, "%u servers given; at most %u shards", n, GR_SLOTS);
    }
    c->conns = calloc(n, sizeof *c->conns);
    if (!c->conns) {
        free(copy);
        return gr_seterr(GR_ENOMEM, "out of memory");
    }
    int rc = GR_OK;
    char *save = NULL, *tok = strtok_r(copy, ",", &save);
    uint32_t i = 0;
    for (; tok && !rc; tok = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*tok)) tok++;
        char *e = tok + strlen(tok);
        while (e > tok && isspace((unsigned char)e[-1])) *--e = '\0';
        rc = cl_conn_init(&c->conns[i], c, i, tok);
        if (!rc) i++;
    }
    c->nshards = i;
    free(copy);
    if (!rc && (i != n || i == 0)) rc = gr_seterr(GR_EINVAL, "bad server list '%s'", list);
    return rc;
}

static int load_cluster_file(gr_client *c, const char *path, char **auth_path)
{
    char *txt;
    int rc = gr_read_file(path, &txt, NULL);
    if (rc) return rc;
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    cJSON *shards = root ? cJSON_GetObjectItemCaseSensitive(root, "shards") : NULL;
    if (!cJSON_IsArray(shards) || cJSON_GetArraySize(shards) == 0) {
        cJSON_Delete(root);
        return gr_seterr(GR_EINVAL, "cluster file %s: needs \"shards\": [\"host:port\", ...]", path);
    }
    size_t cap = 1;
    cJSON *s;
    cJSON_ArrayForEach(s, shards)
    {
        if (!cJSON_IsString(s)) {
            cJSON_Delete(root);
            return gr_seterr(GR_EINVAL, "cluster file %s: shard entries must be strings", path);
        }
        cap += strlen(s->valuestring) + 1;
    }
    char *list = malloc(cap);
    if (!list) {
        cJSON_Delete(root);
        return gr_seterr(GR_ENOMEM, "out of memory");
    }
    list[0] = '\0';
    cJSON_ArrayForEach(s, shards)
    {
        if (list[0]) strcat(list, ",");
        strcat(list, s->valuestring);
    }
    rc = add_shards_from_list(c, list);
    free(list);
    cJSON *af = cJSON_GetObjectItemCaseSensitive(root, "auth_file");
    if (!rc && cJSON_IsString(af) && af->valuestring[0]) {
        /* A relative auth file is relative to the cluster file's folder. */
        if (af->valuestring[0] == '/') {
            *auth_path = strdup(af->valuestring);
        } else {
            char *dup = strdup(path);
            const char *dir = dup ? dirname(dup) : ".";
            size_t n = strlen(dir) + strlen(af->valuestring) + 2;
            *auth_path = malloc(n);
            if (*auth_path) snprintf(*auth_path, n, "%s/%s", dir, af->valuestring);
            free(dup);
        }
        if (!*auth_path) rc = gr_seterr(GR_ENOMEM, "out of memory");
    }
    cJSON_Delete(root);
    return rc;
}

int gr_client_create(const gr_client_config *cfg, gr_client **out)
{
    *out = NULL;
    if (!cfg || (!cfg->servers == !cfg->cluster_file))
        return gr_seterr(GR_EINVAL, "give either a server list or a cluster file");
    gr_client *c = calloc(1, sizeof *c);
    if (!c) return gr_seterr(GR_ENOMEM, "cannot allocate a client");
    c->cfg = *cfg;
    gr_client_config d;
    gr_client_config_default(&d);
    if (!c->cfg.connect_timeout_ms) c->cfg.connect_timeout_ms = d.connect_timeout_ms;
    if (!c->cfg.request_timeout_ms) c->cfg.request_timeout_ms = d.request_timeout_ms;
    if (!c->cfg.backoff_initial_ms) c->cfg.backoff_initial_ms = d.backoff_initial_ms;
    if (!c->cfg.backoff_max_ms) c->cfg.backoff_max_ms = d.backoff_max_ms;
    c->cfg.servers = c->cfg.cluster_file = c->cfg.auth_file = NULL;
    c->cfg.secret = NULL;
    atomic_init(&c->next_id, 1);
    char *auth_path = NULL;
    int rc = cfg->servers ? add_shards_from_list(c, cfg->servers)
                          : load_cluster_file(c, cfg->cluster_file, &auth_path);
    if (!rc && cfg->any_shard && c->nshards != 1)
        rc = gr_seterr(GR_EINVAL, "any_shard needs exactly one server");
    if (!rc && cfg->secret) {
        if (!cfg->secret_len) rc = gr_seterr(GR_EINVAL, "empty secret");
        c->secret = malloc(cfg->secret_len ? cfg->secret_len : 1);
        if (!rc && !c->secret) rc = gr_seterr(GR_ENOMEM, "out of memory");
        if (!rc) {
            memcpy(c->secret, cfg->secret, cfg->secret_len);
            c->secret_len = cfg->secret_len;
        }
    } else if (!rc && (cfg->auth_file || auth_path)) {
        rc = read_secret(cfg->auth_file ? cfg->auth_file : auth_path, &c->secret, &c->secret_len);
    }
    free(auth_path);
    for (uint32_t i = 0; !rc && i < c->nshards; i++) rc = cl_conn_ensure(&c->conns[i]);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", gr_errmsg());
        gr_client_destroy(c);
        return gr_seterr(rc, "%s", msg);
    }
    *out = c;
    return GR_OK;
}

void gr_client_destroy(gr_client *c)
{
    if (!c) return;
    for (uint32_t i = 0; i < c->nshards; i++) cl_conn_fini(&c->conns[i]);
    free(c->conns);
    if (c->secret) OPENSSL_cleanse(c->secret, c->secret_len);
    free(c->secret);
    free(c);
}

uint32_t gr_client_shards(const gr_client *c) { return c->nshards; }

const char *gr_client_shard_addr(const gr_client *c, uint32_t shard)
{
    return shard < c->nshards ? c->conns[shard].addr : NULL;
}

void gr_client_get_stats(gr_client *c, gr_client_stats_t *st)
{
    st->requests = atomic_load(&c->requests);
    st->bytes_sent = atomic_load(&c->bytes_sent);
    st->bytes_received = atomic_load(&c->bytes_received);
    st->keys_in = atomic_load(&c->keys_in);
    st->keys_sent = atomic_load(&c->keys_sent);
    st->reconnects = atomic_load(&c->reconnects);
}

/* ---- operations and requests ---- */

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static gr_client_op *op_new(gr_client *c, uint16_t opcode)
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
    op->deadline_ns = mono_ns() + (uint64_t)c->cfg.request_timeout_ms * 1000000u;
    return op;
}

static void op_free(gr_client_op *op)
{
    if (!op) return;
    for (size_t i = 0; i < op->nreqs; i++) {
        cl_req *r = op->reqs[i];
        gr_proto_buf_fini(&r->frame);
        free(r->pieces);
        free(r->reply);
        free(r);
    }
    free(op->reqs);
    free(op->tb);
    free(op->arena);
    pthread_mutex_destroy(&op->mu);
    pthread_cond_destroy(&op->cv);
    free(op);
}

static cl_req *op_add_req(gr_client_op *op, uint32_t shard, uint16_t flags)
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
    r->op = op;
    r->shard = shard;
    r->opcode = op->opcode;
    r->flags = flags;
    r->id = atomic_fetch_add(&op->cl->next_id, 1);
    gr_proto_buf_init(&r->frame);
    op->reqs[op->nreqs++] = r;
    return r;
}

void cl_req_complete(cl_req *r, int rc, const char *msg)
{
    gr_client_op *op = r->op;
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

static void error_text(const uint8_t *body, size_t len, char *out, size_t cap)
{
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    const char *s = NULL;
    uint32_t n = 0;
    if (gr_proto_decode_str(body, len, &lim, &s, &n) == GR_OK)
        snprintf(out, cap, "%.*s", (int)n, s);
    else
        snprintf(out, cap, "%s", "(unreadable error message)");
}

int cl_req_handle_reply(cl_req *r, const gr_proto_header *h, uint8_t *body, bool *fatal)
{
    gr_client_op *op = r->op;
    *fatal = false;
    if (h->status < 0) {
        char msg[300];
        error_text(body, h->body_len, msg, sizeof msg);
        return gr_seterr(h->status, "%s", msg);
    }
    if (h->op != r->opcode) {
        *fatal = true;
        return gr_seterr(GR_EPROTO, "reply opcode %u does not match request opcode %u", h->op,
                         r->opcode);
    }
    switch (r->opcode) {
    case GR_OP_PULL:
    case GR_OP_PUSH_PULL: {
        gr_proto_batch b;
        int rc = gr_proto_decode_batch(body, h->body_len, GR_PROTO_VALUES,
                                       &op->cl->conns[r->shard].limits, &b);
        if (rc) {
            *fatal = true;
            return rc;
        }
        if (b.ntables != r->npieces) rc = gr_seterr(GR_EPROTO, "reply has %u tables, expected %u",
                                                     b.ntables, r->npieces);
        for (uint32_t k = 0; !rc && k < b.ntables; k++) {
            const gr_proto_section *sec = &b.sections[k];
            const cl_piece *p = &r->pieces[k];
            const cl_tbl *t = &op->tb[p->bi];
            if (sec->table != t->table || sec->dim != t->dim || sec->n != p->count) {
                rc = gr_seterr(GR_EPROTO, "reply section %u does not match the request", k);
                break;
            }
            size_t dim = t->dim, rowb = dim * sizeof(float);
#if defined(__SSE2__)
            if (op->stream_rows && (dim & 3) == 0 && ((uintptr_t)t->rows & 15) == 0) {
                for (uint32_t j = 0; j < p->count; j++) {
                    const float *src = sec->values + (size_t)j * dim;
                    for (int32_t i = t->first[p->uidx[j]]; i >= 0; i = t->next[i]) {
                        float *dst = t->rows + (size_t)i * dim;
                        for (size_t d = 0; d < dim; d += 4)
                            _mm_stream_ps(dst + d, _mm_loadu_ps(src + d));
                    }
                }
                continue;
            }
#endif
            for (uint32_t j = 0; j < p->count; j++) {
                const float *src = sec->values + (size_t)j * dim;
                for (int32_t i = t->first[p->uidx[j]]; i >= 0; i = t->next[i])
                    memcpy(t->rows + (size_t)i * dim, src, rowb);
            }
        }
#if defined(__SSE2__)
        /* Streaming stores are weakly ordered: fence before the request is marked complete. */
        if (op->stream_rows) _mm_sfence();
#endif
        gr_proto_batch_fini(&b);
        if (rc) *fatal = true;
        return rc;
    }
    case GR_OP_PUSH:
        if (h->body_len != 0) {
            *fatal = true;
            return gr_seterr(GR_EPROTO, "push reply carries a body");
        }
        return GR_OK;
    case GR_OP_SYNC_ACQUIRE:
    case GR_OP_PUSH_STEP: {
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
    case GR_OP_DENSE_PULL:
        if (op->dense_out) {
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
        /* fall through - the blocking pull decodes the copy */
    default:
        r->reply = malloc(h->body_len ? h->body_len : 8);
        if (!r->reply) return gr_seterr(GR_ENOMEM, "out of memory for a %u-byte reply", h->body_len);
        memcpy(r->reply, body, h->body_len);
        r->reply_len = h->body_len;
        return GR_OK;
    }
}

/* Sends every request of op. Returns 0 when at least one was sent (the op must be waited on);
 * otherwise every request has been completed with its error and the first is returned. */
static int op_send(gr_client_op *op)
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
        int rc = cl_conn_send(k, r);
        if (rc == GR_OK) {
            sent++;
        } else {
            if (!first_rc) {
                first_rc = rc;
                snprintf(first_msg, sizeof first_msg, "shard %u (%s): %s", r->shard, k->addr, r->msg);
            }
            cl_req_complete(r, rc, r->msg);
        }
        gr_proto_buf_fini(&r->frame);
    }
    if (sent == 0) return gr_seterr(first_rc, "%s", first_msg);
    return GR_OK;
}

static void ts_from_mono(uint64_t ns, struct timespec *ts)
{
    ts->tv_sec = (time_t)(ns / 1000000000u);
    ts->tv_nsec = (long)(ns % 1000000000u);
}

/* Waits for completion (0) or the caller's timeout (GR_EAGAIN); at the op's deadline the
 * requests still outstanding are cancelled with GR_ETIMEDOUT. The op stays allocated. */
static int op_wait(gr_client_op *op, int timeout_ms)
{
    uint64_t until = op->deadline_ns;
    bool caller_limit = false;
    if (timeout_ms >= 0) {
        uint64_t t = mono_ns() + (uint64_t)timeout_ms * 1000000u;
        if (t < until) {
            until = t;
            caller_limit = true;
        }
    }
    pthread_mutex_lock(&op->mu);
    while (op->remaining > 0 && !(op->fail_fast && op->err) && mono_ns() < until) {
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
                 op->cl->cfg.request_timeout_ms);
    for (size_t i = 0; i < op->nreqs; i++) {
        cl_req *r = op->reqs[i];
        if (cl_conn_claim(&op->cl->conns[r->shard], r)) cl_req_complete(r, GR_ETIMEDOUT, msg);
    }
    /* Requests a reader already took are being finished right now; wait for them. */
    pthread_mutex_lock(&op->mu);
    while (op->remaining > 0) pthread_cond_wait(&op->cv, &op->mu);
    pthread_mutex_unlock(&op->mu);
    return GR_OK;
}

static int op_result(gr_client_op *op)
{
    int rc = op->err;
    if (rc) gr_seterr(rc, "%s", op->msg);
    return rc;
}

int gr_client_wait(gr_client_op *op, int timeout_ms)
{
    if (!op) return gr_seterr(GR_EINVAL, "gr_client_wait: NULL operation");
    int rc = op_wait(op, timeout_ms);
    if (rc == GR_EAGAIN) return rc;
    rc = op_result(op);
    op_free(op);
    return rc;
}

/* ---- batches ---- */

static inline uint32_t shard_of_key(const gr_client *c, uint64_t key)
{
    return c->nshards == 1 ? 0 : gr_slot_shard(gr_slot_of(key), c->nshards);
}

/* Dedups each table's keys, links every occurrence of a key, and groups unique keys by shard. */
static int prepare_tables(gr_client_op *op, const gr_client_batch *b, size_t nb, bool rows,
                          bool grads)
{
    gr_client *c = op->cl;
    if (nb == 0 || !b) return gr_seterr(GR_EINVAL, "a batch needs at least one table");
    size_t bytes = 0, out_bytes = 0;
    for (size_t i = 0; i < nb; i++) {
        if (b[i].dim == 0 || b[i].dim > GR_PROTO_DIM_MAX)
            return gr_seterr(GR_EINVAL, "table %u: dim %u is out of range 1..%u", b[i].table,
                             b[i].dim, GR_PROTO_DIM_MAX);
        if (b[i].n > (size_t)INT32_MAX / 2)
            return gr_seterr(GR_ETOOBIG, "table %u: %zu keys in one batch is too many", b[i].table,
                             b[i].n);
        if (b[i].n && (!b[i].keys || (rows && !b[i].rows) || (grads && !b[i].grads)))
            return gr_seterr(GR_EINVAL, "table %u: NULL keys, rows or gradients", b[i].table);
        bytes += b[i].n * (8 + 4 + 4 + 4 + 4 + 4 + (grads ? 8 : 0)) + ((size_t)c->nshards + 1) * 4 + 64;
        out_bytes += rows ? b[i].n * b[i].dim * sizeof(float) : 0;
    }
    op->stream_rows = out_bytes >= STREAM_ROWS_BYTES;
    op->tb = calloc(nb, sizeof *op->tb);
    op->arena = malloc(bytes);
    if (!op->tb || !op->arena) return gr_seterr(GR_ENOMEM, "cannot allocate a batch of %zu bytes", bytes);
    op->nb = nb;
    uint8_t *p = op->arena;
    gr_dedup_scratch scratch = {0};
    uint32_t *count = calloc((size_t)c->nshards + 1, sizeof *count);
    if (!count) return gr_seterr(GR_ENOMEM, "out of memory");
    int rc = GR_OK;
    uint64_t keys_in = 0, keys_sent = 0;
    for (size_t bi = 0; bi < nb && !rc; bi++) {
        cl_tbl *t = &op->tb[bi];
        size_t n = b[bi].n;
        t->table = b[bi].table;
        t->dim = b[bi].dim;
        t->n = n;
        t->rows = b[bi].rows;
        t->uniq = (uint64_t *)(void *)p;
        p += n * 8;
        t->first = (int32_t *)(void *)p;
        p += n * 4;
        t->next = (int32_t *)(void *)p;
        p += n * 4;
        t->order = (uint32_t *)(void *)p;
        p += n * 4;
        uint32_t *inv = t->inv = (uint32_t *)(void *)p;
        p += n * 4;
        uint32_t *shard_of = (uint32_t *)(void *)p; /* per unique key */
        p += n * 4;
        t->shard_start = (uint32_t *)(void *)p;
        p += ((size_t)c->nshards + 1) * 4;
        p = (uint8_t *)(((uintptr_t)p + 7) & ~(uintptr_t)7);
        if (grads) {
            t->dst = (float **)(void *)p;
            p += n * sizeof(float *);
        }
        memset(t->shard_start, 0, ((size_t)c->nshards + 1) * 4);
        if (n == 0) continue;
        long nu = gr_dedup(b[bi].keys, n, t->uniq, inv, &scratch);
        if (nu < 0) {
            rc = (int)nu;
            break;
        }
        t->nuniq = (uint32_t)nu;
        for (uint32_t u = 0; u < t->nuniq; u++) t->first[u] = -1;
        for (size_t i = n; i-- > 0;) {
            uint32_t u = inv[i];
            t->next[i] = t->first[u];
            t->first[u] = (int32_t)i;
        }
        /* Counting sort of the unique keys by shard. */
        memset(count, 0, ((size_t)c->nshards + 1) * sizeof *count);
        for (uint32_t u = 0; u < t->nuniq; u++) {
            uint32_t s = shard_of_key(c, t->uniq[u]);
            shard_of[u] = s;
            count[s + 1]++;
        }
        for (uint32_t s = 0; s < c->nshards; s++) count[s + 1] += count[s];
        memcpy(t->shard_start, count, ((size_t)c->nshards + 1) * 4);
        for (uint32_t u = 0; u < t->nuniq; u++) t->order[count[shard_of[u]]++] = u;
        keys_in += n;
        keys_sent += t->nuniq;
    }
    free(count);
    gr_dedup_scratch_fini(&scratch);
    atomic_fetch_add(&c->keys_in, keys_in);
    atomic_fetch_add(&c->keys_sent, keys_sent);
    return rc;
}

static int req_add_piece(cl_req *r, uint32_t bi, uint32_t count, const uint32_t *uidx, uint32_t *cap)
{
    if (r->npieces == *cap) {
        uint32_t nc = *cap ? *cap * 2 : 8;
        cl_piece *p = realloc(r->pieces, nc * sizeof *p);
        if (!p) return gr_seterr(GR_ENOMEM, "out of memory");
        r->pieces = p;
        *cap = nc;
    }
    r->pieces[r->npieces++] = (cl_piece){bi, count, uidx};
    return GR_OK;
}

/* Fills a request's frame from its pieces: keys, and for pushes the summed gradients. */
static int build_frame(gr_client_op *op, cl_req *r, gr_proto_layout layout,
                       const gr_client_batch *b)
{
    size_t size = GR_PROTO_HEADER_SIZE + 8;
    for (uint32_t k = 0; k < r->npieces; k++)
        size += gr_proto_section_size(layout, r->pieces[k].count, op->tb[r->pieces[k].bi].dim);
    int rc = gr_proto_buf_reserve(&r->frame, size);
    if (!rc) rc = gr_proto_begin(&r->frame, GR_PROTO_REQUEST, r->opcode, r->flags, 0, r->id);
    if (!rc) rc = gr_proto_put_batch_head(&r->frame, r->npieces);
    for (uint32_t k = 0; !rc && k < r->npieces; k++) {
        const cl_piece *p = &r->pieces[k];
        const cl_tbl *t = &op->tb[p->bi];
        uint64_t *keys;
        float *vals;
        rc = gr_proto_put_section(&r->frame, layout, t->table, t->dim, p->count, &keys, &vals);
        if (rc) break;
        for (uint32_t j = 0; j < p->count; j++) keys[j] = t->uniq[p->uidx[j]];
        if (layout == GR_PROTO_KEYS_VALUES)
            for (uint32_t j = 0; j < p->count; j++) t->dst[p->uidx[j]] = vals + (size_t)j * t->dim;
    }
    if (!rc) rc = gr_proto_end(&r->frame, 0);
    (void)b;
    return rc;
}

/* Fills every push frame's gradient rows: each key's occurrences summed in order of occurrence.
 * It walks the gradients in the caller's order (a sequential read of the largest array) and
 * adds into each key's row in the frame; repeated keys are the hot ones, so their rows stay in
 * cache. Walking key by key instead would jump across the caller's array for every repeat. */
static void sum_gradients(gr_client_op *op, const gr_client_batch *b)
{
    for (size_t bi = 0; bi < op->nb; bi++) {
        const cl_tbl *t = &op->tb[bi];
        const float *g = b[bi].grads;
        size_t dim = t->dim;
        for (size_t i = 0; i < t->n; i++) {
            uint32_t u = t->inv[i];
            float *dst = t->dst[u];
            const float *src = g + i * dim;
            if (t->first[u] == (int32_t)i) {
                memcpy(dst, src, dim * sizeof(float));
            } else {
                for (size_t d = 0; d < dim; d++) dst[d] += src[d];
            }
        }
    }
}

/* Splits each shard's unique keys into requests that fit the shard's limits. */
static int plan_requests(gr_client_op *op, gr_proto_layout layout, bool reply_rows, uint16_t flags)
{
    gr_client *c = op->cl;
    for (uint32_t s = 0; s < c->nshards; s++) {
        const gr_proto_limits *lim = &c->conns[s].limits;
        uint64_t budget = lim->max_body - 64;
        cl_req *cur = NULL;
        uint32_t cap = 0;
        uint64_t keys_used = 0, req_bytes = 0, resp_bytes = 0;
        for (uint32_t bi = 0; bi < op->nb; bi++) {
            const cl_tbl *t = &op->tb[bi];
            uint32_t off = t->shard_start[s], end = t->shard_start[s + 1];
            uint64_t per_req = 8 + (layout == GR_PROTO_KEYS_VALUES ? (uint64_t)t->dim * 4 : 0);
            uint64_t per_resp = reply_rows ? (uint64_t)t->dim * 4 : 0;
            const uint64_t fixed = 16 + 8;
            while (off < end) {
                uint64_t room = 0;
                if (cur && cur->npieces < lim->max_tables && req_bytes + fixed < budget &&
                    resp_bytes + fixed < budget) {
                    room = lim->max_keys - keys_used;
                    uint64_t r1 = (budget - req_bytes - fixed) / per_req;
                    if (r1 < room) room = r1;
                    if (per_resp) {
                        uint64_t r2 = (budget - resp_bytes - fixed) / per_resp;
                        if (r2 < room) room = r2;
                    }
                }
                if (room == 0) {
                    if (cur && cur->npieces == 0)
                        return gr_seterr(GR_ETOOBIG, "shard %u (%s): one row of dim %u does not "
                                         "fit its %u-byte frame limit", s, c->conns[s].addr,
                                         t->dim, lim->max_body);
                    cur = op_add_req(op, s, flags);
                    if (!cur) return gr_seterr(GR_ENOMEM, "out of memory");
                    cap = 0;
                    keys_used = 0;
                    req_bytes = resp_bytes = 8;
                    continue;
                }
                uint32_t take = end - off < room ? end - off : (uint32_t)room;
                int rc = req_add_piece(cur, bi, take, t->order + off, &cap);
                if (rc) return rc;
                keys_used += take;
                req_bytes += fixed + per_req * take;
                resp_bytes += fixed + per_resp * take;
                off += take;
            }
        }
    }
    return GR_OK;
}

static int batch_start(gr_client *c, uint16_t opcode, const gr_client_batch *b, size_t nb,
                       unsigned flags, gr_client_op **out)
{
    if (!out) return gr_seterr(GR_EINVAL, "no place for the operation handle");
    *out = NULL;
    bool push = opcode == GR_OP_PUSH || opcode == GR_OP_PUSH_PULL;
    bool rows = opcode == GR_OP_PULL || opcode == GR_OP_PUSH_PULL;
    gr_proto_layout layout = push ? GR_PROTO_KEYS_VALUES : GR_PROTO_KEYS;
    gr_client_op *op = op_new(c, opcode);
    if (!op) return gr_seterr(GR_ENOMEM, "cannot allocate an operation");
    uint16_t wflags = (opcode == GR_OP_PULL && (flags & GR_CLIENT_READONLY)) ? GR_PROTO_F_READONLY : 0;
    int rc = prepare_tables(op, b, nb, rows, push);
    if (!rc) rc = plan_requests(op, layout, rows, wflags);
    for (size_t i = 0; !rc && i < op->nreqs; i++) rc = build_frame(op, op->reqs[i], layout, b);
    if (!rc && push) sum_gradients(op, b);
    if (!rc) rc = op_send(op);
    if (rc) {
        op_free(op);
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
    return batch_start(c, GR_OP_PUSH, b, nb, 0, op);
}

int gr_client_push_pull_start(gr_client *c, const gr_client_batch *b, size_t nb,
                              gr_client_op **op)
{
    return batch_start(c, GR_OP_PUSH_PULL, b, nb, 0, op);
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
    gr_client_batch b = {table, dim, n, keys, rows, NULL};
    return gr_client_pull_many(c, &b, 1, 0);
}

int gr_client_push(gr_client *c, uint32_t table, uint32_t dim, const uint64_t *keys, size_t n,
                   const float *grads)
{
    gr_client_batch b = {table, dim, n, keys, NULL, grads};
    return gr_client_push_many(c, &b, 1);
}

int gr_client_delete(gr_client *c, uint32_t table, uint32_t dim, const uint64_t *keys, size_t n,
                     uint64_t *deleted)
{
    gr_client_batch b = {table, dim, n, keys, NULL, NULL};
    gr_client_op *op = op_new(c, GR_OP_DELETE);
    if (!op) return gr_seterr(GR_ENOMEM, "cannot allocate an operation");
    int rc = prepare_tables(op, &b, 1, false, false);
    if (!rc) rc = plan_requests(op, GR_PROTO_KEYS, false, 0);
    for (size_t i = 0; !rc && i < op->nreqs; i++) rc = build_frame(op, op->reqs[i], GR_PROTO_KEYS, &b);
    if (!rc) rc = op_send(op);
    if (!rc) {
        op_wait(op, -1);
        rc = op_result(op);
    }
    uint64_t total = 0;
    for (size_t i = 0; !rc && i < op->nreqs; i++) {
        uint64_t v[1];
        uint32_t cnt = 0;
        rc = gr_proto_decode_u64s(op->reqs[i]->reply, op->reqs[i]->reply_len, 1, v, &cnt);
        if (!rc && cnt == 1) total += v[0];
    }
    op_free(op);
    if (!rc && deleted) *deleted = total;
    return rc;
}

/* ---- control calls ---- */

/* Sends the same body to each listed shard and waits for all replies. The op is returned for
 * the caller to read per-shard results (r->rc, r->reply), then op_free. */
static int ctl_run(gr_client *c, const uint32_t *shards, uint32_t n, uint16_t opcode,
                   const gr_proto_buf *body, gr_client_op **out)
{
    *out = NULL;
    gr_client_op *op = op_new(c, opcode);
    if (!op) return gr_seterr(GR_ENOMEM, "cannot allocate an operation");
    int rc = GR_OK;
    for (uint32_t i = 0; i < n && !rc; i++) {
        cl_req *r = op_add_req(op, shards[i], 0);
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
    if (!rc) rc = op_send(op);
    if (rc) {
        op_free(op);
        return rc;
    }
    op_wait(op, -1);
    *out = op;
    return GR_OK;
}

static uint32_t *all_shards(gr_client *c)
{
    uint32_t *s = calloc(c->nshards, sizeof *s);
    if (s)
        for (uint32_t i = 0; i < c->nshards; i++) s[i] = i;
    return s;
}

static int ctl_all_str(gr_client *c, uint16_t opcode, const char *str, gr_client_op **op)
{
    gr_proto_buf body;
    gr_proto_buf_init(&body);
    uint32_t *shards = all_shards(c);
    int rc = shards ? GR_OK : gr_seterr(GR_ENOMEM, "out of memory");
    if (!rc && str) rc = gr_proto_put_str(&body, str, strlen(str));
    if (!rc) rc = ctl_run(c, shards, c->nshards, opcode, &body, op);
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
    rc = op_result(op);
    op_free(op);
    return rc;
}

int gr_client_drop_table(gr_client *c, const char *name)
{
    if (!name || !*name) return gr_seterr(GR_EINVAL, "empty table name");
    gr_client_op *op;
    int rc = ctl_all_str(c, GR_OP_DROP_TABLE, name, &op);
    if (rc) return rc;
    rc = all_or_enoent(op, NULL);
    op_free(op);
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
    op_free(op);
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
    rc = op_result(op);
    uint64_t total = 0;
    for (size_t i = 0; !rc && i < op->nreqs; i++) {
        uint64_t v[1] = {0};
        uint32_t cnt = 0;
        rc = gr_proto_decode_u64s(op->reqs[i]->reply, op->reqs[i]->reply_len, 1, v, &cnt);
        total += v[0];
    }
    op_free(op);
    if (!rc && evicted) *evicted = total;
    return rc;
}

static uint32_t dense_owner(gr_client *c, const char *name)
{
    return c->nshards == 1 ? 0 : gr_slot_shard(gr_proto_dense_slot(name, strlen(name)), c->nshards);
}

static int check_name(const char *name)
{
    if (!name || !*name || strlen(name) >= 64)
        return gr_seterr(GR_EINVAL, "dense parameter names are 1..63 bytes");
    return GR_OK;
}

int gr_client_dense_create(gr_client *c, const char *spec_json)
{
    if (!spec_json) return gr_seterr(GR_EINVAL, "NULL dense spec");
    cJSON *root = cJSON_Parse(spec_json);
    cJSON *nm = root ? cJSON_GetObjectItemCaseSensitive(root, "name") : NULL;
    if (!cJSON_IsString(nm) || check_name(nm->valuestring)) {
        cJSON_Delete(root);
        return gr_seterr(GR_EINVAL, "dense spec needs a \"name\" of 1..63 bytes");
    }
    uint32_t shard = dense_owner(c, nm->valuestring);
    cJSON_Delete(root);
    gr_proto_buf body;
    gr_proto_buf_init(&body);
    int rc = gr_proto_put_str(&body, spec_json, strlen(spec_json));
    gr_client_op *op = NULL;
    if (!rc) rc = ctl_run(c, &shard, 1, GR_OP_DENSE_CREATE, &body, &op);
    gr_proto_buf_fini(&body);
    if (rc) return rc;
    rc = op_result(op);
    op_free(op);
    return rc;
}

int gr_client_dense_pull(gr_client *c, const char *name, float *out, size_t n)
{
    int rc = check_name(name);
    if (rc) return rc;
    if (n && !out) return gr_seterr(GR_EINVAL, "NULL output");
    uint32_t shard = dense_owner(c, name);
    gr_proto_buf body;
    gr_proto_buf_init(&body);
    rc = gr_proto_put_str(&body, name, strlen(name));
    gr_client_op *op = NULL;
    if (!rc) rc = ctl_run(c, &shard, 1, GR_OP_DENSE_PULL, &body, &op);
    gr_proto_buf_fini(&body);
    if (rc) return rc;
    rc = op_result(op);
    if (!rc) {
        uint64_t size = 0;
        const float *vals = NULL;
        rc = gr_proto_decode_dense_values(op->reqs[0]->reply, op->reqs[0]->reply_len, &size, &vals);
        if (!rc && size != n)
            rc = gr_seterr(GR_EDIM, "dense parameter '%s' has %llu floats, the caller expected %zu",
                           name, (unsigned long long)size, n);
        if (!rc && n) memcpy(out, vals, n * sizeof *out);
    }
    op_free(op);
    return rc;
}

int gr_client_dense_push(gr_client *c, const char *name, const float *grad, size_t n)
{
    int rc = check_name(name);
    if (rc) return rc;
    if (n && !grad) return gr_seterr(GR_EINVAL, "NULL gradient");
    uint32_t shard = dense_owner(c, name);
    gr_proto_buf body;
    gr_proto_buf_init(&body);
    rc = gr_proto_put_str(&body, name, strlen(name));
    if (!rc) rc = gr_proto_put_u64(&body, n);
    if (!rc) rc = gr_proto_put_bytes(&body, grad, n * sizeof *grad);
    gr_client_op *op = NULL;
    if (!rc) rc = ctl_run(c, &shard, 1, GR_OP_DENSE_PUSH, &body, &op);
    gr_proto_buf_fini(&body);
    if (rc) return rc;
    rc = op_result(op);
    op_free(op);
    return rc;
}

int gr_client_stats(gr_client *c, uint32_t shard, char **json)
{
    if (!json || shard >= c->nshards) return gr_seterr(GR_EINVAL, "no shard %u", shard);
    *json = NULL;
    gr_client_op *op;
    int rc = ctl_run(c, &shard, 1, GR_OP_STATS, NULL, &op);
    if (rc) return rc;
    rc = op_result(op);
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
    op_free(op);
    return rc;
}

int gr_client_shutdown(gr_client *c, int shard)
{
    if (shard >= (int)c->nshards) return gr_seterr(GR_EINVAL, "no shard %d", shard);
    uint32_t n = shard < 0 ? c->nshards : 1;
    uint32_t *shards = calloc(n, sizeof *shards);
    if (!shards) return gr_seterr(GR_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < n; i++) shards[i] = shard < 0 ? i : (uint32_t)shard;
    gr_client_op *op;
    int rc = ctl_run(c, shards, n, GR_OP_SHUTDOWN, NULL, &op);
    free(shards);
    if (rc) return rc;
    rc = op_result(op);
    op_free(op);
    return rc;
}

/* ---- async dense pull, dense set ---- */

/* Builds a one-request op to the owner of a dense parameter: body = str name [+ u64 n +
 * floats]. */
static int dense_op(gr_client *c, uint16_t opcode, const char *name, const float *vals, size_t n,
                    gr_client_op **out)
{
    *out = NULL;
    int rc = check_name(name);
    if (rc) return rc;
    gr_client_op *op = op_new(c, opcode);
    if (!op) return gr_seterr(GR_ENOMEM, "cannot allocate an operation");
    cl_req *r = op_add_req(op, dense_owner(c, name), 0);
    rc = r ? gr_proto_begin(&r->frame, GR_PROTO_REQUEST, opcode, 0, 0, r->id)
           : gr_seterr(GR_ENOMEM, "out of memory");
    if (!rc) rc = gr_proto_put_str(&r->frame, name, strlen(name));
    if (!rc && vals) rc = gr_proto_put_u64(&r->frame, n);
    if (!rc && vals) rc = gr_proto_put_bytes(&r->frame, vals, n * sizeof *vals);
    if (!rc) rc = gr_proto_end(&r->frame, 0);
    if (rc) {
        op_free(op);
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
    gr_client_op *o;
    int rc = dense_op(c, GR_OP_DENSE_PULL, name, NULL, 0, &o);
    if (rc) return rc;
    o->dense_out = out;
    o->dense_n = n;
    rc = op_send(o);
    if (rc) {
        op_free(o);
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
    gr_client_op *o;
    int rc = dense_op(c, GR_OP_DENSE_PUSH, name, grad, n, &o);
    if (rc) return rc;
    rc = op_send(o);
    if (rc) {
        op_free(o);
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
    rc = op_send(op);
    if (!rc) {
        op_wait(op, -1);
        rc = op_result(op);
    }
    op_free(op);
    return rc;
}

/* ---- sync jobs ---- */

int gr_client_sync_configure(gr_client *c, const gr_client_sync_config *cfg, unsigned flags,
                             uint64_t *step)
{
    if (!cfg && !(flags & GR_CLIENT_SYNC_CLEAR)) return gr_seterr(GR_EINVAL, "NULL sync config");
    gr_proto_sync_config pc = {0};
    if (cfg) pc = (gr_proto_sync_config){cfg->mode, cfg->workers, cfg->aggregate, cfg->staleness, 0};
    pc.flags = (flags & GR_CLIENT_SYNC_RESET ? GR_PROTO_SYNC_RESET : 0) |
               (flags & GR_CLIENT_SYNC_CLEAR ? GR_PROTO_SYNC_CLEAR : 0);
    gr_proto_buf body;
    gr_proto_buf_init(&body);
    if (flags & GR_CLIENT_SYNC_LIVE) {
        int rc = gr_proto_put_sync_config(&body, &pc);
        for (uint32_t s = 0; !rc && s < c->nshards; s++) {
            cl_conn *k = &c->conns[s];
            pthread_mutex_lock(&k->mu);
            bool up = k->fd >= 0 && !k->broken;
            pthread_mutex_unlock(&k->mu);
            gr_client_op *op = NULL;
            if (up && ctl_run(c, &s, 1, GR_OP_SYNC_CONFIG, &body, &op) == GR_OK) op_free(op);
        }
        gr_proto_buf_fini(&body);
        gr_clearerr();
        if (step) *step = 0;
        return GR_OK;
    }
    uint32_t *shards = all_shards(c);
    int rc = shards ? gr_proto_put_sync_config(&body, &pc) : gr_seterr(GR_ENOMEM, "out of memory");
    gr_client_op *op = NULL;
    if (!rc) rc = ctl_run(c, shards, c->nshards, GR_OP_SYNC_CONFIG, &body, &op);
    free(shards);
    gr_proto_buf_fini(&body);
    if (rc) return rc;
    rc = op_result(op);
    uint64_t top = 0;
    for (size_t i = 0; !rc && i < op->nreqs; i++) {
        uint64_t res = 0, g = 0;
        rc = gr_proto_decode_pair(op->reqs[i]->reply, op->reqs[i]->reply_len, &res, &g);
        if (g > top) top = g;
    }
    op_free(op);
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
    gr_client_op *o = op_new(c, GR_OP_SYNC_ACQUIRE);
    if (!o) return gr_seterr(GR_ENOMEM, "cannot allocate an operation");
    /* The shard may hold the request for timeout_ms: the op's own deadline comes after. */
    o->deadline_ns += (uint64_t)timeout_ms * 1000000u;
    o->fail_fast = true;
    o->tags_out = tags;
    o->cur_out = current;
    int rc = GR_OK;
    for (uint32_t s = 0; s < c->nshards && !rc; s++) {
        cl_req *r = op_add_req(o, s, 0);
        if (!r) {
            rc = gr_seterr(GR_ENOMEM, "out of memory");
            break;
        }
        gr_proto_sync_acquire a = {worker, timeout_ms, want[s]};
        rc = gr_proto_begin(&r->frame, GR_PROTO_REQUEST, GR_OP_SYNC_ACQUIRE, 0, 0, r->id);
        if (!rc) rc = gr_proto_put_sync_acquire(&r->frame, &a);
        if (!rc) rc = gr_proto_end(&r->frame, 0);
    }
    if (!rc) rc = op_send(o);
    if (rc) {
        op_free(o);
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
        for (uint32_t s = 0; s < c->nshards; s++)
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
    for (size_t i = 0; i < nd; i++) {
        int rc = check_name(d[i].name);
        if (rc) return rc;
        if (d[i].n && !d[i].grad) return gr_seterr(GR_EINVAL, "dense gradient '%s' is NULL", d[i].name);
    }
    gr_client_op *o = op_new(c, GR_OP_PUSH_STEP);
    if (!o) return gr_seterr(GR_ENOMEM, "cannot allocate an operation");
    o->outcomes_out = outcomes;
    int rc = nb ? prepare_tables(o, b, nb, false, true) : GR_OK;
    uint32_t *dshard = calloc(nd ? nd : 1, sizeof *dshard);
    if (!rc && !dshard) rc = gr_seterr(GR_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < nd; i++) dshard[i] = dense_owner(c, d[i].name);
    for (uint32_t s = 0; s < c->nshards && !rc; s++) {
        const gr_proto_limits *lim = &c->conns[s].limits;
        cl_req *r = op_add_req(o, s, 0);
        if (!r) {
            rc = gr_seterr(GR_ENOMEM, "out of memory");
            break;
        }
        uint32_t cap = 0, ndense = 0;
        uint64_t keys = 0;
        size_t blen = 8, size = GR_PROTO_HEADER_SIZE + 24;
        for (uint32_t bi = 0; bi < o->nb && !rc; bi++) {
            const cl_tbl *t = &o->tb[bi];
            uint32_t off = t->shard_start[s], cnt = t->shard_start[s + 1] - off;
            if (!cnt) continue;
            rc = req_add_piece(r, (uint32_t)bi, cnt, t->order + off, &cap);
            blen += gr_proto_section_size(GR_PROTO_KEYS_VALUES, cnt, t->dim);
            keys += cnt;
        }
        if (rc) break;
        if (r->npieces == 0) blen = 0;
        size += blen;
        for (size_t i = 0; i < nd; i++)
            if (dshard[i] == s) {
                ndense++;
                size += 8 + ((strlen(d[i].name) + 4 + 7) & ~(size_t)7) + ((d[i].n * 4 + 7) & ~(size_t)7);
            }
        if (size - GR_PROTO_HEADER_SIZE > lim->max_body || keys > lim->max_keys ||
            r->npieces > lim->max_tables || ndense > lim->max_tables) {
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
        if (!rc && r->npieces) rc = gr_proto_put_batch_head(&r->frame, r->npieces);
        for (uint32_t k = 0; !rc && k < r->npieces; k++) {
            const cl_piece *p = &r->pieces[k];
            const cl_tbl *t = &o->tb[p->bi];
            uint64_t *kk;
            float *vals;
            rc = gr_proto_put_section(&r->frame, GR_PROTO_KEYS_VALUES, t->table, t->dim, p->count,
                                      &kk, &vals);
            if (rc) break;
            for (uint32_t j = 0; j < p->count; j++) {
                kk[j] = t->uniq[p->uidx[j]];
                t->dst[p->uidx[j]] = vals + (size_t)j * t->dim;
            }
        }
        for (size_t i = 0; !rc && i < nd; i++)
            if (dshard[i] == s) rc = gr_proto_put_dense_part(&r->frame, d[i].name, d[i].grad, d[i].n);
        if (!rc) rc = gr_proto_end(&r->frame, 0);
    }
    free(dshard);
    if (!rc && nb) sum_gradients(o, b);
    if (!rc) rc = op_send(o);
    if (rc) {
        op_free(o);
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
    uint32_t *shards = all_shards(c);
    int rc = shards ? gr_proto_put_u32(&body, worker) : gr_seterr(GR_ENOMEM, "out of memory");
    if (!rc) rc = gr_proto_put_u32(&body, 0);
    gr_client_op *op = NULL;
    if (!rc) rc = ctl_run(c, shards, c->nshards, GR_OP_SYNC_LEAVE, &body, &op);
    free(shards);
    gr_proto_buf_fini(&body);
    if (rc) return rc;
    rc = op_result(op);
    op_free(op);
    return rc;
}

/* ---- checkpoints ---- */

/* An op of one request per listed shard with the same body, whose deadline is timeout_ms
 * (checkpoint requests take as long as the disk needs, not the request timeout). */
static int ckpt_run(gr_client *c, const uint32_t *shards, uint32_t n, uint16_t opcode,
                    const gr_proto_buf *body, uint32_t timeout_ms, gr_client_op **out)
{
    *out = NULL;
    gr_client_op *op = op_new(c, opcode);
    if (!op) return gr_seterr(GR_ENOMEM, "cannot allocate an operation");
    op->deadline_ns = mono_ns() + (uint64_t)timeout_ms * 1000000u;
    int rc = GR_OK;
    for (uint32_t i = 0; i < n && !rc; i++) {
        cl_req *r = op_add_req(op, shards[i], 0);
        if (!r) {
            rc = gr_seterr(GR_ENOMEM, "out of memory");
            break;
        }
        rc = gr_proto_begin(&r->frame, GR_PROTO_REQUEST, opcode, 0, 0, r->id);
        if (!rc) rc = gr_proto_buf_reserve(&r->frame, body->len);
        if (!rc) {
            memcpy(r->frame.data + r->frame.len, body->data, body->len);
            r->frame.len += body->len;
            rc = gr_proto_end(&r->frame, 0);
        }
    }
    if (!rc) rc = op_send(op);
    if (rc) {
        op_free(op);
        return rc;
    }
    op_wait(op, -1);
    rc = op_result(op);
    if (rc) {
        op_free(op);
        return rc;
    }
    *out = op;
    return GR_OK;
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
    uint32_t *shards = all_shards(c);
    if (!shards) return gr_seterr(GR_ENOMEM, "out of memory");
    gr_proto_buf body;
    gr_proto_buf_init(&body);
    gr_proto_ckpt_save sv = {o->step, o->incremental ? GR_PROTO_CKPT_INCREMENTAL : 0,
                             o->zstd_level, o->full_every, strv(o->root), strv(inf.name),
                             strv(o->incremental ? o->parent : NULL)};
    int rc = gr_proto_put_ckpt_save(&body, &sv);
    gr_client_op *op = NULL;
    if (!rc) rc = ckpt_run(c, shards, c->nshards, GR_OP_CKPT_SAVE, &body, timeout, &op);
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
    op_free(op);
    if (rc) return rc;
    if (o->same_step && !(inf.sync_job && inf.sync_agree))
        return gr_seterr(GR_ESTALE,
                         "%s: the shards were not all at one sync step (%s): not committed",
                         inf.name, inf.sync_job ? "they disagree" : "no sync job on some shard");
    /* Every shard's file is durable: now, and only now, the manifest. */
    gr_proto_buf_init(&body);
    gr_proto_ckpt_commit cm = {c->nshards, o->keep, strv(o->root), strv(inf.name),
                               strv(inf.delta ? o->parent : NULL), strv(o->meta)};
    uint32_t zero = 0;
    rc = gr_proto_put_ckpt_commit(&body, &cm);
    if (!rc) rc = ckpt_run(c, &zero, 1, GR_OP_CKPT_COMMIT, &body, timeout, &op);
    gr_proto_buf_fini(&body);
    if (rc) return rc;
    gr_proto_ckpt_committed cr;
    rc = gr_proto_decode_ckpt_committed(op->reqs[0]->reply, op->reqs[0]->reply_len, &cr);
    op_free(op);
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
    uint32_t *shards = all_shards(c);
    if (!shards) return gr_seterr(GR_ENOMEM, "out of memory");
    gr_proto_buf body;
    gr_proto_buf_init(&body);
    gr_proto_ckpt_load ld = {resolve ? GR_PROTO_CKPT_RESOLVE : 0, strv(root), strv(name)};
    int rc = gr_proto_put_ckpt_load(&body, &ld);
    gr_client_op *op = NULL;
    if (!rc) rc = ckpt_run(c, shards, resolve ? 1 : c->nshards, GR_OP_CKPT_LOAD, &body, 3600000u, &op);
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
    op_free(op);
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
