/* bench train's rounds (bench/train_rounds.c): a fresh `granary train` run's figures, and the
 * median of the rounds' speed ratios. */
#include "bench/train_int.h"
#include "granary/train.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

static const char *granary_bin(char *buf, size_t cap)
{
    const char *dir = getenv("GR_BUILD_DIR");
    snprintf(buf, cap, "%s/granary", dir && *dir ? dir : "build");
    return buf;
}

/* granary train in a child: its metrics file's figures come back; a run that fails (no such
 * files) says so, with its exit status, and gives no figure. */
static void test_cli_train(void **state)
{
    (void)state;
    char dir[] = "/tmp/gr_test_rounds_XXXXXX", exe[PATH_MAX], why[320] = "";
    assert_non_null(mkdtemp(dir));
    gr_datagen_opts go = {.train_rows = 40000, .test_rows = 4000, .seed = 5, .threads = 2};
    gr_datagen_result gd;
    assert_int_equal(gr_datagen_run(dir, &go, &gd), 0);
    gr_bench_cli_args a = {.no_direct = false, .dense_lag = -1};
    double eps = 0, auc = 0;
    int rc = gr_bench_cli_train(granary_bin(exe, sizeof exe), dir, &a, &eps, &auc, why, sizeof why);
    if (rc) fail_msg("granary train in a child: %s", why);
    assert_true(eps > 0);
    assert_true(auc > 0.6 && auc < 1.0);
    /* The same with --no-direct and a dense lag given. */
    a = (gr_bench_cli_args){.no_direct = true, .dense_lag = 0};
    eps = auc = 0;
    rc = gr_bench_cli_train(exe, dir, &a, &eps, &auc, why, sizeof why);
    if (rc) fail_msg("granary train --no-direct --dense-lag 0 in a child: %s", why);
    assert_true(eps > 0 && auc > 0.6);
    /* No files: the child fails, and nothing is reported as a figure. */
    char missing[PATH_MAX + 16];
    snprintf(missing, sizeof missing, "%s/none", dir);
    eps = auc = 0;
    assert_int_equal(gr_bench_cli_train(exe, missing, &a, &eps, &auc, why, sizeof why), -1);
    assert_true(eps == -1 && auc == -1);
    assert_non_null(strstr(why, "granary train failed (exit status"));
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static gr_bench_round rnd(double eps, double torch_eps)
{
    return (gr_bench_round){.eps = eps, .auc = 0.78, .torch_eps = torch_eps, .torch_auc = 0.78};
}

static void test_median_odd(void **state)
{
    (void)state;
    /* Ratios 6, 4, 5: the middle one. */
    gr_bench_round r[3] = {rnd(300, 50), rnd(200, 50), rnd(250, 50)};
    assert_float_equal(gr_bench_rounds_median_ratio(r, 3), 5.0, 1e-12);
    /* Each round's own pair: 400/100 = 4, 350/50 = 7, 270/60 = 4.5 -> 4.5, while the median
     * granary figure over the median PyTorch one would be 350/60 = 5.83. */
    gr_bench_round s[3] = {rnd(400, 100), rnd(350, 50), rnd(270, 60)};
    assert_float_equal(gr_bench_rounds_median_ratio(s, 3), 4.5, 1e-12);
}

static void test_median_even_one_none(void **state)
{
    (void)state;
    gr_bench_round r[4] = {rnd(500, 100), rnd(300, 100), rnd(700, 100), rnd(600, 100)};
    assert_float_equal(gr_bench_rounds_median_ratio(r, 4), 5.5, 1e-12); /* (5 + 6) / 2 */
    assert_float_equal(gr_bench_rounds_median_ratio(r, 1), 5.0, 1e-12);
    assert_float_equal(gr_bench_rounds_median_ratio(r, 0), -1.0, 0);
    /* The rounds themselves are left in their order. */
    assert_float_equal(r[0].eps, 500, 0);
    assert_float_equal(r[2].eps, 700, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli_train),
        cmocka_unit_test(test_median_odd),
        cmocka_unit_test(test_median_even_one_none),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
