/* Integration (ZooKeeper), the headline of coordinated training: two shards and a standby
 * under `granary server --coord`, one `granary train --coord` process with two workers. Once
 * the run has written a checkpoint, the shard serving index 1 is killed with SIGKILL; the
 * standby takes its index over and restores it, the trainer waits for the healed layout and
 * goes on, and the job finishes by itself.
 *  - sync with --recovery rollback (the default for sync) ends bitwise equal to an
 *    uninterrupted coordinated run: the same test AUC and logloss to the last digit;
 *  - async with --recovery partial (the default for async) ends with a test AUC within 0.003
 *    of an uninterrupted run's.
 * Both record one recovery in their metrics. And the chief dies: a second train process that
 * waited takes the job over from the newest checkpoint. The last test runs the sync job again
 * with every shard in a network namespace of its own (skipped without root or netns, or with
 * GR_TEST_NETNS=0), the trainer's workers in this one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "granary/ckpt.h"
#include "granary/coord.h"
#include "tests/support/ps_harness.h"
#include "tests/support/train_fixture.h"
#include "tests/support/zk_harness.h"

static zk_test_server zk;
static char tmp[256];
static tr_fixture data;

/* A hang detector for each run, not a speed target (a run takes seconds). */
#define RUN_BUDGET_S 150.0
static double g_binary_deadline;

/* When a run must end: RUN_BUDGET_S from now, or the binary's own deadline if sooner. */
static double run_until(void)
{
    double u = gr_now_s() + RUN_BUDGET_S;
    return g_binary_deadline && g_binary_deadline < u ? g_binary_deadline : u;
}

/* What a run that did not end was doing: every thread's stack (gdb, when installed). */
static void dump_stacks(pid_t pid, const char *what)
{
    char cmd[300];
    fprintf(stderr, "coord train: stacks of %s (pid %d):\n", what, (int)pid);
    snprintf(cmd, sizeof cmd, "timeout 30 gdb -batch -nx -p %d -ex 'thread apply all bt' "
             "2>/dev/null | grep -E '^(Thread|#)' | head -150 >&2", (int)pid);
    if (system(cmd) != 0) fprintf(stderr, "  (no stacks: gdb missing or failed)\n");
}

static int setup(void **state)
{
    (void)state;
    if (ps_test_tmpdir(tmp, sizeof tmp)) return -1;
    if (!zk_test_available()) return 0;
    if (tr_fixture_make(&data, "coordtrain", 11)) return -1;
    return zk_test_start(&zk);
}

static int teardown(void **state)
{
    (void)state;
    zk_test_destroy(&zk);
    if (data.dir[0]) tr_fixture_remove(&data);
    ps_test_rmdir(tmp);
    return 0;
}

typedef struct job {
    char url[256], ck[64], ckpath[400], metrics[400], log[400];
    ps_test_server shard[2], standby;
    bool with_standby;
    bool sequential; /* one worker, not pipelined: a run that is the same every time */
} job;

static void start_job(job *j, const char *name, bool standby)
{
    memset(j->shard, 0, sizeof j->shard);
    char path[64];
    snprintf(path, sizeof path, "/jobs/%s", name);
    zk_test_url(&zk, path, j->url, sizeof j->url);
    snprintf(j->ck, sizeof j->ck, "ck-%s", name);
    rmdir(j->ck); /* an empty one an older build's trainer left in this directory */
    snprintf(j->ckpath, sizeof j->ckpath, "%s/%s", tmp, j->ck);
    snprintf(j->metrics, sizeof j->metrics, "%s/metrics-%s.json", tmp, name);
    snprintf(j->log, sizeof j->log, "%s/train-%s.log", tmp, name);
    j->with_standby = standby;
    for (int i = 0; i < 2 + standby; i++) {
        const char *args[] = {"server", "--coord", j->url, "--shards", "2", "--threads", "1",
                              "--session-timeout", "2000", "--ckpt-root", tmp, "--ckpt-dir",
                              j->ck, i == 2 ? "--standby" : NULL, NULL};
        assert_int_equal(ps_test_server_start_args(i == 2 ? &j->standby : &j->shard[i], args), 0);
    }
}

