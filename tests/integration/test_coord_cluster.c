/* Integration (ZooKeeper): `granary cluster status` and `granary cluster up`. Status reads a
 * job made of members this test registers itself (shards, a standby, an elected worker) and
 * must report the epoch, every shard with index, address, slots and pid, the standbys, the
 * workers and the chief, as text and as JSON, and a shard whose member is gone as down. Up
 * starts real `granary server --coord` processes, restarts a SIGKILLed one as a standby, and
 * stops them all on SIGTERM. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "granary/coord.h"
#include "granary/core.h"
#include "tests/support/ps_harness.h"
#include "tests/support/zk_harness.h"

static zk_test_server zk;

static int setup(void **state)
{
    (void)state;
    if (!zk_test_available()) return 0;
    return zk_test_start(&zk);
}

static int teardown(void **state)
{
    (void)state;
    zk_test_destroy(&zk);
    return 0;
}

static gr_coord *join(const char *url, gr_coord_role role, int32_t index, const char *addr,
                      char *id)
{
    gr_coord_options o;
    gr_coord_options_default(&o);
    o.session_timeout_ms = 2000;
    gr_coord *c;
    if (gr_coord_open(url, &o, &c)) fail_msg("open: %s", gr_errmsg());
    gr_coord_member m;
    gr_coord_member_init(&m, role);
    m.index = index;
    if (addr) snprintf(m.address, sizeof m.address, "%s", addr);
    assert_int_equal(gr_coord_register(c, &m, id), 0);
    return c;
}

static cJSON *status_json(const char *url)
{
    const char *args[] = {"cluster", "status", "--coord", url, "--json", NULL};
    static char out[65536];
    int rc = ps_test_run_granary(args, out, sizeof out);
    if (rc != 0) fail_msg("cluster status exited %d: %s", rc, out);
    cJSON *j = cJSON_Parse(out);
    if (!j) fail_msg("cluster status --json printed no JSON: %s", out);
    return j;
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v)) fail_msg("no number '%s'", k);
    return v->valuedouble;
}

static const char *str(const cJSON *o, const char *k)
{
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
    if (!s) fail_msg("no string '%s'", k);
    return s;
}

static void test_status_of_registered_members(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    char url[256];
    zk_test_url(&zk, "/granary/t-status", url, sizeof url);
    char id0[GR_COORD_ID_MAX], id1[GR_COORD_ID_MAX], ids[GR_COORD_ID_MAX], idw[GR_COORD_ID_MAX];
    gr_coord *s0 = join(url, GR_COORD_SHARD, 0, "127.0.0.1:7100", id0);
    gr_coord *s1 = join(url, GR_COORD_SHARD, 1, "127.0.0.1:7101", id1);
    gr_coord *sb = join(url, GR_COORD_STANDBY, -1, "127.0.0.1:7102", ids);
    gr_coord *w = join(url, GR_COORD_WORKER, 0, NULL, idw);
    assert_int_equal(gr_coord_elect(w, NULL, NULL), 0);
    gr_coord_layout l;
    assert_int_equal(gr_coord_layout_init(&l, 2), 0);
    l.epoch = 3;
    strcpy(l.shards[0].address, "127.0.0.1:7100");
    strcpy(l.shards[0].member, id0);
    strcpy(l.shards[1].address, "127.0.0.1:7101");
    strcpy(l.shards[1].member, id1);
    assert_int_equal(gr_coord_layout_cas(s0, &l), 0);
    for (int i = 0; i < 200 && !gr_coord_is_leader(w); i++) gr_sleep_ms(10);

    cJSON *j = status_json(url);
    assert_int_equal(num(j, "epoch"), 3);
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(j, "shards");
    assert_int_equal(cJSON_GetArraySize(shards), 2);
    const cJSON *a = cJSON_GetArrayItem(shards, 0), *b = cJSON_GetArrayItem(shards, 1);
    assert_int_equal(num(a, "index"), 0);
    assert_string_equal(str(a, "address"), "127.0.0.1:7100");
    assert_int_equal(num(a, "pid"), getpid()); /* registered from this process, this host */
    assert_int_equal(num(a, "slots"), 8192);
    assert_string_equal(str(a, "slot_ranges"), "0-8191");
    assert_string_equal(str(a, "member"), id0);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "up")));
    assert_int_equal(num(b, "index"), 1);
    assert_string_equal(str(b, "slot_ranges"), "8192-16383");
    const cJSON *standbys = cJSON_GetObjectItemCaseSensitive(j, "standbys");
    assert_int_equal(cJSON_GetArraySize(standbys), 1);
    assert_string_equal(str(cJSON_GetArrayItem(standbys, 0), "id"), ids);
    const cJSON *workers = cJSON_GetObjectItemCaseSensitive(j, "workers");
    assert_int_equal(cJSON_GetArraySize(workers), 1);
    const cJSON *chief = cJSON_GetObjectItemCaseSensitive(j, "chief");
    assert_string_equal(str(chief, "id"), idw);
    assert_string_equal(str(chief, "role"), "worker");
    cJSON_Delete(j);

    /* Shard 1's process goes: its entry stays in the layout, marked down. */
    gr_coord_close(s1);
    j = status_json(url);
    b = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "shards"), 1);
    assert_true(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(b, "up")));
    assert_null(cJSON_GetObjectItemCaseSensitive(b, "pid"));
    cJSON_Delete(j);

    /* The text form says the same in words. */
    const char *args[] = {"cluster", "status", "--coord", url, NULL};
    char out[8192];
    assert_int_equal(ps_test_run_granary(args, out, sizeof out), 0);
    assert_non_null(strstr(out, "epoch 3 (layout version 0), 2 shards"));
    assert_non_null(strstr(out, "shard 0    127.0.0.1:7100         slots 0-8191 (8192)"));
    assert_non_null(strstr(out, "LOST (member "));
    assert_non_null(strstr(out, "standbys: 1"));
    assert_non_null(strstr(out, "workers: 1"));
    assert_non_null(strstr(out, "chief:"));

    gr_coord_layout_fini(&l);
    gr_coord_close(w);
    gr_coord_close(sb);
    gr_coord_close(s0);
}

