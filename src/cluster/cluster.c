/* The embedded local cluster: S parameter-server shards as gr_servers inside this process, on
 * free loopback ports, so `granary train` without --servers (and the benchmark and tests) run
 * the real wire protocol and shard code with nothing to deploy. Its own part because it
 * depends on server, which train must not. */
#include "granary/cluster.h"
#include "granary/client.h"
#include "granary/proto.h"
#include "granary/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gr_local_cluster {
    gr_server **s;
    unsigned n;
    char *servers;       /* TCP, for anyone */
    char *local_servers; /* AF_UNIX, for clients on this machine */
};

int gr_local_cluster_start(unsigned shards, unsigned threads, gr_local_cluster **out)
{
    return gr_local_cluster_start_with(shards, threads, 0, NULL, out);
}

int gr_local_cluster_start_publishing(unsigned shards, unsigned threads,
                                      uint32_t publish_interval_ms, gr_local_cluster **out)
{
    return gr_local_cluster_start_with(shards, threads, publish_interval_ms, NULL, out);
}

int gr_local_cluster_start_metrics(unsigned shards, unsigned threads, gr_metrics *metrics,
                                   gr_local_cluster **out)
{
    return gr_local_cluster_start_with(shards, threads, 0, metrics, out);
}

int gr_local_cluster_start_with(unsigned shards, unsigned threads, uint32_t publish_interval_ms,
                                gr_metrics *metrics, gr_local_cluster **out)
{
    gr_local_cluster_opts o;
    gr_local_cluster_opts_default(&o, shards);
    o.threads = threads;
    o.publish_interval_ms = publish_interval_ms;
    o.metrics = metrics;
    return gr_local_cluster_start_opts(&o, out);
}

void gr_local_cluster_opts_default(gr_local_cluster_opts *o, unsigned shards)
{
    *o = (gr_local_cluster_opts){.shards = shards, .threads = 2};
}

int gr_local_cluster_start_opts(const gr_local_cluster_opts *o, gr_local_cluster **out)
{
    *out = NULL;
    const unsigned shards = o->shards, threads = o->threads;
    if (shards == 0 || shards > 256)
        return gr_seterr(GR_EINVAL, "a local cluster has 1..256 shards, not %u", shards);
    gr_local_cluster *c = calloc(1, sizeof *c);
    if (!c) return gr_seterr(GR_ENOMEM, "out of memory");
    c->s = calloc(shards, sizeof *c->s);
    c->servers = calloc(shards, 24);
    c->local_servers = calloc(shards, 72);
    int rc = c->s && c->servers && c->local_servers ? GR_OK : gr_seterr(GR_ENOMEM, "out of memory");
    for (unsigned i = 0; i < shards && !rc; i++) {
        gr_server_config cfg;
        gr_server_config_default(&cfg);
        cfg.host = "127.0.0.1";
        cfg.shard = i;
        cfg.shards = shards;
        cfg.threads = threads ? threads : 2;
        cfg.publish_interval_ms = o->publish_interval_ms;
        cfg.metrics = o->metrics;
        cfg.local_socket = true;
        cfg.slice_us = GR_LOCAL_CLUSTER_SLICE_US;
        cfg.populate_ahead = o->populate_ahead;
        cfg.huge_rows = o->huge_rows;
        rc = gr_server_create(&cfg, &c->s[i]);
        if (!rc) {
            c->n++;
            rc = gr_server_start(c->s[i]);
        }
        if (!rc) {
            char a[24];
            snprintf(a, sizeof a, "%s127.0.0.1:%u", i ? "," : "", gr_server_port(c->s[i]));
            strcat(c->servers, a);
            char u[72];
            snprintf(u, sizeof u, "%s%s", i ? "," : "", gr_server_local_addr(c->s[i]));
            strcat(c->local_servers, u);
        }
    }
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", gr_errmsg());
        gr_local_cluster_stop(c);
        return gr_seterr(rc, "local cluster: %s", msg);
    }
    *out = c;
    return GR_OK;
}

const char *gr_local_cluster_servers(const gr_local_cluster *c) { return c ? c->servers : NULL; }

const char *gr_local_cluster_local_servers(const gr_local_cluster *c)
{
    return c ? c->local_servers : NULL;
}

