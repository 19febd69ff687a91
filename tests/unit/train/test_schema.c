/* Unit tests for data schemas: every schema error names what was wrong; lines are parsed as
 * the schema says (labels in float syntax, floats, missing values, string/int/hex ids, lists
 * with their bags, header lines, CRLF); ids depend on the column's name, not its position;
 * the JSON round-trips; the streaming reader gives the same batches with and without threads;
 * models take any number of dense and sparse inputs. */
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
#include "train/trainer_int.h" /* tr_bags: the pooling under test */

static char tmpdir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/gr_schema_XXXXXX");
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

static gr_schema *must_parse(const char *json)
{
    gr_schema *s = NULL;
    int rc = gr_schema_parse(json, strlen(json), &s);
    if (rc) fprintf(stderr, "unexpected: %s\n", gr_errmsg());
    assert_int_equal(rc, GR_OK);
    return s;
}

/* The schema must be refused with a message holding `want`. */
static void refused(const char *json, int code, const char *want)
{
    gr_schema *s = NULL;
    int rc = gr_schema_parse(json, strlen(json), &s);
    if (rc != code || !strstr(gr_errmsg(), want))
        fprintf(stderr, "schema %s\n  gave %d '%s', wanted %d '%s'\n", json, rc, gr_errmsg(), code,
                want);
    assert_int_equal(rc, code);
    assert_non_null(strstr(gr_errmsg(), want));
    assert_null(s);
}

static void test_schema_errors(void **state)
{
    (void)state;
    refused("{\"columns\": [{\"name\": \"y\", \"type\": \"label\"}, {\"name\": \"x\", \"type\": "
            "\"float\"}]}", GR_EINVAL, "type must be one of ignore, label, dense, categorical, list");
    refused("{\"columns\": [{\"name\": \"x\", \"type\": \"dense\"}]}", GR_EINVAL, "no label column");
    refused("{\"columns\": [{\"name\": \"y\", \"type\": \"label\"}, {\"name\": \"z\", \"type\": "
            "\"label\"}, {\"name\": \"x\", \"type\": \"dense\"}]}", GR_EINVAL, "2 label columns");
    refused("{\"columns\": [{\"name\": \"y\", \"type\": \"label\"}, {\"name\": \"x\", \"type\": "
            "\"dense\"}, {\"name\": \"x\", \"type\": \"categorical\"}]}", GR_EINVAL,
            "duplicate column name 'x' (columns 2 and 3)");
    /* Bad separators: the delimiter itself, more than one character, none at all, a line end. */
    refused("{\"delimiter\": \",\", \"columns\": [{\"name\": \"y\", \"type\": \"label\"}, {\"name\": "
            "\"l\", \"type\": \"list\", \"separator\": \",\"}]}", GR_EINVAL,
            "column 'l': its separator ',' is the file's delimiter");
    refused("{\"columns\": [{\"name\": \"y\", \"type\": \"label\"}, {\"name\": \"l\", \"type\": "
            "\"list\", \"separator\": \"||\"}]}", GR_EINVAL, "column l: separator '||' must be one character");
    refused("{\"columns\": [{\"name\": \"y\", \"type\": \"label\"}, {\"name\": \"l\", \"type\": "
            "\"list\"}]}", GR_EINVAL, "column 'l' is a list: it needs a \"separator\"");
    refused("{\"columns\": [{\"name\": \"y\", \"type\": \"label\"}, {\"name\": \"l\", \"type\": "
            "\"list\", \"separator\": \"\\n\"}]}", GR_EINVAL, "must be one character other than a line end");
    refused("{\"delimiter\": \"\\n\", \"columns\": [{\"name\": \"y\", \"type\": \"label\"}]}",
            GR_EINVAL, "delimiter");
    /* Keys: unknown ones, and ones of another type. */
    refused("{\"delimeter\": \",\", \"columns\": []}", GR_EINVAL, "unknown key \"delimeter\"");
    refused("{\"columns\": [{\"name\": \"y\", \"type\": \"label\"}, {\"name\": \"x\", \"type\": "
            "\"dense\", \"pooling\": \"mean\"}]}", GR_EINVAL,
            "column 'x': key \"pooling\" does not apply to a dense column");
    refused("{\"columns\": [{\"name\": \"y\", \"type\": \"label\"}, {\"name\": \"x\", \"type\": "
            "\"dense\", \"scale\": 2}]}", GR_EINVAL, "column 'x': unknown key \"scale\"");
    refused("{\"columns\": [{\"name\": \"y\", \"type\": \"label\"}, {\"name\": \"l\", \"type\": "
            "\"list\", \"separator\": \"|\", \"max_items\": 0}]}", GR_EINVAL, "max_items must be");
    refused("{\"columns\": [{\"name\": \"y\", \"type\": \"label\"}, {\"name\": \"c\", \"type\": "
            "\"categorical\", \"encoding\": \"base64\"}]}", GR_EINVAL, "encoding must be one of");
    refused("{\"columns\": [{\"name\": \"y\", \"type\": \"label\"}]}", GR_EINVAL, "no feature column");
    refused("{\"columns\": [{\"type\": \"label\"}]}", GR_EINVAL, "column 1 has no \"name\"");
    refused("{\"columns\": [{\"name\": \"y\"}]}", GR_EINVAL, "column 'y' has no \"type\"");
    refused("{\"columns\": ", GR_ECORRUPT, "not valid JSON");
    refused("[1, 2]", GR_EINVAL, "must be an object");
    refused("{\"builtin\": \"avazu\"}", GR_EINVAL, "unknown builtin 'avazu'");
    /* A missing file names its path. */
    gr_schema *s = NULL;
    assert_int_not_equal(gr_schema_load("/nonexistent/schema.json", &s), GR_OK);
    assert_non_null(strstr(gr_errmsg(), "/nonexistent/schema.json"));
}

