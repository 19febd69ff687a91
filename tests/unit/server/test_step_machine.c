/* Unit tests for the step synchronisation state machine: every mode, staleness drops,
 * duplicates, deterministic reduction order, timeouts and shutdown. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "server/step_machine.h"

/* A fake store: key k of id 1 is weights[k], dim 1; apply adds the gradient. */
typedef struct store {
    float w[16];
    int calls;
    size_t last_n;
} store;

static int apply_add(void *ctx, uint32_t kind, uint32_t id, uint32_t dim, const uint64_t *keys,
                     size_t n, const float *grads)
{
    store *s = ctx;
    assert_int_equal(kind, GR_SYNC_SPARSE);
    assert_int_equal(id, 1);
    assert_int_equal(dim, 1);
    for (size_t i = 1; i < n; i++)
        for (size_t j = 0; j < i; j++) assert_true(keys[i] != keys[j]); /* unique */
    for (size_t i = 0; i < n; i++) s->w[keys[i]] += grads[i];
    s->calls++;
    s->last_n = n;
    return 0;
}

static gr_sync_part part1(const uint64_t *keys, const float *g, size_t n)
{
    gr_sync_part p = {.id = 1, .dim = 1, .n = n, .keys = keys, .grads = g};
    return p;
}

static void test_async_applies_on_arrival(void **state)
{
    (void)state;
    store s = {0};
    gr_sync_config cfg = {.mode = GR_SYNC_ASYNC, .workers = 2};
    gr_step_machine *ss;
    assert_int_equal(gr_step_machine_create(&cfg, apply_add, &s, &ss), 0);
    uint64_t k[] = {3};
    float g[] = {2.0f};
    gr_sync_part p = part1(k, g, 1);
    gr_sync_outcome o;
    assert_int_equal(gr_step_machine_push(ss, 0, 0, &p, 1, &o), 0);
    assert_int_equal(o, GR_SYNC_APPLIED);
    assert_true(s.w[3] == 2.0f);
    assert_int_equal(gr_step_machine_acquire(ss, 1, 100, 10, NULL), 0); /* never blocks */
    gr_step_machine_destroy(ss);
}

static void test_sync_waits_for_all_and_averages(void **state)
{
    (void)state;
    store s = {0};
    gr_sync_config cfg = {.mode = GR_SYNC_SYNC, .workers = 3, .aggregate = 1, .staleness = 5};
    gr_step_machine *ss;
    assert_int_equal(gr_step_machine_create(&cfg, apply_add, &s, &ss), 0);
    assert_int_equal(gr_step_machine_config(ss)->aggregate, 3); /* sync forces K = N, s = 0 */
    assert_int_equal(gr_step_machine_config(ss)->staleness, 0);
    uint64_t k0[] = {1, 2}, k1[] = {2}, k2[] = {5};
    float g0[] = {3, 6}, g1[] = {3}, g2[] = {9};
    gr_sync_part p0 = part1(k0, g0, 2), p1 = part1(k1, g1, 1), p2 = part1(k2, g2, 1);
    gr_sync_outcome o;
    assert_int_equal(gr_step_machine_push(ss, 0, 0, &p0, 1, &o), 0);
    assert_int_equal(o, GR_SYNC_STAGED);
    assert_int_equal(gr_step_machine_acquire(ss, 0, 1, 20, NULL), GR_ETIMEDOUT);
    assert_non_null(strstr(gr_errmsg(), "1 of 3"));
    assert_int_equal(gr_step_machine_push(ss, 1, 0, &p1, 1, &o), 0);
    assert_int_equal(o, GR_SYNC_STAGED);
    assert_int_equal(s.calls, 0);
    /* A repeated push from worker 0 for step 0 is a retry: ignored. */
    assert_int_equal(gr_step_machine_push(ss, 0, 0, &p0, 1, &o), 0);
    assert_int_equal(o, GR_SYNC_DUPLICATE);
    assert_int_equal(gr_step_machine_push(ss, 2, 0, &p2, 1, &o), 0);
    assert_int_equal(o, GR_SYNC_APPLIED);
    assert_int_equal(s.calls, 1);
    assert_int_equal(s.last_n, 3); /* keys 1, 2, 5 after dedup */
    assert_true(s.w[1] == 1.0f);   /* 3 / 3 */
    assert_true(s.w[2] == 3.0f);   /* (6 + 3) / 3 */
    assert_true(s.w[5] == 3.0f);
    uint64_t cur = 0;
    assert_int_equal(gr_step_machine_acquire(ss, 0, 1, 10, &cur), 0);
    assert_true(cur == 1);
    /* A step from the future is refused. */
    assert_int_equal(gr_step_machine_push(ss, 0, 5, &p0, 1, &o), GR_ESTALE);
    assert_int_equal(gr_step_machine_push(ss, 7, 1, &p0, 1, &o), GR_EINVAL);
    gr_sync_stats st;
    gr_step_machine_get_stats(ss, &st);
    assert_true(st.step == 1 && st.applied_steps == 1 && st.duplicates == 1);
    gr_step_machine_destroy(ss);
}

