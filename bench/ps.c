/* `granary bench ps`: the parameter server end to end on loopback. Two shards run as child
 * processes (`granary server`); a client pulls and pushes (Adagrad) batches of 4096 x 26 ids
 * (26 tables, one per categorical column, Zipf(1.05) ids, dim 64). Baselines in the same run:
 * Redis MGET/MSET of the same rows as 256-byte values with pipelining (redis-server started
 * here, no persistence), and raw loopback TCP throughput between two processes.
 * Rows/s count every id of a batch, duplicates included (before dedup). */
#include "bench/bench.h"
#include "bench/redis.h"
#include "cli/opts.h"
#include "granary/client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define DIM 64
#define EXAMPLES 4096
#define COLS 26
#define IDS (EXAMPLES * COLS)
#define ZIPF_S 1.05
#define SHARDS 2

typedef struct opts {
    bool json, full;
    unsigned batches;  /* distinct batches generated */
    unsigned rounds;   /* passes over them per measurement */
    unsigned inflight; /* batches in flight at once */
    unsigned threads;  /* worker threads per shard */
    uint64_t vocab;    /* Zipf ranks per column */
    unsigned redis_batches;
    bool no_baselines;
    int only; /* 0 all, 1 pull, 2 push */
} opts;

/* Every option of `granary bench ps`, declared once. --batches and --vocab have no default in
 * the table because theirs follows --full. */
#define PS_BENCH_OPTIONS(X)                                                                    \
    X(PB_JSON, "json", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL, "print a final JSON line")    \
    X(PB_FULL, "full", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,                               \
      "128 batches over 10M ranks per column unless --batches / --vocab")                     \
    X(PB_BATCHES, "batches", GR_CLI_INT, NULL, 1, 4096, NULL, "B", NULL,                        \
      "distinct batches (default 32; --full 128)")                                             \
    X(PB_ROUNDS, "rounds", GR_CLI_INT, NULL, 1, 1000, NULL, "R", "3",                           \
      "passes over them per measurement")                                                     \
    X(PB_INFLIGHT, "inflight", GR_CLI_INT, NULL, 1, 64, NULL, "K", "2", "batches in flight")    \
    X(PB_THREADS, "threads", GR_CLI_INT, NULL, 1, 256, NULL, "T", "1",                          \
      "worker threads per shard")                                                             \
    X(PB_VOCAB, "vocab", GR_CLI_INT, NULL, 1, 1099511627776.0, NULL, "V", NULL,                \
      "Zipf ranks per column (default 1M; --full 10M)")                                        \
    X(PB_NO_BASELINES, "no-baselines", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,               \
      "skip Redis and raw TCP (for profiling)")                                                \
    X(PB_ONLY, "only", GR_CLI_CHOICE, NULL, 0, 0, "all|pull|push", "WHAT", "all",                \
      "time only the deduplicating pulls or pushes, nothing else (for profiling one side)")

enum { PS_BENCH_OPTIONS(GR_CLI_ENUM) PB_COUNT };
static const gr_cli_opt ps_bench_opts[] = {PS_BENCH_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec ps_bench_spec = {
    .command = "bench ps",
    .synopsis = "granary bench ps [--json] [--full] [--batches B] [--rounds R] [--inflight K]\n"
                "                        [--threads T] [--vocab V] [--no-baselines] [--only WHAT]\n"
                "  two local shards; batches of 4096 x 26 ids (one table per column), dim 64, "
                "Adagrad",
    .opts = ps_bench_opts,
    .n_opts = PB_COUNT,
};

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double now_s(void) { return gr_now_s(); }

static double div0(double a, double b) { return b > 0 ? a / b : 0; }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double percentile(double *v, size_t n, double p)
{
    if (!n) return 0;
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

/* ---- child processes ---- */

typedef struct child {
    pid_t pid;
    uint16_t port;
} child;

static pid_t spawn_reading(char *const argv[], int *out_fd)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC)) return -1;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        dup2(p[1], 1);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    *out_fd = p[0];
    return pid;
}

static void stop_child(child *c)
{
    if (c->pid <= 0) return;
    kill(c->pid, SIGTERM);
    for (int i = 0; i < 500; i++) {
        if (waitpid(c->pid, NULL, WNOHANG) == c->pid) {
            c->pid = 0;
            return;
        }
        gr_sleep_ms(10);
    }
    kill(c->pid, SIGKILL);
    waitpid(c->pid, NULL, 0);
    c->pid = 0;
}

