/* `granary train` on files in the wrong format and on files of a user's own schema:
 *  - a CSV file, a header only, an empty file and 39-field lines read as Criteo fail with exit
 *    1 and a message naming the first bad line, before any training;
 *  - a file with some bad lines prints at most 5 of them, one line saying the rest are
 *    counted, and one summary; below --min-valid it fails, above it trains;
 *  - a generated comma-separated file with a header, 4 dense, 3 string categorical and one
 *    '|' list column trains to an AUC well above 0.5 (near the generator's teacher);
 *  - the schema is recorded with the checkpoint, and a resume with another schema is refused.
 * Every run uses the in-process backend or the embedded cluster, with small sizes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/train.h"
#include "support/ps_harness.h"

static char dir[256];
static char out[1 << 16];

static const char *SCHEMA =
    "{\"delimiter\": \",\", \"header\": true, \"columns\": [\n"
    " {\"name\": \"clicked\", \"type\": \"label\"},\n"
    " {\"name\": \"price\", \"type\": \"dense\"},\n"
    " {\"name\": \"age\", \"type\": \"dense\", \"transform\": \"log1p\"},\n"
    " {\"name\": \"views\", \"type\": \"dense\", \"transform\": \"log1p\"},\n"
    " {\"name\": \"score\", \"type\": \"dense\", \"fill\": 0.5},\n"
    " {\"name\": \"user\", \"type\": \"categorical\"},\n"
    " {\"name\": \"item\", \"type\": \"categorical\"},\n"
    " {\"name\": \"category\", \"type\": \"categorical\"},\n"
    " {\"name\": \"recent\", \"type\": \"list\", \"separator\": \"|\", \"pooling\": \"mean\"}]}\n";

static const char *path_of(const char *name)
{
    static char p[8][320];
    static int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static void write_text(const char *name, const char *text)
{
    FILE *f = fopen(path_of(name), "wb");
    assert_non_null(f);
    fwrite(text, 1, strlen(text), f);
    fclose(f);
}

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static int setup(void **state)
{
    (void)state;
    if (ps_test_tmpdir(dir, sizeof dir)) return -1;
    /* A small Criteo data set, and the user's own one (generated for the schema). */
    gr_datagen_opts o = {.train_rows = 20000, .test_rows = 4000, .seed = 3, .threads = 2};
    gr_datagen_result r;
    char sub[300];
    snprintf(sub, sizeof sub, "%s/criteo", dir);
    if (gr_datagen_run(sub, &o, &r)) return -1;
    write_text("schema.json", SCHEMA);
    gr_schema *s = NULL;
    if (gr_schema_load(path_of("schema.json"), &s)) return -1;
    o = (gr_datagen_opts){.train_rows = 60000, .test_rows = 10000, .seed = 5, .threads = 2,
                          .schema = s};
    snprintf(sub, sizeof sub, "%s/own", dir);
    int rc = gr_datagen_run(sub, &o, &r);
    gr_schema_destroy(s);
    return rc ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    ps_test_rmdir(dir);
    return 0;
}

/* `granary train --train FILE --local` (with more args) into `out`; its exit status. */
static int train(const char *file, const char *const *more)
{
    const char *args[32] = {"train", "--train", file, "--local", "--progress", "0",
                            "--batch", "256", "--workers", "2", "--dim", "8", "--bottom", "16",
                            "--top", "16"};
    int n = 16;
    for (; more && *more; more++) args[n++] = *more;
    args[n] = NULL;
    return ps_test_run_granary(args, out, sizeof out);
}

static void expect_failure(const char *name, const char *want)
{
    int rc = train(path_of(name), NULL);
    if (rc != 1 || !strstr(out, want)) fprintf(stderr, "%s: rc %d\n%s\n", name, rc, out);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, want));
    /* Refused before training: no result line, no AUC of an untrained model. */
    assert_null(strstr(out, "auc "));
    assert_null(strstr(out, "train: done"));
}

