/* The coordinator handle: open/close, and the public calls, which check their arguments and
 * the handle's registration state here and leave the I/O to the backend (static.c, zk.c). */
#include "coord/coord_int.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void gr_coord_options_default(gr_coord_options *o)
{
    memset(o, 0, sizeof *o);
    o->session_timeout_ms = 4000;
    o->connect_timeout_ms = 10000;
}

int gr_coord_open(const char *spec, const gr_coord_options *opts, gr_coord **out)
{
    *out = NULL;
    gr_coord *c = calloc(1, sizeof *c);
    if (!c) return gr_seterr(GR_ENOMEM, "coord: out of memory");
    if (opts) c->opts = *opts;
    else gr_coord_options_default(&c->opts);
    if (!c->opts.session_timeout_ms) c->opts.session_timeout_ms = 4000;
    if (!c->opts.connect_timeout_ms) c->opts.connect_timeout_ms = 10000;
    c->spec = strdup(spec ? spec : "");
    pthread_mutex_init(&c->reg_mu, NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    gr_coord_member_init(&c->self, GR_COORD_OBSERVER);
    c->last_layout_version = -2;
    if (!c->spec) {
        gr_coord_close(c);
        return gr_seterr(GR_ENOMEM, "coord: out of memory");
    }
    bool zk = !strncmp(c->spec, "zk://", 5);
    c->kind = zk ? GR_COORD_ZOOKEEPER : GR_COORD_STATIC;
    c->be = zk ? &coord_zk_backend : &coord_static_backend;
    c->session = zk ? GR_COORD_SUSPENDED : GR_COORD_CONNECTED;
    c->link_up = !zk; /* zookeeper: its watcher says when */
    c->lease_until_ns = zk ? 0 : UINT64_MAX;
    int rc = c->be->start(c);
    if (rc) {
        c->be = NULL; /* start cleaned up after itself */
        gr_coord_close(c);
        return rc;
    }
    if ((rc = coord_events_start(c))) {
        gr_coord_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void gr_coord_close(gr_coord *c)
{
    if (!c) return;
    coord_events_stop(c);
    if (c->be) c->be->stop(c);
    free(c->last_members);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->reg_mu);
    free(c->spec);
    free(c);
}

gr_coord_backend gr_coord_backend_of(const gr_coord *c) { return c->kind; }
const char *gr_coord_spec(const gr_coord *c) { return c->spec; }

/* ---- membership ---- */

static void fill_identity(gr_coord_member *m)
{
    if (!m->host[0] && gethostname(m->host, sizeof m->host) != 0) m->host[0] = '\0';
    m->host[sizeof m->host - 1] = '\0';
    if (!m->pid) m->pid = (int64_t)getpid();
}

static int check_record(const gr_coord_member *m)
{
    if ((int)m->role < GR_COORD_SHARD || (int)m->role > GR_COORD_OBSERVER)
        return gr_seterr(GR_EINVAL, "coord: member role %d is not one of shard, standby, worker, "
                         "observer", (int)m->role);
    if (m->index < -1 || m->index >= (int32_t)GR_SLOTS)
        return gr_seterr(GR_EINVAL, "coord: member index %d (want -1..%u)", m->index,
                         GR_SLOTS - 1);
    if (!memchr(m->address, 0, sizeof m->address) || !memchr(m->host, 0, sizeof m->host))
        return gr_seterr(GR_EINVAL, "coord: member address or host is not terminated");
    return 0;
}

int gr_coord_register(gr_coord *c, const gr_coord_member *self, char *id_out)
{
    int rc = check_record(self);
    if (rc) return rc;
    pthread_mutex_lock(&c->reg_mu);
    pthread_mutex_lock(&c->mu);
    if (c->want_registered) {
        pthread_mutex_unlock(&c->mu);
        pthread_mutex_unlock(&c->reg_mu);
        return gr_seterr(GR_EEXIST, "coord: already registered as %s", c->self.id);
    }
    c->self = *self;
    c->self.id[0] = '\0';
    fill_identity(&c->self);
    c->want_registered = true;
    pthread_mutex_unlock(&c->mu);
    rc = c->be->register_self(c);
    pthread_mutex_lock(&c->mu);
    if (rc) c->want_registered = false;
    else if (id_out) memcpy(id_out, c->self.id, GR_COORD_ID_MAX);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&c->reg_mu);
    return rc;
}

int gr_coord_update(gr_coord *c, const gr_coord_member *self)
{
    int rc = check_record(self);
    if (rc) return rc;
    pthread_mutex_lock(&c->reg_mu);
    pthread_mutex_lock(&c->mu);
    if (!c->want_registered) {
        pthread_mutex_unlock(&c->mu);
        pthread_mutex_unlock(&c->reg_mu);
        return gr_seterr(GR_ENOENT, "coord: not registered");
    }
    char id[GR_COORD_ID_MAX];
    memcpy(id, c->self.id, sizeof id);
    c->self = *self;
    memcpy(c->self.id, id, sizeof id);
    fill_identity(&c->self);
    bool registered = c->registered;
    pthread_mutex_unlock(&c->mu);
    rc = registered ? c->be->update_self(c)
                    : gr_seterr(GR_EAGAIN, "coord: not registered right now; the record is "
                                "written when the session is back");
    pthread_mutex_lock(&c->mu);
    /* Not registered: registering again writes the new record. Registered but the write
     * was lost with the connection: the reconnect rewrites it. */
    c->self_dirty = rc == GR_EAGAIN && registered;
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&c->reg_mu);
    return rc;
}

