/* The training step's matrix products (src/train/gemm.c): bit for bit the plain loop that
 * adds each product in order without fusing (the promise that every CPU gets the same
 * bits), for shapes with partial tiles and panels, strided operands, bias and no bias, and
 * near cblas_sgemm. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cblas.h>
#include <stdbool.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/gemm.h"

static float *rand_floats(size_t n, uint32_t *seed)
{
    float *v = malloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        v[i] = (float)((double)(*seed >> 8) / (double)(1u << 24) - 0.5);
    }
    return v;
}

/* The order the kernels promise: bias, then + a * b for s = 0 .. k-1, each rounded. */
static float ordered_dot(size_t k, const float *a, size_t a_cs, const float *b, size_t ldb,
                         float init)
{
    volatile float c = init; /* volatile: keep every multiply and add separate and rounded */
    for (size_t s = 0; s < k; s++) {
        volatile float p = a[s * a_cs] * b[s * ldb];
        c = c + p;
    }
    return c;
}

static void check_nn(size_t m, size_t n, size_t k, size_t pad, bool bias, uint32_t seed)
{
    const size_t lda = k + pad, ldb = n + pad, ldc = n + pad;
    float *a = rand_floats(m * lda, &seed), *b = rand_floats(k * ldb, &seed);
    float *bv = bias ? rand_floats(n, &seed) : NULL;
    float *c = calloc(m * ldc + 1, sizeof *c), *ref = calloc(m * ldc + 1, sizeof *ref);
    float *scratch = aligned_alloc(64, tr_gemm_scratch_floats(n + 1) * sizeof *scratch);
    for (size_t i = 0; i < m * ldc; i++) c[i] = ref[i] = -7.0f; /* the gaps stay as they are */
    tr_gemm_nn(m, n, k, a, lda, b, ldb, bv, c, ldc, scratch);
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++)
            ref[i * ldc + j] = ordered_dot(k, a + i * lda, 1, b + j, ldb, bv ? bv[j] : 0.0f);
    assert_memory_equal(c, ref, m * ldc * sizeof *c);
    /* And the same product as OpenBLAS computes it, up to rounding. */
    float *o = calloc(m * n + 1, sizeof *o);
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++) o[i * n + j] = bv ? bv[j] : 0.0f;
    if (m && n && k)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a,
                    (int)lda, b, (int)ldb, 1.0f, o, (int)n);
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++)
            assert_true(fabsf(o[i * n + j] - c[i * ldc + j]) <= 1e-5f * (float)(k + 1));
    free(a), free(b), free(bv), free(c), free(ref), free(scratch), free(o);
}

static void check_tn(size_t m, size_t n, size_t r, size_t pad, uint32_t seed)
{
    const size_t lda = m + pad, ldb = n + pad, ldc = n + pad;
    float *a = rand_floats(r * lda, &seed), *b = rand_floats(r * ldb, &seed);
    float *c = calloc(m * ldc + 1, sizeof *c), *ref = calloc(m * ldc + 1, sizeof *ref);
    float *scratch = aligned_alloc(64, tr_gemm_scratch_floats(n + 1) * sizeof *scratch);
    for (size_t i = 0; i < m * ldc; i++) c[i] = ref[i] = -7.0f;
    tr_gemm_tn(m, n, r, a, lda, b, ldb, c, ldc, scratch);
    for (size_t o = 0; o < m; o++)
        for (size_t j = 0; j < n; j++) ref[o * ldc + j] = ordered_dot(r, a + o, lda, b + j, ldb, 0);
    assert_memory_equal(c, ref, m * ldc * sizeof *c);
    free(a), free(b), free(c), free(ref), free(scratch);
}

static void test_nn_bitwise(void **state)
{
    (void)state;
    /* The default DLRM's layers (forward: B = W^T; backward dX: B = W), smaller batches. */
    const size_t shapes[][3] = {{37, 64, 13},  {37, 32, 64},  {37, 16, 32}, {37, 128, 367},
                                {37, 64, 128}, {37, 1, 64},   {37, 367, 128}, {5, 13, 64},
                                {1, 1, 1},     {4, 32, 1},    {3, 33, 2},   {9, 31, 70},
                                {70, 40, 300}, {33, 64, 256}, {2, 3, 129}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        check_nn(shapes[i][0], shapes[i][1], shapes[i][2], 0, true, (uint32_t)i + 1);
        check_nn(shapes[i][0], shapes[i][1], shapes[i][2], 3, false, (uint32_t)i + 100);
    }
    check_nn(0, 5, 5, 0, true, 7); /* nothing to do */
    check_nn(6, 5, 0, 0, true, 8); /* k = 0: C is the bias */
}

static void test_tn_bitwise(void **state)
{
    (void)state;
    /* Weight gradients: dY^T X, summed over the batch. */
    const size_t shapes[][3] = {{64, 13, 37}, {16, 32, 37}, {128, 367, 37}, {1, 64, 37},
                                {3, 5, 1},    {7, 33, 300}, {5, 32, 0},  {128, 367, 1024}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        check_tn(shapes[i][0], shapes[i][1], shapes[i][2], 0, (uint32_t)i + 200);
        check_tn(shapes[i][0], shapes[i][1], shapes[i][2], 2, (uint32_t)i + 300);
    }
}

static void test_isa_named(void **state)
{
    (void)state;
    const char *isa = tr_gemm_isa();
    assert_true(!strcmp(isa, "avx512") || !strcmp(isa, "avx2") || !strcmp(isa, "generic"));
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) assert_string_equal(isa, "avx512");
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nn_bitwise),
        cmocka_unit_test(test_tn_bitwise),
        cmocka_unit_test(test_isa_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