static void test_semisync_backup_drops_stale(void **state)
{
    (void)state;
    store s = {0};
    gr_sync_config cfg = {.mode = GR_SYNC_SEMISYNC, .workers = 3, .aggregate = 2, .staleness = 0};
    gr_step_machine *ss;
    assert_int_equal(gr_step_machine_create(&cfg, apply_add, &s, &ss), 0);
    uint64_t k[] = {0};
    float g[] = {4};
    gr_sync_part p = part1(k, g, 1);
    gr_sync_outcome o;
    assert_int_equal(gr_step_machine_push(ss, 2, 0, &p, 1, &o), 0);
    assert_int_equal(gr_step_machine_push(ss, 0, 0, &p, 1, &o), 0);
    assert_int_equal(o, GR_SYNC_APPLIED); /* K = 2 arrived */
    assert_true(s.w[0] == 4.0f);          /* (4 + 4) / 2 */
    /* The straggler's step-0 gradient is now stale: dropped and counted. */
    assert_int_equal(gr_step_machine_push(ss, 1, 0, &p, 1, &o), 0);
    assert_int_equal(o, GR_SYNC_DROPPED);
    assert_true(s.w[0] == 4.0f);
    /* The straggler acquires its next step and learns the current step to tag with. */
    uint64_t cur = 0;
    assert_int_equal(gr_step_machine_acquire(ss, 1, 1, 10, &cur), 0);
    assert_true(cur == 1);
    gr_sync_stats st;
    gr_step_machine_get_stats(ss, &st);
    assert_true(st.dropped == 1 && st.step == 1);
    assert_true(st.staleness_hist[0] == 2);
    gr_step_machine_destroy(ss);
}

static void test_semisync_staleness_admits(void **state)
{
    (void)state;
    store s = {0};
    gr_sync_config cfg = {.mode = GR_SYNC_SEMISYNC, .workers = 2, .aggregate = 1, .staleness = 1};
    gr_step_machine *ss;
    assert_int_equal(gr_step_machine_create(&cfg, apply_add, &s, &ss), 0);
    uint64_t k[] = {0};
    float g[] = {1};
    gr_sync_part p = part1(k, g, 1);
    gr_sync_outcome o;
    assert_int_equal(gr_step_machine_push(ss, 0, 0, &p, 1, &o), 0); /* G -> 1 */
    assert_int_equal(gr_step_machine_push(ss, 0, 1, &p, 1, &o), 0); /* G -> 2 */
    assert_int_equal(gr_step_machine_push(ss, 1, 1, &p, 1, &o), 0); /* lag 1: admitted, G -> 3 */
    assert_int_equal(o, GR_SYNC_APPLIED);
    assert_int_equal(gr_step_machine_push(ss, 1, 2, &p, 1, &o), 0); /* wait: lag 1 admitted */
    assert_int_equal(o, GR_SYNC_APPLIED);
    assert_true(s.w[0] == 4.0f);
    uint64_t kk[] = {1};
    gr_sync_part q = part1(kk, g, 1);
    /* G = 4 now; worker 0 pushing step 2 is lag 2 > 1: dropped. */
    assert_int_equal(gr_step_machine_push(ss, 0, 2, &q, 1, &o), 0);
    assert_int_equal(o, GR_SYNC_DROPPED);
    assert_true(s.w[1] == 0.0f);
    gr_step_machine_destroy(ss);
}

