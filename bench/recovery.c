/* `granary bench recovery`: how long a coordinated job stands still when a shard is killed.
 * A ZooKeeper (started here on a free loopback port with `java`, or --zk HOSTS), two shards
 * and a standby (`granary server --coord` processes), a table filled with R rows per shard
 * (Adagrad, dim 16) and checkpointed; then a worker thread pushes small steps without pause,
 * the shard serving index 1 is killed with SIGKILL, and the time from the kill to the
 * worker's first applied step after it is split into: detect (kill -> the standby sees the
 * shard's member vanish: the session timeout), claim (-> its compare-and-set won), restore
 * (-> its rows are loaded and it serves), resume (-> the worker's next step applied). The
 * baseline is `cp` of the lost shard's checkpoint file (the bytes the restore reads) on the
 * same disk, in the same run, in the same page cache state (the save wrote it seconds before
 * the restore read it), without fsync on either side, the median of three runs; and, kinder,
 * `cat` of it to /dev/null (reading alone, as the restore does, but without building tables).
 * The standby's CPU time over the recovery tells a restore that computes from one that waits
 * for a CPU on a loaded machine. The standby is warm (docs/coord.md, "Warm standby"): the kill
 * comes once it has prepared for the checkpoint, and what that holds and cost is reported
 * beside the restore. */
#include "bench/bench.h"
#include "cli/opts.h"
#include "granary/client.h"
#include "granary/coord.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#define DIM 16
#define STEP_KEYS 256
#define CP_RUNS 3

static double median3(const double v[3])
{
    double a = v[0], b = v[1], c = v[2];
    return a > b ? (b > c ? b : a > c ? c : a) : (a > c ? a : b > c ? c : b);
}

/* CPU seconds (user + system) a process has used so far, from /proc; 0 when unknown. */
static double proc_cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

#define RECOVERY_BENCH_OPTIONS(X)                                                              \
    X(RB_JSON, "json", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL, "print a final JSON line")    \
    X(RB_FULL, "full", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,                              \
      "10M rows on the lost shard unless --rows")                                              \
    X(RB_ROWS, "rows", GR_CLI_SIZE, NULL, 1000, 4294967295.0, NULL, "N", NULL,                 \
      "rows on each shard (default 1M; --full 10M)")                                           \
    X(RB_SESSION, "session-timeout", GR_CLI_INT, NULL, 1000, 60000, NULL, "MS", "2000",        \
      "the shards' coordinator session timeout (detection takes about this)")                 \
    X(RB_ZK, "zk", GR_CLI_STR, NULL, 0, 0, NULL, "HOST:PORT", NULL,                             \
      "use this ZooKeeper instead of starting one")                                           \
    X(RB_DIR, "dir", GR_CLI_STR, NULL, 0, 0, NULL, "PATH", NULL,                                \
      "where the checkpoint goes (default $TMPDIR or /tmp); removed afterwards")                \
    X(RB_WARM_MAX, "standby-warm-max", GR_CLI_SIZE, NULL, 0, 1e18, NULL, "BYTES", NULL,          \
      "passed to the standby (0: not warm, the restore faults its memory in)")

enum { RECOVERY_BENCH_OPTIONS(GR_CLI_ENUM) RB_COUNT };
static const gr_cli_opt recovery_bench_opts[] = {RECOVERY_BENCH_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec recovery_bench_spec = {
    .command = "bench recovery",
    .synopsis = "granary bench recovery [--json] [--full] [--rows N] [--session-timeout MS]\n"
                "                       [--zk HOST:PORT] [--dir PATH] [--standby-warm-max BYTES]\n"
                "  2 shards + a standby under ZooKeeper; kill -9 the shard of index 1 while a\n"
                "  worker pushes: kill -> first applied step, split into detect, claim, restore,\n"
                "  resume; baseline: cp of the lost shard's checkpoint file",
    .opts = recovery_bench_opts,
    .n_opts = RB_COUNT,
};

typedef struct bench {
    char root[1024], exe[4096], zk_hosts[128], url[300];
    pid_t zk_pid, pid[3];
    uint16_t port[3];
    uint32_t session_ms;
    char warm_max[32]; /* --standby-warm-max for the standby, "" = its default */
    gr_coord *coord;
} bench;

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static pid_t spawn(bench *b, char *const argv[], int out_fd)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        if (out_fd >= 0) dup2(out_fd, 1);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    (void)b;
    return pid;
}

