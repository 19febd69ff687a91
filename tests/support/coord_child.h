/* Test support: a coordinator member in its own process, so that a test can SIGKILL or
 * SIGSTOP it like a real shard or worker. The child opens the coordinator, registers with a
 * role and index, joins the election when asked, and reports every event as a line on a
 * pipe the test reads:
 *   "registered ID"  "session connected|suspended|expired R" (R: gr_coord_registered then)
 *   "leader 1|0"  "members N"  "writable 1|0" (every change of gr_coord_registered)
 *   "error MESSAGE"
 * Fork children before the test opens a coordinator itself (a forked child of a process
 * with threads could inherit a held lock). The child dies with the test (PR_SET_PDEATHSIG). */
#ifndef GRANARY_TEST_COORD_CHILD_H
#define GRANARY_TEST_COORD_CHILD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct coord_child {
    pid_t pid;
    int fd;          /* the read end of its report pipe */
    char buf[4096];  /* unread bytes */
    size_t len;
} coord_child;

typedef struct coord_child_opts {
    const char *spec;
    int role;                 /* gr_coord_role */
    int32_t index;
    const char *address;
    bool elect;
    uint32_t session_timeout_ms;
} coord_child_opts;

/* Forks the member. 0, or -1. */
int coord_child_start(coord_child *ch, const coord_child_opts *o);
/* Waits up to timeout_ms for a report line starting with prefix; copies the whole line into
 * line (may be NULL). Lines before it are dropped. 0 when seen, -1 on timeout or EOF. */
int coord_child_expect(coord_child *ch, const char *prefix, char *line, size_t cap,
                       unsigned timeout_ms);
/* SIGKILL, reap, close the pipe. A no-op for a child already killed. */
void coord_child_kill(coord_child *ch);

#endif
