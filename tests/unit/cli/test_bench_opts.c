/* Tests that every `granary bench` subcommand reads its options from its table (in bench/):
 * --help lists each flag, and a malformed number, an out-of-range value, a missing value or an
 * unknown flag is refused with exit 2 and a message naming the flag, before any benchmark work
 * starts (so these stay fast). Also the checked readers of a child's output (bench/util.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "bench/bench.h"

/* Runs build/granary with args; returns its exit status and its stdout+stderr in out. */
static int run_granary(const char *args, char *out, size_t cap)
{
    const char *dir = getenv("GR_BUILD_DIR");
    char cmd[1024];
    /* A refused option exits at once; the timeout only bounds a regression that would start
     * the benchmark instead. */
    snprintf(cmd, sizeof cmd, "timeout 20 %s/granary %s 2>&1", dir && *dir ? dir : "build", args);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void expect_refused(const char *args, const char *want)
{
    static char out[16384];
    int rc = run_granary(args, out, sizeof out);
    if (rc != 2 || !strstr(out, want))
        fail_msg("granary %s: exit %d, output '%s'; wanted exit 2 and '%s'", args, rc, out, want);
}

static void expect_help_lists(const char *bench, const char *const *flags)
{
    static char out[16384];
    char args[64];
    snprintf(args, sizeof args, "bench %s --help", bench);
    assert_int_equal(run_granary(args, out, sizeof out), 0);
    for (size_t i = 0; flags[i]; i++) {
        char want[64];
        snprintf(want, sizeof want, "\n  %s", flags[i]);
        if (!strstr(out, want)) fail_msg("bench %s --help lacks %s:\n%s", bench, flags[i], out);
    }
}

static void test_ps(void **state)
{
    (void)state;
    expect_help_lists("ps", (const char *const[]){"--json", "--full", "--batches B", "--rounds R",
                                                  "--inflight K", "--threads T", "--vocab V",
                                                  "--no-baselines", NULL});
    expect_refused("bench ps --batches 3x", "granary bench ps: --batches wants a whole number");
    expect_refused("bench ps --rounds 0", "granary bench ps: --rounds must be in 1..1000, got 0");
    expect_refused("bench ps --inflight 65", "--inflight must be in 1..64, got 65");
    expect_refused("bench ps --threads -1", "--threads must be in 1..256, got -1");
    expect_refused("bench ps --vocab 10Q", "--vocab wants a whole number");
    expect_refused("bench ps --vocab -1", "--vocab must be in 1..1099511627776, got -1");
    expect_refused("bench ps --rounds", "--rounds needs a value");
    expect_refused("bench ps --no-baseline", "unknown option --no-baseline");
}

static void test_torch(void **state)
{
    (void)state;
    expect_help_lists("torch", (const char *const[]){"--json", "--rows N", "--test-rows M",
                                                     "--data DIR", "--threads T", "--workers W",
                                                     "--torch-workers W", "--granary-workers W",
                                                     NULL});
    expect_refused("bench torch --torch-workers 65", "--torch-workers must be in 0..64, got 65");
    expect_refused("bench torch --rows 10x", "granary bench torch: --rows wants a whole number");
    expect_refused("bench torch --threads 0", "--threads must be in 1..256, got 0");
    expect_refused("bench torch --workers 65", "--workers must be in 1..64, got 65");
    expect_refused("bench torch --data", "--data needs a value");
    expect_refused("bench torch --shards 2", "unknown option --shards");
}

static void test_ckpt(void **state)
{
    (void)state;
    expect_help_lists("ckpt", (const char *const[]){"--json", "--full", "--rows N", "--zstd L",
                                                    "--dir PATH", "--keep", NULL});
    expect_refused("bench ckpt --zstd 3x", "granary bench ckpt: --zstd wants a whole number");
    expect_refused("bench ckpt --zstd 20", "--zstd must be in 0..19, got 20");
    expect_refused("bench ckpt --rows 0", "--rows must be in 1..4294967295");
    expect_refused("bench ckpt --rows 2Mx", "--rows wants a whole number");
    expect_refused("bench ckpt --dir", "--dir needs a value");
    expect_refused("bench ckpt --kep", "unknown option --kep");
}

static void test_soak(void **state)
{
    (void)state;
    expect_help_lists("soak", (const char *const[]){"--minutes N", "--json", NULL});
    /* atof read "1m" as 1 and "abc" as 0 before. */
    expect_refused("bench soak --minutes 1m", "granary bench soak: --minutes wants a number");
    expect_refused("bench soak --minutes abc", "--minutes wants a number");
    expect_refused("bench soak --minutes 0", "--minutes must be in 0.001..1440, got 0");
    expect_refused("bench soak --minutes 1441", "--minutes must be in 0.001..1440, got 1441");
    expect_refused("bench soak --minutes nan", "--minutes wants a number");
    expect_refused("bench soak --hours 1", "unknown option --hours");
}

static void test_train(void **state)
{
    (void)state;
    expect_help_lists("train", (const char *const[]){"--json", "--full", "--rows N",
                                                     "--test-rows M", "--no-torch",
                                                     "--delay-us D", "--skip-link",
                                                     "--skip-straggler", "--rounds R", NULL});
    expect_refused("bench train --rows 1.5e0", "granary bench train: --rows wants a whole number");
    expect_refused("bench train --rounds 0", "--rounds must be in 1..20, got 0");
    expect_refused("bench train --rounds 21", "--rounds must be in 1..20, got 21");
    expect_refused("bench train --test-rows 0", "--test-rows must be in 1..");
    expect_refused("bench train --delay-us 0", "--delay-us must be in 1..10000000, got 0");
    expect_refused("bench train --delay-us 20000000", "--delay-us must be in 1..10000000");
    expect_refused("bench train --delay-us", "--delay-us needs a value");
    expect_refused("bench train --torch", "unknown option --torch");
}

static void test_table(void **state)
{
    (void)state;
    expect_help_lists("table", (const char *const[]){"--json", "--full", "--rows N",
                                                     "--batches B", "--threads T", "--repeat R",
                                                     "--only", "--wide", NULL});
    expect_refused("bench table --threads 65", "granary bench table: --threads must be in 1..64");
    expect_refused("bench table --only gather", "--only wants one of all|lookup");
}

static void test_parse_port(void **state)
{
    (void)state;
    uint16_t port = 7;
    assert_int_equal(gr_bench_parse_port("41234\n", &port), 0);
    assert_int_equal(port, 41234);
    assert_int_equal(gr_bench_parse_port("1", &port), 0);
    assert_int_equal(port, 1);
    assert_int_equal(gr_bench_parse_port("5000,127.0.0.1:5001", &port), 0);
    assert_int_equal(port, 5000);
    /* atoi took each of these as some port (or 0, or a wrapped one). */
    const char *bad[] = {"", "0", "65536", "70000", "-1", " 80", "80x", "8o", "\n", "80 \n", NULL};
    for (size_t i = 0; bad[i]; i++) {
        port = 7;
        if (gr_bench_parse_port(bad[i], &port) != -1 || port != 7)
            fail_msg("port '%s' should be refused and leave the port alone", bad[i]);
    }
}

static void test_parse_double(void **state)
{
    (void)state;
    double x = -5;
    assert_int_equal(gr_bench_parse_double("4629.5, \"auc\": 0.77", &x), 0);
    assert_true(x == 4629.5);
    assert_int_equal(gr_bench_parse_double("0.7749}\n", &x), 0);
    assert_true(x == 0.7749);
    x = -5;
    /* strtod with a NULL end pointer turned each of these into 0 (or inf). */
    assert_int_equal(gr_bench_parse_double("null", &x), -1);
    assert_int_equal(gr_bench_parse_double("", &x), -1);
    assert_int_equal(gr_bench_parse_double("inf", &x), -1);
    assert_int_equal(gr_bench_parse_double("1e999", &x), -1);
    assert_true(x == -5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ps),           cmocka_unit_test(test_ckpt),
        cmocka_unit_test(test_soak),         cmocka_unit_test(test_train),
        cmocka_unit_test(test_table),        cmocka_unit_test(test_parse_port),
        cmocka_unit_test(test_parse_double), cmocka_unit_test(test_torch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
