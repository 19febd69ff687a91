/* A warm standby's preparation (warm.c): the tables a takeover's restore will fill, created
 * and prefaulted ahead from the job's newest checkpoint. Internal to src/server. */
#ifndef GRANARY_SERVER_WARM_H
#define GRANARY_SERVER_WARM_H

#include "granary/ckpt.h"
#include "granary/server.h"
#include "granary/table.h"

typedef struct srv_warm_info {
    char ckpt[GR_CKPT_NAME_MAX]; /* the checkpoint last looked at ("" before any) */
    uint64_t rows;               /* rows prepared, all tables */
    uint64_t bytes;              /* memory held prefaulted */
    uint32_t tables;
    bool capped;                 /* the memory limit cut the rows prepared */
    uint64_t ms, cpu_ms;         /* the last preparation: wall and CPU time */
    uint32_t builds;             /* preparations so far */
} srv_warm_info;

/* Owned by the join's thread. */
typedef struct srv_warm {
    srv_warm_info info;
    gr_table_spec *specs; /* the prepared set's specs and rows, per table */
    uint64_t *rows;
    size_t ntables;
    uint32_t shards; /* the job's shard count it was prepared for */
    bool partial;    /* a preparation was cut short by stop(): rebuilt at the next refresh */
} srv_warm;

/* Prepares (or keeps) the set for the newest checkpoint under root (as CKPT_LOAD resolves
 * it) and a job of `shards` shards: rows for the largest shard, the whole set within
 * max_bytes (0: no limit). Cheap when the newest checkpoint has not changed. An error leaves
 * no set or the old one; the restore does without. stop(arg) (may be NULL) is asked between
 * pieces of the preparation: when it says true (the job's layout or members changed: a
 * takeover may be due) the preparation returns at once, keeping what it prepared so far for
 * that takeover, and is done again at the next refresh. */
int srv_warm_refresh(gr_server *s, srv_warm *w, const char *root, uint32_t shards,
                     uint64_t max_bytes, bool (*stop)(void *arg), void *arg);
/* Destroys the set's tables that no restore adopted and forgets it. */
void srv_warm_release(gr_server *s, srv_warm *w);

#endif
