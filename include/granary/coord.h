/* granary coord: who is in a job and where its shards are. One interface, two backends:
 *
 *  - static: today's behaviour, nothing running. The layout comes from a server list
 *    ("host:port,host:port", position = shard index), a cluster file (the client's format,
 *    {"shards":["host:port",...]}, or a full layout object as below), or is empty for the
 *    embedded local cluster (its starter writes the layout). Membership, the barrier and the
 *    election are local to the handle (see each function).
 *  - zookeeper: "zk://HOST:PORT[,HOST:PORT...]/PATH" over libzookeeper-mt. Each job lives
 *    under its own PATH (docs/coord.md has the znodes): members are ephemeral sequential
 *    znodes, the chief is elected by the recipe (watch only the predecessor), the layout is
 *    one versioned znode changed only by compare-and-set, and a lost session is replaced by a
 *    new one that re-registers and re-arms every watch by itself.
 *
 * A gr_coord is thread-safe. Callbacks (members, layout, leader, session) run one at a time
 * on the handle's own event thread, never on a ZooKeeper library thread: they may call any
 * function of this header on the same handle except gr_coord_close, and should return soon
 * (a slow callback delays the others and, past two thirds of the session timeout, lets the
 * lease of gr_coord_registered lapse). A callback removed or replaced by a watch call may
 * still be running (or about to run once) when that call returns; gr_coord_close returns only
 * after the last one ended, so free what a callback uses after closing the handle.
 *
 * Errors: functions return 0 or a negative gr_err and set gr_errmsg(). GR_EAGAIN always means
 * "not connected to the coordinator right now, try again"; GR_ESTALE means someone else
 * changed the layout first. */
#ifndef GRANARY_COORD_H
#define GRANARY_COORD_H

#include "granary/core.h"

typedef struct gr_coord gr_coord;

typedef enum gr_coord_backend {
    GR_COORD_STATIC = 0,
    GR_COORD_ZOOKEEPER = 1,
} gr_coord_backend;

/* What a member does in the job. A standby is a shard process without a shard index yet. */
typedef enum gr_coord_role {
    GR_COORD_SHARD = 0,
    GR_COORD_STANDBY = 1,
    GR_COORD_WORKER = 2,
    GR_COORD_OBSERVER = 3, /* tools (cluster status, supervisors): counted by nothing */
} gr_coord_role;
/* "shard", "standby", "worker", "observer"; "unknown" otherwise. Never NULL. */
GR_API const char *gr_coord_role_name(int role);
GR_API int gr_coord_role_parse(const char *s, gr_coord_role *out);

#define GR_COORD_ID_MAX 64     /* member ids, with the NUL */
#define GR_COORD_ADDR_MAX 256  /* "host:port", with the NUL */
#define GR_COORD_HOST_MAX 64   /* host names, with the NUL */

typedef struct gr_coord_member {
    /* The member's name in the job, set by gr_coord_register ("m-<session>-<seq>" under
     * zookeeper, "local-0" for static). Ignored on input. It changes when an expired session
     * re-registers. */
    char id[GR_COORD_ID_MAX];
    gr_coord_role role;
    int32_t index;                    /* shard index (shard), worker rank (worker), or -1 */
    char address[GR_COORD_ADDR_MAX];  /* where it serves ("" for a worker) */
    char host[GR_COORD_HOST_MAX];     /* gethostname(); filled by register when "" */
    int64_t pid;                      /* its process id on host; filled by register when 0 */
} gr_coord_member;

/* A member with role, index -1, nothing else. */
GR_API void gr_coord_member_init(gr_coord_member *m, gr_coord_role role);

/* ---- The layout: shard list, slot map, epoch. One versioned value per job. ---- */

typedef struct gr_coord_shard {
    uint32_t index;                   /* == its position in the list */
    char address[GR_COORD_ADDR_MAX];  /* "" while the index is vacant */
    char member[GR_COORD_ID_MAX];     /* the member serving it ("" when vacant or static) */
} gr_coord_shard;

