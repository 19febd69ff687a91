/* Test support: a coordinator member in a forked process (see coord_child.h). */
#include "tests/support/coord_child.h"

#include "granary/coord.h"

#include <fcntl.h>
#include <pthread.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int report_fd = -1;

static void report(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    ssize_t w = write(report_fd, line, (size_t)n);
    (void)w;
}

static void on_session(void *arg, gr_coord_session s)
{
    gr_coord *c = arg;
    /* Whether a shard would accept writes right now rides along. */
    report("session %s %d", gr_coord_session_name((int)s), gr_coord_registered(c) ? 1 : 0);
    if (s == GR_COORD_CONNECTED) {
        gr_coord_member self;
        gr_coord_self(c, &self);
        report("registered %s", self.id);
    }
}

static void on_leader(void *arg, bool leader)
{
    (void)arg;
    report("leader %d", leader ? 1 : 0);
}

static void on_members(void *arg, const gr_coord_members_event *ev)
{
    (void)arg;
    report("members %zu", ev->n);
}

/* Reports every change of gr_coord_registered (would a shard accept writes?) as it happens,
 * polling every 2 ms: after a SIGSTOP this thread runs again as soon as the library's. */
static void *fence_watch(void *arg)
{
    gr_coord *c = arg;
    int last = -1;
    for (;;) {
        int now = gr_coord_registered(c) ? 1 : 0;
        if (now != last) report("writable %d", now);
        last = now;
        usleep(2000);
    }
    return NULL;
}

static void child_main(const coord_child_opts *o)
{
    gr_coord_options opts;
    gr_coord_options_default(&opts);
    if (o->session_timeout_ms) opts.session_timeout_ms = o->session_timeout_ms;
    gr_coord *c;
    if (gr_coord_open(o->spec, &opts, &c)) {
        report("error open: %s", gr_errmsg());
        _exit(1);
    }
    gr_coord_watch_session(c, on_session, c);
    gr_coord_member m;
    gr_coord_member_init(&m, (gr_coord_role)o->role);
    m.index = o->index;
    if (o->address) snprintf(m.address, sizeof m.address, "%s", o->address);
    char id[GR_COORD_ID_MAX];
    if (gr_coord_register(c, &m, id)) {
        report("error register: %s", gr_errmsg());
        _exit(1);
    }
    report("registered %s", id);
    pthread_t fence;
    pthread_create(&fence, NULL, fence_watch, c);
    gr_coord_watch_members(c, on_members, NULL);
    if (o->elect && gr_coord_elect(c, on_leader, NULL)) {
        report("error elect: %s", gr_errmsg());
        _exit(1);
    }
    for (;;) pause(); /* the test kills us */
}

int coord_child_start(coord_child *ch, const coord_child_opts *o)
{
    memset(ch, 0, sizeof *ch);
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return -1;
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        close(p[0]);
        report_fd = p[1];
        child_main(o);
        _exit(0);
    }
    close(p[1]);
    ch->pid = pid;
    ch->fd = p[0];
    return 0;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int coord_child_expect(coord_child *ch, const char *prefix, char *line, size_t cap,
                       unsigned timeout_ms)
{
    uint64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        char *nl;
        while ((nl = memchr(ch->buf, '\n', ch->len))) {
            size_t n = (size_t)(nl - ch->buf);
            *nl = '\0';
            bool hit = !strncmp(ch->buf, prefix, strlen(prefix));
            if (hit && line && cap) snprintf(line, cap, "%s", ch->buf);
            if (!hit) fprintf(stderr, "  child %d: %s\n", (int)ch->pid, ch->buf);
            memmove(ch->buf, nl + 1, ch->len - n - 1);
            ch->len -= n + 1;
            if (hit) return 0;
        }
        uint64_t t = now_ms();
        if (t >= deadline || ch->fd < 0) return -1;
        struct pollfd p = {ch->fd, POLLIN, 0};
        if (poll(&p, 1, (int)(deadline - t)) <= 0) return -1;
        ssize_t r = read(ch->fd, ch->buf + ch->len, sizeof ch->buf - 1 - ch->len);
        if (r <= 0) return -1;
        ch->len += (size_t)r;
    }
}

void coord_child_kill(coord_child *ch)
{
    if (ch->pid > 0) {
        kill(ch->pid, SIGKILL);
        waitpid(ch->pid, NULL, 0);
    }
    ch->pid = 0;
    if (ch->fd >= 0) close(ch->fd);
    ch->fd = -1;
}
