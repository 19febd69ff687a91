/* `granary train --coord`: the training process as a member of a coordinated job (see
 * train_coord.h). The trainer itself knows nothing of the coordinator: this file hands it a
 * client over the layout's addresses, and train.c runs it again from the job's checkpoint
 * when a shard was lost (docs/operations.md, "Recovery"). */
#include "cli/train_coord.h"
#include "granary/coord.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tc_job {
    gr_coord *c;
    char servers[GR_COORD_ADDR_MAX * 16 + 64];
    char *servers_big; /* more than 16 shards */
    uint64_t epoch;
    uint32_t stale_patience_ms; /* 0: 50 */
};

#define POLL_MS 100

static int read_layout(tc_job *j, gr_coord_layout *l)
{
    memset(l, 0, sizeof *l);
    int rc = gr_coord_layout_get(j->c, l);
    if (rc) return rc;
    for (uint32_t i = 0; i < l->n_shards; i++)
        if (!l->shards[i].address[0]) {
            gr_coord_layout_fini(l);
            return gr_seterr(GR_EAGAIN, "shard %u of the layout has no address yet", i);
        }
    return GR_OK;
}

static int keep_servers(tc_job *j, const gr_coord_layout *l)
{
    size_t cap = (size_t)l->n_shards * GR_COORD_ADDR_MAX + 1;
    free(j->servers_big);
    j->servers_big = NULL;
    char *buf = j->servers;
    if (cap > sizeof j->servers) {
        if (!(j->servers_big = malloc(cap))) return gr_seterr(GR_ENOMEM, "out of memory");
        buf = j->servers_big;
    } else {
        cap = sizeof j->servers;
    }
    j->epoch = l->epoch;
    return gr_coord_layout_servers(l, buf, cap);
}

const char *tc_servers(const tc_job *j) { return j->servers_big ? j->servers_big : j->servers; }
uint64_t tc_epoch(const tc_job *j) { return j->epoch; }

/* Every shard of l answers stats with fence "open" at l's epoch. */
static bool shards_serve(const gr_coord_layout *l, const char *servers)
{
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = servers;
    cc.connect_timeout_ms = 1000;
    cc.request_timeout_ms = 2000;
    gr_client *c = NULL;
    if (gr_client_create(&cc, &c)) return false;
    bool ok = true;
    for (uint32_t s = 0; ok && s < l->n_shards; s++) {
        char *txt = NULL;
        ok = gr_client_stats(c, s, &txt) == 0;
        cJSON *root = ok ? cJSON_Parse(txt) : NULL;
        free(txt);
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "fence");
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "epoch");
        ok = ok && cJSON_IsString(f) && !strcmp(f->valuestring, "open") && cJSON_IsNumber(e) &&
             (uint64_t)e->valuedouble == l->epoch;
        cJSON_Delete(root);
    }
    gr_client_destroy(c);
    return ok;
}

int tc_wait_healed(tc_job *j, uint64_t epoch, uint32_t timeout_ms)
{
    uint64_t deadline = gr_now_ns() + (uint64_t)timeout_ms * 1000000u;
    char why[300] = "no layout yet";
    for (;;) {
        gr_coord_layout l;
        int rc = read_layout(j, &l);
        if (!rc) {
            if (l.epoch >= epoch && !keep_servers(j, &l) && shards_serve(&l, tc_servers(j))) {
                gr_coord_layout_fini(&l);
                return GR_OK;
            }
            snprintf(why, sizeof why, "layout epoch %llu, %u shards at %.200s",
                     (unsigned long long)l.epoch, l.n_shards, tc_servers(j));
            gr_coord_layout_fini(&l);
        } else {
            snprintf(why, sizeof why, "%s", gr_errmsg());
        }
        if (gr_now_ns() >= deadline)
            return gr_seterr(GR_ETIMEDOUT, "the job's shards did not all serve a layout of "
                             "epoch %llu or later within %u ms (last seen: %s)",
                             (unsigned long long)epoch, timeout_ms, why);
        gr_sleep_ms(POLL_MS);
    }
}

