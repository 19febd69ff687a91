/* Unit tests for the step machine's dense lag (delayed synchronous SGD, docs/sync.md): two
 * steps in flight, each step applied alone and in worker order whatever the arrival order,
 * duplicate and future refusals, leaving while the next step's sum is staged, and the config
 * checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "server/step_machine.h"

/* A fake store: key k of id 1 is w[k], dim 1; apply adds the gradient (so the last applied
 * step's values can be told apart from a sum of several steps) and logs each call. */
typedef struct store {
    float w[8];
    int calls;
    float last[8]; /* the last call's gradient per key (0 where absent) */
} store;

static int apply_add(void *ctx, uint32_t kind, uint32_t id, uint32_t dim, const uint64_t *keys,
                     size_t n, const float *grads)
{
    store *s = ctx;
    assert_int_equal(kind, GR_SYNC_DENSE);
    assert_int_equal(id, 1);
    assert_int_equal(dim, 1);
    memset(s->last, 0, sizeof s->last);
    for (size_t i = 0; i < n; i++) {
        s->w[keys[i]] += grads[i];
        s->last[keys[i]] = grads[i];
    }
    s->calls++;
    return 0;
}

static const uint64_t key0[] = {0};

static gr_sync_part dense1(const float *g)
{
    gr_sync_part p = {.id = 1, .dim = 1, .n = 1, .keys = key0, .grads = g, .kind = GR_SYNC_DENSE};
    return p;
}

static gr_step_machine *make(uint32_t workers, uint32_t lag, store *s)
{
    gr_sync_config cfg = {.mode = GR_SYNC_SYNC, .workers = workers, .dense_lag = lag};
    gr_step_machine *ss = NULL;
    assert_int_equal(gr_step_machine_create(&cfg, apply_add, s, &ss), 0);
    return ss;
}

static gr_sync_outcome push(gr_step_machine *ss, uint32_t w, uint64_t step, float g)
{
    gr_sync_part p = dense1(&g);
    gr_sync_outcome o = (gr_sync_outcome)-1;
    assert_int_equal(gr_step_machine_push(ss, w, step, &p, 1, &o), 0);
    return o;
}

static bool ready(gr_step_machine *ss, uint32_t w, uint64_t step, uint64_t *tag)
{
    bool r = false;
    uint64_t t = 0, cur = 0;
    assert_int_equal(gr_step_machine_poll(ss, w, step, false, &r, &t, &cur), 0);
    if (tag) *tag = t;
    return r;
}

static uint64_t g_of(gr_step_machine *ss)
{
    gr_sync_stats st;
    gr_step_machine_get_stats(ss, &st);
    return st.step;
}

/* Worker 0 runs one step ahead of worker 1: it starts step 1 before step 0 is applied, its
 * step-1 gradient waits in step 1's own sum, and step 0 applies only step 0's gradients. */
static void test_two_steps_in_flight(void **state)
{
    (void)state;
    store s = {0};
    gr_step_machine *ss = make(2, 1, &s);
    uint64_t tag = 99;
    assert_true(ready(ss, 0, 0, &tag));
    assert_true(tag == 0);
    assert_int_equal(push(ss, 0, 0, 2.0f), GR_SYNC_STAGED);
    /* Lag 1: step 1 may start while step 0 waits for worker 1; the tag is the step itself. */
    assert_true(ready(ss, 0, 1, &tag));
    assert_true(tag == 1);
    assert_false(ready(ss, 0, 2, NULL));
    assert_int_equal(gr_step_machine_acquire(ss, 0, 2, 20, NULL), GR_ETIMEDOUT);
    assert_non_null(strstr(gr_errmsg(), "1 of 2"));
    assert_int_equal(push(ss, 0, 1, 100.0f), GR_SYNC_STAGED);
    assert_int_equal(s.calls, 0);
    /* Worker 1's step 0 completes step 0: mean of 2 and 4, worker 0's step 1 stays staged. */
    assert_int_equal(push(ss, 1, 0, 4.0f), GR_SYNC_APPLIED);
    assert_int_equal(s.calls, 1);
    assert_true(s.w[0] == 3.0f);
    assert_true(g_of(ss) == 1);
    assert_true(ready(ss, 0, 2, NULL));
    assert_false(ready(ss, 0, 3, NULL));
    assert_int_equal(push(ss, 1, 1, 300.0f), GR_SYNC_APPLIED);
    assert_int_equal(s.calls, 2);
    assert_true(s.last[0] == 200.0f); /* (100 + 300) / 2: step 1 alone */
    assert_true(s.w[0] == 203.0f);
    gr_sync_stats st;
    gr_step_machine_get_stats(ss, &st);
    assert_true(st.step == 2 && st.applied_steps == 2 && st.admitted == 4);
    assert_true(st.ahead == 1 && st.staleness_hist[0] == 4 && st.dropped == 0);
    gr_step_machine_destroy(ss);
}