static void test_wrong_format_files_fail(void **state)
{
    (void)state;
    /* The user's CSV read as Criteo (the default), 3000 lines. */
    char csv[300];
    snprintf(csv, sizeof csv, "own/train.csv");
    expect_failure(csv, "has 1 field, expected 40 (the line has commas");
    expect_failure(csv, "none of the first ");  /* the probe reads 4 MiB of the 6 MB */
    /* A header only. */
    write_text("header.tsv", "label\tI1\tI2\tI3\tI4\tI5\tI6\tI7\tI8\tI9\tI10\tI11\tI12\tI13\tC1\tC2\t"
                             "C3\tC4\tC5\tC6\tC7\tC8\tC9\tC10\tC11\tC12\tC13\tC14\tC15\tC16\tC17\tC18\t"
                             "C19\tC20\tC21\tC22\tC23\tC24\tC25\tC26\n");
    expect_failure("header.tsv", "header.tsv: none of its 1 line is a valid example (first: line 1: "
                                 "field 1 (label): label must be 0 or 1: 'label')");
    /* Empty. */
    write_text("empty.tsv", "");
    expect_failure("empty.tsv", "empty.tsv has no examples: it is empty");
    /* 39 fields: the Criteo file with its last column cut. */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cut -f1-39 %s/criteo/train.tsv > %s/f39.tsv", dir, dir);
    assert_int_equal(system(cmd), 0);
    expect_failure("f39.tsv", "(first: line 1: has 39 fields, expected 40)");
    /* A good training file with a test file in the wrong format fails before training too. */
    const char *more[] = {"--test", path_of("own/test.csv"), NULL};
    int rc = train(path_of("criteo/train.tsv"), more);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "own/test.csv: none of its"));
    assert_null(strstr(out, "train: done"));
}

/* Every 25th (4 %) or 5th (20 %) line of the Criteo file replaced by a CSV line. */
static void write_with_bad(const char *name, int every)
{
    char src[320], *text = NULL;
    snprintf(src, sizeof src, "%s/criteo/train.tsv", dir);
    assert_int_equal(gr_read_file(src, &text, NULL), 0);
    FILE *f = fopen(path_of(name), "wb");
    assert_non_null(f);
    int line = 0;
    for (char *p = text, *q; *p; p = q + 1, line++) {
        q = strchr(p, '\n');
        if (line % every == 0)
            fprintf(f, "garbage,%d,x\n", line);
        else
            fwrite(p, 1, (size_t)(q - p + 1), f);
    }
    fclose(f);
    free(text);
}

static void test_bad_lines_logged_once_and_counted(void **state)
{
    (void)state;
    /* 4 % bad with 2 workers over shared chunks (the 5 warnings per chunk): 5 printed in
     * all, one line for the rest, one summary; the run succeeds. */
    write_with_bad("bad4.tsv", 25);
    const char *shared[] = {"--data", "shared", NULL};
    int rc = train(path_of("bad4.tsv"), shared);
    if (rc) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    assert_int_equal(count(out, "skipping bad line"), 5);
    assert_int_equal(count(out, "more bad lines are skipped without a message"), 1);
    assert_int_equal(count(out, "800 of 20000 lines were bad and skipped (4.00%); the first: line 1: "
                                "has 1 field, expected 40"), 1);
    /* 20 % bad: below the default share (0.9), the run fails after its summary... */
    write_with_bad("bad20.tsv", 5);
    rc = train(path_of("bad20.tsv"), NULL);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "only 16000 of 20000 lines (80.00%) are valid examples, fewer than "
                                "the share required (--min-valid 0.9)"));
    /* ... and a lower share lets it train. */
    const char *lower[] = {"--min-valid", "0.75", NULL};
    rc = train(path_of("bad20.tsv"), lower);
    assert_int_equal(rc, 0);
    assert_int_equal(count(out, "skipping bad line"), 5);
    const char *bad[] = {"--min-valid", "1.5", NULL};
    assert_int_equal(train(path_of("bad20.tsv"), bad), 2);
}

static double metric(const char *file, const char *key)
{
    char *txt = NULL;
    assert_int_equal(gr_read_file(file, &txt, NULL), 0);
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    assert_non_null(j);
    double v = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(j, key));
    cJSON_Delete(j);
    return v;
}

static void test_own_schema_learns(void **state)
{
    (void)state;
    double teacher = metric(path_of("own/oracle.json"), "teacher_auc");
    assert_true(teacher > 0.65);
    for (int model = 0; model < 2; model++) {
        const char *more[] = {"--schema", path_of("schema.json"), "--test", path_of("own/test.csv"),
                              "--model", model ? "lr" : "dlrm", "--metrics-out",
                              path_of("m.json"), NULL};
        int rc = train(path_of("own/train.csv"), more);
        if (rc) fprintf(stderr, "%s\n", out);
        assert_int_equal(rc, 0);
        assert_int_equal(count(out, "skipping bad line"), 0);
        double auc = metric(path_of("m.json"), "auc");
        fprintf(stderr, "own schema, %s: AUC %.4f (teacher %.4f)\n", model ? "lr" : "dlrm", auc,
                teacher);
        /* Well above chance, and most of the way to what the data allows. */
        /* LR has no interactions: it gets the per-id and dense part of the teacher only. */
        assert_true(auc > 0.5 + (model ? 0.4 : 0.75) * (teacher - 0.5));
        assert_int_equal((int)metric(path_of("m.json"), "examples"), 60000);
    }
}

