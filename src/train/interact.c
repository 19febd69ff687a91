/* DLRM's pairwise dot interaction over a batch (model.c's training step and predictions).
 *
 * Forward: IA_LANES examples at a time with one example per lane. Their vectors are transposed
 * into lanes (16 x 16 blocks by shuffles when d is a multiple of 16), then every dot of the
 * block is a chain of lane-wise multiplies and adds over t, 4 x 4 pairs at a time so that 16
 * independent chains hide the add's latency and each loaded vector serves four; the dots come
 * back out of the lanes by the same transposition. Each dot is still summed over t in order
 * from 0, as the one-example loop does, so both give the same bits and may be mixed within a
 * batch. Backward: one example at a time, IA_LANES elements of a gradient side by side. */
#include "train/interact.h"
#include "granary/train.h"
#include "train/hot_loops.h"

#include <stdbool.h>
#include <string.h>

#define IA_LANES 16 /* dots (forward) or elements (backward) summed side by side */
/* IA_LANES floats as one value (GCC/clang vector extension): lane-wise arithmetic, lowered to
 * whatever vector width the target has. */
typedef float ia_vec __attribute__((vector_size(IA_LANES * sizeof(float))));
#define IA_GROUP 4 /* backward: vectors whose gradients are summed side by side */
#define IA_TILE 4  /* forward in lanes: a tile of IA_TILE x IA_TILE pairs (a, b) per pass over t */
/* The lanes' scratch (IA_LANES examples' vectors and their dots) is used up to these sizes;
 * larger shapes take the one-example path (same bits). */
#define IA_LANES_MAX_VALUES 16384 /* nvec * d */
#define IA_LANES_MAX_PAIRS 8192

size_t tr_interact_vt_floats(uint32_t nvec, uint32_t d)
{
    size_t vpad = (size_t)(nvec + IA_LANES - 1) / IA_LANES * IA_LANES;
    return (vpad ? vpad : 1) * (d ? d : 1);
}

static bool lanes_fit(uint32_t nvec, uint32_t d)
{
    size_t npairs = (size_t)nvec * (nvec - 1) / 2;
    return nvec >= 2 && (size_t)nvec * d <= IA_LANES_MAX_VALUES && npairs <= IA_LANES_MAX_PAIRS;
}

size_t tr_interact_lanes_floats(uint32_t nvec, uint32_t d)
{
    if (!lanes_fit(nvec, d)) return 0;
    size_t npairs = (size_t)nvec * (nvec - 1) / 2;
    return ((size_t)nvec * d + npairs) * IA_LANES; /* xt, then the block's dots */
}

/* Vector v of one example: its bottom output bi (v = 0) or its slot v - 1's row in ei (the
 * example's first slot). The callers hoist bi and ei per example: with any number of slots
 * the index arithmetic would otherwise cost ~3 % of a step. */
static inline const float *vec_at(const float *bi, const float *ei, uint32_t v, uint32_t d)
{
    return v == 0 ? bi : ei + (size_t)(v - 1) * d;
}

#define IA_ONE_GROUP 4 /* one example: vectors a whose dots are summed side by side */

/* The dots (a, b0 .. min(a, b0 + IA_LANES) - 1) of one example, from the lanes of acc. */
static inline __attribute__((always_inline)) void
one_dots_store(float *restrict dots, const ia_vec *acc, uint32_t a, uint32_t b0)
{
    float out[IA_LANES];
    memcpy(out, acc, sizeof out);
    uint32_t m = a - b0 < IA_LANES ? a - b0 : IA_LANES;
    memcpy(dots + (size_t)a * (a - 1) / 2 + b0, out, m * sizeof *out);
}

/* The interaction one example at a time (a batch's last n % IA_LANES examples, and shapes too
 * large for the lanes' scratch): z = [bot, <va, vb> for a > b]. The example's vectors are first
 * transposed into vt (d x vpad, lanes past nvec zero), so the dots of va with IA_LANES vectors
 * vb are one vector multiply-add per element t: no horizontal sums, and each dot is still
 * summed over t in order, as the scalar loop did (bitwise the same dots). */
