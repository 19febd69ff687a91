/* The zookeeper backend's session: parsing zk://HOSTS/PATH, connecting, creating the job's
 * folders, and the event thread's session step (suspended, expired -> a new session that
 * registers again and re-arms every watch). The operations on members, the layout and the
 * election are in zk_ops.c. */
#include "coord/zk_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int zk_err(int zrc, const char *what, const char *path)
{
    switch (zrc) {
    case ZCONNECTIONLOSS:
    case ZOPERATIONTIMEOUT:
    case ZINVALIDSTATE:
    case ZSESSIONEXPIRED:
    case ZCLOSING:
        return gr_seterr(GR_EAGAIN, "coord: %s %s: not connected to ZooKeeper (%s)", what, path,
                         zerror(zrc));
    case ZNONODE: return gr_seterr(GR_ENOENT, "coord: %s %s: no such znode", what, path);
    case ZNODEEXISTS: return gr_seterr(GR_EEXIST, "coord: %s %s: znode exists", what, path);
    case ZBADVERSION:
        return gr_seterr(GR_ESTALE, "coord: %s %s: someone else changed it first", what, path);
    case ZNOAUTH: return gr_seterr(GR_EAUTH, "coord: %s %s: not allowed (%s)", what, path,
                                   zerror(zrc));
    default: return gr_seterr(GR_EIO, "coord: %s %s: %s", what, path, zerror(zrc));
    }
}

int zk_child_path(char *out, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return gr_seterr(GR_ETOOBIG, "coord: znode path %s/%s is too long", dir, name);
    return 0;
}

void zk_session_prefix(coord_zk *z, char kind, char *buf, size_t cap)
{
    const clientid_t *id = z->zh ? zoo_client_id(z->zh) : NULL;
    snprintf(buf, cap, "%c-%016" PRIx64 "-", kind, id ? (uint64_t)id->client_id : 0u);
}

int zk_find_child(coord_zk *z, const char *dir, const char *prefix, char *path, size_t cap)
{
    struct String_vector kids = {0, NULL};
    int zrc = zoo_get_children(z->zh, dir, 0, &kids);
    if (zrc != ZOK) return zk_err(zrc, "list", dir);
    int rc = GR_ENOENT;
    for (int32_t i = 0; i < kids.count && rc; i++)
        if (!strncmp(kids.data[i], prefix, strlen(prefix))) {
            rc = zk_child_path(path, cap, dir, kids.data[i]);
        }
    deallocate_String_vector(&kids);
    return rc;
}

/* Runs on a ZooKeeper library thread: only flags and a signal, never a call into ZooKeeper. */
static void zk_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctxp)
{
    (void)zh;
    zk_watch_ctx *ctx = ctxp;
    gr_coord *c = ctx->c;
    coord_zk *z = c->zk;
    if (type == ZOO_SESSION_EVENT) {
        pthread_mutex_lock(&c->mu);
        if (ctx->gen == z->gen) {
            z->state = state;
            c->link_up = state == ZOO_CONNECTED_STATE;
            if (state == ZOO_EXPIRED_SESSION_STATE) z->expired = true;
            c->dirty |= COORD_DIRTY_SESSION;
            pthread_cond_broadcast(&c->cv);
        }
        pthread_mutex_unlock(&c->mu);
        return;
    }
    if (!path) return;
    unsigned flag = 0;
    if (!strncmp(path, z->members_dir, strlen(z->members_dir))) flag = COORD_DIRTY_MEMBERS;
    else if (!strncmp(path, z->election_dir, strlen(z->election_dir))) flag = COORD_DIRTY_ELECTION;
    else if (!strcmp(path, z->layout_path)) flag = COORD_DIRTY_LAYOUT;
    if (flag) coord_mark(c, flag);
}

/* The lease from a server answer to a request sent at sent_ns (caller holds c->mu). Two
 * thirds of the session timeout, as the library's own connection timeout. */