static void test_reduction_order_is_worker_order(void **state)
{
    (void)state;
    /* Floating-point sums depend on order; the aggregate must not depend on arrival. */
    float big = 1e8f, small = 1.0f;
    float results[2];
    for (int order = 0; order < 2; order++) {
        store s = {0};
        gr_sync_config cfg = {.mode = GR_SYNC_SYNC, .workers = 3};
        gr_step_machine *ss;
        assert_int_equal(gr_step_machine_create(&cfg, apply_add, &s, &ss), 0);
        uint64_t k[] = {0};
        /* Worker order: (big - big) + small = small; arrival order 2, 1, 0 would give
         * (small - big) + big = 0. */
        float gb[] = {big}, gs[] = {small}, gn[] = {-big};
        gr_sync_part pb = part1(k, gb, 1), ps = part1(k, gs, 1), pn = part1(k, gn, 1);
        if (order == 0) {
            gr_step_machine_push(ss, 0, 0, &pb, 1, NULL);
            gr_step_machine_push(ss, 1, 0, &pn, 1, NULL);
            gr_step_machine_push(ss, 2, 0, &ps, 1, NULL);
        } else {
            gr_step_machine_push(ss, 2, 0, &ps, 1, NULL);
            gr_step_machine_push(ss, 1, 0, &pn, 1, NULL);
            gr_step_machine_push(ss, 0, 0, &pb, 1, NULL);
        }
        results[order] = s.w[0];
        gr_step_machine_destroy(ss);
    }
    assert_memory_equal(&results[0], &results[1], sizeof(float));
    assert_true(results[0] == small / 3.0f);
}

static void test_ssp_bound(void **state)
{
    (void)state;
    store s = {0};
    gr_sync_config cfg = {.mode = GR_SYNC_SSP, .workers = 2, .staleness = 2};
    gr_step_machine *ss;
    assert_int_equal(gr_step_machine_create(&cfg, apply_add, &s, &ss), 0);
    uint64_t k[] = {0};
    float g[] = {1};
    gr_sync_part p = part1(k, g, 1);
    /* Worker 0 may run steps 0, 1, 2 while worker 1 has pushed nothing. */
    for (uint64_t t = 0; t < 3; t++) {
        assert_int_equal(gr_step_machine_acquire(ss, 0, t, 10, NULL), 0);
        assert_int_equal(gr_step_machine_push(ss, 0, t, &p, 1, NULL), 0);
    }
    assert_true(s.w[0] == 3.0f); /* applied on arrival */
    assert_int_equal(gr_step_machine_acquire(ss, 0, 3, 20, NULL), GR_ETIMEDOUT);
    assert_non_null(strstr(gr_errmsg(), "worker 1"));
    assert_int_equal(gr_step_machine_push(ss, 1, 0, &p, 1, NULL), 0);
    assert_int_equal(gr_step_machine_acquire(ss, 0, 3, 10, NULL), 0);
    gr_step_machine_destroy(ss);
}

typedef struct waiter_arg {
    gr_step_machine *ss;
    int rc;
} waiter_arg;

static void *waiter(void *arg)
{
    waiter_arg *a = arg;
    a->rc = gr_step_machine_acquire(a->ss, 0, 1, 10000, NULL);
    return NULL;
}

static void *waiter5(void *arg)
{
    waiter_arg *a = arg;
    a->rc = gr_step_machine_acquire(a->ss, 1, 5, 10000, NULL);
    return NULL;
}

static void test_blocked_acquire_wakes(void **state)
{
    (void)state;
    store s = {0};
    gr_sync_config cfg = {.mode = GR_SYNC_SYNC, .workers = 2};
    gr_step_machine *ss;
    assert_int_equal(gr_step_machine_create(&cfg, apply_add, &s, &ss), 0);
    uint64_t k[] = {0};
    float g[] = {1};
    gr_sync_part p = part1(k, g, 1);
    waiter_arg a = {ss, -999};
    pthread_t th;
    pthread_create(&th, NULL, waiter, &a);
    gr_step_machine_push(ss, 0, 0, &p, 1, NULL);
    gr_step_machine_push(ss, 1, 0, &p, 1, NULL);
    pthread_join(th, NULL);
    assert_int_equal(a.rc, 0);
    /* Shutdown wakes a blocked waiter with GR_ESHUTDOWN. */
    waiter_arg b = {ss, -999};
    pthread_t th2;
    pthread_create(&th2, NULL, waiter5, &b);
    gr_sleep_ms(20);
    gr_step_machine_shutdown(ss);
    pthread_join(th2, NULL);
    assert_int_equal(b.rc, GR_ESHUTDOWN);
    assert_int_equal(gr_step_machine_acquire(ss, 0, 5, 10000, NULL), GR_ESHUTDOWN);
    gr_step_machine_destroy(ss);
}

static void test_bad_config(void **state)
{
    (void)state;
    store s = {0};
    gr_step_machine *ss;
    gr_sync_config c1 = {.mode = GR_SYNC_SEMISYNC, .workers = 2, .aggregate = 3};
    assert_int_equal(gr_step_machine_create(&c1, apply_add, &s, &ss), GR_EINVAL);
    gr_sync_config c2 = {.mode = GR_SYNC_SYNC, .workers = 0};
    assert_int_equal(gr_step_machine_create(&c2, apply_add, &s, &ss), GR_EINVAL);
    gr_sync_config c3 = {.mode = 9, .workers = 1};
    assert_int_equal(gr_step_machine_create(&c3, apply_add, &s, &ss), GR_EINVAL);
}

