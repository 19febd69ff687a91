/* The predict reply without printf: a float as the 9 significant digits that bring it back
 * exactly (the count %.9g printed), from integer arithmetic on one correctly scaled double.
 * printf's float formatting (its positional-argument pass, the multi-precision digits) was
 * 2.5 % of a one-example request's CPU on the replica (perf, bench serve). */
#include "serve/serve_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 10^k for k = -32 .. 55, each the double nearest to it (the compiler rounds the literals). A
 * float times one of them, both rounded once, is within 2^-52 of the true product: far less
 * than the half unit of the ninth digit a round trip can afford (a float's neighbours are at
 * least 6e-8 apart relative to it, nine digits' half unit at most 5e-9). */
static const double pow10_neg[33] = {
    1e0,  1e-1,  1e-2,  1e-3,  1e-4,  1e-5,  1e-6,  1e-7,  1e-8,  1e-9,  1e-10,
    1e-11, 1e-12, 1e-13, 1e-14, 1e-15, 1e-16, 1e-17, 1e-18, 1e-19, 1e-20, 1e-21,
    1e-22, 1e-23, 1e-24, 1e-25, 1e-26, 1e-27, 1e-28, 1e-29, 1e-30, 1e-31, 1e-32};
static const double pow10_pos[56] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11, 1e12, 1e13,
    1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22, 1e23, 1e24, 1e25, 1e26, 1e27,
    1e28, 1e29, 1e30, 1e31, 1e32, 1e33, 1e34, 1e35, 1e36, 1e37, 1e38, 1e39, 1e40, 1e41,
    1e42, 1e43, 1e44, 1e45, 1e46, 1e47, 1e48, 1e49, 1e50, 1e51, 1e52, 1e53, 1e54, 1e55};

static double pow10_of(int k)
{
    return k >= 0 ? pow10_pos[k] : pow10_neg[-k];
}

size_t gr_serve_format_float(float f, char out[GR_SERVE_FLOAT_CHARS])
{
    char *o = out;
    if (!isfinite(f)) {
        memcpy(out, "null", 4); /* JSON has no NaN or infinity */
        return 4;
    }
    if (signbit(f)) *o++ = '-';
    double v = fabs((double)f);
    if (v == 0) {
        *o++ = '0';
        return (size_t)(o - out);
    }
    /* The decimal exponent e of v (10^e <= v < 10^(e+1)): first from the binary one
     * (log10(2) ~ 78913 / 2^18), then corrected on the scaled value. */
    int e2;
    frexp(v, &e2);
    int e = ((e2 - 1) * 78913) >> 18;
    if (e < -46) e = -46;
    if (e > 38) e = 38;
    double s = v * pow10_of(8 - e);
    if (s < 1e8) s = v * pow10_of(8 - --e);
    else if (s >= 1e9) s = v * pow10_of(8 - ++e);
    uint64_t d = (uint64_t)llrint(s); /* nine digits, ties to even */
    if (d >= 1000000000u) d /= 10, e++;
    char dig[9];
    for (int i = 8; i >= 0; i--, d /= 10) dig[i] = (char)('0' + d % 10);
    int nd = 9;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    if (e >= -5 && e < 9) { /* plain decimal, as %g writes these */
        if (e < 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = -1; i > e; i--) *o++ = '0';
            memcpy(o, dig, (size_t)nd);
            o += nd;
        } else {
            int whole = e + 1;
            for (int i = 0; i < whole; i++) *o++ = i < nd ? dig[i] : '0';
            if (nd > whole) {
                *o++ = '.';
                memcpy(o, dig + whole, (size_t)(nd - whole));
                o += nd - whole;
            }
        }
    } else { /* d.ddde-X */
        *o++ = dig[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, dig + 1, (size_t)(nd - 1));
            o += nd - 1;
        }
        *o++ = 'e';
        if (e < 0) *o++ = '-', e = -e;
        if (e >= 10) *o++ = (char)('0' + e / 10);
        *o++ = (char)('0' + e % 10);
    }
    return (size_t)(o - out);
}

int sv_predict_reply(const float *probs, size_t n, uint64_t version, char **body, size_t *len)
{
    static const char head[] = "{\"predictions\":[", mid[] = "],\"model_version\":";
    size_t cap = sizeof head + sizeof mid + n * (GR_SERVE_FLOAT_CHARS + 1) + 24;
    char *b = malloc(cap), *o = b;
    if (!b) return GR_ENOMEM;
    memcpy(o, head, sizeof head - 1);
    o += sizeof head - 1;
    for (size_t i = 0; i < n; i++) {
        if (i) *o++ = ',';
        o += gr_serve_format_float(probs[i], o);
    }
    memcpy(o, mid, sizeof mid - 1);
    o += sizeof mid - 1;
    char ver[24];
    int k = 0;
    do ver[k++] = (char)('0' + version % 10);
    while (version /= 10);
    while (k) *o++ = ver[--k];
    *o++ = '}';
    *body = b;
    *len = (size_t)(o - b);
    return GR_OK;
}