int tc_open(const char *spec, uint32_t timeout_ms, tc_job **out, bool *took_over)
{
    *out = NULL;
    *took_over = false;
    tc_job *j = calloc(1, sizeof *j);
    if (!j) return gr_seterr(GR_ENOMEM, "out of memory");
    int rc = gr_coord_open(spec, NULL, &j->c);
    gr_coord_member self;
    gr_coord_member_init(&self, GR_COORD_WORKER);
    self.index = 0;
    if (!rc) rc = gr_coord_register(j->c, &self, NULL);
    gr_coord_member lead;
    if (!rc) *took_over = gr_coord_leader(j->c, &lead) == 0; /* someone led before us */
    if (!rc) rc = gr_coord_elect(j->c, NULL, NULL);
    if (!rc && *took_over)
        fprintf(stderr, "train: %s leads the job; waiting to take over as its chief\n",
                lead.id);
    uint64_t deadline = gr_now_ns() + (uint64_t)timeout_ms * 1000000u;
    while (!rc && !gr_coord_is_leader(j->c)) {
        if (gr_now_ns() >= deadline)
            rc = gr_seterr(GR_ETIMEDOUT, "another process still leads the job after %u ms",
                           timeout_ms);
        else
            gr_sleep_ms(POLL_MS);
    }
    if (!rc) rc = tc_wait_healed(j, 0, timeout_ms);
    if (rc) {
        tc_close(j);
        return rc;
    }
    *out = j;
    return GR_OK;
}

int tc_open_member(const char *spec, uint32_t timeout_ms, tc_job **out)
{
    *out = NULL;
    tc_job *j = calloc(1, sizeof *j);
    if (!j) return gr_seterr(GR_ENOMEM, "out of memory");
    int rc = gr_coord_open(spec, NULL, &j->c);
    gr_coord_member self;
    gr_coord_member_init(&self, GR_COORD_WORKER);
    if (!rc) rc = gr_coord_register(j->c, &self, NULL);
    if (!rc) rc = gr_coord_elect(j->c, NULL, NULL);
    if (!rc) rc = tc_wait_healed(j, 0, timeout_ms);
    if (rc) {
        tc_close(j);
        return rc;
    }
    *out = j;
    return GR_OK;
}

struct gr_coord *tc_coord(tc_job *j) { return j->c; }
void tc_set_stale_patience(tc_job *j, uint32_t ms) { j->stale_patience_ms = ms; }

bool tc_recoverable(int rc)
{
    return rc == GR_ECONN || rc == GR_ETIMEDOUT || rc == GR_ESTALE || rc == GR_ESHUTDOWN;
}

/* The stale hook: same addresses, so a shard is behind or restoring: take the newest epoch and
 * retry shortly; a moved shard fails the operation, so the run recovers with a new client. */
static int on_stale(void *ctx, gr_client *c, uint32_t shard, uint32_t epoch, const char *msg)
{
    (void)shard;
    (void)epoch;
    (void)msg;
    tc_job *j = ctx;
    gr_coord_layout l;
    memset(&l, 0, sizeof l);
    if (gr_coord_layout_get(j->c, &l)) return GR_EAGAIN;
    int rc = l.n_shards == gr_client_shards(c) ? GR_OK : GR_ESTALE;
    for (uint32_t i = 0; !rc && i < l.n_shards; i++)
        if (strcmp(l.shards[i].address, gr_client_shard_addr(c, i))) rc = GR_ESTALE;
    if (!rc) gr_client_set_epoch(c, (uint32_t)l.epoch);
    gr_coord_layout_fini(&l);
    if (!rc) gr_sleep_ms(j->stale_patience_ms ? j->stale_patience_ms : 50);
    return rc;
}

void tc_attach(tc_job *j, gr_client *client)
{
    gr_client_set_epoch(client, (uint32_t)j->epoch);
    gr_client_set_stale_hook(client, on_stale, j);
}

void tc_close(tc_job *j)
{
    if (!j) return;
    gr_coord_close(j->c);
    free(j->servers_big);
    free(j);
}
