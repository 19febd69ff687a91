/* Internal to the train part: the data generator's threaded writer (datagen.c), shared by the
 * Criteo generator (datagen.c) and the generator for any schema (datagen_schema.c). */
#ifndef GRANARY_TRAIN_DATAGEN_INT_H
#define GRANARY_TRAIN_DATAGEN_INT_H

#include "granary/train.h"

/* A test row's label and teacher probability (for the oracle). */
typedef struct dg_row {
    float label, prob;
} dg_row;

/* Writes one row (with its '\n') into buf, at most max_row_bytes; returns its length. Called
 * from several threads with their own rng: it may only read gen. */
typedef size_t (*dg_row_fn)(const void *gen, gr_rng *r, char *buf, float *label, float *prob);

typedef struct dg_split {
    const void *gen;
    dg_row_fn row;
    size_t max_row_bytes;
    const char *header; /* a first line (with its '\n'), or NULL */
    /* Set by dg_run: */
    const char *dir, *name;
    uint64_t rows, seed, split;
    unsigned threads;
} dg_split;

/* Writes DIR/NAME (via a temporary file renamed into place): rows in chunks of 16384, each
 * chunk's rng seeded from (seed, split, chunk), so the bytes do not depend on threads. */
int dg_write_split(const dg_split *sp, dg_row *rows_out, double *positives);
/* Creates dir, writes res->train_file and res->test_file (their names set by the caller) with
 * the split's generator, and oracle.json with the teacher's test metrics. */
int dg_run(const char *dir, const gr_datagen_opts *opts, const dg_split *sp, gr_datagen_result *res);
/* gr_datagen_run for a schema that is not Criteo (datagen_schema.c). */
int dg_schema_run(const char *dir, const gr_datagen_opts *opts, gr_datagen_result *res);

#endif