static const char *FULL =
    "{\"delimiter\": \",\", \"header\": true, \"columns\": ["
    "{\"name\": \"y\", \"type\": \"label\"},"
    "{\"name\": \"price\", \"type\": \"dense\"},"
    "{\"name\": \"count\", \"type\": \"dense\", \"transform\": \"log1p\", \"fill\": -1},"
    "{\"name\": \"user\", \"type\": \"categorical\"},"
    "{\"name\": \"item\", \"type\": \"categorical\", \"encoding\": \"int\"},"
    "{\"name\": \"skip\", \"type\": \"ignore\"},"
    "{\"name\": \"h\", \"type\": \"categorical\", \"encoding\": \"hex\"},"
    "{\"name\": \"recent\", \"type\": \"list\", \"separator\": \"|\", \"pooling\": \"mean\", "
    "\"max_items\": 3}]}";

typedef struct parsed {
    float label, dense[2];
    uint64_t ids[6];
    uint32_t bags[4];
    size_t n;
    int rc;
} parsed;

static parsed parse(const gr_schema *s, const char *line)
{
    parsed p;
    memset(&p, 0, sizeof p);
    p.rc = gr_schema_parse_line(s, line, strlen(line), &p.label, p.dense, p.ids, p.bags, &p.n);
    return p;
}

static uint64_t fid(const gr_schema *s, uint32_t slot, const char *text)
{
    uint64_t id = 0;
    assert_int_equal(gr_schema_feature_id(s, slot, text, strlen(text), &id), GR_OK);
    return id;
}

