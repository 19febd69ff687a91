/* bench serve's load generators (bench/serve_load.h): wrk at saturation, the paced client, and
 * the CPU and latency accounting of each run. docs/serving.md ("The latency tail at half
 * saturation") says why the paced client is built as it is. */
#include "bench/serve_load.h"

#include "bench/bench.h"
#include "granary/core.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

double sl_now_s(void) { return (double)gr_now_ns() / 1e9; }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double sl_pct(double *v, size_t n, double p)
{
    if (!n) return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)ceil(p * (double)n) - 1;
    return v[i < n ? i : n - 1];
}


double sl_rusage_s(int who)
{
    struct rusage ru;
    getrusage(who, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

/* User + system CPU seconds of another process (from /proc), or NAN. */
double sl_proc_cpu_s(pid_t pid)
{
    if (pid <= 0) return NAN;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return NAN;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long long ut, st;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return NAN;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double wrk_ms(const char *s)
{
    double v = atof(s);
    if (strstr(s, "us")) return v / 1000.0;
    if (strstr(s, "ms")) return v;
    if (strchr(s, 's')) return v * 1000.0;
    return v;
}

/* ---- placement: the client on a core of its own ---- */

/* The CPU wrk is pinned to, or -1 (it shares every CPU with the servers). */
static int wrk_cpu = -1;

void sl_set_wrk_cpu(int cpu) { wrk_cpu = cpu; }

int sl_pin_threads(pid_t pid, const cpu_set_t *set)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0, failed = 0;
    struct dirent *e;
    /* Twice: a thread started while the first pass ran inherits its creator's old mask. */
    for (int pass = 0; pass < 2; pass++) {
        rewinddir(d);
        n = failed = 0;
        while ((e = readdir(d))) {
            if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
            pid_t tid = (pid_t)atoi(e->d_name);
            if (sched_setaffinity(tid, sizeof *set, set) == 0) n++;
            else if (errno != ESRCH) failed++; /* ESRCH: the thread ended meanwhile */
        }
    }
    closedir(d);
    return failed ? -1 : n;
}

int sl_split_cpus(const cpu_set_t *allowed, cpu_set_t *servers, int *client)
{
    int last = -1, count = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, allowed)) last = c, count++;
    if (count < 2) return -1;
    *servers = *allowed;
    CPU_CLR(last, servers);
    *client = last;
    return 0;
}

/* Writes a wrk Lua script that cycles through the bodies. */
int sl_write_script(const char *path, const bodies *b)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\n"
               "bodies = {\n");
    for (size_t i = 0; i < b->n; i++) fprintf(f, "[==[%s]==],\n", b->b[i]);
    /* Each request formatted once, on the first call (wrk has set the path by then), not on
     * every call: wrk shares the cores with the server it measures, so what it spends per
     * request is taken from the server (equally for both servers: they get the same script). */
    fprintf(f, "}\ni = 0\nreqs = nil\nrequest = function()\n"
               "  if not reqs then\n    reqs = {}\n"
               "    for k, b in ipairs(bodies) do reqs[k] = wrk.format(nil, nil, nil, b) end\n"
               "  end\n  i = i %% #reqs + 1\n  return reqs[i]\nend\n");
    return fclose(f);
}

