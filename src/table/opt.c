/* Row kernels of the table: initializers (deterministic per table seed and key), the five
 * optimizers (one step on one row), half-float conversion and the spinlock's slow path.
 * Kept apart from the index code so the arithmetic can be read against the formulas. */
#include "table/table_internal.h"

#include <float.h>
#include <math.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GR_OPT_WIDE 1 /* AVX-512 / AVX kernels, chosen at run time */
#endif

bool gr_have_prefetchw = false;
#if GR_OPT_WIDE
/* The build targets baseline x86-64 (SSE2); the Adagrad step and the finite check, which a
 * push runs on every row, use wider vectors when the CPU has them. Measured on the shards of
 * `granary bench ps` (docs/server.md, "Where a batch's time goes"). */
static int opt_width = 4;
static bool have_avx512dq = false; /* the vector uniform initializer's 64-bit multiplies */
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
/* PREFETCHW is CPUID 0x80000001 ECX bit 8 (3DNowPrefetch); set once before main runs. */
__attribute__((constructor)) static void detect_prefetchw(void)
{
    unsigned a, b, c, d;
    if (__get_cpuid(0x80000001u, &a, &b, &c, &d)) gr_have_prefetchw = (c >> 8) & 1u;
    __builtin_cpu_init();
    opt_width = __builtin_cpu_supports("avx512f") ? 16 : __builtin_cpu_supports("avx") ? 8 : 4;
    have_avx512dq = opt_width == 16 && __builtin_cpu_supports("avx512dq");
}
#endif

void gr_spin_lock_slow(gr_spin *l)
{
    /* About 3.6 us of pause on Zen 5 (28 ns each): a row's step or a lookup is far shorter. */
    for (unsigned spins = 0; spins < 128; spins++) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        unsigned free = 0;
        if (atomic_load_explicit(&l->v, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_weak_explicit(&l->v, &free, 1, memory_order_acquire,
                                                  memory_order_relaxed))
            return;
    }
    /* Held with the sleeper mark (2) from here on: whoever takes it this way may leave a
     * sleeper behind, so it unlocks with a wake, which costs one futex call at most. */
    while (atomic_exchange_explicit(&l->v, 2, memory_order_acquire) != 0)
        syscall(SYS_futex, &l->v, FUTEX_WAIT_PRIVATE, 2u, NULL, NULL, 0);
}

void gr_spin_wake(gr_spin *l)
{
    syscall(SYS_futex, &l->v, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* ---- initializers ---- */

#define U01_STEP 0x9e3779b97f4a7c15ull /* splitmix64's increment */

static inline double u01(uint64_t *st)
{
    uint64_t z = (*st += U01_STEP);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

#if GR_OPT_WIDE
/* The uniform initializer on elements [0, dim - dim % 8): element i draws from the splitmix64
 * state st + (i + 1) * U01_STEP (the stream only ever adds that constant), so eight elements
 * are drawn at once. The same integer steps, the same exact conversion of the top 53 bits,
 * then the same double multiply, add and rounding to float as u01 and the scalar loop (no FMA:
 * intrinsics are never contracted), so the values are bit for bit the scalar ones
 * (test_table_init.c checks them against a scalar reference). Returns how many elements it
 * did; the caller's stream then continues at st + done * U01_STEP. */
__attribute__((target("avx512f,avx512dq"))) static uint32_t
uniform8(uint64_t st, double low, double span, float high, float below, uint32_t dim, float *w)
{
    const __m512i lanes = _mm512_set_epi64(8, 7, 6, 5, 4, 3, 2, 1);
    const __m512i step = _mm512_set1_epi64((long long)U01_STEP);
    const __m512i m1 = _mm512_set1_epi64((long long)0xbf58476d1ce4e5b9ull);
    const __m512i m2 = _mm512_set1_epi64((long long)0x94d049bb133111ebull);
    const __m512d vlow = _mm512_set1_pd(low), vspan = _mm512_set1_pd(span);
    const __m512d scale = _mm512_set1_pd(0x1.0p-53);
    const __m256 vhigh = _mm256_set1_ps(high), vbelow = _mm256_set1_ps(below);
    __m512i s = _mm512_add_epi64(_mm512_set1_epi64((long long)st), _mm512_mullo_epi64(lanes, step));
    const __m512i step8 = _mm512_set1_epi64((long long)(U01_STEP * 8u));
    uint32_t i = 0;
    for (; i + 8 <= dim; i += 8) {
        __m512i z = s;
        z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), m1);
        z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), m2);
        z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
        const __m512d u = _mm512_mul_pd(_mm512_cvtepu64_pd(_mm512_srli_epi64(z, 11)), scale);
        const __m256 v = _mm512_cvtpd_ps(_mm512_add_pd(vlow, _mm512_mul_pd(vspan, u)));
        _mm256_storeu_ps(w + i, _mm256_blendv_ps(v, vbelow, _mm256_cmp_ps(v, vhigh, _CMP_GE_OQ)));
        s = _mm512_add_epi64(s, step8);
    }
    return i;
}
#endif