static void test_parse_lines(void **state)
{
    (void)state;
    gr_schema *s = must_parse(FULL);
    assert_int_equal(gr_schema_n_columns(s), 8);
    assert_int_equal(gr_schema_n_dense(s), 2);
    assert_int_equal(gr_schema_n_sparse(s), 4);
    assert_int_equal(gr_schema_max_ids(s), 3 + 3);
    assert_true(gr_schema_has_lists(s));
    assert_int_equal(gr_schema_delimiter(s), ',');

    parsed p = parse(s, "1.0,2.5e1,3,alice,007,whatever,0xFF,a|b||c\r");
    assert_int_equal(p.rc, GR_OK);
    assert_true(p.label == 1.0f);
    assert_true(p.dense[0] == 25.0f);
    assert_float_equal(p.dense[1], log1p(3.0), 1e-6);
    assert_int_equal(p.n, 6);
    assert_true(p.ids[0] == fid(s, 0, "alice"));
    /* Integers and hex of any spelling of the same value are the same id. */
    assert_true(p.ids[1] == fid(s, 1, "7"));
    assert_true(p.ids[1] == fid(s, 1, "+0007"));
    assert_true(p.ids[2] == fid(s, 2, "ff"));
    assert_true(p.ids[2] == fid(s, 2, "00Ff"));
    assert_true(p.ids[3] == fid(s, 3, "a") && p.ids[4] == fid(s, 3, "b") && p.ids[5] == fid(s, 3, "c"));
    assert_int_equal(p.bags[0], 1);
    assert_int_equal(p.bags[3], 3);
    /* The same text in two columns is two ids; an empty value is the column's missing id. */
    assert_true(fid(s, 0, "a") != fid(s, 3, "a"));
    assert_true(fid(s, 0, "") != fid(s, 0, "0"));

    /* Missing values: empty dense -> fill (0 by default, -1 for count), empty id, empty list. */
    p = parse(s, "0,,  ,,,,,");
    assert_int_equal(p.rc, GR_OK);
    assert_true(p.label == 0.0f && p.dense[0] == 0.0f && p.dense[1] == -1.0f);
    assert_int_equal(p.n, 4);
    assert_true(p.ids[0] == fid(s, 0, ""));
    assert_true(p.ids[3] == fid(s, 3, ""));
    assert_int_equal(p.bags[3], 1);
    /* A list keeps its first max_items items; integers of any width; negative zero. */
    p = parse(s, "1,0,0,u,123456789012345678901234567890,,1,x|y|z|w");
    assert_int_equal(p.rc, GR_OK);
    assert_int_equal(p.bags[3], 3);
    assert_true(p.ids[1] == fid(s, 1, "0123456789012345678901234567890"));
    assert_true(fid(s, 1, "-0") == fid(s, 1, "0"));
    assert_true(fid(s, 1, "-5") != fid(s, 1, "5"));

    /* Bad lines name the column and what was wrong. */
    static const struct {
        const char *line, *want;
    } bad[] = {
        {"2,0,0,u,1,,1,x", "column 1 'y' (label): the label must be 0 or 1: '2'"},
        {"yes,0,0,u,1,,1,x", "the label must be 0 or 1"},
        {",0,0,u,1,,1,x", "the label must be 0 or 1"},
        {"1,abc,0,u,1,,1,x", "column 2 'price' (dense): not a number: 'abc'"},
        {"1,inf,0,u,1,,1,x", "not a number: 'inf'"},
        {"1,1e400,0,u,1,,1,x", "not a number"},
        {"1,0,0,u,1.5,,1,x", "column 5 'item' (categorical): not an integer: '1.5'"},
        {"1,0,0,u,1,,fg,x", "not hex"},
        {"1,0,0,u,1,,1", "has 7 fields, expected 8"},
        {"1,0,0,u,1,,1,x,extra", "has 9 fields, expected 8"},
        {"1\t0\t0\tu\t1\t\t1\tx", "has 1 field, expected 8 (the line has tabs"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = parse(s, bad[i].line);
        if (p.rc != GR_ECORRUPT || !strstr(gr_errmsg(), bad[i].want))
            fprintf(stderr, "line '%s': %d '%s', wanted '%s'\n", bad[i].line, p.rc, gr_errmsg(),
                    bad[i].want);
        assert_int_equal(p.rc, GR_ECORRUPT);
        assert_non_null(strstr(gr_errmsg(), bad[i].want));
    }
    gr_schema_destroy(s);
}

/* A column's ids come from its name: adding a column elsewhere keeps them. */
static void test_ids_follow_names(void **state)
{
    (void)state;
    gr_schema *a = must_parse("{\"columns\": [{\"name\": \"y\", \"type\": \"label\"}, {\"name\": "
                              "\"user\", \"type\": \"categorical\"}]}");
    gr_schema *b = must_parse("{\"columns\": [{\"name\": \"y\", \"type\": \"label\"}, {\"name\": "
                              "\"site\", \"type\": \"categorical\"}, {\"name\": \"user\", \"type\": "
                              "\"categorical\"}]}");
    assert_true(fid(a, 0, "u42") == fid(b, 1, "u42"));
    assert_true(fid(a, 0, "") == fid(b, 1, ""));
    assert_true(fid(b, 0, "u42") != fid(b, 1, "u42"));
    gr_schema_destroy(a);
    gr_schema_destroy(b);
}

static void test_json_round_trip_and_criteo(void **state)
{
    (void)state;
    gr_schema *s = must_parse(FULL);
    char *txt = gr_schema_to_json(s);
    assert_non_null(txt);
    gr_schema *t = must_parse(txt);
    assert_true(gr_schema_equal(s, t));
    gr_schema *c = NULL;
    assert_int_equal(gr_schema_clone(s, &c), GR_OK);
    assert_true(gr_schema_equal(s, c));
    assert_true(fid(c, 3, "q") == fid(s, 3, "q"));
    free(txt);
    gr_schema_destroy(t);
    gr_schema_destroy(c);
    /* Another fill is another schema. */
    t = must_parse("{\"columns\": [{\"name\": \"y\", \"type\": \"label\"}, {\"name\": \"x\", \"type\": "
                   "\"dense\", \"fill\": 1}]}");
    assert_false(gr_schema_equal(s, t));
    gr_schema_destroy(t);
    gr_schema_destroy(s);

    /* The built-in Criteo schema: its JSON names it, and its ids are Criteo's. */
    const gr_schema *cr = gr_schema_criteo();
    assert_true(gr_schema_is_criteo(cr));
    assert_int_equal(gr_schema_n_dense(cr), GR_CRITEO_DENSE);
    assert_int_equal(gr_schema_n_sparse(cr), GR_CRITEO_SPARSE);
    txt = gr_schema_to_json(cr);
    assert_non_null(strstr(txt, "\"builtin\":\t\"criteo\""));
    t = must_parse(txt);
    assert_true(t == cr);
    free(txt);
    assert_int_equal(gr_schema_load("criteo", &t), GR_OK);
    assert_true(t == cr);
    gr_schema_destroy(t); /* a no-op */
    assert_true(fid(cr, 3, "00ab") == gr_criteo_feature_id(3, 0xab));
    assert_true(fid(cr, 3, "") == gr_criteo_missing_id(3));
    /* A Criteo line read through the schema gives what the Criteo parser gives. */
    char line[512];
    size_t at = (size_t)sprintf(line, "1");
    for (int f = 1; f < GR_CRITEO_FIELDS; f++)
        at += (size_t)sprintf(line + at, f <= GR_CRITEO_DENSE ? "\t%d" : "\t%x", f * 7);
    float l1, l2, d1[GR_CRITEO_DENSE], d2[GR_CRITEO_DENSE];
    uint64_t i1[GR_CRITEO_SPARSE], i2[GR_CRITEO_SPARSE];
    uint32_t bags[GR_CRITEO_SPARSE];
    size_t n;
    assert_int_equal(gr_criteo_parse_line(line, at, &l1, d1, i1), GR_OK);
    assert_int_equal(gr_schema_parse_line(cr, line, at, &l2, d2, i2, bags, &n), GR_OK);
    assert_int_equal(n, GR_CRITEO_SPARSE);
    assert_memory_equal(d1, d2, sizeof d1);
    assert_memory_equal(i1, i2, sizeof i1);
    /* A CSV line read as Criteo says what is likely wrong. */
    assert_int_equal(gr_schema_parse_line(cr, "1,2,3", 5, &l2, d2, i2, bags, &n), GR_ECORRUPT);
    assert_non_null(strstr(gr_errmsg(), "has 1 field, expected 40 (the line has commas"));
}

/* Reads a whole file with a reader: every batch's labels, ids and bag offsets appended. */
typedef struct dump {
    float labels[64], dense[128];
    uint64_t ids[256];
    uint32_t off[256];
    size_t n, n_ids, noff;
} dump;

static void read_all(const char *path, const gr_schema *s, unsigned threads, size_t block, dump *d,
                     gr_criteo_stats *st)
{
    memset(d, 0, sizeof *d);
    gr_criteo_opts o;
    gr_criteo_opts_default(&o);
    o.batch = 3;
    o.threads = threads;
    o.block_bytes = block;
    o.schema = s;
    gr_criteo_reader *r;
    assert_int_equal(gr_criteo_open(path, &o, &r), GR_OK);
    gr_batch b;
    assert_int_equal(gr_batch_init_schema(&b, 3, s), GR_OK);
    for (;;) {
        assert_int_equal(gr_criteo_next(r, &b), GR_OK);
        if (b.n == 0) break;
        memcpy(d->labels + d->n, b.labels, b.n * sizeof *b.labels);
        memcpy(d->dense + d->n * 2, b.dense, b.n * 2 * sizeof *b.dense);
        memcpy(d->ids + d->n_ids, b.ids, b.n_ids * sizeof *b.ids);
        for (size_t t = 0; t < b.n * b.n_sparse; t++)
            d->off[d->noff++] = b.bag_off[t + 1] - b.bag_off[t];
        assert_int_equal(b.bag_off[b.n * b.n_sparse], b.n_ids);
        d->n += b.n;
        d->n_ids += b.n_ids;
    }
    gr_criteo_get_stats(r, st);
    gr_batch_fini(&b);
    gr_criteo_close(r);
}

static void test_reader_with_lists_and_header(void **state)
{
    (void)state;
    gr_schema *s = must_parse(FULL);
    /* A header, 7 examples with lists of 0..3 items, one bad line, one empty line. */
    const char *path = write_tmp("lists.csv",
                                 "y,price,count,user,item,skip,h,recent\n"
                                 "1,1,1,a,1,,1,x\n"
                                 "0,2,2,b,2,,2,x|y\n"
                                 "1,3,3,c,3,,3,\n"
                                 "bad line\n"
                                 "0,4,4,d,4,,4,p|q|r\n"
                                 "\n"
                                 "1,5,5,e,5,,5,p|q|r|s|t\n"
                                 "0,6,6,f,6,,6,|z|\n"
                                 "1,7,7,g,7,,7,k");
    dump d0, d2;
    gr_criteo_stats st0, st2;
    read_all(path, s, 0, 1 << 20, &d0, &st0);
    read_all(path, s, 2, 64, &d2, &st2);
    assert_int_equal(d0.n, 7);
    assert_int_equal(st0.bad_lines, 1);
    assert_int_equal(st0.first_bad_line, 5);
    assert_int_equal(st0.empty_lines, 2); /* the header and the empty line */
    /* Bags: recent has 1, 2, 1 (empty -> missing id), 3, 3 (cut), 1, 1 ids. */
    static const uint32_t recent[7] = {1, 2, 1, 3, 3, 1, 1};
    for (size_t i = 0; i < 7; i++) {
        assert_int_equal(d0.off[i * 4 + 0], 1);
        assert_int_equal(d0.off[i * 4 + 3], recent[i]);
        assert_true(d0.dense[i * 2] == (float)(i + 1));
    }
    assert_int_equal(d0.n_ids, 7 * 3 + 12);
    /* Threads and tiny blocks change nothing. */
    assert_int_equal(d2.n, d0.n);
    assert_int_equal(d2.n_ids, d0.n_ids);
    assert_memory_equal(d0.labels, d2.labels, sizeof d0.labels);
    assert_memory_equal(d0.dense, d2.dense, sizeof d0.dense);
    assert_memory_equal(d0.ids, d2.ids, sizeof d0.ids);
    assert_memory_equal(d0.off, d2.off, sizeof d0.off);
    assert_int_equal(st2.bad_lines, 1);
    /* A batch made for another schema is refused. */
    gr_criteo_opts o;
    gr_criteo_opts_default(&o);
    o.schema = s;
    gr_criteo_reader *r;
    assert_int_equal(gr_criteo_open(path, &o, &r), GR_OK);
    gr_batch b;
    assert_int_equal(gr_batch_init(&b, 4), GR_OK);
    assert_int_equal(gr_criteo_next(r, &b), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "another schema"));
    gr_batch_fini(&b);
    gr_criteo_close(r);
    gr_schema_destroy(s);
}

