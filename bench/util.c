/* Helpers shared by the benchmarks. */
#include "bench/bench.h"

#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

bool gr_bench_find_script(const char *env_var, const char *name, char *path, size_t cap)
{
    const char *env = getenv(env_var);
    if (env && access(env, R_OK) == 0) {
        snprintf(path, cap, "%s", env);
        return true;
    }
    snprintf(path, cap, "bench/%s", name);
    if (access(path, R_OK) == 0) return true;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return false;
    exe[n] = '\0';
    const char *dir = dirname(exe);
    const char *ups[] = {"/../bench/", "/../../bench/"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(path, cap, "%s%s%s", dir, ups[i], name);
        if (access(path, R_OK) == 0) return true;
    }
    return false;
}

int gr_bench_parse_port(const char *text, uint16_t *port)
{
    if (*text < '0' || *text > '9') return -1;
    char *end;
    errno = 0;
    unsigned long v = strtoul(text, &end, 10);
    if (*end == ',') end++; /* one entry of a "HOST:PORT,HOST:PORT" list */
    else while (*end == '\r' || *end == '\n') end++;
    if (errno || (*end && end[-1] != ',') || v == 0 || v > 65535) return -1;
    *port = (uint16_t)v;
    return 0;
}

int gr_bench_parse_double(const char *text, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || errno || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

/* A TCP connection to 127.0.0.1:port with TCP_NODELAY, or -1. */
int gr_bench_tcp_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}
