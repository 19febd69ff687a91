/* The training tests' data set and small model (train_fixture.h). */
#include "tests/support/train_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tr_fixture_make(tr_fixture *f, const char *name, uint64_t seed)
{
    snprintf(f->dir, sizeof f->dir, "/tmp/gr_%s_XXXXXX", name);
    if (!mkdtemp(f->dir)) return -1;
    gr_datagen_opts o = {.train_rows = 40000, .test_rows = 5000, .seed = seed, .threads = 2};
    gr_datagen_result r;
    if (gr_datagen_run(f->dir, &o, &r)) return -1;
    snprintf(f->train, sizeof f->train, "%s/train.tsv", f->dir);
    snprintf(f->test, sizeof f->test, "%s/test.tsv", f->dir);
    return 0;
}

int tr_fixture_remove(tr_fixture *f)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    return system(cmd) == 0 ? 0 : -1;
}

void tr_fixture_small_dlrm(const tr_fixture *f, gr_train_opts *o, gr_train_mode mode,
                           unsigned workers)
{
    gr_train_opts_default(o, GR_MODEL_DLRM);
    o->model.dim = 8;
    o->model.n_bottom = 1;
    o->model.bottom[0] = 16;
    o->model.n_top = 1;
    o->model.top[0] = 32;
    o->emb.dim = 8;
    o->train_path = f->train;
    o->test_path = f->test;
    o->batch = 256;
    o->workers = workers;
    o->mode = mode;
    o->progress_s = 0;
}

int tr_metrics_text(const char *path, const char *key, char *out, size_t cap)
{
    char *txt = NULL;
    if (gr_read_file(path, &txt, NULL) != 0) return -1;
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *at = strstr(txt, pat);
    int rc = -1;
    if (at) {
        at += strlen(pat);
        while (*at == ' ') at++;
        size_t n = strcspn(at, ",}\n");
        if (n < cap) {
            memcpy(out, at, n);
            out[n] = '\0';
            rc = 0;
        }
    }
    free(txt);
    return rc;
}
