/* Synthetic data for any schema, with a planted teacher so a model has something to learn:
 * every sparse column draws Zipf-distributed ids (a list column several, pooled as the schema
 * says), every dense column a value tied to one sparse column's id plus noise, and the label
 * comes from a teacher over per-id weights, latent interactions between pairs of sparse
 * columns and per-dense weights. Values are printed in each column's encoding (strings, 64-bit
 * integers, hex; floats in varied syntax), with some missing, so the file exercises the whole
 * reader. Every draw derives from (seed, split, chunk) or (seed, column, rank), as for Criteo. */
#include "train/datagen_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LATENT 4
#define MAX_PAIRS 8
#define LIST_MEAN_ITEMS 4  /* a list holds 0..2*LIST_MEAN_ITEMS items (at most max_items) */
#define FIELD_BYTES 24     /* the longest value printed: "-9223372036854775808" */
#define BIAS (-1.4)

/* Vocabulary, Zipf exponent and weight scale by sparse slot, cycling: small vocabularies
 * carry the most learnable signal, large ones a long tail. */
static const uint32_t VOCAB[] = {40, 2000, 300, 50000, 12, 5000, 800, 200000};
static const double ZIPF[] = {1.0, 1.1, 1.05, 1.1, 0.8, 1.1, 1.0, 1.05};
static const double WEIGHT[] = {0.9, 0.6, 0.7, 0.4, 0.9, 0.5, 0.6, 0.35};
#define NSHAPES (sizeof VOCAB / sizeof VOCAB[0])

typedef struct sgen {
    const gr_schema *s;
    uint64_t seed;
    gr_zipf *zipf;               /* per sparse slot */
    int8_t *pair_of;             /* per slot: in a latent pair */
    uint32_t pairs[MAX_PAIRS][2];
    uint32_t npairs;
} sgen;

static inline double u16(uint64_t h, int k) /* k-th 16-bit lane as a value in [-1, 1) */
{
    return (double)((h >> (16 * k)) & 0xffff) / 32768.0 - 1.0;
}

static inline uint64_t rank_hash(const sgen *g, uint32_t slot, uint64_t rank, uint64_t what)
{
    return gr_hash_key((rank << 12) ^ ((uint64_t)slot << 2) ^ what, g->seed ^ 0x73636867656eull);
}

/* Prints rank r of a slot in its column's encoding; returns the bytes written. Strings are
 * letters and digits only, so they never hold a delimiter or separator. */
static size_t put_value(const sgen *g, const gr_schema_column *c, uint64_t rank, char *p)
{
    uint64_t v = rank_hash(g, c->index, rank, 0);
    switch (c->encoding) {
    case GR_ENC_INT: /* the full 64-bit width, negative half the time */
        return (size_t)sprintf(p, "%lld", (long long)v);
    case GR_ENC_HEX:
        return (size_t)sprintf(p, "%llx", (unsigned long long)v);
    default: {
        static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
        size_t n = 0;
        p[n++] = (char)('a' + c->index % 26);
        for (int k = 0; k < 7; k++, v /= 36) p[n++] = digits[v % 36];
        return n;
    }
    }
}

/* A rank's weight fades past rank 30, so most of the signal sits on ids seen often enough. */
static inline double fade(uint64_t rank) { return rank > 30 ? 30.0 / (double)rank : 1.0; }