int gr_coord_resign(gr_coord *c)
{
    pthread_mutex_lock(&c->reg_mu);
    pthread_mutex_lock(&c->mu);
    bool in = c->in_election;
    c->in_election = false;
    pthread_mutex_unlock(&c->mu);
    int rc = in ? c->be->resign(c) : 0;
    pthread_mutex_unlock(&c->reg_mu);
    coord_leader_report(c, false);
    return rc;
}

int gr_coord_unregister(gr_coord *c)
{
    gr_coord_resign(c);
    pthread_mutex_lock(&c->reg_mu);
    pthread_mutex_lock(&c->mu);
    bool want = c->want_registered;
    c->want_registered = false;
    pthread_mutex_unlock(&c->mu);
    int rc = want ? c->be->unregister_self(c) : 0;
    pthread_mutex_lock(&c->mu);
    c->registered = false;
    c->self.id[0] = '\0';
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&c->reg_mu);
    /* Only now does a listing leave us out (the static backend lists from these fields). */
    coord_mark(c, COORD_DIRTY_MEMBERS);
    return rc;
}

void gr_coord_self(gr_coord *c, gr_coord_member *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->self;
    if (!c->registered) out->id[0] = '\0';
    pthread_mutex_unlock(&c->mu);
}

bool gr_coord_registered(gr_coord *c)
{
    pthread_mutex_lock(&c->mu);
    bool r = c->registered && c->session == GR_COORD_CONNECTED && c->link_up &&
             gr_now_ns() < c->lease_until_ns;
    pthread_mutex_unlock(&c->mu);
    return r;
}

int gr_coord_members(gr_coord *c, gr_coord_member **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    return c->be->list_members(c, false, out, n);
}

int gr_coord_watch_members(gr_coord *c, gr_coord_members_fn fn, void *arg)
{
    pthread_mutex_lock(&c->mu);
    c->members_fn = fn;
    c->members_arg = arg;
    pthread_mutex_unlock(&c->mu);
    /* The event thread starts over: everyone shows as joined to a new callback. */
    if (fn) coord_mark(c, COORD_DIRTY_MEMBERS | COORD_DIRTY_MEMBERS_RESET);
    return 0;
}

/* ---- barrier ---- */

