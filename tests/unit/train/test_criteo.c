/* Unit tests for the Criteo TSV reader: line parsing, missing fields, bad lines (skipped or
 * refused, with line numbers), CRLF, a last line without newline, empty files, byte-range
 * splits, and the same output whatever the thread count or block size, or blocks read ahead. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "granary/train.h"

static char tmpdir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/gr_criteo_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *write_tmp(const char *name, const char *text)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(text, 1, strlen(text), f);
    fclose(f);
    return path;
}

/* A valid line: label, I1..I13 = k+i, C1..C26 = hex of k*1000+j; dense/cat fields listed
 * in `missing` (field indexes 1..39) are left empty. */
static void make_line(char *buf, size_t len, int label, int k, int missing)
{
    size_t at = (size_t)snprintf(buf, len, "%d", label);
    for (int f = 1; f < GR_CRITEO_FIELDS; f++) {
        buf[at++] = '\t';
        if (f == missing) continue;
        if (f <= GR_CRITEO_DENSE)
            at += (size_t)snprintf(buf + at, len - at, "%d", k + f);
        else
            at += (size_t)snprintf(buf + at, len - at, "%08x", (unsigned)(k * 1000 + f));
    }
    buf[at] = 0;
}

static void test_parse_line(void **state)
{
    (void)state;
    char line[1024];
    make_line(line, sizeof line, 1, 5, 3);
    float label, dense[13];
    uint64_t ids[26];
    assert_int_equal(gr_criteo_parse_line(line, strlen(line), &label, dense, ids), GR_OK);
    assert_true(label == 1.0f);
    assert_float_equal(dense[0], log1p(6.0), 1e-6);  /* I1 = 5 + 1 */
    assert_float_equal(dense[2], 0.0, 0);            /* I3 missing */
    assert_float_equal(dense[12], log1p(18.0), 1e-6);
    assert_true(ids[0] == gr_criteo_feature_id(0, 5 * 1000 + 14));
    assert_true(ids[25] == gr_criteo_feature_id(25, 5 * 1000 + 39));
    /* Slots salt ids; missing ids differ per slot and from values. */
    assert_true(gr_criteo_feature_id(0, 7) != gr_criteo_feature_id(1, 7));
    assert_true(gr_criteo_missing_id(0) != gr_criteo_missing_id(1));
    assert_true(gr_criteo_missing_id(3) != gr_criteo_feature_id(3, 0));

    /* Missing categorical; negative integer -> 0; upper-case hex; short hex. */
    const char *l2 = "0\t-5\t\t\t\t\t\t\t\t\t\t\t\t0\t\tABCDEF01\t1\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t"
                     "\t\t\t\t\t\t";
    assert_int_equal(gr_criteo_parse_line(l2, strlen(l2), &label, dense, ids), GR_OK);
    assert_true(label == 0.0f);
    assert_true(dense[0] == 0.0f && dense[12] == 0.0f);
    assert_true(ids[0] == gr_criteo_missing_id(0));
    assert_true(ids[1] == gr_criteo_feature_id(1, 0xabcdef01u));
    assert_true(ids[2] == gr_criteo_feature_id(2, 1));
    assert_true(ids[25] == gr_criteo_missing_id(25));

    /* CRLF is accepted. */
    make_line(line, sizeof line, 0, 1, 0);
    strcat(line, "\r");
    assert_int_equal(gr_criteo_parse_line(line, strlen(line), &label, dense, ids), GR_OK);
    assert_true(ids[25] == gr_criteo_feature_id(25, 1000 + 39));
}

static void expect_bad(const char *line, const char *msg_part)
{
    float label, dense[13];
    uint64_t ids[26];
    assert_int_equal(gr_criteo_parse_line(line, strlen(line), &label, dense, ids), GR_ECORRUPT);
    if (!strstr(gr_errmsg(), msg_part)) fail_msg("'%s' lacks '%s'", gr_errmsg(), msg_part);
}

/* The one-pass parser and the full one (which takes over for whatever the first is unsure
 * of) give the same values at the edges: signs, counts around the log1p table's end (4096),
 * 18 digits (the most accepted), 8 hex digits; and the same errors past them. */
