/* The shard's Prometheus series. Everything the STATS document already counts (connections,
 * per-opcode requests, tables, the sync job, checkpoints) is copied from that document at
 * each scrape by one collector, through the tables below, so no counter exists twice; the
 * only series counted here is the request latency, which nothing else measured. Every series
 * carries shard="I" (several shards of one process share a registry). docs/operations.md
 * lists the names. */
#include "server/server_int.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One number of the STATS document and its series. obj: the member holding it: an object
 * ("" for the top level, "sync", "ckpt", "ckpt.last_save"; labels shard), or, in the second
 * and third tables, the array "tables" (labels shard, table), "dense" (shard, dense), or the
 * per-opcode object "requests" (shard, op). */
typedef struct mirror_row {
    const char *obj, *key;
    gr_metric_type type;
    const char *name, *help;
} mirror_row;

#define C GR_METRIC_COUNTER
#define G GR_METRIC_GAUGE
static const mirror_row shard_rows[] = {
    {"", "connections", G, "granary_server_connections", "Open client connections."},
    {"", "connections_total", C, "granary_server_connections_accepted_total",
     "Connections accepted."},
    {"", "connections_rejected", C, "granary_server_connections_rejected_total",
     "Connections refused over --max-connections."},
    {"", "connections_reaped", C, "granary_server_connections_reaped_total",
     "Connections closed for a deadline (idle, stalled frame, authentication)."},
    {"", "connections_dropped_slow", C, "granary_server_connections_dropped_slow_total",
     "Connections dropped because the peer did not read its replies."},
    {"", "inflight_bytes", G, "granary_server_inflight_request_bytes",
     "Request bodies held, over all connections."},
    {"", "bad_frames", C, "granary_server_bad_frames_total",
     "Frames that did not decode (the connection was closed)."},
    {"", "auth_failures", C, "granary_server_auth_failures_total",
     "Failed or missing authentications."},
    {"", "inflight", G, "granary_server_inflight_requests",
     "Requests queued or running on the pool."},
    {"", "queued", G, "granary_server_queued_requests", "Requests waiting for a pool thread."},
    {"", "rows", G, "granary_server_rows", "Embedding rows held by the shard, all tables."},
    {"", "memory_bytes", G, "granary_server_memory_bytes",
     "Bytes held by the shard's tables and dense parameters (the table engine's accounting)."},
    {"sync", "step", G, "granary_sync_step", "The sync job's global step G on this shard."},
    {"sync", "applied_steps", C, "granary_sync_applied_steps_total",
     "Steps the sync job applied (counts restart with a new job)."},
    {"sync", "admitted", C, "granary_sync_admitted_pushes_total",
     "Gradient pushes admitted into applied steps."},
    {"sync", "dropped", C, "granary_sync_dropped_gradients_total",
     "Stale gradient pushes dropped (semisync)."},
    {"sync", "short_steps", C, "granary_sync_short_steps_total",
     "Steps applied with fewer than K pushes because workers had left."},
    {"sync", "waiting", G, "granary_sync_waiting_workers", "Step acquires parked on this shard."},
    {"sync", "waits", C, "granary_sync_waits_total", "Step acquires that had to wait."},
    {"sync", "wait_s", C, "granary_sync_wait_seconds_total",
     "Seconds step acquires waited, summed."},
    {"sync", "staleness", G, "granary_sync_staleness_bound",
     "The job's staleness bound (semisync: drop older gradients; ssp: steps ahead)."},
    {"sync", "workers", G, "granary_sync_workers", "Workers in the sync job."},
    {"ckpt", "saves", C, "granary_checkpoint_saves_total", "Checkpoint shard files written."},
    {"ckpt", "save_errors", C, "granary_checkpoint_save_errors_total",
     "Checkpoint saves that failed."},
    {"ckpt", "commits", C, "granary_checkpoint_commits_total", "Checkpoints committed (manifest)."},
    {"ckpt", "commit_errors", C, "granary_checkpoint_commit_errors_total",
     "Checkpoint commits that failed."},
    {"ckpt", "loads", C, "granary_checkpoint_loads_total", "Checkpoint restores into this shard."},
    {"ckpt", "load_errors", C, "granary_checkpoint_load_errors_total", "Restores that failed."},
    {"ckpt.last_save", "seconds", G, "granary_checkpoint_last_save_duration_seconds",
     "Wall time of the shard's last checkpoint save."},
    {"ckpt.last_save", "bytes", G, "granary_checkpoint_last_save_bytes",
     "Bytes of the shard's last checkpoint file."},
    {"ckpt.last_save", "rows", G, "granary_checkpoint_last_save_rows", "Rows in the last save."},
    {"ckpt.last_save", "step", G, "granary_checkpoint_last_save_step", "Step of the last save."},
};