static int direct_pull(void *ctx, uint32_t shard, uint32_t table, uint32_t dim,
                       const uint64_t *keys, size_t n, float *rows, bool readonly)
{
    gr_local_cluster *c = ctx;
    if (shard >= c->n) return gr_seterr(GR_EINVAL, "no shard %u in a cluster of %u", shard, c->n);
    return gr_server_direct_pull(c->s[shard], table, dim, keys, n, rows, readonly);
}

static int direct_push(void *ctx, uint32_t shard, uint32_t table, uint32_t dim,
                       const uint64_t *keys, size_t n, const float *grads)
{
    gr_local_cluster *c = ctx;
    if (shard >= c->n) return gr_seterr(GR_EINVAL, "no shard %u in a cluster of %u", shard, c->n);
    return gr_server_direct_push(c->s[shard], table, dim, keys, n, grads);
}

static gr_server *shard_of(gr_local_cluster *c, uint32_t shard)
{
    if (shard < c->n) return c->s[shard];
    gr_seterr(GR_EINVAL, "no shard %u in a cluster of %u", shard, c->n);
    return NULL;
}

static int direct_acquire(void *ctx, uint32_t shard, uint32_t worker, uint64_t step,
                          uint32_t timeout_ms, uint64_t *tag, uint64_t *current)
{
    gr_server *s = shard_of(ctx, shard);
    return s ? gr_server_direct_acquire(s, worker, step, timeout_ms, tag, current) : GR_EINVAL;
}

#define MAX_PARTS 64

static int direct_push_step(void *ctx, uint32_t shard, uint32_t worker, uint64_t step,
                            const gr_client_batch *rows, size_t nrows,
                            const gr_client_dense_grad *dense, size_t ndense, uint32_t *outcome)
{
    gr_server *s = shard_of(ctx, shard);
    if (!s) return GR_EINVAL;
    if (nrows > MAX_PARTS || ndense > MAX_PARTS)
        return gr_seterr(GR_ETOOBIG, "a step push of %zu tables and %zu dense parts: at most %d "
                         "each", nrows, ndense, MAX_PARTS);
    gr_proto_section sec[MAX_PARTS];
    gr_proto_dense_part dp[MAX_PARTS];
    for (size_t i = 0; i < nrows; i++) {
        if (rows[i].n > UINT32_MAX) return gr_seterr(GR_ETOOBIG, "%zu keys in one table", rows[i].n);
        sec[i] = (gr_proto_section){rows[i].table, rows[i].dim, (uint32_t)rows[i].n, rows[i].keys,
                                    rows[i].grads};
    }
    for (size_t i = 0; i < ndense; i++)
        dp[i] = (gr_proto_dense_part){dense[i].name, (uint32_t)strlen(dense[i].name), dense[i].n,
                                      dense[i].grad};
    return gr_server_direct_push_step(s, worker, step, sec, (uint32_t)nrows, dp, (uint32_t)ndense,
                                      outcome, NULL);
}

static int direct_dense_pull(void *ctx, uint32_t shard, const char *name, float *out, size_t n)
{
    gr_server *s = shard_of(ctx, shard);
    return s ? gr_server_direct_dense_pull(s, name, out, n) : GR_EINVAL;
}

static int direct_dense_push(void *ctx, uint32_t shard, const char *name, const float *grad,
                             size_t n)
{
    gr_server *s = shard_of(ctx, shard);
    return s ? gr_server_direct_dense_push(s, name, grad, n) : GR_EINVAL;
}

int gr_local_cluster_direct(gr_local_cluster *c, gr_client *client)
{
    if (!c || !client) return gr_seterr(GR_EINVAL, "gr_local_cluster_direct: no cluster or client");
    gr_client_direct d = {c,
                          c->n,
                          direct_pull,
                          direct_push,
                          direct_acquire,
                          direct_push_step,
                          direct_dense_pull,
                          direct_dense_push};
    return gr_client_set_direct(client, &d);
}

void gr_local_cluster_stop(gr_local_cluster *c)
{
    if (!c) return;
    for (unsigned i = 0; i < c->n; i++) gr_server_stop(c->s[i]);
    for (unsigned i = 0; i < c->n; i++) gr_server_destroy(c->s[i]);
    free(c->s);
    free(c->servers);
    free(c->local_servers);
    free(c);
}
