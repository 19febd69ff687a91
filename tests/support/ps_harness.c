/* Test support for the parameter-server tests: child `granary server` processes on loopback,
 * raw sockets, temporary folders. Linked into every test binary; it only runs when called. */
#include "tests/support/ps_harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

const char *ps_test_granary_bin(void)
{
    static char path[512];
    const char *dir = getenv("GR_BUILD_DIR");
    snprintf(path, sizeof path, "%s/granary", dir && *dir ? dir : "build");
    return path;
}

/* Forks and execs granary with args; the child's stdout goes to a pipe returned in *out_fd
 * (stderr too when merge_stderr). */
static pid_t spawn(const char *const *args, int *out_fd, bool merge_stderr)
{
    /* Everything the child needs is prepared before fork: a multi-threaded parent's child may
     * only call async-signal-safe functions until exec. */
    size_t n = 0;
    while (args[n]) n++;
    char **argv = calloc(n + 2, sizeof *argv);
    if (!argv) return -1;
    argv[0] = (char *)ps_test_granary_bin();
    for (size_t i = 0; i < n; i++) argv[i + 1] = (char *)args[i];
    if (!getenv("GRANARY_LOG")) setenv("GRANARY_LOG", "warn", 0);
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        free(argv);
        return -1;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        free(argv);
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        dup2(p[1], 1);
        if (merge_stderr) dup2(p[1], 2);
        execv(argv[0], argv);
        static const char msg[] = "harness: cannot exec the granary binary\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(127);
    }
    free(argv);
    close(p[1]);
    *out_fd = p[0];
    return pid;
}

int ps_test_server_start(ps_test_server *s, unsigned shard, unsigned shards, uint16_t port,
                         const char *const *extra)
{
    memset(s, 0, sizeof *s);
    char listen[64], sh[16], shs[16];
    snprintf(listen, sizeof listen, "127.0.0.1:%u", port);
    snprintf(sh, sizeof sh, "%u", shard);
    snprintf(shs, sizeof shs, "%u", shards);
    const char *args[64] = {"server", "--listen", listen, "--shard", sh, "--shards", shs};
    size_t n = 7;
    for (size_t i = 0; extra && extra[i] && n < 63; i++) args[n++] = extra[i];
    args[n] = NULL;
    return ps_test_server_start_args(s, args);
}

int ps_test_server_start_args(ps_test_server *s, const char *const *args)
{
    memset(s, 0, sizeof *s);
    int fd;
    pid_t pid = spawn(args, &fd, false);
    if (pid < 0) {
        fprintf(stderr, "harness: cannot start a server: %s\n", strerror(errno));
        return -1;
    }
    /* With --metrics the server prints a second line, "metrics on port N". */
    unsigned want_lines = 1;
    for (size_t i = 0; args[i]; i++)
        if (!strcmp(args[i], "--metrics")) want_lines = 2;
    char line[256];
    size_t len = 0;
    uint64_t deadline = now_ms() + 20000;
    while (len < sizeof line - 1) {
        uint64_t t = now_ms();
        if (t >= deadline) break;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, (int)(deadline - t)) <= 0) break;
        ssize_t r = read(fd, line + len, sizeof line - 1 - len);
        if (r <= 0) break;
        len += (size_t)r;
        line[len] = '\0';
        unsigned lines = 0;
        for (const char *q = line; (q = strchr(q, '\n')); q++) lines++;
        if (lines >= want_lines) break;
    }
    close(fd);
    const char *mline = strstr(line, "\nmetrics on port ");
    if (mline) s->metrics_port = (uint16_t)atoi(mline + strlen("\nmetrics on port "));
    char *nl = strchr(line, '\n');
    if (nl) *nl = '\0';
    line[len] = '\0';
    const char *colon = strrchr(line, ':');
    if (strncmp(line, "listening on ", 13) != 0 || !colon) {
        fprintf(stderr, "harness: server did not start (said '%s')\n", line);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    s->pid = pid;
    s->port = (uint16_t)atoi(colon + 1);
    snprintf(s->addr, sizeof s->addr, "127.0.0.1:%u", s->port);
    return 0;
}

int ps_test_server_wait(ps_test_server *s, unsigned timeout_ms)
{
    if (s->pid <= 0) return -1;
    uint64_t deadline = now_ms() + timeout_ms;
    int st = 0;
    for (;;) {
        pid_t r = waitpid(s->pid, &st, WNOHANG);
        if (r == s->pid) break;
        if (r < 0) return -1;
        if (now_ms() >= deadline) {
            fprintf(stderr, "harness: server %d did not exit in %u ms; killing it\n", s->pid,
                    timeout_ms);
            kill(s->pid, SIGKILL);
            waitpid(s->pid, &st, 0);
            s->pid = 0;
            return -1;
        }
        usleep(2000);
    }
    s->pid = 0;
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return -1;
}

int ps_test_server_stop(ps_test_server *s, int sig)
{
    if (s->pid <= 0) return -1;
    kill(s->pid, sig ? sig : SIGTERM);
    return ps_test_server_wait(s, 20000);
}

int ps_test_cluster_start(ps_test_server *s, unsigned n, const char *const *extra, char *list,
                          size_t cap)
{
    size_t off = 0;
    if (cap) list[0] = '\0';
    for (unsigned i = 0; i < n; i++) {
        if (ps_test_server_start(&s[i], i, n, 0, extra) != 0) {
            ps_test_cluster_stop(s, i);
            return -1;
        }
        off += (size_t)snprintf(list + off, off < cap ? cap - off : 0, "%s%s", i ? "," : "",
                                s[i].addr);
    }
    return 0;
}

void ps_test_cluster_stop(ps_test_server *s, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        if (s[i].pid > 0) ps_test_server_stop(&s[i], SIGTERM);
}

int ps_test_run_granary(const char *const *args, char *out, size_t cap)
{
    int fd;
    pid_t pid = spawn(args, &fd, true);
    if (pid < 0) return -1;
    size_t len = 0;
    uint64_t deadline = now_ms() + 30000;
    for (;;) {
        uint64_t t = now_ms();
        if (t >= deadline) break;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, (int)(deadline - t)) <= 0) break;
        char tmp[4096];
        ssize_t r = read(fd, tmp, sizeof tmp);
        if (r <= 0) break;
        for (ssize_t i = 0; i < r && len + 1 < cap; i++) out[len++] = tmp[i];
    }
    if (cap) out[len] = '\0';
    close(fd);
    ps_test_server s = {.pid = pid};
    return ps_test_server_wait(&s, 10000);
}

int ps_test_connect(uint16_t port) { return ps_test_connect_rcvbuf(port, 0); }

int ps_test_connect_rcvbuf(uint16_t port, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    /* Before connect, so the window the peer sees is small from the first byte. */
    if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int ps_test_tmpdir(char *path, size_t cap)
{
    if (snprintf(path, cap, "/tmp/granary-test-XXXXXX") >= (int)cap) return -1;
    return mkdtemp(path) ? 0 : -1;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

void ps_test_rmdir(const char *path)
{
    if (path && !strncmp(path, "/tmp/", 5)) nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}
