/* The uniform initializer's values, bit for bit: rows created by lookups are compared with a
 * scalar reference written here from the documented stream (splitmix64 seeded with
 * gr_hash_key(key, table seed), low + (high - low) * u in double, rounded to float, values at
 * `high` moved just below it). On a CPU with AVX-512 DQ the table draws eight elements at a
 * time (opt.c, uniform8); this test holds that path to the scalar values for every dim from 1
 * to 130 (the vector part and each scalar tail), f32 and f16 storage, and ranges where the
 * rounding to float reaches `high` often. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "granary/core.h"
#include "granary/table.h"

#define NKEYS 97
#define MAXD 130

/* Returns how many values rounded to `high` and were moved below it. */
static unsigned reference_row(uint64_t key, uint64_t seed, float low, float high, uint32_t dim,
                              float *w)
{
    unsigned clamped = 0;
    uint64_t st = gr_hash_key(key, seed);
    const double span = (double)high - (double)low;
    for (uint32_t i = 0; i < dim; i++) {
        uint64_t z = (st += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const double u = (double)(z >> 11) * 0x1.0p-53;
        float v = (float)((double)low + span * u);
        if (v >= high) {
            v = nextafterf(high, low);
            clamped++;
        }
        w[i] = v;
    }
    return clamped;
}

static uint64_t key_of(unsigned i) { return (uint64_t)i * 0x2545f4914f6cdd1dull + 11; }

/* Creates NKEYS rows of a table of `dim` by lookup and compares each with the reference;
 * returns how many reference values were clamped below `high`. */
static unsigned check_dim(uint32_t dim, float low, float high, gr_dtype dtype, uint64_t seed)
{
    gr_table_spec s;
    gr_table_spec_default(&s, "init", dim);
    s.dtype = dtype;
    s.seed = seed;
    s.init.kind = GR_INIT_UNIFORM;
    s.init.low = low;
    s.init.high = high;
    s.partitions = 4;
    gr_table *t = NULL;
    assert_int_equal(gr_table_create(&s, &t), GR_OK);
    uint64_t keys[NKEYS];
    for (unsigned i = 0; i < NKEYS; i++) keys[i] = key_of(i);
    static float out[NKEYS * MAXD], ref[MAXD];
    assert_int_equal(gr_table_lookup(t, keys, NKEYS, out, 0), GR_OK);
    unsigned clamped = 0;
    for (unsigned i = 0; i < NKEYS; i++) {
        clamped += reference_row(keys[i], seed, low, high, dim, ref);
        for (uint32_t j = 0; j < dim; j++) {
            float want = ref[j];
            if (dtype == GR_DTYPE_F16) want = gr_f16_to_f32(gr_f32_to_f16(want));
            uint32_t a, b;
            memcpy(&a, &out[i * dim + j], 4);
            memcpy(&b, &want, 4);
            if (a != b)
                fail_msg("dim %u key %u element %u: %a, reference %a", dim, i, j,
                         (double)out[i * dim + j], (double)want);
        }
    }
    gr_table_destroy(t);
    return clamped;
}

static void test_uniform_every_dim(void **state)
{
    (void)state;
    for (uint32_t dim = 1; dim <= MAXD; dim++) check_dim(dim, -0.05f, 0.05f, GR_DTYPE_F32, 0x656d62);
}

static void test_uniform_f16_and_other_ranges(void **state)
{
    (void)state;
    const uint32_t dims[] = {7, 8, 9, 16, 23, 64, 128};
    for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++) {
        check_dim(dims[k], -0.05f, 0.05f, GR_DTYPE_F16, 42);
        check_dim(dims[k], 0.0f, 1.0f, GR_DTYPE_F32, 7);
        check_dim(dims[k], -3.0f, -2.5f, GR_DTYPE_F32, 1ull << 63);
    }
}

/* A range one float wide: low + span * u rounds to `high` for about half of the draws, which
 * are then moved below it; the vector path must move exactly the same ones. */
static void test_uniform_clamp(void **state)
{
    (void)state;
    const float low = 1.0f, high = nextafterf(1.0f, 2.0f);
    unsigned clamped = 0;
    for (uint32_t dim = 8; dim <= 24; dim++) clamped += check_dim(dim, low, high, GR_DTYPE_F32, 3);
    /* Every value ends as low (the float below high); the clamp must have been taken. */
    assert_true(clamped > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uniform_every_dim),
        cmocka_unit_test(test_uniform_f16_and_other_ranges),
        cmocka_unit_test(test_uniform_clamp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