int sl_run_wrk(uint16_t port, const char *script, unsigned wthreads, unsigned conns, double secs,
                   pid_t helper, load *out)
{
    memset(out, 0, sizeof *out);
    out->qps = out->p50_ms = out->p99_ms = NAN;
    out->cpu_us = out->gen_cpu_us = out->helper_cpu_us = out->late_p99_ms = out->service_p99_ms = NAN;
    double self0 = sl_rusage_s(RUSAGE_SELF), gen0 = sl_rusage_s(RUSAGE_CHILDREN), help0 = sl_proc_cpu_s(helper);
    char cmd[1024];
    char pin[32] = "";
    if (wrk_cpu >= 0) snprintf(pin, sizeof pin, "taskset -c %d ", wrk_cpu);
    snprintf(cmd, sizeof cmd, "%swrk -t%u -c%u -d%.0fs --latency -s %s http://127.0.0.1:%u/v1/predict 2>&1",
             pin, wthreads, conns < wthreads ? wthreads : conns, secs, script, port);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[512];
    bool dist = false;
    while (fgets(line, sizeof line, p)) {
        char a[64];
        if (strstr(line, "Latency Distribution")) dist = true;
        if (dist && sscanf(line, " 50%% %63s", a) == 1) out->p50_ms = wrk_ms(a);
        if (dist && sscanf(line, " 99%% %63s", a) == 1) out->p99_ms = wrk_ms(a);
        if (sscanf(line, "Requests/sec: %63s", a) == 1) out->qps = atof(a);
        unsigned long long n;
        if (sscanf(line, " %llu requests in", &n) == 1) out->requests = n;
        if (sscanf(line, " Non-2xx or 3xx responses: %llu", &n) == 1) out->errors = n;
    }
    int st = pclose(p);
    if (out->requests) {
        double per = 1e6 / (double)out->requests;
        out->cpu_us = (sl_rusage_s(RUSAGE_SELF) - self0) * per;
        out->gen_cpu_us = (sl_rusage_s(RUSAGE_CHILDREN) - gen0) * per;
        out->helper_cpu_us = (sl_proc_cpu_s(helper) - help0) * per;
    }
    return st == 0 && !isnan(out->qps) ? 0 : -1;
}

/* Medians, field by field, of n runs of the same measurement (requests and errors: sums). */
void sl_load_median(const load *runs, unsigned n, load *out)
{
    double v[16];
    *out = runs[0];
#define MED(f)                                             \
    do {                                                   \
        for (unsigned i = 0; i < n; i++) v[i] = runs[i].f; \
        qsort(v, n, sizeof *v, cmp_double);            \
        out->f = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2; \
    } while (0)
    MED(qps);
    MED(p50_ms);
    MED(p99_ms);
    MED(cpu_us);
    MED(gen_cpu_us);
    MED(helper_cpu_us);
    MED(late_p99_ms);
    MED(service_p99_ms);
    MED(runq_ms);
    MED(steal_ms);
    MED(wake_late_p99_ms);
    MED(late_max_ms);
    MED(conn_wait_p99_ms);
    MED(own_late_p99_ms);
#undef MED
    out->requests = out->errors = 0;
    out->lat = NULL;
    out->nlat = 0;
    size_t all = 0;
    for (unsigned i = 0; i < n; i++) {
        out->requests += runs[i].requests, out->errors += runs[i].errors;
        all += runs[i].nlat;
    }
    if (all && (out->lat = malloc(all * sizeof *out->lat)))
        for (unsigned i = 0; i < n; i++) {
            if (runs[i].nlat) memcpy(out->lat + out->nlat, runs[i].lat, runs[i].nlat * sizeof *out->lat);
            out->nlat += runs[i].nlat;
        }
}

void sl_load_free(load *l)
{
    free(l->lat);
    l->lat = NULL;
    l->nlat = 0;
}

/* ---- the paced client: keep-alive connections, each request due at a fixed time ---- */

typedef struct paced {
    uint16_t port;
    const bodies *b;
    double rate, secs, t0;
    double *lat;
    size_t n, cap;
    atomic_ullong errors;
    pthread_mutex_t mu;
    double cpu_s; /* the client threads' CPU, under mu */
} paced;

typedef struct paced_arg {
    paced *p;
    unsigned id, nthreads;
} paced_arg;