typedef struct gr_coord_layout {
    /* Raised by every change of who serves what; requests carry it and shards refuse other
     * epochs (docs/coord.md). 1 for a new layout; 0 never names a stored layout. */
    uint64_t epoch;
    uint32_t n_shards;
    gr_coord_shard *shards;  /* n_shards entries, owned */
    uint16_t *slot_map;      /* GR_SLOTS entries: the shard index of each slot, owned */
    /* The version it was read at (the compare of compare-and-set); -1: not stored yet. */
    int64_t version;
} gr_coord_layout;

/* A new layout of n_shards vacant shards (1..GR_SLOTS) with the default slot map
 * (gr_slot_shard), epoch 1, version -1. */
GR_API int gr_coord_layout_init(gr_coord_layout *l, uint32_t n_shards);
/* Frees what the layout owns and zeroes it; a zeroed layout is a no-op. */
GR_API void gr_coord_layout_fini(gr_coord_layout *l);
/* A deep copy into dst (which is overwritten, not freed). */
GR_API int gr_coord_layout_copy(gr_coord_layout *dst, const gr_coord_layout *src);
/* The layout as JSON (the znode's data and the cluster file's format):
 * {"epoch":E,"shards":[{"index":0,"address":"h:p","member":"m-.."},...],
 *  "slots":[[first,last,shard],...]}  (slot ranges, covering 0..GR_SLOTS-1 in order).
 * Returns a string the caller frees, or NULL (GR_ENOMEM). The version is not encoded. */
GR_API char *gr_coord_layout_encode(const gr_coord_layout *l);
/* Parses that JSON (len bytes, need not be NUL-terminated) into out (version -1). Shard
 * entries may also be plain "host:port" strings (the client's cluster file); "slots" and
 * "epoch" are optional (default map, epoch 1). GR_EINVAL naming the bad field otherwise:
 * every slot must be covered once and name a listed shard, indexes must be 0..n-1 in order.
 * Unknown keys are ignored (newer writers may add some). */
GR_API int gr_coord_layout_decode(const char *json, size_t len, gr_coord_layout *out);
/* "addr,addr,..." in index order (a vacant shard gives an empty entry) into buf; GR_ETOOBIG
 * when cap is too small. */
GR_API int gr_coord_layout_servers(const gr_coord_layout *l, char *buf, size_t cap);

/* ---- Opening a coordinator ---- */

typedef struct gr_coord_options {
    /* ZooKeeper session timeout asked for; the server clamps it to [2, 20] x its tickTime.
     * A member that is silent this long loses its znodes. Default 4000. */
    uint32_t session_timeout_ms;
    /* gr_coord_open waits this long for the first session (GR_ETIMEDOUT). Default 10000. */
    uint32_t connect_timeout_ms;
} gr_coord_options;
GR_API void gr_coord_options_default(gr_coord_options *o);

/* Opens a coordinator from spec:
 *   NULL, "" or "embedded"        static, empty layout (the embedded cluster writes it)
 *   "host:port,host:port"         static, that server list
 *   "file:PATH", or a PATH with a '/' or ending in ".json"
 *                                 static, a cluster file (read once, here)
 *   "zk://h:p[,h:p...]/PATH"      zookeeper; PATH (absolute, no trailing '/') and its parents
 *                                 are created when missing
 * opts may be NULL (defaults). GR_EINVAL naming what was wrong with spec; zookeeper:
 * GR_ETIMEDOUT when no server answered within connect_timeout_ms. */
GR_API int gr_coord_open(const char *spec, const gr_coord_options *opts, gr_coord **out);
/* Leaves the job (our znodes are deleted at once rather than after the session timeout),
 * stops the event thread and frees the handle. No callback runs after it returns. NULL is a
 * no-op. */
GR_API void gr_coord_close(gr_coord *c);
GR_API gr_coord_backend gr_coord_backend_of(const gr_coord *c);
/* The spec it was opened with ("" for embedded); valid until close. */
GR_API const char *gr_coord_spec(const gr_coord *c);

/* ---- Membership ---- */