static inline __attribute__((always_inline)) void
interact_forward_one(float *restrict zs, uint32_t top_in, const float *restrict bot,
                 const float *restrict emb, size_t n, uint32_t d, uint32_t ns, uint32_t nvec,
                 float *restrict vt)
{
    const size_t vpad = (size_t)(nvec + IA_LANES - 1) / IA_LANES * IA_LANES;
    for (size_t i = 0; i < n; i++) {
        float *z = zs + i * top_in;
        const float *bi = bot + i * d, *ei = emb + i * ns * d;
        memcpy(z, bi, d * sizeof *z);
        for (uint32_t v = 0; v < nvec; v++) {
            const float *x = vec_at(bi, ei, v, d);
            for (uint32_t t = 0; t < d; t++) vt[t * vpad + v] = x[t];
        }
        float *dots = z + d;
        /* For each block of IA_LANES vectors b, the vectors a past its start: IA_ONE_GROUP of
         * them at a time share each loaded column and keep that many chains in flight (one
         * chain at a time waited on each add's latency). Dot (a, b) lands at its a-major place
         * a (a - 1) / 2 + b; lanes b >= a are computed and dropped, as before. */
        for (uint32_t b0 = 0; b0 + 1 < nvec; b0 += IA_LANES) {
            uint32_t a = b0 + 1;
            for (; a + IA_ONE_GROUP <= nvec; a += IA_ONE_GROUP) {
                const float *va[IA_ONE_GROUP];
                ia_vec acc[IA_ONE_GROUP] = {{0}}, col;
                for (uint32_t p = 0; p < IA_ONE_GROUP; p++) va[p] = vec_at(bi, ei, a + p, d);
                for (uint32_t t = 0; t < d; t++) {
                    memcpy(&col, vt + t * vpad + b0, sizeof col);
                    for (uint32_t p = 0; p < IA_ONE_GROUP; p++) acc[p] += va[p][t] * col;
                }
                for (uint32_t p = 0; p < IA_ONE_GROUP; p++)
                    one_dots_store(dots, &acc[p], a + p, b0);
            }
            for (; a < nvec; a++) {
                const float *va = vec_at(bi, ei, a, d);
                ia_vec acc = {0}, col;
                for (uint32_t t = 0; t < d; t++) {
                    memcpy(&col, vt + t * vpad + b0, sizeof col);
                    acc += va[t] * col;
                }
                one_dots_store(dots, &acc, a, b0);
            }
        }
    }
}

/* Its backward: the gradient of every slot's row (gemb) and of the bottom output (dbot) from
 * dz. Vector c's gradient is its start (dz's bottom part for c = 0, else 0) plus
 * sum over j != c, in order of j, of ddot(c, j) v_j: the order in which the pair loop
 * (a > b: g_a += ddot v_b, g_b += ddot v_a) added them, so the same gradients, but summed
 * IA_LANES elements at a time in registers rather than read and written per pair. The sum also
 * takes j == c with a coefficient of 0: adding 0 * v_c changes nothing but the sign of a zero,
 * which it keeps as it always was. */

/* ddot(a, j), the coefficient of v_j in g_a: dot (max, min) at its a-major place; 0 for
 * j == a. */
static inline __attribute__((always_inline)) float dd_coef(const float *ddots, uint32_t a,
                                                            uint32_t j)
{
    if (j == a) return 0.0f;
    return j < a ? ddots[(size_t)a * (a - 1) / 2 + j] : ddots[(size_t)j * (j - 1) / 2 + a];
}

/* G vectors' gradients, c .. c + G - 1, IA_LANES elements (t0) at a time, with G independent
 * chains of adds (one chain waited on each add's latency). The coefficients are read from
 * ddots where they lie, in three runs of j: below c (row a of the triangle, contiguous in j),
 * the G x G block around the diagonal, and above (column a: for each j, G neighbours). Until
 * session 11 every example first copied ddots into a full nvec x nvec matrix (dsym), 40 % of
 * this function's time. */
static inline __attribute__((always_inline)) void
backward_group(uint32_t G, uint32_t c, uint32_t t0, const float *restrict dz,
               const float *restrict ddots, const float *restrict bi, const float *restrict ei,
               uint32_t d, uint32_t nvec, float *restrict dbot, float *restrict gi)
{
    ia_vec acc[IA_GROUP] = {{0}}, v;
    if (c == 0) memcpy(&acc[0], dz + t0, sizeof acc[0]);
    const float *lo[IA_GROUP];
    for (uint32_t q = 0; q < G; q++) lo[q] = ddots + (size_t)(c + q) * (c + q - 1) / 2;
    uint32_t j = 0;
    for (; j < c; j++) { /* j < c <= a: the triangle's row a */
        memcpy(&v, j == 0 ? bi + t0 : ei + (size_t)(j - 1) * d + t0, sizeof v);
        for (uint32_t q = 0; q < G; q++) acc[q] += lo[q][j] * v;
    }
    for (; j < c + G; j++) {
        memcpy(&v, j == 0 ? bi + t0 : ei + (size_t)(j - 1) * d + t0, sizeof v);
        for (uint32_t q = 0; q < G; q++) acc[q] += dd_coef(ddots, c + q, j) * v;
    }
    for (; j < nvec; j++) { /* j > a: column a of the triangle, G neighbours per j */
        const float *up = ddots + (size_t)j * (j - 1) / 2 + c;
        memcpy(&v, ei + (size_t)(j - 1) * d + t0, sizeof v);
        for (uint32_t q = 0; q < G; q++) acc[q] += up[q] * v;
    }
    for (uint32_t q = 0; q < G; q++) {
        float *gc = c + q == 0 ? dbot : gi + (size_t)(c + q - 1) * d;
        memcpy(gc + t0, &acc[q], sizeof acc[q]);
    }
}

