/* The scheduler's decisions (pure): priorities, waiting, preemption order, no preemption of
 * equal or higher priority or of serving jobs, cores already being freed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "platform/platform_int.h"

#define Q(id, prio, cores) {id, prio, cores, JOB_QUEUED, false, true}
#define R(id, prio, cores) {id, prio, cores, JOB_RUNNING, false, true}

static size_t decide(const sched_job *jobs, size_t n, unsigned cap, sched_action *out)
{
    return sched_decide(jobs, n, cap, out, 16);
}

static void test_starts_by_priority_then_age(void **state)
{
    (void)state;
    sched_job jobs[] = {Q(1, 0, 1), Q(2, 5, 1), Q(3, 5, 1), Q(4, 0, 1)};
    sched_action a[16];
    size_t n = decide(jobs, 4, 3, a);
    assert_int_equal(n, 3);
    assert_int_equal(a[0].kind, ACT_START);
    assert_int_equal(a[0].id, 2);
    assert_int_equal(a[1].id, 3);
    assert_int_equal(a[2].id, 1);
}

static void test_nothing_lower_starts_while_a_higher_one_waits(void **state)
{
    (void)state;
    /* 2 cores busy with priority 9; job 2 (prio 5, 2 cores) cannot preempt it and waits;
     * job 3 (prio 1, 1 core) would fit in the free core but must not jump the queue. */
    sched_job jobs[] = {R(1, 9, 2), Q(2, 5, 2), Q(3, 1, 1)};
    sched_action a[16];
    assert_int_equal(decide(jobs, 3, 3, a), 0);
}

static void test_preempts_lowest_then_newest(void **state)
{
    (void)state;
    sched_job jobs[] = {R(1, 1, 1), R(2, 0, 1), R(3, 0, 1), R(4, 3, 1), Q(5, 10, 2)};
    sched_action a[16];
    size_t n = decide(jobs, 5, 4, a);
    assert_int_equal(n, 2);
    assert_int_equal(a[0].kind, ACT_PREEMPT);
    assert_int_equal(a[0].id, 3); /* priority 0, the newer of the two */
    assert_int_equal(a[1].kind, ACT_PREEMPT);
    assert_int_equal(a[1].id, 2);
}

static void test_no_preemption_without_enough_room(void **state)
{
    (void)state;
    /* Only job 1 is below priority 5; its core is not enough for 3 cores. */
    sched_job jobs[] = {R(1, 0, 1), R(2, 7, 2), Q(3, 5, 3)};
    sched_action a[16];
    assert_int_equal(decide(jobs, 3, 3, a), 0);
}

static void test_equal_priority_and_serving_jobs_are_not_preempted(void **state)
{
    (void)state;
    sched_job jobs[] = {R(1, 5, 1), {2, 0, 1, JOB_RUNNING, false, false}, Q(3, 5, 2)};
    sched_action a[16];
    assert_int_equal(decide(jobs, 3, 2, a), 0);
}

static void test_cores_being_freed_count_before_new_preemptions(void **state)
{
    (void)state;
    /* Job 1 is already stopping (2 cores on their way back): job 3 waits, job 2 is spared. */
    sched_job jobs[] = {{1, 0, 2, JOB_RUNNING, true, true}, R(2, 0, 2), Q(3, 9, 2)};
    sched_action a[16];
    assert_int_equal(decide(jobs, 3, 4, a), 0);
    /* Once job 1 is gone, job 3 starts without touching job 2. */
    sched_job after[] = {R(2, 0, 2), Q(3, 9, 2)};
    size_t n = decide(after, 2, 4, a);
    assert_int_equal(n, 1);
    assert_int_equal(a[0].kind, ACT_START);
    assert_int_equal(a[0].id, 3);
}

static void test_preempted_jobs_resume_when_room_frees(void **state)
{
    (void)state;
    sched_job jobs[] = {{1, 0, 2, JOB_PREEMPTED, false, true}, Q(2, 0, 1)};
    sched_action a[16];
    size_t n = decide(jobs, 2, 2, a);
    assert_int_equal(n, 1);
    assert_int_equal(a[0].kind, ACT_START);
    assert_int_equal(a[0].id, 1); /* older than job 2 at the same priority */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_starts_by_priority_then_age),
        cmocka_unit_test(test_nothing_lower_starts_while_a_higher_one_waits),
        cmocka_unit_test(test_preempts_lowest_then_newest),
        cmocka_unit_test(test_no_preemption_without_enough_room),
        cmocka_unit_test(test_equal_priority_and_serving_jobs_are_not_preempted),
        cmocka_unit_test(test_cores_being_freed_count_before_new_preemptions),
        cmocka_unit_test(test_preempted_jobs_resume_when_room_frees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