static void test_status_errors(void **state)
{
    (void)state;
    char out[4096];
    const char *none[] = {"cluster", "status", NULL};
    assert_int_equal(ps_test_run_granary(none, out, sizeof out), 2);
    assert_non_null(strstr(out, "--coord is required"));
    const char *down[] = {"cluster", "status", "--coord", "zk://127.0.0.1:1/x", "--timeout",
                          "300", NULL};
    assert_int_equal(ps_test_run_granary(down, out, sizeof out), 1);
    assert_non_null(strstr(out, "no ZooKeeper server answered at 127.0.0.1:1 within 300 ms"));
    /* A static spec: the layout it names, nobody registered. */
    const char *st[] = {"cluster", "status", "--coord", "127.0.0.1:7000,127.0.0.1:7001",
                        "--json", NULL};
    assert_int_equal(ps_test_run_granary(st, out, sizeof out), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_int_equal(num(j, "epoch"), 1);
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(j, "shards");
    assert_int_equal(cJSON_GetArraySize(shards), 2);
    assert_string_equal(str(cJSON_GetArrayItem(shards, 1), "address"), "127.0.0.1:7001");
    assert_null(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(shards, 1), "pid"));
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "chief")));
    cJSON_Delete(j);
    const char *bad[] = {"cluster", "nope", NULL};
    assert_int_equal(ps_test_run_granary(bad, out, sizeof out), 2);
    const char *up[] = {"cluster", "up", "--coord", "127.0.0.1:1", "--shards", "2", NULL};
    assert_int_equal(ps_test_run_granary(up, out, sizeof out), 2);
    assert_non_null(strstr(out, "--coord zk://HOSTS/PATH and --shards N are required"));
}

/* ---- cluster up ---- */

typedef struct up_proc {
    pid_t pid;
    int fd;
    char buf[16384];
    size_t len;
} up_proc;

static int up_start(up_proc *u, const char *const *args)
{
    memset(u, 0, sizeof *u);
    size_t n = 0;
    while (args[n]) n++;
    char **argv = calloc(n + 2, sizeof *argv);
    argv[0] = (char *)ps_test_granary_bin();
    for (size_t i = 0; i < n; i++) argv[i + 1] = (char *)args[i];
    int p[2];
    if (pipe2(p, O_CLOEXEC)) return -1;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        dup2(p[1], 1);
        execv(argv[0], argv);
        _exit(127);
    }
    free(argv);
    close(p[1]);
    u->pid = pid;
    u->fd = p[0];
    return pid > 0 ? 0 : -1;
}

