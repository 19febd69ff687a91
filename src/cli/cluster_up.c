/* `granary cluster up`: starts N shards and K standbys as local `granary server --coord`
 * processes and supervises them: a process that dies (kill -9, a crash, a shard that found
 * itself replaced) is started again as a standby, so the job keeps K spare processes to take
 * over lost indexes; SIGTERM or SIGINT stops them all and exits 0. The shards themselves
 * claim indexes and restore from checkpoints (server --coord); this file only keeps
 * processes alive and reports what it does on stdout, one line per event. */
#include "cli/cli.h"
#include "cli/cluster.h"
#include "cli/opts.h"
#include "granary/coord.h"

#include <errno.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define UP_OPTIONS(X)                                                                          \
    X(CU_COORD, "coord", GR_CLI_STR, "coord", 0, 0, NULL, "zk://HOSTS/PATH", NULL,              \
      "the job's ZooKeeper coordinator; required")                                           \
    X(CU_SHARDS, "shards", GR_CLI_INT, "shards", 1, 16384, NULL, "N", NULL,                      \
      "shard processes to start (the layout's shard count when it creates it); required")    \
    X(CU_STANDBY, "standby", GR_CLI_INT, "standby", 0, 1024, NULL, "K", "0",                     \
      "standby processes to start besides them")                                              \
    X(CU_CKPT_DIR, "ckpt-dir", GR_CLI_STR, "ckpt_dir", 0, 0, NULL, "DIR", NULL,                 \
      "the job's checkpoint root, passed to every server (a standby that takes\n"             \
      "over restores from it)")                                                               \
    X(CU_CKPT_ROOT, "ckpt-root", GR_CLI_STR, "ckpt_root", 0, 0, NULL, "DIR", NULL,              \
      "passed to every server (see granary server --help)")                                   \
    X(CU_HOST, "host", GR_CLI_STR, "host", 0, 0, NULL, "HOST", "127.0.0.1",                      \
      "address the servers listen on (each on a free port)")                                  \
    X(CU_THREADS, "threads", GR_CLI_INT, "threads", 0, 4096, NULL, "T", "0",                     \
      "worker threads per server (0 = one per online CPU)")                                    \
    X(CU_SESSION, "session-timeout", GR_CLI_INT, "session_timeout_ms", 1000, 600000, NULL,      \
      "MS", "4000", "the servers' coordinator session timeout: a lost shard is\n"              \
      "noticed after about this long")                                                       \
    X(CU_AUTH_FILE, "auth-file", GR_CLI_STR, "auth_file", 0, 0, NULL, "F", NULL,                \
      "passed to every server")                                                               \
    X(CU_INSECURE, "insecure", GR_CLI_FLAG, "insecure", 0, 0, NULL, NULL, NULL,                  \
      "passed to every server")                                                               \
    X(CU_RESTART_DELAY, "restart-delay", GR_CLI_INT, "restart_delay_ms", 0, 600000, NULL, "MS",  \
      "500", "wait before starting a replacement for a process that died within\n"            \
      "2 s of its start; doubled per such death, up to 30 s")

