/* Smoke test of `granary bench soak` (a few seconds): it runs its mixed load against two real
 * shards, sees no unexpected error, and prints the JSON keys the docs promise. No timing or
 * growth assertions: those belong to the 30-minute run recorded in docs/benchmarks.md. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "tests/support/ps_harness.h"

static void test_soak_smoke(void **state)
{
    (void)state;
    static char out[16384];
    const char *args[] = {"bench", "soak", "--minutes", "0.05", "--json", NULL};
    int rc = ps_test_run_granary(args, out, sizeof out);
    if (rc) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    const char *keys[] = {"\"minutes\":0.05", "\"requests\":", "\"errors_unexpected\":0,",
                          "\"rss_growth_bytes\":", "\"fd_growth\":", "\"thread_growth\":",
                          "\"checkpoints\":"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        assert_non_null(strstr(out, keys[i]));
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_soak_smoke)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
