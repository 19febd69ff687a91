/* Internal to the cli part: `granary cluster up` (cluster_up.c), called by the `cluster`
 * command's dispatch in cluster.c. argv[0] is "up". */
#ifndef GRANARY_CLI_CLUSTER_H
#define GRANARY_CLI_CLUSTER_H

int gr_cli_cluster_up(int argc, char **argv);

#endif