static inline __attribute__((always_inline)) void
interact_backward(const float *restrict dzs, uint32_t top_in, const float *restrict bot,
                  const float *restrict emb, size_t n, uint32_t d, uint32_t ns, uint32_t nvec,
                  float *restrict dbots, float *restrict gemb, float *restrict dsym)
{
    if (d % IA_LANES == 0) {
        for (size_t i = 0; i < n; i++) {
            const float *dz = dzs + i * top_in, *ddots = dz + d;
            const float *bi = bot + i * d, *ei = emb + i * ns * d;
            float *gi = gemb + i * ns * d, *dbot = dbots + i * d;
            for (uint32_t t0 = 0; t0 < d; t0 += IA_LANES) {
                uint32_t c = 0;
                for (; c + IA_GROUP <= nvec; c += IA_GROUP)
                    backward_group(IA_GROUP, c, t0, dz, ddots, bi, ei, d, nvec, dbot, gi);
                switch (nvec - c) {
                case 3: backward_group(3, c, t0, dz, ddots, bi, ei, d, nvec, dbot, gi); break;
                case 2: backward_group(2, c, t0, dz, ddots, bi, ei, d, nvec, dbot, gi); break;
                case 1: backward_group(1, c, t0, dz, ddots, bi, ei, d, nvec, dbot, gi); break;
                default: break;
                }
            }
        }
        return;
    }
    /* Other widths: the coefficients as a full nvec x nvec matrix first (dsym, diagonal 0),
     * then each vector's gradient over j, element by element past the last whole vector. */
    for (uint32_t c = 0; c < nvec; c++) dsym[c * nvec + c] = 0.0f;
    for (size_t i = 0; i < n; i++) {
        const float *dz = dzs + i * top_in, *ddots = dz + d;
        const float *bi = bot + i * d, *ei = emb + i * ns * d;
        float *gi = gemb + i * ns * d;
        uint32_t k = 0;
        for (uint32_t a = 1; a < nvec; a++)
            for (uint32_t b = 0; b < a; b++, k++) dsym[a * nvec + b] = dsym[b * nvec + a] = ddots[k];
        for (uint32_t c = 0; c < nvec; c++) {
            float *gc = c == 0 ? dbots + i * d : gi + (size_t)(c - 1) * d;
            const float *row = dsym + (size_t)c * nvec;
            uint32_t t0 = 0;
            for (; t0 + IA_LANES <= d; t0 += IA_LANES) {
                ia_vec acc = {0}, v;
                if (c == 0) memcpy(&acc, dz + t0, sizeof acc);
                memcpy(&v, bi + t0, sizeof v);
                acc += row[0] * v;
                const float *vj = ei + t0;
                for (uint32_t j = 1; j < nvec; j++, vj += d) {
                    memcpy(&v, vj, sizeof v);
                    acc += row[j] * v;
                }
                memcpy(gc + t0, &acc, sizeof acc);
            }
            for (uint32_t t = t0; t < d; t++) {
                float s = c == 0 ? dz[t] : 0.0f;
                s += row[0] * bi[t];
                for (uint32_t j = 1; j < nvec; j++) s += row[j] * ei[(size_t)(j - 1) * d + t];
                gc[t] = s;
            }
        }
    }
}


/* r[i][j] becomes r[j][i]: four rounds that each swap the off-diagonal blocks of size h
 * (8, 4, 2, 1) between rows i and i + h. */
