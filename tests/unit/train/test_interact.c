/* DLRM's pairwise dot interaction (src/train/interact.c): the forward in lanes (16 examples at
 * a time) gives bit for bit the plain ordered dot of every pair, as the one-example path does,
 * for shapes with and without whole 16 x 16 blocks (d a multiple of 16 or not, a partial last
 * block of examples, a last tile past the last vector), and the backward the ordered sums of
 * the pair loop. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "train/interact.h"

static float *rand_floats(size_t n, uint32_t *seed)
{
    float *v = malloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        /* some exact zeros and negative products: the sign of a zero sum shows */
        v[i] = (*seed >> 28) == 0 ? -0.0f : (float)((double)(*seed >> 8) / (double)(1u << 24) - 0.5);
    }
    return v;
}

static const float *vec(const float *bot, const float *emb, size_t i, uint32_t v, uint32_t d,
                        uint32_t ns)
{
    return v == 0 ? bot + i * d : emb + (i * ns + v - 1) * d;
}

/* The order promised: 0, then + va[t] * vb[t] for t = 0 .. d-1, each rounded. */
static float ordered_dot(const float *va, const float *vb, uint32_t d)
{
    volatile float s = 0.0f;
    for (uint32_t t = 0; t < d; t++) {
        volatile float p = va[t] * vb[t];
        s = s + p;
    }
    return s;
}

static void check_forward(size_t n, uint32_t d, uint32_t ns)
{
    const uint32_t nvec = ns + 1, top_in = d + nvec * (nvec - 1) / 2;
    uint32_t seed = 17u + (uint32_t)n * 31u + d * 7u + ns;
    float *bot = rand_floats(n * d, &seed), *emb = rand_floats(n * ns * d, &seed);
    float *want = malloc(n * top_in * sizeof *want), *got = malloc(n * top_in * sizeof *got);
    float *one = malloc(n * top_in * sizeof *one);
    for (size_t i = 0; i < n; i++) {
        float *z = want + i * top_in;
        memcpy(z, bot + i * d, d * sizeof *z);
        uint32_t k = d;
        for (uint32_t a = 1; a < nvec; a++)
            for (uint32_t b = 0; b < a; b++)
                z[k++] = ordered_dot(vec(bot, emb, i, a, d, ns), vec(bot, emb, i, b, d, ns), d);
    }
    float *vt = calloc(tr_interact_vt_floats(nvec, d), sizeof *vt);
    size_t lf = tr_interact_lanes_floats(nvec, d);
    assert_true(lf > 0);
    float *lanes = malloc(lf * sizeof *lanes);
    memset(got, 0xff, n * top_in * sizeof *got);
    tr_interact_forward(got, top_in, bot, emb, n, d, ns, nvec, vt, lanes);
    assert_memory_equal(got, want, n * top_in * sizeof *got);
    tr_interact_forward(one, top_in, bot, emb, n, d, ns, nvec, vt, NULL); /* one at a time */
    assert_memory_equal(one, want, n * top_in * sizeof *one);
    free(bot);
    free(emb);
    free(want);
    free(got);
    free(one);
    free(vt);
    free(lanes);
}

static void test_forward_criteo_shape(void **state)
{
    (void)state;
    check_forward(64, 16, 26);  /* four whole blocks */
    check_forward(37, 16, 26);  /* two blocks and 5 examples one at a time */
    check_forward(5, 16, 26);   /* no whole block */
}

static void test_forward_other_shapes(void **state)
{
    (void)state;
    const uint32_t dims[] = {1, 3, 8, 17, 32, 48};
    const uint32_t slots[] = {1, 2, 4, 5, 13, 40};
    for (size_t a = 0; a < sizeof dims / sizeof *dims; a++)
        for (size_t b = 0; b < sizeof slots / sizeof *slots; b++) check_forward(33, dims[a], slots[b]);
}

static void test_forward_large_shape_falls_back(void **state)
{
    (void)state;
    /* Past the lanes' scratch limits the scratch size is 0 and NULL is the whole path. */
    assert_int_equal(tr_interact_lanes_floats(200, 128), 0);
    assert_true(tr_interact_lanes_floats(27, 16) > 0);
}

/* Backward: g_c = (dz's bottom part for c = 0) + sum over j != c, in order of j, of
 * ddot(c, j) v_j. */
static void test_backward_ordered(void **state)
{
    (void)state;
    /* Criteo's 26 slots, and counts that leave 0 to 3 vectors past the last group of 4. */
    const uint32_t dims[] = {4, 16, 17, 32}, slots[] = {26, 1, 2, 5, 8};
    for (size_t q = 0; q < sizeof dims / sizeof *dims * (sizeof slots / sizeof *slots); q++) {
        const uint32_t d = dims[q % 4], ns = slots[q / 4], nvec = ns + 1,
                       top_in = d + nvec * (nvec - 1) / 2;
        const size_t n = 19;
        uint32_t seed = 99u + d + 1000u * ns;
        float *bot = rand_floats(n * d, &seed), *emb = rand_floats(n * ns * d, &seed);
        float *dz = rand_floats(n * top_in, &seed);
        float *dbot = malloc(n * d * sizeof *dbot), *gemb = malloc(n * ns * d * sizeof *gemb);
        float *dsym = malloc(((size_t)nvec * nvec + 1) * sizeof *dsym);
        tr_interact_backward(dz, top_in, bot, emb, n, d, ns, nvec, dbot, gemb, dsym);
        for (size_t i = 0; i < n; i++) {
            const float *ddots = dz + i * top_in + d;
            for (uint32_t c = 0; c < nvec; c++)
                for (uint32_t t = 0; t < d; t++) {
                    volatile float s = c == 0 ? dz[i * top_in + t] : 0.0f;
                    for (uint32_t j = 0; j < nvec; j++) {
                        uint32_t a = c > j ? c : j, b = c > j ? j : c;
                        float dd = j == c ? 0.0f : ddots[a * (a - 1) / 2 + b];
                        volatile float p = dd * vec(bot, emb, i, j, d, ns)[t];
                        s = s + p;
                    }
                    float got = c == 0 ? dbot[i * d + t] : gemb[(i * ns + c - 1) * d + t];
                    float want = s;
                    assert_memory_equal(&got, &want, sizeof got);
                }
        }
        free(bot);
        free(emb);
        free(dz);
        free(dbot);
        free(gemb);
        free(dsym);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_criteo_shape),
        cmocka_unit_test(test_forward_other_shapes),
        cmocka_unit_test(test_forward_large_shape_falls_back),
        cmocka_unit_test(test_backward_ordered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
