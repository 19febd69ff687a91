/* Tests for the option framework of the cli (src/cli/opts.c): every kind of bad input is
 * refused with a message naming the flag or config key, values land where the table says,
 * the config file fills what the flags left, and --help lists every option. The last tests
 * run the real `granary server` ($GR_BUILD_DIR/granary) to check its table is wired in. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/opts.h"

#define T_OPTIONS(X)                                                                           \
    X(T_NAME, "name", GR_CLI_STR, "name", 0, 0, NULL, "NAME", NULL, "a name")                   \
    X(T_COUNT, "count", GR_CLI_INT, "count", 1, 100, NULL, NULL, "7", "how many")               \
    X(T_RATE, "rate", GR_CLI_NUM, "rate", 0.5, 2, NULL, NULL, NULL, "a rate")                   \
    X(T_BYTES, "bytes", GR_CLI_SIZE, "bytes", 1, 1 << 20, NULL, NULL, NULL, "a size")           \
    X(T_MODEL, "model", GR_CLI_CHOICE, "model", 0, 0, "lr|dlrm", NULL, "dlrm", "the model")    \
    X(T_FAST, "fast", GR_CLI_FLAG, "fast", 0, 0, NULL, NULL, NULL, "go fast")                   \
    X(T_SECRET, "secret", GR_CLI_STR, NULL, 0, 0, NULL, "F", NULL, "command line only")

enum { T_OPTIONS(GR_CLI_ENUM) T_COUNT_ };
static const gr_cli_opt t_opts[] = {T_OPTIONS(GR_CLI_ROW)};
static const gr_cli_spec t_spec = {"t", "granary t [options] [DIR]", t_opts, T_COUNT_, "t", 1,
                                   NULL};

static gr_cli_value g_v[T_COUNT_];
static gr_cli_parsed g_p;
static char g_cfg[64];

static int teardown(void **state)
{
    (void)state;
    gr_cli_parsed_fini(&g_p);
    if (g_cfg[0]) unlink(g_cfg);
    g_cfg[0] = '\0';
    return 0;
}

/* Parses a NULL-terminated argument list (argv[0] is added). */
static int parse_spec(const gr_cli_spec *spec, const char *const *args)
{
    char *argv[32] = {"t"};
    int argc = 1;
    while (args[argc - 1]) {
        argv[argc] = (char *)args[argc - 1];
        argc++;
    }
    gr_cli_parsed_fini(&g_p);
    FILE *devnull = fopen("/dev/null", "w");
    int rc = gr_cli_parse(spec, argc, argv, g_v, &g_p, devnull);
    fclose(devnull);
    return rc;
}
#define PARSE(...) parse_spec(&t_spec, (const char *const[]){__VA_ARGS__, NULL})

static void expect_bad(int rc, const char *want1, const char *want2)
{
    assert_int_equal(rc, GR_CLI_BAD);
    if (!strstr(g_p.err, want1) || (want2 && !strstr(g_p.err, want2)))
        fail_msg("error '%s' should name '%s' and '%s'", g_p.err, want1, want2 ? want2 : "");
}

static const char *write_cfg(const char *json)
{
    if (g_cfg[0]) unlink(g_cfg);
    snprintf(g_cfg, sizeof g_cfg, "/tmp/gr-opts-XXXXXX");
    int fd = mkstemp(g_cfg);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    return g_cfg;
}

static void test_values_and_defaults(void **state)
{
    (void)state;
    assert_int_equal(PARSE("--name", "x", "--rate=1.25", "--bytes", "4k", "--model", "lr", "--fast",
                           "dir"),
                     GR_CLI_OK);
    assert_string_equal(g_v[T_NAME].s, "x");
    assert_true(g_v[T_NAME].given);
    assert_true(g_v[T_RATE].d == 1.25);
    assert_int_equal(g_v[T_BYTES].u, 4096);
    assert_int_equal(g_v[T_MODEL].i, 0);
    assert_true(g_v[T_FAST].b);
    /* A default is a value, not a given one. */
    assert_int_equal(g_v[T_COUNT].i, 7);
    assert_false(g_v[T_COUNT].given);
    assert_int_equal(g_p.n_args, 1);
    assert_string_equal(g_p.args[0], "dir");
    /* The last of a repeated flag wins. */
    assert_int_equal(PARSE("--count", "3", "--count", "100"), GR_CLI_OK);
    assert_int_equal(g_v[T_COUNT].i, 100);
    assert_int_equal(g_v[T_MODEL].i, 1); /* the default word, dlrm */
    assert_false(g_v[T_FAST].b);
}