void gr_table_init_row(const gr_table *t, uint64_t key, float *w)
{
    const gr_init_spec *in = &t->spec.init;
    uint32_t dim = t->dim;
    switch (in->kind) {
    case GR_INIT_ZEROS: memset(w, 0, dim * sizeof *w); return;
    case GR_INIT_CONSTANT:
        for (uint32_t i = 0; i < dim; i++) w[i] = in->value;
        return;
    case GR_INIT_UNIFORM:
    case GR_INIT_TRUNC_NORMAL: break;
    }
    /* The same key gets the same first row on any shard and after any restart: a local
     * splitmix64 stream seeded from (key, table seed), inlined because row creation is on the
     * lookup path. */
    uint64_t st = gr_hash_key(key, t->spec.seed);
    if (in->kind == GR_INIT_UNIFORM) {
        double span = (double)in->high - (double)in->low;
        uint32_t i = 0;
#if GR_OPT_WIDE
        if (have_avx512dq && dim >= 8) {
            i = uniform8(st, (double)in->low, span, in->high, nextafterf(in->high, in->low), dim, w);
            st += (uint64_t)i * U01_STEP;
        }
#endif
        for (; i < dim; i++) {
            float v = (float)((double)in->low + span * u01(&st));
            if (v >= in->high) v = nextafterf(in->high, in->low);
            w[i] = v;
        }
    } else {
        /* Box-Muller pairs; values outside mean +- 2 stddev are redrawn. */
        uint32_t i = 0;
        while (i < dim) {
            double u1 = u01(&st), u2 = u01(&st);
            if (u1 < 1e-300) u1 = 1e-300;
            double r = sqrt(-2.0 * log(u1)), a = 6.283185307179586 * u2;
            double z[2] = {r * cos(a), r * sin(a)};
            for (int k = 0; k < 2 && i < dim; k++)
                if (z[k] >= -2.0 && z[k] <= 2.0)
                    w[i++] = (float)((double)in->mean + (double)in->stddev * z[k]);
        }
    }
}

void gr_table_init_state(const gr_table *t, float *state)
{
    uint32_t n = t->state_floats;
    float a0 = t->spec.opt.initial_accumulator;
    switch (t->spec.opt.kind) {
    case GR_OPT_ADAGRAD:
    case GR_OPT_ROWWISE_ADAGRAD:
        for (uint32_t i = 0; i < n; i++) state[i] = a0;
        break;
    default: memset(state, 0, n * sizeof *state); break;
    }
}

/* ---- optimizers: one step on one row ---- */

static void step_sgd(const gr_opt_spec *o, uint32_t dim, float *restrict w,
                     const float *restrict g)
{
    const float lr = o->lr;
    for (uint32_t i = 0; i < dim; i++) w[i] -= lr * g[i];
}

#if GR_OPT_WIDE
/* Adagrad on elements [0, n - n % 16) / [0, n - n % 8): the same operations in the same order
 * as the SSE and scalar loops below (add, mul, div and sqrt are correctly rounded at any
 * width, and intrinsics are never contracted into FMAs), so the results are bit for bit those
 * of the narrow loops; returns how many elements it did. */