/* Per table ({"tables": [...]}, label table) and per opcode ({"requests": {op: {...}}}). */
static const mirror_row table_rows[] = {
    {"tables", "rows", G, "granary_table_rows", "Rows of an embedding table on this shard."},
    {"tables", "bytes", G, "granary_table_bytes",
     "Bytes of an embedding table on this shard (rows, index, trackers)."},
    {"tables", "hits", C, "granary_table_lookup_hits_total", "Lookups of present keys."},
    {"tables", "misses", C, "granary_table_lookup_misses_total", "Lookups of missing keys."},
    {"tables", "admits", C, "granary_table_admissions_total", "Missing keys given a row."},
    {"tables", "rejects", C, "granary_table_admission_rejects_total",
     "Missing keys refused by the admission policy."},
    {"tables", "evictions", C, "granary_table_evictions_total", "Rows evicted (capacity and TTL)."},
    {"tables", "applies", C, "granary_table_applied_rows_total", "Gradient rows applied."},
    {"tables", "nonfinite_rejected", C, "granary_table_nonfinite_rejected_total",
     "Row updates refused because the result would not be finite."},
    {"dense", "bytes", G, "granary_dense_bytes", "Bytes of a dense parameter on this shard."},
};
static const mirror_row op_rows[] = {
    {"requests", "count", C, "granary_server_requests_total", "Requests by operation."},
    {"requests", "errors", C, "granary_server_request_errors_total",
     "Requests answered with an error, by operation."},
    {"requests", "keys", C, "granary_server_request_keys_total", "Keys carried, by operation."},
    {"requests", "bytes_in", C, "granary_server_received_bytes_total",
     "Request bytes received (header and body), by operation."},
    {"requests", "bytes_out", C, "granary_server_sent_bytes_total",
     "Reply bytes sent, by operation."},
};
#undef C
#undef G

#define NROWS(a) (sizeof(a) / sizeof((a)[0]))
#define NSHARD NROWS(shard_rows)
#define NTABLE NROWS(table_rows)
#define NOP NROWS(op_rows)

/* The families of the rows above, looked up once (srv_metrics_init). */
struct srv_metrics {
    gr_metric_family *shard[NSHARD], *table[NTABLE], *op[NOP], *staleness;
    char label[16]; /* this shard's index, the value of its "shard" label */
};

static int declare(gr_metrics *r, const mirror_row *row, const char *labels, gr_metric_family **out)
{
    return gr_metrics_family(r, row->type, row->name, row->help, labels, NULL, 0,
                             GR_METRIC_MIRRORED, out);
}

static const char *table_labels(const mirror_row *row)
{
    return !strcmp(row->obj, "dense") ? "shard,dense" : "shard,table";
}

static cJSON *member(cJSON *root, const char *path)
{
    if (!*path) return root;
    char a[32];
    const char *dot = strchr(path, '.');
    snprintf(a, sizeof a, "%.*s", dot ? (int)(dot - path) : (int)strlen(path), path);
    cJSON *o = cJSON_GetObjectItemCaseSensitive(root, a);
    return dot ? cJSON_GetObjectItemCaseSensitive(o, dot + 1) : o;
}

