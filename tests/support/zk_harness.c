/* Test support: a ZooKeeper server (Debian's `zookeeper` package) for the coord tests. See
 * zk_harness.h. The java command line is the one /work/shared/notes/coordination.md found to
 * work: the jar's manifest carries its class path. */
#include "tests/support/zk_harness.h"
#include "tests/support/ps_harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ZK_JAR "/usr/share/java/zookeeper.jar"
#define SLF4J_JAR "/usr/share/java/slf4j-simple.jar"

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static const char *java_bin(void)
{
    static const char *const cands[] = {"/usr/bin/java", "/usr/lib/jvm/default-java/bin/java"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++)
        if (access(cands[i], X_OK) == 0) return cands[i];
    return NULL;
}

bool zk_test_available(void) { return java_bin() && access(ZK_JAR, R_OK) == 0; }

static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    uint16_t port = 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

int zk_test_4lw(const zk_test_server *z, const char *word, char *out, size_t cap)
{
    if (cap) out[0] = '\0';
    int fd = ps_test_connect(z->port);
    if (fd < 0) return -1;
    size_t len = 0;
    if (write(fd, word, strlen(word)) == (ssize_t)strlen(word)) {
        for (;;) {
            struct pollfd p = {fd, POLLIN, 0};
            if (poll(&p, 1, 2000) <= 0) break;
            char tmp[1024];
            ssize_t r = read(fd, tmp, sizeof tmp);
            if (r <= 0) break;
            for (ssize_t i = 0; i < r && len + 1 < cap; i++) out[len++] = tmp[i];
        }
    }
    close(fd);
    if (cap) out[len] = '\0';
    return len ? 0 : -1;
}

static int write_config(zk_test_server *z)
{
    char path[300], data[300];
    snprintf(data, sizeof data, "%s/data", z->dir);
    if (mkdir(data, 0700) != 0 && errno != EEXIST) return -1;
    snprintf(path, sizeof path, "%s/zoo.cfg", z->dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    /* tickTime 500: sessions of 1..10 s; no admin server (it would take port 8080). */
    fprintf(f, "tickTime=500\ninitLimit=10\nsyncLimit=5\ndataDir=%s\nclientPort=%u\n"
               "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
               "4lw.commands.whitelist=ruok,srvr,mntr,stat\nmaxClientCnxns=0\n"
               "snapCount=1000\nautopurge.purgeInterval=0\n",
            data, z->port);
    return fclose(f) == 0 ? 0 : -1;
}

static int spawn_java(zk_test_server *z)
{
    const char *java = java_bin();
    char cfg[300], log[300], cp[256];
    snprintf(cfg, sizeof cfg, "%s/zoo.cfg", z->dir);
    snprintf(log, sizeof log, "%s/zk.log", z->dir);
    snprintf(cp, sizeof cp, "%s%s", ZK_JAR, access(SLF4J_JAR, R_OK) == 0 ? ":" SLF4J_JAR : "");
    /* A small, quickly started JVM: eight test suites may run one each on two cores. */
    char *argv[] = {(char *)java, "-Xmx96m", "-Xss512k", "-XX:+UseSerialGC",
                    "-XX:TieredStopAtLevel=1", "-Xshare:auto",
                    "-Dzookeeper.admin.enableServer=false", "-cp", cp,
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain", cfg, NULL};
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0) dup2(null, 0);
        execv(argv[0], argv);
        _exit(127);
    }
    z->pid = pid;
    return 0;
}

static int wait_ready(zk_test_server *z)
{
    uint64_t deadline = now_ms() + 30000;
    while (now_ms() < deadline) {
        int st;
        if (waitpid(z->pid, &st, WNOHANG) == z->pid) {
            fprintf(stderr, "zk harness: ZooKeeper exited at start (log: %s/zk.log)\n", z->dir);
            z->pid = 0;
            return -1;
        }
        char reply[64];
        if (zk_test_4lw(z, "ruok", reply, sizeof reply) == 0 && !strncmp(reply, "imok", 4))
            return 0;
        usleep(50000);
    }
    fprintf(stderr, "zk harness: ZooKeeper did not answer on port %u in 30 s (log: %s/zk.log)\n",
            z->port, z->dir);
    zk_test_stop(z);
    return -1;
}

int zk_test_start(zk_test_server *z)
{
    memset(z, 0, sizeof *z);
    if (!zk_test_available()) {
        fprintf(stderr, "zk harness: java or %s is missing\n", ZK_JAR);
        return -1;
    }
    if (ps_test_tmpdir(z->dir, sizeof z->dir) != 0) return -1;
    z->port = free_port();
    snprintf(z->hosts, sizeof z->hosts, "127.0.0.1:%u", z->port);
    if (!z->port || write_config(z) != 0 || spawn_java(z) != 0) {
        fprintf(stderr, "zk harness: cannot set up ZooKeeper in %s: %s\n", z->dir,
                strerror(errno));
        ps_test_rmdir(z->dir);
        return -1;
    }
    return wait_ready(z);
}

int zk_test_stop(zk_test_server *z)
{
    if (z->pid <= 0) return 0;
    kill(z->pid, SIGTERM);
    uint64_t deadline = now_ms() + 10000;
    int st;
    while (waitpid(z->pid, &st, WNOHANG) == 0) {
        if (now_ms() >= deadline) {
            kill(z->pid, SIGKILL);
            waitpid(z->pid, &st, 0);
            break;
        }
        usleep(20000);
    }
    z->pid = 0;
    return 0;
}

int zk_test_restart(zk_test_server *z)
{
    zk_test_stop(z);
    if (spawn_java(z) != 0) return -1;
    return wait_ready(z);
}

void zk_test_destroy(zk_test_server *z)
{
    zk_test_stop(z);
    if (z->dir[0]) ps_test_rmdir(z->dir);
    z->dir[0] = '\0';
}

void zk_test_url(const zk_test_server *z, const char *path, char *buf, size_t cap)
{
    snprintf(buf, cap, "zk://%s%s", z->hosts, path);
}