/* Counts bad lines as the reader reports them. */
static void count_bad(void *ctx, const char *path, uint64_t line, const char *why)
{
    (void)path;
    (void)why;
    uint64_t *c = ctx;
    c[0]++;
    c[1] = line;
}

static void test_on_bad_callback(void **state)
{
    (void)state;
    const char *path = write_tmp("csv_as_criteo.tsv", "1,2,3\n4,5,6\n7,8,9\n");
    uint64_t seen[2] = {0, 0};
    gr_criteo_opts o;
    gr_criteo_opts_default(&o);
    o.on_bad = count_bad;
    o.on_bad_ctx = seen;
    gr_criteo_reader *r;
    assert_int_equal(gr_criteo_open(path, &o, &r), GR_OK);
    gr_batch b;
    assert_int_equal(gr_batch_init(&b, 8), GR_OK);
    assert_int_equal(gr_criteo_next(r, &b), GR_OK);
    assert_int_equal(b.n, 0);
    assert_int_equal(seen[0], 3);
    assert_int_equal(seen[1], 3);
    gr_criteo_stats st;
    gr_criteo_get_stats(r, &st);
    assert_int_equal(st.bad_lines, 3);
    assert_non_null(strstr(st.first_bad_msg, "the line has commas"));
    gr_batch_fini(&b);
    gr_criteo_close(r);
}

