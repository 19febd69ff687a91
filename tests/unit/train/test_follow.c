/* The streaming reader behind `granary train --follow`: it hands out the lines already in the
 * file, then the ones appended later (a partial last line only once it is complete), starts
 * over when the file is truncated, switches to the new file when it is rotated, skips and
 * counts bad lines, and returns an empty batch once the stop flag is set. Also the drifting
 * data stream: deterministic per seed, and its labels follow a teacher that drifts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "granary/train.h"

static char dir[64], path[128], rotated[160];

static void append(const char *text)
{
    FILE *f = fopen(path, "a");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void *append_later(void *arg)
{
    usleep(300000);
    append(arg);
    return NULL;
}

/* A valid line with label `label` and first dense value `d0`. */
static void line(char *buf, size_t cap, int label, int d0)
{
    snprintf(buf, cap, "%d\t%d\t\t\t\t\t\t\t\t\t\t\t\t\t68fd1e64\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\n",
             label, d0);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/gr_follow_XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/stream.tsv", dir);
    snprintf(rotated, sizeof rotated, "%s/stream.tsv.1", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(path);
    unlink(rotated);
    rmdir(dir);
    return 0;
}

static void test_tail_truncate_rotate_stop(void **state)
{
    (void)state;
    char l[256];
    line(l, sizeof l, 1, 3);
    append(l);
    append("not a line\n");
    line(l, sizeof l, 0, 7);
    append(l);
    atomic_bool stop = false;
    gr_follow *f;
    assert_int_equal(gr_follow_open(path, &stop, &f), 0);
    gr_batch b;
    assert_int_equal(gr_batch_init(&b, 8), 0);
    /* Two good lines are there; the reader hands them out after its idle flush. */
    assert_int_equal(gr_follow_next(f, &b, 8), 0);
    assert_int_equal(b.n, 2);
    assert_true(b.labels[0] == 1.0f && b.labels[1] == 0.0f);
    assert_true(b.dense[0] == (float)log1p(3.0) && b.dense[GR_CRITEO_DENSE] == (float)log1p(7.0));
    gr_criteo_stats st;
    gr_follow_get_stats(f, &st);
    assert_int_equal(st.bad_lines, 1);
    /* A line written in two parts is read once it is whole. */
    line(l, sizeof l, 1, 20);
    size_t half = strlen(l) / 2;
    char first[256];
    memcpy(first, l, half);
    first[half] = 0;
    append(first);
    pthread_t th;
    pthread_create(&th, NULL, append_later, l + half);
    assert_int_equal(gr_follow_next(f, &b, 1), 0); /* waits for the rest */
    pthread_join(th, NULL);
    assert_int_equal(b.n, 1);
    assert_true(b.dense[0] == (float)log1p(20.0));
    /* Truncated and rewritten: read from the start. */
    assert_int_equal(truncate(path, 0), 0);
    usleep(150000); /* the reader notices the truncation while idle */
    line(l, sizeof l, 0, 100);
    append(l);
    assert_int_equal(gr_follow_next(f, &b, 1), 0);
    assert_int_equal(b.n, 1);
    assert_true(b.dense[0] == (float)log1p(100.0));
    /* Rotated: the old file gets its last line, then a new file takes the name. */
    line(l, sizeof l, 1, 200);
    append(l);
    assert_int_equal(rename(path, rotated), 0);
    line(l, sizeof l, 1, 300);
    append(l);
    assert_int_equal(gr_follow_next(f, &b, 1), 0);
    assert_true(b.n == 1 && b.dense[0] == (float)log1p(200.0));
    assert_int_equal(gr_follow_next(f, &b, 1), 0);
    assert_true(b.n == 1 && b.dense[0] == (float)log1p(300.0));
    /* Stop: the next call returns nothing instead of waiting for more lines. */
    atomic_store(&stop, true);
    assert_int_equal(gr_follow_next(f, &b, 8), 0);
    assert_int_equal(b.n, 0);
    gr_batch_fini(&b);
    gr_follow_close(f);
}

static void test_drifting_stream(void **state)
{
    (void)state;
    char a[GR_DATAGEN_ROW_MAX], b[GR_DATAGEN_ROW_MAX];
    gr_datagen_stream *s1, *s2, *fixed;
    assert_int_equal(gr_datagen_stream_create(7, 2.0, &s1), 0);
    assert_int_equal(gr_datagen_stream_create(7, 2.0, &s2), 0);
    assert_int_equal(gr_datagen_stream_create(7, 0.0, &fixed), 0);
    assert_int_equal(gr_datagen_stream_create(7, -1.0, &(gr_datagen_stream *){0}), GR_EINVAL);
    /* Same seed and drift: the same rows. Drift changes the teacher, not the features: the
     * first row (theta 0) is the same as the fixed teacher's, later probabilities differ. */
    double diff = 0;
    for (int i = 0; i < 20000; i++) {
        float p1, p2, pf;
        size_t n1 = gr_datagen_stream_next(s1, a, NULL, &p1);
        size_t n2 = gr_datagen_stream_next(s2, b, NULL, &p2);
        char c[GR_DATAGEN_ROW_MAX];
        gr_datagen_stream_next(fixed, c, NULL, &pf);
        assert_int_equal(n1, n2);
        assert_memory_equal(a, b, n1);
        assert_memory_equal(a + 2, c + 2, n1 - 2); /* features equal; labels may differ */
        if (i == 0) assert_true(p1 == pf);
        if (i >= 10000) diff += fabs((double)p1 - (double)pf);
    }
    assert_true(diff / 10000 > 0.02);
    assert_int_equal(gr_datagen_stream_rows(s1), 20000);
    gr_datagen_stream_destroy(s1);
    gr_datagen_stream_destroy(s2);
    gr_datagen_stream_destroy(fixed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_tail_truncate_rotate_stop, setup, teardown),
        cmocka_unit_test(test_drifting_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