static void test_parse_edges(void **state)
{
    (void)state;
    const char *dense_in[13] = {"+7",   "-3", "4095", "4096", "4097", "999999999999999999",
                                "0",    "",   "+0",   "-0",   "12",   "65535",
                                "1000000"};
    const double dense_want[13] = {7, -1, 4095, 4096, 4097, 999999999999999999.0, 0, -1, 0, -1,
                                   12, 65535, 1000000};
    char line[1024];
    size_t at = (size_t)snprintf(line, sizeof line, "1");
    for (int f = 0; f < 13; f++) at += (size_t)snprintf(line + at, sizeof line - at, "\t%s", dense_in[f]);
    for (int f = 0; f < 26; f++)
        at += (size_t)snprintf(line + at, sizeof line - at, f % 2 ? "\tffffffff" : "\t%x", f);
    float label, dense[13];
    uint64_t ids[26];
    assert_int_equal(gr_criteo_parse_line(line, strlen(line), &label, dense, ids), GR_OK);
    for (int f = 0; f < 13; f++) {
        float want = dense_want[f] < 0 ? 0.0f : (float)log1p(dense_want[f]);
        assert_memory_equal(&dense[f], &want, sizeof want);
    }
    for (unsigned f = 0; f < 26; f++)
        assert_true(ids[f] == gr_criteo_feature_id(f, f % 2 ? 0xffffffffu : f));
    /* One field past each limit: the error names it. */
    char bad[1100];
    snprintf(bad, sizeof bad, "1\t1234567890123456789%s", strchr(line + 2, '\t'));
    expect_bad(bad, "field 2 (I1): not an integer");
    snprintf(bad, sizeof bad, "1\t+%s", strchr(line + 2, '\t'));
    expect_bad(bad, "field 2 (I1): not an integer");
    strcpy(bad, line);
    char *last = strrchr(bad, '\t');
    strcpy(last, "\t123456789");
    expect_bad(bad, "field 40 (C26): more than 8 hex digits");
    strcpy(last, "\tfg");
    expect_bad(bad, "field 40 (C26): not hex");
    strcpy(last, "\t1\t2");
    expect_bad(bad, "has 41 fields, expected 40");
    *last = 0;
    expect_bad(bad, "has 39 fields, expected 40");
}

static void test_parse_bad(void **state)
{
    (void)state;
    char line[1024], bad[1100];
    make_line(line, sizeof line, 1, 5, 0);
    expect_bad("1\t2\t3", "has 3 fields, expected 40");
    snprintf(bad, sizeof bad, "%s\textra\tmore", line);
    expect_bad(bad, "has 42 fields, expected 40");
    snprintf(bad, sizeof bad, "2%s", line + 1);
    expect_bad(bad, "field 1 (label)");
    snprintf(bad, sizeof bad, "%s", line + 1); /* empty label */
    expect_bad(bad, "label must be 0 or 1");
    /* I2 = "x7" */
    snprintf(bad, sizeof bad, "1\t3\tx7%s", strchr(strchr(line + 2, '\t') + 1, '\t'));
    expect_bad(bad, "field 3 (I2): not an integer: 'x7'");
    /* C1 bad hex, C2 too long */
    make_line(line, sizeof line, 1, 5, 0);
    char *c1 = line;
    for (int i = 0; i < 14; i++) c1 = strchr(c1, '\t') + 1;
    c1[0] = 'g';
    expect_bad(line, "field 15 (C1): not hex");
    make_line(line, sizeof line, 1, 5, 0);
    c1 = line;
    for (int i = 0; i < 15; i++) c1 = strchr(c1, '\t') + 1;
    memmove(c1 + 1, c1, strlen(c1) + 1);
    c1[0] = 'a'; /* 9 hex digits */
    expect_bad(line, "field 16 (C2): more than 8 hex digits");
    expect_bad("", "has 1 fields");
}

typedef struct collected {
    size_t n;
    float labels[64];
    float dense[64 * 13];
    uint64_t ids[64 * 26];
} collected;

/* Reads the whole file; with `ahead`, gr_criteo_read_ahead is called that many times before
 * each batch (its errors are left for gr_criteo_next to return). */
static int read_all_ahead(const char *path, const gr_criteo_opts *o, collected *c,
                          gr_criteo_stats *st, int ahead)
{
    gr_criteo_reader *r;
    int rc = gr_criteo_open(path, o, &r);
    if (rc) return rc;
    gr_batch b;
    assert_int_equal(gr_batch_init(&b, 7), GR_OK);
    c->n = 0;
    for (;;) {
        for (int k = 0; k < ahead; k++) gr_criteo_read_ahead(r);
        rc = gr_criteo_next(r, &b);
        if (rc || b.n == 0) break;
        assert_true(b.n <= o->batch);
        assert_true(c->n + b.n <= 64);
        memcpy(c->labels + c->n, b.labels, b.n * sizeof(float));
        memcpy(c->dense + c->n * 13, b.dense, b.n * 13 * sizeof(float));
        memcpy(c->ids + c->n * 26, b.ids, b.n * 26 * sizeof(uint64_t));
        c->n += b.n;
    }
    gr_criteo_get_stats(r, st);
    gr_criteo_close(r);
    gr_batch_fini(&b);
    return rc;
}

