/* Integration: the time slices of the threads that wait more than they compute
 * (docs/server.md, "Time slices"; docs/train.md, "Session 8"). A shard's connection loop and
 * worker threads ask for gr_server_config.slice_us, a client's reader threads for
 * gr_client_config.slice_us, the embedded cluster's shards for GR_LOCAL_CLUSTER_SLICE_US, and
 * a pipelined trainer's read, fetch and push threads for GR_TRAIN_IO_SLICE_US while its
 * compute threads keep the kernel's default; out-of-range slices are refused, naming the
 * field. Each thread's slice is read from the kernel (sched_getattr of every thread of the
 * process). Skipped where the kernel has no custom slices (before Linux 6.12). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "granary/client.h"
#include "granary/cluster.h"
#include "granary/server.h"
#include "granary/train.h"
#include "tests/support/sched_probe.h"
#include "tests/support/train_fixture.h"

#define MAXT 512

/* Every thread id of this process; their number. */
static size_t threads(pid_t *out)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < MAXT)
        if (e->d_name[0] != '.') out[n++] = (pid_t)atoi(e->d_name);
    closedir(d);
    return n;
}

/* The threads in now[] that are not in before[], with their slices. */
static size_t new_threads(const pid_t *before, size_t nb, const pid_t *now, size_t nn,
                          uint64_t *slices)
{
    size_t k = 0;
    for (size_t i = 0; i < nn; i++) {
        bool old = false;
        for (size_t j = 0; j < nb && !old; j++) old = now[i] == before[j];
        if (!old) slices[k++] = sched_probe_slice_ns_of(now[i]);
    }
    return k;
}

static void *probe_main(void *arg)
{
    *(int *)arg = gr_thread_set_slice_us(300);
    return NULL;
}

/* How many of slices[0..k) are exactly ns. */
static size_t count(const uint64_t *slices, size_t k, uint64_t ns)
{
    size_t c = 0;
    for (size_t i = 0; i < k; i++) c += slices[i] == ns;
    return c;
}

/* The threads started since before[] and their slices, once `want` of them have slice ns (a
 * new thread asks for its slice when it starts running, a moment after it was created); up
 * to 2 s. */
static size_t settled(const pid_t *before, size_t nb, uint64_t *sl, uint64_t ns, size_t want)
{
    static pid_t now[MAXT];
    size_t k = 0;
    for (int i = 0; i < 200; i++) {
        k = new_threads(before, nb, now, threads(now), sl);
        if (count(sl, k, ns) >= want) break;
        usleep(10000);
    }
    return k;
}

/* Whether this kernel lets a thread choose its slice (asked on a thread of its own). */
static bool custom_slices(void)
{
    int rc = -1;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, probe_main, &rc), 0);
    pthread_join(t, NULL);
    gr_clearerr();
    return rc == GR_OK;
}

static void test_bad_slices_refused(void **state)
{
    (void)state;
    gr_server_config cfg;
    gr_server_config_default(&cfg);
    cfg.slice_us = 50;
    gr_server *s = NULL;
    assert_int_equal(gr_server_create(&cfg, &s), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "slice_us"));
    assert_null(s);
    cfg.slice_us = 100001;
    assert_int_equal(gr_server_create(&cfg, &s), GR_EINVAL);

    gr_local_cluster *cl;
    assert_int_equal(gr_local_cluster_start(1, 1, &cl), 0);
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = gr_local_cluster_servers(cl);
    cc.slice_us = 99;
    gr_client *c = NULL;
    assert_int_equal(gr_client_create(&cc, &c), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "slice_us"));
    assert_null(c);
    gr_local_cluster_stop(cl);
}