static int start_shard(child *c, unsigned shard, unsigned threads)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return -1;
    exe[n] = '\0';
    char sh[16], shs[16], th[16];
    snprintf(sh, sizeof sh, "%u", shard);
    snprintf(shs, sizeof shs, "%u", SHARDS);
    snprintf(th, sizeof th, "%u", threads);
    char *argv[] = {exe, "server", "--listen", "127.0.0.1:0", "--shard", sh, "--shards", shs,
                    "--threads", th, NULL};
    int fd;
    setenv("GRANARY_LOG", "warn", 0);
    c->pid = spawn_reading(argv, &fd);
    if (c->pid < 0) return -1;
    char line[256];
    size_t len = 0;
    while (len < sizeof line - 1) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 20000) <= 0) break;
        ssize_t r = read(fd, line + len, sizeof line - 1 - len);
        if (r <= 0) break;
        len += (size_t)r;
        line[len] = '\0';
        if (strchr(line, '\n')) break;
    }
    close(fd);
    line[len] = '\0';
    /* Only the first line is the address; a log line may follow it in the same read. */
    line[strcspn(line, "\n")] = '\0';
    const char *colon = strrchr(line, ':');
    if (strncmp(line, "listening on ", 13) || !colon) {
        stop_child(c);
        return -1;
    }
    if (gr_bench_parse_port(colon + 1, &c->port)) {
        stop_child(c);
        return -1;
    }
    return 0;
}

/* ---- raw loopback TCP ---- */

static int tcp_listen_any(uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 4)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    socklen_t sl = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &sl);
    *port = ntohs(a.sin_port);
    return fd;
}

/* One stream from a child process to this one; bytes/s at the receiver. */
static double loopback_bytes_per_sec(uint64_t total)
{
    uint16_t port;
    int lfd = tcp_listen_any(&port);
    if (lfd < 0) return NAN;
    pid_t pid = fork();
    if (pid == 0) {
        int fd = gr_bench_tcp_connect(port);
        if (fd >= 0) gr_sock_unpaced_loopback(fd); /* as the client's and shards' sockets */
        size_t chunk = 1 << 20;
        char *buf = calloc(1, chunk);
        uint64_t sent = 0;
        while (fd >= 0 && buf && sent < total) {
            ssize_t w = send(fd, buf, chunk, MSG_NOSIGNAL);
            if (w <= 0) break;
            sent += (uint64_t)w;
        }
        _exit(0);
    }
    int fd = accept(lfd, NULL, NULL);
    close(lfd);
    if (fd >= 0) gr_sock_unpaced_loopback(fd);
    size_t chunk = 1 << 20;
    char *buf = malloc(chunk);
    uint64_t got = 0;
    double t0 = now_s();
    while (fd >= 0 && got < total) {
        ssize_t r = recv(fd, buf, chunk, 0);
        if (r <= 0) break;
        got += (uint64_t)r;
    }
    double dt = now_s() - t0;
    free(buf);
    if (fd >= 0) close(fd);
    waitpid(pid, NULL, 0);
    return got == total ? (double)got / dt : NAN;
}

/* ---- Redis over RESP, pipelined ---- */

/* Reads one MGET reply of n values of vlen bytes. */
static int r_read_mget(gr_redis_conn *r, size_t n, size_t vlen)
{
    char *l = gr_redis_line(r);
    if (!l || l[0] != '*' || (size_t)atol(l + 1) != n) return -1;
    for (size_t i = 0; i < n; i++) {
        l = gr_redis_line(r);
        if (!l || l[0] != '$') return -1;
        long sz = atol(l + 1);
        if (sz < 0) continue; /* missing key */
        if ((size_t)sz != vlen || gr_redis_skip(r, vlen + 2)) return -1;
    }
    return 0;
}

typedef struct cmdbuf {
    char *p;
    size_t len, cap;
} cmdbuf;

static void cb_put(cmdbuf *c, const void *p, size_t n)
{
    if (c->len + n > c->cap) {
        c->cap = (c->len + n) * 2;
        c->p = realloc(c->p, c->cap);
    }
    memcpy(c->p + c->len, p, n);
    c->len += n;
}

static void cb_fmt(cmdbuf *c, const char *s)
{
    cb_put(c, s, strlen(s));
}

static void cb_bulk(cmdbuf *c, const void *p, size_t n)
{
    char h[32];
    snprintf(h, sizeof h, "$%zu\r\n", n);
    cb_fmt(c, h);
    cb_put(c, p, n);
    cb_fmt(c, "\r\n");
}

