/* A shard under a coordinator (`granary server --coord`): it registers, takes a shard index
 * from the layout by compare-and-set, or waits as a standby and takes over the index of a
 * shard whose member vanished (epoch + 1), restoring that index's rows from the job's newest
 * checkpoint before it serves; it follows the layout's epoch while it holds its index, fences
 * itself while its session is lost, and stops when it finds it was replaced meanwhile.
 *
 * One thread reconciles the shard with what the coordinator says. The coordinator's callbacks
 * only wake it (and fence at once on a lost session), so nothing slow runs on the
 * coordinator's event thread; a tick wakes it too, so a missed event costs at most a tick. */
#include "server/server_int.h"
#include "server/warm.h"
#include "granary/coord.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TICK_MS 200
#define WARM_CHECK_MS 1000 /* a standby looks for a newer checkpoint this often */

struct gr_server_join {
    gr_server *s;
    gr_coord *c;
    bool standby, stop, kick;
    uint32_t shards;
    uint32_t session_ms; /* the coordinator session timeout: the lease's length */
    char address[GR_COORD_ADDR_MAX];
    char *ckpt_dir;
    pthread_t thread;
    bool thread_live;
    bool stopped; /* gr_server_join_stop ran (the caller's thread only) */
    pthread_mutex_t mu; /* guards stop, kick and st */
    pthread_cond_t cv;
    /* The reconciling thread's own state. */
    int32_t index;        /* -1: standby */
    bool restore_pending; /* took over an index whose rows are not restored yet */
    bool warned_shards;
    uint64_t lost_seen_ms;
    gr_server_join_stats st;
    /* The warm standby (warm.c): its state is the thread's, its figures (warm_pub, and at
     * the takeover warm_bytes_at_claim and warm_adopted) are under mu for STATS. */
    srv_warm warm;
    bool no_warm;
    uint64_t warm_max_bytes, warm_checked_ms;
    uint32_t layout_shards;
    bool warm_warned;
    srv_warm_info warm_pub;
    uint64_t warm_bytes_at_claim;
    uint32_t warm_adopted;
};

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void kick(gr_server_join *j)
{
    pthread_mutex_lock(&j->mu);
    j->kick = true;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void on_members(void *arg, const gr_coord_members_event *ev)
{
    (void)ev;
    kick(arg);
}

static void on_layout(void *arg, const gr_coord_layout *l)
{
    (void)l;
    kick(arg);
}

/* A lost session fences at once: a replacement may be claiming our index while we wait for
 * the reconciling thread. */
static void on_session(void *arg, gr_coord_session state)
{
    gr_server_join *j = arg;
    if (state != GR_COORD_CONNECTED) {
        gr_server_set_fence(j->s, j->index >= 0 ? gr_server_session_fence(j->s)
                                                : GR_SERVER_FENCE_ALL);
        GR_LOGW("shard %u: coordinator session %s: fenced until it has re-registered",
                gr_server_shard(j->s), gr_coord_session_name(state));
    }
    kick(j);
}

static bool member_alive(const gr_coord_member *m, size_t n, const char *id)
{
    if (!id[0]) return false;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(m[i].id, id)) return true;
    return false;
}

static void set_record(gr_server_join *j, gr_coord_role role, int32_t index)
{
    gr_coord_member self;
    gr_coord_self(j->c, &self);
    self.role = role;
    self.index = index;
    snprintf(self.address, sizeof self.address, "%s", j->address);
    gr_coord_update(j->c, &self); /* GR_EAGAIN: kept, written on re-registration */
}

/* Restores the rows of the index this shard took over; false when it must be tried again. */
static bool restore(gr_server_join *j)
{
    if (!j->ckpt_dir) return true;
    gr_server_ckpt_loaded ld;
    uint64_t t0 = wall_ms();
    uint32_t adopted0 = srv_ckpt_warm_adopted(j->s);
    int rc = gr_server_ckpt_load(j->s, j->ckpt_dir, NULL, &ld);
    if (rc == GR_ENOENT) {
        GR_LOGW("shard %u: no checkpoint under %s to restore from (%s): serving empty tables",
                gr_server_shard(j->s), j->ckpt_dir, gr_errmsg());
        memset(&ld, 0, sizeof ld);
    } else if (rc) {
        GR_LOGE("shard %u: cannot restore from %s: %s (fenced; trying again)",
                gr_server_shard(j->s), j->ckpt_dir, gr_errmsg());
        return false;
    }
    uint64_t restore_ms = wall_ms() - t0;
    /* What the warm set did not give the restore is of no use now. */
    uint32_t adopted = srv_ckpt_warm_adopted(j->s) - adopted0;
    srv_warm_release(j->s, &j->warm);
    pthread_mutex_lock(&j->mu);
    j->warm_adopted = adopted;
    j->warm_pub = j->warm.info;
    j->st.rows_restored = ld.rows_loaded;
    j->st.restore_ms = restore_ms;
    snprintf(j->st.restored_from, sizeof j->st.restored_from, "%s", ld.name);
    pthread_mutex_unlock(&j->mu);
    return true;
}