static void test_model_shapes(void **state)
{
    (void)state;
    gr_schema *s = must_parse(FULL);
    gr_model_config c;
    gr_model_config_default(&c, GR_MODEL_DLRM);
    c.schema = s;
    gr_model *m = NULL;
    assert_int_equal(gr_model_create(&c, &m), GR_OK);
    gr_schema_destroy(s); /* the model keeps its own copy */
    assert_int_equal(gr_model_n_dense(m), 2);
    assert_int_equal(gr_model_n_sparse(m), 4);
    assert_int_equal(gr_schema_n_sparse(gr_model_schema(m)), 4);
    /* bottom 2-64-32-16, then 16 + C(5, 2) = 26 inputs to the top MLP. */
    size_t want = (2 * 64 + 64) + (64 * 32 + 32) + (32 * 16 + 16) + (26 * 128 + 128) +
                  (128 * 64 + 64) + (64 * 1 + 1);
    assert_int_equal(gr_model_dense_size(m), want);
    /* A forward/backward pass over the shapes: finite loss, gradients where the inputs are. */
    gr_model_ws *ws;
    assert_int_equal(gr_model_ws_create(m, &ws), GR_OK);
    size_t n = 5, np = gr_model_dense_size(m);
    float *p = malloc(np * sizeof *p), *g = malloc(np * sizeof *g);
    float dense[5 * 2], emb[5 * 4 * 16], gemb[5 * 4 * 16], labels[5] = {1, 0, 1, 0, 1}, probs[5];
    gr_model_init_dense(m, p);
    for (size_t i = 0; i < sizeof dense / sizeof *dense; i++) dense[i] = (float)i * 0.1f;
    for (size_t i = 0; i < sizeof emb / sizeof *emb; i++) emb[i] = (float)((i * 37) % 11) * 0.01f;
    double loss = 0;
    assert_int_equal(gr_model_train_step(m, ws, p, n, dense, emb, labels, &loss, probs, g, gemb),
                     GR_OK);
    assert_true(isfinite(loss) && loss > 0);
    double gsum = 0;
    for (size_t i = 0; i < sizeof gemb / sizeof *gemb; i++) gsum += fabs(gemb[i]);
    assert_true(gsum > 0);
    free(p);
    free(g);
    gr_model_ws_destroy(ws);
    gr_model_destroy(m);
    /* Shapes that contradict the schema, and DLRM without a dense input, are refused. */
    s = must_parse(FULL);
    c.schema = s;
    c.n_dense = 13;
    assert_int_equal(gr_model_create(&c, &m), GR_EINVAL);
    gr_schema_destroy(s);
    s = must_parse("{\"columns\": [{\"name\": \"y\", \"type\": \"label\"}, {\"name\": \"c\", "
                   "\"type\": \"categorical\"}]}");
    c.schema = s;
    c.n_dense = 0;
    assert_int_equal(gr_model_create(&c, &m), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "--model lr"));
    gr_model_config_default(&c, GR_MODEL_LR);
    c.schema = s;
    assert_int_equal(gr_model_create(&c, &m), GR_OK);
    assert_int_equal(gr_model_dense_size(m), 1);
    gr_model_destroy(m);
    gr_schema_destroy(s);
}