#define REDIS_CMD_KEYS 1024 /* keys per MGET/MSET command */
#define REDIS_PIPE 16       /* commands in flight */

/* Runs MGET (set = false) or MSET (set = true) over every id of nb batches, 1024 keys per
 * command, 16 commands in flight; returns rows/s (ids, duplicates included). */
static double redis_run(const child *redis, bool over_unix, uint64_t *const *batches, unsigned nb,
                        bool set)
{
    int fd = over_unix ? gr_redis_unix_connect(redis->pid) : gr_bench_tcp_connect(redis->port);
    if (fd < 0) return NAN;
    /* Our end of the TCP connection gets what granary's sockets get (redis-server's own end
     * keeps the host's congestion control: it cannot be set from here, which is why the Unix
     * socket is measured too). */
    if (!over_unix) gr_sock_unpaced_loopback(fd);
    gr_redis_conn r = {fd, malloc(1 << 22), 0, 0, 1 << 22};
    cmdbuf cb = {NULL, 0, 0};
    char value[DIM * 4];
    memset(value, 0x3f, sizeof value);
    size_t ncmd_total = 0;
    double t0 = now_s();
    bool ok = true;
    for (unsigned b = 0; b < nb && ok; b++) {
        const uint64_t *ids = batches[b];
        size_t ncmd = (IDS + REDIS_CMD_KEYS - 1) / REDIS_CMD_KEYS, sent = 0, done = 0;
        while (done < ncmd && ok) {
            cb.len = 0;
            while (sent < ncmd && sent - done < REDIS_PIPE) {
                size_t lo = sent * REDIS_CMD_KEYS, hi = lo + REDIS_CMD_KEYS;
                if (hi > IDS) hi = IDS;
                char h[48];
                snprintf(h, sizeof h, "*%zu\r\n", (hi - lo) * (set ? 2 : 1) + 1);
                cb_fmt(&cb, h);
                cb_bulk(&cb, set ? "MSET" : "MGET", 4);
                for (size_t i = lo; i < hi; i++) {
                    char key[24];
                    int kn = snprintf(key, sizeof key, "%llx", (unsigned long long)ids[i]);
                    cb_bulk(&cb, key, (size_t)kn);
                    if (set) cb_bulk(&cb, value, sizeof value);
                }
                sent++;
            }
            if (cb.len && gr_redis_send(fd, cb.p, cb.len)) ok = false;
            /* Read one reply, keeping the pipeline full. */
            if (ok) {
                size_t lo = done * REDIS_CMD_KEYS, hi = lo + REDIS_CMD_KEYS;
                if (hi > IDS) hi = IDS;
                if (set) {
                    char *l = gr_redis_line(&r);
                    ok = l && !strcmp(l, "+OK");
                } else {
                    ok = r_read_mget(&r, hi - lo, sizeof value) == 0;
                }
                done++;
            }
        }
        ncmd_total += ncmd;
    }
    double dt = now_s() - t0;
    (void)ncmd_total;
    free(r.buf);
    free(cb.p);
    close(fd);
    return ok ? (double)nb * IDS / dt : NAN;
}

static int start_redis(child *c)
{
    c->pid = gr_redis_start(&c->port);
    return c->pid > 0 ? 0 : -1;
}

/* ---- the PS measurement ---- */

/* CPU seconds used so far by this process (all threads) and by the shard processes, so the
 * cost of a batch can be read independently of what else the machine is running. */
static pid_t g_shard_pids[SHARDS];

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
    unsigned long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static double shards_cpu_s(void)
{
    double t = 0;
    for (int i = 0; i < SHARDS; i++) t += g_shard_pids[i] > 0 ? proc_cpu_s(g_shard_pids[i]) : 0;
    return t;
}

typedef struct run_stats {
    double rows_per_sec;
    double client_cpu_ms, server_cpu_ms; /* per batch */
    double p50_ms, p99_ms;
    uint64_t wire_bytes, ids, unique;
    unsigned nbatches;
    /* The client's time per batch by phase, in microseconds (gr_client_stats_t): */
    double plan_us, frame_us, send_us, recv_us, scatter_us;
} run_stats;

/* Runs `rounds` passes over the batches with `inflight` operations in flight. With nuniq,
 * batch b's column t holds nuniq[b][t] keys that are already unique (a trainer's deduplicated
 * batch), passed with GR_CLIENT_BATCH_UNIQUE. */
