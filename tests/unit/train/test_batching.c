/* --batch is honoured with shared data: the file is cut into chunks of whole batches, so an
 * epoch is ceil(examples / batch) batches whatever the worker count (before, chunks were cut
 * at byte offsets and every chunk ended with a short batch: 256 steps instead of 196, and a
 * batch of 1 Mi examples ran 128 steps). Empty lines and CRLF do not count as examples; a
 * resumed run continues with the same chunks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "granary/train.h"

static char dir[64], plain[128], messy[128];
#define LINES 5000

static void write_file(const char *path, bool mess)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (unsigned i = 0; i < LINES; i++) {
        if (mess && i % 97 == 0) fputs(i % 2 ? "\n" : "\r\n", f); /* empty lines */
        fprintf(f, "%u", (unsigned)(gr_hash_key(i, 3) & 1));
        for (int j = 0; j < 13; j++) fprintf(f, "\t%u", (unsigned)((i * 7 + (unsigned)j) % 23));
        for (int s = 0; s < 26; s++)
            fprintf(f, "\t%x", (unsigned)(gr_hash_key(i * 29 + (unsigned)s, 9) % (5 + (unsigned)s * 40)));
        fputs(mess && i % 5 == 0 ? "\r\n" : "\n", f);
    }
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/gr_batching_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(plain, sizeof plain, "%s/plain.tsv", dir);
    snprintf(messy, sizeof messy, "%s/messy.tsv", dir);
    write_file(plain, false);
    write_file(messy, true);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static gr_train_result run(const char *path, size_t batch, unsigned workers, unsigned epochs,
                           bool pipeline)
{
    gr_train_opts o;
    gr_train_opts_default(&o, GR_MODEL_LR);
    o.emb.dim = 1;
    o.train_path = path;
    o.batch = batch;
    o.workers = workers;
    o.epochs = epochs;
    o.pipeline = pipeline;
    o.data = GR_TRAIN_DATA_SHARED;
    o.progress_s = 0;
    gr_train_backend be;
    assert_int_equal(gr_local_backend_create(NULL, &be), 0);
    gr_train_result r;
    int rc = gr_train_run(&o, &be, &r);
    if (rc) fprintf(stderr, "%s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    gr_train_backend_destroy(&be);
    return r;
}

static void expect(const char *path, size_t batch, unsigned workers, unsigned epochs, bool pipe)
{
    gr_train_result r = run(path, batch, workers, epochs, pipe);
    uint64_t want = epochs * ((LINES + batch - 1) / batch);
    if (r.steps != want)
        fprintf(stderr, "batch %zu, %u workers, %u epochs: %llu steps, want %llu\n", batch,
                workers, epochs, (unsigned long long)r.steps, (unsigned long long)want);
    assert_int_equal(r.examples, (uint64_t)epochs * LINES);
    assert_int_equal(r.bad_lines, 0);
    assert_int_equal(r.steps, want);
}

static void test_steps_are_ceil_examples_over_batch(void **state)
{
    (void)state;
    expect(plain, 256, 2, 1, true);  /* 20 steps (128 before) */
    expect(plain, 100, 3, 1, true);  /* 50 */
    expect(plain, 1000, 2, 2, true); /* 2 x 5 */
    expect(plain, 7, 4, 1, false);   /* 715: more batches than chunks */
    expect(plain, 1 << 20, 2, 1, true); /* one step (128 before) */
    expect(plain, LINES, 2, 1, true);   /* exactly one full batch */
    expect(plain, 1, 2, 1, true);       /* a batch per example */
}

static void test_empty_lines_and_crlf(void **state)
{
    (void)state;
    expect(messy, 256, 2, 1, true);
    expect(messy, 97, 3, 1, false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steps_are_ceil_examples_over_batch),
        cmocka_unit_test(test_empty_lines_and_crlf),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