static void extend_lease_locked(gr_coord *c, uint64_t sent_ns)
{
    uint64_t until = sent_ns + (uint64_t)c->opts.session_timeout_ms * 2000000u / 3u;
    if (until > c->lease_until_ns) c->lease_until_ns = until;
}

static void extend_lease(gr_coord *c, uint64_t sent_ns)
{
    pthread_mutex_lock(&c->mu);
    extend_lease_locked(c, sent_ns);
    pthread_mutex_unlock(&c->mu);
}

/* The answer to a lease ping, on the library's completion thread: flags only. */
static void ping_done(int zrc, const struct Stat *st, const void *data)
{
    (void)st;
    const zk_watch_ctx *ctx = data;
    gr_coord *c = ctx->c;
    pthread_mutex_lock(&c->mu);
    if (ctx->gen == c->zk->gen) {
        c->zk->ping_inflight = false;
        if (zrc == ZOK || zrc == ZNONODE) extend_lease_locked(c, c->zk->ping_sent_ns);
    }
    pthread_mutex_unlock(&c->mu);
}

/* Every quarter session: one asynchronous read, whose answer renews the lease. */
static void zk_tick(gr_coord *c)
{
    coord_zk *z = c->zk;
    pthread_mutex_lock(&c->mu);
    bool go = c->link_up && !z->ping_inflight;
    if (go) {
        z->ping_inflight = true;
        z->ping_sent_ns = gr_now_ns();
    }
    pthread_mutex_unlock(&c->mu);
    if (!go) return;
    pthread_rwlock_rdlock(&z->lock);
    int zrc = zoo_aexists(z->zh, z->root, 0, ping_done, z->ctx);
    pthread_rwlock_unlock(&z->lock);
    if (zrc != ZOK) {
        pthread_mutex_lock(&c->mu);
        z->ping_inflight = false;
        pthread_mutex_unlock(&c->mu);
    }
}

static int parse_spec(const char *spec, coord_zk *z)
{
    const char *hosts = spec + 5; /* after "zk://" */
    const char *slash = strchr(hosts, '/');
    if (slash == hosts || !slash)
        return gr_seterr(GR_EINVAL, "coord: '%s' wants zk://HOST:PORT[,HOST:PORT...]/PATH", spec);
    const char *path = slash;
    size_t plen = strlen(path);
    if (plen < 2 || path[plen - 1] == '/' || strstr(path, "//") || plen + 32 >= ZK_PATH_MAX)
        return gr_seterr(GR_EINVAL, "coord: '%s': PATH must be like /granary/job (no trailing "
                         "'/', no '//', under %d bytes)", spec, ZK_PATH_MAX - 32);
    for (const char *h = hosts; h < slash; h++)
        if (*h == ' ' || *h == '@')
            return gr_seterr(GR_EINVAL, "coord: '%s': bad character in the host list", spec);
    z->hosts = strndup(hosts, (size_t)(slash - hosts));
    if (!z->hosts) return gr_seterr(GR_ENOMEM, "coord: out of memory");
    snprintf(z->root, sizeof z->root, "%s", path);
    snprintf(z->members_dir, sizeof z->members_dir, "%s/members", path);
    snprintf(z->election_dir, sizeof z->election_dir, "%s/election", path);
    snprintf(z->layout_path, sizeof z->layout_path, "%s/layout", path);
    return 0;
}

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static void set_zk_log_level(void)
{
    /* The C client logs every failed reconnect attempt at ERROR; our own log reports the
     * session's states in words. Its log comes back with GRANARY_LOG=debug. (Level 0 turns
     * it off.) */
    zoo_set_debug_level(gr_log_get_level() >= GR_LOG_DEBUG ? ZOO_LOG_LEVEL_INFO : (ZooLogLevel)0);
}