static int ps_run(gr_client *c, uint64_t *const *batches, uint32_t *const *nuniq, unsigned nb,
                  unsigned rounds, unsigned inflight, bool push, float *rows_pool,
                  const float *grads, run_stats *st)
{
    unsigned total = nb * rounds;
    double *lat = calloc(total, sizeof *lat);
    gr_client_op **ops = calloc(inflight, sizeof *ops);
    double *t_start = calloc(inflight, sizeof *t_start);
    gr_client_batch *b = calloc((size_t)inflight * COLS, sizeof *b);
    gr_client_stats_t s0, s1;
    gr_client_get_stats(c, &s0);
    int rc = 0;
    double c0 = self_cpu_s(), v0 = shards_cpu_s();
    double t0 = now_s();
    unsigned started = 0, finished = 0;
    while (finished < total && !rc) {
        /* Keep `inflight` operations running; wait for the oldest. */
        while (started < total && started - finished < inflight) {
            unsigned slot = started % inflight;
            const uint64_t *ids = batches[started % nb];
            for (unsigned t = 0; t < COLS; t++) {
                gr_client_batch *x = &b[slot * COLS + t];
                x->table = t + 1;
                x->dim = DIM;
                x->n = nuniq ? nuniq[started % nb][t] : EXAMPLES;
                x->flags = nuniq ? GR_CLIENT_BATCH_UNIQUE : 0;
                x->keys = ids + (size_t)t * EXAMPLES;
                x->rows = push ? NULL : rows_pool + ((size_t)slot * IDS + (size_t)t * EXAMPLES) * DIM;
                x->grads = push ? grads + (size_t)t * EXAMPLES * DIM : NULL;
            }
            t_start[slot] = now_s();
            rc = push ? gr_client_push_start(c, &b[slot * COLS], COLS, &ops[slot])
                      : gr_client_pull_start(c, &b[slot * COLS], COLS, 0, &ops[slot]);
            if (rc) break;
            started++;
        }
        if (rc) break;
        unsigned slot = finished % inflight;
        rc = gr_client_wait(ops[slot], -1);
        lat[finished] = (now_s() - t_start[slot]) * 1e3;
        finished++;
    }
    double dt = now_s() - t0;
    /* Drain what is still running after an error. */
    for (unsigned i = finished; i < started; i++) gr_client_wait(ops[i % inflight], -1);
    gr_client_get_stats(c, &s1);
    if (!rc) {
        st->client_cpu_ms = (self_cpu_s() - c0) * 1e3 / total;
        st->server_cpu_ms = (shards_cpu_s() - v0) * 1e3 / total;
        st->rows_per_sec = (double)total * IDS / dt;
        st->p50_ms = percentile(lat, total, 0.50);
        st->p99_ms = percentile(lat, total, 0.99);
        st->wire_bytes = (s1.bytes_sent - s0.bytes_sent) + (s1.bytes_received - s0.bytes_received);
        st->ids = s1.keys_in - s0.keys_in;
        st->unique = s1.keys_sent - s0.keys_sent;
        st->nbatches = total;
        st->plan_us = (double)(s1.plan_ns - s0.plan_ns) / 1e3 / total;
        st->frame_us = (double)(s1.frame_ns - s0.frame_ns) / 1e3 / total;
        st->send_us = (double)(s1.send_ns - s0.send_ns) / 1e3 / total;
        st->recv_us = (double)(s1.recv_ns - s0.recv_ns) / 1e3 / total;
        st->scatter_us = (double)(s1.scatter_ns - s0.scatter_ns) / 1e3 / total;
    }
    free(lat);
    free(ops);
    free(t_start);
    free(b);
    return rc;
}

