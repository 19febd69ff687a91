/* Smoke test of `granary bench recovery` (seconds, small rows): it starts its ZooKeeper, shards
 * and standby, kills a shard, sees the standby restore every row of the lost shard, and prints
 * the JSON keys the docs promise, with parts that add up, and that the standby was warm (its
 * prepared table adopted by the restore). No timing targets: the figures are
 * in docs/benchmarks.md. Skipped without Debian's ZooKeeper. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/ps_harness.h"
#include "tests/support/zk_harness.h"

static double key(const char *out, const char *k)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", k);
    const char *p = strstr(out, pat);
    assert_non_null(p);
    return atof(p + strlen(pat));
}

static void test_recovery_smoke(void **state)
{
    (void)state;
    if (!zk_test_available()) skip();
    static char out[16384];
    const char *args[] = {"bench", "recovery", "--rows", "20000", "--session-timeout", "1000",
                          "--json", NULL};
    int rc = ps_test_run_granary(args, out, sizeof out);
    if (rc) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    const char *keys[] = {"detect_ms", "claim_ms", "restore_ms", "resume_ms", "total_ms",
                          "rows_restored", "cp_ms", "restore_vs_cp"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) (void)key(out, keys[i]);
    double rows = key(out, "rows_restored");
    assert_true(rows > 18000 && rows < 22000); /* about half of the 2 x 20 000 keys */
    double parts = key(out, "detect_ms") + key(out, "claim_ms") + key(out, "restore_ms") +
                   key(out, "resume_ms");
    assert_true(parts > key(out, "total_ms") - 1.5 && parts < key(out, "total_ms") + 1.5);
    assert_true(key(out, "detect_ms") > 0);
    /* The standby was warm before the kill (docs/coord.md, "Warm standby"): it held memory
     * prepared for the lost shard's rows, and the restore adopted its table. */
    assert_true(key(out, "standby_warm_wait_ms") >= 0);
    assert_true(key(out, "standby_warm_bytes") > rows * 100);
    assert_int_equal((int)key(out, "standby_warm_adopted"), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_recovery_smoke)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
