/* Internal to the coord part: the handle both backends share, the backend operations, the
 * member record's JSON form and the event thread that runs the callbacks.
 *
 * Threads: the caller's threads run the public functions; one event thread per handle
 * (events.c) re-reads what changed and runs the user's callbacks; the zookeeper backend adds
 * the library's two threads (I/O and completion), whose watcher only sets flags here and
 * signals (it never blocks and never calls the synchronous API). Lock order: zk.lock (the
 * session handle, read-held around every ZooKeeper call) before c->mu; c->mu is never held
 * across a ZooKeeper call or a callback. */
#ifndef GRANARY_COORD_INT_H
#define GRANARY_COORD_INT_H

#include "granary/coord.h"

#include <pthread.h>

typedef struct coord_backend coord_backend;

/* Every operation exists in both backends (static.c, zk.c); `watch` asks the backend to
 * raise the matching dirty flag on the next change. */
struct coord_backend {
    int (*start)(gr_coord *c);                 /* after the common fields are set */
    void (*stop)(gr_coord *c);                 /* leave: delete our nodes, free state */
    int (*register_self)(gr_coord *c);         /* c->self -> a member node; sets c->self.id */
    int (*update_self)(gr_coord *c);           /* rewrite our node from c->self */
    int (*unregister_self)(gr_coord *c);
    int (*list_members)(gr_coord *c, bool watch, gr_coord_member **out, size_t *n);
    int (*layout_get)(gr_coord *c, bool watch, gr_coord_layout *out);
    int (*layout_cas)(gr_coord *c, gr_coord_layout *l);
    /* Job values (gr_coord_value_*; the name is checked by the caller). */
    int (*value_get)(gr_coord *c, const char *name, char **out, int64_t *version);
    int (*value_cas)(gr_coord *c, const char *name, const char *text, int64_t *version);
    int (*elect)(gr_coord *c);                 /* join: create our candidate */
    int (*resign)(gr_coord *c);
    /* Re-checks the election (arming the predecessor's watch): *leading out. */
    int (*election_check)(gr_coord *c, bool *leading);
    int (*leader)(gr_coord *c, gr_coord_member *out);
    /* Runs on the event thread every c->tick_ns (zookeeper: renews the lease). */
    void (*tick)(gr_coord *c);
    /* Runs on the event thread when a session event is pending (zookeeper only; static
     * never raises one): reconnects, re-registers, reports through coord_session_report. */
    void (*session_step)(gr_coord *c);
};

/* Dirty flags the event thread serves. */
enum {
    COORD_DIRTY_MEMBERS = 1u << 0,
    COORD_DIRTY_LAYOUT = 1u << 1,
    COORD_DIRTY_ELECTION = 1u << 2,
    COORD_DIRTY_SESSION = 1u << 3,
    COORD_DIRTY_MEMBERS_RESET = 1u << 4, /* a new members callback: everyone is new to it */
};

typedef struct coord_zk coord_zk;   /* zk.c */
typedef struct coord_static coord_static; /* static.c */

struct gr_coord {
    gr_coord_backend kind;
    const coord_backend *be;
    char *spec;
    gr_coord_options opts;
    coord_zk *zk;
    coord_static *st;

    /* Serialises register / update / unregister / elect / resign with the event thread's
     * re-registration after an expiry. Taken before zk.lock and mu. */
    pthread_mutex_t reg_mu;
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* event thread: dirty flags; waiters: state changes */
    unsigned dirty;
    unsigned retry_flags;       /* flags whose refresh failed and waits for retry_at_ns */
    bool stopping;
    pthread_t thread;
    bool thread_started;
    uint64_t retry_at_ns;       /* a failed refresh retries then (0: none pending) */

    /* Our registration (under mu). */
    bool want_registered;       /* register was called and unregister was not */
    bool registered;            /* our member node exists now */
    bool self_dirty;            /* an update did not reach the node: rewrite on reconnect */
    gr_coord_member self;
    bool in_election;
    bool leading;
    gr_coord_session session;
    /* Set by the ZooKeeper watcher itself, at once (the session state above waits for the
     * event thread): fencing must not lag behind a callback that runs long. */
    bool link_up;
    /* Until then the server has certainly not expired our session (its last answer to us
     * was sent after lease_start, and it waits a session timeout from our last message):
     * registered is true only before it. A SIGSTOPped process finds it passed the moment it
     * runs again, before the library even notices. */
    uint64_t lease_until_ns;
    uint64_t tick_ns;           /* period of be->tick; 0: none */
    uint64_t next_tick_ns;

    /* Callbacks (under mu; called without it, on the event thread). */
    gr_coord_members_fn members_fn;
    void *members_arg;
    gr_coord_layout_fn layout_fn;
    void *layout_arg;
    gr_coord_leader_fn leader_fn;
    void *leader_arg;
    gr_coord_session_fn session_fn;
    void *session_arg;
    gr_coord_member *last_members; /* what the members callback saw last (event thread only) */
    size_t n_last_members;
    int64_t last_layout_version; /* what the layout callback saw last; -2: nothing yet */
};

extern const coord_backend coord_static_backend;
extern const coord_backend coord_zk_backend;

/* GR_EINVAL naming the problem when l could not be stored (indexes, slot map). */
int coord_layout_check(const gr_coord_layout *l);

/* Parses the spec of a static coordinator into a layout (version 0); ENOENT for embedded. */
int coord_static_layout_from_spec(const char *spec, gr_coord_layout *out, bool *embedded);

/* Raises dirty flags and wakes the event thread. Safe from any thread, even the ZooKeeper
 * library's (it only takes c->mu briefly). */
void coord_mark(gr_coord *c, unsigned flags);
/* Serves flags again 200 ms from now (a step that failed because the connection is down). */
void coord_retry(gr_coord *c, unsigned flags);
/* Records a session state and runs the session callback (event thread only). */
void coord_session_report(gr_coord *c, gr_coord_session state);
/* Leadership changed (event thread or a caller of resign): runs the leader callback. */
void coord_leader_report(gr_coord *c, bool leading);
/* Event thread start / stop (events.c). */
int coord_events_start(gr_coord *c);
void coord_events_stop(gr_coord *c);

/* The member record's JSON (the znode's data): id, role, index, address, host, pid. A member
 * znode's name is its id (the listing overrides the "id" key); an election candidate's data
 * names the member it stands for. The decoder takes hostile input. */
char *coord_member_encode(const gr_coord_member *m);
int coord_member_decode(const char *json, size_t len, gr_coord_member *out);
/* Sorts members by the sequence number that ends their id, then by id. */
void coord_members_sort(gr_coord_member *m, size_t n);
/* The 10-digit sequence suffix ZooKeeper appends to sequential names; -1 when none. */
long long coord_seq_of(const char *name);

#endif
