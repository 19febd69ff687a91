/* Test support for the training tests: a generated data set in a fresh temporary folder (the
 * teacher of `granary datagen`, 40 000 training and 5 000 test rows) and a small DLRM that
 * learns it in seconds. */
#ifndef GRANARY_TEST_TRAIN_FIXTURE_H
#define GRANARY_TEST_TRAIN_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "granary/client.h"
#include "granary/train.h"

typedef struct tr_fixture {
    char dir[64];    /* the temporary folder */
    char train[128]; /* dir/train.tsv */
    char test[128];  /* dir/test.tsv */
} tr_fixture;

/* Generates the data set with datagen seed `seed` under /tmp/gr_NAME_XXXXXX; 0 or -1. */
int tr_fixture_make(tr_fixture *f, const char *name, uint64_t seed);
/* Removes the folder and everything in it; 0 or -1. */
int tr_fixture_remove(tr_fixture *f);
/* The value of "key" in a --metrics-out file exactly as printed (every digit it has), in out;
 * 0, or -1 when the file or the key is missing. */
int tr_metrics_text(const char *path, const char *key, char *out, size_t cap);
/* A small DLRM (dim 8, bottom 16, top 32, batch 256, no progress lines) on f's files. */
void tr_fixture_small_dlrm(const tr_fixture *f, gr_train_opts *o, gr_train_mode mode,
                           unsigned workers);

/* One fixed-width Criteo line for example i: a label from a simple rule (so gradients are not
 * noise), 13 ints as "%04u" ("%012u" when wide), 26 ids as "%08x", a few ids per slot so rows
 * repeat. Fixed width lets byte ranges split a file exactly; wide lines make a range shorter. */
void tr_write_fixed_line(FILE *f, unsigned i, bool wide);
/* Every distinct feature id of a TSV file in *out (malloc'd); their number, 0 on failure. */
size_t tr_file_ids(const char *path, uint64_t **out);

/* A trained model's parameters, read back from the shards. */
typedef struct tr_params {
    float *dense;
    size_t nd;
    float *rows;
    size_t nrows;
} tr_params;
/* The dense parameters of the model `model` describes and the rows (dim floats) of ids from
 * the trainer's embedding table; 0 or -1. */
int tr_params_read(gr_client *client, const gr_model_config *model, const uint64_t *ids,
                   size_t nids, uint32_t dim, tr_params *out);
void tr_params_fini(tr_params *p);

#endif
