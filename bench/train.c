/* `granary bench train`: end-to-end DLRM training over the parameter server on generated data,
 * beside its baselines measured in the same run on the same files: PyTorch's DLRM
 * (bench/torch_dlrm.py), the in-process local backend, and the reader alone. It measures
 *  - the main run: the default (hybrid), 2 workers, an embedded cluster of 1 shard, as granary
 *    train starts it (examples/s, test AUC);
 *  - a straggler run: 4 workers, worker 3 three times slower, in sync, semisync (K = 3) and
 *    async;
 *  - pipelined vs --no-pipeline with the shards behind an emulated datacenter link: a network
 *    namespace + veth + netem delay when the kernel has netem, else a userspace relay that
 *    holds every chunk of bytes for the same one-way delay (the output says which).
 * The last line with --json holds every figure. */
#include "bench/bench.h"
#include "bench/train_int.h"
#include "cli/opts.h"
#include "granary/cluster.h"
#include "granary/client.h"
#include "granary/train.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Every option of `granary bench train`, declared once. --rows and --test-rows have no default
 * in the table because theirs follows --full. */
#define TRAIN_BENCH_OPTIONS(X)                                                                 \
    X(RB_JSON, "json", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,                               \
      "print a final JSON line with the figures")                                             \
    X(RB_FULL, "full", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,                               \
      "1M training and 100k test rows unless --rows / --test-rows")                           \
    X(RB_ROWS, "rows", GR_CLI_INT, NULL, 1, 1e15, NULL, "N", NULL,                              \
      "training rows generated (default 200000; --full 1000000)")                              \
    X(RB_TEST_ROWS, "test-rows", GR_CLI_INT, NULL, 1, 1e15, NULL, "M", NULL,                    \
      "test rows (default 20000; --full 100000)")                                              \
    X(RB_NO_TORCH, "no-torch", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,                       \
      "skip the PyTorch baseline")                                                            \
    X(RB_DELAY_US, "delay-us", GR_CLI_INT, NULL, 1, 10000000, NULL, "D", "200",                 \
      "one-way delay of the emulated link, in microseconds")                                  \
    X(RB_SKIP_LINK, "skip-link", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,                     \
      "skip the pipelined vs --no-pipeline runs over the delayed link")                       \
    X(RB_SKIP_STRAGGLER, "skip-straggler", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,           \
      "skip the 4-worker straggler runs")                                                     \
    X(RB_DENSE_LAG, "dense-lag", GR_CLI_INT, NULL, 0, 64, NULL, "L", NULL,                     \
      "hybrid runs: the dense lag (default: granary train's, 1 for 2+ workers)")              \
    X(RB_NO_DIRECT, "no-direct", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,                   \
      "embedded runs: rows over the shards' sockets (granary train --no-direct)")             \
    X(RB_MODEL_STEP_ONLY, "model-step-only", GR_CLI_FLAG, NULL, 0, 0, NULL, NULL, NULL,         \
      "only time one DLRM training step (thread CPU per example) and exit")                    \
    X(RB_ROUNDS, "rounds", GR_CLI_INT, NULL, 1, 20, NULL, "R", "3",                              \
      "rounds of a fresh `granary train` beside a PyTorch run; the speed ratio is their median")

