/* model_prep.c: one example's layer product with cblas_sgemm's bits (used by model.c for
 * gr_model_predict_prepared), and the same for several independent examples at once
 * (gr_model_predict_each). */
#ifndef GRANARY_TRAIN_MODEL_PREP_H
#define GRANARY_TRAIN_MODEL_PREP_H

#include "granary/core.h"

#include <stdbool.h>
#include <stdint.h>

/* Whether this CPU has the fused multiply-add the kernel needs. */
bool tr_gemv_supported(void);
/* y = b + x W^T for one example (wt: W transposed, in x out) with OpenBLAS's K blocks
 * (q, u). */
void tr_gemv_exact(uint32_t in, uint32_t out, const float *x, const float *wt, const float *b,
                   uint32_t q, uint32_t u, float *y);
/* Its two kernels (tr_gemv_exact picks the widest this CPU runs), the same bits: the unit
 * tests compare them. The AVX-512 one only where tr_gemv_avx512_supported(). */
void tr_gemv_exact_avx2(uint32_t in, uint32_t out, const float *x, const float *wt,
                        const float *b, uint32_t q, uint32_t u, float *y);
void tr_gemv_exact_avx512(uint32_t in, uint32_t out, const float *x, const float *wt,
                          const float *b, uint32_t q, uint32_t u, float *y);
bool tr_gemv_avx512_supported(void);
/* tr_gemv_exact for m examples (rows of x ldx floats apart, of y ldy apart): each row of y
 * bitwise what tr_gemv_exact gives for that row alone (so no row depends on the others or on
 * m), but each weight vector loaded once for up to four examples. Its two kernels likewise;
 * the AVX2 one is tr_gemv_exact_avx2 per row. */
void tr_gemv_exact_multi(uint32_t in, uint32_t out, size_t m, const float *x, size_t ldx,
                         const float *wt, const float *b, uint32_t q, uint32_t u, float *y,
                         size_t ldy);
void tr_gemv_exact_multi_avx2(uint32_t in, uint32_t out, size_t m, const float *x, size_t ldx,
                              const float *wt, const float *b, uint32_t q, uint32_t u, float *y,
                              size_t ldy);
void tr_gemv_exact_multi_avx512(uint32_t in, uint32_t out, size_t m, const float *x, size_t ldx,
                                const float *wt, const float *b, uint32_t q, uint32_t u, float *y,
                                size_t ldy);
/* The (q, u) with which tr_gemv_exact equals cblas_sgemm bit for bit on this layer, tried
 * against it; 1 when found, 0 (q = u = 0) when none. */
int tr_gemv_find_split(uint32_t in, uint32_t out, const float *w, const float *wt, const float *b,
                       uint32_t *q_out, uint32_t *u_out, uint32_t *hint_q, uint32_t *hint_u);

#endif