static size_t gen_row(const void *gv, gr_rng *r, char *buf, float *label_out, float *prob_out)
{
    const sgen *g = gv;
    const gr_schema *s = g->s;
    uint32_t ns = gr_schema_n_sparse(s), ncols = gr_schema_n_columns(s);
    double logit = BIAS;
    /* Per slot: the teacher's pooled weight, latent vector and "activity" (for dense). */
    double lat[64][LATENT], act[64];
    char *p = buf;
    char delim = gr_schema_delimiter(s);
    /* Two passes over the columns: the sparse ids first (they drive the dense values and the
     * teacher), their text kept in tmp; then the row in column order. */
    size_t span_at[GR_SCHEMA_MAX_COLUMNS], span_len[GR_SCHEMA_MAX_COLUMNS];
    char tmp[1 << 16];
    size_t tmp_len = 0;
    for (uint32_t i = 0; i < ncols; i++) {
        const gr_schema_column *c = gr_schema_column_at(s, i);
        span_at[i] = tmp_len;
        span_len[i] = 0;
        if (c->type != GR_COL_CATEGORICAL && c->type != GR_COL_LIST) continue;
        uint32_t slot = c->index, k = slot < 64 ? slot : 63;
        double wsum = 0, lsum[LATENT] = {0}, asum = 0;
        uint32_t items = 1;
        if (c->type == GR_COL_LIST) {
            uint32_t cap = c->max_items < 2 * LIST_MEAN_ITEMS ? c->max_items : 2 * LIST_MEAN_ITEMS;
            items = (uint32_t)(gr_rng_next(r) % (cap + 1));
        } else if (gr_rng_uniform(r) < 0.03) {
            items = 0; /* a missing value */
        }
        for (uint32_t t = 0; t < items; t++) {
            uint64_t rank = gr_zipf_draw(&g->zipf[slot], r);
            if (t) tmp[tmp_len++] = c->separator;
            tmp_len += put_value(g, c, rank, tmp + tmp_len);
            uint64_t h = rank_hash(g, slot, rank, 1), h2 = rank_hash(g, slot, rank, 2);
            double f = fade(rank);
            wsum += u16(h, 0) * f;
            asum += u16(h, 1);
            for (int q = 0; q < LATENT; q++) lsum[q] += u16(h2, q) * 0.6 * sqrt(f);
        }
        span_len[i] = tmp_len - span_at[i];
        /* A missing value or an empty list has a weight of its own, as the reader gives it an
         * id of its own. */
        if (items == 0) {
            uint64_t h = rank_hash(g, slot, UINT32_MAX, 1);
            wsum = u16(h, 0);
            items = 1;
        }
        double scale = c->type == GR_COL_LIST && c->pooling == GR_POOL_SUM ? 1.0 : 1.0 / items;
        logit += WEIGHT[slot % NSHAPES] * wsum * scale;
        act[k] = asum / items;
        for (int q = 0; q < LATENT; q++) lat[k][q] = lsum[q] / items;
    }
    for (uint32_t q = 0; q < g->npairs; q++) {
        double d = 0;
        for (int t = 0; t < LATENT; t++) d += lat[g->pairs[q][0]][t] * lat[g->pairs[q][1]][t];
        logit += d;
    }
    /* Dense values: tied to a sparse slot's activity, with noise; the teacher reads them as the
     * model will (after the column's transform). */
    double dense_val[GR_SCHEMA_MAX_COLUMNS];
    bool dense_missing[GR_SCHEMA_MAX_COLUMNS];
    for (uint32_t i = 0; i < ncols; i++) {
        const gr_schema_column *c = gr_schema_column_at(s, i);
        if (c->type != GR_COL_DENSE) continue;
        uint32_t j = c->index;
        double a = ns ? act[(j % ns) < 64 ? j % ns : 63] : 0;
        double z = gr_rng_normal(r);
        double u = (j % 2 ? 0.35 : -0.3) * (1.0 + 0.1 * (double)(j % 3));
        dense_missing[i] = gr_rng_uniform(r) < 0.04;
        double x, feat;
        if (c->transform == GR_TRANSFORM_LOG1P) {
            x = floor(exp(1.5 + 0.9 * a + 0.7 * z));
            feat = log1p(x);
        } else {
            x = 0.8 * a + 0.6 * z;
            feat = x;
        }
        dense_val[i] = x;
        if (dense_missing[i]) feat = c->fill;
        logit += u * (c->transform == GR_TRANSFORM_LOG1P ? feat - 1.5 : feat);
    }
    double prob = 1.0 / (1.0 + exp(-logit));
    int label = gr_rng_uniform(r) < prob;
    *label_out = (float)label;
    *prob_out = (float)prob;
    for (uint32_t i = 0; i < ncols; i++) {
        const gr_schema_column *c = gr_schema_column_at(s, i);
        if (i) *p++ = delim;
        switch (c->type) {
        case GR_COL_LABEL:
            *p++ = (char)('0' + label);
            break;
        case GR_COL_DENSE:
            if (dense_missing[i]) break;
            /* Varied float syntax: plain, with an exponent, with trailing zeros. */
            if (c->transform == GR_TRANSFORM_LOG1P)
                p += sprintf(p, (gr_rng_next(r) & 7) == 0 ? "%.1f" : "%.0f", dense_val[i]);
            else
                p += sprintf(p, (gr_rng_next(r) & 7) == 0 ? "%.4e" : "%.5g", dense_val[i]);
            break;
        case GR_COL_CATEGORICAL:
        case GR_COL_LIST:
            memcpy(p, tmp + span_at[i], span_len[i]);
            p += span_len[i];
            break;
        default:
            *p++ = 'x';
            break;
        }
    }
    *p++ = '\n';
    return (size_t)(p - buf);
}