static void test_bad_numbers(void **state)
{
    (void)state;
    expect_bad(PARSE("--count", "abc"), "--count", "'abc'");
    expect_bad(PARSE("--count", "12x"), "--count", "'12x'");
    expect_bad(PARSE("--count", ""), "--count", NULL);
    expect_bad(PARSE("--count", "2.5"), "--count", "whole number");
    expect_bad(PARSE("--count", "99999999999999999999999"), "--count", NULL);
    expect_bad(PARSE("--rate", "nan"), "--rate", "'nan'");
    expect_bad(PARSE("--rate", "1e400"), "--rate", NULL);
    expect_bad(PARSE("--rate", "1,5"), "--rate", "'1,5'");
    expect_bad(PARSE("--bytes", "-1"), "--bytes", "'-1'");
    expect_bad(PARSE("--bytes", "4q"), "--bytes", "'4q'");
    expect_bad(PARSE("--model", "xgb"), "--model", "lr|dlrm");
    expect_bad(PARSE("--fast=maybe"), "--fast", "'maybe'");
}

static int run_granary(const char *args, char *out, size_t cap);

/* Every count of every command reads the same way: plain digits, a k/M/G/T suffix (x 1000) or
 * an exponent, as long as the value is whole. */
static void test_count_suffixes(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int64_t want;
    } good[] = {{"10", 10}, {"1k", 1000}, {"10K", 10000}, {"1.5k", 1500}, {"2M", 2000000},
                {"1e6", 1000000}, {"2.5e3", 2500}, {"1G", 1000000000}, {"3T", 3000000000000},
                {"+7", 7}, {"9007199254740993", 9007199254740993}};
    static const gr_cli_opt big = {0, "max-examples", GR_CLI_INT, NULL, 0, 1e18, NULL, NULL,
                                   NULL, ""};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        gr_cli_value v;
        char err[256];
        memset(&v, 0, sizeof v);
        if (gr_cli_set_text(&big, good[i].text, &v, err, sizeof err) != GR_CLI_OK)
            fail_msg("'%s' refused: %s", good[i].text, err);
        assert_int_equal(v.i, good[i].want);
    }
    const char *bad_ones[] = {"1.5", "1.0001k", "k", "1kk", "1m", "0x10", "1e400", "inf", "nan",
                              "1e17", "1 k", "5k5", "1,5k"};
    for (size_t i = 0; i < sizeof bad_ones / sizeof bad_ones[0]; i++) {
        gr_cli_value v;
        char err[256];
        if (gr_cli_set_text(&big, bad_ones[i], &v, err, sizeof err) == GR_CLI_OK)
            fail_msg("'%s' was taken as %lld", bad_ones[i], (long long)v.i);
    }
    /* The range prints in full, not as 1e+18. */
    gr_cli_value v;
    char err[256];
    assert_int_equal(gr_cli_set_text(&big, "x", &v, err, sizeof err), GR_CLI_BAD);
    assert_non_null(strstr(err, "0..1000000000000000000"));
    /* The commands that failed on it before: --max-examples 10k, datagen --train-rows 2k. */
    static char out[16384];
    assert_int_equal(run_granary("train --train /nonexistent --max-examples 10k", out, sizeof out),
                     2);
    assert_null(strstr(out, "--max-examples"));
    assert_non_null(strstr(out, "--train /nonexistent"));
}