__attribute__((target("avx512f"))) static uint32_t adagrad16(float lr, float eps, uint32_t n,
                                                             float *restrict w, float *restrict a,
                                                             const float *restrict g)
{
    const __m512 vlr = _mm512_set1_ps(lr), veps = _mm512_set1_ps(eps);
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gi = _mm512_loadu_ps(g + i);
        __m512 ai = _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_mul_ps(gi, gi));
        _mm512_storeu_ps(a + i, ai);
        __m512 d = _mm512_div_ps(_mm512_mul_ps(vlr, gi), _mm512_add_ps(_mm512_sqrt_ps(ai), veps));
        _mm512_storeu_ps(w + i, _mm512_sub_ps(_mm512_loadu_ps(w + i), d));
    }
    return i;
}

__attribute__((target("avx"))) static uint32_t adagrad8(float lr, float eps, uint32_t n,
                                                        float *restrict w, float *restrict a,
                                                        const float *restrict g)
{
    const __m256 vlr = _mm256_set1_ps(lr), veps = _mm256_set1_ps(eps);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gi = _mm256_loadu_ps(g + i);
        __m256 ai = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_mul_ps(gi, gi));
        _mm256_storeu_ps(a + i, ai);
        __m256 d = _mm256_div_ps(_mm256_mul_ps(vlr, gi), _mm256_add_ps(_mm256_sqrt_ps(ai), veps));
        _mm256_storeu_ps(w + i, _mm256_sub_ps(_mm256_loadu_ps(w + i), d));
    }
    return i;
}
#endif

static void step_adagrad(const gr_opt_spec *o, uint32_t dim, float *restrict w,
                         float *restrict a, const float *restrict g)
{
    const float lr = o->lr, eps = o->eps;
    uint32_t i = 0;
#if GR_OPT_WIDE
    if (opt_width == 16) i = adagrad16(lr, eps, dim, w, a, g);
    else if (opt_width == 8) i = adagrad8(lr, eps, dim, w, a, g);
#endif
#if defined(__SSE2__)
    /* The compiler will not vectorize sqrtf without -fno-math-errno; SSE's add, mul, div and
     * sqrt are IEEE correctly rounded, so this gives the scalar loop's results bit for bit. */
    const __m128 vlr = _mm_set1_ps(lr), veps = _mm_set1_ps(eps);
    for (; i + 4 <= dim; i += 4) {
        __m128 gi = _mm_loadu_ps(g + i);
        __m128 ai = _mm_add_ps(_mm_loadu_ps(a + i), _mm_mul_ps(gi, gi));
        _mm_storeu_ps(a + i, ai);
        __m128 d = _mm_div_ps(_mm_mul_ps(vlr, gi), _mm_add_ps(_mm_sqrt_ps(ai), veps));
        _mm_storeu_ps(w + i, _mm_sub_ps(_mm_loadu_ps(w + i), d));
    }
#endif
    for (; i < dim; i++) {
        float gi = g[i];
        float ai = a[i] + gi * gi;
        a[i] = ai;
        w[i] -= lr * gi / (sqrtf(ai) + eps);
    }
}

static void step_rowwise(const gr_opt_spec *o, uint32_t dim, float *restrict w,
                         float *restrict a, const float *restrict g)
{
    float sum = 0.0f;
    for (uint32_t i = 0; i < dim; i++) sum += g[i] * g[i];
    float acc = a[0] + sum / (float)dim;
    a[0] = acc;
    const float r = o->lr / (sqrtf(acc) + o->eps);
    for (uint32_t i = 0; i < dim; i++) w[i] -= r * g[i];
}