/* The example schema docs/data.md shows parses (tests run from the repository's root). */
static void test_example_schema(void **state)
{
    (void)state;
    gr_schema *s = NULL;
    int rc = gr_schema_load("examples/schema.json", &s);
    if (rc) fprintf(stderr, "%s\n", gr_errmsg());
    assert_int_equal(rc, GR_OK);
    assert_int_equal(gr_schema_n_dense(s), 4);
    assert_int_equal(gr_schema_n_sparse(s), 4);
    assert_true(gr_schema_has_lists(s));
    assert_true(gr_schema_header(s));
    gr_schema_destroy(s);
}

/* The gradient that tr_bags_scatter gives each id's row matches a finite difference of the
 * model's loss through tr_bags_gather: sum and mean bags, a repeated id, a categorical id. */
static void test_bag_gradients(void **state)
{
    (void)state;
    gr_schema *s = must_parse("{\"columns\": [{\"name\": \"y\", \"type\": \"label\"}, "
                              "{\"name\": \"x\", \"type\": \"dense\"}, {\"name\": \"c\", \"type\": "
                              "\"categorical\"}, {\"name\": \"s\", \"type\": \"list\", \"separator\": "
                              "\"|\"}, {\"name\": \"m\", \"type\": \"list\", \"separator\": \"|\", "
                              "\"pooling\": \"mean\"}]}");
    const char *lines[] = {"1\t0.5\ta\tp|q|p\tu|v", "0\t-1\tb\tq\tu|u|w", "1\t2\ta\t\tv"};
    gr_batch b;
    assert_int_equal(gr_batch_init_schema(&b, 3, s), GR_OK);
    b.n = 0;
    b.n_ids = 0;
    b.bag_off[0] = 0;
    for (int i = 0; i < 3; i++) {
        uint32_t bags[3];
        size_t n;
        assert_int_equal(gr_schema_parse_line(s, lines[i], strlen(lines[i]), &b.labels[i],
                                              &b.dense[i], b.ids + b.n_ids, bags, &n), GR_OK);
        for (int k = 0; k < 3; k++) b.bag_off[i * 3 + k + 1] = b.bag_off[i * 3 + k] + bags[k];
        b.n_ids += n;
        b.n++;
    }
    assert_int_equal(b.n_ids, 6 + 5 + 3); /* an empty list is its missing id */
    tr_bags g;
    assert_int_equal(tr_bags_init(&g, s), GR_OK);
    assert_true(g.on);
    gr_model_config c;
    gr_model_config_default(&c, GR_MODEL_DLRM);
    c.dim = 4;
    c.schema = s;
    gr_model *m;
    assert_int_equal(gr_model_create(&c, &m), GR_OK);
    gr_model_ws *ws;
    assert_int_equal(gr_model_ws_create(m, &ws), GR_OK);
    size_t np = gr_model_dense_size(m);
    float *p = malloc(np * sizeof *p), *gd = malloc(np * sizeof *gd);
    gr_model_init_dense(m, p);
    uint64_t uniq[16];
    uint32_t inv[16];
    gr_dedup_scratch ds = {0};
    long nu = gr_dedup(b.ids, b.n_ids, uniq, inv, &ds);
    assert_true(nu > 0 && nu <= 16);
    double rows[16 * 4];
    float rowsf[16 * 4], emb[3 * 3 * 4], gemb[3 * 3 * 4], grad[16 * 4];
    for (int i = 0; i < nu * 4; i++) rows[i] = 0.3 * sin(1.7 * i + 0.4);
    double loss;
    /* The loss at the rows, and the analytic gradient per unique row. */
    for (int i = 0; i < nu * 4; i++) rowsf[i] = (float)rows[i];
    tr_bags_gather(&g, &b, rowsf, inv, 4, emb);
    assert_int_equal(gr_model_train_step(m, ws, p, 3, b.dense, emb, b.labels, &loss, NULL, gd, gemb),
                     GR_OK);
    tr_bags_scatter(&g, &b, gemb, inv, (size_t)nu, 4, grad);
    const double eps = 1e-2;
    for (int i = 0; i < nu * 4; i++) {
        double lp, lm;
        for (int sign = 0; sign < 2; sign++) {
            for (int k = 0; k < nu * 4; k++) rowsf[k] = (float)(rows[k] + (k == i ? (sign ? -eps : eps) : 0));
            tr_bags_gather(&g, &b, rowsf, inv, 4, emb);
            assert_int_equal(gr_model_train_step(m, ws, p, 3, b.dense, emb, b.labels,
                                                 sign ? &lm : &lp, NULL, gd, gemb), GR_OK);
        }
        double fd = (lp - lm) / (2 * eps);
        if (fabs(fd - grad[i]) > 2e-3 + 0.05 * fabs(fd))
            fprintf(stderr, "row %d k %d: finite difference %.6f, scattered %.6f\n", i / 4, i % 4, fd,
                    grad[i]);
        assert_true(fabs(fd - grad[i]) <= 2e-3 + 0.05 * fabs(fd));
    }
    gr_dedup_scratch_fini(&ds);
    free(p);
    free(gd);
    gr_model_ws_destroy(ws);
    gr_model_destroy(m);
    tr_bags_fini(&g);
    gr_batch_fini(&b);
    gr_schema_destroy(s);
}