static void test_out_of_range(void **state)
{
    (void)state;
    expect_bad(PARSE("--count", "0"), "--count", "1..100");
    expect_bad(PARSE("--count", "101"), "--count", "1..100");
    expect_bad(PARSE("--count", "-5"), "--count", "1..100");
    expect_bad(PARSE("--rate", "0.25"), "--rate", "0.5..2");
    expect_bad(PARSE("--bytes", "2M"), "--bytes", "1..1048576");
    assert_int_equal(PARSE("--count", "1", "--rate", "2", "--bytes", "1M"), GR_CLI_OK);
    assert_int_equal(g_v[T_BYTES].u, 1 << 20);
}

static void test_unknown_missing_extra(void **state)
{
    (void)state;
    expect_bad(PARSE("--nope", "1"), "unknown option --nope", NULL);
    expect_bad(PARSE("-x"), "unknown option -x", NULL);
    expect_bad(PARSE("--count"), "--count needs a value", NULL);
    expect_bad(PARSE("--config"), "--config needs a value", NULL);
    expect_bad(PARSE("a", "b"), "unexpected argument 'b'", NULL);
    /* A prefix of a flag is not the flag. */
    expect_bad(PARSE("--coun", "3"), "unknown option --coun", NULL);
}

static void test_config_file(void **state)
{
    (void)state;
    const char *path = write_cfg("{\"t\": {\"name\": \"fromfile\", \"count\": 9, \"rate\": 0.75,"
                                 " \"bytes\": \"2k\", \"model\": \"lr\", \"fast\": true},"
                                 " \"other\": [1, 2]}");
    /* The flag wins over the file; the file fills the rest. */
    assert_int_equal(PARSE("--config", path, "--count", "4"), GR_CLI_OK);
    assert_int_equal(g_v[T_COUNT].i, 4);
    assert_string_equal(g_v[T_NAME].s, "fromfile");
    assert_true(g_v[T_NAME].given);
    assert_true(g_v[T_RATE].d == 0.75);
    assert_int_equal(g_v[T_BYTES].u, 2048);
    assert_int_equal(g_v[T_MODEL].i, 0);
    assert_true(g_v[T_FAST].b);
    assert_non_null(g_p.config);
    assert_string_equal(g_p.config_path, path);
    /* A plain number is a size in bytes too. */
    write_cfg("{\"t\": {\"bytes\": 100}}");
    assert_int_equal(PARSE("--config=" "/dev/null"), GR_CLI_BAD); /* empty: not JSON */
    assert_int_equal(PARSE("--config", g_cfg), GR_CLI_OK);
    assert_int_equal(g_v[T_BYTES].u, 100);
}

static void test_config_file_errors(void **state)
{
    (void)state;
    write_cfg("{\"t\": {\"cuont\": 3}}");
    expect_bad(PARSE("--config", g_cfg), "unknown option \"cuont\"", NULL);
    unlink(g_cfg);
    write_cfg("{\"t\": {\"count\": \"3\"}}");
    expect_bad(PARSE("--config", g_cfg), "\"count\" must be a number", NULL);
    unlink(g_cfg);
    write_cfg("{\"t\": {\"count\": 3.5}}");
    expect_bad(PARSE("--config", g_cfg), "\"count\" must be a whole number", NULL);
    unlink(g_cfg);
    write_cfg("{\"t\": {\"count\": 1000}}");
    expect_bad(PARSE("--config", g_cfg), "\"count\"", "1..100");
    unlink(g_cfg);
    write_cfg("{\"t\": {\"fast\": 1}}");
    expect_bad(PARSE("--config", g_cfg), "\"fast\" must be true or false", NULL);
    unlink(g_cfg);
    /* A command-line-only option has no config key. */
    write_cfg("{\"t\": {\"secret\": \"x\"}}");
    expect_bad(PARSE("--config", g_cfg), "unknown option \"secret\"", NULL);
    unlink(g_cfg);
    write_cfg("{\"t\": [1]}");
    expect_bad(PARSE("--config", g_cfg), "\"t\" must be an object", NULL);
    unlink(g_cfg);
    write_cfg("[1, 2]");
    expect_bad(PARSE("--config", g_cfg), "is not a JSON object", NULL);
    expect_bad(PARSE("--config", "/nonexistent/gr.json"), "--config", "/nonexistent/gr.json");
}