/* Registers this process as a member (one registration per handle; GR_EEXIST for a second):
 * zookeeper creates an ephemeral sequential znode holding self (JSON). Copies the record,
 * fills id (and host, pid when unset) and, when id_out is not NULL, writes the id there.
 * After a session expires, the handle registers the same record again by itself (with a new
 * id). GR_EAGAIN when not connected. */
GR_API int gr_coord_register(gr_coord *c, const gr_coord_member *self, char *id_out);
/* Replaces our record (a standby that became shard 3) in place; id is kept. GR_ENOENT when
 * not registered. When the session is down the new record is kept and written when it is
 * registered again (returns GR_EAGAIN then). */
GR_API int gr_coord_update(gr_coord *c, const gr_coord_member *self);
/* Deletes our member znode (and leaves the election). No-op when not registered. */
GR_API int gr_coord_unregister(gr_coord *c);
/* Our current record (id "" when not registered). */
GR_API void gr_coord_self(gr_coord *c, gr_coord_member *out);
/* True while the session is connected, our member znode exists and the session lease is
 * current (the server answered us within the last two thirds of a session timeout, so it
 * cannot have expired us yet; docs/coord.md): a shard accepts writes only while this holds
 * (no split brain after a pause or a partition, even in the moment after a SIGCONT).
 * Static: registered. */
GR_API bool gr_coord_registered(gr_coord *c);

/* Every member now, sorted by id (sequence order): *out is an array the caller frees with
 * free(). GR_EAGAIN when not connected. Static: only this handle's own registration. */
GR_API int gr_coord_members(gr_coord *c, gr_coord_member **out, size_t *n);

typedef struct gr_coord_members_event {
    const gr_coord_member *members; /* everyone now, sorted by id */
    size_t n;
    const gr_coord_member *joined;  /* members not in the previous call's list */
    size_t n_joined;
    const gr_coord_member *lost;    /* members of the previous call's list now gone */
    size_t n_lost;
} gr_coord_members_event;
/* Called once at once (everyone as joined) and then after every join or loss. Only ids are
 * compared: a record changed in place (gr_coord_update) is not an event of its own (it shows
 * in the next call's `members`). The arrays are valid during the call only. */
typedef void (*gr_coord_members_fn)(void *arg, const gr_coord_members_event *ev);
/* Sets (fn NULL: removes) the handle's one members callback. */
GR_API int gr_coord_watch_members(gr_coord *c, gr_coord_members_fn fn, void *arg);

/* ---- Startup barrier ---- */

/* Waits until members with role shard cover `shards` distinct indexes (0..shards-1) and at
 * least `workers` members with role worker are registered, or timeout_ms passes
 * (GR_ETIMEDOUT saying how many of each it saw). timeout_ms 0 checks once. Static: shards
 * are counted from the layout (a static list is up by definition) and workers are not
 * counted (a static job has no discovery: each worker is told its rank). */
GR_API int gr_coord_barrier(gr_coord *c, uint32_t shards, uint32_t workers,
                            uint32_t timeout_ms);

/* ---- Leader election (the chief worker) ---- */

/* Called with true when this member becomes the leader, and with false when it stops being
 * it (resigned, or its session expired: another member may lead by now). */
typedef void (*gr_coord_leader_fn)(void *arg, bool leader);
/* Joins the election (must be registered; GR_ENOENT otherwise; GR_EEXIST when already in
 * it). zookeeper: an ephemeral sequential candidate znode; the smallest sequence leads and
 * each other candidate watches only its predecessor. After an expiry the handle rejoins by
 * itself (at the back of the line). Static: the member with index <= 0 leads at once, any
 * other never does. fn may be NULL (poll gr_coord_is_leader). */
GR_API int gr_coord_elect(gr_coord *c, gr_coord_leader_fn fn, void *arg);
/* Leaves the election (fn(false) when it was leading). No-op when not in it. */
GR_API int gr_coord_resign(gr_coord *c);
GR_API bool gr_coord_is_leader(gr_coord *c);
/* The leader's member record now; GR_ENOENT when nobody is in the election. */
GR_API int gr_coord_leader(gr_coord *c, gr_coord_member *out);

