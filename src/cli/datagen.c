/* `granary datagen`: writes synthetic train/test files (Criteo layout, or any layout a schema
 * gives) with a planted teacher and the teacher's own test metrics (oracle.json), the ceiling
 * a trained model can reach. */
#include "cli/cli.h"
#include "cli/opts.h"
#include "granary/train.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* --stream: rows to stdout, paced to about `rate` per second in steps of 10 ms; a reader that
 * goes away (EPIPE) ends it quietly with status 0. */
static int stream_rows(uint64_t seed, double drift, uint64_t rate, uint64_t max_rows)
{
    gr_datagen_stream *s;
    if (gr_datagen_stream_create(seed, drift, &s)) {
        fprintf(stderr, "granary datagen: %s\n", gr_errmsg());
        return 2;
    }
    static char buf[1 << 16];
    size_t len = 0;
    double t0 = gr_now_s();
    int status = 0;
    for (;;) {
        uint64_t made = gr_datagen_stream_rows(s);
        if (max_rows && made >= max_rows) break;
        if (rate) {
            double due = t0 + (double)made / (double)rate;
            double now = gr_now_s();
            if (due > now) {
                if (len && write(1, buf, len) < 0) break;
                len = 0;
                struct timespec ts = {0, (long)((due - now > 0.01 ? 0.01 : due - now) * 1e9)};
                nanosleep(&ts, NULL);
                continue;
            }
        }
        len += gr_datagen_stream_next(s, buf + len, NULL, NULL);
        if (len > sizeof buf - GR_DATAGEN_ROW_MAX) {
            ssize_t w = 0;
            for (size_t off = 0; off < len; off += (size_t)w)
                if ((w = write(1, buf + off, len - off)) < 0 && errno != EINTR) break;
            if (w < 0) break; /* EPIPE: the reader went away */
            len = 0;
        }
    }
    if (len && write(1, buf, len) < 0 && errno != EPIPE) status = 1;
    gr_datagen_stream_destroy(s);
    return status;
}

/* Every option of `granary datagen`, declared once (also the keys of --config FILE). */
#define DATAGEN_OPTIONS(X)                                                                     \
    X(DO_OUT, "out", GR_CLI_STR, "out", 0, 0, NULL, "DIR", NULL, "output directory; required")  \
    X(DO_TRAIN_ROWS, "train-rows", GR_CLI_INT, "train_rows", 0, 1e15, NULL, "N", NULL,          \
      "training rows to write; required")                                                      \
    X(DO_TEST_ROWS, "test-rows", GR_CLI_INT, "test_rows", 0, 1e15, NULL, "M", NULL,             \
      "test rows to write; required")                                                          \
    X(DO_SEED, "seed", GR_CLI_INT, "seed", 0, 9007199254740992.0, NULL, "S", "1",              \
      "the teacher's and the data's seed")                                                     \
    X(DO_THREADS, "threads", GR_CLI_INT, "threads", 1, 64, NULL, "T", "2", "generator threads") \
    X(DO_SCHEMA, "schema", GR_CLI_STR, "schema", 0, 0, NULL, "FILE", NULL,                      \
      "write files of this layout (docs/data.md); default: Criteo TSV")                        \
    X(DO_STREAM, "stream", GR_CLI_FLAG, "stream", 0, 0, NULL, NULL, NULL,                        \
      "write an endless stream of rows to stdout instead (until killed or the\n"              \
      "reader goes away; --out and the row counts are not used)")                              \
    X(DO_RATE, "rate", GR_CLI_INT, "rate", 0, 1e9, NULL, "N", "0",                             \
      "--stream: about N rows per second (0 = as fast as possible)")                          \
    X(DO_DRIFT, "drift", GR_CLI_NUM, "drift", 0, 1000, NULL, "D", "0",                         \
      "--stream: the teacher's weights turn D radians per 100000 rows")                       \
    X(DO_ROWS, "rows", GR_CLI_INT, "rows", 0, 1e15, NULL, "N", "0",                            \
      "--stream: stop after N rows (0 = never)")