static void test_config_top_level(void **state)
{
    (void)state;
    gr_cli_spec top = t_spec;
    top.config_section = "";
    write_cfg("{\"count\": 12, \"model\": \"lr\"}");
    assert_int_equal(parse_spec(&top, (const char *const[]){"--config", g_cfg, NULL}), GR_CLI_OK);
    assert_int_equal(g_v[T_COUNT].i, 12);
    unlink(g_cfg);
    write_cfg("{\"count\": 12, \"tables\": []}");
    expect_bad(parse_spec(&top, (const char *const[]){"--config", g_cfg, NULL}), "\"tables\"", NULL);
    /* A command without a config section has no --config flag. */
    top.config_section = NULL;
    expect_bad(parse_spec(&top, (const char *const[]){"--config", g_cfg, NULL}),
               "unknown option --config", NULL);
}

static void test_help_lists_every_option(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    char *argv[] = {"t", "--count", "3", "--help", NULL};
    assert_int_equal(gr_cli_parse(&t_spec, 4, argv, g_v, &g_p, f), GR_CLI_HELP);
    fclose(f);
    assert_non_null(strstr(buf, "usage: granary t [options] [DIR]"));
    for (size_t i = 0; i < T_COUNT_; i++) {
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", t_opts[i].name);
        if (!strstr(buf, flag)) fail_msg("--help does not list %s:\n%s", flag, buf);
        if (!strstr(buf, t_opts[i].help)) fail_msg("--help lacks the help of %s", flag);
        if (t_opts[i].json_key) {
            char key[64];
            snprintf(key, sizeof key, "config \"%s\"", t_opts[i].json_key);
            if (!strstr(buf, key)) fail_msg("--help does not name config key of %s", flag);
        }
    }
    assert_non_null(strstr(buf, "--config FILE"));
    assert_non_null(strstr(buf, "default 7"));
    assert_non_null(strstr(buf, "1..100"));
    free(buf);
}

static void test_table_id_mismatch_is_caught(void **state)
{
    (void)state;
    gr_cli_opt rows[2] = {t_opts[0], t_opts[1]};
    rows[1].id = 5;
    gr_cli_spec s = {"t", "t", rows, 2, NULL, 0, NULL};
    expect_bad(parse_spec(&s, (const char *const[]){NULL}), "--count is row 1 but has id 5", NULL);
}

