/* The checks every request handler repeats, in one place: keys routed to this shard, dense
 * parameters owned by it, gradients finite. Each returns a gr_err whose message names what
 * was wrong; none changes anything, so handlers run them all before applying anything. */
#include "server/server_int.h"

#include <math.h>
#include <string.h>

int srv_check_routing(const gr_server *s, const gr_proto_section *sec)
{
    if (s->cfg.shards == 1 || !sec->keys) return GR_OK;
    uint32_t slots[512]; /* hashed a chunk at a time: gr_slots_of makes no call per key */
    for (uint32_t k0 = 0; k0 < sec->n; k0 += 512) {
        uint32_t m = sec->n - k0 < 512 ? sec->n - k0 : 512, bad = 0;
        gr_slots_of(sec->keys + k0, m, slots);
        for (uint32_t j = 0; j < m; j++) bad |= !s->owns[slots[j]];
        for (uint32_t j = 0; bad && j < m; j++)
            if (!s->owns[slots[j]])
                return gr_seterr(GR_ESTALE,
                                 "key %llu (slot %u) belongs to shard %u, not shard %u: the "
                                 "client's slot map is wrong or stale",
                                 (unsigned long long)sec->keys[k0 + j], slots[j],
                                 gr_proto_default_shard(slots[j], s->cfg.shards), s->cfg.shard);
    }
    return GR_OK;
}

srv_entry *srv_get_dense(gr_server *s, const char *name, int *rc)
{
    srv_entry *e = srv_registry_get(&s->reg, true, name, 0);
    if (!e) {
        uint32_t slot = gr_proto_dense_slot(name, strlen(name));
        if (!s->owns[slot])
            *rc = gr_seterr(GR_ESTALE, "dense parameter '%s' belongs to shard %u, not shard %u",
                            name, gr_proto_default_shard(slot, s->cfg.shards), s->cfg.shard);
        else
            *rc = gr_seterr(GR_ENOENT, "no dense parameter named '%s' on shard %u", name,
                            s->cfg.shard);
    }
    return e;
}

size_t srv_first_nonfinite(const float *v, size_t n)
{
    /* The exponent-bits test vectorizes; the search for the culprit runs only on a hit. */
    uint32_t bad = 0;
    for (size_t k = 0; k < n; k++) {
        uint32_t b;
        memcpy(&b, &v[k], sizeof b);
        bad |= (uint32_t)((b & 0x7f800000u) == 0x7f800000u);
    }
    for (size_t k = 0; bad && k < n; k++)
        if (!isfinite(v[k])) return k;
    return n;
}

int srv_check_finite(const float *v, size_t n, const char *what)
{
    size_t i = srv_first_nonfinite(v, n);
    if (i < n) return gr_seterr(GR_EINVAL, "%s: gradient value %zu is not finite", what, i);
    return GR_OK;
}