static inline __attribute__((always_inline)) void transpose16(ia_vec r[IA_LANES])
{
/* __builtin_shufflevector (clang, and GCC since 12) takes its lane indices as constant
 * arguments: each round's two index lists come parenthesised and are unwrapped here. */
#define IA_UNPAREN(...) __VA_ARGS__
#define IA_SHUF(x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
#define IA_ROUND(h, LO, HI)                                                                    \
    do {                                                                                       \
        for (int i = 0; i < IA_LANES; i++) {                                                   \
            if (i & (h)) continue;                                                             \
            ia_vec x = r[i], y = r[i + (h)];                                                   \
            r[i] = IA_SHUF(x, y, IA_UNPAREN LO);                                               \
            r[i + (h)] = IA_SHUF(x, y, IA_UNPAREN HI);                                         \
        }                                                                                      \
    } while (0)
    IA_ROUND(8, (0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23),
             (8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31));
    IA_ROUND(4, (0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27),
             (4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31));
    IA_ROUND(2, (0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29),
             (2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31));
    IA_ROUND(1, (0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30),
             (1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31));
#undef IA_ROUND
#undef IA_SHUF
#undef IA_UNPAREN
}

/* Examples i0 .. i0 + IA_LANES - 1's vectors into lanes: xt[(v * d + t) * IA_LANES + l] is
 * element t of example i0 + l's vector v. */
static inline __attribute__((always_inline)) void
lanes_load(float *restrict xt, const float *restrict bot, const float *restrict emb, size_t i0,
           uint32_t d, uint32_t ns, uint32_t nvec)
{
    for (uint32_t v = 0; v < nvec; v++) {
        const float *src[IA_LANES];
        for (uint32_t l = 0; l < IA_LANES; l++)
            src[l] = v == 0 ? bot + (i0 + l) * d : emb + ((i0 + l) * ns + v - 1) * d;
        float *dst = xt + (size_t)v * d * IA_LANES;
        uint32_t t0 = 0;
        for (; t0 + IA_LANES <= d; t0 += IA_LANES) {
            ia_vec r[IA_LANES];
            for (uint32_t l = 0; l < IA_LANES; l++) memcpy(&r[l], src[l] + t0, sizeof r[l]);
            transpose16(r);
            for (uint32_t t = 0; t < IA_LANES; t++)
                memcpy(dst + (t0 + t) * IA_LANES, &r[t], sizeof r[t]);
        }
        for (uint32_t t = t0; t < d; t++)
            for (uint32_t l = 0; l < IA_LANES; l++) dst[t * IA_LANES + l] = src[l][t];
    }
}

/* The dots of the block's pairs, dot k (a-major order, a > b) at out + k * stride. Tiles of
 * IA_TILE a's x IA_TILE b's cover the triangle; the pairs of a tile with b >= a (or past the
 * last vector, whose rows are read clamped) are computed and dropped. */
static inline __attribute__((always_inline)) void
lanes_dots(float *restrict out, size_t stride, const float *restrict xt, uint32_t d,
           uint32_t nvec)
{
    const size_t vs = (size_t)d * IA_LANES; /* floats per vector in xt */
    for (uint32_t a0 = 1; a0 < nvec; a0 += IA_TILE) {
        const float *xa[IA_TILE];
        for (uint32_t p = 0; p < IA_TILE; p++)
            xa[p] = xt + (a0 + p < nvec ? a0 + p : nvec - 1) * vs;
        for (uint32_t b0 = 0; b0 < a0 + IA_TILE - 1 && b0 < nvec - 1; b0 += IA_TILE) {
            const float *xb[IA_TILE];
            for (uint32_t q = 0; q < IA_TILE; q++)
                xb[q] = xt + (b0 + q < nvec ? b0 + q : nvec - 1) * vs;
            ia_vec acc[IA_TILE][IA_TILE] = {{{0}}};
            for (uint32_t t = 0; t < d; t++) {
                ia_vec va[IA_TILE], vb[IA_TILE];
                for (uint32_t p = 0; p < IA_TILE; p++)
                    memcpy(&va[p], xa[p] + t * IA_LANES, sizeof va[p]);
                for (uint32_t q = 0; q < IA_TILE; q++)
                    memcpy(&vb[q], xb[q] + t * IA_LANES, sizeof vb[q]);
                for (uint32_t p = 0; p < IA_TILE; p++)
                    for (uint32_t q = 0; q < IA_TILE; q++) acc[p][q] += va[p] * vb[q];
            }
            for (uint32_t p = 0; p < IA_TILE; p++) {
                const uint32_t a = a0 + p;
                for (uint32_t q = 0; q < IA_TILE; q++) {
                    const uint32_t b = b0 + q;
                    if (a < nvec && b < a)
                        memcpy(out + ((size_t)a * (a - 1) / 2 + b) * stride, &acc[p][q],
                               sizeof acc[p][q]);
                }
            }
        }
    }
}