/* A store that records (kind, id) of every apply and the sum written. */
typedef struct kstore {
    int calls;
    uint32_t kinds[8], ids[8];
    float vals[8];
    int notified;
} kstore;

static int apply_kinds(void *ctx, uint32_t kind, uint32_t id, uint32_t dim, const uint64_t *keys,
                       size_t n, const float *grads)
{
    kstore *s = ctx;
    (void)keys;
    assert_int_equal(dim, 1);
    assert_int_equal(n, 1);
    if (s->calls < 8) {
        s->kinds[s->calls] = kind;
        s->ids[s->calls] = id;
        s->vals[s->calls] = grads[0];
    }
    s->calls++;
    return 0;
}

static void count_notify(void *ctx) { ((kstore *)ctx)->notified++; }

static void test_kinds_aggregate_apart(void **state)
{
    (void)state;
    kstore s = {0};
    gr_sync_config cfg = {.mode = GR_SYNC_SYNC, .workers = 2};
    gr_step_machine *ss;
    assert_int_equal(gr_step_machine_create(&cfg, apply_kinds, &s, &ss), 0);
    uint64_t k[] = {0};
    float a[] = {2}, b[] = {6};
    /* Sparse table 3 and dense tensor 3 share the number but not the kind. */
    gr_sync_part p0[2] = {{.id = 3, .dim = 1, .n = 1, .keys = k, .grads = a},
                          {.id = 3, .dim = 1, .n = 1, .keys = k, .grads = b, .kind = GR_SYNC_DENSE}};
    gr_sync_part p1[2] = {{.id = 3, .dim = 1, .n = 1, .keys = k, .grads = b, .kind = GR_SYNC_DENSE},
                          {.id = 3, .dim = 1, .n = 1, .keys = k, .grads = a}};
    assert_int_equal(gr_step_machine_push(ss, 0, 0, p0, 2, NULL), 0);
    assert_int_equal(gr_step_machine_push(ss, 1, 0, p1, 2, NULL), 0);
    assert_int_equal(s.calls, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(s.ids[i], 3);
        assert_true(s.vals[i] == (s.kinds[i] == GR_SYNC_DENSE ? 6.0f : 2.0f)); /* means */
    }
    assert_true(s.kinds[0] != s.kinds[1]);
    gr_step_machine_destroy(ss);
}

static void test_leave_in_sync(void **state)
{
    (void)state;
    store s = {0};
    gr_sync_config cfg = {.mode = GR_SYNC_SYNC, .workers = 3};
    gr_step_machine *ss;
    assert_int_equal(gr_step_machine_create(&cfg, apply_add, &s, &ss), 0);
    uint64_t k[] = {0};
    float g[] = {6};
    gr_sync_part p = part1(k, g, 1);
    gr_sync_outcome o;
    bool applied = true;
    /* Worker 0 pushes its last step and leaves: the step still waits for 1 and 2. */
    assert_int_equal(gr_step_machine_push(ss, 0, 0, &p, 1, &o), 0);
    assert_int_equal(gr_step_machine_leave(ss, 0, &applied), 0);
    assert_false(applied);
    assert_int_equal(gr_step_machine_push(ss, 1, 0, &p, 1, &o), 0);
    assert_int_equal(o, GR_SYNC_STAGED);
    /* Worker 2 leaves without pushing: the step has every remaining worker's push. */
    assert_int_equal(gr_step_machine_leave(ss, 2, &applied), 0);
    assert_true(applied);
    assert_true(s.w[0] == 6.0f); /* (6 + 6) / 2: divided by the pushes in the step */
    assert_int_equal(gr_step_machine_active(ss), 1);
    /* Worker 1 alone now: each push is a step. */
    assert_int_equal(gr_step_machine_push(ss, 1, 1, &p, 1, &o), 0);
    assert_int_equal(o, GR_SYNC_APPLIED);
    assert_true(s.w[0] == 12.0f);
    assert_int_equal(gr_step_machine_leave(ss, 2, &applied), 0); /* idempotent */
    gr_sync_stats st;
    gr_step_machine_get_stats(ss, &st);
    assert_true(st.step == 2 && st.short_steps == 2 && st.left == 2 && st.admitted == 3);
    gr_step_machine_destroy(ss);
}