static void stop_job(job *j)
{
    /* The shards write the checkpoints under their --ckpt-root; the trainer, given the same
     * relative --ckpt-dir, must not have made a directory of that name where it ran. */
    struct stat st;
    assert_int_not_equal(stat(j->ck, &st), 0);
    for (int i = 0; i < 2; i++)
        if (j->shard[i].pid > 0) ps_test_server_stop(&j->shard[i], 0);
    if (j->with_standby) ps_test_server_stop(&j->standby, 0);
}

static pid_t spawn_train(job *j, const char *mode)
{
    const char *args[] = {ps_test_granary_bin(), "train", "--train", data.train, "--test",
                          data.test, "--coord", j->url, "--mode", mode, "--workers",
                          j->sequential ? "1" : "2", "--batch", "64", "--dim", "4", "--bottom",
                          "8", "--top", "8", "--progress", "0", "--ckpt-dir", j->ck,
                          "--ckpt-every", "24", "--metrics-out", j->metrics,
                          "--recovery-timeout", "60000", j->sequential ? "--no-pipeline" : NULL,
                          NULL};
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(j->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(args[0], (char *const *)args);
        _exit(127);
    }
    return pid;
}

static int wait_exit(pid_t pid, double until, const char *what)
{
    int st = 0;
    double t0 = gr_now_s();
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            fprintf(stderr, "coord train: %s took %.1f s\n", what, gr_now_s() - t0);
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        if (r < 0 || gr_now_s() > until) break;
        usleep(5000);
    }
    fprintf(stderr, "coord train: %s did not end in time: killed\n", what);
    dump_stacks(pid, what);
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

/* The shard process serving index 1 now. A shard prints its address before it has claimed an
 * index, so the layout is read until index 1 names one of them (on a loaded machine, under
 * ASan, the claim came after the first read once). */
static ps_test_server *serving_index1(job *j)
{
    gr_coord *c = NULL;
    assert_int_equal(gr_coord_open(j->url, NULL, &c), 0);
    ps_test_server *s = NULL;
    char seen[128] = "";
    for (double until = gr_now_s() + 30; !s && gr_now_s() < until;) {
        gr_coord_layout l;
        memset(&l, 0, sizeof l);
        if (gr_coord_layout_get(c, &l) == 0 && l.n_shards == 2) {
            snprintf(seen, sizeof seen, "%.120s", l.shards[1].address);
            for (int i = 0; i < 2; i++)
                if (!strcmp(l.shards[1].address, j->shard[i].addr)) s = &j->shard[i];
        }
        gr_coord_layout_fini(&l);
        if (!s) usleep(20000);
    }
    gr_coord_close(c);
    if (!s) fprintf(stderr, "coord train: index 1 is served by '%s', not by a shard of the job\n", seen);
    assert_non_null(s);
    return s;
}

/* Runs the job to the end; with kill_after_ckpt, SIGKILLs index 1's shard once the first
 * checkpoint is complete (and asserts the run was still going then). */
static void run(job *j, const char *mode, bool kill_after_ckpt)
{
    double until = run_until();
    pid_t pid = spawn_train(j, mode);
    assert_true(pid > 0);
    if (kill_after_ckpt) {
        ps_test_server *victim = serving_index1(j); /* before: the kill follows the checkpoint */
        char name[GR_CKPT_NAME_MAX];
        uint64_t step = 0;
        while (gr_ckpt_latest(j->ckpath, name, &step) != GR_OK) {
            int st;
            assert_int_equal(waitpid(pid, &st, WNOHANG), 0); /* still training */
            assert_true(gr_now_s() < until);
            usleep(2000);
        }
        int st;
        assert_int_equal(waitpid(pid, &st, WNOHANG), 0);
        fprintf(stderr, "coord train: killing shard 1 (pid %d) after checkpoint %s\n",
                (int)victim->pid, name);
        assert_int_equal(ps_test_server_stop(victim, SIGKILL), 128 + SIGKILL);
        victim->pid = 0;
    }
    int rc = wait_exit(pid, until, kill_after_ckpt ? "the interrupted run" : "the clean run");
    if (rc != 0 || getenv("GR_TEST_VERBOSE")) {
        char *txt = NULL;
        if (gr_read_file(j->log, &txt, NULL) == 0) fprintf(stderr, "%s\n", txt);
        free(txt);
    }
    assert_int_equal(rc, 0);
}