static int barrier_count(gr_coord *c, uint32_t shards, uint32_t *have_shards,
                         uint32_t *have_workers)
{
    *have_shards = *have_workers = 0;
    if (c->kind == GR_COORD_STATIC) {
        gr_coord_layout l;
        int rc = c->be->layout_get(c, false, &l);
        if (rc == GR_ENOENT) return 0;
        if (rc) return rc;
        *have_shards = l.n_shards < shards ? l.n_shards : shards;
        gr_coord_layout_fini(&l);
        return 0;
    }
    gr_coord_member *m;
    size_t n;
    int rc = c->be->list_members(c, false, &m, &n);
    if (rc) return rc;
    uint8_t *seen = shards ? calloc(shards, 1) : NULL;
    if (shards && !seen) {
        free(m);
        return gr_seterr(GR_ENOMEM, "coord: out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == GR_COORD_WORKER) (*have_workers)++;
        if (m[i].role == GR_COORD_SHARD && m[i].index >= 0 && (uint32_t)m[i].index < shards &&
            !seen[m[i].index]) {
            seen[m[i].index] = 1;
            (*have_shards)++;
        }
    }
    free(seen);
    free(m);
    return 0;
}

int gr_coord_barrier(gr_coord *c, uint32_t shards, uint32_t workers, uint32_t timeout_ms)
{
    if (shards > GR_SLOTS) return gr_seterr(GR_EINVAL, "barrier: %u shards (at most %u)", shards,
                                            GR_SLOTS);
    if (c->kind == GR_COORD_STATIC) workers = 0;
    uint64_t deadline = gr_now_ns() + (uint64_t)timeout_ms * 1000000u;
    uint32_t hs = 0, hw = 0;
    for (;;) {
        int rc = barrier_count(c, shards, &hs, &hw);
        if (rc && rc != GR_EAGAIN) return rc;
        if (!rc && hs >= shards && hw >= workers) return 0;
        if (gr_now_ns() >= deadline) break;
        gr_sleep_ms(50);
    }
    return gr_seterr(GR_ETIMEDOUT, "barrier: %u of %u shards and %u of %u workers after %u ms",
                     hs, shards, hw, workers, timeout_ms);
}

/* ---- election ---- */

int gr_coord_elect(gr_coord *c, gr_coord_leader_fn fn, void *arg)
{
    pthread_mutex_lock(&c->reg_mu);
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    if (!c->want_registered) rc = gr_seterr(GR_ENOENT, "coord: register before the election");
    else if (c->in_election) rc = gr_seterr(GR_EEXIST, "coord: already in the election");
    if (!rc) {
        c->leader_fn = fn;
        c->leader_arg = arg;
        c->in_election = true;
    }
    pthread_mutex_unlock(&c->mu);
    if (!rc && (rc = c->be->elect(c))) {
        pthread_mutex_lock(&c->mu);
        c->in_election = false;
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&c->reg_mu);
    if (!rc) coord_mark(c, COORD_DIRTY_ELECTION);
    return rc;
}

bool gr_coord_is_leader(gr_coord *c)
{
    pthread_mutex_lock(&c->mu);
    bool l = c->leading;
    pthread_mutex_unlock(&c->mu);
    return l;
}

int gr_coord_leader(gr_coord *c, gr_coord_member *out) { return c->be->leader(c, out); }

/* ---- layout ---- */

int gr_coord_layout_get(gr_coord *c, gr_coord_layout *out)
{
    memset(out, 0, sizeof *out);
    return c->be->layout_get(c, false, out);
}

bool gr_coord_value_name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > 63) return false;
    for (size_t i = 0; i < n; i++)
        if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') ||
              name[i] == '_' || name[i] == '-'))
            return false;
    return strcmp(name, "members") && strcmp(name, "election") && strcmp(name, "layout");
}

int gr_coord_value_get(gr_coord *c, const char *name, char **out, int64_t *version)
{
    *out = NULL;
    if (!gr_coord_value_name_ok(name))
        return gr_seterr(GR_EINVAL, "coord: '%s' cannot name a value (1..63 of a-z, 0-9, _ and "
                         "-; not members, election or layout)", name ? name : "(null)");
    int64_t v = -1;
    int rc = c->be->value_get(c, name, out, &v);
    if (version) *version = v;
    return rc;
}

int gr_coord_value_cas(gr_coord *c, const char *name, const char *text, int64_t *version)
{
    if (!gr_coord_value_name_ok(name))
        return gr_seterr(GR_EINVAL, "coord: '%s' cannot name a value (1..63 of a-z, 0-9, _ and "
                         "-; not members, election or layout)", name ? name : "(null)");
    if (!text || strlen(text) > GR_COORD_VALUE_MAX)
        return gr_seterr(GR_ETOOBIG, "coord: value %s: %zu bytes, at most %u", name,
                         text ? strlen(text) : 0, GR_COORD_VALUE_MAX);
    return c->be->value_cas(c, name, text, version);
}

int gr_coord_layout_cas(gr_coord *c, gr_coord_layout *l)
{
    int rc = coord_layout_check(l);
    if (rc) return rc;
    return c->be->layout_cas(c, l);
}

int gr_coord_watch_layout(gr_coord *c, gr_coord_layout_fn fn, void *arg)
{
    pthread_mutex_lock(&c->mu);
    c->layout_fn = fn;
    c->layout_arg = arg;
    c->last_layout_version = -2;
    pthread_mutex_unlock(&c->mu);
    if (fn) coord_mark(c, COORD_DIRTY_LAYOUT);
    return 0;
}

/* ---- session ---- */

int gr_coord_watch_session(gr_coord *c, gr_coord_session_fn fn, void *arg)
{
    pthread_mutex_lock(&c->mu);
    c->session_fn = fn;
    c->session_arg = arg;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

gr_coord_session gr_coord_session_state(gr_coord *c)
{
    pthread_mutex_lock(&c->mu);
    gr_coord_session s = c->session;
    pthread_mutex_unlock(&c->mu);
    return s;
}