enum { DATAGEN_OPTIONS(GR_CLI_ENUM) DO_COUNT };
static const gr_cli_opt datagen_opts[] = {DATAGEN_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec datagen_spec = {
    .command = "datagen",
    .synopsis = "granary datagen --out DIR --train-rows N --test-rows M [--seed S] [--threads T]\n"
                "                      [--schema FILE]\n"
                "       granary datagen --stream [--rate N] [--drift D] [--rows N] [--seed S]",
    .opts = datagen_opts,
    .n_opts = DO_COUNT,
    .config_section = "",
    .epilog = "Writes DIR/train.tsv, DIR/test.tsv (label, 13 integer, 26 hex fields, tab-separated)\n"
              "and DIR/oracle.json (the teacher's test AUC and logloss, rows, seed, positive rate).\n"
              "With --schema: files of that layout (train.csv/test.csv when comma-delimited).\n"
              "Output depends only on the schema, the seed and row counts.\n",
};

int gr_cli_datagen(int argc, char **argv)
{
    gr_cli_value v[DO_COUNT];
    gr_cli_parsed p;
    int exit_now = gr_cli_parse_or_exit(&datagen_spec, argc, argv, v, &p);
    if (exit_now >= 0) {
        gr_cli_parsed_fini(&p);
        return exit_now;
    }
    if (v[DO_STREAM].b && v[DO_SCHEMA].s) {
        fprintf(stderr, "granary datagen: --stream writes the Criteo layout only; drop --schema\n");
        gr_cli_parsed_fini(&p);
        return 2;
    }
    if (v[DO_STREAM].b) {
        int st = stream_rows((uint64_t)v[DO_SEED].i, v[DO_DRIFT].d, (uint64_t)v[DO_RATE].i,
                             (uint64_t)v[DO_ROWS].i);
        gr_cli_parsed_fini(&p);
        return st;
    }
    const char *out = v[DO_OUT].s;
    if (!out || !v[DO_TRAIN_ROWS].given || !v[DO_TEST_ROWS].given) {
        fprintf(stderr, "granary datagen: --out, --train-rows and --test-rows are required (see "
                        "granary datagen --help)\n");
        gr_cli_parsed_fini(&p);
        return 2;
    }
    gr_schema *schema = NULL;
    if (v[DO_SCHEMA].s && gr_schema_load(v[DO_SCHEMA].s, &schema)) {
        fprintf(stderr, "granary datagen: --schema: %s\n", gr_errmsg());
        gr_cli_parsed_fini(&p);
        return 2;
    }
    gr_datagen_opts o = {.train_rows = (uint64_t)v[DO_TRAIN_ROWS].i,
                         .test_rows = (uint64_t)v[DO_TEST_ROWS].i,
                         .seed = (uint64_t)v[DO_SEED].i,
                         .threads = (unsigned)v[DO_THREADS].i,
                         .schema = schema};
    gr_datagen_result r;
    int rc = gr_datagen_run(out, &o, &r);
    gr_schema_destroy(schema);
    if (rc) {
        fprintf(stderr, "granary datagen: %s: %s\n", gr_strerror(rc), gr_errmsg());
        gr_cli_parsed_fini(&p);
        return 1;
    }
    fprintf(stderr,
            "granary datagen: %llu train + %llu test rows in %.2f s (%.0f rows/s) -> %s/{%s,%s}\n"
            "  positive rate train %.4f test %.4f; teacher test AUC %.4f logloss %.4f "
            "(constant predictor %.4f)\n",
            (unsigned long long)r.train_rows, (unsigned long long)r.test_rows, r.seconds,
            (double)(r.train_rows + r.test_rows) / (r.seconds > 0 ? r.seconds : 1e-9), out,
            r.train_file, r.test_file,
            r.train_positive_rate, r.test_positive_rate, r.teacher_auc, r.teacher_logloss,
            r.base_logloss);
    gr_cli_parsed_fini(&p);
    return 0;
}
