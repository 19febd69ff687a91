/* The benchmarks' Redis helpers (bench ps and bench serve use Redis as their baseline): a
 * redis-server started on a free loopback port, and a reader of its RESP replies over one
 * connection. */
#ifndef GRANARY_BENCH_REDIS_H
#define GRANARY_BENCH_REDIS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* One connection's receive buffer: bytes [off, len) of buf are read and not yet consumed. */
typedef struct gr_redis_conn {
    int fd;
    char *buf;
    size_t len, off, cap;
} gr_redis_conn;

/* Receives more bytes (after dropping the consumed ones); -1 on EOF, error or a full buffer. */
int gr_redis_fill(gr_redis_conn *r);
/* The next line, its \r\n cut off (NUL-terminated in place), or NULL. */
char *gr_redis_line(gr_redis_conn *r);
/* Copies the next n bytes to out; -1 when the connection ends first. */
int gr_redis_read(gr_redis_conn *r, void *out, size_t n);
/* Consumes the next n bytes; -1 when the connection ends first. */
int gr_redis_skip(gr_redis_conn *r, size_t n);
/* Sends all n bytes; -1 on error. */
int gr_redis_send(int fd, const void *p, size_t n);

/* Starts redis-server (no persistence, killed with this process) on a free loopback port and
 * waits until it answers PING: its pid and *port, or -1 when it cannot be started. */
pid_t gr_redis_start(uint16_t *port);
/* The redis-server also listens on a Unix socket (no TCP stack, no congestion control: the
 * transport that serves Redis best on one machine); its path, and a connection to it (-1 when
 * it cannot connect). */
void gr_redis_unix_path(pid_t pid, char *out, size_t cap);
int gr_redis_unix_connect(pid_t pid);
/* SIGTERM, then waits for it. pid <= 0 is a no-op. */
void gr_redis_stop(pid_t pid);

#endif