static int read_all(const char *path, const gr_criteo_opts *o, collected *c, gr_criteo_stats *st)
{
    return read_all_ahead(path, o, c, st, 0);
}

static char *build_file(int nlines, int bad_at1, int bad_at2, bool crlf, bool final_newline)
{
    size_t cap = (size_t)nlines * 400 + 64;
    char *text = malloc(cap), line[1024];
    size_t at = 0;
    for (int i = 1; i <= nlines; i++) {
        if (i == bad_at1 || i == bad_at2)
            snprintf(line, sizeof line, "1\tnot-a-line");
        else
            make_line(line, sizeof line, i % 3 == 0, i, i % 40);
        at += (size_t)snprintf(text + at, cap - at, "%s%s", line,
                               i == nlines && !final_newline ? "" : crlf ? "\r\n" : "\n");
    }
    return text;
}

static void test_reader_skip_and_strict(void **state)
{
    (void)state;
    char *text = build_file(20, 4, 17, false, true);
    const char *path = write_tmp("bad.tsv", text);
    gr_criteo_opts o;
    gr_criteo_opts_default(&o);
    o.batch = 5;
    o.log_bad = 1;
    collected c;
    gr_criteo_stats st;
    for (unsigned threads = 0; threads <= 3; threads++) {
        o.threads = threads;
        o.block_bytes = threads == 2 ? 100 : 0; /* tiny blocks: a line spans several reads */
        assert_int_equal(read_all(path, &o, &c, &st), GR_OK);
        assert_int_equal(c.n, 18);
        assert_int_equal(st.lines, 20);
        assert_int_equal(st.bad_lines, 2);
        assert_int_equal(st.examples, 18);
        assert_int_equal(st.first_bad_line, 4);
        assert_non_null(strstr(st.first_bad_msg, "has 2 fields"));
        /* Example 3 (0-based) is line 5: label 5%3!=0 -> 0, I1 = 5 + 1. */
        assert_true(c.labels[2] == 1.0f && c.labels[3] == 0.0f);
        assert_float_equal(c.dense[3 * 13], log1p(6.0), 1e-6);
    }
    o.strict = true;
    for (unsigned threads = 0; threads <= 2; threads++) {
        o.threads = threads;
        assert_int_equal(read_all(path, &o, &c, &st), GR_ECORRUPT);
        if (!strstr(gr_errmsg(), "bad.tsv:4: has 2 fields, expected 40"))
            fail_msg("message: %s", gr_errmsg());
    }
    free(text);
}

/* gr_criteo_read_ahead: the same batches, stats and errors whether blocks are parsed ahead or
 * not; at most one block ahead; nothing to do with parser threads or at the end; a read error
 * comes back from the next gr_criteo_next too. */
