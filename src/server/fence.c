/* Coordination on the shard's side: the layout epoch it serves and the fence that stops
 * requests while it is not sure it still owns its index (include/granary/server.h says when
 * each applies). The checks run on the connection loop before a request is queued, so a
 * refused request has done nothing; they read two atomics and cost nothing when unused. */
#include "server/server_int.h"

#include <cjson/cJSON.h>
#include <stdio.h>

void gr_server_set_fence(gr_server *s, gr_server_fence fence)
{
    atomic_store(&s->fence, (int)fence);
}

gr_server_fence gr_server_get_fence(const gr_server *s)
{
    return (gr_server_fence)atomic_load(&((gr_server *)s)->fence);
}

gr_server_fence gr_server_session_fence(gr_server *s)
{
    uint32_t mode;
    if (srv_sync_mode(s, &mode) && (mode == GR_SYNC_SYNC || mode == GR_SYNC_SEMISYNC))
        return GR_SERVER_FENCE_ALL;
    return GR_SERVER_FENCE_WRITES;
}

void gr_server_set_lease(gr_server *s, uint64_t until_ns) { atomic_store(&s->lease_ns, until_ns); }

int gr_server_set_epoch(gr_server *s, uint32_t epoch)
{
    if (epoch > GR_PROTO_EPOCH_MAX)
        return gr_seterr(GR_EINVAL, "layout epoch %u is over the limit of %u", epoch,
                         GR_PROTO_EPOCH_MAX);
    atomic_store(&s->epoch, epoch);
    return GR_OK;
}

uint32_t gr_server_epoch(const gr_server *s) { return atomic_load(&((gr_server *)s)->epoch); }

int gr_server_assign(gr_server *s, uint32_t shard, uint32_t shards)
{
    if (gr_server_get_fence(s) != GR_SERVER_FENCE_ALL)
        return gr_seterr(GR_EBUSY, "a shard index is given only to a fully fenced server");
    if (shards == 0 || shards > GR_SLOTS || shard >= shards)
        return gr_seterr(GR_EINVAL, "shard %u of %u is out of range", shard, shards);
    /* No request touches the slot map while the fence stops every table operation, and no
     * client has the address yet (the caller publishes it afterwards). */
    s->cfg.shard = shard;
    s->cfg.shards = shards;
    for (uint32_t slot = 0; slot < GR_SLOTS; slot++)
        s->owns[slot] = gr_proto_default_shard(slot, shards) == shard;
    return GR_OK;
}

int srv_fence_check(gr_server *s, const srv_op_row *row, const gr_proto_header *h, char *msg,
                    size_t cap)
{
    if (row->fence == SRV_FENCE_NEVER) return GR_OK;
    int fence = atomic_load(&s->fence);
    uint64_t lease = atomic_load(&s->lease_ns);
    if (lease && fence == GR_SERVER_OPEN && gr_now_ns() > lease)
        fence = (int)gr_server_session_fence(s); /* not heard from the coordinator lately */
    if (fence == GR_SERVER_FENCE_ALL || (fence == GR_SERVER_FENCE_WRITES && row->fence == SRV_FENCE_WRITE)) {
        snprintf(msg, cap, "shard %u is fenced (it lost its coordinator session or has not "
                 "finished taking over its index): %s refused, retry after the layout changes",
                 s->cfg.shard, gr_proto_op_name(h->op));
        return GR_ESTALE;
    }
    uint32_t want = gr_proto_request_epoch(h), have = atomic_load(&s->epoch);
    if (want != 0 && want != have) {
        snprintf(msg, cap, "layout epoch %u is stale: shard %u serves epoch %u; re-read the "
                 "layout", want, s->cfg.shard, have);
        return GR_ESTALE;
    }
    return GR_OK;
}

void srv_fence_stats_json(gr_server *s, void *rootp)
{
    static const char *const names[] = {"open", "writes", "all"};
    cJSON *root = rootp;
    int f = atomic_load(&s->fence);
    cJSON_AddNumberToObject(root, "epoch", atomic_load(&s->epoch));
    cJSON_AddStringToObject(root, "fence", f >= 0 && f <= 2 ? names[f] : "unknown");
    struct gr_server_join *j = atomic_load(&s->join);
    if (j) srv_join_stats_json(j, cJSON_AddObjectToObject(root, "coord"));
}
