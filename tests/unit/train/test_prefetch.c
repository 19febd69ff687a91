/* The hybrid row prefetch's split (src/train/prefetch.c): a batch's unique ids are split into
 * those the previous batch did not touch (fresh) and those it did (common), each part in the
 * batch's order with its positions (and the common ones' in the previous batch); remembering a batch forgets the one before; id 0 and ids
 * that share a slot are told apart; rows land at their positions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "train/trainer_int.h"

static void test_first_batch_is_all_fresh(void **state)
{
    (void)state;
    tr_prefetch p;
    assert_int_equal(tr_prefetch_init(&p, 8, 2), GR_OK);
    uint64_t a[] = {5, 0, 9};
    tr_prefetch_split(&p, a, 3);
    assert_int_equal(p.nfresh, 3);
    assert_int_equal(p.ncommon, 0);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(p.fresh_keys[i], a[i]);
        assert_int_equal(p.fresh_at[i], i);
    }
    tr_prefetch_fini(&p);
}

static void test_split_against_previous_batch(void **state)
{
    (void)state;
    tr_prefetch p;
    assert_int_equal(tr_prefetch_init(&p, 8, 2), GR_OK);
    uint64_t a[] = {5, 0, 9, 1ull << 40};
    tr_prefetch_remember(&p, a, 4);
    uint64_t b[] = {7, 9, 0, 11, 1ull << 40};
    tr_prefetch_split(&p, b, 5);
    assert_int_equal(p.ncommon, 3);
    assert_int_equal(p.common_keys[0], 9);
    assert_int_equal(p.common_at[0], 1);
    assert_int_equal(p.common_prev[0], 2); /* a[2] */
    assert_int_equal(p.common_keys[1], 0);
    assert_int_equal(p.common_at[1], 2);
    assert_int_equal(p.common_prev[1], 1);
    assert_int_equal(p.common_keys[2], 1ull << 40);
    assert_int_equal(p.common_at[2], 4);
    assert_int_equal(p.common_prev[2], 3);
    assert_int_equal(p.nfresh, 2);
    assert_int_equal(p.fresh_keys[0], 7);
    assert_int_equal(p.fresh_at[0], 0);
    assert_int_equal(p.fresh_keys[1], 11);
    assert_int_equal(p.fresh_at[1], 3);
    /* Remembering b forgets a: 5 is fresh again, 7 is now common. */
    tr_prefetch_remember(&p, b, 5);
    uint64_t c[] = {5, 7};
    tr_prefetch_split(&p, c, 2);
    assert_int_equal(p.nfresh, 1);
    assert_int_equal(p.fresh_keys[0], 5);
    assert_int_equal(p.ncommon, 1);
    assert_int_equal(p.common_keys[0], 7);
    tr_prefetch_fini(&p);
}

/* Many ids in a small set (every slot probed past its home), over many generations. */
static void test_full_set_and_generations(void **state)
{
    (void)state;
    enum { N = 1000 };
    tr_prefetch p;
    assert_int_equal(tr_prefetch_init(&p, N, 1), GR_OK);
    static uint64_t k[N], odd[N];
    for (int round = 0; round < 50; round++) {
        for (uint64_t i = 0; i < N; i++) k[i] = i * 2 + (uint64_t)round * 4096;
        tr_prefetch_remember(&p, k, N);
        for (uint64_t i = 0; i < N; i++) odd[i] = i + (uint64_t)round * 4096;
        tr_prefetch_split(&p, odd, N);
        assert_int_equal(p.ncommon, N / 2);
        for (size_t i = 0; i < p.ncommon; i++) {
            assert_int_equal(p.common_keys[i] % 2, 0);
            assert_int_equal(k[p.common_prev[i]], p.common_keys[i]); /* its place in k */
        }
        for (size_t i = 0; i < p.nfresh; i++) assert_int_equal(p.fresh_keys[i] % 2, 1);
    }
    tr_prefetch_fini(&p);
}

static void test_place(void **state)
{
    (void)state;
    float src[] = {1, 2, 3, 4}, rows[6] = {0};
    uint32_t at[] = {2, 0};
    tr_prefetch_place(src, at, 2, 2, rows);
    float want[] = {3, 4, 0, 0, 1, 2};
    assert_memory_equal(rows, want, sizeof want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_batch_is_all_fresh),
        cmocka_unit_test(test_split_against_previous_batch),
        cmocka_unit_test(test_full_set_and_generations),
        cmocka_unit_test(test_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
