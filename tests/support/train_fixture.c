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

void tr_write_fixed_line(FILE *f, unsigned i, bool wide)
{
    uint64_t h = gr_hash_key(i, 77);
    unsigned ints[13], ids[26];
    int score = 0;
    for (int j = 0; j < 13; j++) ints[j] = (unsigned)((h >> (j * 3)) % 50);
    for (int s = 0; s < 26; s++) {
        ids[s] = (unsigned)(gr_hash_key(i * 31 + (unsigned)s, 5) % (3 + (unsigned)s * 7)) *
                 2654435761u;
        score += (ids[s] >> 7) & 1;
    }
    fprintf(f, "%d", score + (int)(ints[0] % 5) > 15 ? 1 : 0);
    for (int j = 0; j < 13; j++) fprintf(f, wide ? "\t%012u" : "\t%04u", ints[j]);
    for (int s = 0; s < 26; s++) fprintf(f, "\t%08x", ids[s]);
    fputc('\n', f);
}

size_t tr_file_ids(const char *path, uint64_t **out)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t cap = 1 << 16, n = 0;
    uint64_t *ids = malloc(cap * sizeof *ids);
    char line[1024];
    while (ids && fgets(line, sizeof line, f)) {
        float label, dense[13];
        uint64_t x[26];
        if (gr_criteo_parse_line(line, strcspn(line, "\n"), &label, dense, x) != 0) {
            free(ids);
            ids = NULL;
            break;
        }
        for (int s = 0; s < 26; s++) {
            if (n == cap) {
                uint64_t *more = realloc(ids, (cap *= 2) * sizeof *ids);
                if (!more) {
                    free(ids);
                    ids = NULL;
                    break;
                }
                ids = more;
            }
            if (ids) ids[n++] = x[s];
        }
    }
    fclose(f);
    if (!ids || n == 0) {
        free(ids);
        return 0;
    }
    uint64_t *uniq = malloc(n * sizeof *uniq);
    uint32_t *inv = malloc(n * sizeof *inv);
    long nu = uniq && inv ? gr_dedup(ids, n, uniq, inv, NULL) : -1;
    free(ids);
    free(inv);
    if (nu <= 0) {
        free(uniq);
        return 0;
    }
    *out = uniq;
    return (size_t)nu;
}

int tr_params_read(gr_client *client, const gr_model_config *model, const uint64_t *ids,
                   size_t nids, uint32_t dim, tr_params *out)
{
    memset(out, 0, sizeof *out);
    gr_model *m;
    if (gr_model_create(model, &m) != 0) return -1;
    out->nd = gr_model_dense_size(m);
    out->dense = malloc(out->nd * sizeof(float));
    int rc = out->dense ? gr_client_dense_pull(client, gr_model_dense_name(m), out->dense,
                                               out->nd)
                        : -1;
    gr_model_destroy(m);
    if (rc) return -1;
    out->nrows = nids * dim;
    out->rows = malloc(out->nrows * sizeof(float));
    if (!out->rows) return -1;
    gr_client_batch b = {GR_TRAIN_EMB_TABLE, dim, nids, ids, out->rows, NULL, 0};
    return gr_client_pull_many(client, &b, 1, GR_CLIENT_READONLY) == 0 ? 0 : -1;
}

void tr_params_fini(tr_params *p)
{
    free(p->dense);
    free(p->rows);
    memset(p, 0, sizeof *p);
}