/* ---- Layout ---- */

/* Reads the layout with its version into out (gr_coord_layout_fini it). GR_ENOENT when none
 * is stored yet (static embedded before its cluster started), GR_EAGAIN when not connected,
 * GR_ECORRUPT when the stored data does not parse (the message says why). */
GR_API int gr_coord_layout_get(gr_coord *c, gr_coord_layout *out);
/* Compare-and-set: stores l when the stored version is still l->version (-1: only when no
 * layout exists yet), and sets l->version to the new version. GR_ESTALE when someone else
 * changed (or created) it first: re-read, re-decide, retry. GR_EAGAIN when the connection
 * dropped and it is not known whether the write happened (re-read and compare the epoch).
 * The epoch is the caller's: raise it when who-serves-what changes. GR_EINVAL for a layout
 * that would not decode. */
GR_API int gr_coord_layout_cas(gr_coord *c, gr_coord_layout *l);
/* Called once at once with the current layout (when one exists) and after every change;
 * the layout is valid during the call only (copy it to keep it). */
typedef void (*gr_coord_layout_fn)(void *arg, const gr_coord_layout *l);
/* Sets (fn NULL: removes) the handle's one layout callback. */
GR_API int gr_coord_watch_layout(gr_coord *c, gr_coord_layout_fn fn, void *arg);

/* ---- Job values: small named records the members of a job share ---- */

/* A value is a short text (JSON by convention) stored under the job by name, changed only by
 * compare-and-set on its version, like the layout: what a job's processes agree on besides the
 * layout (granary train's worker ranks and its run, docs/coord.md). zookeeper: the persistent
 * znode PATH/NAME; static: held by the handle (one process sees its own values only). */
#define GR_COORD_VALUE_MAX (256u * 1024u) /* bytes of a value's text */
/* Whether name can name a value: 1..63 of [a-z0-9_-], and not "members", "election" or
 * "layout" (the job's own znodes). */
GR_API bool gr_coord_value_name_ok(const char *name);
/* Reads value `name` into *out (malloc'd, NUL-terminated; the caller frees it) and its version
 * into *version (may be NULL). GR_ENOENT when none is stored, GR_EAGAIN when not connected,
 * GR_EINVAL for a bad name. */
GR_API int gr_coord_value_get(gr_coord *c, const char *name, char **out, int64_t *version);
/* Compare-and-set: stores text when the stored version is still *version (-1: only when no
 * value of that name exists yet) and sets *version to the new one. GR_ESTALE when someone
 * else changed (or created) it first: re-read, re-decide, retry. GR_EAGAIN when the connection
 * dropped and it is not known whether the write happened (re-read and compare). GR_ETOOBIG
 * past GR_COORD_VALUE_MAX. */
GR_API int gr_coord_value_cas(gr_coord *c, const char *name, const char *text, int64_t *version);

/* ---- Session ---- */

typedef enum gr_coord_session {
    /* Connected, and (when registered) our member znode exists. */
    GR_COORD_CONNECTED = 0,
    /* Connection lost; the session may still live on the server and may expire any moment:
     * a shard stops accepting writes until CONNECTED. */
    GR_COORD_SUSPENDED = 1,
    /* The session is gone with its znodes (a replacement may be serving our shard by now).
     * The handle opens a new session, registers self again, rejoins the election and re-arms
     * every watch; then CONNECTED follows. */
    GR_COORD_EXPIRED = 2,
} gr_coord_session;
GR_API const char *gr_coord_session_name(int state); /* "connected", ... */
/* Called on every change of state. During the EXPIRED call, gr_coord_update may change the
 * record that is registered again (a shard that lost its index comes back as a standby). */
typedef void (*gr_coord_session_fn)(void *arg, gr_coord_session state);
GR_API int gr_coord_watch_session(gr_coord *c, gr_coord_session_fn fn, void *arg);
GR_API gr_coord_session gr_coord_session_state(gr_coord *c);

#endif
