/* The parameter-server training backend: gr_train_backend over the client library. Tables and
 * dense parameters live on the shards (a dense parameter is a dense tensor on its owner
 * shard, updated there by its optimizer). In async mode pushes are plain PUSH / DENSE_PUSH.
 * In sync, semisync and ssp it installs the job on every shard and runs the step protocol of
 * docs/sync.md: step_begin acquires the step on every shard and keeps the per-shard tags
 * under a token, fetch pulls rows and dense parameters with two requests in flight at once,
 * push_step sends the step's whole gradient in one PUSH_STEP per shard, worker_done leaves. */
#include "granary/client.h"
#include "granary/train.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Tokens a worker may hold at once (pipeline items in flight; the trainer's are at most
 * 3 * 64 + 4). */
#define RING 256
#define MAX_TABLES 64

typedef struct ps_ctx {
    gr_client *c;
    bool own_client;
    gr_ps_backend_opts o;
    uint32_t shards;
    bool stepped;
    pthread_mutex_t mu; /* the table list */
    uint32_t table_ids[MAX_TABLES], table_dims[MAX_TABLES], ntables;
    uint64_t *want;     /* [worker][shard]: the step to ask for next (fetch thread only) */
    uint64_t *next;     /* [worker]: next token (fetch thread only) */
    uint64_t *tags;     /* [worker][RING][shard] */
    atomic_bool cancelled;
    /* The sync job's owner: this trainer (docs/sync.md, "One trainer per job"). */
    uint64_t owner, started_ms;
    char label[128];
} ps_ctx;

/* The job this backend installs, owned by this trainer. Hybrid runs a sync job whose steps
 * carry only the dense gradient; the rows go through plain PULL/PUSH beside it. */
static gr_client_sync_config job_config(const ps_ctx *p)
{
    gr_client_sync_config sc;
    memset(&sc, 0, sizeof sc);
    sc.mode = p->o.mode == GR_MODE_HYBRID ? GR_CLIENT_SYNC_SYNC : (uint32_t)p->o.mode;
    sc.workers = p->o.job_workers ? p->o.job_workers : p->o.workers;
    sc.aggregate = p->o.aggregate;
    sc.staleness = p->o.staleness;
    sc.dense_lag = p->o.dense_lag;
    return sc;
}

/* Installs (or clears, with CLEAR) this trainer's job. */
static int configure(ps_ctx *p, unsigned flags)
{
    gr_client_sync_config sc = job_config(p);
    gr_client_sync_owner ow = {p->owner, p->started_ms, p->label};
    return gr_client_sync_configure_owned(p->c, &sc, &ow, flags, NULL);
}

void gr_ps_backend_opts_default(gr_ps_backend_opts *o)
{
    memset(o, 0, sizeof *o);
    o->mode = GR_MODE_ASYNC;
    o->dense_opt = GR_DENSE_OPT_ADAM;
    o->dense_lr = 1e-3f;
    o->beta1 = 0.9f;
    o->beta2 = 0.999f;
    o->eps = 1e-8f;
}

static int dim_of(ps_ctx *p, uint32_t table, uint32_t *dim)
{
    pthread_mutex_lock(&p->mu);
    int rc = GR_ENOENT;
    for (uint32_t i = 0; i < p->ntables; i++)
        if (p->table_ids[i] == table) {
            *dim = p->table_dims[i];
            rc = GR_OK;
        }
    pthread_mutex_unlock(&p->mu);
    return rc ? gr_seterr(rc, "table %u was not declared with table_init", table) : GR_OK;
}

/* A run owns its tables: rows left on the servers by an earlier run are refused, reused or
 * dropped, as the options say (docs/train.md, "A run owns its tables"). */