static void step_adam(const gr_opt_spec *o, uint32_t dim, float *restrict w,
                      float *restrict st, const float *restrict g)
{
    float *restrict m = st, *restrict v = st + dim;
    float t = st[2 * dim];
    /* The step count is a float: exact up to 2^24 steps per row; past that the bias
     * corrections are 1 to float precision anyway, so it simply stops counting. */
    if (t < 16777216.0f) t += 1.0f;
    st[2 * dim] = t;
    const float b1 = o->beta1, b2 = o->beta2, lr = o->lr, eps = o->eps;
    const float bc1 = 1.0f - powf(b1, t), bc2 = 1.0f - powf(b2, t);
    const float c1 = 1.0f - b1, c2 = 1.0f - b2;
    for (uint32_t i = 0; i < dim; i++) {
        float gi = g[i];
        float mi = b1 * m[i] + c1 * gi;
        float vi = b2 * v[i] + c2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        w[i] -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
}

static void step_ftrl(const gr_opt_spec *o, uint32_t dim, float *restrict w,
                      float *restrict st, const float *restrict g)
{
    float *restrict z = st, *restrict n = st + dim;
    const float alpha = o->lr, l1 = o->l1, l2 = o->l2, beta = o->beta;
    for (uint32_t i = 0; i < dim; i++) {
        float gi = g[i], ni = n[i];
        float nn = ni + gi * gi;
        float sigma = (sqrtf(nn) - sqrtf(ni)) / alpha;
        float zi = z[i] + (gi - sigma * w[i]);
        z[i] = zi;
        n[i] = nn;
        if (fabsf(zi) <= l1) {
            w[i] = 0.0f;
        } else {
            float sgn = zi < 0.0f ? -1.0f : 1.0f;
            w[i] = -(zi - sgn * l1) / ((beta + sqrtf(nn)) / alpha + l2);
        }
    }
}

void gr_table_opt_step(const gr_table_spec *spec, uint32_t dim, float *w, float *state,
                       const float *g)
{
    const gr_opt_spec *o = &spec->opt;
    switch (o->kind) {
    case GR_OPT_SGD: step_sgd(o, dim, w, g); break;
    case GR_OPT_ADAGRAD: step_adagrad(o, dim, w, state, g); break;
    case GR_OPT_ROWWISE_ADAGRAD: step_rowwise(o, dim, w, state, g); break;
    case GR_OPT_ADAM: step_adam(o, dim, w, state, g); break;
    case GR_OPT_FTRL: step_ftrl(o, dim, w, state, g); break;
    }
}

/* ---- the finite policy ---- */

#if GR_OPT_WIDE
/* Every |v[i]| < lim for i < n - n % 16 (a NaN compares false: ordered, non-signalling);
 * *done says how far it looked. */
__attribute__((target("avx512f"))) static bool below16(const float *v, uint32_t n, float lim,
                                                      uint32_t *done)
{
    const __m512 vl = _mm512_set1_ps(lim);
    __mmask16 ok = 0xffff;
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16)
        ok &= _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(v + i)), vl, _CMP_LT_OQ);
    *done = i;
    return ok == 0xffff;
}
#endif

bool gr_row_finite(const float *w, uint32_t dim, const float *state, uint32_t nstate,
                   float wlimit)
{
    /* Branch-free so the loops vectorize: a NaN fails every comparison and so counts as bad.
     * The state test |s| <= FLT_MAX is |s| < inf. */
    uint32_t ok = 1, i = 0, j = 0;
#if GR_OPT_WIDE
    if (opt_width == 16 && !(below16(w, dim, wlimit, &i) && below16(state, nstate, INFINITY, &j)))
        return false;
#endif
    for (; i < dim; i++) ok &= (uint32_t)(fabsf(w[i]) < wlimit);
    for (; j < nstate; j++) ok &= (uint32_t)(fabsf(state[j]) <= FLT_MAX);
    return ok != 0;
}

static inline float clip_one(float v, float old, float max)
{
    if (isnan(v)) return old;
    return v > max ? max : v < -max ? -max : v;
}

void gr_row_clip(float *w, const float *w_old, uint32_t dim, float *state,
                 const float *state_old, uint32_t nstate, float wmax)
{
    for (uint32_t i = 0; i < dim; i++) w[i] = clip_one(w[i], w_old[i], wmax);
    for (uint32_t i = 0; i < nstate; i++) state[i] = clip_one(state[i], state_old[i], FLT_MAX);
}
