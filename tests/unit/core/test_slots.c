/* The slot function is part of the wire and checkpoint contract: gr_slot_of and the array
 * version gr_slots_of (XXH3 compiled in) must give exactly the values libxxhash's XXH3 gives,
 * which placed every row written so far. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>

#include "granary/core.h"

/* Values of XXH3_64bits_withSeed(&key, 8, 0x736c6f74) & 16383 from libxxhash 0.8. */
static const struct {
    uint64_t key;
    uint32_t slot;
} pinned[] = {{0, 12205},           {1, 4768},     {2, 346},
              {0xdeadbeefull, 13927}, {UINT64_MAX, 13609}, {1234567890123ull, 9002},
              {1ull << 63, 7356}};

static void test_pinned_values(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++) {
        assert_int_equal(gr_slot_of(pinned[i].key), pinned[i].slot);
        uint32_t s = 0;
        gr_slots_of(&pinned[i].key, 1, &s);
        assert_int_equal(s, pinned[i].slot);
    }
}

/* The array version against the library's hash (gr_hash_key links libxxhash) key by key. */
static void test_array_matches_library(void **state)
{
    (void)state;
    enum { N = 20000 };
    uint64_t *keys = malloc(N * sizeof *keys);
    uint32_t *slots = malloc((N + 1) * sizeof *slots);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        keys[i] = i < 1000 ? i : x;
    }
    slots[N] = 0xabcdu; /* not written past n */
    gr_slots_of(keys, N, slots);
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(slots[i], (uint32_t)(gr_hash_key(keys[i], 0x736c6f74u) & (GR_SLOTS - 1)));
        assert_int_equal(slots[i], gr_slot_of(keys[i]));
    }
    assert_int_equal(slots[N], 0xabcdu);
    gr_slots_of(keys, 0, NULL);
    free(keys);
    free(slots);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pinned_values),
        cmocka_unit_test(test_array_matches_library),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
