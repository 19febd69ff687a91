/* granary cluster: an embedded parameter-server cluster. S shards as in-process gr_servers on
 * free loopback ports (and abstract AF_UNIX addresses for clients on this machine), for `granary train` without --servers, the benchmarks and tests: they
 * run the real wire protocol and shard code with nothing to deploy. This part depends on
 * server; train does not (the trainer only sees the client backend over the cluster's
 * addresses).
 *
 * Errors: functions return 0 or a negative gr_err and set gr_errmsg(). */
#ifndef GRANARY_CLUSTER_H
#define GRANARY_CLUSTER_H

#include "granary/core.h"
#include "granary/metrics.h"

typedef struct gr_local_cluster gr_local_cluster;
/* The time slice (us) the shards' connection loop and worker threads ask for: they share the
 * process's cores with the trainer's compute threads (gr_server_config.slice_us). */
#define GR_LOCAL_CLUSTER_SLICE_US 200u
/* Row memory an embedded shard has handed out ahead of its growing tables
 * (gr_server_config.populate_ahead), for gr_local_cluster_opts.populate_ahead: two huge pages.
 * granary train and bench train's runs ask for it (their cores idle between a step's
 * hand-offs); the other starts leave it off: where the callers keep both cores busy (the
 * Python module's workers) the grow thread only adds the pages past the last rows. */
#define GR_LOCAL_CLUSTER_AHEAD (4u << 20)
/* Row memory an embedded shard keeps on huge pages per table (gr_server_config.huge_rows), for
 * gr_local_cluster_opts.huge_rows: the first 32 MiB (about 230 k rows of dim 16 with Adagrad),
 * the rows a skewed workload creates first and touches most; the rest on 4 KiB pages, which a
 * VM's host backs faster. granary train and bench train's runs ask for it. */
#define GR_LOCAL_CLUSTER_HUGE_ROWS (32u << 20)
/* threads: worker threads per shard (0 = 2). */
GR_API int gr_local_cluster_start(unsigned shards, unsigned threads, gr_local_cluster **out);
/* The same with every shard publishing its changed rows to serving replicas every
 * publish_interval_ms (gr_server_config.publish_interval_ms; 0 = never). */
GR_API int gr_local_cluster_start_publishing(unsigned shards, unsigned threads,
                                             uint32_t publish_interval_ms, gr_local_cluster **out);
/* The same with every shard's series in metrics (labelled shard="I"; NULL = none), which must
 * outlive the cluster. */
GR_API int gr_local_cluster_start_metrics(unsigned shards, unsigned threads, gr_metrics *metrics,
                                          gr_local_cluster **out);
/* Both: publishing (0 = never) and metrics (NULL = none). */
GR_API int gr_local_cluster_start_with(unsigned shards, unsigned threads,
                                       uint32_t publish_interval_ms, gr_metrics *metrics,
                                       gr_local_cluster **out);
/* Everything a local cluster can be started with; gr_local_cluster_opts_default gives what
 * gr_local_cluster_start uses (2 threads, no publishing, no metrics, no row memory ahead). */
typedef struct gr_local_cluster_opts {
    unsigned shards;              /* 1..256 */
    unsigned threads;             /* worker threads per shard (0 = 2) */
    uint32_t publish_interval_ms; /* 0 = never */
    gr_metrics *metrics;          /* NULL = none; must outlive the cluster */
    uint64_t populate_ahead;      /* bytes (gr_server_config.populate_ahead); 0 = off */
    uint64_t huge_rows;           /* bytes (gr_server_config.huge_rows); 0 = all huge */
} gr_local_cluster_opts;
GR_API void gr_local_cluster_opts_default(gr_local_cluster_opts *o, unsigned shards);
GR_API int gr_local_cluster_start_opts(const gr_local_cluster_opts *o, gr_local_cluster **out);
/* "127.0.0.1:PORT,..." in shard order, for any process; valid until stop. */
GR_API const char *gr_local_cluster_servers(const gr_local_cluster *c);
/* "unix:@NAME,..." in shard order: the same shards over abstract AF_UNIX sockets, for
 * clients on this machine (the trainer embedding the cluster); no TCP stack, same protocol.
 * Valid until stop; both lists work at once. */
GR_API const char *gr_local_cluster_local_servers(const gr_local_cluster *c);
/* Installs direct hooks on a client of this process connected to this cluster's shards in
 * shard order (either list): its pulls and pushes of rows then call the shards' tables on the
 * caller's thread (gr_server_direct_pull/push, gr_client_direct), everything else stays on
 * the socket. Remove them (gr_client_set_direct(client, NULL)) or destroy the client before
 * the cluster stops. GR_EINVAL when the client's shard count is not the cluster's. */
typedef struct gr_client gr_client;
GR_API int gr_local_cluster_direct(gr_local_cluster *c, gr_client *client);
/* Stops every shard (gracefully) and frees the cluster. NULL is a no-op. */
GR_API void gr_local_cluster_stop(gr_local_cluster *c);

#endif
