/* `granary bench soak`: a local cluster (two `granary server` child processes) under mixed load
 * for N minutes: pulls, pushes and push-pulls on four tables and a dense parameter, tables
 * created and dropped, incremental checkpoints with retention, clients that connect and
 * vanish, connections cut mid-frame and frames that are not the protocol. Every few seconds
 * it samples each shard's RSS, threads and open descriptors from /proc/PID. The figures are
 * growth after warm-up (the first quarter of the run): flat is the target. Every request that
 * should succeed and did not is an unexpected error. */
#include "bench/bench.h"
#include "cli/opts.h"
#include "granary/client.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define SHARDS 2
#define TABLES 4
#define DIM 16
#define KEYS 256
#define VOCAB 50000 /* keys per table: every row exists well within the warm-up */
#define DENSE 1000
#define MAX_SAMPLES 4096

typedef struct sample {
    double t;
    long long rss[SHARDS], fds[SHARDS], threads[SHARDS];
} sample;

typedef struct soak {
    char servers[128];
    char root[64];
    uint16_t port[SHARDS];
    pid_t pid[SHARDS];
    uint64_t deadline_ns;
    atomic_ullong requests, unexpected, expected, checkpoints, clients, bad_frames;
    atomic_bool stop;
    pthread_mutex_t msg_mu;
    /* Held by a save and by one create-use-drop of the churn table: a save that races a
     * create or drop is refused by the commit by design (shards must list the same tables,
     * docs/checkpoints.md), which is not what this run looks for. */
    pthread_mutex_t tables_mu;
    char first_error[512];
} soak;

static void unexpected(soak *k, const char *what)
{
    if (atomic_fetch_add(&k->unexpected, 1) == 0) {
        pthread_mutex_lock(&k->msg_mu);
        snprintf(k->first_error, sizeof k->first_error, "%s: %s", what, gr_errmsg());
        pthread_mutex_unlock(&k->msg_mu);
    }
}

static bool running(soak *k) { return !atomic_load(&k->stop) && gr_now_ns() < k->deadline_ns; }

/* ---- the shards ---- */

static int start_shard(soak *k, unsigned i)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return -1;
    exe[n] = '\0';
    char sh[16], shs[16];
    snprintf(sh, sizeof sh, "%u", i);
    snprintf(shs, sizeof shs, "%u", SHARDS);
    char *argv[] = {exe, "server", "--listen", "127.0.0.1:0", "--shard", sh, "--shards", shs,
                    "--threads", "2", "--ckpt-root", k->root, NULL};
    int p[2];
    if (pipe2(p, O_CLOEXEC)) return -1;
    setenv("GRANARY_LOG", "error", 0);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        dup2(p[1], 1);
        execv(exe, argv);
        _exit(127);
    }
    close(p[1]);
    k->pid[i] = pid;
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
    /* Only the first line is the address; a log line may follow it in the same read. */
    line[strcspn(line, "\n")] = '\0';
    const char *colon = strrchr(line, ':');
    if (strncmp(line, "listening on ", 13) || !colon) return -1;
    return gr_bench_parse_port(colon + 1, &k->port[i]);
}

static int stop_shard(pid_t pid)
{
    if (pid <= 0) return -1;
    kill(pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 2000; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
        gr_sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return 137;
}

/* The count after a /proc/PID/status field name ("VmRSS:   1234 kB"), or -1 when the line
 * does not hold one (a kernel that words it differently leaves the figure unknown). */
static long long proc_count(const char *text)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || errno || v < 0) return -1;
    while (*end == ' ' || *end == '\t') end++;
    if (*end && *end != '\n' && strncmp(end, "kB", 2)) return -1;
    return v;
}