int gr_bench_ps(int argc, char **argv)
{
    gr_cli_value v[PB_COUNT];
    gr_cli_parsed parsed;
    int exit_now = gr_cli_parse_or_exit(&ps_bench_spec, argc, argv, v, &parsed);
    gr_cli_parsed_fini(&parsed);
    if (exit_now >= 0) return exit_now;
    opts o = {.json = v[PB_JSON].b,
              .full = v[PB_FULL].b,
              .batches = (unsigned)v[PB_BATCHES].i,
              .rounds = (unsigned)v[PB_ROUNDS].i,
              .inflight = (unsigned)v[PB_INFLIGHT].i,
              .threads = (unsigned)v[PB_THREADS].i,
              .vocab = (uint64_t)v[PB_VOCAB].i,
              .no_baselines = v[PB_NO_BASELINES].b,
              .only = (int)v[PB_ONLY].i};
    if (o.only) o.no_baselines = true;
    if (!v[PB_BATCHES].given) o.batches = o.full ? 128 : 32;
    if (!v[PB_VOCAB].given) o.vocab = o.full ? 10000000 : 1000000;
    o.redis_batches = o.full ? 32 : 8;
    signal(SIGPIPE, SIG_IGN);
    /* As the server does: keep per-request frame buffers in the heap between batches. */
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);

    /* Batches: column t draws Zipf ranks, mapped to keys by a per-column bijection. */
    fprintf(stderr, "bench ps: generating %u batches of %d x %d ids (Zipf %.2f over %llu per column)\n",
            o.batches, EXAMPLES, COLS, ZIPF_S, (unsigned long long)o.vocab);
    uint64_t **batches = calloc(o.batches, sizeof *batches);
    gr_zipf z;
    gr_zipf_init(&z, o.vocab, ZIPF_S);
    gr_rng rng;
    gr_rng_seed(&rng, 42);
    for (unsigned b = 0; b < o.batches; b++) {
        batches[b] = malloc(IDS * sizeof(uint64_t));
        for (unsigned t = 0; t < COLS; t++)
            for (unsigned i = 0; i < EXAMPLES; i++)
                batches[b][(size_t)t * EXAMPLES + i] = mix(gr_zipf_draw(&z, &rng) * COLS + t);
    }
    float *rows = malloc((size_t)o.inflight * IDS * DIM * sizeof(float));
    float *grads = malloc((size_t)IDS * DIM * sizeof(float));
    for (size_t i = 0; i < (size_t)IDS * DIM; i++) grads[i] = (float)((i % 17) - 8) * 1e-4f;

    int status = 1;
    child shards[SHARDS] = {{0, 0}, {0, 0}}, redis = {0, 0};
    gr_client *c = NULL;
    run_stats pull = {0}, push = {0}, upull = {0}, upush = {0};
    uint64_t **ubatches = calloc(o.batches, sizeof *ubatches);
    uint32_t **ununiq = calloc(o.batches, sizeof *ununiq);
    double mget = NAN, mset = NAN, loop = NAN;
    double mget_tcp = NAN, mget_unix = NAN, mset_tcp = NAN, mset_unix = NAN;
    for (unsigned i = 0; i < SHARDS; i++)
        if (start_shard(&shards[i], i, o.threads)) {
            fprintf(stderr, "bench ps: cannot start shard %u\n", i);
            goto out;
        }
    for (unsigned i = 0; i < SHARDS; i++) g_shard_pids[i] = shards[i].pid;
    char list[128];
    snprintf(list, sizeof list, "127.0.0.1:%u,127.0.0.1:%u", shards[0].port, shards[1].port);
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = list;
    cfg.request_timeout_ms = 120000;
    if (gr_client_create(&cfg, &c)) {
        fprintf(stderr, "bench ps: %s\n", gr_errmsg());
        goto out;
    }
    /* 16 partitions per table: each shard sees ~1000 keys per table per batch, and the table's
     * per-call cost grows with its partition count (measured: 256 partitions cost the shards
     * ~40% more CPU per batch than 16). */
    for (unsigned t = 0; t < COLS; t++) {
        char spec[256];
        snprintf(spec, sizeof spec,
                 "{\"name\":\"c%u\",\"id\":%u,\"dim\":%d,\"seed\":%u,"
                 "\"init\":{\"kind\":\"uniform\",\"low\":-0.01,\"high\":0.01},"
                 "\"optimizer\":{\"kind\":\"adagrad\",\"lr\":0.05,\"eps\":1e-8},"
                 "\"partitions\":16}",
                 t, t + 1, DIM, t);
        if (gr_client_create_table(c, spec)) {
            fprintf(stderr, "bench ps: %s\n", gr_errmsg());
            goto out;
        }
    }
    /* Warm-up pass creates the rows, so the timed passes read and update existing rows. */
    fprintf(stderr, "bench ps: warm-up (creates the rows)\n");
    run_stats warm;
    if (ps_run(c, batches, NULL, o.batches, 1, o.inflight, false, rows, grads, &warm)) {
        fprintf(stderr, "bench ps: %s\n", gr_errmsg());
        goto out;
    }
    fprintf(stderr, "bench ps: pull\n");
    if (o.only != 2 &&
        ps_run(c, batches, NULL, o.batches, o.rounds, o.inflight, false, rows, grads, &pull)) {
        fprintf(stderr, "bench ps: %s\n", gr_errmsg());
        goto out;
    }
    fprintf(stderr, "bench ps: push\n");
    if (o.only != 1 &&
        ps_run(c, batches, NULL, o.batches, o.rounds, o.inflight, true, rows, grads, &push)) {
        fprintf(stderr, "bench ps: %s\n", gr_errmsg());
        goto out;
    }
    /* --only: one side's deduplicating batches and nothing else, for a profiler. */
    if (o.only) goto measured;
    /* The training path: the trainer has deduplicated each column already and hands the
     * client unique keys (GR_CLIENT_BATCH_UNIQUE); it computes on the unique rows. Same
     * batches, so rows/s still count every id of the original batch. */
    fprintf(stderr, "bench ps: pull and push of keys given unique\n");
    for (unsigned b = 0; b < o.batches; b++) {
        ubatches[b] = malloc(IDS * sizeof(uint64_t));
        ununiq[b] = malloc(COLS * sizeof(uint32_t));
        uint32_t *inv = malloc(EXAMPLES * sizeof *inv);
        uint64_t *u = malloc(EXAMPLES * sizeof *u);
        for (unsigned t = 0; t < COLS; t++) {
            long n = gr_dedup(batches[b] + (size_t)t * EXAMPLES, EXAMPLES, u, inv, NULL);
            memcpy(ubatches[b] + (size_t)t * EXAMPLES, u, (size_t)n * sizeof *u);
            ununiq[b][t] = (uint32_t)n;
        }
        free(inv);
        free(u);
    }
    if (ps_run(c, ubatches, ununiq, o.batches, o.rounds, o.inflight, false, rows, grads, &upull) ||
        ps_run(c, ubatches, ununiq, o.batches, o.rounds, o.inflight, true, rows, grads, &upush)) {
        fprintf(stderr, "bench ps: %s\n", gr_errmsg());
        goto out;
    }
    upull.rows_per_sec = upull.rows_per_sec * pull.ids / upull.ids; /* ids of the full batch */
    upush.rows_per_sec = upush.rows_per_sec * pull.ids / upush.ids;
    /* Latency per batch is measured alone (one batch in flight): with K in flight each batch
     * would also wait for the K - 1 ahead of it. */
    if (o.inflight > 1) {
        fprintf(stderr, "bench ps: latency (one batch in flight)\n");
        run_stats lp, lq;
        if (ps_run(c, batches, NULL, o.batches, 1, 1, false, rows, grads, &lp) ||
            ps_run(c, batches, NULL, o.batches, 1, 1, true, rows, grads, &lq)) {
            fprintf(stderr, "bench ps: %s\n", gr_errmsg());
            goto out;
        }
        pull.p50_ms = lp.p50_ms;
        pull.p99_ms = lp.p99_ms;
        push.p50_ms = lq.p50_ms;
        push.p99_ms = lq.p99_ms;
    }