enum { UP_OPTIONS(GR_CLI_ENUM) CU_COUNT };
static const gr_cli_opt up_opts[] = {UP_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec up_spec = {
    .command = "cluster up",
    .synopsis = "granary cluster up --coord zk://HOSTS/PATH --shards N [--standby K] "
                "[--ckpt-dir DIR] [options]",
    .opts = up_opts,
    .n_opts = CU_COUNT,
    .config_section = "cluster",
    .epilog = "Runs until SIGTERM or SIGINT, then stops every process it started and exits 0\n"
              "(1 when a server refused its options: exit status 2 is not restarted).\n"
              "The servers' own output goes to stderr; stdout has one line per event.\n",
};

#define QUICK_DEATH_MS 2000u
#define MAX_DELAY_MS 30000u

typedef struct proc {
    pid_t pid;          /* 0: waiting to be started at start_at_ms */
    bool standby;
    uint64_t started_ms;
    uint64_t start_at_ms;
    uint32_t delay_ms;  /* the next quick death's delay */
} proc;

typedef struct supervisor {
    const gr_cli_value *v;
    char self[4096];    /* the granary binary */
    proc *procs;
    unsigned n;
    sigset_t old_mask;
} supervisor;

static uint64_t now_ms(void) { return gr_now_ns() / 1000000u; }

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

/* `granary server --coord SPEC --listen HOST:0 ...` for one process. */
static size_t server_args(const supervisor *s, bool standby, const char **a, char *buf,
                          size_t cap)
{
    const gr_cli_value *v = s->v;
    size_t n = 0, off = 0;
#define ARG(x) (a[n++] = (x))
#define NUM(x)                                                                                 \
    do {                                                                                       \
        int w_ = snprintf(buf + off, cap - off, "%lld", (long long)(x));                       \
        a[n++] = buf + off;                                                                    \
        off += (size_t)w_ + 1;                                                                 \
    } while (0)
    ARG(s->self);
    ARG("server");
    ARG("--coord");
    ARG(v[CU_COORD].s);
    ARG("--listen");
    int w = snprintf(buf + off, cap - off, strchr(v[CU_HOST].s, ':') ? "[%s]:0" : "%s:0",
                     v[CU_HOST].s);
    a[n++] = buf + off;
    off += (size_t)w + 1;
    if (standby) ARG("--standby");
    else {
        ARG("--shards");
        NUM(v[CU_SHARDS].i);
    }
    ARG("--session-timeout");
    NUM(v[CU_SESSION].i);
    ARG("--threads");
    NUM(v[CU_THREADS].i);
    if (v[CU_CKPT_DIR].s) ARG("--ckpt-dir"), ARG(v[CU_CKPT_DIR].s);
    if (v[CU_CKPT_ROOT].s) ARG("--ckpt-root"), ARG(v[CU_CKPT_ROOT].s);
    if (v[CU_AUTH_FILE].s) ARG("--auth-file"), ARG(v[CU_AUTH_FILE].s);
    if (v[CU_INSECURE].b) ARG("--insecure");
    a[n] = NULL;
#undef ARG
#undef NUM
    return n;
}

static int spawn(supervisor *s, proc *p)
{
    const char *args[40];
    char buf[512];
    server_args(s, p->standby, args, buf, sizeof buf);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        /* The servers go when we go, even after a kill -9 of the supervisor. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(127);
        dup2(2, 1); /* their "listening on" lines are not our events */
        sigprocmask(SIG_SETMASK, &s->old_mask, NULL);
        execv(s->self, (char *const *)args);
        /* Only async-signal-safe calls here: the parent has threads (the coordinator's). */
        static const char msg[] = "granary cluster up: cannot run the granary binary\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(127);
    }
    p->pid = pid;
    p->started_ms = now_ms();
    say("started %s process pid %d", p->standby ? "standby" : "shard", (int)pid);
    return 0;
}

static void describe_exit(int st, char *out, size_t cap)
{
    if (WIFEXITED(st)) snprintf(out, cap, "exited with status %d%s", WEXITSTATUS(st),
                                WEXITSTATUS(st) == 3 ? " (replaced)" : "");
    else if (WIFSIGNALED(st)) snprintf(out, cap, "was killed by signal %d", WTERMSIG(st));
    else snprintf(out, cap, "ended (status %d)", st);
}

/* A child died: its replacement is a standby, started now or, after a quick death, later.
 * Exit status 2 is a server that refused its command line: starting it again cannot help,
 * so that stops the supervisor (returns false). */
static bool reap(supervisor *s)
{
    int st;
    pid_t pid;
    bool go_on = true;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        for (unsigned i = 0; i < s->n; i++) {
            proc *p = &s->procs[i];
            if (p->pid != pid) continue;
            char how[96];
            describe_exit(st, how, sizeof how);
            if (WIFEXITED(st) && WEXITSTATUS(st) == 2) {
                say("%s process pid %d %s: it refused its options (see its message above); "
                    "stopping", p->standby ? "standby" : "shard", (int)pid, how);
                p->pid = 0;
                p->start_at_ms = UINT64_MAX;
                go_on = false;
                continue;
            }
            uint64_t t = now_ms();
            bool quick = t - p->started_ms < QUICK_DEATH_MS;
            uint32_t delay = quick ? p->delay_ms : 0;
            p->delay_ms = quick ? (p->delay_ms * 2 > MAX_DELAY_MS ? MAX_DELAY_MS : p->delay_ms * 2)
                                : (uint32_t)s->v[CU_RESTART_DELAY].i;
            if (!p->delay_ms) p->delay_ms = 1;
            say("%s process pid %d %s; starting a standby in its place%s",
                p->standby ? "standby" : "shard", (int)pid, how, delay ? " after a delay" : "");
            p->pid = 0;
            p->standby = true;
            p->start_at_ms = t + delay;
        }
    }
    return go_on;
}

