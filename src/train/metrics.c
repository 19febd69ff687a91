/* Evaluation metrics: exact rank-based ROC AUC (ties share their average rank) and clipped
 * binary log loss. Used by the trainer's evaluation and by datagen's oracle. */
#include "granary/train.h"

#include <math.h>
#include <stdlib.h>

typedef struct scored {
    float s;
    float y;
} scored;

static int cmp_scored(const void *a, const void *b)
{
    float x = ((const scored *)a)->s, y = ((const scored *)b)->s;
    return (x > y) - (x < y);
}

int gr_auc(const float *scores, const float *labels, size_t n, double *out)
{
    *out = NAN;
    if (n == 0) return GR_OK;
    scored *v = malloc(n * sizeof *v);
    if (!v) return gr_seterr(GR_ENOMEM, "auc: cannot allocate %zu entries", n);
    double pos = 0;
    for (size_t i = 0; i < n; i++) {
        /* NaN scores would break the ordering qsort needs; rank them lowest. */
        v[i].s = isnan(scores[i]) ? -INFINITY : scores[i];
        v[i].y = labels[i] > 0.5f ? 1.0f : 0.0f;
        pos += v[i].y;
    }
    double neg = (double)n - pos;
    if (pos == 0 || neg == 0) {
        free(v);
        return GR_OK;
    }
    qsort(v, n, sizeof *v, cmp_scored);
    /* Sum of the (1-based) ranks of the positives, a tie group getting its mean rank. */
    double rank_sum = 0;
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        double p = 0;
        while (j < n && v[j].s == v[i].s) p += v[j++].y;
        double avg_rank = ((double)i + 1 + (double)j) / 2.0;
        rank_sum += p * avg_rank;
        i = j;
    }
    free(v);
    *out = (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg);
    return GR_OK;
}

double gr_logloss(const float *probs, const float *labels, size_t n)
{
    if (n == 0) return 0.0;
    const double lo = 1e-7, hi = 1.0 - 1e-7;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        double p = probs[i];
        if (!(p >= lo)) p = lo; /* also catches NaN */
        if (p > hi) p = hi;
        double y = labels[i] > 0.5f ? 1.0 : 0.0;
        sum -= y * log(p) + (1.0 - y) * log(1.0 - p);
    }
    return sum / (double)n;
}