measured:
    gr_client_destroy(c);
    c = NULL;
    for (unsigned i = 0; i < SHARDS; i++) stop_child(&shards[i]);

    if (o.no_baselines) {
        fprintf(stderr, "bench ps: baselines skipped (--no-baselines)\n");
    } else if (start_redis(&redis) == 0) {
        /* Over loopback TCP, granary's transport here: the baseline. And over Redis's Unix
         * socket, which has no congestion control: on this host redis-server's end of a TCP
         * connection paces with BBR, which granary's loopback sockets turn off and
         * redis-server cannot; the Unix figures show what that costs Redis. */
        fprintf(stderr, "bench ps: redis MSET then MGET, over TCP then over a Unix socket\n");
        unsigned nb = o.redis_batches < o.batches ? o.redis_batches : o.batches;
        mset_tcp = redis_run(&redis, false, batches, nb, true);
        mget_tcp = redis_run(&redis, false, batches, nb, false);
        mset_unix = redis_run(&redis, true, batches, nb, true);
        mget_unix = redis_run(&redis, true, batches, nb, false);
        mset = mset_tcp;
        mget = mget_tcp;
        stop_child(&redis);
    } else {
        fprintf(stderr, "bench ps: redis-server not available; Redis baselines skipped\n");
    }
    if (!o.no_baselines) {
        fprintf(stderr, "bench ps: raw loopback TCP\n");
        loop = loopback_bytes_per_sec(o.full ? (8ull << 30) : (2ull << 30));
    }

    /* With --only one side ran: the other's figures print as 0, and the ids come from it. */
    const run_stats *ran = pull.nbatches ? &pull : &push;
    double bpb_pull = div0((double)pull.wire_bytes, pull.nbatches);
    double bpb_push = div0((double)push.wire_bytes, push.nbatches);
    /* Without dedup every id would travel: 8 key bytes + 256 row bytes more per duplicate. */
    double dup_per_batch = div0((double)(ran->ids - ran->unique), ran->nbatches);
    double bpb_pull_nodedup = pull.nbatches ? bpb_pull + dup_per_batch * (8 + DIM * 4) : 0;
    double bpb_push_nodedup = push.nbatches ? bpb_push + dup_per_batch * (8 + DIM * 4) : 0;
    double pull_bytes = pull.rows_per_sec * DIM * 4;           /* rows delivered to the caller */
    double pull_wire = bpb_pull * pull.rows_per_sec / IDS;     /* bytes on the wire */
    printf("parameter server: %d shards (%u worker threads each), batches of %d x %d ids, dim %d, "
           "Zipf %.2f over %llu ids per column, %u batches x %u rounds, %u in flight\n",
           SHARDS, o.threads, EXAMPLES, COLS, DIM, ZIPF_S, (unsigned long long)o.vocab,
           o.batches, o.rounds, o.inflight);
    printf("  unique ids per batch        %.0f of %d (%.1f%%)\n", div0((double)ran->unique, ran->nbatches),
           IDS, 100.0 * div0((double)ran->unique, (double)ran->ids));
    printf("  (rows/s count every id of a batch, duplicates included; latency with 1 batch in flight)\n");
    printf("  pull                        %10.2f M rows/s   p50 %6.2f ms  p99 %6.2f ms per batch\n",
           pull.rows_per_sec / 1e6, pull.p50_ms, pull.p99_ms);
    printf("  push (Adagrad)              %10.2f M rows/s   p50 %6.2f ms  p99 %6.2f ms per batch\n",
           push.rows_per_sec / 1e6, push.p50_ms, push.p99_ms);
    printf("  CPU per batch               pull %.1f ms client + %.1f ms shards, push %.1f + %.1f ms\n",
           pull.client_cpu_ms, pull.server_cpu_ms, push.client_cpu_ms, push.server_cpu_ms);
    printf("  client time per pull batch  %.0f us: dedup+route %.0f, frames %.0f, send %.0f, "
           "recv %.0f, scatter %.0f (client CPU %.0f us)\n",
           pull.plan_us + pull.frame_us + pull.send_us + pull.recv_us + pull.scatter_us,
           pull.plan_us, pull.frame_us, pull.send_us, pull.recv_us, pull.scatter_us,
           pull.client_cpu_ms * 1e3);
    printf("  client time per push batch  %.0f us: dedup+route %.0f, frames+sums %.0f, send %.0f, "
           "recv %.0f (client CPU %.0f us)\n",
           push.plan_us + push.frame_us + push.send_us + push.recv_us + push.scatter_us,
           push.plan_us, push.frame_us, push.send_us, push.recv_us, push.client_cpu_ms * 1e3);
    printf("  keys given unique (trainer) pull %.2f M rows/s (client CPU %.1f ms), push %.2f M "
           "rows/s (client CPU %.1f ms)\n",
           upull.rows_per_sec / 1e6, upull.client_cpu_ms, upush.rows_per_sec / 1e6,
           upush.client_cpu_ms);
    printf("  wire bytes per pull batch   %10.2f MB (without dedup %.2f MB)\n", bpb_pull / 1e6,
           bpb_pull_nodedup / 1e6);
    printf("  wire bytes per push batch   %10.2f MB (without dedup %.2f MB)\n", bpb_push / 1e6,
           bpb_push_nodedup / 1e6);
    printf("  pull rows delivered         %10.2f GB/s   (on the wire %.2f GB/s)\n", pull_bytes / 1e9,
           pull_wire / 1e9);
    printf("baselines:\n");
    printf("  redis MGET (256-byte values) %9.2f M rows/s   -> pull is %.1fx\n", mget / 1e6,
           pull.rows_per_sec / mget);
    printf("  redis MSET (256-byte values) %9.2f M rows/s   -> push is %.1fx\n", mset / 1e6,
           push.rows_per_sec / mset);
    printf("    (over Redis's Unix socket instead: MGET %.2f, MSET %.2f M rows/s; TCP %.2f / %.2f)\n",
           mget_unix / 1e6, mset_unix / 1e6, mget_tcp / 1e6, mset_tcp / 1e6);
    printf("  raw loopback TCP             %9.2f GB/s       -> pull rows are %.2fx of it\n",
           loop / 1e9, pull_bytes / loop);
    if (o.json) {
#define JNUM(x) (isfinite(x) ? (x) : -1)
        printf("{\"bench\":\"ps\",\"shards\":%d,\"threads_per_shard\":%u,\"batch_examples\":%d,"
               "\"columns\":%d,\"dim\":%d,\"zipf_s\":%.2f,\"vocab_per_column\":%llu,"
               "\"batches\":%u,\"rounds\":%u,\"inflight\":%u,"
               "\"pull_rows_per_sec\":%.0f,\"push_rows_per_sec\":%.0f,"
               "\"pull_p50_ms\":%.3f,\"pull_p99_ms\":%.3f,\"push_p50_ms\":%.3f,\"push_p99_ms\":%.3f,"
               "\"unique_fraction\":%.4f,\"pull_cpu_ms_per_batch\":%.2f,\"push_cpu_ms_per_batch\":%.2f,"
               "\"pull_wire_bytes_per_batch\":%.0f,\"pull_wire_bytes_per_batch_no_dedup\":%.0f,"
               "\"push_wire_bytes_per_batch\":%.0f,\"push_wire_bytes_per_batch_no_dedup\":%.0f,"
               "\"pull_bytes_per_sec\":%.0f,\"pull_wire_bytes_per_sec\":%.0f,",
               SHARDS, o.threads, EXAMPLES, COLS, DIM, ZIPF_S, (unsigned long long)o.vocab,
               o.batches, o.rounds, o.inflight, pull.rows_per_sec, push.rows_per_sec, pull.p50_ms,
               pull.p99_ms, push.p50_ms, push.p99_ms, div0((double)ran->unique, (double)ran->ids),
               pull.client_cpu_ms + pull.server_cpu_ms, push.client_cpu_ms + push.server_cpu_ms,
               bpb_pull, bpb_pull_nodedup, bpb_push, bpb_push_nodedup, pull_bytes, pull_wire);
        printf("\"pull_client_cpu_ms_per_batch\":%.2f,\"push_client_cpu_ms_per_batch\":%.2f,"
               "\"pull_client_plan_us\":%.0f,\"pull_client_frame_us\":%.0f,"
               "\"pull_client_send_us\":%.0f,\"pull_client_recv_us\":%.0f,"
               "\"pull_client_scatter_us\":%.0f,\"push_client_plan_us\":%.0f,"
               "\"push_client_frame_us\":%.0f,\"push_client_send_us\":%.0f,"
               "\"push_client_recv_us\":%.0f,"
               "\"unique_pull_rows_per_sec\":%.0f,\"unique_push_rows_per_sec\":%.0f,"
               "\"unique_pull_client_cpu_ms_per_batch\":%.2f,"
               "\"unique_push_client_cpu_ms_per_batch\":%.2f,",
               pull.client_cpu_ms, push.client_cpu_ms, pull.plan_us, pull.frame_us, pull.send_us,
               pull.recv_us, pull.scatter_us, push.plan_us, push.frame_us, push.send_us,
               push.recv_us, upull.rows_per_sec, upush.rows_per_sec, upull.client_cpu_ms,
               upush.client_cpu_ms);
        if (isfinite(mget) && isfinite(mset))
            printf("\"redis_mget_rows_per_sec\":%.0f,\"redis_mset_rows_per_sec\":%.0f,", mget, mset);
        else
            printf("\"redis_mget_rows_per_sec\":null,\"redis_mset_rows_per_sec\":null,");
        printf("\"redis_mget_tcp_rows_per_sec\":%.0f,\"redis_mget_unix_rows_per_sec\":%.0f,"
               "\"redis_mset_tcp_rows_per_sec\":%.0f,\"redis_mset_unix_rows_per_sec\":%.0f,",
               JNUM(mget_tcp), JNUM(mget_unix), JNUM(mset_tcp), JNUM(mset_unix));
        printf("\"loopback_bytes_per_sec\":%.0f}\n", JNUM(loop));
#undef JNUM
    }
    status = 0;
out:
    gr_client_destroy(c);
    for (unsigned i = 0; i < SHARDS; i++) stop_child(&shards[i]);
    stop_child(&redis);
    for (unsigned b = 0; b < o.batches; b++) {
        free(batches[b]);
        free(ubatches[b]);
        free(ununiq[b]);
    }
    free(batches);
    free(ubatches);
    free(ununiq);
    free(rows);
    free(grads);
    return status;
}