/* Runs build/granary with args; returns its exit status and its stdout+stderr in out. */
static int run_granary(const char *args, char *out, size_t cap)
{
    const char *dir = getenv("GR_BUILD_DIR");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/granary %s 2>&1", dir && *dir ? dir : "build", args);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_server_uses_the_table(void **state)
{
    (void)state;
    static char out[16384];
    assert_int_equal(run_granary("server --help", out, sizeof out), 0);
    const char *flags[] = {"--listen", "--shard ", "--shards", "--threads", "--auth-file",
                           "--insecure", "--ckpt-root", "--max-connections", "--max-body",
                           "--max-keys", "--max-tables", "--max-inflight-bytes", "--config"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strstr(out, flags[i])) fail_msg("server --help lacks %s:\n%s", flags[i], out);
    assert_int_equal(run_granary("server --listen 127.0.0.1:0 --shards 0", out, sizeof out), 2);
    assert_non_null(strstr(out, "granary server: --shards must be in 1..16384, got 0"));
    assert_int_equal(run_granary("server --listen 127.0.0.1:0 --threads 2x", out, sizeof out), 2);
    assert_non_null(strstr(out, "--threads wants a whole number"));
    assert_int_equal(run_granary("server --listen 127.0.0.1:0 --max-body", out, sizeof out), 2);
    assert_non_null(strstr(out, "--max-body needs a value"));
}

static void test_other_commands_use_tables(void **state)
{
    (void)state;
    static char out[16384];
    assert_int_equal(run_granary("datagen --help", out, sizeof out), 0);
    assert_non_null(strstr(out, "--train-rows N"));
    assert_non_null(strstr(out, "config \"test_rows\""));
    assert_int_equal(run_granary("datagen --out /tmp/x --train-rows 1 --test-rows 1 --threads 65",
                                 out, sizeof out), 2);
    assert_non_null(strstr(out, "granary datagen: --threads must be in 1..64, got 65"));
    assert_int_equal(run_granary("datagen --out /tmp/x --train-rows 1.5e0 --test-rows 1", out,
                                 sizeof out), 2);
    assert_non_null(strstr(out, "--train-rows wants a whole number"));
    assert_int_equal(run_granary("stats --server", out, sizeof out), 2);
    assert_non_null(strstr(out, "granary stats: --server needs a value"));
    assert_int_equal(run_granary("stats --serve 127.0.0.1:1", out, sizeof out), 2);
    assert_non_null(strstr(out, "unknown option --serve"));
    assert_int_equal(run_granary("ckpt reshard /tmp --shards 2 --out /tmp/y --zstd 20", out,
                                 sizeof out), 2);
    assert_non_null(strstr(out, "granary ckpt: --zstd must be in 0..19, got 20"));
    assert_int_equal(run_granary("ckpt retain /tmp --keep -1", out, sizeof out), 2);
    assert_non_null(strstr(out, "--keep must be in 0..4294967295, got -1"));
    assert_int_equal(run_granary("ckpt inspect /tmp /tmp", out, sizeof out), 2);
    assert_non_null(strstr(out, "unexpected argument '/tmp'"));
}

/* --straggler W:F is read by hand (two numbers in one value): each half must end where it
 * should. strtod once overwrote strtoul's end pointer, so "3x:3" ran as worker 3. */
static void test_train_straggler_is_checked(void **state)
{
    (void)state;
    static char out[16384];
    const char *bad[] = {"3x:3", "3:3x", "3", ":3", "3:", "-1:3", " 3:3", "3: 3", "3:0.5",
                         "3:nan", "3:inf", "256:2", "3:1001", "x:3", "3::3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[128];
        snprintf(args, sizeof args, "train --straggler '%s'", bad[i]);
        int rc = run_granary(args, out, sizeof out);
        char want[160];
        snprintf(want, sizeof want,
                 "granary train: --straggler wants WORKER:FACTOR, a worker in 0..255 and a factor "
                 "in 1..1000 (e.g. 3:3), got '%s'", bad[i]);
        if (rc != 2 || !strstr(out, want))
            fail_msg("--straggler '%s': exit %d, '%s'; wanted exit 2 and '%s'", bad[i], rc, out,
                     want);
    }
    /* A well-formed value passes the straggler check and stops at the next (no --train). */
    const char *good[] = {"3:3", "0:1", "255:1000", "2:1.5", "3:1e3"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char args[128];
        snprintf(args, sizeof args, "train --straggler '%s'", good[i]);
        assert_int_equal(run_granary(args, out, sizeof out), 2);
        if (!strstr(out, "--train FILE is required"))
            fail_msg("--straggler '%s' should be accepted, got '%s'", good[i], out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_values_and_defaults, teardown),
        cmocka_unit_test_teardown(test_bad_numbers, teardown),
        cmocka_unit_test_teardown(test_out_of_range, teardown),
        cmocka_unit_test(test_count_suffixes),
        cmocka_unit_test_teardown(test_unknown_missing_extra, teardown),
        cmocka_unit_test_teardown(test_config_file, teardown),
        cmocka_unit_test_teardown(test_config_file_errors, teardown),
        cmocka_unit_test_teardown(test_config_top_level, teardown),
        cmocka_unit_test_teardown(test_help_lists_every_option, teardown),
        cmocka_unit_test_teardown(test_table_id_mismatch_is_caught, teardown),
        cmocka_unit_test(test_server_uses_the_table),
        cmocka_unit_test(test_other_commands_use_tables),
        cmocka_unit_test(test_train_straggler_is_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