/* The block's rows of z: the bottom output, then the dots out of the lanes. */
static inline __attribute__((always_inline)) void
lanes_store(float *restrict zs, uint32_t top_in, const float *restrict bot,
            const float *restrict dk, size_t i0, uint32_t d, uint32_t npairs)
{
    for (uint32_t l = 0; l < IA_LANES; l++)
        memcpy(zs + (i0 + l) * top_in, bot + (i0 + l) * d, d * sizeof *zs);
    uint32_t k0 = 0;
    for (; k0 + IA_LANES <= npairs; k0 += IA_LANES) {
        ia_vec r[IA_LANES];
        for (uint32_t j = 0; j < IA_LANES; j++)
            memcpy(&r[j], dk + (size_t)(k0 + j) * IA_LANES, sizeof r[j]);
        transpose16(r);
        for (uint32_t l = 0; l < IA_LANES; l++)
            memcpy(zs + (i0 + l) * top_in + d + k0, &r[l], sizeof r[l]);
    }
    for (uint32_t l = 0; l < IA_LANES; l++) {
        float *z = zs + (i0 + l) * top_in + d;
        for (uint32_t k = k0; k < npairs; k++) z[k] = dk[(size_t)k * IA_LANES + l];
    }
}

static inline __attribute__((always_inline)) void
interact_forward(float *restrict zs, uint32_t top_in, const float *restrict bot,
                 const float *restrict emb, size_t n, uint32_t d, uint32_t ns, uint32_t nvec,
                 float *restrict vt, float *restrict lanes)
{
    size_t i0 = 0;
    if (lanes && lanes_fit(nvec, d)) {
        const uint32_t npairs = nvec * (nvec - 1) / 2;
        float *xt = lanes, *dk = lanes + (size_t)nvec * d * IA_LANES;
        for (; i0 + IA_LANES <= n; i0 += IA_LANES) {
            lanes_load(xt, bot, emb, i0, d, ns, nvec);
            lanes_dots(dk, IA_LANES, xt, d, nvec);
            lanes_store(zs, top_in, bot, dk, i0, d, npairs);
        }
    }
    if (i0 < n) /* the last n % IA_LANES examples */
        interact_forward_one(zs + i0 * top_in, top_in, bot + i0 * d, emb + i0 * ns * d, n - i0,
                             d, ns, nvec, vt);
}

/* Criteo's 27 vectors get their own copy of each, with the count known to the compiler, as
 * before models took any number of columns. */
GR_HOT_LOOPS static void interact_forward_any(float *zs, uint32_t top_in, const float *bot,
                                              const float *emb, size_t n, uint32_t d, uint32_t ns,
                                              uint32_t nvec, float *vt, float *lanes)
{
    if (nvec == GR_CRITEO_SPARSE + 1)
        interact_forward(zs, top_in, bot, emb, n, d, GR_CRITEO_SPARSE, GR_CRITEO_SPARSE + 1,
                         vt, lanes);
    else
        interact_forward(zs, top_in, bot, emb, n, d, ns, nvec, vt, lanes);
}

GR_HOT_LOOPS static void interact_backward_any(const float *dzs, uint32_t top_in,
                                               const float *bot, const float *emb, size_t n,
                                               uint32_t d, uint32_t ns, uint32_t nvec,
                                               float *dbots, float *gemb, float *dsym)
{
    if (nvec == GR_CRITEO_SPARSE + 1)
        interact_backward(dzs, top_in, bot, emb, n, d, GR_CRITEO_SPARSE, GR_CRITEO_SPARSE + 1,
                          dbots, gemb, dsym);
    else
        interact_backward(dzs, top_in, bot, emb, n, d, ns, nvec, dbots, gemb, dsym);
}


void tr_interact_forward(float *zs, uint32_t top_in, const float *bot, const float *emb,
                         size_t n, uint32_t d, uint32_t ns, uint32_t nvec, float *vt,
                         float *lanes)
{
    interact_forward_any(zs, top_in, bot, emb, n, d, ns, nvec, vt, lanes);
}

void tr_interact_backward(const float *dzs, uint32_t top_in, const float *bot, const float *emb,
                          size_t n, uint32_t d, uint32_t ns, uint32_t nvec, float *dbots,
                          float *gemb, float *dsym)
{
    interact_backward_any(dzs, top_in, bot, emb, n, d, ns, nvec, dbots, gemb, dsym);
}