/* Waits for a line containing `what`; copies it. */
static int up_expect(up_proc *u, const char *what, char *line, size_t cap, unsigned ms)
{
    uint64_t deadline = gr_now_ns() / 1000000u + ms;
    for (;;) {
        char *nl;
        while ((nl = memchr(u->buf, '\n', u->len))) {
            *nl = '\0';
            bool hit = strstr(u->buf, what) != NULL;
            if (hit && line && cap) {
                size_t k = strlen(u->buf) < cap ? strlen(u->buf) : cap - 1;
                memcpy(line, u->buf, k);
                line[k] = '\0';
            }
            fprintf(stderr, "  cluster up: %s\n", u->buf);
            size_t used = (size_t)(nl - u->buf) + 1;
            memmove(u->buf, nl + 1, u->len - used);
            u->len -= used;
            if (hit) return 0;
        }
        uint64_t t = gr_now_ns() / 1000000u;
        if (t >= deadline) return -1;
        struct pollfd p = {u->fd, POLLIN, 0};
        if (poll(&p, 1, (int)(deadline - t)) <= 0) return -1;
        ssize_t r = read(u->fd, u->buf + u->len, sizeof u->buf - 1 - u->len);
        if (r <= 0) return -1;
        u->len += (size_t)r;
    }
}

static bool server_has_coord(void)
{
    const char *args[] = {"server", "--help", NULL};
    char out[16384];
    ps_test_run_granary(args, out, sizeof out);
    return strstr(out, "--coord") && strstr(out, "--standby");
}

/* The pid serving shard `index` per cluster status, or 0. */
static pid_t shard_pid(const char *url, int index, int *standbys)
{
    cJSON *j = status_json(url);
    pid_t pid = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(j, "shards"))
    {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(s, "pid");
        if (num(s, "index") == index && cJSON_IsNumber(p)) pid = (pid_t)p->valuedouble;
    }
    if (standbys) *standbys = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "standbys"));
    cJSON_Delete(j);
    return pid;
}

static void test_up_restarts_and_stops(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    if (!server_has_coord()) {
        fprintf(stderr, "  granary server has no --coord in this build: skipped\n");
        skip();
    }
    char url[256];
    zk_test_url(&zk, "/granary/t-up", url, sizeof url);
    const char *args[] = {"cluster", "up", "--coord", url, "--shards", "2", "--standby", "1",
                          "--session-timeout", "2000", "--threads", "1", NULL};
    up_proc u;
    assert_int_equal(up_start(&u, args), 0);
    assert_int_equal(up_expect(&u, "ready: 2 shards registered", NULL, 0, 60000), 0);
    /* "ready" counts the shards; the standby registers on its own time (slow under load). */
    int standbys = 0;
    pid_t victim = 0;
    for (double until = gr_now_s() + 30; gr_now_s() < until; usleep(100000)) {
        victim = shard_pid(url, 0, &standbys);
        if (victim > 0 && standbys == 1) break;
    }
    assert_true(victim > 0);
    assert_int_equal(standbys, 1);
    assert_true(shard_pid(url, 1, NULL) > 0);

    assert_int_equal(kill(victim, SIGKILL), 0);
    char line[512], want[128];
    snprintf(want, sizeof want, "shard process pid %d was killed by signal 9", (int)victim);
    assert_int_equal(up_expect(&u, want, line, sizeof line, 10000), 0);
    assert_non_null(strstr(line, "starting a standby in its place"));
    assert_int_equal(up_expect(&u, "started standby process pid", NULL, 0, 10000), 0);
    /* The old standby takes index 0 over; the new process is the spare now. */
    pid_t now = 0;
    for (int i = 0; i < 150; i++) {
        now = shard_pid(url, 0, &standbys);
        if (now > 0 && now != victim && standbys == 1) break;
        gr_sleep_ms(200);
    }
    assert_true(now > 0 && now != victim);
    assert_int_equal(standbys, 1);

    /* SIGTERM stops every process it started, then it exits 0. */
    pid_t s1 = shard_pid(url, 1, NULL);
    assert_int_equal(kill(u.pid, SIGTERM), 0);
    assert_int_equal(up_expect(&u, "stopped", NULL, 0, 30000), 0);
    int st;
    assert_int_equal(waitpid(u.pid, &st, 0), u.pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(kill(now, 0), -1);
    assert_int_equal(kill(s1, 0), -1);
    close(u.fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_of_registered_members),
        cmocka_unit_test(test_status_errors),
        cmocka_unit_test(test_up_restarts_and_stops),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