/* Three workers, steps 0 and 1 in flight, every arrival order of the six pushes that a lag
 * of 1 allows: the dense values are bitwise those of worker order. The gradients are chosen
 * so float addition in another order gives another result ((1e8 + 1) - 1e8 = 0 but
 * (1e8 - 1e8) + 1 = 1). */
static void run_order(const int *order, float *out)
{
    static const float g[2][3] = {{1e8f, 1.0f, -1e8f}, {-1e8f, 3.0f, 1e8f}};
    store s = {0};
    gr_step_machine *ss = make(3, 1, &s);
    uint64_t next[3] = {0, 0, 0};
    for (int i = 0; i < 6; i++) {
        uint32_t w = (uint32_t)order[i];
        uint64_t step = next[w]++;
        assert_true(ready(ss, w, step, NULL));
        gr_sync_outcome o = push(ss, w, step, g[step][w]);
        assert_true(o == GR_SYNC_STAGED || o == GR_SYNC_APPLIED);
    }
    assert_true(g_of(ss) == 2);
    assert_int_equal(s.calls, 2);
    *out = s.w[0];
    gr_step_machine_destroy(ss);
}

static void test_order_independent(void **state)
{
    (void)state;
    /* Each worker's own pushes in its order; a step-1 push needs step 0 applied or at most
     * one step ahead, which lag 1 allows at any point here. */
    static const int orders[][6] = {
        {0, 1, 2, 0, 1, 2}, {2, 1, 0, 2, 1, 0}, {0, 0, 1, 1, 2, 2}, {2, 2, 1, 0, 1, 0},
        {1, 2, 2, 0, 1, 0}, {0, 0, 2, 2, 1, 1},
    };
    float ref;
    run_order(orders[0], &ref);
    /* Worker order: ((1e8 + 1) - 1e8) / 3 = 0, then ((-1e8 + 3) + 1e8) / 3 = 0. */
    assert_true(ref == 0.0f);
    for (size_t i = 1; i < sizeof orders / sizeof orders[0]; i++) {
        float w;
        run_order(orders[i], &w);
        assert_memory_equal(&w, &ref, sizeof w);
    }
}

static void test_duplicates_and_future(void **state)
{
    (void)state;
    store s = {0};
    gr_step_machine *ss = make(2, 1, &s);
    assert_int_equal(push(ss, 0, 0, 1.0f), GR_SYNC_STAGED);
    assert_int_equal(push(ss, 0, 1, 1.0f), GR_SYNC_STAGED);
    /* Step 2 is beyond G + L = 1: from the future, refused as without a lag. */
    float g = 5.0f;
    gr_sync_part p = dense1(&g);
    gr_sync_outcome o;
    assert_int_equal(gr_step_machine_push(ss, 0, 2, &p, 1, &o), GR_ESTALE);
    assert_non_null(strstr(gr_errmsg(), "dense lag 1"));
    assert_int_equal(gr_step_machine_push(ss, 1, 2, &p, 1, &o), GR_ESTALE);
    /* Retries of steps already staged (either one) are duplicates: not staged twice. */
    assert_int_equal(push(ss, 0, 1, 7.0f), GR_SYNC_DUPLICATE);
    assert_int_equal(push(ss, 0, 0, 7.0f), GR_SYNC_DUPLICATE);
    assert_int_equal(push(ss, 1, 0, 3.0f), GR_SYNC_APPLIED);
    assert_true(s.w[0] == 2.0f); /* (1 + 3) / 2: no duplicate in it */
    assert_int_equal(push(ss, 1, 0, 3.0f), GR_SYNC_DUPLICATE);
    /* G = 1 now: step 2 is allowed, step 3 is not. */
    assert_int_equal(gr_step_machine_push(ss, 0, 3, &p, 1, &o), GR_ESTALE);
    assert_int_equal(push(ss, 1, 1, 5.0f), GR_SYNC_APPLIED);
    assert_true(s.w[0] == 5.0f); /* + (1 + 5) / 2 */
    gr_sync_stats st;
    gr_step_machine_get_stats(ss, &st);
    assert_true(st.duplicates == 3 && st.applied_steps == 2);
    gr_step_machine_destroy(ss);
}

/* A worker leaves while the next step's sum is staged: the steps that waited only for it are
 * applied at the leave (short steps), each alone, the later one too. */
