/* `granary datagen`: writes synthetic Criteo-layout train/test files with a planted teacher
 * and the teacher's own test metrics (oracle.json), the ceiling a trained model can reach. */
#include "cli/cli.h"
#include "granary/train.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: granary datagen --out DIR --train-rows N --test-rows M [--seed S]\n"
            "                       [--threads T]\n"
            "Writes DIR/train.tsv, DIR/test.tsv (label, 13 integer, 26 hex fields, tab-separated)\n"
            "and DIR/oracle.json (the teacher's test AUC and logloss, rows, seed, positive rate).\n"
            "Output depends only on the seed and row counts. Defaults: seed 1, threads 2.\n");
}

static int parse_u64(const char *opt, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || errno || s[0] == '-') {
        fprintf(stderr, "granary datagen: %s wants a non-negative integer, got '%s'\n", opt, s);
        return -1;
    }
    *out = v;
    return 0;
}

int gr_cli_datagen(int argc, char **argv)
{
    static const struct option opts[] = {
        {"out", required_argument, NULL, 'o'},        {"train-rows", required_argument, NULL, 'n'},
        {"test-rows", required_argument, NULL, 'm'},  {"seed", required_argument, NULL, 's'},
        {"threads", required_argument, NULL, 't'},    {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *out = NULL;
    gr_datagen_opts o = {.seed = 1, .threads = 2};
    bool have_train = false, have_test = false;
    uint64_t v;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'n':
            if (parse_u64("--train-rows", optarg, &o.train_rows)) return 2;
            have_train = true;
            break;
        case 'm':
            if (parse_u64("--test-rows", optarg, &o.test_rows)) return 2;
            have_test = true;
            break;
        case 's':
            if (parse_u64("--seed", optarg, &o.seed)) return 2;
            break;
        case 't':
            if (parse_u64("--threads", optarg, &v)) return 2;
            if (v < 1 || v > 64) {
                fprintf(stderr, "granary datagen: --threads must be 1..64\n");
                return 2;
            }
            o.threads = (unsigned)v;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "granary datagen: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!out || !have_train || !have_test) {
        fprintf(stderr, "granary datagen: --out, --train-rows and --test-rows are required\n");
        usage(stderr);
        return 2;
    }
    gr_datagen_result r;
    int rc = gr_datagen_run(out, &o, &r);
    if (rc) {
        fprintf(stderr, "granary datagen: %s: %s\n", gr_strerror(rc), gr_errmsg());
        return 1;
    }
    fprintf(stderr,
            "granary datagen: %llu train + %llu test rows in %.2f s (%.0f rows/s) -> %s\n"
            "  positive rate train %.4f test %.4f; teacher test AUC %.4f logloss %.4f "
            "(constant predictor %.4f)\n",
            (unsigned long long)r.train_rows, (unsigned long long)r.test_rows, r.seconds,
            (double)(r.train_rows + r.test_rows) / (r.seconds > 0 ? r.seconds : 1e-9), out,
            r.train_positive_rate, r.test_positive_rate, r.teacher_auc, r.teacher_logloss,
            r.base_logloss);
    return 0;
}
