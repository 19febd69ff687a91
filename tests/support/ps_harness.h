/* Test support: start `granary server` child processes on free loopback ports and stop them.
 * The binary is $GR_BUILD_DIR/granary (the test runner exports build or build/address).
 * Children die with the test process (PR_SET_PDEATHSIG), so a crashed test leaves none. */
#ifndef GRANARY_TEST_PS_HARNESS_H
#define GRANARY_TEST_PS_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct ps_test_server {
    pid_t pid;
    uint16_t port;
    char addr[64]; /* "127.0.0.1:PORT" */
    uint16_t metrics_port; /* with "--metrics" "127.0.0.1:0" among the arguments: that port */
} ps_test_server;

/* Path of the granary binary under test. */
const char *ps_test_granary_bin(void);

/* Starts `granary server --listen 127.0.0.1:PORT --shard I --shards N [extra...]` (PORT 0
 * unless port is given) and waits (up to 20 s) for its "listening on" line. extra is a
 * NULL-terminated list or NULL. Returns 0, or -1 with the reason on stderr (the child's
 * stderr goes to the test's stderr). */
int ps_test_server_start(ps_test_server *s, unsigned shard, unsigned shards, uint16_t port,
                         const char *const *extra);
/* Starts `granary ARGS...` (args[0] is the subcommand, NULL-terminated) and waits as above for
 * its "listening on" line: for servers started with other flags (--coord). */
int ps_test_server_start_args(ps_test_server *s, const char *const *args);
/* Sends sig (0 = SIGTERM) and waits up to 20 s (then SIGKILL). Returns the exit status
 * (0..255), 128 + signal number when killed by a signal, or -1. */
int ps_test_server_stop(ps_test_server *s, int sig);
/* Waits for an already-signalled or exiting server; same return as stop. */
int ps_test_server_wait(ps_test_server *s, unsigned timeout_ms);

/* Starts n shards (0..n-1 of n) and writes "addr,addr,..." to list (cap bytes). */
int ps_test_cluster_start(ps_test_server *s, unsigned n, const char *const *extra, char *list,
                          size_t cap);
void ps_test_cluster_stop(ps_test_server *s, unsigned n);

/* Runs `granary ARGS...` to completion (up to 30 s) and returns its exit status; its stdout
 * and stderr are captured into out (NUL-terminated, truncated to cap). */
int ps_test_run_granary(const char *const *args, char *out, size_t cap);

/* A raw TCP connection to 127.0.0.1:port (for hand-made frames), with 10 s I/O timeouts. */
int ps_test_connect(uint16_t port);
/* The same with SO_RCVBUF set to rcvbuf bytes first (0: the default). */
int ps_test_connect_rcvbuf(uint16_t port, int rcvbuf);

/* A fresh temporary folder under /tmp (caller removes it with ps_test_rmdir). */
int ps_test_tmpdir(char *path, size_t cap);
void ps_test_rmdir(const char *path);

#endif