static int check_existing(ps_ctx *p, const gr_table_spec *spec)
{
    if (p->o.tables == GR_PS_TABLES_REUSE) return GR_OK;
    char *js = NULL;
    int rc = gr_client_describe_table(p->c, spec->name, &js);
    if (rc == GR_ENOENT) {
        gr_clearerr();
        return GR_OK;
    }
    if (rc) return rc;
    cJSON *j = cJSON_Parse(js);
    free(js);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "rows");
    uint64_t rows = cJSON_IsNumber(r) && r->valuedouble > 0 ? (uint64_t)r->valuedouble : 0;
    cJSON_Delete(j);
    if (p->o.tables == GR_PS_TABLES_FRESH) {
        if ((rc = gr_client_drop_table(p->c, spec->name))) return rc;
        GR_LOGW("train: dropped table '%s' (%llu rows) on the servers to start fresh (--fresh)",
                spec->name, (unsigned long long)rows);
        return GR_OK;
    }
    if (!rows) return GR_OK;
    return gr_seterr(GR_EEXIST, "table '%s' on the servers already holds %llu rows (from an "
                     "earlier run?) and this run is not a resume: pass --fresh to drop and "
                     "recreate it, --reuse-tables to continue with its rows, or --resume DIR to "
                     "continue from a checkpoint", spec->name, (unsigned long long)rows);
}

