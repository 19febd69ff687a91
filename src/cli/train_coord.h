/* Internal to the cli part: `granary train --coord` (train_coord.c). The training process
 * joins the job as a worker, leads it (the chief: one train process at a time; another one
 * waits and takes over when it dies), finds the shards through the layout, and after a
 * failure waits until the layout has healed (a standby took the lost index and serves). */
#ifndef GRANARY_CLI_TRAIN_COORD_H
#define GRANARY_CLI_TRAIN_COORD_H

#include "granary/client.h"

typedef struct tc_job tc_job;

/* Opens the coordinator, registers this process as a worker, waits to lead the job (up to
 * timeout_ms while another process leads), then until every shard of the layout serves.
 * *took_over: a chief led the job before us (the run should resume from its checkpoint). */
int tc_open(const char *spec, uint32_t timeout_ms, tc_job **out, bool *took_over);
/* The same for one of several worker processes of a job (train_job.c): registers as a worker
 * (rank -1 until it claims one), joins the election without waiting to lead, then waits until
 * every shard of the layout serves. */
int tc_open_member(const char *spec, uint32_t timeout_ms, tc_job **out);
/* The job's coordinator handle (valid until tc_close). */
struct gr_coord *tc_coord(tc_job *j);
/* "addr,addr,..." of the layout tc_open or tc_wait_healed last saw (valid until the next). */
const char *tc_servers(const tc_job *j);
/* Stamps the layout's epoch on client's requests and installs the stale hook: on GR_ESTALE it
 * re-reads the layout and retries while the shards' addresses are the client's; once one has
 * moved it fails the operation (the run then recovers). Call before the client is shared. */
void tc_attach(tc_job *j, gr_client *client);
/* How long the stale hook waits before a request refused by a shard of an unchanged layout is
 * sent again (64 times at most); default 50 ms. */
void tc_set_stale_patience(tc_job *j, uint32_t ms);
/* The failures a coordinated run recovers from: a shard gone or refusing the epoch. */
bool tc_recoverable(int rc);
/* Waits (up to timeout_ms) until the layout's epoch is at least `epoch` and every shard of it
 * serves at that epoch (answers stats with its fence open), polling the layout and the
 * shards. A lost shard keeps this waiting until a standby serves its index. */
int tc_wait_healed(tc_job *j, uint64_t epoch, uint32_t timeout_ms);
/* The epoch of the layout the job last saw. */
uint64_t tc_epoch(const tc_job *j);
/* Leaves the job. NULL is a no-op. */
void tc_close(tc_job *j);

#endif