/* RSS (bytes) and threads from /proc/PID/status, open descriptors from /proc/PID/fd. */
static void sample_proc(pid_t pid, long long *rss, long long *threads, long long *fds)
{
    char path[64], line[256];
    *rss = *threads = *fds = -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "VmRSS:", 6)) {
            long long kb = proc_count(line + 6);
            *rss = kb < 0 ? -1 : kb * 1024;
        } else if (!strncmp(line, "Threads:", 8)) {
            *threads = proc_count(line + 8);
        }
    }
    if (f) fclose(f);
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d) return;
    long long n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    *fds = n;
}

/* ---- load ---- */

static gr_client *connect_client(soak *k)
{
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = k->servers;
    cc.request_timeout_ms = 60000;
    gr_client *c = NULL;
    return gr_client_create(&cc, &c) == GR_OK ? c : NULL;
}

/* Pulls, pushes and push-pulls on the four tables; the dense parameter every few rounds. */
static void *load_main(void *arg)
{
    soak *k = arg;
    static atomic_uint seed;
    gr_rng r;
    gr_rng_seed(&r, 1000 + atomic_fetch_add(&seed, 1));
    gr_client *c = connect_client(k);
    if (!c) {
        unexpected(k, "load client");
        return NULL;
    }
    uint64_t keys[KEYS];
    float *rows = malloc(sizeof(float) * KEYS * DIM), *g = malloc(sizeof(float) * KEYS * DIM);
    float *dense = malloc(sizeof(float) * DENSE);
    for (uint64_t round = 0; rows && g && dense && running(k); round++) {
        uint32_t table = 1 + (uint32_t)(gr_rng_next(&r) % TABLES);
        for (int i = 0; i < KEYS; i++) keys[i] = gr_rng_next(&r) % VOCAB;
        for (int i = 0; i < KEYS * DIM; i++) g[i] = (float)(gr_rng_uniform(&r) - 0.5) * 0.1f;
        if (gr_client_pull(c, table, DIM, keys, KEYS, rows)) unexpected(k, "pull");
        if (gr_client_push(c, table, DIM, keys, KEYS, g)) unexpected(k, "push");
        gr_client_batch b = {.table = table, .dim = DIM, .n = KEYS, .keys = keys, .rows = rows,
                             .grads = g};
        if (round % 4 == 0 && gr_client_push_pull_many(c, &b, 1)) unexpected(k, "push_pull");
        atomic_fetch_add(&k->requests, round % 4 == 0 ? 3 : 2);
        if (round % 8 == 0) {
            for (int i = 0; i < DENSE; i++) dense[i] = (float)(gr_rng_uniform(&r) - 0.5) * 0.01f;
            if (gr_client_dense_push(c, "mlp", dense, DENSE)) unexpected(k, "dense push");
            if (gr_client_dense_pull(c, "mlp", dense, DENSE)) unexpected(k, "dense pull");
            atomic_fetch_add(&k->requests, 2);
        }
    }
    free(rows);
    free(g);
    free(dense);
    gr_client_destroy(c);
    return NULL;
}

/* A table created, used and dropped, over and over. */
static void *churn_main(void *arg)
{
    soak *k = arg;
    gr_client *c = connect_client(k);
    if (!c) {
        unexpected(k, "churn client");
        return NULL;
    }
    uint64_t keys[64];
    float g[64 * 8];
    for (int i = 0; i < 64; i++) keys[i] = (uint64_t)i * 7919;
    for (int i = 0; i < 64 * 8; i++) g[i] = 0.01f;
    while (running(k)) {
        pthread_mutex_lock(&k->tables_mu);
        if (gr_client_create_table(c, "{\"name\":\"churn\",\"id\":100,\"dim\":8}"))
            unexpected(k, "create table");
        if (gr_client_push(c, 100, 8, keys, 64, g)) unexpected(k, "push to a new table");
        if (gr_client_drop_table(c, "churn")) unexpected(k, "drop table");
        pthread_mutex_unlock(&k->tables_mu);
        atomic_fetch_add(&k->requests, 3);
        gr_sleep_ms(100);
    }
    gr_client_destroy(c);
    return NULL;
}

