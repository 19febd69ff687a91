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
#define GR_CLI_COMMANDS(X) \
    X("bench", gr_cli_bench, "run a benchmark: granary bench table|ps|train|ckpt [--json] [--full]")

#define GR_CLI_DECLARE(name, fn, summary) int fn(int argc, char **argv);
GR_CLI_COMMANDS(GR_CLI_DECLARE)
#undef GR_CLI_DECLARE

#endif