/* Publishes this shard at index i of l (a copy the caller owns) by compare-and-set, epoch + 1.
 * The server is fenced and given the index first, so a worker that reads the new layout finds
 * a shard that refuses it until it is ready. */
static void claim(gr_server_join *j, gr_coord_layout *l, uint32_t i, const char *self_id)
{
    bool lost = l->shards[i].member[0] != '\0';
    uint64_t epoch = l->epoch + 1;
    if (epoch > GR_PROTO_EPOCH_MAX) {
        GR_LOGE("layout epoch %llu is past the protocol's limit", (unsigned long long)epoch);
        return;
    }
    gr_server_set_fence(j->s, GR_SERVER_FENCE_ALL);
    if (gr_server_assign(j->s, i, l->n_shards)) return;
    snprintf(l->shards[i].address, sizeof l->shards[i].address, "%s", j->address);
    snprintf(l->shards[i].member, sizeof l->shards[i].member, "%s", self_id);
    l->epoch = epoch;
    int rc = gr_coord_layout_cas(j->c, l);
    if (rc) { /* another standby was first, or the layout moved: look again */
        if (rc != GR_ESTALE) GR_LOGW("claiming shard %u: %s", i, gr_errmsg());
        return;
    }
    uint64_t claimed = wall_ms();
    j->index = (int32_t)i;
    pthread_mutex_lock(&j->mu);
    j->warm_bytes_at_claim = j->warm.info.bytes;
    pthread_mutex_unlock(&j->mu);
    gr_server_set_epoch(j->s, (uint32_t)epoch);
    set_record(j, GR_COORD_SHARD, (int32_t)i);
    pthread_mutex_lock(&j->mu);
    j->st.index = (int32_t)i;
    j->st.epoch = epoch;
    if (lost) {
        j->st.takeovers++;
        j->st.lost_seen_ms = j->lost_seen_ms ? j->lost_seen_ms : claimed;
        j->st.claimed_ms = claimed;
    }
    pthread_mutex_unlock(&j->mu);
    j->restore_pending = lost;
    GR_LOGI("shard %u of %u: %s at layout epoch %llu as %s", i, l->n_shards,
            lost ? "took over a lost shard's index" : "took a free index",
            (unsigned long long)epoch, j->address);
}

