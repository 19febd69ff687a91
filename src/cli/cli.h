/* Internal to the cli part: the subcommand table. A subcommand is `int fn(argc, argv)` where
 * argv[0] is the subcommand's name; it returns the process exit status. */
#ifndef GRANARY_CLI_H
#define GRANARY_CLI_H

#include "granary/core.h"

typedef int (*gr_cli_fn)(int argc, char **argv);
typedef struct gr_cli_command {
    const char *name;
    gr_cli_fn fn;
    const char *summary;
} gr_cli_command;

/* Every subcommand, declared once: X(name, function, summary). */
#define GR_CLI_COMMANDS(X)                                                                     \
    X("server", gr_cli_server, "serve one shard: granary server --listen HOST:PORT --shard I --shards N") \
    X("stats", gr_cli_stats, "print a shard's tables and counters: granary stats --server HOST:PORT")    \
    X("datagen", gr_cli_datagen, "generate synthetic Criteo-layout data with a known teacher")           \
    X("train", gr_cli_train, "train a model on a local or remote cluster")                              \
    X("eval", gr_cli_eval, "score a file with a saved model: granary eval --model DIR --test FILE") \
    X("ckpt", gr_cli_ckpt, "checkpoints: granary ckpt list|inspect|verify|reshard|export|latest|retain") \
    X("serve", gr_cli_serve, "serve a trained model: granary serve --model DIR --http HOST:PORT [--from HOST:PORT,...]") \
    X("controller", gr_cli_controller, "the control plane: job API, scheduler and dashboard (docs/platform.md)") \
    X("job", gr_cli_job, "submit, list, watch and stop jobs on a controller: granary job submit|list|status|stop|logs") \
    X("bench", gr_cli_bench, "run a benchmark: granary bench table|ps|train|ckpt|soak [--json]") \
    X("cluster", gr_cli_cluster, "start and supervise local shards, or show a job: granary cluster up|status")

#define GR_CLI_DECLARE(name, fn, summary) int fn(int argc, char **argv);
GR_CLI_COMMANDS(GR_CLI_DECLARE)
#undef GR_CLI_DECLARE

#endif