static size_t max_row_bytes(const gr_schema *s)
{
    size_t n = 2;
    for (uint32_t i = 0; i < gr_schema_n_columns(s); i++) {
        const gr_schema_column *c = gr_schema_column_at(s, i);
        uint32_t items = c->type == GR_COL_LIST ? 2 * LIST_MEAN_ITEMS : 1;
        n += (size_t)items * (FIELD_BYTES + 1) + 1;
    }
    return n;
}

int dg_schema_run(const char *dir, const gr_datagen_opts *opts, gr_datagen_result *res)
{
    const gr_schema *s = opts->schema;
    uint32_t ns = gr_schema_n_sparse(s), ncols = gr_schema_n_columns(s);
    if (ns > 64)
        return gr_seterr(GR_EINVAL, "datagen: a schema with %u sparse columns; the generator "
                         "writes at most 64", ns);
    if (max_row_bytes(s) > (1 << 16))
        return gr_seterr(GR_EINVAL, "datagen: the schema's rows are too wide to generate");
    sgen g = {.s = s, .seed = opts->seed};
    g.zipf = calloc(ns ? ns : 1, sizeof *g.zipf);
    g.pair_of = calloc(ns ? ns : 1, 1);
    char *header = NULL;
    int rc = g.zipf && g.pair_of ? GR_OK : gr_seterr(GR_ENOMEM, "datagen: out of memory");
    for (uint32_t k = 0; !rc && k < ns; k++)
        rc = gr_zipf_init(&g.zipf[k], VOCAB[k % NSHAPES], ZIPF[k % NSHAPES]);
    /* Latent interactions between neighbouring slots (0-1, 1-2, ...). */
    for (uint32_t k = 0; k + 1 < ns && g.npairs < MAX_PAIRS; k++) {
        g.pairs[g.npairs][0] = k;
        g.pairs[g.npairs][1] = k + 1;
        g.npairs++;
    }
    if (!rc && gr_schema_header(s)) {
        size_t len = 2;
        for (uint32_t i = 0; i < ncols; i++) len += strlen(gr_schema_column_at(s, i)->name) + 1;
        header = malloc(len);
        if (!header) rc = gr_seterr(GR_ENOMEM, "datagen: out of memory");
        for (uint32_t i = 0, at = 0; header && i < ncols; i++) {
            at += (uint32_t)sprintf(header + at, "%s%s", i ? (char[2]){gr_schema_delimiter(s), 0} : "",
                                    gr_schema_column_at(s, i)->name);
            if (i + 1 == ncols) sprintf(header + at, "\n");
        }
    }
    if (!rc) {
        char d = gr_schema_delimiter(s);
        const char *ext = d == '\t' ? "tsv" : d == ',' ? "csv" : "txt";
        snprintf(res->train_file, sizeof res->train_file, "train.%s", ext);
        snprintf(res->test_file, sizeof res->test_file, "test.%s", ext);
        dg_split sp = {.gen = &g, .row = gen_row, .max_row_bytes = max_row_bytes(s), .header = header};
        rc = dg_run(dir, opts, &sp, res);
    }
    free(header);
    free(g.zipf);
    free(g.pair_of);
    return rc;
}