/* A new handle (and watcher context); caller holds zk.lock for writing (or is alone). */
static int new_handle(gr_coord *c)
{
    coord_zk *z = c->zk;
    zk_watch_ctx *ctx = malloc(sizeof *ctx);
    if (!ctx) return gr_seterr(GR_ENOMEM, "coord: out of memory");
    pthread_mutex_lock(&c->mu);
    ctx->c = c;
    ctx->gen = ++z->gen;
    z->state = 0;
    z->expired = false;
    z->ping_inflight = false;
    pthread_mutex_unlock(&c->mu);
    zhandle_t *zh = zookeeper_init(z->hosts, zk_watcher, (int)c->opts.session_timeout_ms, NULL,
                                   ctx, 0);
    if (!zh) {
        free(ctx);
        return gr_seterr(GR_EINVAL, "coord: cannot start a ZooKeeper client for '%s': %s",
                         z->hosts, strerror(errno));
    }
    z->zh = zh;
    z->ctx = ctx;
    return 0;
}

static void close_handle(coord_zk *z)
{
    if (z->zh) zookeeper_close(z->zh); /* ends the session: our ephemeral znodes go now */
    z->zh = NULL;
    free(z->ctx);
    z->ctx = NULL;
}

/* PATH, its parents and its two folders, as persistent znodes (existing ones are fine). */
static int ensure_root(coord_zk *z)
{
    char p[ZK_PATH_MAX];
    size_t n = strlen(z->root);
    for (size_t i = 1; i <= n; i++) {
        if (i < n && z->root[i] != '/') continue;
        memcpy(p, z->root, i);
        p[i] = '\0';
        int zrc = zoo_create(z->zh, p, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, 0, NULL, 0);
        if (zrc != ZOK && zrc != ZNODEEXISTS) return zk_err(zrc, "create", p);
    }
    const char *dirs[2] = {z->members_dir, z->election_dir};
    for (int i = 0; i < 2; i++) {
        int zrc = zoo_create(z->zh, dirs[i], NULL, -1, &ZOO_OPEN_ACL_UNSAFE, 0, NULL, 0);
        if (zrc != ZOK && zrc != ZNODEEXISTS) return zk_err(zrc, "create", dirs[i]);
    }
    return 0;
}

static int zk_start(gr_coord *c)
{
    pthread_once(&log_once, set_zk_log_level);
    coord_zk *z = calloc(1, sizeof *z);
    if (!z) return gr_seterr(GR_ENOMEM, "coord: out of memory");
    c->zk = z;
    pthread_rwlock_init(&z->lock, NULL);
    int rc = parse_spec(c->spec, z);
    if (!rc) rc = new_handle(c);
    if (!rc) {
        /* Wait for the first session; the watcher signals c->cv. */
        uint64_t deadline = gr_now_ns() + (uint64_t)c->opts.connect_timeout_ms * 1000000u;
        pthread_mutex_lock(&c->mu);
        while (z->state != ZOO_CONNECTED_STATE && gr_now_ns() < deadline) {
            struct timespec ts = {(time_t)(deadline / 1000000000u), (long)(deadline % 1000000000u)};
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        }
        bool up = z->state == ZOO_CONNECTED_STATE;
        if (up) c->session = GR_COORD_CONNECTED;
        pthread_mutex_unlock(&c->mu);
        if (!up)
            rc = gr_seterr(GR_ETIMEDOUT, "coord: no ZooKeeper server answered at %s within %u ms",
                           z->hosts, c->opts.connect_timeout_ms);
    }
    uint64_t t0 = gr_now_ns();
    if (!rc) rc = ensure_root(z);
    if (!rc) {
        extend_lease(c, t0);
        c->tick_ns = (uint64_t)c->opts.session_timeout_ms * 250000u; /* a quarter session */
    }
    if (rc) {
        close_handle(z);
        pthread_rwlock_destroy(&z->lock);
        free(z->hosts);
        free(z);
        c->zk = NULL;
    }
    return rc;
}