static void test_reader_read_ahead(void **state)
{
    (void)state;
    char *text = build_file(60, 4, 41, false, true);
    const char *path = write_tmp("ahead.tsv", text);
    gr_criteo_opts o;
    gr_criteo_opts_default(&o);
    o.batch = 5;
    o.log_bad = 1;
    collected want, got;
    gr_criteo_stats wst, gst;
    for (int tiny = 0; tiny <= 1; tiny++) {
        o.block_bytes = tiny ? 300 : 0; /* 300: a block holds about one line */
        assert_int_equal(read_all(path, &o, &want, &wst), GR_OK);
        assert_int_equal(want.n, 58);
        for (int ahead = 1; ahead <= 2; ahead++) {
            memset(&got, 0xa5, sizeof got);
            assert_int_equal(read_all_ahead(path, &o, &got, &gst, ahead), GR_OK);
            assert_int_equal(got.n, want.n);
            assert_memory_equal(got.labels, want.labels, want.n * sizeof(float));
            assert_memory_equal(got.dense, want.dense, want.n * 13 * sizeof(float));
            assert_memory_equal(got.ids, want.ids, want.n * 26 * sizeof(uint64_t));
            assert_true(gst.lines == wst.lines && gst.bad_lines == wst.bad_lines &&
                        gst.examples == wst.examples && gst.first_bad_line == wst.first_bad_line);
        }
    }
    /* Return values: a fresh reader parses the block the first batch comes from, then the
     * next one, then nothing more until a block is used up; and 0 once all is read. */
    o.block_bytes = 300;
    gr_criteo_reader *r;
    assert_int_equal(gr_criteo_open(path, &o, &r), GR_OK);
    assert_int_equal(gr_criteo_read_ahead(r), 1);
    assert_int_equal(gr_criteo_read_ahead(r), 1);
    assert_int_equal(gr_criteo_read_ahead(r), 0);
    gr_batch b;
    assert_int_equal(gr_batch_init(&b, 5), GR_OK);
    size_t total = 0;
    do {
        assert_int_equal(gr_criteo_next(r, &b), GR_OK);
        total += b.n;
    } while (b.n > 0);
    assert_int_equal(total, 58);
    assert_int_equal(gr_criteo_read_ahead(r), 0);
    gr_criteo_close(r);
    /* Parser threads read ahead on their own: nothing to do here. */
    o.threads = 2;
    assert_int_equal(gr_criteo_open(path, &o, &r), GR_OK);
    assert_int_equal(gr_criteo_read_ahead(r), 0);
    assert_int_equal(gr_criteo_next(r, &b), GR_OK);
    assert_int_equal(b.n, 5);
    gr_criteo_close(r);
    /* Strict: the bad line stops the read at the same place, with the same message. */
    o.threads = 0;
    o.strict = true;
    assert_int_equal(read_all_ahead(path, &o, &got, &gst, 1), GR_ECORRUPT);
    if (!strstr(gr_errmsg(), "ahead.tsv:4: has 2 fields, expected 40"))
        fail_msg("message: %s", gr_errmsg());
    o.strict = false;
    /* A read error (a directory reads as EISDIR): read ahead says so, and so does the next
     * batch, which gets no examples. */
    assert_int_equal(gr_criteo_open(tmpdir, &o, &r), GR_OK);
    int rc = gr_criteo_read_ahead(r);
    assert_true(rc < 0);
    assert_int_equal(gr_criteo_next(r, &b), rc);
    assert_int_equal(b.n, 0);
    assert_int_equal(gr_criteo_next(r, &b), rc); /* and it stays failed */
    gr_criteo_close(r);
    gr_batch_fini(&b);
    free(text);
}

static void test_reader_crlf_no_final_newline(void **state)
{
    (void)state;
    char *a = build_file(9, 0, 0, false, true);
    char *b = build_file(9, 0, 0, true, false);
    char pa[128];
    snprintf(pa, sizeof pa, "%s", write_tmp("lf.tsv", a));
    const char *pb = write_tmp("crlf.tsv", b);
    gr_criteo_opts o;
    gr_criteo_opts_default(&o);
    o.batch = 4;
    collected ca, cb;
    gr_criteo_stats sa, sb;
    for (unsigned threads = 0; threads <= 2; threads++) {
        o.threads = threads;
        assert_int_equal(read_all(pa, &o, &ca, &sa), GR_OK);
        assert_int_equal(read_all(pb, &o, &cb, &sb), GR_OK);
        assert_int_equal(ca.n, 9);
        assert_int_equal(cb.n, 9);
        assert_int_equal(sb.lines, 9);
        assert_memory_equal(ca.labels, cb.labels, 9 * sizeof(float));
        assert_memory_equal(ca.dense, cb.dense, 9 * 13 * sizeof(float));
        assert_memory_equal(ca.ids, cb.ids, 9 * 26 * sizeof(uint64_t));
    }
    free(a);
    free(b);
}

static void test_reader_empty(void **state)
{
    (void)state;
    gr_criteo_opts o;
    gr_criteo_opts_default(&o);
    collected c;
    gr_criteo_stats st;
    for (unsigned threads = 0; threads <= 1; threads++) {
        o.threads = threads;
        assert_int_equal(read_all(write_tmp("empty.tsv", ""), &o, &c, &st), GR_OK);
        assert_int_equal(c.n, 0);
        assert_int_equal(st.lines, 0);
        /* Blank lines are ignored, not bad. */
        assert_int_equal(read_all(write_tmp("blank.tsv", "\n\r\n\n"), &o, &c, &st), GR_OK);
        assert_int_equal(c.n, 0);
        assert_int_equal(st.empty_lines, 3);
        assert_int_equal(st.bad_lines, 0);
    }
    gr_criteo_reader *r;
    assert_int_equal(gr_criteo_open("/nonexistent/x.tsv", &o, &r), GR_ENOENT);
    assert_null(r);
    o.batch = 0;
    assert_int_equal(gr_criteo_open(write_tmp("e.tsv", ""), &o, &r), GR_EINVAL);
    gr_criteo_close(NULL);
}