/* Our index's entry names someone else, or a member id of ours from before a lost session. */
static void check_held(gr_server_join *j, gr_coord_layout *l, const gr_coord_member *m, size_t n,
                       const char *self_id)
{
    gr_coord_shard *e = &l->shards[j->index];
    if (!strcmp(e->member, self_id)) { /* ours: follow the epoch */
        if (j->restore_pending) {
            if (!restore(j)) return;
            j->restore_pending = false;
            pthread_mutex_lock(&j->mu);
            j->st.serving_ms = wall_ms();
            pthread_mutex_unlock(&j->mu);
            GR_LOGI("shard %u: restored %llu rows from %s/%s in %llu ms; serving",
                    (unsigned)j->index, (unsigned long long)j->st.rows_restored, j->ckpt_dir,
                    j->st.restored_from, (unsigned long long)j->st.restore_ms);
        }
        if (gr_server_epoch(j->s) != (uint32_t)l->epoch) {
            gr_server_set_epoch(j->s, (uint32_t)l->epoch);
            pthread_mutex_lock(&j->mu);
            j->st.epoch = l->epoch;
            pthread_mutex_unlock(&j->mu);
        }
        if (gr_server_get_fence(j->s) != GR_SERVER_OPEN) {
            gr_server_set_fence(j->s, GR_SERVER_OPEN);
            GR_LOGI("shard %u: serving at layout epoch %llu", (unsigned)j->index,
                    (unsigned long long)l->epoch);
        }
        return;
    }
    if (member_alive(m, n, e->member)) { /* replaced while we were away: never serve again */
        gr_server_set_fence(j->s, GR_SERVER_FENCE_ALL);
        GR_LOGE("shard %u: replaced by %s (%s) at layout epoch %llu while this process had lost "
                "its coordinator session; stopping", (unsigned)j->index, e->member, e->address,
                (unsigned long long)l->epoch);
        pthread_mutex_lock(&j->mu);
        j->st.replaced = true;
        j->stop = true;
        pthread_mutex_unlock(&j->mu);
        gr_server_request_stop(j->s);
        return;
    }
    /* Our old registration expired and nobody took the index: take it back with our new id
     * (epoch + 1, so workers re-read the layout); our rows are still here, newer than any
     * checkpoint. */
    uint64_t epoch = l->epoch + 1;
    snprintf(e->address, sizeof e->address, "%s", j->address);
    snprintf(e->member, sizeof e->member, "%s", self_id);
    l->epoch = epoch;
    if (gr_coord_layout_cas(j->c, l)) return;
    gr_server_set_epoch(j->s, (uint32_t)epoch);
    set_record(j, GR_COORD_SHARD, j->index);
    GR_LOGI("shard %u: re-registered and took its index back at layout epoch %llu",
            (unsigned)j->index, (unsigned long long)epoch);
}

static int read_or_create_layout(gr_server_join *j, gr_coord_layout *l)
{
    int rc = gr_coord_layout_get(j->c, l);
    if (rc != GR_ENOENT || j->shards == 0) return rc;
    if ((rc = gr_coord_layout_init(l, j->shards))) return rc;
    rc = gr_coord_layout_cas(j->c, l); /* GR_ESTALE: another shard made it first */
    if (rc) gr_coord_layout_fini(l);
    if (!rc) GR_LOGI("created the job's layout: %u vacant shards", j->shards);
    return rc ? rc : GR_OK;
}

static void reconcile(gr_server_join *j)
{
    if (gr_coord_session_state(j->c) != GR_COORD_CONNECTED || !gr_coord_registered(j->c)) {
        gr_server_set_fence(j->s, j->index >= 0 ? gr_server_session_fence(j->s)
                                                : GR_SERVER_FENCE_ALL);
        return;
    }
    gr_coord_layout l;
    memset(&l, 0, sizeof l);
    uint64_t asked = gr_now_ns();
    if (read_or_create_layout(j, &l)) return;
    /* The coordinator answered a request sent at `asked`: it cannot expire our session before
     * asked + the session timeout. Keep a margin for the clocks' rates and the tick. */
    gr_server_set_lease(j->s, asked + (uint64_t)j->session_ms * 1000000u * 3 / 4);
    gr_coord_member *m = NULL;
    size_t n = 0;
    if (gr_coord_members(j->c, &m, &n)) {
        gr_coord_layout_fini(&l);
        return;
    }
    gr_coord_member self;
    gr_coord_self(j->c, &self);
    j->layout_shards = l.n_shards;
    if (j->shards && l.n_shards != j->shards && !j->warned_shards) {
        GR_LOGW("--shards %u, but the job's layout has %u shards: following the layout",
                j->shards, l.n_shards);
        j->warned_shards = true;
    }
    if (j->index >= 0 && (uint32_t)j->index < l.n_shards) {
        check_held(j, &l, m, n, self.id);
    } else {
        int32_t pick = -1;
        for (uint32_t i = 0; i < l.n_shards && pick < 0; i++) {
            const gr_coord_shard *e = &l.shards[i];
            bool lost = e->member[0] && !member_alive(m, n, e->member);
            bool vacant = !e->member[0];
            if (lost && !j->lost_seen_ms) j->lost_seen_ms = wall_ms();
            if (lost || (vacant && !j->standby)) pick = (int32_t)i;
        }
        if (pick >= 0) claim(j, &l, (uint32_t)pick, self.id);
        if (j->index >= 0) {
            j->lost_seen_ms = 0;
            check_held(j, &l, m, n, self.id); /* restores, then opens */
        }
    }
    free(m);
    gr_coord_layout_fini(&l);
}