int sl_send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads one HTTP response (headers, then Content-Length bytes); its status or -1. */
static int read_response(int fd, char *buf, size_t cap)
{
    size_t len = 0;
    char *end = NULL;
    while (!end) {
        ssize_t r = recv(fd, buf + len, cap - 1 - len, 0);
        if (r <= 0) return -1;
        len += (size_t)r;
        buf[len] = 0;
        end = strstr(buf, "\r\n\r\n");
        if (!end && len >= cap - 1) return -1;
    }
    int status = atoi(buf + 9);
    char *cl = strcasestr(buf, "Content-Length:");
    size_t want = cl ? (size_t)atol(cl + 15) : 0, have = len - (size_t)(end + 4 - buf);
    while (have < want) {
        ssize_t r = recv(fd, buf, cap - 1, 0);
        if (r <= 0) return -1;
        have += (size_t)r;
    }
    return status;
}

static void *paced_main(void *arg)
{
    paced_arg *a = arg;
    paced *p = a->p;
    int fd = gr_bench_tcp_connect(p->port);
    char *buf = malloc(1 << 16);
    double interval = a->nthreads / p->rate;
    size_t k = 0;
    char head[256];
    for (;;) {
        double due = p->t0 + ((double)k + (double)a->id / a->nthreads) * interval;
        if (due > p->t0 + p->secs) break;
        double now = sl_now_s();
        if (due > now) usleep((useconds_t)((due - now) * 1e6));
        const char *body = p->b->b[(k * a->nthreads + a->id) % p->b->n];
        size_t blen = p->b->len[(k * a->nthreads + a->id) % p->b->n];
        int hn = snprintf(head, sizeof head, "POST /v1/predict HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", blen);
        int st = fd < 0 || sl_send_all(fd, head, (size_t)hn) || sl_send_all(fd, body, blen)
                     ? -1 : read_response(fd, buf, 1 << 16);
        double lat = (sl_now_s() - due) * 1e3;
        if (st != 200) {
            atomic_fetch_add(&p->errors, 1);
            if (st < 0) { /* reconnect */
                if (fd >= 0) close(fd);
                fd = gr_bench_tcp_connect(p->port);
            }
        } else {
            pthread_mutex_lock(&p->mu);
            if (p->n == p->cap) {
                p->cap = p->cap ? p->cap * 2 : 4096;
                p->lat = realloc(p->lat, p->cap * sizeof *p->lat);
            }
            p->lat[p->n++] = lat;
            pthread_mutex_unlock(&p->mu);
        }
        k++;
    }
    if (fd >= 0) close(fd);
    free(buf);
    pthread_mutex_lock(&p->mu);
    p->cpu_s += sl_rusage_s(RUSAGE_THREAD);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* The blocking paced client the bench used before (4 threads, one connection each); kept for
 * `--paced-threads`, to compare the two generators in one run (docs/benchmarks.md). */
void sl_run_paced_threads(uint16_t port, const bodies *b, double rate, double secs, load *out)
{
    enum { THREADS = 4 };
    paced p = {.port = port, .b = b, .rate = rate, .secs = secs};
    pthread_mutex_init(&p.mu, NULL);
    p.t0 = sl_now_s() + 0.05;
    pthread_t th[THREADS];
    paced_arg args[THREADS];
    for (unsigned i = 0; i < THREADS; i++) {
        args[i] = (paced_arg){&p, i, THREADS};
        pthread_create(&th[i], NULL, paced_main, &args[i]);
    }
    for (unsigned i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    out->requests = p.n;
    out->errors = atomic_load(&p.errors);
    out->qps = (double)p.n / secs;
    out->p50_ms = sl_pct(p.lat, p.n, 0.50);
    out->p99_ms = sl_pct(p.lat, p.n, 0.99);
    out->gen_cpu_us = p.n ? p.cpu_s * 1e6 / (double)p.n : NAN;
    free(p.lat);
    pthread_mutex_destroy(&p.mu);
}

/* The paced client: one thread, an epoll set of keep-alive connections. Request k is due at
 * t0 + k / rate and goes out on any idle connection as soon as it is due (one write of head and
 * body); its latency runs from when it was due, so a late send, a queue of due requests
 * waiting for a free connection or a stalled server all count (no coordinated omission). One
 * thread that sleeps in epoll until the next due time costs far less CPU per request than
 * blocking threads, on cores it shares with the server it measures. */
typedef struct pconn {
    int fd;
    bool busy;
    double due;   /* of the request in flight */
    double sent;  /* when it went out */
    size_t have;  /* bytes of the response read */
    char buf[8192];
} pconn;

enum { PACED_CONNS = 32 };

/* Bytes of a complete response at the start of c->buf (headers and Content-Length body), 0
 * while incomplete, -1 when it cannot be one. *status gets its status. */
static long response_len(const pconn *c, int *status)
{
    const char *end = memmem(c->buf, c->have, "\r\n\r\n", 4);
    if (!end) return c->have >= sizeof c->buf - 1 ? -1 : 0;
    *status = atoi(c->buf + 9);
    const char *cl = memmem(c->buf, (size_t)(end - c->buf), "Content-Length:", 15);
    if (!cl) cl = memmem(c->buf, (size_t)(end - c->buf), "content-length:", 15);
    size_t total = (size_t)(end + 4 - c->buf) + (cl ? (size_t)atol(cl + 15) : 0);
    if (total >= sizeof c->buf) return -1;
    return c->have >= total ? (long)total : 0;
}

static int pconn_open(int ep, pconn *c, uint16_t port)
{
    c->fd = gr_bench_tcp_connect(port);
    c->busy = false;
    c->have = 0;
    if (c->fd < 0) return -1;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    return epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
}

/* Nanoseconds this thread has waited runnable on a run queue (/proc/thread-self/schedstat,
 * its second field), or NAN. */
static double thread_runq_ns(void)
{
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    unsigned long long run, wait;
    int got = f ? fscanf(f, "%llu %llu", &run, &wait) : 0;
    if (f) fclose(f);
    return got == 2 ? (double)wait : NAN;
}

/* Seconds of steal time of all CPUs so far (the "cpu" line of /proc/stat), or NAN. */
static double steal_s(void)
{
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8];
    int got = f ? fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                         &v[3], &v[4], &v[5], &v[6], &v[7]) : 0;
    if (f) fclose(f);
    return got == 8 ? (double)v[7] / (double)sysconf(_SC_CLK_TCK) : NAN;
}