enum { TRAIN_BENCH_OPTIONS(GR_CLI_ENUM) RB_COUNT };
static const gr_cli_opt train_bench_opts[] = {TRAIN_BENCH_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec train_bench_spec = {
    .command = "bench train",
    .synopsis = "granary bench train [--json] [--full] [--rows N] [--test-rows M] [--no-torch]\n"
                "                           [--delay-us D] [--skip-link] [--skip-straggler]\n"
                "                           [--dense-lag L] [--no-direct] [--model-step-only]\n"
                "                           [--rounds R]",
    .opts = train_bench_opts,
    .n_opts = RB_COUNT,
};

/* ---- PyTorch baseline ---- */


/* Parse-only throughput of the reader over the training file, rows/s. */
static double run_reader(const char *path)
{
    gr_criteo_opts o;
    gr_criteo_opts_default(&o);
    gr_criteo_reader *r;
    if (gr_criteo_open(path, &o, &r)) return -1;
    gr_batch b;
    if (gr_batch_init(&b, o.batch)) {
        gr_criteo_close(r);
        return -1;
    }
    double t0 = gr_now_s();
    uint64_t n = 0;
    while (gr_criteo_next(r, &b) == 0 && b.n) n += b.n;
    double secs = gr_now_s() - t0;
    gr_batch_fini(&b);
    gr_criteo_close(r);
    return secs > 0 ? (double)n / secs : -1;
}

/* ---- one DLRM training step alone ---- */

static double thread_cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* gr_model_train_step of the default DLRM on one batch of 1024 random examples, `steps` times
 * on the same inputs: the median and the best thread CPU per example, in microseconds (the
 * model's own CPU, without the reader, the pulls and pushes or the other threads; thread
 * CPU rather than wall time, so a loaded machine changes it less). -1 when it cannot run. */
static void run_model_step(int steps, double *median_us, double *min_us)
{
    *median_us = *min_us = -1;
    const size_t n = 1024;
    gr_model_config c;
    gr_model_config_default(&c, GR_MODEL_DLRM);
    gr_model *m = NULL;
    gr_model_ws *ws = NULL;
    if (gr_model_create(&c, &m) || gr_model_ws_create(m, &ws)) {
        gr_model_destroy(m);
        return;
    }
    const size_t np = gr_model_dense_size(m), nd = gr_model_n_dense(m);
    const size_t ne = n * gr_model_n_sparse(m) * gr_model_emb_dim(m);
    float *p = malloc(np * sizeof *p), *g = malloc(np * sizeof *g);
    float *dense = malloc(n * nd * sizeof *dense), *emb = malloc(ne * sizeof *emb);
    float *gemb = malloc(ne * sizeof *gemb), *labels = malloc(n * sizeof *labels);
    double *t = malloc((size_t)steps * sizeof *t);
    if (p && g && dense && emb && gemb && labels && t) {
        gr_model_init_dense(m, p);
        gr_rng r;
        gr_rng_seed(&r, 7);
        /* like the data: a third of the dense features 0, small embedding values */
        for (size_t i = 0; i < n * nd; i++)
            dense[i] = gr_rng_uniform(&r) < 0.3 ? 0.0f : (float)(3 * gr_rng_uniform(&r));
        for (size_t i = 0; i < ne; i++) emb[i] = (float)(0.1 * (gr_rng_uniform(&r) - 0.5));
        for (size_t i = 0; i < n; i++) labels[i] = (float)(gr_rng_uniform(&r) < 0.25);
        int done = 0;
        for (; done < steps; done++) {
            double loss, t0 = thread_cpu_s();
            if (gr_model_train_step(m, ws, p, n, dense, emb, labels, &loss, NULL, g, gemb)) break;
            t[done] = thread_cpu_s() - t0;
        }
        if (done == steps && steps > 0) {
            qsort(t, (size_t)steps, sizeof *t, cmp_double);
            *median_us = 1e6 * t[steps / 2] / (double)n;
            *min_us = 1e6 * t[0] / (double)n;
        }
    }
    free(p);
    free(g);
    free(dense);
    free(emb);
    free(gemb);
    free(labels);
    free(t);
    gr_model_ws_destroy(ws);
    gr_model_destroy(m);
}

/* ---- one training run ---- */

typedef struct run_spec {
    const char *label;
    gr_train_mode mode;
    unsigned workers;
    uint32_t aggregate;
    int pipeline;        /* 1 on, 0 off, -1 granary train's default (gr_train_default_pipeline) */
    bool local;          /* the in-process local backend instead of the PS */
    const char *servers; /* use these shards instead of an embedded cluster */
    int straggler;       /* -1: none */
} run_spec;

/* --dense-lag for the hybrid runs; -1: granary train's default for the worker count. */
static long bench_dense_lag = -1;
/* --no-direct: the embedded runs' rows over the shards' sockets, not by direct call. */
static bool bench_no_direct = false;

static uint32_t dense_lag_for(const run_spec *rs)
{
    if (rs->mode != GR_MODE_HYBRID) return 0;
    return bench_dense_lag >= 0 ? (uint32_t)bench_dense_lag : gr_train_dense_lag_default(rs->workers);
}

static int run_granary(const char *dir, const run_spec *rs, gr_train_result *res)
{
    char train[PATH_MAX], test[PATH_MAX];
    snprintf(train, sizeof train, "%s/train.tsv", dir);
    snprintf(test, sizeof test, "%s/test.tsv", dir);
    gr_train_opts o;
    gr_train_opts_default(&o, GR_MODEL_DLRM);
    o.train_path = train;
    o.test_path = test;
    o.workers = rs->workers;
    /* As granary train's --seed default (1): its embedding seed is the model's ^ "emb" (the
     * library's default embedding seed is 0's). */
    o.emb.seed = o.model.seed ^ 0x656d62;
    /* As granary train: a pipeline unless the shards are called in process and the workers
     * keep the cores busy between them. */
    bool direct = !rs->local && !rs->servers && !bench_no_direct;
    o.pipeline = rs->pipeline >= 0 ? rs->pipeline != 0
                                   : gr_train_default_pipeline(rs->workers, direct);
    o.mode = rs->mode;
    o.progress_s = 0;
    if (rs->straggler >= 0) {
        o.straggler = (unsigned)rs->straggler;
        o.straggler_factor = 3;
    }
    gr_train_backend be;
    gr_local_cluster *cl = NULL;
    gr_client *client = NULL;
    int rc;
    if (rs->local) {
        rc = gr_local_backend_create(NULL, &be);
    } else {
        const char *servers = rs->servers;
        if (!servers) {
            /* As granary train: row memory ahead, and its own client reaches the embedded
             * shards over AF_UNIX. */
            gr_local_cluster_opts lo;
            gr_local_cluster_opts_default(&lo, 1); /* granary train's --shards default */
            lo.populate_ahead = GR_LOCAL_CLUSTER_AHEAD;
            lo.huge_rows = GR_LOCAL_CLUSTER_HUGE_ROWS;
            rc = gr_local_cluster_start_opts(&lo, &cl);
            if (rc) return rc;
            servers = gr_local_cluster_local_servers(cl);
        }
        gr_client_config cc;
        gr_client_config_default(&cc);
        cc.servers = servers;
        cc.slice_us = GR_TRAIN_IO_SLICE_US; /* as granary train's client */
        rc = gr_client_create(&cc, &client);
        /* As granary train: its rows go to the embedded shards' tables by direct call. */
        if (!rc && cl && !bench_no_direct) {
            rc = gr_local_cluster_direct(cl, client);
            o.stage_slice_us = 0; /* as granary train: no socket to wait on */
        }
        if (!rc) {
            gr_ps_backend_opts po;
            gr_ps_backend_opts_default(&po);
            po.client = client;
            po.mode = rs->mode;
            po.workers = rs->workers;
            po.aggregate = rs->aggregate;
            po.staleness = rs->mode == GR_MODE_SSP ? 2 : 0;
            po.dense_lag = dense_lag_for(rs);
            po.reset = true;
            /* Runs over the relay share one cluster: each starts from new tables. */
            po.tables = GR_PS_TABLES_FRESH;
            /* As granary train does: the one-worker dense rate, scaled by the trainer's rule. */
            po.dense_lr = gr_train_dense_lr(rs->mode, rs->workers, po.dense_lr);
            rc = gr_ps_backend_create(&po, &be);
        }
    }
    if (!rc) {
        fprintf(stderr, "bench train: %s ...\n", rs->label);
        rc = gr_train_run(&o, &be, res);
        char msg[512];
        snprintf(msg, sizeof msg, "%s", rc ? gr_errmsg() : "");
        if (!rs->local) gr_ps_backend_finish(&be);
        gr_train_backend_destroy(&be);
        if (rc) gr_seterr(rc, "%s: %s", rs->label, msg);
    }
    gr_client_destroy(client);
    gr_local_cluster_stop(cl);
    return rc;
}

/* ---- the emulated datacenter link ---- */

/* Userspace relay: every chunk of bytes read from one side is written to the other no earlier
 * than delay after it was read, in both directions, without limiting bandwidth (what netem
 * delay does in the kernel). One relay per shard; each accepted connection gets four threads
 * (a reader and a delayed writer per direction). */
typedef struct chunk {
    struct chunk *next;
    uint64_t due_ns;
    size_t len; /* 0 = end of stream */
    uint8_t data[];
} chunk;

typedef struct pipe_dir {
    int from, to;
    uint64_t delay_ns;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    chunk *head, *tail;
} pipe_dir;

typedef struct relay {
    int lfd;
    uint16_t port;
    char target[64];
    uint16_t target_port;
    uint64_t delay_ns;
    pthread_t acceptor;
    atomic_bool stop;
    pthread_mutex_t mu;
    pthread_t threads[512];
    pipe_dir *dirs[128];
    unsigned nthreads, ndirs;
} relay;

static void *dir_reader(void *arg)
{
    pipe_dir *d = arg;
    for (;;) {
        chunk *c = malloc(sizeof *c + 262144);
        if (!c) break;
        ssize_t r = recv(d->from, c->data, 262144, 0);
        if (r < 0 && errno == EINTR) {
            free(c);
            continue;
        }
        c->len = r > 0 ? (size_t)r : 0;
        c->due_ns = gr_now_ns() + d->delay_ns;
        c->next = NULL;
        pthread_mutex_lock(&d->mu);
        if (d->tail) d->tail->next = c;
        else d->head = c;
        d->tail = c;
        pthread_cond_signal(&d->cv);
        pthread_mutex_unlock(&d->mu);
        if (r <= 0) break;
    }
    return NULL;
}

static void *dir_writer(void *arg)
{
    pipe_dir *d = arg;
    for (;;) {
        pthread_mutex_lock(&d->mu);
        while (!d->head) pthread_cond_wait(&d->cv, &d->mu);
        chunk *c = d->head;
        d->head = c->next;
        if (!d->head) d->tail = NULL;
        pthread_mutex_unlock(&d->mu);
        uint64_t now = gr_now_ns();
        if (c->due_ns > now) {
            uint64_t w = c->due_ns - now;
            struct timespec ts = {(time_t)(w / 1000000000u), (long)(w % 1000000000u)};
            while (nanosleep(&ts, &ts) != 0) {
            }
        }
        if (c->len == 0) {
            free(c);
            shutdown(d->to, SHUT_WR);
            break;
        }
        size_t off = 0;
        bool dead = false;
        while (off < c->len) {
            ssize_t w = send(d->to, c->data + off, c->len - off, MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                dead = true;
                break;
            }
            off += (size_t)w;
        }
        free(c);
        if (dead) {
            shutdown(d->from, SHUT_RDWR);
            break;
        }
    }
    return NULL;
}

static int tcp_listen(uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 16) ||
        getsockname(fd, (struct sockaddr *)&a, &sl)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static void tune(int fd)
{
    int one = 1, buf = 4 << 20;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

static void *relay_accept(void *arg)
{
    relay *r = arg;
    while (!atomic_load(&r->stop)) {
        struct pollfd p = {r->lfd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        int c = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) continue;
        int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(r->target_port)};
        inet_pton(AF_INET, r->target, &a.sin_addr);
        if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
            close(c);
            if (s >= 0) close(s);
            continue;
        }
        tune(c);
        tune(s);
        pthread_mutex_lock(&r->mu);
        if (r->ndirs + 2 <= 128 && r->nthreads + 4 <= 512) {
            int ends[2][2] = {{c, s}, {s, c}};
            for (int k = 0; k < 2; k++) {
                pipe_dir *d = calloc(1, sizeof *d);
                d->from = ends[k][0];
                d->to = ends[k][1];
                d->delay_ns = r->delay_ns;
                pthread_mutex_init(&d->mu, NULL);
                pthread_cond_init(&d->cv, NULL);
                r->dirs[r->ndirs++] = d;
                pthread_create(&r->threads[r->nthreads++], NULL, dir_reader, d);
                pthread_create(&r->threads[r->nthreads++], NULL, dir_writer, d);
            }
        } else {
            close(c);
            close(s);
        }
        pthread_mutex_unlock(&r->mu);
    }
    return NULL;
}