static void zk_stop(gr_coord *c)
{
    coord_zk *z = c->zk;
    if (!z) return;
    close_handle(z);
    pthread_rwlock_destroy(&z->lock);
    free(z->hosts);
    free(z);
    c->zk = NULL;
}

/* Creates our member znode from c->self. reg_mu held by the caller. */
static int zk_register(gr_coord *c)
{
    coord_zk *z = c->zk;
    pthread_mutex_lock(&c->mu);
    gr_coord_member self = c->self;
    pthread_mutex_unlock(&c->mu);
    self.id[0] = '\0';
    char *json = coord_member_encode(&self);
    if (!json) return GR_ENOMEM;
    char prefix[64], path[ZK_PATH_MAX], made[ZK_PATH_MAX];
    pthread_rwlock_rdlock(&z->lock);
    zk_session_prefix(z, 'm', prefix, sizeof prefix);
    if (zk_child_path(path, sizeof path, z->members_dir, prefix)) {
        pthread_rwlock_unlock(&z->lock);
        free(json);
        return GR_ETOOBIG;
    }
    /* A create whose reply was lost with the connection may have happened: a node of this
     * session is ours (one registration per handle), so look before making another. */
    int rc = zk_find_child(z, z->members_dir, prefix, made, sizeof made);
    if (rc == 0) {
        int zrc = zoo_set(z->zh, made, json, (int)strlen(json), -1);
        if (zrc != ZOK) rc = zk_err(zrc, "register at", made);
    } else if (rc == GR_ENOENT) {
        int zrc = zoo_create(z->zh, path, json, (int)strlen(json), &ZOO_OPEN_ACL_UNSAFE,
                             ZOO_EPHEMERAL_SEQUENTIAL, made, sizeof made);
        rc = zrc == ZOK ? 0 : zk_err(zrc, "register at", path);
    }
    pthread_rwlock_unlock(&z->lock);
    free(json);
    if (rc) return rc;
    snprintf(z->member_path, sizeof z->member_path, "%s", made);
    const char *name = strrchr(made, '/') + 1;
    pthread_mutex_lock(&c->mu);
    snprintf(c->self.id, sizeof c->self.id, "%s", name);
    c->registered = true;
    c->self_dirty = false;
    pthread_mutex_unlock(&c->mu);
    GR_LOGI("coord %s: registered as %s (%s %d)", c->spec, name,
            gr_coord_role_name((int)self.role), self.index);
    coord_mark(c, COORD_DIRTY_MEMBERS);
    return 0;
}

static int zk_update(gr_coord *c)
{
    coord_zk *z = c->zk;
    pthread_mutex_lock(&c->mu);
    gr_coord_member self = c->self;
    pthread_mutex_unlock(&c->mu);
    char *json = coord_member_encode(&self);
    if (!json) return GR_ENOMEM;
    pthread_rwlock_rdlock(&z->lock);
    int zrc = zoo_set(z->zh, z->member_path, json, (int)strlen(json), -1);
    /* A candidate carries the record too (gr_coord_leader reads it from there). */
    if (zrc == ZOK && z->cand_path[0]) {
        int crc = zoo_set(z->zh, z->cand_path, json, (int)strlen(json), -1);
        if (crc != ZOK && crc != ZNONODE) zrc = crc;
    }
    pthread_rwlock_unlock(&z->lock);
    free(json);
    return zrc == ZOK ? 0 : zk_err(zrc, "update", z->member_path);
}

static int zk_unregister(gr_coord *c)
{
    coord_zk *z = c->zk;
    if (!z->member_path[0]) return 0;
    pthread_rwlock_rdlock(&z->lock);
    int zrc = zoo_delete(z->zh, z->member_path, -1);
    pthread_rwlock_unlock(&z->lock);
    int rc = zrc == ZOK || zrc == ZNONODE ? 0 : zk_err(zrc, "delete", z->member_path);
    z->member_path[0] = '\0';
    coord_mark(c, COORD_DIRTY_MEMBERS);
    return rc;
}

