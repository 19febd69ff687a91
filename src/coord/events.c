/* The event thread of a coordinator handle: it serves the dirty flags that watches (or the
 * static backend) raise, re-reads what changed (which re-arms the one-shot ZooKeeper
 * watches), and runs the user's callbacks, one at a time, never under a lock. A refresh that
 * fails (connection lost) is retried 200 ms later, and again after every session event. */
#include "coord/coord_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RETRY_NS 200000000ull

void coord_mark(gr_coord *c, unsigned flags)
{
    pthread_mutex_lock(&c->mu);
    c->dirty |= flags;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void coord_retry(gr_coord *c, unsigned flags)
{
    pthread_mutex_lock(&c->mu);
    c->retry_flags |= flags;
    c->retry_at_ns = gr_now_ns() + RETRY_NS;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void coord_session_report(gr_coord *c, gr_coord_session state)
{
    pthread_mutex_lock(&c->mu);
    bool changed = c->session != state;
    c->session = state;
    gr_coord_session_fn fn = c->session_fn;
    void *arg = c->session_arg;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (changed)
        GR_LOGI("coord %s: session %s", c->spec[0] ? c->spec : "embedded",
                gr_coord_session_name((int)state));
    if (changed && fn) fn(arg, state);
}

void coord_leader_report(gr_coord *c, bool leading)
{
    pthread_mutex_lock(&c->mu);
    bool changed = c->leading != leading;
    c->leading = leading;
    gr_coord_leader_fn fn = c->leader_fn;
    void *arg = c->leader_arg;
    pthread_mutex_unlock(&c->mu);
    if (changed)
        GR_LOGI("coord %s: %s the leader", c->spec[0] ? c->spec : "embedded",
                leading ? "became" : "is no longer");
    if (changed && fn) fn(arg, leading);
}

static bool has_id(const gr_coord_member *m, size_t n, const char *id)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(m[i].id, id)) return true;
    return false;
}

/* Members now vs what the callback saw last: joined and lost, then the callback. */
static int refresh_members(gr_coord *c, bool reset)
{
    pthread_mutex_lock(&c->mu);
    gr_coord_members_fn fn = c->members_fn;
    void *arg = c->members_arg;
    pthread_mutex_unlock(&c->mu);
    if (!fn) return 0;
    if (reset) {
        free(c->last_members);
        c->last_members = NULL;
        c->n_last_members = 0;
    }
    gr_coord_member *now = NULL;
    size_t n = 0;
    int rc = c->be->list_members(c, true, &now, &n);
    if (rc) return rc;
    gr_coord_member *joined = calloc(n + 1, sizeof *joined);
    gr_coord_member *lost = calloc(c->n_last_members + 1, sizeof *lost);
    if (!joined || !lost) {
        free(joined);
        free(lost);
        free(now);
        return gr_seterr(GR_ENOMEM, "coord: out of memory");
    }
    gr_coord_members_event ev = {now, n, joined, 0, lost, 0};
    for (size_t i = 0; i < n; i++)
        if (!has_id(c->last_members, c->n_last_members, now[i].id)) joined[ev.n_joined++] = now[i];
    for (size_t i = 0; i < c->n_last_members; i++)
        if (!has_id(now, n, c->last_members[i].id)) lost[ev.n_lost++] = c->last_members[i];
    bool first = reset || !c->last_members;
    free(c->last_members);
    c->last_members = now;
    c->n_last_members = n;
    if (first || ev.n_joined || ev.n_lost) fn(arg, &ev);
    free(joined);
    free(lost);
    return 0;
}

static int refresh_layout(gr_coord *c)
{
    pthread_mutex_lock(&c->mu);
    gr_coord_layout_fn fn = c->layout_fn;
    void *arg = c->layout_arg;
    int64_t last = c->last_layout_version;
    pthread_mutex_unlock(&c->mu);
    if (!fn) return 0;
    gr_coord_layout l;
    memset(&l, 0, sizeof l);
    int rc = c->be->layout_get(c, true, &l);
    if (rc == GR_ENOENT) return 0; /* the backend watches for its creation */
    if (rc == GR_ECORRUPT) {
        GR_LOGE("coord %s: %s", c->spec, gr_errmsg());
        return 0; /* nothing to retry until someone writes it again */
    }
    if (rc) return rc;
    if (l.version != last) {
        pthread_mutex_lock(&c->mu);
        c->last_layout_version = l.version;
        pthread_mutex_unlock(&c->mu);
        fn(arg, &l);
    }
    gr_coord_layout_fini(&l);
    return 0;
}

static int refresh_election(gr_coord *c)
{
    pthread_mutex_lock(&c->reg_mu);
    pthread_mutex_lock(&c->mu);
    bool in = c->in_election;
    pthread_mutex_unlock(&c->mu);
    bool leading = false;
    int rc = in ? c->be->election_check(c, &leading) : 0;
    pthread_mutex_unlock(&c->reg_mu);
    if (rc) return rc;
    coord_leader_report(c, leading);
    return 0;
}

static void *event_thread(void *arg)
{
    gr_coord *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        uint64_t now = gr_now_ns();
        if (c->retry_flags && c->retry_at_ns <= now) {
            c->dirty |= c->retry_flags;
            c->retry_flags = 0;
        }
        if (c->stopping) break;
        if (c->tick_ns && now >= c->next_tick_ns) {
            c->next_tick_ns = now + c->tick_ns;
            pthread_mutex_unlock(&c->mu);
            c->be->tick(c);
            pthread_mutex_lock(&c->mu);
            continue;
        }
        if (!c->dirty) {
            uint64_t until = c->retry_flags ? c->retry_at_ns : now + 1000000000ull;
            if (c->tick_ns && c->next_tick_ns < until) until = c->next_tick_ns;
            struct timespec ts = {(time_t)(until / 1000000000ull), (long)(until % 1000000000ull)};
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
            continue;
        }
        unsigned flags = c->dirty;
        c->dirty = 0;
        pthread_mutex_unlock(&c->mu);
        unsigned failed = 0;
        if (flags & COORD_DIRTY_SESSION) c->be->session_step(c);
        if ((flags & COORD_DIRTY_MEMBERS) &&
            refresh_members(c, (flags & COORD_DIRTY_MEMBERS_RESET) != 0))
            failed |= COORD_DIRTY_MEMBERS | (flags & COORD_DIRTY_MEMBERS_RESET);
        if ((flags & COORD_DIRTY_LAYOUT) && refresh_layout(c)) failed |= COORD_DIRTY_LAYOUT;
        if ((flags & COORD_DIRTY_ELECTION) && refresh_election(c)) failed |= COORD_DIRTY_ELECTION;
        pthread_mutex_lock(&c->mu);
        if (failed) {
            c->retry_flags |= failed;
            c->retry_at_ns = gr_now_ns() + RETRY_NS;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int coord_events_start(gr_coord *c)
{
    int e = pthread_create(&c->thread, NULL, event_thread, c);
    if (e) return gr_seterr(GR_ENOMEM, "coord: cannot start the event thread: %s", strerror(e));
    c->thread_started = true;
    return 0;
}

void coord_events_stop(gr_coord *c)
{
    if (!c->thread_started) return;
    pthread_mutex_lock(&c->mu);
    c->stopping = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    c->thread_started = false;
}