/* Incremental checkpoints with retention, every few seconds. */
static void *ckpt_main(void *arg)
{
    soak *k = arg;
    gr_client *c = connect_client(k);
    if (!c) {
        unexpected(k, "checkpoint client");
        return NULL;
    }
    char parent[64] = "";
    for (uint64_t step = 1; running(k); step++) {
        gr_client_ckpt_opts o = {.root = "soak", .step = step, .incremental = true,
                                 .full_every = 5, .keep = 2, .parent = parent[0] ? parent : NULL,
                                 .meta = "{\"soak\":true}"};
        gr_client_ckpt_info info;
        pthread_mutex_lock(&k->tables_mu);
        int rc = gr_client_ckpt_save(c, &o, &info);
        pthread_mutex_unlock(&k->tables_mu);
        if (rc) {
            unexpected(k, "checkpoint save");
            parent[0] = '\0';
        } else {
            snprintf(parent, sizeof parent, "%s", info.name);
            atomic_fetch_add(&k->checkpoints, 1);
        }
        atomic_fetch_add(&k->requests, 1);
        for (int i = 0; i < 30 && running(k); i++) gr_sleep_ms(100);
    }
    gr_client_destroy(c);
    return NULL;
}

/* Clients that connect, pull once and vanish; connections cut mid-frame; frames that are not
 * the protocol (the shard must answer or close, and keep serving everyone else). */
static void *hostile_main(void *arg)
{
    soak *k = arg;
    uint64_t key = 42;
    float row[DIM];
    for (unsigned i = 0; running(k); i++) {
        gr_client *c = connect_client(k);
        if (!c || gr_client_pull(c, 1, DIM, &key, 1, row)) unexpected(k, "short-lived client");
        gr_client_destroy(c);
        atomic_fetch_add(&k->clients, 1);
        atomic_fetch_add(&k->requests, 1);
        int fd = gr_bench_tcp_connect(k->port[i % SHARDS]);
        if (fd < 0) {
            unexpected(k, "raw connect");
        } else {
            /* Half a header, then gone; or 24 bytes of garbage, answered by a close. */
            uint8_t junk[24];
            memset(junk, i % 2 ? 0xA5 : 0x00, sizeof junk);
            size_t n = i % 2 ? sizeof junk : 11;
            if (send(fd, junk, n, MSG_NOSIGNAL) == (ssize_t)n && i % 2) {
                struct pollfd p = {fd, POLLIN, 0};
                char buf[512];
                while (poll(&p, 1, 5000) > 0 && recv(fd, buf, sizeof buf, 0) > 0) {}
                atomic_fetch_add(&k->bad_frames, 1);
            }
            close(fd);
            atomic_fetch_add(&k->expected, 1);
        }
        gr_sleep_ms(50);
    }
    return NULL;
}

/* ---- the run ---- */

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

/* Every option of `granary bench soak`, declared once. */
#define SOAK_BENCH_OPTIONS(X)                                                                  \
    X(SB_MINUTES, "minutes", GR_CLI_NUM, NULL, 0.001, 1440, NULL, "N", "1",                     \
      "how long to run, in minutes (fractions allowed)")                                       \
    X(SB_JSON, "json", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL, "print a final JSON line")