static int relay_start(relay *r, const char *target, uint16_t port, uint64_t delay_ns)
{
    memset(r, 0, sizeof *r);
    snprintf(r->target, sizeof r->target, "%s", target);
    r->target_port = port;
    r->delay_ns = delay_ns;
    pthread_mutex_init(&r->mu, NULL);
    r->lfd = tcp_listen(&r->port);
    if (r->lfd < 0) return -1;
    return pthread_create(&r->acceptor, NULL, relay_accept, r) == 0 ? 0 : -1;
}

static void relay_stop(relay *r)
{
    atomic_store(&r->stop, true);
    pthread_join(r->acceptor, NULL);
    close(r->lfd);
    /* The client has closed its side: readers see EOF, writers pass it on and exit. */
    for (unsigned i = 0; i < r->ndirs; i++) shutdown(r->dirs[i]->from, SHUT_RDWR);
    for (unsigned i = 0; i < r->nthreads; i++) pthread_join(r->threads[i], NULL);
    for (unsigned i = 0; i < r->ndirs; i++) {
        pipe_dir *d = r->dirs[i];
        for (chunk *c = d->head, *n; c; c = n) {
            n = c->next;
            free(c);
        }
        close(d->from);
        free(d);
    }
}

/* netem: shards as `granary server` children inside a network namespace behind a veth pair
 * with `tc qdisc ... netem delay` on both ends. Returns false (after cleaning up) when any step
 * fails, e.g. a kernel without netem. */
typedef struct netem_env {
    char ns[32], veth[16];
    pid_t pids[2];
    FILE *out[2]; /* the shards' stdout, kept open so they never write to a closed pipe */
    char servers[128];
} netem_env;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[600];
    snprintf(full, sizeof full, "%s >/dev/null 2>&1", cmd);
    int st = system(full);
    return st == -1 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
}