static void stop_all(supervisor *s)
{
    unsigned live = 0;
    for (unsigned i = 0; i < s->n; i++)
        if (s->procs[i].pid > 0) {
            kill(s->procs[i].pid, SIGTERM);
            live++;
        }
    say("stopping %u processes", live);
    uint64_t deadline = now_ms() + 20000;
    while (live) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid > 0) {
            for (unsigned i = 0; i < s->n; i++)
                if (s->procs[i].pid == pid) {
                    s->procs[i].pid = 0;
                    live--;
                }
            continue;
        }
        if (pid < 0 && errno == ECHILD) break;
        if (now_ms() >= deadline) {
            for (unsigned i = 0; i < s->n; i++)
                if (s->procs[i].pid > 0) kill(s->procs[i].pid, SIGKILL);
            deadline = UINT64_MAX;
        }
        gr_sleep_ms(10);
    }
}

/* Until a stop signal: reap, restart what is due, report readiness once. Returns 0 after a
 * stop signal, 1 when a server refused its options. */
static int supervise(supervisor *s, gr_coord *c)
{
    sigset_t wait_set;
    sigemptyset(&wait_set);
    sigaddset(&wait_set, SIGCHLD);
    sigaddset(&wait_set, SIGTERM);
    sigaddset(&wait_set, SIGINT);
    bool ready = false;
    uint32_t shards = (uint32_t)s->v[CU_SHARDS].i;
    for (;;) {
        struct timespec ts = {0, 100 * 1000000L};
        int sig = sigtimedwait(&wait_set, NULL, &ts);
        if (sig == SIGTERM || sig == SIGINT) {
            say("got signal %d", sig);
            return 0;
        }
        if (!reap(s)) return 1;
        uint64_t t = now_ms();
        for (unsigned i = 0; i < s->n; i++) {
            proc *p = &s->procs[i];
            if (p->pid == 0 && p->start_at_ms <= t && spawn(s, p) != 0) {
                say("cannot start a process: %s; retrying", strerror(errno));
                p->start_at_ms = t + 1000;
            }
        }
        if (!ready && gr_coord_barrier(c, shards, 0, 0) == 0) {
            ready = true;
            say("ready: %u shards registered under %s", shards, s->v[CU_COORD].s);
        }
    }
}

int gr_cli_cluster_up(int argc, char **argv)
{
    gr_cli_value v[CU_COUNT];
    gr_cli_parsed p;
    int status = gr_cli_parse_or_exit(&up_spec, argc, argv, v, &p);
    if (status >= 0) {
        gr_cli_parsed_fini(&p);
        return status;
    }
    status = 1;
    supervisor s;
    memset(&s, 0, sizeof s);
    s.v = v;
    gr_coord *c = NULL;
    if (!v[CU_COORD].s || strncmp(v[CU_COORD].s, "zk://", 5) || !v[CU_SHARDS].given) {
        fprintf(stderr, "granary cluster up: --coord zk://HOSTS/PATH and --shards N are "
                        "required (see --help)\n");
        status = 2;
        goto out;
    }
    ssize_t len = readlink("/proc/self/exe", s.self, sizeof s.self - 1);
    if (len <= 0) {
        fprintf(stderr, "granary cluster up: cannot find the granary binary: %s\n",
                strerror(errno));
        goto out;
    }
    s.self[len] = '\0';
    /* Fail before starting anything when the coordinator cannot be reached. */
    gr_coord_options o;
    gr_coord_options_default(&o);
    if (gr_coord_open(v[CU_COORD].s, &o, &c)) {
        fprintf(stderr, "granary cluster up: %s\n", gr_errmsg());
        goto out;
    }
    s.n = (unsigned)(v[CU_SHARDS].i + v[CU_STANDBY].i);
    s.procs = calloc(s.n, sizeof *s.procs);
    if (!s.procs) {
        fprintf(stderr, "granary cluster up: out of memory\n");
        goto out;
    }
    for (unsigned i = 0; i < s.n; i++) {
        s.procs[i].standby = i >= (unsigned)v[CU_SHARDS].i;
        s.procs[i].delay_ms = (uint32_t)v[CU_RESTART_DELAY].i ? (uint32_t)v[CU_RESTART_DELAY].i : 1;
    }
    /* Signals are taken with sigtimedwait: no handler, no race with the loop. */
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &s.old_mask);
    say("cluster up: %lld shards and %lld standbys under %s", (long long)v[CU_SHARDS].i,
        (long long)v[CU_STANDBY].i, v[CU_COORD].s);
    status = supervise(&s, c);
    stop_all(&s);
    sigprocmask(SIG_SETMASK, &s.old_mask, NULL);
    say("stopped");
out:
    gr_coord_close(c);
    free(s.procs);
    gr_cli_parsed_fini(&p);
    return status;
}
