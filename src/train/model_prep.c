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
 * one. Only called when tr_gemv_supported(). */
#if defined(__x86_64__) && defined(__GNUC__)
TR_TARGET void tr_gemv_exact(uint32_t in, uint32_t out, const float *x, const float *wt,
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
#else
void tr_gemv_exact(uint32_t in, uint32_t out, const float *x, const float *wt, const float *b,
                   uint32_t q, uint32_t u, float *y)
{
    (void)in, (void)out, (void)x, (void)wt, (void)b, (void)q, (void)u, (void)y;
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