static void read_metrics(const job *j, char *auc, char *logloss, double *recoveries)
{
    char rec[64];
    assert_int_equal(tr_metrics_text(j->metrics, "auc", auc, 64), 0);
    assert_int_equal(tr_metrics_text(j->metrics, "logloss", logloss, 64), 0);
    assert_int_equal(tr_metrics_text(j->metrics, "recoveries", rec, sizeof rec), 0);
    *recoveries = atof(rec);
}

static void test_sync_rollback_is_bitwise_equal(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    job a = {0}, b = {0};
    start_job(&a, "syncA", false);
    run(&a, "sync", false);
    stop_job(&a);
    start_job(&b, "syncB", true);
    run(&b, "sync", true);
    stop_job(&b);
    char aucA[64], llA[64], aucB[64], llB[64];
    double recA, recB;
    read_metrics(&a, aucA, llA, &recA);
    read_metrics(&b, aucB, llB, &recB);
    fprintf(stderr, "coord train sync: clean auc %s logloss %s; killed auc %s logloss %s\n", aucA,
            llA, aucB, llB);
    assert_true(recA == 0 && recB == 1);
    assert_string_equal(aucA, aucB);
    assert_string_equal(llA, llB);
}

static void test_async_partial_keeps_auc(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    /* One sequential worker: two clean async runs of two pipelined workers differ by up to
     * 0.0026 AUC between themselves (measured), which would leave the bound no room to say
     * anything about the recovery; this way the clean run is the same every time and the
     * difference is the recovery's alone. */
    job a = {.sequential = true}, b = {.sequential = true};
    start_job(&a, "asyncA", false);
    run(&a, "async", false);
    stop_job(&a);
    start_job(&b, "asyncB", true);
    run(&b, "async", true);
    stop_job(&b);
    char aucA[64], llA[64], aucB[64], llB[64];
    double recA, recB;
    read_metrics(&a, aucA, llA, &recA);
    read_metrics(&b, aucB, llB, &recB);
    fprintf(stderr, "coord train async: clean auc %s; killed (partial) auc %s\n", aucA, aucB);
    assert_true(recA == 0 && recB == 1);
    assert_true(fabs(atof(aucA) - atof(aucB)) <= 0.003);
}

/* The chief dies: a second train process of the same job waits while the first leads, takes
 * over when it is killed (after its session expires), resumes from the newest checkpoint and
 * finishes the job; in sync mode it ends bitwise equal to an uninterrupted run. */
static void test_second_trainer_takes_over_from_a_dead_chief(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    job a = {0}, b = {0};
    start_job(&a, "chiefA", false);
    run(&a, "sync", false);
    stop_job(&a);
    start_job(&b, "chiefB", false);
    double until = run_until();
    pid_t first = spawn_train(&b, "sync");
    char log1[400];
    snprintf(log1, sizeof log1, "%s", b.log);
    char name[GR_CKPT_NAME_MAX];
    uint64_t step = 0;
    while (gr_ckpt_latest(b.ckpath, name, &step) != GR_OK) {
        int st;
        assert_int_equal(waitpid(first, &st, WNOHANG), 0);
        assert_true(gr_now_s() < until);
        usleep(2000);
    }
    snprintf(b.log, sizeof b.log, "%s/train-chiefB-2.log", tmp);
    pid_t second = spawn_train(&b, "sync"); /* waits: the first one leads */
    usleep(300000);
    int st;
    assert_int_equal(waitpid(first, &st, WNOHANG), 0);
    assert_int_equal(kill(first, SIGKILL), 0);
    waitpid(first, &st, 0);
    fprintf(stderr, "coord train: killed the chief after checkpoint %s\n", name);
    int rc = wait_exit(second, until, "the second trainer");
    char *txt = NULL;
    assert_int_equal(gr_read_file(b.log, &txt, NULL), 0);
    if (rc) fprintf(stderr, "%s\n", txt);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(txt, "waiting to take over as its chief"));
    free(txt);
    stop_job(&b);
    char aucA[64], llA[64], aucB[64], llB[64];
    double recA, recB;
    read_metrics(&a, aucA, llA, &recA);
    read_metrics(&b, aucB, llB, &recB);
    fprintf(stderr, "coord train chief: clean auc %s; taken over auc %s\n", aucA, aucB);
    assert_string_equal(aucA, aucB);
    assert_string_equal(llA, llB);
}

