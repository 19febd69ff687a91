/* The one-example layer kernels of model_prep.c: the AVX-512 kernel gives the AVX2 kernel's
 * bits, and both give a plain reference written from the rule they follow (per block of
 * OpenBLAS's K split, a fused multiply-add chain from zero in input order, added to the
 * bias), on random layers of many shapes, every block split the search may pick, and inputs
 * with zeros, negative zeros, denormals and mixed scales. A CPU without AVX-512 checks only
 * the AVX2 kernel against the reference. The multi-example kernels give the one-example
 * kernel's bits row by row. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "granary/core.h"
#include "train/model_prep.h"

/* The block length rule, written again here from its description in model_prep.c. */
static uint32_t ref_block(uint32_t left, uint32_t q, uint32_t u)
{
    if (left >= 2 * q) return q;
    if (left > q) {
        uint32_t half = ((left / 2 + u - 1) / u) * u;
        return half < left ? half : left;
    }
    return left;
}

static void ref_gemv(uint32_t in, uint32_t out, const float *x, const float *wt, const float *b,
                     uint32_t q, uint32_t u, float *y)
{
    for (uint32_t j = 0; j < out; j++) y[j] = b[j];
    for (uint32_t k0 = 0, len; k0 < in; k0 += len) {
        len = ref_block(in - k0, q, u);
        for (uint32_t j = 0; j < out; j++) {
            float a = 0.0f;
            for (uint32_t k = k0; k < k0 + len; k++) a = fmaf(x[k], wt[(size_t)k * out + j], a);
            y[j] += a;
        }
    }
}

static float value(gr_rng *r, uint32_t i)
{
    switch (gr_rng_next(r) % 8) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return 1e-40f * (float)(gr_rng_uniform(r) - 0.5); /* a denormal */
    default: return (float)(gr_rng_uniform(r) * 2.0 - 1.0) * (float)(1u << (i % 9));
    }
}

static void test_kernels_bitwise(void **state)
{
    (void)state;
    if (!tr_gemv_supported()) skip();
    gr_rng r;
    gr_rng_seed(&r, 77);
    /* The served model's layers first (DLRM's default: 13-64-32-16, 367-128-64-1), then
     * random shapes: outputs around every width the kernels cut at (8, 16, 64, 128). */
    static const uint32_t shapes[][2] = {{13, 64}, {64, 32}, {32, 16}, {367, 128}, {128, 64},
                                         {64, 1}, {383, 256}, {1, 1}, {5, 129}, {200, 143}};
    size_t nshapes = sizeof shapes / sizeof shapes[0], differ = 0, runs = 0;
    for (size_t c = 0; c < nshapes + 60; c++) {
        uint32_t in = c < nshapes ? shapes[c][0] : 1 + (uint32_t)(gr_rng_next(&r) % 420);
        uint32_t out = c < nshapes ? shapes[c][1] : 1 + (uint32_t)(gr_rng_next(&r) % 300);
        uint32_t q = 16 * (1 + (uint32_t)(gr_rng_next(&r) % 16)), u = 1u << (gr_rng_next(&r) % 6);
        float *wt = malloc((size_t)in * out * sizeof *wt), *b = malloc(out * sizeof *b);
        float *x = malloc(in * sizeof *x), *want = malloc(out * sizeof *want);
        float *got = malloc(out * sizeof *got);
        for (size_t i = 0; i < (size_t)in * out; i++) wt[i] = value(&r, (uint32_t)i);
        for (uint32_t j = 0; j < out; j++) b[j] = value(&r, j);
        for (int t = 0; t < 3; t++) {
            for (uint32_t k = 0; k < in; k++) x[k] = value(&r, k + (uint32_t)t);
            ref_gemv(in, out, x, wt, b, q, u, want);
            tr_gemv_exact_avx2(in, out, x, wt, b, q, u, got);
            differ += memcmp(want, got, out * sizeof *got) != 0;
            if (tr_gemv_avx512_supported()) {
                memset(got, 0x7f, out * sizeof *got);
                tr_gemv_exact_avx512(in, out, x, wt, b, q, u, got);
                differ += memcmp(want, got, out * sizeof *got) != 0;
            }
            tr_gemv_exact(in, out, x, wt, b, q, u, got);
            differ += memcmp(want, got, out * sizeof *got) != 0;
            runs++;
        }
        free(wt), free(b), free(x), free(want), free(got);
    }
    assert_int_equal(differ, 0);
    assert_true(runs >= 200);
}

