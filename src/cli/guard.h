/* Internal to the cli part: what a long-running command owes its user besides its work. Its
 * paths are checked before it starts (a missing input or an unwritable output found after an
 * hour of training is an hour lost), SIGINT and SIGTERM stop it cleanly (the first asks it to
 * stop at a safe point, the second ends the process at once), and it can print the command
 * line that continues it. Used by `granary train`. */
#ifndef GRANARY_CLI_GUARD_H
#define GRANARY_CLI_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* An input the command reads: `path` must be a regular file it can open for reading. On
 * failure writes "FLAG PATH: why" into err and returns -1. */
int gr_cli_check_input(const char *flag, const char *path, char *err, size_t cap);
/* An output file written at the end: its directory must exist and take a new file there
 * (probed by creating and removing one, which also catches read-only and pseudo filesystems
 * where access() says yes to root), and `path` must not be a directory. */
int gr_cli_check_output_file(const char *flag, const char *path, char *err, size_t cap);
/* An output directory: created with its parents if missing, and probed like an output file. */
int gr_cli_check_output_dir(const char *flag, const char *path, char *err, size_t cap);
/* Whether `path` names an existing directory or file. */
bool gr_cli_path_exists(const char *path);

/* Installs the handlers of SIGINT and SIGTERM: the first signal is recorded (and a line on
 * stderr says the command is stopping and that another signal aborts); the second restores
 * the default action and re-raises, so the process ends at once as the signal says.
 * gr_cli_stop_signals_restore puts the previous handlers back. */
void gr_cli_stop_signals_install(const char *command);
void gr_cli_stop_signals_restore(void);
/* The first stop signal received since install (SIGINT, SIGTERM), or 0. */
int gr_cli_stop_signal(void);
/* gr_train_opts.should_stop: true once a stop signal came (ctx unused). Async-signal-safe
 * reads only. */
bool gr_cli_stop_requested(void *ctx);
/* The exit status of a command a signal stopped: 128 + its number (130 SIGINT, 143 SIGTERM),
 * what a shell reports for a process that signal ended. */
int gr_cli_signal_status(int sig);
/* "SIGINT", "SIGTERM", or "signal N". */
const char *gr_cli_signal_name(int sig);

/* After a connection error `errmsg` of the client ("shard 1 (HOST:PORT): no reply to the
 * handshake ..."): a peer that took the connection but never answered is often an HTTP server
 * (it waits for a request line granary's binary hello never sends); asks it in HTTP and, if it
 * answers, prints "granary CMD: HOST:PORT is not a granary server: it answered in HTTP". */
void gr_cli_explain_no_reply(const char *command, const char *errmsg);

/* Prints "granary CMD ARGS..." with each argument quoted for a POSIX shell where it needs it,
 * leaving out the option `flag` (given as "--flag VALUE" or "--flag=VALUE") and then adding
 * "--flag VALUE" at the end (value NULL: only left out). argv[0] is the subcommand. */
void gr_cli_print_command(FILE *out, int argc, char **argv, const char *flag, const char *value);

#endif
