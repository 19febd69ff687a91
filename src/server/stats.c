/* The STATS reply: the shard, its connections (conn.c's counters), tables and dense
 * parameters, every module's object (sync, ckpt) and the per-opcode counters, which are
 * declared once by the opcode X-macro. The same document feeds the shard's Prometheus
 * series (metrics.c), so nothing is counted twice. */
#include "server/server_int.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

void *srv_stats_build(gr_server *s)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddNumberToObject(root, "shard", s->cfg.shard);
    cJSON_AddNumberToObject(root, "shards", s->cfg.shards);
    srv_fence_stats_json(s, root);
    cJSON_AddStringToObject(root, "version", GR_VERSION_STRING);
    cJSON_AddNumberToObject(root, "uptime_s", (double)(gr_now_ns() - s->start_ns) / 1e9);
    cJSON_AddNumberToObject(root, "threads", s->nworkers);
    srv_net_stats *ns = srv_net_counters(s->net);
    cJSON_AddNumberToObject(root, "connections", atomic_load(&ns->nconns));
    cJSON_AddNumberToObject(root, "connections_total", (double)atomic_load(&ns->conns_total));
    cJSON_AddNumberToObject(root, "connections_rejected", (double)atomic_load(&ns->conns_rejected));
    cJSON_AddNumberToObject(root, "connections_reaped", (double)atomic_load(&ns->reaped));
    cJSON_AddNumberToObject(root, "connections_dropped_slow", (double)atomic_load(&ns->dropped_slow));
    cJSON_AddNumberToObject(root, "inflight_bytes", (double)atomic_load(&ns->total_inflight_bytes));
    cJSON_AddNumberToObject(root, "bad_frames",
                            (double)(atomic_load(&s->bad_frames) + atomic_load(&ns->bad_frames)));
    cJSON_AddNumberToObject(root, "auth_failures", (double)atomic_load(&s->auth_failures));
    cJSON_AddNumberToObject(root, "inflight", (double)atomic_load(&s->inflight));
    pthread_mutex_lock(&s->q_mu);
    cJSON_AddNumberToObject(root, "queued", (double)s->q_len);
    pthread_mutex_unlock(&s->q_mu);

    srv_entry **items;
    size_t n;
    uint64_t total_bytes = 0, total_rows = 0;
    cJSON *tables = cJSON_AddArrayToObject(root, "tables");
    cJSON *dense = cJSON_AddArrayToObject(root, "dense");
    if (srv_registry_snapshot(&s->reg, &items, &n) == GR_OK) {
        for (size_t i = 0; i < n; i++) {
            gr_table_stats st;
            gr_table_get_stats(items[i]->table, &st);
            const gr_table_spec *sp = gr_table_get_spec(items[i]->table);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", items[i]->name);
            if (items[i]->dense) {
                cJSON_AddNumberToObject(o, "size", (double)items[i]->dense_size);
            } else {
                cJSON_AddNumberToObject(o, "id", sp->id);
                cJSON_AddNumberToObject(o, "dim", sp->dim);
                cJSON_AddNumberToObject(o, "rows", (double)st.rows);
            }
            cJSON_AddNumberToObject(o, "bytes", (double)st.bytes);
            cJSON_AddNumberToObject(o, "hits", (double)st.hits);
            cJSON_AddNumberToObject(o, "misses", (double)st.misses);
            cJSON_AddNumberToObject(o, "applies", (double)st.applies);
            cJSON_AddNumberToObject(o, "admits", (double)st.admits);
            cJSON_AddNumberToObject(o, "rejects", (double)st.rejects);
            cJSON_AddNumberToObject(o, "nonfinite_rejected", (double)st.nonfinite_rejected);
            cJSON_AddNumberToObject(o, "nonfinite_clipped", (double)st.nonfinite_clipped);
            cJSON_AddNumberToObject(o, "evictions", (double)(st.evictions + st.expirations));
            cJSON_AddItemToArray(items[i]->dense ? dense : tables, o);
            total_bytes += st.bytes;
            if (!items[i]->dense) total_rows += st.rows;
        }
        srv_registry_release(items, n);
    }
    cJSON_AddNumberToObject(root, "rows", (double)total_rows);
    cJSON_AddNumberToObject(root, "memory_bytes", (double)total_bytes);
    for (size_t m = 0; m < srv_nmodules; m++) srv_modules[m]->stats_json(s, root);
    cJSON *reqs = cJSON_AddObjectToObject(root, "requests");
    for (unsigned op = 1; op < GR_PROTO_OP_LIMIT; op++) {
        const char *nm = gr_proto_op_name(op);
        if (!nm) continue;
        srv_op_stats *o = &s->ops[op];
        cJSON *x = cJSON_AddObjectToObject(reqs, nm);
        cJSON_AddNumberToObject(x, "count", (double)atomic_load(&o->count));
        cJSON_AddNumberToObject(x, "errors", (double)atomic_load(&o->errors));
        cJSON_AddNumberToObject(x, "keys", (double)atomic_load(&o->keys));
        cJSON_AddNumberToObject(x, "bytes_in", (double)atomic_load(&o->bytes_in));
        cJSON_AddNumberToObject(x, "bytes_out", (double)atomic_load(&o->bytes_out));
    }
    return root;
}

char *srv_stats_json(gr_server *s)
{
    cJSON *root = srv_stats_build(s);
    if (!root) return NULL;
    char *txt = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return txt;
}

int srv_stats_op(srv_req *r)
{
    if (r->len != 0) {
        *r->fatal = true;
        return gr_seterr(GR_EPROTO, "stats request carries a body");
    }
    char *txt = srv_stats_json(r->s);
    if (!txt) return gr_seterr(GR_ENOMEM, "cannot format stats");
    size_t start = r->out->len;
    int rc = gr_proto_begin(r->out, GR_PROTO_RESPONSE, r->h->op, 0, 0, r->h->id);
    if (!rc) rc = gr_proto_put_str(r->out, txt, strlen(txt));
    if (!rc) rc = gr_proto_end(r->out, start);
    free(txt);
    return rc;
}