/* Whether something woke the thread (a member or layout change, the session): a preparation
 * in progress gives way at once, so that a takeover never waits for it. */
static bool kicked(void *arg)
{
    gr_server_join *j = arg;
    pthread_mutex_lock(&j->mu);
    bool k = j->kick || j->stop;
    pthread_mutex_unlock(&j->mu);
    return k;
}

/* A standby keeps its tables ready for the newest checkpoint (warm.c). It runs between
 * reconciliations on this thread; a change that may call for a takeover (kick) cuts a
 * preparation short within one 32 MiB piece, the takeover adopts what was prepared, and an
 * unneeded cut is made good at the next refresh. */
static void warm_up(gr_server_join *j)
{
    if (j->no_warm || !j->standby || j->index >= 0 || !j->ckpt_dir || !j->layout_shards)
        return;
    uint64_t now = wall_ms();
    if (now - j->warm_checked_ms < WARM_CHECK_MS) return;
    j->warm_checked_ms = now;
    uint32_t builds = j->warm.info.builds;
    int rc = srv_warm_refresh(j->s, &j->warm, j->ckpt_dir, j->layout_shards, j->warm_max_bytes,
                              kicked, j);
    if (rc && !j->warm_warned)
        GR_LOGW("standby: cannot prepare for %s/%s (the restore will do without): %s",
                j->ckpt_dir, j->warm.info.ckpt, gr_errmsg());
    j->warm_warned = rc != 0;
    if (!rc && j->warm.info.builds != builds)
        GR_LOGI("standby: ready for %s/%s: %u tables, %llu rows, %llu MB prefaulted in %llu ms",
                j->ckpt_dir, j->warm.info.ckpt, j->warm.info.tables,
                (unsigned long long)j->warm.info.rows,
                (unsigned long long)(j->warm.info.bytes >> 20),
                (unsigned long long)j->warm.info.ms);
    pthread_mutex_lock(&j->mu);
    j->warm_pub = j->warm.info;
    pthread_mutex_unlock(&j->mu);
}