static int ps_table_init(void *ctx, const gr_table_spec *spec)
{
    ps_ctx *p = ctx;
    int rc = check_existing(p, spec);
    if (rc) return rc;
    char *json = gr_table_spec_to_json(spec);
    if (!json) return gr_seterr(GR_ENOMEM, "out of memory");
    rc = gr_client_create_table(p->c, json);
    free(json);
    if (rc) return rc;
    pthread_mutex_lock(&p->mu);
    bool known = false;
    for (uint32_t i = 0; i < p->ntables; i++) known |= p->table_ids[i] == spec->id;
    if (!known && p->ntables == MAX_TABLES)
        rc = gr_seterr(GR_ECAPACITY, "the parameter-server backend tracks at most %d tables",
                       MAX_TABLES);
    else if (!known) {
        p->table_ids[p->ntables] = spec->id;
        p->table_dims[p->ntables++] = spec->dim;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* The trainer hands the backend unique keys (train.h), so the client does not dedup them a
 * second time: each batch below says so. */
#define UNIQUE GR_CLIENT_BATCH_UNIQUE

static int ps_pull(void *ctx, uint32_t table, const uint64_t *keys, size_t n, float *rows,
                   unsigned flags)
{
    ps_ctx *p = ctx;
    if (n == 0) return GR_OK;
    uint32_t dim = 0;
    int rc = dim_of(p, table, &dim);
    if (rc) return rc;
    gr_client_batch b = {table, dim, n, keys, rows, NULL, UNIQUE};
    return gr_client_pull_many(p->c, &b, 1, (flags & GR_PULL_READONLY) ? GR_CLIENT_READONLY : 0);
}

static int ps_push(void *ctx, uint32_t table, const uint64_t *keys, size_t n, const float *grads)
{
    ps_ctx *p = ctx;
    if (n == 0) return GR_OK;
    uint32_t dim = 0;
    int rc = dim_of(p, table, &dim);
    if (rc) return rc;
    gr_client_batch b = {table, dim, n, keys, NULL, grads, UNIQUE};
    return gr_client_push_many(p->c, &b, 1);
}

/* The shard-side spec of a dense parameter: zeros, the configured optimizer. The values are
 * then set with DENSE_SET (the model's own initialisation). */
static int dense_spec(const ps_ctx *p, const char *name, size_t n, char *buf, size_t cap)
{
    const gr_ps_backend_opts *o = &p->o;
    char opt[256];
    switch (o->dense_opt) {
    case GR_DENSE_OPT_ADAM:
        snprintf(opt, sizeof opt, "{\"kind\":\"adam\",\"lr\":%.9g,\"beta1\":%.9g,\"beta2\":%.9g,\"eps\":%.9g}",
                 o->dense_lr, o->beta1, o->beta2, o->eps);
        break;
    case GR_DENSE_OPT_ADAGRAD:
        snprintf(opt, sizeof opt, "{\"kind\":\"adagrad\",\"lr\":%.9g,\"eps\":%.9g}", o->dense_lr,
                 o->eps);
        break;
    case GR_DENSE_OPT_SGD:
        snprintf(opt, sizeof opt, "{\"kind\":\"sgd\",\"lr\":%.9g}", o->dense_lr);
        break;
    default: return gr_seterr(GR_EINVAL, "unknown dense optimizer %d", (int)o->dense_opt);
    }
    int w = snprintf(buf, cap, "{\"name\":\"%s\",\"size\":%zu,\"optimizer\":%s}", name, n, opt);
    return w > 0 && (size_t)w < cap ? GR_OK : gr_seterr(GR_EINVAL, "dense spec too long");
}

static int ps_dense_init(void *ctx, const char *name, const float *init, size_t n)
{
    ps_ctx *p = ctx;
    char spec[512];
    int rc = dense_spec(p, name, n, spec, sizeof spec);
    if (!rc) rc = gr_client_dense_create(p->c, spec);
    /* The run starts from the model's initialisation (Xavier weights the shard's initializers
     * cannot express): set it, which also resets the optimizer state. Not in a partial
     * recovery: the shards hold the trained values (the lost shard's restored ones) and no
     * checkpoint load follows to put them back. */
    if (!rc && init && !p->o.resume_position_only && !p->o.joined)
        rc = gr_client_dense_set(p->c, name, init, n);
    return rc;
}

static int ps_dense_pull(void *ctx, const char *name, float *out, size_t n)
{
    return gr_client_dense_pull(((ps_ctx *)ctx)->c, name, out, n);
}

static int ps_dense_push(void *ctx, const char *name, const float *grad, size_t n)
{
    return gr_client_dense_push(((ps_ctx *)ctx)->c, name, grad, n);
}

static int ps_dense_pull_start(void *ctx, const char *name, float *out, size_t n, void **op)
{
    gr_client_op *o = NULL;
    int rc = gr_client_dense_pull_start(((ps_ctx *)ctx)->c, name, out, n, &o);
    *op = o;
    return rc;
}

static int ps_dense_push_start(void *ctx, const char *name, const float *grad, size_t n, void **op)
{
    gr_client_op *o = NULL;
    int rc = gr_client_dense_push_start(((ps_ctx *)ctx)->c, name, grad, n, &o);
    *op = o;
    return rc;
}

static int ps_op_wait(void *ctx, void *op)
{
    (void)ctx;
    return gr_client_wait(op, -1);
}

static int ps_fetch(void *ctx, uint32_t table, const uint64_t *keys, size_t n, float *rows,
                    const char *dense, float *params, size_t np)
{
    ps_ctx *p = ctx;
    uint32_t dim = 0;
    int rc = dim_of(p, table, &dim);
    if (rc) return rc;
    gr_client_op *rop = NULL, *dop = NULL;
    gr_client_batch b = {table, dim, n, keys, rows, NULL, UNIQUE};
    /* Both requests in flight at once: one round trip for the step's parameters. */
    if (n && (rc = gr_client_pull_start(p->c, &b, 1, 0, &rop))) return rc;
    rc = gr_client_dense_pull_start(p->c, dense, params, np, &dop);
    int r1 = rop ? gr_client_wait(rop, -1) : GR_OK;
    char msg[512] = "";
    if (r1) snprintf(msg, sizeof msg, "%s", gr_errmsg());
    int r2 = rc ? rc : gr_client_wait(dop, -1);
    if (r1) return gr_seterr(r1, "%s", msg);
    return r2;
}

static uint64_t *tag_slot(ps_ctx *p, uint32_t worker, uint64_t token)
{
    return p->tags + ((size_t)worker * RING + token % RING) * p->shards;
}

static int ps_step_begin(void *ctx, uint32_t worker, uint64_t *token)
{
    ps_ctx *p = ctx;
    if (worker >= p->o.workers)
        return gr_seterr(GR_EINVAL, "worker %u out of range (job of %u workers)", worker,
                         p->o.workers);
    if (atomic_load(&p->cancelled)) return gr_seterr(GR_ESHUTDOWN, "the job was cancelled");
    uint64_t t = p->next[worker]++;
    uint64_t *want = p->want + (size_t)worker * p->shards, *tags = tag_slot(p, worker, t);
    int rc = gr_client_sync_acquire(p->c, p->o.worker_base + worker, want, p->o.timeout_ms, tags,
                                    NULL);
    if (rc) return rc;
    for (uint32_t s = 0; s < p->shards; s++) want[s] = tags[s] + 1;
    *token = t;
    return GR_OK;
}

static int ps_push_step(void *ctx, uint32_t worker, uint64_t token, uint32_t table,
                        const uint64_t *keys, size_t n, const float *grads, const char *dense,
                        const float *dgrad, size_t dn, bool *dropped)
{
    ps_ctx *p = ctx;
    uint32_t dim = 0;
    int rc = dim_of(p, table, &dim);
    if (rc) return rc;
    gr_client_batch b = {table, dim, n, keys, NULL, grads, UNIQUE};
    gr_client_dense_grad d = {dense, dgrad, dn};
    uint32_t *out = calloc(p->shards, sizeof *out);
    if (!out) return gr_seterr(GR_ENOMEM, "out of memory");
    rc = gr_client_push_step(p->c, p->o.worker_base + worker, tag_slot(p, worker, token), &b,
                             n ? 1 : 0, &d,
                             dense ? 1 : 0, out);
    bool drop = false;
    for (uint32_t s = 0; !rc && s < p->shards; s++) drop |= out[s] == GR_CLIENT_PUSH_DROPPED;
    free(out);
    if (dropped) *dropped = drop;
    return rc;
}

static int ps_worker_done(void *ctx, uint32_t worker)
{
    ps_ctx *p = ctx;
    return gr_client_sync_leave(p->c, p->o.worker_base + worker);
}

static void ps_cancel(void *ctx)
{
    ps_ctx *p = ctx;
    atomic_store(&p->cancelled, true);
    /* Dropping the job answers every parked acquire at once (GR_ESHUTDOWN). Only shards that
     * are still connected: a dead one would hold this call for the reconnect timeout. */
    (void)configure(p, GR_CLIENT_SYNC_CLEAR | GR_CLIENT_SYNC_LIVE);
}

static const gr_train_steps ps_steps = {ps_step_begin, ps_fetch, ps_push_step, ps_worker_done,
                                         ps_cancel};

static void ps_destroy(void *ctx)
{
    ps_ctx *p = ctx;
    if (!p) return;
    if (p->own_client) gr_client_destroy(p->c);
    pthread_mutex_destroy(&p->mu);
    free(p->want);
    free(p->next);
    free(p->tags);
    free(p);
}

/* ---- checkpoints: the shards save and load themselves (gr_client_ckpt_*) ---- */

static int ps_ckpt_save(void *ctx, gr_train_ckpt *k)
{
    ps_ctx *p = ctx;
    gr_client_ckpt_opts o;
    memset(&o, 0, sizeof o);
    o.root = k->root;
    o.step = k->step;
    o.parent = k->parent;
    o.incremental = k->incremental;
    o.full_every = k->full_every;
    o.zstd_level = k->zstd_level;
    o.keep = k->keep;
    o.meta = k->meta;
    o.same_step = k->same_step && p->stepped;
    gr_client_ckpt_info info;
    int rc = gr_client_ckpt_save(p->c, &o, &info);
    if (rc) return rc;
    snprintf(k->name, sizeof k->name, "%s", info.name);
    k->delta = info.delta;
    k->bytes = info.bytes;
    k->rows = info.rows;
    k->seconds = info.seconds;
    return GR_OK;
}

static int ps_ckpt_load(void *ctx, const char *root, const char *name, gr_train_ckpt *out)
{
    ps_ctx *p = ctx;
    gr_client_ckpt_loaded ld;
    int rc = gr_client_ckpt_load(p->c, root, name, p->o.resume_position_only, &ld);
    if (rc) return rc;
    snprintf(out->name, sizeof out->name, "%s", ld.name);
    out->step = ld.step;
    out->meta = ld.meta;
    out->rows = ld.rows;
    out->seconds = ld.seconds;
    if (p->stepped && !p->o.joined) {
        /* The job's step state belongs to the run that was interrupted (gradients staged for a
         * step it never finished, its workers' step counts): start it over. Called before any
         * worker runs, so the per-worker arrays are ours. */
        rc = configure(p, GR_CLIENT_SYNC_RESET);
        memset(p->want, 0, (size_t)p->o.workers * p->shards * sizeof *p->want);
        memset(p->next, 0, p->o.workers * sizeof *p->next);
    }
    return rc;
}

int gr_ps_backend_create(const gr_ps_backend_opts *o, gr_train_backend *out)
{
    memset(out, 0, sizeof *out);
    if (!o || (!o->client && !o->servers))
        return gr_seterr(GR_EINVAL, "parameter-server backend: give a client or a server list");
    if (o->mode < GR_MODE_ASYNC || o->mode > GR_MODE_HYBRID)
        return gr_seterr(GR_EINVAL, "parameter-server backend: unknown mode %d", o->mode);
    ps_ctx *p = calloc(1, sizeof *p);
    if (!p) return gr_seterr(GR_ENOMEM, "out of memory");
    p->o = *o;
    if (!p->o.timeout_ms) p->o.timeout_ms = 60000;
    pthread_mutex_init(&p->mu, NULL);
    int rc = GR_OK;
    if (o->client) {
        p->c = o->client;
    } else {
        gr_client_config cc;
        gr_client_config_default(&cc);
        cc.servers = o->servers;
        cc.auth_file = o->auth_file;
        cc.slice_us = GR_TRAIN_IO_SLICE_US;
        rc = gr_client_create(&cc, &p->c);
        p->own_client = rc == GR_OK;
    }
    p->stepped = o->mode != GR_MODE_ASYNC;
    if (!rc && p->stepped) {
        if (p->o.workers == 0 || p->o.workers > 65536)
            rc = gr_seterr(GR_EINVAL, "mode %s needs 1..65536 workers, got %u",
                           gr_train_mode_name((gr_train_mode)o->mode), p->o.workers);
        uint32_t all = p->o.job_workers ? p->o.job_workers : p->o.workers;
        if (!rc && (all < p->o.workers || p->o.worker_base > all - p->o.workers))
            rc = gr_seterr(GR_EINVAL, "workers %u..%u are not in a job of %u workers",
                           p->o.worker_base, p->o.worker_base + p->o.workers - 1, all);
        if (!rc && o->dense_lag && o->mode != GR_MODE_SYNC && o->mode != GR_MODE_HYBRID)
            rc = gr_seterr(GR_EINVAL, "a dense lag (%u) needs mode hybrid or sync, not %s",
                           o->dense_lag, gr_train_mode_name((gr_train_mode)o->mode));
        if (!rc && o->mode == GR_MODE_SEMISYNC && p->o.aggregate == 0)
            p->o.aggregate = all > 1 ? all - 1 : 1;
        p->shards = rc ? 0 : gr_client_shards(p->c);
        if (!rc) {
            p->want = calloc((size_t)p->o.workers * p->shards, sizeof *p->want);
            p->next = calloc(p->o.workers, sizeof *p->next);
            p->tags = calloc((size_t)p->o.workers * RING * p->shards, sizeof *p->tags);
            if (!p->want || !p->next || !p->tags) rc = gr_seterr(GR_ENOMEM, "out of memory");
        }
        if (!rc) {
            p->owner = o->owner ? o->owner : gr_random_id();
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            p->started_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
            char host[64] = "?";
            if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
            host[sizeof host - 1] = '\0';
            snprintf(p->label, sizeof p->label, "%s:%ld", host, (long)getpid());
            rc = configure(p, o->reset ? GR_CLIENT_SYNC_RESET : 0);
        }
    }
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", gr_errmsg());
        ps_destroy(p);
        return gr_seterr(rc, "%s", msg);
    }
    out->ctx = p;
    out->table_init = ps_table_init;
    out->pull = ps_pull;
    out->push = ps_push;
    out->dense_init = ps_dense_init;
    out->dense_pull = ps_dense_pull;
    out->dense_push = ps_dense_push;
    out->destroy = ps_destroy;
    out->dense_pull_start = ps_dense_pull_start;
    out->dense_push_start = ps_dense_push_start;
    out->op_wait = ps_op_wait;
    out->ckpt_save = ps_ckpt_save;
    out->ckpt_load = ps_ckpt_load;
    out->checkpoints = true;
    out->steps = p->stepped ? &ps_steps : NULL;
    return GR_OK;
}

int gr_ps_backend_finish(gr_train_backend *b)
{
    if (!b || b->destroy != ps_destroy) return gr_seterr(GR_EINVAL, "not a parameter-server backend");
    ps_ctx *p = b->ctx;
    if (!p->stepped) return GR_OK;
    /* Ours only: a job someone replaced with --sync-reset meanwhile is left alone. */
    return configure(p, GR_CLIENT_SYNC_CLEAR);
}