static void netem_down(netem_env *e)
{
    for (int i = 0; i < 2; i++) {
        if (e->pids[i] > 0) {
            kill(e->pids[i], SIGTERM);
            waitpid(e->pids[i], NULL, 0);
            e->pids[i] = 0;
        }
        if (e->out[i]) fclose(e->out[i]);
        e->out[i] = NULL;
    }
    sh("ip link del %s", e->veth);
    sh("ip netns del %s", e->ns);
}

static bool netem_up(netem_env *e, unsigned delay_us, char *why, size_t cap)
{
    memset(e, 0, sizeof *e);
    unsigned tag = (unsigned)getpid() % 10000;
    snprintf(e->ns, sizeof e->ns, "grbench%u", tag);
    snprintf(e->veth, sizeof e->veth, "grb%u", tag);
    unsigned net = 200 + tag % 50;
    if (sh("ip netns add %s", e->ns) || sh("ip link add %s type veth peer name %sp", e->veth, e->veth) ||
        sh("ip link set %sp netns %s", e->veth, e->ns) ||
        sh("ip addr add 10.%u.0.1/24 dev %s", net, e->veth) || sh("ip link set %s up", e->veth) ||
        sh("ip netns exec %s ip addr add 10.%u.0.2/24 dev %sp", e->ns, net, e->veth) ||
        sh("ip netns exec %s ip link set %sp up", e->ns, e->veth) ||
        sh("ip netns exec %s ip link set lo up", e->ns)) {
        snprintf(why, cap, "cannot set up a network namespace with a veth pair (needs root and "
                           "iproute2)");
        netem_down(e);
        return false;
    }
    if (sh("tc qdisc add dev %s root netem delay %uus", e->veth, delay_us) ||
        sh("ip netns exec %s tc qdisc add dev %sp root netem delay %uus", e->ns, e->veth, delay_us)) {
        snprintf(why, cap, "netem is not available in this kernel: `tc qdisc add ... netem` "
                           "fails");
        netem_down(e);
        return false;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        netem_down(e);
        return false;
    }
    exe[n] = '\0';
    e->servers[0] = '\0';
    for (int i = 0; i < 2; i++) {
        int p[2];
        if (pipe(p) != 0) break;
        pid_t pid = fork();
        if (pid == 0) {
            dup2(p[1], 1);
            close(p[0]);
            close(p[1]);
            char listen[32], shard[4];
            snprintf(listen, sizeof listen, "10.%u.0.2:0", net);
            snprintf(shard, sizeof shard, "%d", i);
            execlp("ip", "ip", "netns", "exec", e->ns, exe, "server", "--listen", listen,
                   "--shard", shard, "--shards", "2", "--threads", "2", "--insecure", (char *)NULL);
            _exit(127);
        }
        close(p[1]);
        e->pids[i] = pid;
        FILE *f = fdopen(p[0], "r");
        e->out[i] = f;
        char line[256], *at = NULL;
        while (f && fgets(line, sizeof line, f))
            if ((at = strstr(line, "listening on "))) break;
        if (!at) {
            snprintf(why, cap, "a shard inside the namespace did not start");
            netem_down(e);
            return false;
        }
        at += strlen("listening on ");
        at[strcspn(at, "\r\n")] = '\0';
        if (i) strcat(e->servers, ",");
        strcat(e->servers, at);
    }
    return true;
}

/* ---- main ---- */

static void num(char *buf, size_t cap, double v, const char *fmt)
{
    if (v < 0 || v != v)
        snprintf(buf, cap, "null");
    else
        snprintf(buf, cap, fmt, v);
}

static void row(const char *name, const gr_train_result *r)
{
    printf("%-44s %12.0f %9.4f %9.4f %8llu\n", name, r->examples_per_sec, r->test_auc,
           r->test_logloss, (unsigned long long)r->dropped_gradients);
}

/* The slowest stage's time per batch (ms, per worker): what bounds a pipelined worker. */
static double slowest_stage_ms(const gr_train_result *r)
{
    double st[5] = {r->read_seconds, r->pull_seconds, r->compute_seconds, r->push_seconds,
                    r->stage_wait_seconds};
    double m = 0;
    for (int i = 0; i < 5; i++)
        if (st[i] > m) m = st[i];
    return r->steps ? 1e3 * m / (double)r->steps : 0;
}

/* The rate the slowest stage allows: W workers, each one batch per slowest-stage time. */
static double stage_bound_eps(const gr_train_result *r, unsigned workers, size_t batch)
{
    double ms = slowest_stage_ms(r);
    return ms > 0 ? (double)workers * (double)batch * 1e3 / ms *
                        ((double)r->examples / ((double)r->steps * (double)batch))
                  : -1;
}

/* The overlap targets for one configuration over the delayed link. io/compute: the step's
 * I/O (pull + push stages) against its compute stage, measured without the pipeline. */
static void overlap_line(const char *name, const gr_train_result *p, const gr_train_result *q,
                         double bound)
{
    if (bound <= 0 || !q->examples) return;
    printf("  %s over the link: I/O / compute %.2f; pipelined >= 1.6 x --no-pipeline: %.2fx %s; "
           ">= 0.9 x the slowest stage's rate: %.2fx %s\n",
           name, q->compute_seconds > 0 ? (q->pull_seconds + q->push_seconds) / q->compute_seconds : 0,
           p->examples_per_sec / q->examples_per_sec,
           p->examples_per_sec >= 1.6 * q->examples_per_sec ? "met" : "NOT met",
           p->examples_per_sec / bound, p->examples_per_sec >= 0.9 * bound ? "met" : "NOT met");
}

static void stage_row(const char *name, const gr_train_result *r)
{
    double k = r->steps ? 1e3 / (double)r->steps : 0;
    printf("  %-42s ms/batch read %.2f pull %.2f compute %.2f push %.2f wait %.2f\n", name,
           r->read_seconds * k, r->pull_seconds * k, r->compute_seconds * k, r->push_seconds * k,
           r->stage_wait_seconds * k);
}

