/* gemm.c: the matrix products of a DLRM training step (model.c), for its small fixed shapes,
 * with one summation order on every CPU. */
#ifndef GRANARY_TRAIN_GEMM_H
#define GRANARY_TRAIN_GEMM_H

#include <stddef.h>

/* Columns of B (and C) one pass of the kernels covers: the zero-padded panel width; and the
 * rows of B packed at a time. scratch must hold tr_gemm_scratch_floats(n) floats, n the
 * columns of B and C, and be 64-byte aligned. */
#define TR_GEMM_NR 32
#define TR_GEMM_KC 128
static inline size_t tr_gemm_scratch_floats(size_t n)
{
    return TR_GEMM_KC * ((n + TR_GEMM_NR - 1) / TR_GEMM_NR * TR_GEMM_NR);
}

/* C (m x n, row stride ldc) = bias + A B, A m x k (lda), B k x n (ldb), all row-major; bias is
 * n floats added to every row, or NULL for none. Each C element is bias, then + a_i * b_i for
 * i = 0 .. k-1 in order, one rounded multiply and one rounded add each (no fused multiply-add),
 * so every CPU and every copy of the kernel gives the same bits. */
void tr_gemm_nn(size_t m, size_t n, size_t k, const float *a, size_t lda, const float *b,
                size_t ldb, const float *bias, float *c, size_t ldc, float *scratch);

/* C (m x n, ldc) = A^T B: A is r x m (lda), B r x n (ldb); each element summed over the r rows
 * in order from 0, as tr_gemm_nn sums. */
void tr_gemm_tn(size_t m, size_t n, size_t r, const float *a, size_t lda, const float *b,
                size_t ldb, float *c, size_t ldc, float *scratch);

/* Which copy of the kernels this CPU runs: "avx512", "avx2" or "generic" (for reports). */
const char *tr_gemm_isa(void);

#endif
