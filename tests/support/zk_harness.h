/* Test support: Debian's ZooKeeper server (`zookeeper` package, java) on a free loopback
 * port with its own temporary data folder and config (tickTime 500 ms, so session timeouts
 * of 1-10 s are allowed and detection takes seconds). It can be stopped and started again on
 * the same port with the same data (sessions and znodes survive, as in a real restart). The
 * java process dies with the test process (PR_SET_PDEATHSIG), so a crashed test leaves none.
 * Its log goes to DIR/zk.log. */
#ifndef GRANARY_TEST_ZK_HARNESS_H
#define GRANARY_TEST_ZK_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct zk_test_server {
    pid_t pid;          /* 0 while stopped */
    uint16_t port;
    char dir[256];      /* temporary folder: zoo.cfg, data/, zk.log */
    char hosts[64];     /* "127.0.0.1:PORT" */
} zk_test_server;

/* True when java and the ZooKeeper jar are installed (tests skip otherwise). */
bool zk_test_available(void);
/* Makes the folder and config, starts the server on a free port and waits (up to 30 s) until
 * it answers "imok" to "ruok". Returns 0, or -1 with the reason on stderr. */
int zk_test_start(zk_test_server *z);
/* Stops it (SIGTERM, then SIGKILL after 10 s) and keeps the folder. */
int zk_test_stop(zk_test_server *z);
/* Starts it again on the same port with the same data; waits as zk_test_start does. */
int zk_test_restart(zk_test_server *z);
/* Stops it and removes the folder. */
void zk_test_destroy(zk_test_server *z);
/* "zk://127.0.0.1:PORT/PATH" into buf. */
void zk_test_url(const zk_test_server *z, const char *path, char *buf, size_t cap);
/* Sends a four-letter word ("ruok", "srvr", "mntr") and reads the reply into out. 0 on
 * success, -1 when nothing answered. */
int zk_test_4lw(const zk_test_server *z, const char *word, char *out, size_t cap);

#endif