static void *join_main(void *arg)
{
    gr_server_join *j = arg;
    pthread_mutex_lock(&j->mu);
    while (!j->stop) {
        j->kick = false;
        pthread_mutex_unlock(&j->mu);
        reconcile(j);
        warm_up(j);
        pthread_mutex_lock(&j->mu);
        if (j->stop || j->kick) continue;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

int gr_server_join_start(gr_server *s, gr_coord *c, const gr_server_join_opts *o,
                         gr_server_join **out)
{
    *out = NULL;
    if (!s || !c || !o || !o->address || !*o->address)
        return gr_seterr(GR_EINVAL, "joining a job needs a server, a coordinator and an address");
    if (strlen(o->address) >= GR_COORD_ADDR_MAX)
        return gr_seterr(GR_EINVAL, "address '%s' is too long", o->address);
    gr_server_join *j = calloc(1, sizeof *j);
    if (!j) return gr_seterr(GR_ENOMEM, "out of memory");
    j->s = s;
    j->c = c;
    j->standby = o->standby;
    j->shards = o->shards;
    j->session_ms = o->session_timeout_ms ? o->session_timeout_ms : 4000;
    j->index = -1;
    j->st.index = -1;
    j->no_warm = o->no_warm;
    j->warm_max_bytes = o->warm_max_bytes;
    snprintf(j->address, sizeof j->address, "%s", o->address);
    if (o->ckpt_dir && !(j->ckpt_dir = strdup(o->ckpt_dir))) {
        free(j);
        return gr_seterr(GR_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    /* Nothing is served until the layout says which index is ours. */
    gr_server_set_fence(s, GR_SERVER_FENCE_ALL);
    gr_coord_member self;
    gr_coord_member_init(&self, GR_COORD_STANDBY);
    snprintf(self.address, sizeof self.address, "%s", j->address);
    int rc = gr_coord_register(c, &self, NULL);
    if (!rc && pthread_create(&j->thread, NULL, join_main, j))
        rc = gr_seterr(GR_ENOMEM, "cannot start the coordination thread");
    if (rc) { /* no callback was installed: nothing can reach j */
        pthread_mutex_destroy(&j->mu);
        pthread_cond_destroy(&j->cv);
        free(j->ckpt_dir);
        free(j);
        return rc;
    }
    j->thread_live = true;
    atomic_store(&s->join, j);
    /* The callbacks only wake the thread sooner: it reconciles on its tick anyway, so a watch
     * that cannot be installed costs latency, not correctness. */
    if (gr_coord_watch_session(c, on_session, j) || gr_coord_watch_members(c, on_members, j) ||
        gr_coord_watch_layout(c, on_layout, j))
        GR_LOGW("coordinator callbacks: %s (reconciling every %d ms instead)", gr_errmsg(),
                TICK_MS);
    *out = j;
    return GR_OK;
}

void gr_server_join_stop(gr_server_join *j)
{
    if (!j || j->stopped) return; /* once: destroy comes after the coordinator is closed */
    j->stopped = true;
    pthread_mutex_lock(&j->mu);
    j->stop = true;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (j->thread_live) pthread_join(j->thread, NULL);
    j->thread_live = false;
    srv_warm_release(j->s, &j->warm); /* the server outlives the join's stop */
    gr_coord_watch_session(j->c, NULL, NULL);
    gr_coord_watch_members(j->c, NULL, NULL);
    gr_coord_watch_layout(j->c, NULL, NULL);
    atomic_store(&j->s->join, NULL); /* a STATS already past this point finishes first: the
                                        caller stops the server before it stops the join */
}

void gr_server_join_destroy(gr_server_join *j)
{
    if (!j) return;
    gr_server_join_stop(j);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j->ckpt_dir);
    free(j);
}

void gr_server_join_get(gr_server_join *j, gr_server_join_stats *out)
{
    pthread_mutex_lock(&j->mu);
    *out = j->st;
    pthread_mutex_unlock(&j->mu);
}

bool gr_server_join_replaced(gr_server_join *j)
{
    pthread_mutex_lock(&j->mu);
    bool r = j->st.replaced;
    pthread_mutex_unlock(&j->mu);
    return r;
}

void srv_join_stats_json(gr_server_join *j, void *objp)
{
    cJSON *o = objp;
    if (!o) return;
    gr_server_join_stats st;
    gr_server_join_get(j, &st);
    cJSON_AddNumberToObject(o, "index", st.index);
    cJSON_AddStringToObject(o, "address", j->address);
    cJSON_AddBoolToObject(o, "standby", j->standby);
    cJSON_AddNumberToObject(o, "layout_epoch", (double)st.epoch);
    cJSON_AddNumberToObject(o, "takeovers", st.takeovers);
    cJSON_AddNumberToObject(o, "lost_seen_ms", (double)st.lost_seen_ms);
    cJSON_AddNumberToObject(o, "claimed_ms", (double)st.claimed_ms);
    cJSON_AddNumberToObject(o, "serving_ms", (double)st.serving_ms);
    cJSON_AddNumberToObject(o, "restore_ms", (double)st.restore_ms);
    cJSON_AddNumberToObject(o, "rows_restored", (double)st.rows_restored);
    cJSON_AddStringToObject(o, "restored_from", st.restored_from);
    pthread_mutex_lock(&j->mu);
    srv_warm_info w = j->warm_pub;
    uint64_t at_claim = j->warm_bytes_at_claim;
    uint32_t adopted = j->warm_adopted;
    pthread_mutex_unlock(&j->mu);
    cJSON *wo = cJSON_AddObjectToObject(o, "warm");
    if (!wo) return;
    cJSON_AddBoolToObject(wo, "enabled", j->standby && j->ckpt_dir && !j->no_warm);
    cJSON_AddStringToObject(wo, "checkpoint", w.ckpt);
    cJSON_AddNumberToObject(wo, "tables", w.tables);
    cJSON_AddNumberToObject(wo, "rows", (double)w.rows);
    cJSON_AddNumberToObject(wo, "bytes", (double)w.bytes);
    cJSON_AddBoolToObject(wo, "capped", w.capped);
    cJSON_AddNumberToObject(wo, "prepare_ms", (double)w.ms);
    cJSON_AddNumberToObject(wo, "prepare_cpu_ms", (double)w.cpu_ms);
    cJSON_AddNumberToObject(wo, "builds", w.builds);
    cJSON_AddNumberToObject(wo, "bytes_at_claim", (double)at_claim);
    cJSON_AddNumberToObject(wo, "adopted", adopted);
}
