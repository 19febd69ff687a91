/* The matrix products of a DLRM training step. OpenBLAS spends a good part of a step packing
 * and blocking for shapes far larger than a DLRM's (at most a few hundred by 128, summed over
 * 1024 examples), and the build Debian ships picks its AVX2 kernels on CPUs it does not know,
 * AMD Zen 4 and 5 among them. These kernels keep one panel of B (k rows x 32 columns, zero
 * padded) in cache and update a 4 x 32 tile of C per pass over k, the A values broadcast;
 * they are compiled three times (AVX-512, AVX2, baseline x86-64 or any other CPU) and picked
 * once by what the CPU reports. Every copy multiplies and adds without fusing them and sums in
 * the same order, so the bits of a step do not depend on the CPU or the copy; on Zen 5 a
 * separate multiply and add run at the same rate as a fused one (two 512-bit pipes each). */
#include "train/gemm.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

typedef float gemm_vec __attribute__((vector_size(16 * sizeof(float))));
#define MR 4 /* rows of C per tile */
#define MB 32 /* rows of C per block: its rows of A (MB x TR_GEMM_KC) stay in L1 over the panels */

/* One tile: C rows p < mr (at c, stride ldc), the panel's first nc columns, += (or, when
 * first, = init +) the sum over s < kc of A(p, s) * panel row s, A(p, s) at
 * a[p * a_rs + s * a_cs]. Continuing from C's stored value keeps the order of the sum. */
static inline __attribute__((always_inline)) void
gemm_tile(size_t mr, size_t kc, const float *restrict a, size_t a_rs, size_t a_cs,
          const float *restrict panel, const float *restrict init, bool first,
          float *restrict c, size_t ldc, size_t nc)
{
    gemm_vec acc[MR][2];
    for (size_t p = 0; p < mr; p++) {
        float start[TR_GEMM_NR] = {0};
        const float *from = init;
        if (!first) {
            memcpy(start, c + p * ldc, nc * sizeof *start);
            from = start;
        }
        memcpy(&acc[p][0], from, sizeof acc[p][0]);
        memcpy(&acc[p][1], from + 16, sizeof acc[p][1]);
    }
    for (size_t s = 0; s < kc; s++) {
        gemm_vec b0, b1;
        memcpy(&b0, panel + s * TR_GEMM_NR, sizeof b0);
        memcpy(&b1, panel + s * TR_GEMM_NR + 16, sizeof b1);
        const float *as = a + s * a_cs;
        for (size_t p = 0; p < mr; p++) {
            const float x = as[p * a_rs];
            acc[p][0] = acc[p][0] + x * b0;
            acc[p][1] = acc[p][1] + x * b1;
        }
    }
    for (size_t p = 0; p < mr; p++) {
        if (nc == TR_GEMM_NR) {
            memcpy(c + p * ldc, &acc[p][0], sizeof acc[p][0]);
            memcpy(c + p * ldc + 16, &acc[p][1], sizeof acc[p][1]);
        } else {
            float out[TR_GEMM_NR];
            memcpy(out, &acc[p][0], sizeof acc[p][0]);
            memcpy(out + 16, &acc[p][1], sizeof acc[p][1]);
            memcpy(c + p * ldc, out, nc * sizeof *out);
        }
    }
}

/* Rows i0 .. i0 + mb of C against one panel. mr is a constant in each call so the tile's
 * accumulators stay in registers. */
static inline __attribute__((always_inline)) void
gemm_rows(size_t mb, size_t kc, const float *a, size_t a_rs, size_t a_cs, const float *panel,
          const float *init, bool first, float *c, size_t ldc, size_t nc)
{
    size_t i = 0;
    for (; i + MR <= mb; i += MR)
        gemm_tile(MR, kc, a + i * a_rs, a_rs, a_cs, panel, init, first, c + i * ldc, ldc, nc);
    const float *ai = a + i * a_rs;
    float *ci = c + i * ldc;
    switch (mb - i) {
    case 3: gemm_tile(3, kc, ai, a_rs, a_cs, panel, init, first, ci, ldc, nc); break;
    case 2: gemm_tile(2, kc, ai, a_rs, a_cs, panel, init, first, ci, ldc, nc); break;
    case 1: gemm_tile(1, kc, ai, a_rs, a_cs, panel, init, first, ci, ldc, nc); break;
    default: break;
    }
}

/* Rows k0 .. k0 + kc of the k x n matrix b as ceil(n / 32) panels of kc x 32, zero padded. */
static inline __attribute__((always_inline)) void
pack_chunk(size_t kc, size_t n, const float *b, size_t ldb, float *scratch)
{
    for (size_t j0 = 0, q = 0; j0 < n; j0 += TR_GEMM_NR, q++) {
        const size_t nc = n - j0 < TR_GEMM_NR ? n - j0 : TR_GEMM_NR;
        float *panel = scratch + q * kc * TR_GEMM_NR;
        for (size_t s = 0; s < kc; s++) {
            const float *src = b + s * ldb + j0;
            float *row = panel + s * TR_GEMM_NR;
            if (nc == TR_GEMM_NR) {
                gemm_vec v0, v1;
                memcpy(&v0, src, sizeof v0);
                memcpy(&v1, src + 16, sizeof v1);
                memcpy(row, &v0, sizeof v0);
                memcpy(row + 16, &v1, sizeof v1);
            } else {
                for (size_t j = 0; j < TR_GEMM_NR; j++) row[j] = j < nc ? src[j] : 0.0f;
            }
        }
    }
}