/* The paced client asks to run as SCHED_FIFO (priority 1) while it measures: a load generator
 * that the guest scheduler leaves waiting behind the server's threads (or anyone else's)
 * sends late, and that lateness is the client's, not the server's (serving.md, "The latency
 * tail at half saturation"). It only sleeps in epoll or sends, so it takes a small share of a
 * core; the kernel's RT throttling bounds it anyway. Not permitted (no CAP_SYS_NICE): it runs
 * as before and says so (fifo false). */
static bool pacer_fifo_begin(void)
{
    struct sched_param sp = {.sched_priority = 1};
    return pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp) == 0;
}

static void pacer_fifo_end(bool was)
{
    struct sched_param sp = {.sched_priority = 0};
    if (was) pthread_setschedparam(pthread_self(), SCHED_OTHER, &sp);
}

/* The spans of time during which every connection of the paced client had a request in
 * flight: a request due then waits for a reply to free one, and that wait is the server's
 * (or the machine's) doing, not the client's, though it shows as send lateness. */
typedef struct busy_spans {
    double *lo, *hi;
    size_t n, cap;
    int nbusy;
    double full_since;
} busy_spans;

static void spans_busy(busy_spans *b, double t)
{
    if (++b->nbusy == PACED_CONNS) b->full_since = t;
}

static void spans_free(busy_spans *b, double t)
{
    if (b->nbusy-- < PACED_CONNS) return;
    if (b->n == b->cap) {
        b->cap = b->cap ? b->cap * 2 : 256;
        b->lo = realloc(b->lo, b->cap * sizeof *b->lo);
        b->hi = realloc(b->hi, b->cap * sizeof *b->hi);
    }
    b->lo[b->n] = b->full_since;
    b->hi[b->n++] = t;
}