enum { SOAK_BENCH_OPTIONS(GR_CLI_ENUM) SB_COUNT };
static const gr_cli_opt soak_bench_opts[] = {SOAK_BENCH_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec soak_bench_spec = {
    .command = "bench soak",
    .synopsis =
        "granary bench soak [--minutes N] [--json]\n"
        "  two local shards under mixed load for N minutes: pulls, pushes, creates and drops,\n"
        "  checkpoints, clients connecting and vanishing, bad frames; samples each shard's RSS,\n"
        "  threads and descriptors every few seconds and reports their growth after warm-up\n"
        "  (the first quarter)",
    .opts = soak_bench_opts,
    .n_opts = SB_COUNT,
};

static int setup_tables(soak *k)
{
    gr_client *c = connect_client(k);
    if (!c) return -1;
    int rc = 0;
    for (unsigned t = 1; t <= TABLES && !rc; t++) {
        char spec[256];
        snprintf(spec, sizeof spec, "{\"name\":\"t%u\",\"id\":%u,\"dim\":%d,"
                 "\"init\":{\"kind\":\"uniform\",\"low\":-0.05,\"high\":0.05},"
                 "\"optimizer\":{\"kind\":\"adagrad\",\"lr\":0.05}}", t, t, DIM);
        rc = gr_client_create_table(c, spec);
    }
    if (!rc) rc = gr_client_dense_create(c, "{\"name\":\"mlp\",\"size\":1000,"
                                            "\"optimizer\":{\"kind\":\"adam\",\"lr\":0.001}}");
    if (rc) fprintf(stderr, "soak: setup: %s\n", gr_errmsg());
    gr_client_destroy(c);
    return rc;
}

static long long growth(const sample *s, size_t n, size_t from, int what)
{
    long long worst = 0;
    for (unsigned i = 0; i < SHARDS; i++) {
        const long long *a = what == 0 ? s[from].rss : what == 1 ? s[from].fds : s[from].threads;
        const long long *b = what == 0 ? s[n - 1].rss : what == 1 ? s[n - 1].fds
                                                                  : s[n - 1].threads;
        long long d = b[i] - a[i];
        if (i == 0 || d > worst) worst = d;
    }
    return worst;
}

int gr_bench_soak(int argc, char **argv)
{
    gr_cli_value v[SB_COUNT];
    gr_cli_parsed parsed;
    int exit_now = gr_cli_parse_or_exit(&soak_bench_spec, argc, argv, v, &parsed);
    gr_cli_parsed_fini(&parsed);
    if (exit_now >= 0) return exit_now;
    double minutes = v[SB_MINUTES].d;
    bool json = v[SB_JSON].b;
    soak *k = calloc(1, sizeof *k);
    sample *samples = calloc(MAX_SAMPLES, sizeof *samples);
    if (!k || !samples) return 1;
    pthread_mutex_init(&k->msg_mu, NULL);
    pthread_mutex_init(&k->tables_mu, NULL);
    snprintf(k->root, sizeof k->root, "/tmp/granary-soak-XXXXXX");
    int status = 1;
    if (!mkdtemp(k->root)) {
        fprintf(stderr, "granary bench soak: cannot create a temporary folder\n");
        goto out;
    }
    for (unsigned i = 0; i < SHARDS; i++) {
        if (start_shard(k, i)) {
            fprintf(stderr, "granary bench soak: shard %u did not start\n", i);
            goto stop;
        }
        char a[40];
        snprintf(a, sizeof a, "%s127.0.0.1:%u", i ? "," : "", k->port[i]);
        strcat(k->servers, a);
    }
    if (setup_tables(k)) goto stop;
    const double total_s = minutes * 60.0;
    /* A sample every 5 s, or ten in all for a short run (at least 1 s apart). */
    double every = total_s / 10 < 5.0 ? total_s / 10 : 5.0;
    if (every < 1.0) every = 1.0;
    uint64_t t0 = gr_now_ns();
    k->deadline_ns = t0 + (uint64_t)(total_s * 1e9);
    pthread_t th[5];
    void *(*mains[5])(void *) = {load_main, load_main, churn_main, ckpt_main, hostile_main};
    int started = 0;
    for (; started < 5; started++)
        if (pthread_create(&th[started], NULL, mains[started], k)) break;
    size_t ns = 0;
    for (double next = 0; ns < MAX_SAMPLES;) {
        double t = (double)(gr_now_ns() - t0) / 1e9;
        if (t >= next) {
            sample *s = &samples[ns++];
            s->t = t;
            for (unsigned i = 0; i < SHARDS; i++)
                sample_proc(k->pid[i], &s->rss[i], &s->threads[i], &s->fds[i]);
            if (!json)
                printf("%7.1f s  rss %6.1f / %6.1f MiB  threads %lld / %lld  fds %lld / %lld  "
                       "requests %llu\n", t, s->rss[0] / 1048576.0, s->rss[1] / 1048576.0,
                       s->threads[0], s->threads[1], s->fds[0], s->fds[1],
                       (unsigned long long)atomic_load(&k->requests));
            fflush(stdout);
            next += every;
        }
        if (gr_now_ns() >= k->deadline_ns) break;
        gr_sleep_ms(100);
    }
    atomic_store(&k->stop, true);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    /* One last sample once the load has stopped (connections closed). */
    if (ns < MAX_SAMPLES) {
        gr_sleep_ms(500);
        sample *s = &samples[ns++];
        s->t = (double)(gr_now_ns() - t0) / 1e9;
        for (unsigned i = 0; i < SHARDS; i++)
            sample_proc(k->pid[i], &s->rss[i], &s->threads[i], &s->fds[i]);
    }
    /* Growth compares like with like: the first sample after warm-up with the last one taken
     * under load. The idle sample shows what is left once every client has gone. */
    size_t loaded = ns > 1 ? ns - 1 : ns, from = 0;
    while (from + 1 < loaded && samples[from].t < total_s / 4) from++;
    long long rss_g = growth(samples, loaded, from, 0), fd_g = growth(samples, loaded, from, 1),
              th_g = growth(samples, loaded, from, 2);
    const sample *idle = &samples[ns - 1];
    int exits[SHARDS];
    for (unsigned i = 0; i < SHARDS; i++) {
        exits[i] = stop_shard(k->pid[i]);
        k->pid[i] = 0;
        if (exits[i] != 0) unexpected(k, "shard exit status");
    }
    unsigned long long bad = atomic_load(&k->unexpected);
    printf("soak: %.2f min, %llu requests, %llu unexpected errors, %llu checkpoints, %llu "
           "short-lived clients, %llu bad frames; after warm-up (%.0f s): rss %+lld bytes, fds "
           "%+lld, threads %+lld (worst shard)%s%s\n",
           minutes, (unsigned long long)atomic_load(&k->requests), bad,
           (unsigned long long)atomic_load(&k->checkpoints),
           (unsigned long long)atomic_load(&k->clients),
           (unsigned long long)atomic_load(&k->bad_frames), samples[from].t, rss_g, fd_g, th_g,
           bad ? "; first: " : "", bad ? k->first_error : "");
    if (json)
        printf("{\"bench\":\"soak\",\"minutes\":%g,\"shards\":%d,\"requests\":%llu,"
               "\"errors_unexpected\":%llu,\"errors_expected\":%llu,\"checkpoints\":%llu,"
               "\"clients_vanished\":%llu,\"bad_frames\":%llu,\"samples\":%zu,"
               "\"warmup_s\":%.1f,\"rss_start_bytes\":%lld,\"rss_end_bytes\":%lld,"
               "\"rss_growth_bytes\":%lld,\"fd_growth\":%lld,\"thread_growth\":%lld,"
               "\"idle_fds\":%lld,\"idle_threads\":%lld}\n",
               minutes, SHARDS, (unsigned long long)atomic_load(&k->requests), bad,
               (unsigned long long)atomic_load(&k->expected),
               (unsigned long long)atomic_load(&k->checkpoints),
               (unsigned long long)atomic_load(&k->clients),
               (unsigned long long)atomic_load(&k->bad_frames), ns, samples[from].t,
               samples[from].rss[0] + samples[from].rss[1],
               samples[loaded - 1].rss[0] + samples[loaded - 1].rss[1], rss_g, fd_g, th_g,
               idle->fds[0] + idle->fds[1], idle->threads[0] + idle->threads[1]);
    status = bad ? 1 : 0;
stop:
    for (unsigned i = 0; i < SHARDS; i++)
        if (k->pid[i] > 0) stop_shard(k->pid[i]);
    nftw(k->root, rm_entry, 16, FTW_DEPTH | FTW_PHYS); /* ours: mkdtemp above */
out:
    free(samples);
    free(k);
    return status;
}