/* One trailing '\r' is a CRLF line end; a second one is part of the last field. The line parser
 * and the reader (whose bad lines go through the schema's parser for a better message) agree:
 * fuzz_criteo found a "...\t\r\r" line the reader took and the line parser refused. */
static void test_double_cr_is_bad(void **state)
{
    (void)state;
    char line[128];
    size_t at = (size_t)snprintf(line, sizeof line, "0");
    for (int f = 0; f < 39; f++) at += (size_t)snprintf(line + at, sizeof line - at, "\t");
    float label, dense[13];
    uint64_t ids[26];
    assert_int_equal(gr_criteo_parse_line(line, at, &label, dense, ids), GR_OK);
    strcpy(line + at, "\r");
    assert_int_equal(gr_criteo_parse_line(line, at + 1, &label, dense, ids), GR_OK);
    strcpy(line + at, "\r\r");
    assert_int_equal(gr_criteo_parse_line(line, at + 2, &label, dense, ids), GR_ECORRUPT);
    char text[300];
    snprintf(text, sizeof text, "%s\n%.*s\r\n", line, (int)at, line);
    gr_criteo_opts o;
    gr_criteo_opts_default(&o);
    o.log_bad = 0;
    collected c;
    gr_criteo_stats st;
    for (unsigned threads = 0; threads <= 1; threads++) {
        o.threads = threads;
        assert_int_equal(read_all(write_tmp("double_cr.tsv", text), &o, &c, &st), GR_OK);
        assert_int_equal(c.n, 1);
        assert_int_equal(st.bad_lines, 1);
    }
}

static void test_split(void **state)
{
    (void)state;
    char *text = build_file(37, 0, 0, false, false);
    const char *path = write_tmp("split.tsv", text);
    gr_criteo_opts o;
    gr_criteo_opts_default(&o);
    o.batch = 8;
    collected all, part;
    gr_criteo_stats st;
    assert_int_equal(read_all(path, &o, &all, &st), GR_OK);
    assert_int_equal(all.n, 37);
    for (unsigned parts = 1; parts <= 5; parts++) {
        uint64_t off[6], first[6];
        assert_int_equal(gr_criteo_split(path, parts, off, first), GR_OK);
        assert_true(off[0] == 0 && first[0] == 1 && off[parts] == strlen(text));
        size_t got = 0;
        for (unsigned k = 0; k < parts; k++) {
            assert_true(off[k] <= off[k + 1]);
            if (off[k]) assert_true(text[off[k] - 1] == '\n');
            o.start = off[k];
            o.end = off[k + 1];
            o.first_line = first[k];
            o.threads = k % 2;
            assert_int_equal(read_all(path, &o, &part, &st), GR_OK);
            assert_memory_equal(part.ids, all.ids + got * 26, part.n * 26 * sizeof(uint64_t));
            got += part.n;
        }
        assert_int_equal(got, 37);
    }
    /* More parts than lines: the extra ranges are empty. */
    uint64_t off[65], first[65];
    const char *small = write_tmp("small.tsv", "a\nb\nc\n");
    assert_int_equal(gr_criteo_split(small, 64, off, first), GR_OK);
    unsigned nonempty = 0;
    for (int k = 0; k < 64; k++) {
        assert_true(off[k] <= off[k + 1]);
        nonempty += off[k + 1] > off[k];
    }
    assert_int_equal(nonempty, 3);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_line),
        cmocka_unit_test(test_parse_bad),
        cmocka_unit_test(test_parse_edges),
        cmocka_unit_test(test_reader_skip_and_strict),
        cmocka_unit_test(test_reader_read_ahead),
        cmocka_unit_test(test_reader_crlf_no_final_newline),
        cmocka_unit_test(test_reader_empty),
        cmocka_unit_test(test_double_cr_is_bad),
        cmocka_unit_test(test_split),
    };
    return cmocka_run_group_tests_name("train_criteo", tests, setup, teardown);
}