/* Generated files for a schema: a header, the schema's delimiter, bytes that depend on the seed
 * and not on the thread count, every line valid. */
static void test_datagen_schema(void **state)
{
    (void)state;
    gr_schema *s = must_parse(FULL);
    char d1[160], d2[160], d3[160];
    snprintf(d1, sizeof d1, "%s/g1", tmpdir);
    snprintf(d2, sizeof d2, "%s/g2", tmpdir);
    snprintf(d3, sizeof d3, "%s/g3", tmpdir);
    gr_datagen_opts o = {.train_rows = 20000, .test_rows = 3000, .seed = 9, .threads = 1, .schema = s};
    gr_datagen_result r;
    assert_int_equal(gr_datagen_run(d1, &o, &r), GR_OK);
    assert_string_equal(r.train_file, "train.csv");
    assert_true(r.teacher_auc > 0.6);
    o.threads = 3;
    assert_int_equal(gr_datagen_run(d2, &o, &r), GR_OK);
    o.seed = 10;
    assert_int_equal(gr_datagen_run(d3, &o, &r), GR_OK);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cmp -s %s/train.csv %s/train.csv && cmp -s %s/test.csv %s/test.csv",
             d1, d2, d1, d2);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "cmp -s %s/train.csv %s/train.csv", d1, d3);
    assert_int_not_equal(system(cmd), 0);
    char path[300], *text = NULL;
    snprintf(path, sizeof path, "%s/train.csv", d1);
    assert_int_equal(gr_read_file(path, &text, NULL), 0);
    assert_true(!strncmp(text, "y,price,count,user,item,skip,h,recent\n", 38));
    free(text);
    gr_criteo_stats st;
    snprintf(path, sizeof path, "%s/test.csv", d1);
    /* Read in full through the reader: every generated line is valid. */
    gr_criteo_opts ro;
    gr_criteo_opts_default(&ro);
    ro.schema = s;
    gr_criteo_reader *rd;
    assert_int_equal(gr_criteo_open(path, &ro, &rd), GR_OK);
    gr_batch b;
    assert_int_equal(gr_batch_init_schema(&b, 1024, s), GR_OK);
    size_t n = 0;
    while (gr_criteo_next(rd, &b) == GR_OK && b.n) n += b.n;
    gr_criteo_get_stats(rd, &st);
    assert_int_equal(n, 3000);
    assert_int_equal(st.bad_lines, 0);
    gr_batch_fini(&b);
    gr_criteo_close(rd);
    gr_schema_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_errors),
        cmocka_unit_test(test_parse_lines),
        cmocka_unit_test(test_ids_follow_names),
        cmocka_unit_test(test_json_round_trip_and_criteo),
        cmocka_unit_test(test_reader_with_lists_and_header),
        cmocka_unit_test(test_on_bad_callback),
        cmocka_unit_test(test_model_shapes),
        cmocka_unit_test(test_example_schema),
        cmocka_unit_test(test_bag_gradients),
        cmocka_unit_test(test_datagen_schema),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
