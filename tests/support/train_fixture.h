/* Test support for the training tests: a generated data set in a fresh temporary folder (the
 * teacher of `granary datagen`, 40 000 training and 5 000 test rows) and a small DLRM that
 * learns it in seconds. */
#ifndef GRANARY_TEST_TRAIN_FIXTURE_H
#define GRANARY_TEST_TRAIN_FIXTURE_H

#include <stdint.h>

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

#endif
