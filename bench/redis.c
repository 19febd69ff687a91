/* The benchmarks' Redis helpers (bench/redis.h): one copy for bench ps and bench serve. */
#include "bench/redis.h"

#include "bench/bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

int gr_redis_fill(gr_redis_conn *r)
{
    if (r->off) {
        memmove(r->buf, r->buf + r->off, r->len - r->off);
        r->len -= r->off;
        r->off = 0;
    }
    if (r->len == r->cap) return -1;
    ssize_t n = recv(r->fd, r->buf + r->len, r->cap - r->len, 0);
    if (n <= 0) return -1;
    r->len += (size_t)n;
    return 0;
}

char *gr_redis_line(gr_redis_conn *r)
{
    for (;;) {
        char *nl = memchr(r->buf + r->off, '\n', r->len - r->off);
        if (nl) {
            char *line = r->buf + r->off;
            *nl = '\0';
            if (nl > line && nl[-1] == '\r') nl[-1] = '\0';
            r->off = (size_t)(nl + 1 - r->buf);
            return line;
        }
        if (gr_redis_fill(r)) return NULL;
    }
}

int gr_redis_read(gr_redis_conn *r, void *out, size_t n)
{
    while (r->len - r->off < n)
        if (gr_redis_fill(r)) return -1;
    memcpy(out, r->buf + r->off, n);
    r->off += n;
    return 0;
}

int gr_redis_skip(gr_redis_conn *r, size_t n)
{
    while (r->len - r->off < n) {
        n -= r->len - r->off;
        r->off = r->len;
        if (gr_redis_fill(r)) return -1;
    }
    r->off += n;
    return 0;
}

int gr_redis_send(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* A port that was free a moment ago (bound to port 0, then closed), or 0. */
static uint16_t free_port(void)
{
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof a;
    uint16_t port = 0;
    if (lfd >= 0 && !bind(lfd, (struct sockaddr *)&a, sizeof a) &&
        !getsockname(lfd, (struct sockaddr *)&a, &sl))
        port = ntohs(a.sin_port);
    if (lfd >= 0) close(lfd);
    return port;
}

void gr_redis_unix_path(pid_t pid, char *out, size_t cap)
{
    snprintf(out, cap, "/tmp/granary-redis-%d.sock", (int)pid);
}

int gr_redis_unix_connect(pid_t pid)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    gr_redis_unix_path(pid, a.sun_path, sizeof a.sun_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

pid_t gr_redis_start(uint16_t *port_out)
{
    /* The port can be taken between the probe and redis-server's bind: a few attempts. */
    for (int attempt = 0; attempt < 5; attempt++) {
        uint16_t port = free_port();
        if (!port) return -1;
        char ps[16];
        snprintf(ps, sizeof ps, "%u", port);
        pid_t parent = getpid(), pid = fork();
        if (pid < 0) return -1;
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(127);
            if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr)) _exit(127);
            char unix_path[108];
            gr_redis_unix_path(getpid(), unix_path, sizeof unix_path);
            execlp("redis-server", "redis-server", "--port", ps, "--bind", "127.0.0.1", "--save",
                   "", "--appendonly", "no", "--protected-mode", "no", "--unixsocket", unix_path,
                   "--unixsocketperm", "700", (char *)NULL);
            _exit(127);
        }
        for (int i = 0; i < 300; i++) {
            int s = gr_bench_tcp_connect(port);
            if (s >= 0) {
                char pong[8] = {0};
                bool up = gr_redis_send(s, "*1\r\n$4\r\nPING\r\n", 14) == 0 &&
                          recv(s, pong, 7, 0) > 0 && !strncmp(pong, "+PONG", 5);
                close(s);
                if (up) {
                    *port_out = port;
                    return pid;
                }
            }
            if (waitpid(pid, NULL, WNOHANG) == pid) break; /* exited: port taken? */
            usleep(10000);
        }
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return -1;
}

void gr_redis_stop(pid_t pid)
{
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    char unix_path[108];
    gr_redis_unix_path(pid, unix_path, sizeof unix_path);
    unlink(unix_path); /* redis-server removes it on SIGTERM; not when it was killed */
}
