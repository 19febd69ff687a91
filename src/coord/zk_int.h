/* Internal to the coord part: the zookeeper backend's state, shared by zk.c (the session:
 * connect, expiry, re-registration) and zk_ops.c (members, layout, election).
 *
 * Znodes under the job's PATH (docs/coord.md):
 *   PATH/members/m-<session>-<seq>    ephemeral sequential, a member record (JSON)
 *   PATH/election/c-<session>-<seq>   ephemeral sequential, a candidate (its member record)
 *   PATH/layout                       persistent, the layout (JSON), changed by version CAS
 *   PATH/NAME                         persistent, a job value (gr_coord_value_*), likewise
 * The session id in the names lets a client that lost the reply to a create find the node it
 * may have made (ZooKeeper's recipe). */
#ifndef GRANARY_COORD_ZK_INT_H
#define GRANARY_COORD_ZK_INT_H

#include "coord/coord_int.h"

/* The synchronous API is declared only for the multi-threaded library (-lzookeeper_mt). */
#ifndef THREADED
#define THREADED
#endif
#include <zookeeper/zookeeper.h>

#define ZK_PATH_MAX 512

/* What a ZooKeeper watcher gets as its context: a generation, so that events of a handle
 * replaced after an expiry are ignored. Freed after zookeeper_close of its handle. */
typedef struct zk_watch_ctx {
    gr_coord *c;
    unsigned gen;
} zk_watch_ctx;

struct coord_zk {
    char *hosts;                 /* "h:p,h:p" */
    char root[ZK_PATH_MAX];      /* the job's PATH */
    char members_dir[ZK_PATH_MAX];
    char election_dir[ZK_PATH_MAX];
    char layout_path[ZK_PATH_MAX];
    /* Read-held around every call on zh; write-held to replace it after an expiry. */
    pthread_rwlock_t lock;
    zhandle_t *zh;
    zk_watch_ctx *ctx;
    unsigned gen;                /* under c->mu */
    int state;                   /* the last ZOO_*_STATE its watcher saw (under c->mu) */
    bool expired;                /* an expiry waits for session_step (under c->mu) */
    bool ping_inflight;          /* a lease ping awaits its answer (under c->mu) */
    uint64_t ping_sent_ns;
    /* Our nodes (under c->reg_mu; "" when none). */
    char member_path[ZK_PATH_MAX];
    char cand_path[ZK_PATH_MAX];
};

/* dir + "/" + name into out; GR_ETOOBIG (with a message) when it does not fit. */
int zk_child_path(char *out, size_t cap, const char *dir, const char *name);
/* A ZooKeeper error as a gr_err with a message: connection trouble is GR_EAGAIN. */
int zk_err(int zrc, const char *what, const char *path);
/* "m-<session hex>-" for names of the current session (call with zk.lock held). */
void zk_session_prefix(coord_zk *z, char kind, char *buf, size_t cap);
/* Finds a child of dir whose name starts with prefix (after ZCONNECTIONLOSS on a create);
 * writes its full path. Returns 0 when found, GR_ENOENT, or another error. zk.lock held. */
int zk_find_child(coord_zk *z, const char *dir, const char *prefix, char *path, size_t cap);

/* zk_ops.c: the operations of the backend table (zk.lock is taken inside). */
int zk_list_members(gr_coord *c, bool watch, gr_coord_member **out, size_t *n);
int zk_layout_get(gr_coord *c, bool watch, gr_coord_layout *out);
int zk_layout_cas(gr_coord *c, gr_coord_layout *l);
/* zk_values.c: job values, the persistent znodes PATH/NAME. */
int zk_value_get(gr_coord *c, const char *name, char **out, int64_t *version);
int zk_value_cas(gr_coord *c, const char *name, const char *text, int64_t *version);
int zk_elect(gr_coord *c);
int zk_resign(gr_coord *c);
int zk_election_check(gr_coord *c, bool *leading);
int zk_leader(gr_coord *c, gr_coord_member *out);

#endif
