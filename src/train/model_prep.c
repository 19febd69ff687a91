/* One example's layer as a vector-matrix product that gives OpenBLAS's bits without its cost.
 *
 * For one example (n = 1) cblas_sgemm packs the whole weight matrix into a scratch panel on
 * every call: a replica scoring one request paid 38 % of its CPU for that (perf, bench serve).
 * With n = 1 this OpenBLAS computes each output as y = b, then per block of K inputs
 * y += (a fused multiply-add chain over the block, from zero, in input order), the blocks cut
 * as its level-3 driver cuts them (a block of Q while 2Q or more remain, then the rest split in
 * two halves rounded up to a multiple of U). The kernel below does the same with the weights
 * transposed once per dense version, vectorised across outputs. Which Q and U a given OpenBLAS
 * uses (or whether it computes that way at all) is never assumed: tr_gemv_find_split tries
 * them against cblas_sgemm on the layer's real weights, and a layer with no exact match keeps
 * cblas_sgemm. */
#include "train/model_prep.h"

#include <cblas.h>
#include <stdatomic.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

bool tr_gemv_supported(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

/* Length of the next block of inputs from `left` remaining, as OpenBLAS's driver cuts K. */
static uint32_t block_len(uint32_t left, uint32_t q, uint32_t u)
{
    if (left >= 2 * q) return q;
    if (left > q) {
        /* Never past the end: with a U near Q (a pair the search tries, never OpenBLAS's)
         * half the rest rounded up can exceed it. */
        uint32_t half = ((left / 2 + u - 1) / u) * u;
        return half < left ? half : left;
    }
    return left;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define TR_TARGET __attribute__((target("avx2,fma")))
#else
#define TR_TARGET
#endif

/* y = b + x W^T for one example; wt is W transposed (in x out). Each output's chain over a
 * block is fused multiply-adds from zero in input order, as OpenBLAS's; the outputs are done
 * 64 at a time in eight registers (the chains of one block never leave them), then 8, then
 * one. The AVX2 kernel; tr_gemv_exact picks it when the CPU lacks AVX-512. */
#if defined(__x86_64__) && defined(__GNUC__)
TR_TARGET void tr_gemv_exact_avx2(uint32_t in, uint32_t out, const float *x, const float *wt,
                                  const float *b, uint32_t q, uint32_t u, float *y)
{
    memcpy(y, b, out * sizeof *y);
    for (uint32_t k0 = 0, len; k0 < in; k0 += len) {
        len = block_len(in - k0, q, u);
        const uint32_t k1 = k0 + len;
        uint32_t j = 0;
        for (; j + 64 <= out; j += 64) {
            __m256 a[8];
            for (int v = 0; v < 8; v++) a[v] = _mm256_setzero_ps();
            for (uint32_t k = k0; k < k1; k++) {
                const __m256 xk = _mm256_broadcast_ss(x + k);
                const float *w = wt + (size_t)k * out + j;
                for (int v = 0; v < 8; v++) a[v] = _mm256_fmadd_ps(xk, _mm256_loadu_ps(w + 8 * v), a[v]);
            }
            for (int v = 0; v < 8; v++)
                _mm256_storeu_ps(y + j + 8 * v, _mm256_add_ps(_mm256_loadu_ps(y + j + 8 * v), a[v]));
        }
        for (; j + 8 <= out; j += 8) {
            __m256 a = _mm256_setzero_ps();
            for (uint32_t k = k0; k < k1; k++)
                a = _mm256_fmadd_ps(_mm256_broadcast_ss(x + k),
                                    _mm256_loadu_ps(wt + (size_t)k * out + j), a);
            _mm256_storeu_ps(y + j, _mm256_add_ps(_mm256_loadu_ps(y + j), a));
        }
        for (; j < out; j++) {
            float a = 0.0f;
            for (uint32_t k = k0; k < k1; k++) a = __builtin_fmaf(x[k], wt[(size_t)k * out + j], a);
            y[j] += a;
        }
    }
}

#define TR_TARGET512 __attribute__((target("avx512f,fma")))
#ifndef TR_PREFETCH_ROWS
#define TR_PREFETCH_ROWS 8
#endif

/* NV registers of 16 outputs (the last one `tail` lanes wide, under a mask) over one block:
 * the same chains as the AVX2 kernel's, twice as wide, so half the instructions, and a row
 * of W^T is read whole (128 outputs: 512 contiguous bytes) rather than in two halves. The
 * masked lanes load zeros and are never stored. */
static inline __attribute__((always_inline)) TR_TARGET512 void
gemv512_group(int nv, uint32_t k0, uint32_t k1, uint32_t out, uint32_t j, __mmask16 tail,
              const float *x, const float *wt, float *y)
{
    __m512 a[8];
    for (int v = 0; v < nv; v++) a[v] = _mm512_setzero_ps();
    for (uint32_t k = k0; k < k1; k++) {
        const __m512 xk = _mm512_set1_ps(x[k]);
        const float *w = wt + (size_t)k * out + j;
        if (TR_PREFETCH_ROWS && k + TR_PREFETCH_ROWS < k1)
            for (int v = 0; v < nv; v++)
                _mm_prefetch((const char *)(w + (size_t)TR_PREFETCH_ROWS * out + 16 * v), _MM_HINT_T0);
        for (int v = 0; v < nv - 1; v++)
            a[v] = _mm512_fmadd_ps(xk, _mm512_loadu_ps(w + 16 * v), a[v]);
        a[nv - 1] = _mm512_fmadd_ps(xk, _mm512_maskz_loadu_ps(tail, w + 16 * (nv - 1)), a[nv - 1]);
    }
    for (int v = 0; v < nv - 1; v++)
        _mm512_storeu_ps(y + j + 16 * v, _mm512_add_ps(_mm512_loadu_ps(y + j + 16 * v), a[v]));
    float *yl = y + j + 16 * (nv - 1);
    _mm512_mask_storeu_ps(yl, tail, _mm512_add_ps(_mm512_maskz_loadu_ps(tail, yl), a[nv - 1]));
}

/* The AVX-512 kernel: outputs 128 at a time (eight registers), the rest in one group of up to
 * eight registers whose last is masked, so no output takes a scalar loop. */
TR_TARGET512 void tr_gemv_exact_avx512(uint32_t in, uint32_t out, const float *x, const float *wt,
                                       const float *b, uint32_t q, uint32_t u, float *y)
{
    memcpy(y, b, out * sizeof *y);
    for (uint32_t k0 = 0, len; k0 < in; k0 += len) {
        len = block_len(in - k0, q, u);
        const uint32_t k1 = k0 + len;
        uint32_t j = 0;
        for (; j + 128 <= out; j += 128) gemv512_group(8, k0, k1, out, j, 0xffff, x, wt, y);
        if (j == out) continue;
        const uint32_t left = out - j, nv = (left + 15) / 16, lanes = left - 16 * (nv - 1);
        const __mmask16 tail = (__mmask16)((1u << lanes) - 1u);
        switch (nv) {
#define TR_GROUP(n)                                                                                    case n: gemv512_group(n, k0, k1, out, j, tail, x, wt, y); break;
            TR_GROUP(1) TR_GROUP(2) TR_GROUP(3) TR_GROUP(4)
            TR_GROUP(5) TR_GROUP(6) TR_GROUP(7) TR_GROUP(8)
#undef TR_GROUP
        }
    }
}

/* NE examples at once, each row's bits those of gemv512_group on that row alone: the same
 * chain per (example, output) -- from zero over the block in input order, then added to y --
 * but each weight vector loaded once for the NE examples. NV registers of 16 outputs (the last
 * masked) per example: NE x NV <= 16 accumulators, the NV weight vectors and a broadcast in
 * the 32 registers. */
static inline __attribute__((always_inline)) TR_TARGET512 void
gemv512_multi_group(int ne, int nv, uint32_t k0, uint32_t k1, uint32_t out, uint32_t j,
                    __mmask16 tail, const float *x, size_t ldx, const float *wt, float *y,
                    size_t ldy)
{
    __m512 a[4][8];
    for (int e = 0; e < ne; e++)
        for (int v = 0; v < nv; v++) a[e][v] = _mm512_setzero_ps();
    for (uint32_t k = k0; k < k1; k++) {
        const float *w = wt + (size_t)k * out + j;
        if (TR_PREFETCH_ROWS && k + TR_PREFETCH_ROWS < k1)
            for (int v = 0; v < nv; v++)
                _mm_prefetch((const char *)(w + (size_t)TR_PREFETCH_ROWS * out + 16 * v), _MM_HINT_T0);
        __m512 wv[8];
        for (int v = 0; v < nv - 1; v++) wv[v] = _mm512_loadu_ps(w + 16 * v);
        wv[nv - 1] = _mm512_maskz_loadu_ps(tail, w + 16 * (nv - 1));
        for (int e = 0; e < ne; e++) {
            const __m512 xk = _mm512_set1_ps(x[(size_t)e * ldx + k]);
            for (int v = 0; v < nv; v++) a[e][v] = _mm512_fmadd_ps(xk, wv[v], a[e][v]);
        }
    }
    for (int e = 0; e < ne; e++) {
        float *ye = y + (size_t)e * ldy + j;
        for (int v = 0; v < nv - 1; v++)
            _mm512_storeu_ps(ye + 16 * v, _mm512_add_ps(_mm512_loadu_ps(ye + 16 * v), a[e][v]));
        float *yl = ye + 16 * (nv - 1);
        _mm512_mask_storeu_ps(yl, tail, _mm512_add_ps(_mm512_maskz_loadu_ps(tail, yl), a[e][nv - 1]));
    }
}

/* Up to four examples (rows of x, ldx apart) through one layer: per K block, the outputs 128 at
 * a time for one or two examples (a row of W^T read whole, 16 accumulators), 64 for three or
 * four, the last group masked. */
static inline __attribute__((always_inline)) TR_TARGET512 void
gemv512_multi_rows(int ne, uint32_t in, uint32_t out, const float *x, size_t ldx, const float *wt,
                   const float *b, uint32_t q, uint32_t u, float *y, size_t ldy)
{
    for (int e = 0; e < ne; e++) memcpy(y + (size_t)e * ldy, b, out * sizeof *y);
    const uint32_t full = ne <= 2 ? 8 : 4, left = out % (16 * full), nv = (left + 15) / 16;
    const uint32_t lanes = left - 16 * (nv ? nv - 1 : 0);
    const __mmask16 tail = (__mmask16)((1u << lanes) - 1u);
    for (uint32_t k0 = 0, len; k0 < in; k0 += len) {
        len = block_len(in - k0, q, u);
        const uint32_t k1 = k0 + len;
        uint32_t j = 0;
        for (; j + 16 * full <= out; j += 16 * full)
            gemv512_multi_group(ne, (int)full, k0, k1, out, j, 0xffff, x, ldx, wt, y, ldy);
        switch (nv) {
#define TR_GROUP(n) \
    case n: if (n <= full) gemv512_multi_group(ne, n, k0, k1, out, j, tail, x, ldx, wt, y, ldy); break;
            TR_GROUP(1) TR_GROUP(2) TR_GROUP(3) TR_GROUP(4)
            TR_GROUP(5) TR_GROUP(6) TR_GROUP(7) TR_GROUP(8)
#undef TR_GROUP
        }
    }
}

/* The AVX-512 kernel for m examples: four at a time, then the two or three left together; a
 * last single example takes the one-example kernel (its 128-output groups read a row of W^T
 * whole: 16 % less CPU than 64-output groups for one example). */
TR_TARGET512 void tr_gemv_exact_multi_avx512(uint32_t in, uint32_t out, size_t m, const float *x,
                                             size_t ldx, const float *wt, const float *b, uint32_t q,
                                             uint32_t u, float *y, size_t ldy)
{
    size_t i = 0;
    for (; i + 4 <= m; i += 4) gemv512_multi_rows(4, in, out, x + i * ldx, ldx, wt, b, q, u, y + i * ldy, ldy);
    switch (m - i) {
    case 1: tr_gemv_exact_avx512(in, out, x + i * ldx, wt, b, q, u, y + i * ldy); break;
    case 2: gemv512_multi_rows(2, in, out, x + i * ldx, ldx, wt, b, q, u, y + i * ldy, ldy); break;
    case 3: gemv512_multi_rows(3, in, out, x + i * ldx, ldx, wt, b, q, u, y + i * ldy, ldy); break;
    }
}

bool tr_gemv_avx512_supported(void)
{
    return tr_gemv_supported() && __builtin_cpu_supports("avx512f");
}

/* Without AVX-512: the one-example kernel per row (the same bits by construction). */
void tr_gemv_exact_multi_avx2(uint32_t in, uint32_t out, size_t m, const float *x, size_t ldx,
                              const float *wt, const float *b, uint32_t q, uint32_t u, float *y,
                              size_t ldy)
{
    for (size_t i = 0; i < m; i++) tr_gemv_exact_avx2(in, out, x + i * ldx, wt, b, q, u, y + i * ldy);
}

/* The kernel for this CPU, looked up once (the check is a few loads; the request is ~1 us). */
void tr_gemv_exact(uint32_t in, uint32_t out, const float *x, const float *wt, const float *b,
                   uint32_t q, uint32_t u, float *y)
{
    static _Atomic int wide = -1; /* -1: not looked up yet */
    int w = atomic_load_explicit(&wide, memory_order_relaxed);
    if (w < 0) atomic_store_explicit(&wide, w = tr_gemv_avx512_supported(), memory_order_relaxed);
    if (w) tr_gemv_exact_avx512(in, out, x, wt, b, q, u, y);
    else tr_gemv_exact_avx2(in, out, x, wt, b, q, u, y);
}

void tr_gemv_exact_multi(uint32_t in, uint32_t out, size_t m, const float *x, size_t ldx,
                         const float *wt, const float *b, uint32_t q, uint32_t u, float *y,
                         size_t ldy)
{
    if (tr_gemv_avx512_supported()) tr_gemv_exact_multi_avx512(in, out, m, x, ldx, wt, b, q, u, y, ldy);
    else tr_gemv_exact_multi_avx2(in, out, m, x, ldx, wt, b, q, u, y, ldy);
}
#else
void tr_gemv_exact(uint32_t in, uint32_t out, const float *x, const float *wt, const float *b,
                   uint32_t q, uint32_t u, float *y)
{
    (void)in, (void)out, (void)x, (void)wt, (void)b, (void)q, (void)u, (void)y;
}
void tr_gemv_exact_avx2(uint32_t in, uint32_t out, const float *x, const float *wt, const float *b,
                        uint32_t q, uint32_t u, float *y)
{
    tr_gemv_exact(in, out, x, wt, b, q, u, y);
}
void tr_gemv_exact_avx512(uint32_t in, uint32_t out, const float *x, const float *wt,
                          const float *b, uint32_t q, uint32_t u, float *y)
{
    tr_gemv_exact(in, out, x, wt, b, q, u, y);
}
bool tr_gemv_avx512_supported(void) { return false; }
void tr_gemv_exact_multi(uint32_t in, uint32_t out, size_t m, const float *x, size_t ldx,
                         const float *wt, const float *b, uint32_t q, uint32_t u, float *y,
                         size_t ldy)
{
    for (size_t i = 0; i < m; i++) tr_gemv_exact(in, out, x + i * ldx, wt, b, q, u, y + i * ldy);
}
void tr_gemv_exact_multi_avx2(uint32_t in, uint32_t out, size_t m, const float *x, size_t ldx,
                              const float *wt, const float *b, uint32_t q, uint32_t u, float *y,
                              size_t ldy)
{
    tr_gemv_exact_multi(in, out, m, x, ldx, wt, b, q, u, y, ldy);
}
void tr_gemv_exact_multi_avx512(uint32_t in, uint32_t out, size_t m, const float *x, size_t ldx,
                                const float *wt, const float *b, uint32_t q, uint32_t u, float *y,
                                size_t ldy)
{
    tr_gemv_exact_multi(in, out, m, x, ldx, wt, b, q, u, y, ldy);
}
#endif

/* Finds the (Q, U) that makes tr_gemv_exact equal cblas_sgemm bit for bit on this layer's
 * weights for a few inputs of mixed signs and scales; 0 when none does (or the CPU lacks
 * FMA). hint_q, hint_u: the pair to try first, updated on success (it is the same for every
 * layer of one OpenBLAS). */
int tr_gemv_find_split(uint32_t in, uint32_t out, const float *w, const float *wt, const float *b,
                       uint32_t *q_out, uint32_t *u_out, uint32_t *hint_q, uint32_t *hint_u)
{
    *q_out = *u_out = 0;
    if (!tr_gemv_supported() || in == 0 || out == 0) return 0;
    enum { TRIES = 3 };
    float *x = malloc((size_t)TRIES * in * sizeof *x), *want = malloc((size_t)TRIES * out * sizeof *want);
    float *got = malloc(out * sizeof *got);
    int found = 0;
    if (!x || !want || !got) goto done;
    gr_rng r;
    gr_rng_seed(&r, 0x5eedu + in * 31u + out);
    for (size_t i = 0; i < (size_t)TRIES * in; i++) {
        float v = (float)(gr_rng_uniform(&r) * 2.0 - 1.0) * (float)(1u << (i % 7));
        x[i] = i % 5 == 4 ? 0.0f : v; /* ReLU outputs have zeros */
    }
    for (int t = 0; t < TRIES; t++) {
        memcpy(want + (size_t)t * out, b, out * sizeof *want);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, (int)out, (int)in, 1.0f,
                    x + (size_t)t * in, (int)in, w, (int)in, 1.0f, want + (size_t)t * out, (int)out);
    }
    /* The hint first, then every Q in steps of 16 up to 1024 with U a power of two to 32
     * (about 1 ms for the default DLRM's widest layer), but only until one search has come
     * back empty: this OpenBLAS then computes otherwise, and every dense version a replica
     * receives would pay for the search again. */
    static atomic_bool searched_in_vain;
    int last = atomic_load(&searched_in_vain) ? 0 : 64 * 6;
    for (int c = -1; c < last && !found; c++) {
        uint32_t q = c < 0 ? *hint_q : 16 + 16 * (uint32_t)(c / 6), u = c < 0 ? *hint_u : 1u << (c % 6);
        if (!q || !u) continue;
        found = 1;
        for (int t = 0; t < TRIES && found; t++) {
            tr_gemv_exact(in, out, x + (size_t)t * in, wt, b, q, u, got);
            found = !memcmp(got, want + (size_t)t * out, out * sizeof *got);
        }
        if (found) *q_out = q, *u_out = u;
    }
    if (found) *hint_q = *q_out, *hint_u = *u_out;
    else if (last) atomic_store(&searched_in_vain, true);
done:
    free(x), free(want), free(got);
    return found;
}
