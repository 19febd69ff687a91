/* The pipeline's bounded queues (src/train/queue.c): items come out in order; try_pop never
 * waits and says when nothing is queued; a closed queue drains then gives NULL; an abort makes
 * every pop give NULL at once, even with items queued. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "train/trainer_int.h"

static void test_order_try_pop_close_abort(void **state)
{
    (void)state;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    bool abort_flag = false;
    tr_queue q;
    assert_int_equal(tr_queue_init(&q, 3, &mu, &abort_flag), GR_OK);
    tr_item items[3];
    assert_null(tr_queue_try_pop(&q));
    for (int i = 0; i < 3; i++) tr_queue_push(&q, &items[i]);
    assert_ptr_equal(tr_queue_try_pop(&q), &items[0]);
    assert_ptr_equal(tr_queue_pop(&q), &items[1]);
    tr_queue_push(&q, &items[0]); /* wraps around the ring */
    assert_ptr_equal(tr_queue_try_pop(&q), &items[2]);
    assert_ptr_equal(tr_queue_pop(&q), &items[0]);
    assert_null(tr_queue_try_pop(&q));
    /* Closed: what is left drains, then NULL without waiting. */
    tr_queue_push(&q, &items[1]);
    tr_queue_close(&q);
    assert_ptr_equal(tr_queue_pop(&q), &items[1]);
    assert_null(tr_queue_pop(&q));
    assert_null(tr_queue_try_pop(&q));
    tr_queue_fini(&q);
    /* Aborted: nothing comes out, whatever is queued. */
    assert_int_equal(tr_queue_init(&q, 2, &mu, &abort_flag), GR_OK);
    tr_queue_push(&q, &items[0]);
    abort_flag = true;
    assert_null(tr_queue_try_pop(&q));
    assert_null(tr_queue_pop(&q));
    tr_queue_fini(&q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_try_pop_close_abort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