/* The newest checkpoint's user.json under root, parsed. */
static cJSON *newest_meta(const char *root)
{
    DIR *d = opendir(root);
    assert_non_null(d);
    char best[256] = "";
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "step-", 5) && strcmp(e->d_name, best) > 0)
            snprintf(best, sizeof best, "%s", e->d_name);
    closedir(d);
    assert_true(best[0]);
    char p[600], *txt = NULL;
    snprintf(p, sizeof p, "%s/%s/user.json", root, best);
    assert_int_equal(gr_read_file(p, &txt, NULL), 0);
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    assert_non_null(j);
    return j;
}

static void test_schema_in_checkpoint(void **state)
{
    (void)state;
    char root[320]; /* path_of's buffers rotate: keep this one */
    snprintf(root, sizeof root, "%s", path_of("ck"));
    const char *args[] = {"train", "--train", path_of("own/train.csv"), "--schema",
                          path_of("schema.json"), "--shards", "2", "--workers", "1",
                          "--batch", "512", "--dim", "4", "--bottom", "8", "--top", "8",
                          "--progress", "0", "--max-steps", "20", "--ckpt-dir", root, NULL};
    int rc = ps_test_run_granary(args, out, sizeof out);
    if (rc) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    cJSON *meta = newest_meta(root);
    char *txt = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(meta, "schema"));
    cJSON_Delete(meta);
    assert_non_null(txt);
    gr_schema *saved = NULL, *given = NULL;
    assert_int_equal(gr_schema_parse(txt, strlen(txt), &saved), GR_OK);
    free(txt);
    assert_int_equal(gr_schema_load(path_of("schema.json"), &given), GR_OK);
    assert_true(gr_schema_equal(saved, given));
    gr_schema_destroy(saved);
    gr_schema_destroy(given);
    /* Resuming with another schema of the same shapes (a column renamed: other feature ids)
     * is refused; with the same one it goes on. */
    char *other = NULL;
    assert_int_equal(gr_read_file(path_of("schema.json"), &other, NULL), 0);
    memcpy(strstr(other, "\"user\""), "\"buyr\"", 6);
    write_text("other.json", other);
    free(other);
    const char *wrong[] = {"train", "--train", path_of("own/train.csv"), "--schema",
                           path_of("other.json"), "--shards", "2", "--workers", "1", "--batch",
                           "512", "--dim", "4", "--bottom", "8", "--top", "8", "--progress", "0",
                           "--max-steps", "30", "--resume", root, NULL};
    rc = ps_test_run_granary(wrong, out, sizeof out);
    if (rc != 1 || !strstr(out, "another schema")) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "was trained on files read with another schema than this run's"));
    /* Another shape (Criteo's 13 dense and 26 sparse) is refused by the shards with a hint. */
    char criteo[320];
    snprintf(criteo, sizeof criteo, "%s", path_of("criteo/train.tsv"));
    wrong[2] = criteo;
    wrong[3] = "--dim";
    wrong[4] = "4";
    rc = ps_test_run_granary(wrong, out, sizeof out);
    if (rc != 1 || !strstr(out, "--schema")) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "another --schema or model shape"));
    const char *same[] = {"train", "--train", path_of("own/train.csv"), "--schema",
                          path_of("schema.json"), "--shards", "2", "--workers", "1", "--batch",
                          "512", "--dim", "4", "--bottom", "8", "--top", "8", "--progress", "0",
                          "--max-steps", "30", "--resume", root, NULL};
    rc = ps_test_run_granary(same, out, sizeof out);
    if (rc) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "resumed from"));
    /* `granary eval` reads the test file with the model's schema (from the checkpoint); a
     * --schema that is not the model's is refused, its own is fine. */
    char test[320], schema[320], other_path[320];
    snprintf(test, sizeof test, "%s", path_of("own/test.csv"));
    snprintf(schema, sizeof schema, "%s", path_of("schema.json"));
    snprintf(other_path, sizeof other_path, "%s", path_of("other.json"));
    const char *ev[] = {"eval", "--model", root, "--test", test, "--json", NULL, NULL, NULL};
    rc = ps_test_run_granary(ev, out, sizeof out);
    if (rc) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "\"examples\":10000"));
    ev[6] = "--schema";
    ev[7] = schema;
    assert_int_equal(ps_test_run_granary(ev, out, sizeof out), 0);
    ev[7] = other_path;
    assert_int_equal(ps_test_run_granary(ev, out, sizeof out), 1);
    assert_non_null(strstr(out, "is not the schema the model was trained with"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wrong_format_files_fail),
        cmocka_unit_test(test_bad_lines_logged_once_and_counted),
        cmocka_unit_test(test_own_schema_learns),
        cmocka_unit_test(test_schema_in_checkpoint),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
