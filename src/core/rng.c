/* Deterministic random numbers (xoshiro256** seeded by splitmix64) and a Zipf sampler
 * (rejection-inversion, W. Hörmann and G. Derflinger, 1996), used by initializers, the data
 * generator and the benchmarks. */
#include "granary/core.h"

#include <math.h>

uint64_t gr_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void gr_rng_seed(gr_rng *r, uint64_t seed)
{
    uint64_t st = seed;
    for (int i = 0; i < 4; i++) r->s[i] = gr_splitmix64(&st);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t gr_rng_next(gr_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double gr_rng_uniform(gr_rng *r) { return (double)(gr_rng_next(r) >> 11) * 0x1.0p-53; }

double gr_rng_normal(gr_rng *r)
{
    double u1 = gr_rng_uniform(r), u2 = gr_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* H(x) = ((x)^(1-s) - 1) / (1 - s), with the limit log(x) at s = 1. */
static double zipf_h(double s, double x)
{
    double e = 1.0 - s;
    if (fabs(e) < 1e-8) return log(x);
    return expm1(e * log(x)) / e;
}

static double zipf_h_inv(double s, double x)
{
    double e = 1.0 - s;
    if (fabs(e) < 1e-8) return exp(x);
    double t = x * e;
    if (t < -1.0) t = -1.0;
    return exp(log1p(t) / e);
}

int gr_zipf_init(gr_zipf *z, uint64_t n, double s)
{
    if (n < 1 || !(s > 0.0)) return gr_seterr(GR_EINVAL, "zipf needs n >= 1 and s > 0");
    z->s = s;
    z->n = (double)n;
    z->h_x1 = zipf_h(s, 1.5) - 1.0;
    z->h_n = zipf_h(s, z->n + 0.5);
    z->c = 2.0 - zipf_h_inv(s, zipf_h(s, 2.5) - exp(-s * log(2.0)));
    return GR_OK;
}

uint64_t gr_zipf_draw(const gr_zipf *z, gr_rng *r)
{
    for (;;) {
        double u = z->h_n + gr_rng_uniform(r) * (z->h_x1 - z->h_n);
        double x = zipf_h_inv(z->s, u);
        double k = floor(x + 0.5);
        if (k < 1.0) k = 1.0;
        if (k > z->n) k = z->n;
        if (k - x <= z->c || u >= zipf_h(z->s, k + 0.5) - exp(-z->s * log(k)))
            return (uint64_t)k;
    }
}