static void test_poll_tags_and_notify(void **state)
{
    (void)state;
    store s = {0};
    kstore n = {0};
    gr_sync_config cfg = {.mode = GR_SYNC_SEMISYNC, .workers = 3, .aggregate = 2};
    gr_step_machine *ss;
    assert_int_equal(gr_step_machine_create(&cfg, apply_add, &s, &ss), 0);
    gr_step_machine_set_notify(ss, count_notify, &n);
    uint64_t k[] = {0};
    float g[] = {1};
    gr_sync_part p = part1(k, g, 1);
    bool ready = true;
    uint64_t tag = 99, cur = 99;
    assert_int_equal(gr_step_machine_poll(ss, 0, 0, true, &ready, &tag, &cur), 0);
    assert_true(ready && tag == 0 && cur == 0);
    assert_int_equal(gr_step_machine_push(ss, 0, 0, &p, 1, NULL), 0);
    assert_int_equal(n.notified, 0); /* staged only: nobody can start anything new */
    assert_int_equal(gr_step_machine_poll(ss, 0, 1, true, &ready, &tag, &cur), 0);
    assert_false(ready);
    assert_int_equal(gr_step_machine_poll(ss, 0, 1, false, &ready, &tag, &cur), 0);
    char why[200];
    gr_step_machine_describe_wait(ss, 1, why, sizeof why);
    assert_non_null(strstr(why, "1 of 2 gradients"));
    assert_int_equal(gr_step_machine_push(ss, 1, 0, &p, 1, NULL), 0);
    assert_int_equal(n.notified, 1);
    assert_int_equal(gr_step_machine_poll(ss, 0, 1, false, &ready, &tag, &cur), 0);
    assert_true(ready && tag == 1);
    /* The backup worker (2) asks for step 0 and is told to tag with G = 1. */
    assert_int_equal(gr_step_machine_poll(ss, 2, 0, true, &ready, &tag, &cur), 0);
    assert_true(ready && tag == 1 && cur == 1);
    gr_step_machine_note_wait(ss, 5000);
    gr_sync_stats st;
    gr_step_machine_get_stats(ss, &st);
    assert_true(st.waits == 1 && st.wait_ns == 5000);
    gr_step_machine_shutdown(ss);
    assert_int_equal(n.notified, 2);
    assert_int_equal(gr_step_machine_poll(ss, 0, 1, false, &ready, &tag, &cur), GR_ESHUTDOWN);
    assert_int_equal(gr_step_machine_poll(ss, 9, 1, false, &ready, &tag, &cur), GR_EINVAL);
    gr_step_machine_destroy(ss);
}

static void test_ssp_leave_unblocks(void **state)
{
    (void)state;
    store s = {0};
    gr_sync_config cfg = {.mode = GR_SYNC_SSP, .workers = 2, .staleness = 0};
    gr_step_machine *ss;
    assert_int_equal(gr_step_machine_create(&cfg, apply_add, &s, &ss), 0);
    uint64_t k[] = {0};
    float g[] = {1};
    gr_sync_part p = part1(k, g, 1);
    assert_int_equal(gr_step_machine_push(ss, 0, 0, &p, 1, NULL), 0);
    bool ready = true;
    uint64_t tag = 0, cur = 0;
    assert_int_equal(gr_step_machine_poll(ss, 0, 1, true, &ready, &tag, &cur), 0);
    assert_false(ready); /* worker 1 has pushed nothing */
    assert_int_equal(gr_step_machine_leave(ss, 1, NULL), 0);
    assert_int_equal(gr_step_machine_poll(ss, 0, 1, true, &ready, &tag, &cur), 0);
    assert_true(ready && tag == 1 && cur == 1); /* ssp tags with the step asked for */
    gr_step_machine_destroy(ss);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_async_applies_on_arrival),
        cmocka_unit_test(test_sync_waits_for_all_and_averages),
        cmocka_unit_test(test_semisync_backup_drops_stale),
        cmocka_unit_test(test_semisync_staleness_admits),
        cmocka_unit_test(test_reduction_order_is_worker_order),
        cmocka_unit_test(test_ssp_bound),
        cmocka_unit_test(test_blocked_acquire_wakes),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_kinds_aggregate_apart),
        cmocka_unit_test(test_leave_in_sync),
        cmocka_unit_test(test_poll_tags_and_notify),
        cmocka_unit_test(test_ssp_leave_unblocks),
    };
    return cmocka_run_group_tests_name("step_machine", tests, NULL, NULL);
}
