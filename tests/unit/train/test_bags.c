/* tr_bags_scatter without list columns (src/train/bags.c): each unique id's gradient summed
 * over its occurrences in order, bit for bit 0 + g1 + g2 + ... (a -0 gradient alone sums to
 * +0), for ids numbered in first-seen order (gr_dedup's) and in any other order; rows it must
 * overwrite start as garbage. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "granary/train.h"
#include "train/trainer_int.h"

#define D 4

static void reference(const uint32_t *inv, size_t n, const float *gemb, size_t nuniq, float *rows)
{
    memset(rows, 0, nuniq * D * sizeof *rows);
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < D; k++) rows[inv[i] * D + k] += gemb[i * D + k];
}

static void check(const uint32_t *inv, size_t n, size_t nuniq)
{
    tr_bags g = {false, 26, NULL};
    gr_batch b;
    memset(&b, 0, sizeof b);
    b.n_ids = n;
    float *gemb = malloc(n * D * sizeof *gemb), *want = malloc(nuniq * D * sizeof *want);
    float *got = malloc(nuniq * D * sizeof *got);
    uint32_t seed = 5;
    for (size_t i = 0; i < n * D; i++) {
        seed = seed * 1664525u + 1013904223u;
        gemb[i] = (seed >> 29) == 0 ? -0.0f : (float)((double)(seed >> 8) / (1u << 24) - 0.5);
    }
    reference(inv, n, gemb, nuniq, want);
    memset(got, 0x7f, nuniq * D * sizeof *got); /* garbage the scatter must overwrite */
    tr_bags_scatter(&g, &b, gemb, inv, nuniq, D, got);
    assert_memory_equal(got, want, nuniq * D * sizeof *got);
    free(gemb);
    free(want);
    free(got);
}

static void test_first_seen_order(void **state)
{
    (void)state;
    uint64_t keys[200];
    uint32_t seed = 9;
    for (size_t i = 0; i < 200; i++) {
        seed = seed * 1664525u + 1013904223u;
        keys[i] = seed % 37; /* many repeats */
    }
    uint64_t uniq[200];
    uint32_t inv[200];
    long nu = gr_dedup(keys, 200, uniq, inv, NULL);
    assert_true(nu > 0 && nu <= 37);
    check(inv, 200, (size_t)nu);
}

static void test_a_single_negative_zero_sums_to_positive_zero(void **state)
{
    (void)state;
    const uint32_t inv[] = {0, 1, 1};
    check(inv, 3, 2); /* seed 5's draws include -0 entries; the reference says what they give */
    tr_bags g = {false, 26, NULL};
    gr_batch b;
    memset(&b, 0, sizeof b);
    b.n_ids = 1;
    const uint32_t one[] = {0};
    float gz[D] = {-0.0f, -0.0f, -0.0f, -0.0f}, row[D];
    tr_bags_scatter(&g, &b, gz, one, 1, D, row);
    const float pz[D] = {0.0f, 0.0f, 0.0f, 0.0f};
    assert_memory_equal(row, pz, sizeof row);
}

static void test_other_numbering(void **state)
{
    (void)state;
    const uint32_t inv[] = {2, 0, 1, 2, 0}; /* id 2 first: not first-seen order */
    check(inv, 5, 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_seen_order),
        cmocka_unit_test(test_a_single_negative_zero_sums_to_positive_zero),
        cmocka_unit_test(test_other_numbering),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