int gr_bench_train(int argc, char **argv)
{
    gr_cli_value v[RB_COUNT];
    gr_cli_parsed parsed;
    int exit_now = gr_cli_parse_or_exit(&train_bench_spec, argc, argv, v, &parsed);
    gr_cli_parsed_fini(&parsed);
    if (exit_now >= 0) return exit_now;
    bool json = v[RB_JSON].b, full = v[RB_FULL].b, torch = !v[RB_NO_TORCH].b,
         link = !v[RB_SKIP_LINK].b, strag = !v[RB_SKIP_STRAGGLER].b;
    uint64_t rows = (uint64_t)v[RB_ROWS].i, test_rows = (uint64_t)v[RB_TEST_ROWS].i,
             delay_us = (uint64_t)v[RB_DELAY_US].i;
    bench_dense_lag = v[RB_DENSE_LAG].given ? (long)v[RB_DENSE_LAG].i : -1;
    bench_no_direct = v[RB_NO_DIRECT].b;
    if (!rows) rows = full ? 1000000 : 200000;
    if (!test_rows) test_rows = full ? 100000 : 20000;
    double step_us, step_min_us;
    run_model_step(200, &step_us, &step_min_us);
    printf("model step alone (DLRM defaults, 1024 examples, 200 steps): %.3f us of thread CPU "
           "per example (median), best %.3f\n",
           step_us, step_min_us);
    if (v[RB_MODEL_STEP_ONLY].b) {
        if (json)
            printf("{\"bench\":\"train\",\"model_step_us_per_example\":%.4f,"
                   "\"model_step_min_us_per_example\":%.4f}\n",
                   step_us, step_min_us);
        return step_us < 0;
    }

    char dir[] = "/tmp/granary_bench_train_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("granary bench train: mkdtemp");
        return 1;
    }
    int status = 1;
    gr_datagen_opts go = {.train_rows = rows, .test_rows = test_rows, .seed = 1, .threads = 2};
    gr_datagen_result gd;
    printf("granary bench train: DLRM (dim 16, 13-64-32-16, 367-128-64-1), batch 1024 per worker, "
           "1 epoch, embedded cluster of 1 shard (2 threads); datagen seed 1, %llu train / "
           "%llu test rows%s\n",
           (unsigned long long)rows, (unsigned long long)test_rows,
           full ? "" : " (default size; --full: 1 M)");
    if (gr_datagen_run(dir, &go, &gd)) {
        fprintf(stderr, "granary bench train: datagen: %s\n", gr_errmsg());
        goto out;
    }
    printf("datagen: %.2f s; teacher test AUC %.4f logloss %.4f\n", gd.seconds, gd.teacher_auc,
           gd.teacher_logloss);
    char train[PATH_MAX];
    snprintf(train, sizeof train, "%s/train.tsv", dir);
    double parse = run_reader(train);

    gr_train_result main_r, local_r, s_sync, s_semi, s_async, l_pipe, l_seq, l1_pipe, l1_seq;
    memset(&s_sync, 0, sizeof s_sync);
    memset(&s_semi, 0, sizeof s_semi);
    memset(&s_async, 0, sizeof s_async);
    memset(&l_pipe, 0, sizeof l_pipe);
    memset(&l_seq, 0, sizeof l_seq);
    memset(&l1_pipe, 0, sizeof l1_pipe);
    memset(&l1_seq, 0, sizeof l1_seq);
    gr_train_result lp_pipe, lp_seq; /* ssp, 1 worker, over the link */
    memset(&lp_pipe, 0, sizeof lp_pipe);
    memset(&lp_seq, 0, sizeof lp_seq);
    /* The default: what `granary train` picks for 2 workers (hybrid), beside one worker (its
     * default, async) and the former default (async with 2 workers). */
    gr_train_mode def_mode = gr_train_default_mode(2);
    char main_label[64];
    snprintf(main_label, sizeof main_label, "default (%s), 2 workers", gr_train_mode_name(def_mode));
    gr_train_result single_r, async2_r, hybrid_r;
    run_spec main_spec = {main_label, def_mode, 2, 0, -1, false, NULL, -1};
    run_spec single_spec = {"default, 1 worker", gr_train_default_mode(1), 1, 0, -1, false, NULL, -1};
    run_spec async2_spec = {"async, 2 workers", GR_MODE_ASYNC, 2, 0, -1, false, NULL, -1};
    run_spec hybrid_spec = {"hybrid, 2 workers", GR_MODE_HYBRID, 2, 0, -1, false, NULL, -1};
    run_spec local_spec = {"local backend, 2 workers", GR_MODE_ASYNC, 2, 0, 1, true, NULL, -1};
    if (run_granary(dir, &main_spec, &main_r) || run_granary(dir, &single_spec, &single_r) ||
        run_granary(dir, &async2_spec, &async2_r) ||
        (def_mode != GR_MODE_HYBRID && run_granary(dir, &hybrid_spec, &hybrid_r)) ||
        run_granary(dir, &local_spec, &local_r)) {
        fprintf(stderr, "granary bench train: %s\n", gr_errmsg());
        goto out;
    }
    if (def_mode == GR_MODE_HYBRID) hybrid_r = main_r; /* the same run */
    if (strag) {
        run_spec a = {"straggler: sync, 4 workers", GR_MODE_SYNC, 4, 0, -1, false, NULL, 3};
        run_spec b = {"straggler: semisync K=3, 4 workers", GR_MODE_SEMISYNC, 4, 3, -1, false, NULL, 3};
        run_spec c = {"straggler: async, 4 workers", GR_MODE_ASYNC, 4, 0, -1, false, NULL, 3};
        if (run_granary(dir, &a, &s_sync) || run_granary(dir, &b, &s_semi) ||
            run_granary(dir, &c, &s_async)) {
            fprintf(stderr, "granary bench train: %s\n", gr_errmsg());
            goto out;
        }
    }
    char link_kind[32] = "none", link_why[256] = "";
    if (link) {
        netem_env ne;
        relay rl[2];
        int nrelay = 0;
        char servers[160] = "";
        gr_local_cluster *cl = NULL;
        if (netem_up(&ne, (unsigned)delay_us, link_why, sizeof link_why)) {
            snprintf(link_kind, sizeof link_kind, "netem");
            snprintf(servers, sizeof servers, "%s", ne.servers);
        } else if (gr_local_cluster_start(2, 2, &cl) == 0) {
            /* Relay each shard of an embedded cluster through a delaying proxy. */
            snprintf(link_kind, sizeof link_kind, "relay");
            const char *list = gr_local_cluster_servers(cl);
            for (int i = 0; i < 2; i++) {
                const char *p = list;
                for (int k = 0; k < i && p; k++) {
                    p = strchr(p, ',');
                    if (p) p++;
                }
                const char *colon = p ? strchr(p, ':') : NULL;
                uint16_t port;
                if (!colon || gr_bench_parse_port(colon + 1, &port)) {
                    fprintf(stderr, "granary bench train: bad cluster address list '%s'\n", list);
                    break;
                }
                if (relay_start(&rl[i], "127.0.0.1", port, delay_us * 1000u) != 0) break;
                nrelay++;
                char a[40];
                snprintf(a, sizeof a, "%s127.0.0.1:%u", i ? "," : "", rl[i].port);
                strcat(servers, a);
            }
        }
        if (servers[0] && (nrelay == 2 || !strcmp(link_kind, "netem"))) {
            printf("delayed link: %s, %llu us one way%s%s%s\n", link_kind,
                   (unsigned long long)delay_us, link_why[0] ? " (" : "",
                   link_why[0] ? link_why : "", link_why[0] ? ")" : "");
            /* 2 workers (the standard configuration) and 1 worker: with as many workers as
             * cores, one worker's network waits are filled by the other's compute, so the
             * pipeline's own effect shows best with one. */
            /* And ssp (staleness 2) with 1 worker: the dense parameters come with the rows in
             * the fetch stage, so the compute stage holds no round trip and a step's I/O can
             * overlap compute entirely (async keeps its dense round trips in compute, for
             * accuracy: docs/train.md). */
            run_spec specs[6] = {
                {"delayed link: async, 2 workers, pipelined", GR_MODE_ASYNC, 2, 0, 1, false, servers, -1},
                {"delayed link: async, 2 workers, --no-pipeline", GR_MODE_ASYNC, 2, 0, 0, false, servers, -1},
                {"delayed link: async, 1 worker, pipelined", GR_MODE_ASYNC, 1, 0, 1, false, servers, -1},
                {"delayed link: async, 1 worker, --no-pipeline", GR_MODE_ASYNC, 1, 0, 0, false, servers, -1},
                {"delayed link: ssp, 1 worker, pipelined", GR_MODE_SSP, 1, 0, 1, false, servers, -1},
                {"delayed link: ssp, 1 worker, --no-pipeline", GR_MODE_SSP, 1, 0, 0, false, servers, -1},
            };
            gr_train_result *outs[6] = {&l_pipe, &l_seq, &l1_pipe, &l1_seq, &lp_pipe, &lp_seq};
            int rc = 0;
            for (int k = 0; k < 6 && !rc; k++) {
                if (k) {
                    /* Fresh tables for each run: drop what the previous one created. */
                    gr_client_config cc;
                    gr_client_config_default(&cc);
                    cc.servers = servers;
                    gr_client *c;
                    if (gr_client_create(&cc, &c) == 0) {
                        gr_client_drop_table(c, "embeddings");
                        gr_client_destroy(c);
                    }
                }
                rc = run_granary(dir, &specs[k], outs[k]);
            }
            if (rc) fprintf(stderr, "granary bench train: %s\n", gr_errmsg());
        } else {
            snprintf(link_kind, sizeof link_kind, "none");
        }
        if (!strcmp(link_kind, "netem")) netem_down(&ne);
        for (int i = 0; i < nrelay; i++) relay_stop(&rl[i]);
        gr_local_cluster_stop(cl);
    }
    /* The baseline is PyTorch at its best thread count on this machine: with 2 threads
     * (torch's pool plus OpenBLAS's) on 2 cores it ran 2.4x slower than with 1 (session 4). */
    double t_eps = -1, t_auc = -1, t2_eps = -1, t2_auc = -1, t1_eps = -1, t1_auc = -1;
    char t_why[sizeof gr_bench_torch_why] = ""; /* why a PyTorch run gave no figure (the last such) */
    unsigned t_threads = 0;
    if (torch) {
        fprintf(stderr, "bench train: PyTorch DLRM (bench/torch_dlrm.py), 2 and 1 threads ...\n");
        gr_bench_run_torch(dir, 2, &t2_eps, &t2_auc);
        if (t2_eps < 0) snprintf(t_why, sizeof t_why, "%s", gr_bench_torch_why);
        gr_bench_run_torch(dir, 1, &t1_eps, &t1_auc);
        if (t1_eps < 0) snprintf(t_why, sizeof t_why, "%s", gr_bench_torch_why);
        bool one = t1_eps > t2_eps;
        t_eps = one ? t1_eps : t2_eps;
        t_auc = one ? t1_auc : t2_auc;
        t_threads = t_eps > 0 ? (one ? 1 : 2) : 0;
    }
    /* The speed ratio: rounds of a fresh `granary train` beside a PyTorch run at the faster
     * thread count (train_rounds.c). The 1-thread run just done is round 1's. */
    size_t nrounds = 0, want_rounds = (size_t)v[RB_ROUNDS].i;
    gr_bench_round rounds[20];
    char rounds_why[sizeof gr_bench_torch_why] = "";
    double ratio = -1;
    if (t_threads) {
        gr_bench_cli_args ca = {.no_direct = bench_no_direct, .dense_lag = bench_dense_lag};
        nrounds = gr_bench_rounds(dir, &ca, t_threads, want_rounds, t_threads == 1 ? t1_eps : -1,
                                  t1_auc, rounds, rounds_why, sizeof rounds_why);
        ratio = gr_bench_rounds_median_ratio(rounds, nrounds);
    }

    printf("\nreader alone (1 thread, parse only): %.0f rows/s\n\n", parse);
    printf("%-44s %12s %9s %9s %8s\n", "run", "examples/s", "test AUC", "logloss", "dropped");
    row("granary PS: default (hybrid), 2 workers", &main_r);
    row("granary PS: 1 worker (async)", &single_r);
    row("granary PS: async, 2 workers", &async2_r);
    if (def_mode != GR_MODE_HYBRID) row("granary PS: hybrid, 2 workers", &hybrid_r);
    stage_row("default, 2 workers", &main_r);
    row("granary local backend (no PS), 2 workers", &local_r);
    char te[32], ta[32];
    num(te, sizeof te, t2_eps, "%.0f");
    num(ta, sizeof ta, t2_auc, "%.4f");
    printf("%-44s %12s %9s\n", "pytorch DLRM, 2 threads (torch_dlrm.py)", te, ta);
    num(te, sizeof te, t1_eps, "%.0f");
    num(ta, sizeof ta, t1_auc, "%.4f");
    printf("%-44s %12s %9s\n", "pytorch DLRM, 1 thread (torch_dlrm.py)", te, ta);
    if (t_threads) printf("(the PyTorch baseline below is its faster run: %u thread%s)\n", t_threads,
                          t_threads == 1 ? "" : "s");
    printf("%-44s %12s %9.4f %9.4f\n", "teacher (ceiling)", "", gd.teacher_auc, gd.teacher_logloss);
    if (strag) {
        row("straggler (4 workers, #3 x3): sync", &s_sync);
        row("straggler: semisync K=3", &s_semi);
        row("straggler: async", &s_async);
    }
    if (l_pipe.examples) {
        row("delayed link: async, 2 workers, pipelined", &l_pipe);
        stage_row("pipelined", &l_pipe);
        row("delayed link: async, 2 workers, --no-pipeline", &l_seq);
        stage_row("--no-pipeline", &l_seq);
    }
    if (lp_seq.examples) {
        row("delayed link: ssp, 1 worker, pipelined", &lp_pipe);
        stage_row("pipelined", &lp_pipe);
        row("delayed link: ssp, 1 worker, --no-pipeline", &lp_seq);
        stage_row("--no-pipeline", &lp_seq);
    }
    if (l1_seq.examples) {
        row("delayed link: async, 1 worker, pipelined", &l1_pipe);
        stage_row("pipelined", &l1_pipe);
        row("delayed link: async, 1 worker, --no-pipeline", &l1_seq);
        stage_row("--no-pipeline", &l1_seq);
    }
    if (t_threads) {
        printf("\nspeed against PyTorch (%u thread%s): %zu round%s of a fresh `granary train` (its "
               "defaults) beside a PyTorch run, the two in turn first\n",
               t_threads, t_threads == 1 ? "" : "s", nrounds, nrounds == 1 ? "" : "s");
        for (size_t i = 0; i < nrounds; i++)
            printf("  round %zu: granary train %9.0f examples/s (AUC %.4f), PyTorch %7.0f: %.2fx%s\n",
                   i + 1, rounds[i].eps, rounds[i].auc, rounds[i].torch_eps,
                   gr_bench_round_ratio(&rounds[i]),
                   rounds[i].torch_first ? "" : " (granary first)");
        if (nrounds < want_rounds) printf("  round %zu gave no figure: %s\n", nrounds + 1, rounds_why);
        if (nrounds) printf("  median: %.2fx\n", ratio);
    }
    printf("\ntargets:\n");
    printf("  default AUC >= 1 worker - 0.002: %+.4f %s\n", main_r.test_auc - single_r.test_auc,
           main_r.test_auc >= single_r.test_auc - 0.002 ? "met" : "NOT met");
    if (t_eps > 0 && nrounds)
        printf("  examples/s >= 5 x PyTorch: %.2fx (median of %zu rounds) %s; AUC >= PyTorch - "
               "0.002: %+.4f %s\n",
               ratio, nrounds, ratio >= 5 ? "met" : "NOT met", main_r.test_auc - t_auc,
               main_r.test_auc >= t_auc - 0.002 ? "met" : "NOT met");
    else if (t_eps > 0)
        printf("  examples/s >= 5 x PyTorch: %.2fx (the first run only: %s) %s; AUC >= PyTorch - "
               "0.002: %+.4f %s\n",
               main_r.examples_per_sec / t_eps, rounds_why,
               main_r.examples_per_sec >= 5 * t_eps ? "met" : "NOT met",
               main_r.test_auc - t_auc, main_r.test_auc >= t_auc - 0.002 ? "met" : "NOT met");
    else if (torch)
        printf("  no PyTorch baseline: %s\n", t_why[0] ? t_why : "no figure");
    if (strag)
        printf("  semisync >= 1.6 x sync: %.2fx %s; >= 0.85 x async: %.2fx %s; AUC >= async: "
               "%+.4f %s\n",
               s_semi.examples_per_sec / s_sync.examples_per_sec,
               s_semi.examples_per_sec >= 1.6 * s_sync.examples_per_sec ? "met" : "NOT met",
               s_semi.examples_per_sec / s_async.examples_per_sec,
               s_semi.examples_per_sec >= 0.85 * s_async.examples_per_sec ? "met" : "NOT met",
               s_semi.test_auc - s_async.test_auc,
               s_semi.test_auc >= s_async.test_auc ? "met" : "NOT met");
    if (l_seq.examples)
        printf("  pipelined >= 1.4 x --no-pipeline over the delayed link (%s): 2 workers %.2fx %s",
               link_kind, l_pipe.examples_per_sec / l_seq.examples_per_sec,
               l_pipe.examples_per_sec >= 1.4 * l_seq.examples_per_sec ? "met" : "NOT met");
    if (l1_seq.examples)
        printf("; 1 worker %.2fx %s", l1_pipe.examples_per_sec / l1_seq.examples_per_sec,
               l1_pipe.examples_per_sec >= 1.4 * l1_seq.examples_per_sec ? "met" : "NOT met");
    if (l_seq.examples) printf("\n");
    double l1_bound = l1_pipe.examples ? stage_bound_eps(&l1_pipe, 1, 1024) : -1;
    double lp_bound = lp_pipe.examples ? stage_bound_eps(&lp_pipe, 1, 1024) : -1;
    overlap_line("async, 1 worker", &l1_pipe, &l1_seq, l1_bound);
    overlap_line("ssp, 1 worker", &lp_pipe, &lp_seq, lp_bound);
    if (json) {
        char v[16][32];
        num(v[0], 32, t_eps, "%.1f");
        num(v[1], 32, t_auc, "%.6f");
        num(v[2], 32, strag ? s_sync.examples_per_sec : -1, "%.1f");
        num(v[3], 32, strag ? s_semi.examples_per_sec : -1, "%.1f");
        num(v[4], 32, strag ? s_async.examples_per_sec : -1, "%.1f");
        num(v[5], 32, strag ? s_sync.test_auc : -1, "%.6f");
        num(v[6], 32, strag ? s_semi.test_auc : -1, "%.6f");
        num(v[7], 32, strag ? s_async.test_auc : -1, "%.6f");
        num(v[8], 32, l_pipe.examples ? l_pipe.examples_per_sec : -1, "%.1f");
        num(v[9], 32, l_seq.examples ? l_seq.examples_per_sec : -1, "%.1f");
        num(v[10], 32, strag ? (double)s_semi.dropped_gradients : -1, "%.0f");
        num(v[11], 32, l1_pipe.examples ? l1_pipe.examples_per_sec : -1, "%.1f");
        num(v[12], 32, l1_seq.examples ? l1_seq.examples_per_sec : -1, "%.1f");
        num(v[13], 32, l1_bound, "%.1f");
        num(v[14], 32, lp_pipe.examples ? lp_pipe.examples_per_sec : -1, "%.1f");
        num(v[15], 32, lp_seq.examples ? lp_seq.examples_per_sec : -1, "%.1f");
        char vb[32], vt[4][32];
        num(vb, 32, lp_bound, "%.1f");
        num(vt[0], 32, t2_eps, "%.1f");
        num(vt[1], 32, t2_auc, "%.6f");
        num(vt[2], 32, t1_eps, "%.1f");
        num(vt[3], 32, t1_auc, "%.6f");
        double sk = main_r.steps ? (double)main_r.steps : 1;
        printf("{\"bench\":\"train\",\"rows\":%llu,\"test_rows\":%llu,\"workers\":2,\"shards\":1,"
               "\"examples_per_sec\":%.1f,\"auc\":%.6f,\"logloss\":%.6f,"
               "\"torch_examples_per_sec\":%s,\"torch_auc\":%s,"
               "\"local_examples_per_sec\":%.1f,\"local_auc\":%.6f,"
               "\"sync_examples_per_sec\":%s,\"semisync_examples_per_sec\":%s,"
               "\"async_examples_per_sec\":%s,\"sync_auc\":%s,\"semisync_auc\":%s,"
               "\"async_auc\":%s,\"semisync_dropped_gradients\":%s,"
               "\"pipelined_examples_per_sec\":%s,\"unpipelined_examples_per_sec\":%s,"
               "\"pipelined_1w_examples_per_sec\":%s,\"unpipelined_1w_examples_per_sec\":%s,"
               "\"link\":\"%s\",\"link_delay_us\":%llu,"
               "\"reader_rows_per_sec\":%.0f,\"teacher_auc\":%.6f,"
               "\"default_mode\":\"%s\",\"single_worker_auc\":%.6f,"
               "\"single_worker_examples_per_sec\":%.1f,\"hybrid_examples_per_sec\":%.1f,"
               "\"hybrid_auc\":%.6f,\"async_2w_examples_per_sec\":%.1f,\"async_2w_auc\":%.6f,"
               "\"pipelined_1w_stage_bound_examples_per_sec\":%s,"
               "\"ssp_pipelined_1w_examples_per_sec\":%s,\"ssp_unpipelined_1w_examples_per_sec\":%s,"
               "\"ssp_pipelined_1w_stage_bound_examples_per_sec\":%s,"
               "\"stage_ms_per_batch\":{\"read\":%.3f,\"pull\":%.3f,\"compute\":%.3f,"
               "\"push\":%.3f,\"wait\":%.3f},\"torch_threads\":%u,"
               "\"torch_2t_examples_per_sec\":%s,\"torch_2t_auc\":%s,"
               "\"torch_1t_examples_per_sec\":%s,\"torch_1t_auc\":%s,"
               "\"model_step_us_per_example\":%.4f,\"model_step_min_us_per_example\":%.4f,"
               "\"dense_lag\":%u,\"direct\":%s,\"default_pipeline\":%s,",
               (unsigned long long)rows, (unsigned long long)test_rows, main_r.examples_per_sec,
               main_r.test_auc, main_r.test_logloss, v[0], v[1], local_r.examples_per_sec,
               local_r.test_auc, v[2], v[3], v[4], v[5], v[6], v[7], v[10], v[8], v[9], v[11], v[12], link_kind,
               (unsigned long long)delay_us, parse, gd.teacher_auc, gr_train_mode_name(def_mode),
               single_r.test_auc, single_r.examples_per_sec, hybrid_r.examples_per_sec,
               hybrid_r.test_auc, async2_r.examples_per_sec, async2_r.test_auc, v[13], v[14], v[15],
               vb,
               1e3 * main_r.read_seconds / sk, 1e3 * main_r.pull_seconds / sk,
               1e3 * main_r.compute_seconds / sk, 1e3 * main_r.push_seconds / sk,
               1e3 * main_r.stage_wait_seconds / sk, t_threads, vt[0], vt[1], vt[2], vt[3], step_us,
               step_min_us, dense_lag_for(&main_spec), bench_no_direct ? "false" : "true",
               gr_train_default_pipeline(2, !bench_no_direct) ? "true" : "false");
        /* The rounds: each granary train run beside its PyTorch run, and their median ratio. */
        char vr[32];
        num(vr, 32, ratio, "%.4f");
        printf("\"speedup_vs_torch\":%s,\"rounds\":[", vr);
        for (size_t i = 0; i < nrounds; i++)
            printf("%s{\"examples_per_sec\":%.1f,\"auc\":%.6f,\"torch_examples_per_sec\":%.1f,"
                   "\"torch_auc\":%.6f,\"ratio\":%.4f,\"torch_first\":%s}",
                   i ? "," : "", rounds[i].eps, rounds[i].auc, rounds[i].torch_eps,
                   rounds[i].torch_auc, gr_bench_round_ratio(&rounds[i]),
                   rounds[i].torch_first ? "true" : "false");
        printf("]}\n");
    }
    status = 0;
out:;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "granary bench train: could not remove %s\n", dir);
    return status;
}
