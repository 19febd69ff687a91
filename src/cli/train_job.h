/* Internal to the cli part: a `granary train --coord ... --job-workers N` process, one of N
 * worker processes of one job (train_job.c; docs/coord.md, "Worker processes"). Each claims a
 * rank, waits for the others, trains its share of the data; the elected chief initialises the
 * job, saves its checkpoints and, when a process dies, makes that process's workers leave the
 * shards' sync job so the others go on. */
#ifndef GRANARY_CLI_TRAIN_JOB_H
#define GRANARY_CLI_TRAIN_JOB_H

#include "cli/train_coord.h"
#include "granary/train.h"

typedef struct tj_job tj_job;

/* What a process asks of the job; the first process's settings are the job's, and a process
 * asking for others is refused naming both. */
typedef struct tj_want {
    unsigned ranks;      /* worker processes */
    unsigned threads;    /* worker threads each */
    const char *mode;    /* the sync mode's name */
    uint32_t timeout_ms; /* for the shards, a rank and the others at the barrier */
    const char *auth_file; /* the shards' secret, for the leaves sent for a lost process */
    bool rollback;       /* --recovery rollback: every process returns to the checkpoint */
} tj_want;

/* Joins (tc_open_member), claims the lowest free rank of the current run (starting a new run
 * when none is running, if it leads), waits until all `ranks` ranks are claimed by live
 * processes, then until the job is initialised or this process is the one to do it
 * (tj_initialises). Prints what it does on stderr. */
int tj_open(const char *spec, const tj_want *want, tj_job **out);
unsigned tj_rank(const tj_job *j);
/* The run's sync-job owner id (every process of the run passes it). */
uint64_t tj_owner(const tj_job *j);
/* This process sets the job up: dense initial values, the restore of --resume, the sync job's
 * reset; the others wait for it (gr_train_job.started) and join. */
bool tj_initialises(const tj_job *j);
/* The coordination underneath (layout, servers, the stale hook). */
tc_job *tj_tc(tj_job *j);
/* The trainer's hooks (valid until tj_close); starts the chief's watch over lost processes. */
const gr_train_job *tj_train_hooks(tj_job *j);
/* Whether this process leads the job now. */
bool tj_is_chief(tj_job *j);
/* This process took over the lost rank of a running run (it resumes from the job's newest
 * checkpoint, at the rank's own position where the job recorded one). */
bool tj_joining(const tj_job *j);
/* Recovery from a lost shard (or a re-admission) inside the job; docs/coord.md, "Recovery in a
 * job of several processes". tj_recover_mark: this process stopped its run and recovers (its
 * claim says so, so the chief can wait for every process before it restores).
 * tj_recover_join, once the layout healed: the leader starts a recovery generation in the job
 * value, waits for the others to stop and then sets the job up again (tj_initialises becomes
 * true: it restores, resets the sync job, re-sends leaves, and its `started` hook marks the
 * generation restored); any other process waits for that before it joins again. */
void tj_recover_mark(tj_job *j);
int tj_recover_join(tj_job *j, uint32_t timeout_ms);
/* A run that returned because the job recovers (it was done with its data and waiting): run
 * again through the recovery. Reading it clears it. */
bool tj_must_recover(tj_job *j);
/* The job is in a recovery or a re-admission now (a process stopped for one, or a generation
 * is not restored yet): a run that failed meanwhile (its sync job cleared under it: "no sync
 * job") recovers with the job instead of failing. */
bool tj_recovering(tj_job *j);
/* After a run that ended well as the chief: the job is done (the others stop waiting). */
void tj_done(tj_job *j);
/* Leaves the job. NULL is a no-op. */
void tj_close(tj_job *j);

#endif