/* The session expired: our znodes are gone. Tell the user, then open a new session; the
 * CONNECTED event that follows registers again. */
static void on_expired(gr_coord *c)
{
    coord_zk *z = c->zk;
    pthread_mutex_lock(&c->reg_mu);
    pthread_mutex_lock(&c->mu);
    c->registered = false;
    pthread_mutex_unlock(&c->mu);
    z->member_path[0] = '\0';
    z->cand_path[0] = '\0';
    pthread_mutex_unlock(&c->reg_mu);
    GR_LOGW("coord %s: ZooKeeper session expired; our znodes are gone: opening a new session",
            c->spec);
    coord_leader_report(c, false);
    coord_session_report(c, GR_COORD_EXPIRED);
    pthread_rwlock_wrlock(&z->lock);
    close_handle(z);
    int rc = new_handle(c);
    pthread_rwlock_unlock(&z->lock);
    if (rc) {
        GR_LOGE("coord %s: %s", c->spec, gr_errmsg());
        pthread_mutex_lock(&c->mu);
        z->expired = true; /* try again */
        pthread_mutex_unlock(&c->mu);
        coord_retry(c, COORD_DIRTY_SESSION);
    }
}

/* Connected (again): make sure our member znode and candidate exist, then re-arm watches. */
static void on_connected(gr_coord *c)
{
    coord_zk *z = c->zk;
    uint64_t t0 = gr_now_ns();
    pthread_rwlock_rdlock(&z->lock);
    int rc = ensure_root(z);
    pthread_rwlock_unlock(&z->lock);
    if (!rc) extend_lease(c, t0);
    pthread_mutex_lock(&c->reg_mu);
    pthread_mutex_lock(&c->mu);
    bool want = c->want_registered, have = c->registered, elect = c->in_election;
    bool rewrite = c->self_dirty;
    pthread_mutex_unlock(&c->mu);
    if (!rc && want && !have) rc = zk_register(c);
    else if (!rc && have && rewrite && !(rc = zk_update(c))) {
        pthread_mutex_lock(&c->mu);
        c->self_dirty = false;
        pthread_mutex_unlock(&c->mu);
    }
    if (!rc && elect && !z->cand_path[0]) rc = zk_elect(c);
    pthread_mutex_unlock(&c->reg_mu);
    if (rc) {
        GR_LOGW("coord %s: after reconnecting: %s (retrying)", c->spec, gr_errmsg());
        coord_retry(c, COORD_DIRTY_SESSION);
        return;
    }
    coord_mark(c, COORD_DIRTY_MEMBERS | COORD_DIRTY_LAYOUT | COORD_DIRTY_ELECTION);
    coord_session_report(c, GR_COORD_CONNECTED);
}

static void zk_session_step(gr_coord *c)
{
    coord_zk *z = c->zk;
    pthread_mutex_lock(&c->mu);
    bool expired = z->expired;
    z->expired = false;
    int state = z->state;
    pthread_mutex_unlock(&c->mu);
    if (expired) on_expired(c);
    else if (state == ZOO_CONNECTED_STATE) on_connected(c);
    else if (state == ZOO_AUTH_FAILED_STATE)
        GR_LOGE("coord %s: ZooKeeper refused our authentication", c->spec);
    else coord_session_report(c, GR_COORD_SUSPENDED);
}

const coord_backend coord_zk_backend = {
    .start = zk_start,
    .stop = zk_stop,
    .register_self = zk_register,
    .update_self = zk_update,
    .unregister_self = zk_unregister,
    .list_members = zk_list_members,
    .layout_get = zk_layout_get,
    .layout_cas = zk_layout_cas,
    .value_get = zk_value_get,
    .value_cas = zk_value_cas,
    .elect = zk_elect,
    .resign = zk_resign,
    .election_check = zk_election_check,
    .leader = zk_leader,
    .tick = zk_tick,
    .session_step = zk_session_step,
};