static void test_server_and_client_threads(void **state)
{
    (void)state;
    if (!custom_slices()) skip();
    static pid_t before[MAXT], now[MAXT];
    uint64_t sl[MAXT];
    uint64_t mine = sched_probe_slice_ns();

    /* A shard with 3 workers and a 250 us slice: its loop and its workers ask for it. */
    size_t nb = threads(before);
    gr_server_config cfg;
    gr_server_config_default(&cfg);
    cfg.threads = 3;
    cfg.slice_us = 250;
    gr_server *s;
    assert_int_equal(gr_server_create(&cfg, &s), 0);
    assert_int_equal(gr_server_start(s), 0);
    size_t k = settled(before, nb, sl, 250000u, 4);
    /* The loop and the 3 workers; the shard's other threads (the sync timer) keep the
     * default, as the thread that started the server has it. */
    assert_int_equal(count(sl, k, 250000u), 4);
    assert_int_equal(count(sl, k, mine), k - 4);
    assert_int_equal(sched_probe_slice_ns(), mine); /* the caller's own is untouched */

    /* A client with a 400 us slice: its reader thread asks for it. */
    nb = threads(before);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", gr_server_port(s));
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = addr;
    cc.slice_us = 400;
    gr_client *c;
    assert_int_equal(gr_client_create(&cc, &c), 0);
    k = settled(before, nb, sl, 400000u, 1);
    assert_int_equal(k, 1);
    assert_int_equal(sl[0], 400000u);
    gr_client_destroy(c);

    /* slice_us 0: the kernel's default, as before. */
    nb = threads(before);
    cc.slice_us = 0;
    assert_int_equal(gr_client_create(&cc, &c), 0);
    k = new_threads(before, nb, now, threads(now), sl);
    assert_int_equal(k, 1);
    assert_int_equal(sl[0], mine);
    gr_client_destroy(c);
    assert_int_equal(gr_server_stop(s), 0);
    gr_server_destroy(s);

    /* The embedded cluster's shards ask for GR_LOCAL_CLUSTER_SLICE_US. */
    nb = threads(before);
    gr_local_cluster *cl;
    assert_int_equal(gr_local_cluster_start(2, 2, &cl), 0);
    k = settled(before, nb, sl, GR_LOCAL_CLUSTER_SLICE_US * 1000u, 6);
    assert_int_equal(count(sl, k, GR_LOCAL_CLUSTER_SLICE_US * 1000u), 6); /* 2 x (loop + 2) */
    gr_local_cluster_stop(cl);
}

/* What the trainer's reader threads and the rest of the process had at each batch. */
typedef struct seen {
    pthread_mutex_t mu;
    unsigned calls, reader_short, reader_other;
    unsigned max_default; /* the most threads started by the run on the default slice */
    uint64_t def;         /* the default slice (the test's own thread) */
    pid_t before[MAXT];   /* the threads before the run */
    size_t nbefore;
} seen;

static bool on_batch(void *ctx)
{
    seen *s = ctx;
    static pid_t now[MAXT];
    pthread_mutex_lock(&s->mu);
    s->calls++;
    if (sched_probe_slice_ns() == GR_TRAIN_IO_SLICE_US * 1000u) s->reader_short++;
    else s->reader_other++;
    uint64_t sl[MAXT];
    size_t k = new_threads(s->before, s->nbefore, now, threads(now), sl);
    unsigned d = 0;
    for (size_t i = 0; i < k; i++) d += sl[i] == s->def;
    if (d > s->max_default) s->max_default = d;
    pthread_mutex_unlock(&s->mu);
    return false;
}

static void test_trainer_io_threads(void **state)
{
    (void)state;
    if (!custom_slices()) skip();
    tr_fixture f;
    assert_int_equal(tr_fixture_make(&f, "slices", 3), 0);
    seen s = {.mu = PTHREAD_MUTEX_INITIALIZER, .def = sched_probe_slice_ns()};
    gr_local_cluster *cl;
    assert_int_equal(gr_local_cluster_start(2, 2, &cl), 0);
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = gr_local_cluster_local_servers(cl);
    cc.slice_us = GR_TRAIN_IO_SLICE_US;
    gr_client *c;
    assert_int_equal(gr_client_create(&cc, &c), 0);
    gr_ps_backend_opts po;
    gr_ps_backend_opts_default(&po);
    po.client = c;
    po.mode = GR_MODE_HYBRID;
    po.workers = 2;
    po.dense_lag = 1;
    po.reset = true;
    gr_train_backend be;
    assert_int_equal(gr_ps_backend_create(&po, &be), 0);
    gr_train_opts o;
    tr_fixture_small_dlrm(&f, &o, GR_MODE_HYBRID, 2);
    o.test_path = NULL;
    o.max_examples = 8192;
    o.should_stop = on_batch;
    o.stop_ctx = &s;
    gr_train_result res;
    s.nbefore = threads(s.before);
    int rc = gr_train_run(&o, &be, &res);
    if (rc) fprintf(stderr, "train: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    gr_ps_backend_finish(&be);
    gr_train_backend_destroy(&be);
    gr_client_destroy(c);
    gr_local_cluster_stop(cl);
    assert_int_equal(tr_fixture_remove(&f), 0);

    assert_true(s.calls > 0);
    /* Every batch was read by a thread on the short slice... */
    assert_int_equal(s.reader_other, 0);
    assert_int_equal(s.reader_short, s.calls);
    /* ... while both compute threads kept the default: a thread inherits its creator's
     * slice, so a push thread that asked before starting compute would pass it on. */
    assert_true(s.max_default >= 2);
    assert_int_equal(sched_probe_slice_ns(), s.def);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_slices_refused),
        cmocka_unit_test(test_server_and_client_threads),
        cmocka_unit_test(test_trainer_io_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