static void collect(void *ctx, gr_metrics *r)
{
    (void)r;
    gr_server *s = ctx;
    struct srv_metrics *mx = s->mx;
    cJSON *root = srv_stats_build(s);
    if (!root) return;
    const char *shard = mx->label;
    for (size_t i = 0; i < NSHARD; i++) {
        cJSON *v =
            cJSON_GetObjectItemCaseSensitive(member(root, shard_rows[i].obj), shard_rows[i].key);
        if (cJSON_IsNumber(v)) gr_metric_set(gr_metric_at(mx->shard[i], shard), v->valuedouble);
    }
    for (size_t i = 0; i < NTABLE; i++) {
        cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(root, table_rows[i].obj))
        {
            cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
            cJSON *v = cJSON_GetObjectItemCaseSensitive(t, table_rows[i].key);
            if (cJSON_IsString(name) && cJSON_IsNumber(v))
                gr_metric_set(gr_metric_at(mx->table[i], shard, name->valuestring), v->valuedouble);
        }
    }
    cJSON *reqs = cJSON_GetObjectItemCaseSensitive(root, "requests");
    for (size_t i = 0; i < NOP; i++) {
        cJSON *op;
        cJSON_ArrayForEach(op, reqs)
        {
            cJSON *v = cJSON_GetObjectItemCaseSensitive(op, op_rows[i].key);
            /* Operations never used stay out of the exposition (there are dozens). */
            cJSON *count = cJSON_GetObjectItemCaseSensitive(op, "count");
            if (cJSON_IsNumber(v) && cJSON_IsNumber(count) && count->valuedouble > 0)
                gr_metric_set(gr_metric_at(mx->op[i], shard, op->string), v->valuedouble);
        }
    }
    /* Admitted pushes by staleness (G - the step they were computed at), in the step
     * machine's own bins. */
    static const char *const bins[8] = {"0", "1", "2", "3", "4-7", "8-15", "16-31", "32+"};
    cJSON *hist = cJSON_GetObjectItemCaseSensitive(member(root, "sync"), "staleness_hist");
    if (cJSON_GetArraySize(hist) == 8)
        for (int b = 0; b < 8; b++)
            gr_metric_set(gr_metric_at(mx->staleness, shard, bins[b]),
                          cJSON_GetArrayItem(hist, b)->valuedouble);
    cJSON_Delete(root);
}

int srv_metrics_init(gr_server *s)
{
    gr_metrics *r = s->cfg.metrics;
    if (!r) return GR_OK;
    struct srv_metrics *mx = calloc(1, sizeof *mx);
    if (!mx) return gr_seterr(GR_ENOMEM, "metrics: out of memory");
    s->mx = mx;
    snprintf(mx->label, sizeof mx->label, "%u", s->cfg.shard);
    int rc = GR_OK;
    for (size_t i = 0; i < NSHARD && !rc; i++)
        rc = declare(r, &shard_rows[i], "shard", &mx->shard[i]);
    for (size_t i = 0; i < NTABLE && !rc; i++)
        rc = declare(r, &table_rows[i], table_labels(&table_rows[i]), &mx->table[i]);
    for (size_t i = 0; i < NOP && !rc; i++)
        rc = declare(r, &op_rows[i], "shard,op", &mx->op[i]);
    if (!rc)
        rc = gr_metrics_family(r, GR_METRIC_COUNTER, "granary_sync_pushes_by_staleness_total",
                               "Admitted gradient pushes by staleness in steps (G - their step).",
                               "shard,staleness", NULL, 0, GR_METRIC_MIRRORED, &mx->staleness);
    gr_metric_family *lat = NULL;
    if (!rc)
        rc = gr_metrics_family(r, GR_METRIC_HISTOGRAM, "granary_server_request_duration_seconds",
                               "Time from a request's dispatch to its reply being written, by "
                               "operation (requests that wait by design, step acquires and "
                               "checkpoints, are not included).",
                               "shard,op", NULL, 0, GR_METRIC_LAZY, &lat);
    if (rc) return rc;
    /* Series for the operations that run through run_request (loop or pool), made now so the
     * hot path only follows a pointer. */
    for (unsigned op = 1; op < GR_PROTO_OP_LIMIT; op++) {
        const srv_op_row *row = srv_op_row_of(op);
        if (row && row->handle && gr_proto_op_name(op))
            s->latency[op] = gr_metric_at(lat, mx->label, gr_proto_op_name(op));
    }
    return GR_OK;
}

int srv_metrics_attach(gr_server *s)
{
    if (!s->cfg.metrics || s->metrics_on) return GR_OK;
    int rc = gr_metrics_add_collector(s->cfg.metrics, collect, s);
    s->metrics_on = rc == GR_OK;
    return rc;
}

void srv_metrics_fini(gr_server *s)
{
    if (s->metrics_on) gr_metrics_remove_collector(s->cfg.metrics, collect, s);
    s->metrics_on = false;
    free(s->mx);
    s->mx = NULL;
}