/* ---- The same job with every shard in a network namespace of its own ----
 * Each shard runs in its own namespace, joined to this one by a veth pair (10.N.i.0/30: .1
 * here, .2 there), so shards and trainer reach each other only as hosts on a network: the
 * shards listen on their veth address (--insecure: not loopback), find ZooKeeper at .1 (a
 * server of this test's own that listens on every address), and the trainer reaches them
 * through the layout. Needs root and `ip netns`; skipped cleanly otherwise. */

typedef struct netjob {
    char ns[3][32], url[3][256], addr[3][64], trainer_url[256];
    ps_test_server srv[3];
    pid_t zk_pid;
    uint16_t zk_port;
    unsigned net;
} netjob;

static int sh(const char *cmd)
{
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* Stops everything net_up, net_zk and net_shard started; safe to call twice (the test calls
 * it, and its teardown again, which is what runs when an assertion ends the test early). */
static void net_down(netjob *n)
{
    char cmd[256];
    for (int i = 0; i < 3; i++) {
        if (n->srv[i].pid > 0) ps_test_server_stop(&n->srv[i], SIGKILL);
        n->srv[i].pid = 0;
        snprintf(cmd, sizeof cmd, "ip netns del %s 2>/dev/null", n->ns[i]);
        if (n->ns[i][0]) sh(cmd);
        n->ns[i][0] = '\0';
    }
    if (n->zk_pid > 0) {
        kill(n->zk_pid, SIGKILL);
        waitpid(n->zk_pid, NULL, 0);
    }
    n->zk_pid = 0;
}

static netjob g_net;

static int net_teardown(void **state)
{
    (void)state;
    net_down(&g_net);
    return 0;
}

/* Three namespaces with a veth pair each; false (nothing left behind) when the kernel or our
 * rights do not allow it. */
static bool net_up(netjob *n)
{
    if (geteuid() != 0) return false;
    /* A 10.N.0.0/16 no interface of this machine uses: another run of this test at the same
     * time, or one killed before it could clean up, keeps its addresses, and a second set of
     * routes to the same subnets would send one run's packets to the other's namespaces. */
    n->net = 0;
    for (unsigned k = 0; k < 150 && !n->net; k++) {
        unsigned cand = 100 + ((unsigned)getpid() + k) % 150;
        char cmd[160];
        snprintf(cmd, sizeof cmd, "ip -4 -o addr show | grep -q ' 10\\.%u\\.'", cand);
        if (sh(cmd) == 1) n->net = cand; /* grep found none */
    }
    if (!n->net) {
        fprintf(stderr, "coord train: every 10.100-249.0.0/16 is in use here\n");
        return false;
    }
    for (int i = 0; i < 3; i++) {
        snprintf(n->ns[i], sizeof n->ns[i], "gr%ds%d", (int)getpid(), i);
        char cmd[600];
        snprintf(cmd, sizeof cmd,
                 "ip netns add %s && ip link add gr%dh%d type veth peer name gr%dn%d && "
                 "ip link set gr%dn%d netns %s && ip addr add 10.%u.%d.1/30 dev gr%dh%d && "
                 "ip link set gr%dh%d up && ip netns exec %s ip addr add 10.%u.%d.2/30 dev gr%dn%d && "
                 "ip netns exec %s ip link set gr%dn%d up && ip netns exec %s ip link set lo up",
                 n->ns[i], (int)getpid(), i, (int)getpid(), i, (int)getpid(), i, n->ns[i], n->net,
                 i, (int)getpid(), i, (int)getpid(), i, n->ns[i], n->net, i, (int)getpid(), i,
                 n->ns[i], (int)getpid(), i, n->ns[i]);
        if (sh(cmd) != 0) {
            fprintf(stderr, "coord train: no network namespaces here (%s failed)\n", "ip netns");
            net_down(n);
            return false;
        }
    }
    return true;
}

/* This test's own ZooKeeper, listening on every address (the harness's binds loopback only). */
static bool net_zk(netjob *n)
{
    char dir[400], cfg[500];
    snprintf(dir, sizeof dir, "%s/nszk", tmp);
    snprintf(cfg, sizeof cfg, "%s/zoo.cfg", dir);
    mkdir(dir, 0755);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof a;
    bind(s, (struct sockaddr *)&a, sizeof a);
    getsockname(s, (struct sockaddr *)&a, &len);
    n->zk_port = ntohs(a.sin_port);
    close(s);
    FILE *f = fopen(cfg, "w");
    if (!f) return false;
    fprintf(f, "tickTime=500\ndataDir=%s\nclientPort=%u\nadmin.enableServer=false\n"
               "4lw.commands.whitelist=ruok\n", dir, n->zk_port);
    fclose(f);
    pid_t parent = getpid();
    n->zk_pid = fork();
    if (n->zk_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execl("/usr/bin/java", "java", "-cp", "/usr/share/java/zookeeper.jar",
              "org.apache.zookeeper.server.quorum.QuorumPeerMain", cfg, (char *)NULL);
        _exit(127);
    }
    /* Ready when "ruok" is answered. Each probe is bounded (zk_test_4lw waits 2 s for a
     * reply): a probe that reached ZooKeeper while it was still starting can stay unanswered
     * for ever, and an unbounded probe (bash's /dev/tcp and grep, before) then hung the whole
     * test until the runner's limit killed it. */
    zk_test_server probe = {.port = n->zk_port};
    bool ready = false;
    for (double until = gr_now_s() + 30; !ready && gr_now_s() < until;) {
        char reply[16];
        ready = zk_test_4lw(&probe, "ruok", reply, sizeof reply) == 0 && !strncmp(reply, "imok", 4);
        if (!ready) usleep(100000);
    }
    if (!ready) {
        fprintf(stderr, "coord train: the namespaces' ZooKeeper did not answer on port %u in 30 s\n",
                n->zk_port);
        return false;
    }
    snprintf(n->trainer_url, sizeof n->trainer_url, "zk://127.0.0.1:%u/jobs/netns", n->zk_port);
    for (int i = 0; i < 3; i++)
        snprintf(n->url[i], sizeof n->url[i], "zk://10.%u.%d.1:%u/jobs/netns", n->net, i,
                 n->zk_port);
    return true;
}

/* `granary server --coord` inside namespace i (setns in the child, then exec: the pid is the
 * shard's, so SIGKILL reaches it). */
static void net_shard(netjob *n, int i, const char *ck)
{
    char listen[64], path[128];
    snprintf(listen, sizeof listen, "10.%u.%d.2:0", n->net, i);
    snprintf(path, sizeof path, "/var/run/netns/%s", n->ns[i]);
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        int fd = open(path, O_RDONLY);
        if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) _exit(126);
        dup2(p[1], 1);
        close(p[0]);
        /* A 5 s session, not the 2 s of the loopback runs: this test's ZooKeeper is a JVM
         * started just before the run, and while it warms up on 2 loaded cores its pings could
         * come later than a 2 s session allows (the client suspends the session after 2/3 of
         * it): the shards then fenced themselves, correctly, and the trainer recovered a second
         * time (2 recoveries where the test expects the kill's 1; seen in CI and in 1 of 40
         * local runs). */
        execl(ps_test_granary_bin(), "granary", "server", "--coord", n->url[i], "--listen", listen,
              "--insecure", "--shards", "2", "--threads", "1", "--session-timeout", "5000",
              "--ckpt-root", tmp, "--ckpt-dir", ck, i == 2 ? "--standby" : (char *)NULL,
              (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    char line[256] = "";
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
    n->srv[i].pid = pid;
    line[strcspn(line, "\n")] = '\0';
    assert_true(strncmp(line, "listening on 10.", 16) == 0);
    snprintf(n->srv[i].addr, sizeof n->srv[i].addr, "%.60s", line + 13);
}

static void test_sync_rollback_across_network_namespaces(void **state)
{
    (void)state;
    if (!zk.pid) skip();
    /* Runs by default (root and `ip netns` needed); GR_TEST_NETNS=0 skips it. It was opt-in
     * while one CI run in three hung after the clean run: the readiness probe of this test's
     * ZooKeeper (bash's /dev/tcp and grep, unbounded) could wait for ever on a connection the
     * starting ZooKeeper left unanswered; net_zk's probe is bounded now. */
    const char *opt = getenv("GR_TEST_NETNS");
    if (opt && !strcmp(opt, "0")) {
        fprintf(stderr, "SKIP: GR_TEST_NETNS=0\n");
        skip();
    }
    netjob *np = &g_net;
    memset(np, 0, sizeof *np);
    if (!net_up(np)) skip();
    job clean = {0};
    start_job(&clean, "nsclean", false);
    run(&clean, "sync", false);
    stop_job(&clean);
    assert_true(net_zk(np));
    job b = {0}; /* the trainer's side of the job: its files and url */
    memset(&b, 0, sizeof b);
    snprintf(b.url, sizeof b.url, "%.255s", np->trainer_url);
    snprintf(b.ck, sizeof b.ck, "ck-netns");
    snprintf(b.ckpath, sizeof b.ckpath, "%s/%s", tmp, b.ck);
    snprintf(b.metrics, sizeof b.metrics, "%s/metrics-netns.json", tmp);
    snprintf(b.log, sizeof b.log, "%s/train-netns.log", tmp);
    net_shard(np, 0, b.ck);
    net_shard(np, 1, b.ck);
    net_shard(np, 2, b.ck);
    for (int i = 0; i < 2; i++) b.shard[i] = np->srv[i]; /* serving_index1 looks here */
    double until = run_until();
    pid_t pid = spawn_train(&b, "sync");
    ps_test_server *victim = serving_index1(&b);
    char name[GR_CKPT_NAME_MAX];
    uint64_t step = 0;
    int st;
    while (gr_ckpt_latest(b.ckpath, name, &step) != GR_OK) {
        assert_int_equal(waitpid(pid, &st, WNOHANG), 0);
        assert_true(gr_now_s() < until);
        usleep(2000);
    }
    assert_int_equal(waitpid(pid, &st, WNOHANG), 0);
    int vi = victim == &b.shard[0] ? 0 : 1;
    fprintf(stderr, "coord train: killing shard 1 at %s in namespace %s after %s\n",
            np->srv[vi].addr, np->ns[vi], name);
    assert_int_equal(ps_test_server_stop(&np->srv[vi], SIGKILL), 128 + SIGKILL);
    np->srv[vi].pid = 0;
    int rc = wait_exit(pid, until, "the interrupted run across namespaces");
    if (rc) {
        char *txt = NULL;
        if (gr_read_file(b.log, &txt, NULL) == 0) fprintf(stderr, "%s\n", txt);
        free(txt);
        char cmd[600];
        snprintf(cmd, sizeof cmd, "timeout 20 %s cluster status --coord %s >&2",
                 ps_test_granary_bin(), np->trainer_url);
        if (system(cmd) != 0) fprintf(stderr, "coord train: cluster status failed\n");
        for (int i = 0; i < 3; i++)
            if (np->srv[i].pid > 0) dump_stacks(np->srv[i].pid, np->ns[i]);
    }
    net_down(np);
    assert_int_equal(rc, 0);
    char aucA[64], llA[64], aucB[64], llB[64];
    double recA, recB;
    read_metrics(&clean, aucA, llA, &recA);
    read_metrics(&b, aucB, llB, &recB);
    fprintf(stderr, "coord train netns: clean auc %s; killed auc %s; recoveries %g\n", aucA,
            aucB, recB);
    if (recB != 1 || strcmp(aucA, aucB) || strcmp(llA, llB)) {
        char *txt = NULL;
        if (gr_read_file(b.log, &txt, NULL) == 0) fprintf(stderr, "%s\n", txt);
        free(txt);
    }
    assert_true(recB == 1);
    assert_string_equal(aucA, aucB);
    assert_string_equal(llA, llB);
}

int main(void)
{
    /* Every run's deadline also ends before scripts/run-tests' limit for the whole binary,
     * so that a run that hangs fails here with its diagnostics rather than being killed. */
    const char *lim = getenv("GR_TEST_TIMEOUT");
    g_binary_deadline = gr_now_s() + (lim && atoi(lim) > 60 ? atoi(lim) : 300) - 25;
    /* GR_TEST_FILTER=NAME runs one test (e.g. the namespace run, in a loop). */
    if (getenv("GR_TEST_FILTER")) cmocka_set_test_filter(getenv("GR_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_rollback_is_bitwise_equal),
        cmocka_unit_test(test_async_partial_keeps_auc),
        cmocka_unit_test(test_second_trainer_takes_over_from_a_dead_chief),
        cmocka_unit_test_teardown(test_sync_rollback_across_network_namespaces, net_teardown),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