static void test_leave_with_next_step_staged(void **state)
{
    (void)state;
    store s = {0};
    gr_step_machine *ss = make(2, 1, &s);
    assert_int_equal(push(ss, 0, 0, 2.0f), GR_SYNC_STAGED);
    assert_int_equal(push(ss, 1, 0, 4.0f), GR_SYNC_APPLIED);
    assert_int_equal(push(ss, 0, 1, 10.0f), GR_SYNC_STAGED);
    assert_int_equal(push(ss, 0, 2, 20.0f), GR_SYNC_STAGED);
    assert_int_equal(s.calls, 1);
    bool applied = false;
    /* Worker 1 leaves: step 1 had only it to wait for, and step 2 then too. */
    assert_int_equal(gr_step_machine_leave(ss, 1, &applied), 0);
    assert_true(applied);
    assert_int_equal(s.calls, 3);
    assert_true(s.last[0] == 20.0f); /* step 2 alone, divided by its one push */
    assert_true(s.w[0] == 33.0f);    /* 3 + 10 + 20 */
    gr_sync_stats st;
    gr_step_machine_get_stats(ss, &st);
    assert_true(st.step == 3 && st.short_steps == 2 && st.left == 1);
    assert_true(ready(ss, 0, 4, NULL));
    gr_step_machine_destroy(ss);

    /* Nobody pushed step 0 but worker 0, which is one step ahead; the other leaves. */
    store s2 = {0};
    ss = make(2, 1, &s2);
    assert_int_equal(push(ss, 0, 0, 2.0f), GR_SYNC_STAGED);
    assert_int_equal(push(ss, 0, 1, 6.0f), GR_SYNC_STAGED);
    assert_int_equal(gr_step_machine_leave(ss, 1, &applied), 0);
    assert_true(applied);
    assert_int_equal(s2.calls, 2);
    assert_true(s2.w[0] == 8.0f);
    assert_true(g_of(ss) == 2);
    gr_step_machine_destroy(ss);
}

/* A lag of 2: a worker may be two steps ahead of the applied step, and three steps' sums are
 * held at once. */
static void test_lag_two(void **state)
{
    (void)state;
    store s = {0};
    gr_step_machine *ss = make(2, 2, &s);
    assert_int_equal(push(ss, 0, 0, 1.0f), GR_SYNC_STAGED);
    assert_int_equal(push(ss, 0, 1, 2.0f), GR_SYNC_STAGED);
    assert_int_equal(push(ss, 0, 2, 4.0f), GR_SYNC_STAGED);
    assert_false(ready(ss, 0, 3, NULL));
    assert_int_equal(push(ss, 1, 0, 1.0f), GR_SYNC_APPLIED);
    assert_true(ready(ss, 0, 3, NULL));
    assert_int_equal(push(ss, 1, 1, 2.0f), GR_SYNC_APPLIED);
    assert_int_equal(push(ss, 1, 2, 4.0f), GR_SYNC_APPLIED);
    assert_int_equal(s.calls, 3);
    assert_true(s.w[0] == 7.0f);
    gr_step_machine_destroy(ss);
}

static void test_lag_config(void **state)
{
    (void)state;
    store s = {0};
    gr_step_machine *ss = NULL;
    gr_sync_config semi = {.mode = GR_SYNC_SEMISYNC, .workers = 2, .aggregate = 1, .dense_lag = 1};
    assert_int_equal(gr_step_machine_create(&semi, apply_add, &s, &ss), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "dense lag"));
    gr_sync_config ssp = {.mode = GR_SYNC_SSP, .workers = 2, .dense_lag = 1};
    assert_int_equal(gr_step_machine_create(&ssp, apply_add, &s, &ss), GR_EINVAL);
    gr_sync_config big = {.mode = GR_SYNC_SYNC, .workers = 2, .dense_lag = GR_SYNC_MAX_LAG + 1};
    assert_int_equal(gr_step_machine_create(&big, apply_add, &s, &ss), GR_EINVAL);
    gr_sync_config ok = {.mode = GR_SYNC_SYNC, .workers = 2, .dense_lag = GR_SYNC_MAX_LAG};
    assert_int_equal(gr_step_machine_create(&ok, apply_add, &s, &ss), 0);
    assert_int_equal(gr_step_machine_config(ss)->dense_lag, GR_SYNC_MAX_LAG);
    gr_step_machine_destroy(ss);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_steps_in_flight),
        cmocka_unit_test(test_order_independent),
        cmocka_unit_test(test_duplicates_and_future),
        cmocka_unit_test(test_leave_with_next_step_staged),
        cmocka_unit_test(test_lag_two),
        cmocka_unit_test(test_lag_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