static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    uint16_t port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

static bool zk_ok(uint16_t port)
{
    int fd = gr_bench_tcp_connect(port);
    if (fd < 0) return false;
    char buf[8] = {0};
    bool ok = write(fd, "ruok", 4) == 4 && read(fd, buf, 4) == 4 && !memcmp(buf, "imok", 4);
    close(fd);
    return ok;
}

/* Debian's ZooKeeper on a free loopback port (tickTime 500 ms, so session timeouts of 1-10 s
 * are granted as asked). */
static int start_zk(bench *b)
{
    const char *jar = "/usr/share/java/zookeeper.jar";
    if (access(jar, R_OK) != 0)
        return gr_seterr(GR_ENOENT, "%s is missing (Debian's zookeeper package): give --zk", jar);
    uint16_t port = free_port();
    char cfg[1100], data[1100];
    snprintf(data, sizeof data, "%s/zk", b->root);
    snprintf(cfg, sizeof cfg, "%s/zoo.cfg", b->root);
    mkdir(data, 0755);
    FILE *f = fopen(cfg, "w");
    if (!f) return gr_seterr(GR_EIO, "cannot write %s", cfg);
    fprintf(f, "tickTime=500\ndataDir=%s\nclientPort=%u\nclientPortAddress=127.0.0.1\n"
               "admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,mntr\n",
            data, port);
    fclose(f);
    char *argv[] = {"/usr/bin/java", "-cp", (char *)jar,
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain", cfg, NULL};
    b->zk_pid = spawn(b, argv, -1);
    for (int i = 0; i < 300; i++) {
        if (zk_ok(port)) {
            snprintf(b->zk_hosts, sizeof b->zk_hosts, "127.0.0.1:%u", port);
            return GR_OK;
        }
        gr_sleep_ms(100);
    }
    return gr_seterr(GR_ETIMEDOUT, "ZooKeeper did not answer on port %u within 30 s", port);
}

static int start_server(bench *b, int i)
{
    char st[16];
    snprintf(st, sizeof st, "%u", b->session_ms);
    bool warm = i == 2 && b->warm_max[0];
    char *argv[] = {b->exe, "server", "--coord", b->url, "--shards", "2", "--threads", "2",
                    "--session-timeout", st, "--ckpt-root", b->root, "--ckpt-dir", "ck",
                    i == 2 ? "--standby" : NULL, warm ? "--standby-warm-max" : NULL,
                    warm ? b->warm_max : NULL, NULL};
    int p[2];
    if (pipe2(p, O_CLOEXEC)) return gr_seterr(GR_EIO, "pipe");
    b->pid[i] = spawn(b, argv, p[1]);
    close(p[1]);
    char line[256];
    size_t len = 0;
    while (len < sizeof line - 1) {
        struct pollfd pf = {p[0], POLLIN, 0};
        if (poll(&pf, 1, 20000) <= 0) break;
        ssize_t r = read(p[0], line + len, sizeof line - 1 - len);
        if (r <= 0) break;
        len += (size_t)r;
        line[len] = '\0';
        if (strchr(line, '\n')) break;
    }
    close(p[0]);
    line[len] = '\0';
    line[strcspn(line, "\n")] = '\0';
    const char *colon = strrchr(line, ':');
    if (strncmp(line, "listening on ", 13) || !colon || gr_bench_parse_port(colon + 1, &b->port[i]))
        return gr_seterr(GR_EIO, "a shard did not start (said '%s')", line);
    return GR_OK;
}

/* The layout once both indexes are served (and index 1 by `addr1` when given). */
static int wait_layout(bench *b, const char *addr1, gr_coord_layout *l, unsigned ms)
{
    for (unsigned t = 0; t < ms; t += 20) {
        memset(l, 0, sizeof *l);
        if (gr_coord_layout_get(b->coord, l) == 0 && l->n_shards == 2 && l->shards[0].address[0] &&
            l->shards[1].address[0] && (!addr1 || !strcmp(l->shards[1].address, addr1)))
            return GR_OK;
        gr_coord_layout_fini(l);
        gr_sleep_ms(20);
    }
    return gr_seterr(GR_ETIMEDOUT, "the layout did not settle within %u ms", ms);
}

static uint64_t key_of(uint64_t i)
{
    uint64_t z = i + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Creates rows by pulling 2 x rows keys (half land on each shard). */
static int fill(gr_client *c, uint64_t rows)
{
    const size_t B = 65536;
    uint64_t *keys = malloc(B * 8);
    float *out = malloc(B * DIM * 4);
    int rc = keys && out ? GR_OK : gr_seterr(GR_ENOMEM, "out of memory");
    for (uint64_t i = 0; !rc && i < 2 * rows; i += B) {
        size_t n = 2 * rows - i < B ? (size_t)(2 * rows - i) : B;
        for (size_t k = 0; k < n; k++) keys[k] = key_of(i + k);
        gr_client_batch bt = {1, DIM, n, keys, out, NULL, GR_CLIENT_BATCH_UNIQUE};
        rc = gr_client_pull_many(c, &bt, 1, 0);
    }
    free(keys);
    free(out);
    return rc;
}

/* The worker: small pushes without pause; after a failure it re-reads the layout, points its
 * connections at the new addresses and tries again. Records the last step applied before the
 * kill and the first one after it. */
typedef struct worker {
    bench *b;
    gr_client *c;
    uint64_t rows;
    atomic_bool stop;
    atomic_uint_fast64_t kill_ms; /* 0 until the kill */
    uint64_t first_after_ms, steps, failures;
} worker;

static void follow_layout(worker *w)
{
    gr_coord_layout l;
    memset(&l, 0, sizeof l);
    if (gr_coord_layout_get(w->b->coord, &l)) return;
    for (uint32_t i = 0; i < l.n_shards && i < gr_client_shards(w->c); i++)
        if (l.shards[i].address[0] && strcmp(l.shards[i].address, gr_client_shard_addr(w->c, i)))
            gr_client_set_shard_addr(w->c, i, l.shards[i].address);
    gr_client_set_epoch(w->c, (uint32_t)l.epoch);
    gr_coord_layout_fini(&l);
}

/* What a coordinated worker does on GR_ESTALE: a shard behind the layout (or restoring) is
 * retried shortly at the layout's epoch; a moved one fails the push, and the worker follows. */
static int on_stale(void *ctx, gr_client *c, uint32_t shard, uint32_t epoch, const char *msg)
{
    (void)shard;
    (void)epoch;
    (void)msg;
    bench *b = ctx;
    gr_coord_layout l;
    memset(&l, 0, sizeof l);
    if (gr_coord_layout_get(b->coord, &l)) return GR_EAGAIN;
    int rc = GR_OK;
    for (uint32_t i = 0; i < l.n_shards && i < gr_client_shards(c); i++)
        if (strcmp(l.shards[i].address, gr_client_shard_addr(c, i))) rc = GR_ESTALE;
    if (!rc) gr_client_set_epoch(c, (uint32_t)l.epoch);
    gr_coord_layout_fini(&l);
    if (!rc) gr_sleep_ms(10);
    return rc;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    uint64_t keys[STEP_KEYS];
    float g[STEP_KEYS * DIM];
    for (size_t i = 0; i < STEP_KEYS * DIM; i++) g[i] = 1e-3f;
    uint64_t n = 0;
    while (!atomic_load(&w->stop)) {
        for (size_t k = 0; k < STEP_KEYS; k++) keys[k] = key_of((n * STEP_KEYS + k) % (2 * w->rows));
        n++;
        /* Only a step sent after the kill counts as the first one after it. */
        uint64_t killed = atomic_load(&w->kill_ms);
        int rc = gr_client_push(w->c, 1, DIM, keys, STEP_KEYS, g);
        if (rc) {
            w->failures++;
            follow_layout(w);
            gr_sleep_ms(5);
            continue;
        }
        w->steps++;
        if (killed && !w->first_after_ms) {
            w->first_after_ms = wall_ms();
            break;
        }
    }
    return NULL;
}

static double num(const cJSON *o, const char *k)
{
    return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

/* A warm standby prepares for the newest checkpoint while it waits (docs/coord.md, "Warm
 * standby"), as it would have for minutes in a real job: the kill comes once the standby
 * says it is ready for checkpoint `name` (at most 60 s), so the restore measured is the one
 * a job sees. Returns the wait in ms; -1 when the standby does not prepare (warm off, or a
 * build without it). */
static double wait_warm(bench *b, const char *name)
{
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", b->port[2]);
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = addr;
    gr_client *c = NULL;
    if (gr_client_create(&cc, &c)) return -1;
    double t0 = gr_now_s(), waited = -1;
    while (gr_now_s() - t0 < 60) {
        char *txt = NULL;
        if (gr_client_stats(c, 0, &txt)) break;
        cJSON *root = cJSON_Parse(txt);
        free(txt);
        const cJSON *co = cJSON_GetObjectItemCaseSensitive(root, "coord");
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(co, "warm");
        const cJSON *ck = cJSON_GetObjectItemCaseSensitive(w, "checkpoint");
        bool off = !w || cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(w, "enabled"));
        bool ready = cJSON_IsString(ck) && !strcmp(ck->valuestring, name);
        cJSON_Delete(root);
        if (off) break;
        if (ready) {
            waited = (gr_now_s() - t0) * 1e3;
            break;
        }
        gr_sleep_ms(50);
    }
    gr_client_destroy(c);
    return waited;
}

static int stop_all(bench *b)
{
    for (int i = 0; i < 3; i++)
        if (b->pid[i] > 0) {
            kill(b->pid[i], SIGTERM);
            waitpid(b->pid[i], NULL, 0);
        }
    if (b->zk_pid > 0) {
        kill(b->zk_pid, SIGTERM);
        waitpid(b->zk_pid, NULL, 0);
    }
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", b->root);
    return system(cmd);
}

int gr_bench_recovery(int argc, char **argv)
{
    gr_cli_value v[RB_COUNT];
    gr_cli_parsed parsed;
    int exit_now = gr_cli_parse_or_exit(&recovery_bench_spec, argc, argv, v, &parsed);
    gr_cli_parsed_fini(&parsed);
    if (exit_now >= 0) return exit_now;
    bool json = v[RB_JSON].b;
    uint64_t rows = v[RB_ROWS].u ? v[RB_ROWS].u : v[RB_FULL].b ? 10000000ull : 1000000ull;
    bench b;
    memset(&b, 0, sizeof b);
    b.session_ms = (uint32_t)v[RB_SESSION].i;
    if (v[RB_WARM_MAX].given)
        snprintf(b.warm_max, sizeof b.warm_max, "%llu", (unsigned long long)v[RB_WARM_MAX].u);
    const char *base = v[RB_DIR].s ? v[RB_DIR].s : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(b.root, sizeof b.root, "%s/granary-bench-recovery-%d", base, (int)getpid());
    ssize_t n = readlink("/proc/self/exe", b.exe, sizeof b.exe - 1);
    if (n <= 0 || mkdir(b.root, 0755) != 0) {
        fprintf(stderr, "granary bench recovery: cannot create %s\n", b.root);
        return 1;
    }
    b.exe[n] = '\0';
    setenv("GRANARY_LOG", "error", 0);
    int rc = GR_OK;
    gr_client *c = NULL;
    worker w;
    memset(&w, 0, sizeof w);
    if (v[RB_ZK].s) snprintf(b.zk_hosts, sizeof b.zk_hosts, "%s", v[RB_ZK].s);
    else rc = start_zk(&b);
    snprintf(b.url, sizeof b.url, "zk://%s/granary-bench/recovery-%d", b.zk_hosts, (int)getpid());
    for (int i = 0; !rc && i < 3; i++) rc = start_server(&b, i);
    if (!rc) rc = gr_coord_open(b.url, NULL, &b.coord);
    gr_coord_layout l;
    memset(&l, 0, sizeof l);
    if (!rc) rc = wait_layout(&b, NULL, &l, 20000);
    char list[600] = "";
    if (!rc) rc = gr_coord_layout_servers(&l, list, sizeof list);
    if (!rc) {
        gr_client_config cc;
        gr_client_config_default(&cc);
        cc.servers = list;
        cc.connect_timeout_ms = 500;
        cc.request_timeout_ms = 120000;
        rc = gr_client_create(&cc, &c);
    }
    if (!rc) {
        gr_client_set_epoch(c, (uint32_t)l.epoch);
        gr_client_set_stale_hook(c, on_stale, &b);
    }
    char spec[256];
    snprintf(spec, sizeof spec, "{\"name\":\"bench\",\"id\":1,\"dim\":%d,\"seed\":1,"
             "\"optimizer\":{\"kind\":\"adagrad\",\"lr\":0.05}}", DIM);
    if (!rc) rc = gr_client_create_table(c, spec);
    double t0 = gr_now_s();
    if (!rc) rc = fill(c, rows);
    if (!rc) fprintf(stderr, "filled %" PRIu64 " rows per shard in %.1f s\n", rows, gr_now_s() - t0);
    gr_client_ckpt_opts co;
    memset(&co, 0, sizeof co);
    co.root = "ck";
    co.step = 1;
    gr_client_ckpt_info ci;
    if (!rc) rc = gr_client_ckpt_save(c, &co, &ci);
    /* The victim: the process serving index 1. */
    int victim = -1;
    for (int i = 0; !rc && i < 2; i++) {
        char a[64];
        snprintf(a, sizeof a, "127.0.0.1:%u", b.port[i]);
        if (!strcmp(l.shards[1].address, a)) victim = i;
    }
    if (!rc && victim < 0) rc = gr_seterr(GR_EINVAL, "no shard process serves index 1");
    gr_coord_layout_fini(&l);
    double warm_wait_ms = !rc ? wait_warm(&b, ci.name) : -1;
    pthread_t th;
    bool started = false;
    uint64_t kill_ms = 0;
    double standby_cpu0 = 0, standby_cpu1 = 0;
    if (!rc) {
        w.b = &b;
        w.c = c;
        w.rows = rows;
        started = pthread_create(&th, NULL, worker_main, &w) == 0;
        gr_sleep_ms(500); /* the job is running */
        standby_cpu0 = proc_cpu_s(b.pid[2]);
        kill_ms = wall_ms();
        kill(b.pid[victim], SIGKILL);
        atomic_store(&w.kill_ms, kill_ms);
        waitpid(b.pid[victim], NULL, 0);
        b.pid[victim] = 0;
        for (int i = 0; i < 1200 && !w.first_after_ms; i++) gr_sleep_ms(100); /* 120 s */
        atomic_store(&w.stop, true);
        pthread_join(th, NULL);
        standby_cpu1 = proc_cpu_s(b.pid[2]);
        started = false;
        if (!w.first_after_ms) rc = gr_seterr(GR_ETIMEDOUT, "no step was applied in 120 s after the kill");
    }
    (void)started;
    /* The standby's account of the takeover. */
    cJSON *root = NULL;
    const cJSON *co_j = NULL;
    if (!rc) {
        char *txt = NULL;
        rc = gr_client_stats(c, 1, &txt);
        root = rc ? NULL : cJSON_Parse(txt);
        free(txt);
        co_j = cJSON_GetObjectItemCaseSensitive(root, "coord");
        if (!rc && (!co_j || num(co_j, "takeovers") < 1))
            rc = gr_seterr(GR_EINVAL, "shard 1 reports no takeover");
    }
    /* The baseline: cp of the lost shard's file of the checkpoint, the median of three runs
     * (one cp of a warm file takes tens of milliseconds: a single run is at the mercy of
     * whatever else the machine does in that moment). Same file, same page cache state as
     * the restore (written by the save seconds before, read by the restore). */
    double cp_s = 0, cat_s = 0, file_bytes = 0;
    if (!rc) {
        char src[1400], dst[1400], cmd[3000];
        snprintf(src, sizeof src, "%s/ck/%s/shard-00001-of-00002.gck", b.root, ci.name);
        snprintf(dst, sizeof dst, "%s/cp-baseline.bin", b.root);
        struct stat st;
        if (stat(src, &st) == 0) file_bytes = (double)st.st_size;
        double cps[CP_RUNS], cats[CP_RUNS];
        for (int k = 0; !rc && k < CP_RUNS; k++) {
            snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, dst);
            double c0 = gr_now_s();
            if (system(cmd) != 0) rc = gr_seterr(GR_EIO, "%s failed", cmd);
            cps[k] = gr_now_s() - c0;
            unlink(dst);
            /* A second, kinder baseline: reading the file alone (no copy written). */
            snprintf(cmd, sizeof cmd, "cat '%s' > /dev/null", src);
            c0 = gr_now_s();
            if (!rc && system(cmd) != 0) rc = gr_seterr(GR_EIO, "%s failed", cmd);
            cats[k] = gr_now_s() - c0;
        }
        cp_s = median3(cps);
        cat_s = median3(cats);
    }
    int status = 1;
    if (!rc) {
        double lost = num(co_j, "lost_seen_ms"), claimed = num(co_j, "claimed_ms");
        double serving = num(co_j, "serving_ms"), restore = num(co_j, "restore_ms");
        double rows_restored = num(co_j, "rows_restored");
        double detect_ms = lost - (double)kill_ms, claim_ms = claimed - lost;
        double restore_total_ms = serving - claimed;
        double resume_ms = (double)w.first_after_ms - serving;
        double total_ms = (double)w.first_after_ms - (double)kill_ms;
        double restore_bps = restore > 0 ? file_bytes / (restore / 1e3) : 0;
        double cp_bps = cp_s > 0 ? file_bytes / cp_s : 0;
        double ratio = cp_bps > 0 ? restore_bps / cp_bps : 0;
        printf("recovery of a killed shard (%.0f rows on it, %.1f MB checkpoint file, session "
               "timeout %u ms)\n", rows_restored, file_bytes / 1e6, b.session_ms);
        printf("  %-40s %9.0f ms\n", "detect (kill -> member gone)", detect_ms);
        printf("  %-40s %9.0f ms\n", "claim (-> compare-and-set won)", claim_ms);
        printf("  %-40s %9.0f ms  (load %.0f ms, %.0f MB/s)\n", "restore (-> serving)",
               restore_total_ms, restore, restore_bps / 1e6);
        double standby_cpu_ms = (standby_cpu1 - standby_cpu0) * 1e3;
        printf("  %-40s %9.0f ms  (CPU time of the standby from the kill to the step)\n",
               "  standby CPU", standby_cpu_ms);
        const cJSON *wj = cJSON_GetObjectItemCaseSensitive(co_j, "warm");
        double warm_bytes = wj ? num(wj, "bytes_at_claim") : 0, warm_ms = wj ? num(wj, "prepare_ms") : 0;
        double warm_cpu_ms = wj ? num(wj, "prepare_cpu_ms") : 0, warm_adopted = wj ? num(wj, "adopted") : 0;
        printf("  %-40s %9.0f MB  (prefaulted before the kill in %.0f ms, %.0f ms CPU; %.0f "
               "tables adopted)\n", "  standby memory held (warm)", warm_bytes / 1e6, warm_ms,
               warm_cpu_ms, warm_adopted);
        printf("  %-40s %9.0f ms\n", "resume (-> first applied step)", resume_ms);
        printf("  %-40s %9.0f ms  (target <= %u + restore + 1000)\n", "total (kill -> step)",
               total_ms, b.session_ms);
        printf("  %-40s %9.0f ms  %.0f MB/s; restore at %.2fx cp\n",
               "baseline: cp of the same file (median of 3)", cp_s * 1e3, cp_bps / 1e6, ratio);
        double cat_bps = cat_s > 0 ? file_bytes / cat_s : 0;
        printf("  %-40s %9.0f ms  %.0f MB/s; restore at %.2fx cat\n",
               "baseline: cat of the file > /dev/null", cat_s * 1e3, cat_bps / 1e6,
               cat_bps > 0 ? restore_bps / cat_bps : 0);
        if (json) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "bench", "recovery");
            cJSON_AddNumberToObject(j, "rows_per_shard", (double)rows);
            cJSON_AddNumberToObject(j, "session_timeout_ms", b.session_ms);
            cJSON_AddNumberToObject(j, "detect_ms", detect_ms);
            cJSON_AddNumberToObject(j, "claim_ms", claim_ms);
            cJSON_AddNumberToObject(j, "restore_ms", restore_total_ms);
            cJSON_AddNumberToObject(j, "load_ms", restore);
            cJSON_AddNumberToObject(j, "resume_ms", resume_ms);
            cJSON_AddNumberToObject(j, "total_ms", total_ms);
            cJSON_AddNumberToObject(j, "rows_restored", rows_restored);
            cJSON_AddNumberToObject(j, "file_bytes", file_bytes);
            cJSON_AddNumberToObject(j, "restore_bytes_per_sec", restore_bps);
            cJSON_AddNumberToObject(j, "cp_ms", cp_s * 1e3);
            cJSON_AddNumberToObject(j, "cp_bytes_per_sec", cp_bps);
            cJSON_AddNumberToObject(j, "restore_vs_cp", ratio);
            cJSON_AddNumberToObject(j, "cat_ms", cat_s * 1e3);
            cJSON_AddNumberToObject(j, "restore_vs_cat", cat_s > 0 ? restore_bps / (file_bytes / cat_s) : 0);
            cJSON_AddNumberToObject(j, "cp_runs", CP_RUNS);
            cJSON_AddNumberToObject(j, "standby_cpu_ms", standby_cpu_ms);
            cJSON_AddNumberToObject(j, "standby_warm_wait_ms", warm_wait_ms);
            cJSON_AddNumberToObject(j, "standby_warm_bytes", warm_bytes);
            cJSON_AddNumberToObject(j, "standby_warm_ms", warm_ms);
            cJSON_AddNumberToObject(j, "standby_warm_cpu_ms", warm_cpu_ms);
            cJSON_AddNumberToObject(j, "standby_warm_adopted", warm_adopted);
            cJSON_AddNumberToObject(j, "steps_before", (double)w.steps);
            cJSON_AddNumberToObject(j, "failed_steps", (double)w.failures);
            char *s = cJSON_PrintUnformatted(j);
            printf("%s\n", s);
            free(s);
            cJSON_Delete(j);
        }
        status = 0;
    } else {
        fprintf(stderr, "granary bench recovery: %s\n", gr_errmsg());
    }
    cJSON_Delete(root);
    gr_client_destroy(c);
    gr_coord_close(b.coord);
    stop_all(&b);
    return status;
}