/* The whole product: A(p, s) at a[p * a_rs + s * a_cs], B k x n at b (ldb). k is cut into
 * chunks of TR_GEMM_KC (B's chunk packed once, then used by every block of rows); C carries
 * the partial sums from one chunk to the next. */
static inline __attribute__((always_inline)) void
gemm_body(size_t m, size_t n, size_t k, const float *a, size_t a_rs, size_t a_cs,
          const float *b, size_t ldb, const float *bias, float *c, size_t ldc, float *scratch)
{
    if (k == 0) { /* C is the bias (or zero) */
        for (size_t i = 0; i < m; i++)
            for (size_t j = 0; j < n; j++) c[i * ldc + j] = bias ? bias[j] : 0.0f;
        return;
    }
    for (size_t k0 = 0; k0 < k; k0 += TR_GEMM_KC) {
        const size_t kc = k - k0 < TR_GEMM_KC ? k - k0 : TR_GEMM_KC;
        const bool first = k0 == 0;
        pack_chunk(kc, n, b + k0 * ldb, ldb, scratch);
        for (size_t i0 = 0; i0 < m; i0 += MB) {
            const size_t mb = m - i0 < MB ? m - i0 : MB;
            for (size_t j0 = 0, q = 0; j0 < n; j0 += TR_GEMM_NR, q++) {
                const size_t nc = n - j0 < TR_GEMM_NR ? n - j0 : TR_GEMM_NR;
                float init[TR_GEMM_NR] = {0};
                if (bias && first) memcpy(init, bias + j0, nc * sizeof *init);
                gemm_rows(mb, kc, a + i0 * a_rs + k0 * a_cs, a_rs, a_cs,
                          scratch + q * kc * TR_GEMM_NR, init, first, c + i0 * ldc + j0, ldc,
                          nc);
            }
        }
    }
}

typedef void gemm_fn(size_t m, size_t n, size_t k, const float *a, size_t a_rs, size_t a_cs,
                     const float *b, size_t ldb, const float *bias, float *c, size_t ldc,
                     float *scratch);

#define GEMM_COPY(name, attr)                                                                  \
    attr static void name(size_t m, size_t n, size_t k, const float *a, size_t a_rs,          \
                          size_t a_cs, const float *b, size_t ldb, const float *bias, float *c, \
                          size_t ldc, float *scratch)                                          \
    {                                                                                          \
        gemm_body(m, n, k, a, a_rs, a_cs, b, ldb, bias, c, ldc, scratch);                      \
    }

GEMM_COPY(gemm_generic, )
#if defined(__x86_64__) && defined(__GNUC__)
/* Chosen by a check at the first call rather than target_clones: its ifunc resolver runs before
 * the sanitizers' runtimes are up. */
GEMM_COPY(gemm_avx2, __attribute__((target("avx2"))))
GEMM_COPY(gemm_avx512, __attribute__((target("avx512f"))))
#endif

static gemm_fn *gemm_pick(void)
{
    static _Atomic(gemm_fn *) picked;
    gemm_fn *f = atomic_load_explicit(&picked, memory_order_relaxed);
    if (f) return f;
    f = gemm_generic;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        f = gemm_avx512;
    else if (__builtin_cpu_supports("avx2"))
        f = gemm_avx2;
#endif
    atomic_store_explicit(&picked, f, memory_order_relaxed);
    return f;
}

void tr_gemm_nn(size_t m, size_t n, size_t k, const float *a, size_t lda, const float *b,
                size_t ldb, const float *bias, float *c, size_t ldc, float *scratch)
{
    gemm_pick()(m, n, k, a, lda, 1, b, ldb, bias, c, ldc, scratch);
}

void tr_gemm_tn(size_t m, size_t n, size_t r, const float *a, size_t lda, const float *b,
                size_t ldb, float *c, size_t ldc, float *scratch)
{
    /* C(o, j) = sum over rows s of A(s, o) B(s, j): A^T's row o, column s is a[o + s * lda]. */
    gemm_pick()(m, n, r, a, 1, lda, b, ldb, NULL, c, ldc, scratch);
}

const char *tr_gemm_isa(void)
{
    gemm_fn *f = gemm_pick();
#if defined(__x86_64__) && defined(__GNUC__)
    if (f == gemm_avx512) return "avx512";
    if (f == gemm_avx2) return "avx2";
#endif
    return f == gemm_generic ? "generic" : "?";
}
