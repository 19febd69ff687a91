/* Client(coord="zk://..."): a client that finds its shards through the coordinator's layout
 * (docs/coord.md) instead of a server list, as `granary train --coord` does
 * (src/cli/train_coord.c). It stamps the layout's epoch on every request and installs the
 * client's stale hook: a shard that refuses a request for its epoch (GR_ESTALE) makes the
 * hook re-read the layout; when the refusing shard still serves at the address the client
 * uses, the client takes the new epoch and sends the refused requests again (nothing ran on
 * that shard, so they apply once). A shard that moved (a standby took its index over) fails
 * the operation instead: re-pointing a connection is only safe with nothing in flight, so
 * the caller does it with Client.refresh() (gr_py_coord_refresh) between steps. */
#include "ext.h"

#include "granary/coord.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define POLL_MS 100

struct gr_py_coord {
    gr_coord *c;
};

/* The layout, once every shard of it has an address (a job still starting, or one whose
 * lost shard has no standby yet, has vacant entries): polls up to timeout_ms. */
static int read_served_layout(gr_coord *c, uint32_t timeout_ms, gr_coord_layout *l)
{
    uint64_t deadline = gr_now_ns() + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        memset(l, 0, sizeof *l);
        int rc = gr_coord_layout_get(c, l);
        uint32_t vacant = UINT32_MAX;
        for (uint32_t i = 0; !rc && i < l->n_shards && vacant == UINT32_MAX; i++)
            if (!l->shards[i].address[0]) vacant = i;
        if (!rc && vacant == UINT32_MAX) return GR_OK;
        if (!rc) {
            rc = gr_seterr(GR_EAGAIN, "coord %s: shard %u of the layout (epoch %llu) has no "
                           "address yet", gr_coord_spec(c), vacant,
                           (unsigned long long)l->epoch);
            gr_coord_layout_fini(l);
        }
        if (gr_now_ns() >= deadline) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", gr_errmsg());
            return gr_seterr(rc == GR_ENOENT || rc == GR_EAGAIN ? GR_ETIMEDOUT : rc,
                             "no served layout within %u ms (last: %s)", timeout_ms, msg);
        }
        gr_sleep_ms(POLL_MS);
    }
}

/* The stale hook (see the top of the file). Runs on the thread waiting on the op, without
 * the GIL. */
static int on_stale(void *ctx, gr_client *c, uint32_t shard, uint32_t epoch, const char *msg)
{
    (void)epoch;
    (void)msg;
    gr_py_coord *pc = ctx;
    gr_coord_layout l;
    memset(&l, 0, sizeof l);
    if (gr_coord_layout_get(pc->c, &l)) return GR_ESTALE; /* the op fails with the refusal */
    const char *now = gr_client_shard_addr(c, shard);
    int rc = l.n_shards == gr_client_shards(c) && shard < l.n_shards && now &&
                     !strcmp(l.shards[shard].address, now)
                 ? GR_OK
                 : GR_ESTALE;
    if (!rc && l.epoch != gr_client_epoch(c)) {
        gr_client_set_epoch(c, (uint32_t)l.epoch);
    } else if (!rc) {
        gr_sleep_ms(50); /* the shard is behind the layout (restoring): give it a moment */
    }
    gr_coord_layout_fini(&l);
    return rc;
}

int gr_py_coord_connect(const char *spec, const gr_client_config *base, gr_py_coord **out_pc,
                        gr_client **out_c)
{
    *out_pc = NULL;
    *out_c = NULL;
    gr_py_coord *pc = calloc(1, sizeof *pc);
    if (!pc) return gr_seterr(GR_ENOMEM, "out of memory");
    gr_coord_options o;
    gr_coord_options_default(&o);
    if (base->connect_timeout_ms) o.connect_timeout_ms = base->connect_timeout_ms;
    int rc = gr_coord_open(spec, &o, &pc->c);
    gr_coord_layout l;
    memset(&l, 0, sizeof l);
    if (!rc) rc = read_served_layout(pc->c, base->connect_timeout_ms, &l);
    char *servers = NULL;
    if (!rc) {
        size_t cap = (size_t)l.n_shards * GR_COORD_ADDR_MAX + 1;
        servers = malloc(cap);
        rc = servers ? gr_coord_layout_servers(&l, servers, cap)
                     : gr_seterr(GR_ENOMEM, "out of memory");
    }
    gr_client *c = NULL;
    if (!rc) {
        gr_client_config cfg = *base;
        cfg.servers = servers;
        cfg.cluster_file = NULL;
        rc = gr_client_create(&cfg, &c);
    }
    /* A static spec (a server list or cluster file) names uncoordinated shards, which serve
     * epoch 0 and refuse any other: only a ZooKeeper layout's epoch is stamped. */
    bool zk = !rc && gr_coord_backend_of(pc->c) == GR_COORD_ZOOKEEPER;
    if (zk) rc = gr_client_set_epoch(c, (uint32_t)l.epoch);
    free(servers);
    gr_coord_layout_fini(&l);
    if (rc) {
        gr_client_destroy(c);
        gr_py_coord_close(pc);
        return rc;
    }
    if (zk) gr_client_set_stale_hook(c, on_stale, pc);
    *out_pc = pc;
    *out_c = c;
    return GR_OK;
}

int gr_py_coord_refresh(gr_py_coord *pc, gr_client *c, uint32_t timeout_ms, uint32_t *moved)
{
    *moved = 0;
    gr_coord_layout l;
    int rc = read_served_layout(pc->c, timeout_ms, &l);
    if (rc) return rc;
    if (l.n_shards != gr_client_shards(c)) {
        rc = gr_seterr(GR_EINVAL, "the job's layout (epoch %llu) has %u shards; this client "
                       "was made for %u: make a new Client", (unsigned long long)l.epoch,
                       l.n_shards, gr_client_shards(c));
    }
    for (uint32_t i = 0; !rc && i < l.n_shards; i++) {
        if (!strcmp(l.shards[i].address, gr_client_shard_addr(c, i))) continue;
        rc = gr_client_set_shard_addr(c, i, l.shards[i].address);
        (*moved)++;
    }
    if (!rc && gr_coord_backend_of(pc->c) == GR_COORD_ZOOKEEPER)
        rc = gr_client_set_epoch(c, (uint32_t)l.epoch);
    gr_coord_layout_fini(&l);
    return rc;
}

void gr_py_coord_close(gr_py_coord *pc)
{
    if (!pc) return;
    gr_coord_close(pc->c);
    free(pc);
}