/* Seconds of [from, to] during which every connection was busy (spans closed so far). */
static double spans_overlap(const busy_spans *b, double from, double to)
{
    double sum = 0;
    for (size_t i = b->n; i-- > 0 && b->hi[i] > from;) {
        double lo = b->lo[i] > from ? b->lo[i] : from, hi = b->hi[i] < to ? b->hi[i] : to;
        if (hi > lo) sum += hi - lo;
    }
    return sum;
}

double sl_paced_wait(bool left, double next, double now, int busy, int conns, double full_wait)
{
    if (!left) return full_wait;
    if (next > now) return next - now;
    return busy < conns ? 0 : full_wait;
}

/* The time slice the paced client asks for (gr_thread_set_slice_us); 0: the default. A
 * short one lets it, when a request falls due, run ahead of the server's handler threads
 * that are on the default slice (1.4 ms on 2 cores) instead of waiting behind one's slice: what a client
 * on its own machine never waits for. Its share of the CPU is unchanged. */
static unsigned pacer_slice_us;

void sl_set_pacer_slice(unsigned us) { pacer_slice_us = us; }

void sl_run_paced(uint16_t port, const bodies *b, double rate, double secs, bool fifo,
                      load *out)
{
    memset(out, 0, sizeof *out);
    out->qps = out->p50_ms = out->p99_ms = out->cpu_us = out->gen_cpu_us = out->helper_cpu_us = NAN;
    out->late_p99_ms = out->service_p99_ms = NAN;
    out->runq_ms = out->steal_ms = out->wake_late_p99_ms = out->late_max_ms = NAN;
    out->own_late_p99_ms = out->conn_wait_p99_ms = NAN;
    prctl(PR_SET_TIMERSLACK, 1UL); /* wake at the due time, not up to 50 us after it */
    out->fifo = fifo && pacer_fifo_begin();
    out->slice = pacer_slice_us && gr_thread_set_slice_us(pacer_slice_us) == GR_OK;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    pconn *cs = calloc(PACED_CONNS, sizeof *cs);
    size_t total = (size_t)(rate * secs), sent = 0, done = 0, cap = total + 1;
    double *lat = malloc(cap * sizeof *lat), *late = malloc(cap * sizeof *late),
           *service = malloc(cap * sizeof *service), *wake = malloc(cap * sizeof *wake),
           *own = malloc(cap * sizeof *own), *connwait = malloc(cap * sizeof *connwait);
    size_t nwake = 0;
    busy_spans spans = {0};
    /* Every request's bytes formatted once: the client's CPU per request is taken from the
     * cores the replica it measures runs on. */
    char **req = calloc(b->n, sizeof *req);
    size_t *req_len = calloc(b->n, sizeof *req_len);
    for (size_t k = 0; k < b->n; k++) {
        char head[160];
        int hn = snprintf(head, sizeof head, "POST /v1/predict HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", b->len[k]);
        req[k] = malloc((size_t)hn + b->len[k]);
        memcpy(req[k], head, (size_t)hn);
        memcpy(req[k] + hn, b->b[k], b->len[k]);
        req_len[k] = (size_t)hn + b->len[k];
    }
    uint64_t errors = 0;
    for (int i = 0; i < PACED_CONNS; i++)
        if (pconn_open(ep, &cs[i], port)) cs[i].fd = -1;
    double t0 = sl_now_s() + 0.05, cpu0 = sl_rusage_s(RUSAGE_THREAD), deadline = t0 + secs + 5.0;
    double runq0 = thread_runq_ns(), steal0 = steal_s();
    while ((sent < total || done + errors < sent) && sl_now_s() < deadline) {
        /* Every due request that has an idle connection goes out now. */
        double now = sl_now_s();
        for (int i = 0; i < PACED_CONNS && sent < total && t0 + (double)sent / rate <= now; i++) {
            pconn *c = &cs[i];
            if (c->busy) continue;
            if (c->fd < 0 && pconn_open(ep, c, port)) continue;
            size_t k = sent % b->n;
            c->due = t0 + (double)sent / rate;
            c->sent = sl_now_s();
            c->have = 0;
            sent++;
            if (sl_send_all(c->fd, req[k], req_len[k])) {
                errors++;
                close(c->fd);
                c->fd = -1;
                continue;
            }
            c->busy = true;
            spans_busy(&spans, c->sent);
        }
        /* Sleep until a reply, or until the next request is due. A request that fell due since
         * the loop above goes out at once when a connection is idle: sleeping for a reply then
         * (with nothing in flight, up to 100 ms) was this client's own tail. */
        double next = t0 + (double)sent / rate, before = sl_now_s();
        double wait = sl_paced_wait(sent < total, next, before, spans.nbusy, PACED_CONNS, 0.1);
        bool waiting = sent < total && next <= before && spans.nbusy >= PACED_CONNS;
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        struct epoll_event evs[PACED_CONNS];
        int n = epoll_pwait2(ep, evs, PACED_CONNS, &ts, NULL);
        /* A wakeup by the timer for a due request: how late the kernel (or the hypervisor)
         * woke us. */
        if (n == 0 && !waiting && wait > 0 && sent < total && nwake < cap)
            wake[nwake++] = (sl_now_s() - next) * 1e3;
        for (int e = 0; e < n; e++) {
            pconn *c = evs[e].data.ptr;
            ssize_t r = recv(c->fd, c->buf + c->have, sizeof c->buf - 1 - c->have, 0);
            int status = 0;
            long len = 0;
            if (r > 0) {
                c->have += (size_t)r;
                len = response_len(c, &status);
            }
            if (r <= 0 || len < 0 || !c->busy) {
                if (c->busy) errors++, spans_free(&spans, sl_now_s());
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                c->fd = -1;
                c->busy = false;
                continue;
            }
            if (len == 0) continue;
            double t = sl_now_s();
            c->busy = false;
            c->have = 0;
            spans_free(&spans, t);
            if (status == 200) {
                late[done] = (c->sent - c->due) * 1e3;
                connwait[done] = spans_overlap(&spans, c->due, c->sent) * 1e3;
                own[done] = late[done] - connwait[done];
                service[done] = (t - c->sent) * 1e3;
                lat[done++] = (t - c->due) * 1e3;
            } else {
                errors++;
            }
        }
    }
    double cpu = sl_rusage_s(RUSAGE_THREAD) - cpu0;
    out->runq_ms = (thread_runq_ns() - runq0) / 1e6;
    out->steal_ms = (steal_s() - steal0) * 1e3;
    pacer_fifo_end(out->fifo);
    if (out->slice) gr_thread_set_slice_us(0);
    for (int i = 0; i < PACED_CONNS; i++)
        if (cs[i].fd >= 0) close(cs[i].fd);
    close(ep);
    out->requests = done;
    out->errors = errors + (sent < total ? total - sent : 0);
    out->qps = (double)done / secs;
    out->p50_ms = sl_pct(lat, done, 0.50);
    out->p99_ms = sl_pct(lat, done, 0.99);
    out->gen_cpu_us = done ? cpu * 1e6 / (double)done : NAN;
    out->lat = lat; /* sorted by sl_pct; the caller's now */
    out->nlat = done;
    lat = NULL;
    /* Where the tail comes from: requests sent late (the client, or the machine, did not run
     * when one was due) or answered slowly (the server, the network stack, or the machine
     * not running the server). */
    out->late_p99_ms = sl_pct(late, done, 0.99);
    out->late_max_ms = sl_pct(late, done, 1.0);
    out->service_p99_ms = sl_pct(service, done, 0.99);
    out->wake_late_p99_ms = sl_pct(wake, nwake, 0.99);
    out->own_late_p99_ms = sl_pct(own, done, 0.99);
    out->conn_wait_p99_ms = sl_pct(connwait, done, 0.99);
    free(lat), free(late), free(service), free(wake), free(own), free(connwait), free(cs);
    for (size_t k = 0; k < b->n; k++) free(req[k]);
    free(req), free(req_len);
    free(spans.lo), free(spans.hi);
}