/* The multi-example kernels: each of m = 1..9 rows (x and y with strides past the layer's
 * width, the gaps poisoned and checked untouched) bitwise what tr_gemv_exact gives for that
 * row alone, on the shapes above and random ones, with every kernel this CPU runs. */
typedef void multi_fn(uint32_t, uint32_t, size_t, const float *, size_t, const float *,
                      const float *, uint32_t, uint32_t, float *, size_t);

static size_t check_multi(multi_fn *fn, uint32_t in, uint32_t out, size_t m, const float *x,
                          size_t ldx, const float *wt, const float *b, uint32_t q, uint32_t u,
                          const float *want, size_t ldy)
{
    float *y = malloc(m * ldy * sizeof *y);
    memset(y, 0x7f, m * ldy * sizeof *y);
    fn(in, out, m, x, ldx, wt, b, q, u, y, ldy);
    size_t differ = 0;
    for (size_t i = 0; i < m; i++) {
        differ += memcmp(want + i * out, y + i * ldy, out * sizeof *y) != 0;
        for (size_t j = out; j < ldy; j++) {
            uint32_t bits;
            memcpy(&bits, &y[i * ldy + j], sizeof bits);
            differ += bits != 0x7f7f7f7fu; /* the gap between rows untouched */
        }
    }
    free(y);
    return differ;
}

static void test_multi_bitwise(void **state)
{
    (void)state;
    if (!tr_gemv_supported()) skip();
    gr_rng r;
    gr_rng_seed(&r, 78);
    static const uint32_t shapes[][2] = {{13, 64}, {64, 32}, {32, 16}, {367, 128}, {128, 64},
                                         {64, 1}, {383, 256}, {1, 1}, {5, 129}, {200, 143}};
    size_t nshapes = sizeof shapes / sizeof shapes[0], differ = 0, rows = 0;
    for (size_t c = 0; c < nshapes + 30; c++) {
        uint32_t in = c < nshapes ? shapes[c][0] : 1 + (uint32_t)(gr_rng_next(&r) % 420);
        uint32_t out = c < nshapes ? shapes[c][1] : 1 + (uint32_t)(gr_rng_next(&r) % 300);
        uint32_t q = 16 * (1 + (uint32_t)(gr_rng_next(&r) % 16)), u = 1u << (gr_rng_next(&r) % 6);
        const size_t ldx = in + 1 + gr_rng_next(&r) % 17, ldy = out + 1 + gr_rng_next(&r) % 17;
        const size_t mmax = 9;
        float *wt = malloc((size_t)in * out * sizeof *wt), *b = malloc(out * sizeof *b);
        float *x = malloc(mmax * ldx * sizeof *x), *want = malloc(mmax * out * sizeof *want);
        for (size_t i = 0; i < (size_t)in * out; i++) wt[i] = value(&r, (uint32_t)i);
        for (uint32_t j = 0; j < out; j++) b[j] = value(&r, j);
        for (size_t i = 0; i < mmax * ldx; i++) x[i] = value(&r, (uint32_t)i);
        for (size_t i = 0; i < mmax; i++) tr_gemv_exact(in, out, x + i * ldx, wt, b, q, u, want + i * out);
        for (size_t m = 1; m <= mmax; m++) {
            /* The rows from the start, and from row 9 - m: every row in every position. */
            const size_t at = mmax - m;
            differ += check_multi(tr_gemv_exact_multi, in, out, m, x, ldx, wt, b, q, u, want, ldy);
            differ += check_multi(tr_gemv_exact_multi_avx2, in, out, m, x + at * ldx, ldx, wt, b,
                                  q, u, want + at * out, ldy);
            if (tr_gemv_avx512_supported()) {
                differ += check_multi(tr_gemv_exact_multi_avx512, in, out, m, x, ldx, wt, b, q, u,
                                      want, ldy);
                differ += check_multi(tr_gemv_exact_multi_avx512, in, out, m, x + at * ldx, ldx,
                                      wt, b, q, u, want + at * out, ldy);
            }
            rows += m;
        }
        free(wt), free(b), free(x), free(want);
    }
    assert_int_equal(differ, 0);
    assert_true(rows >= 40 * 45);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_bitwise),
        cmocka_unit_test(test_multi_bitwise),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
