/* The docs stay true: scripts/check-doc-commands takes every `granary ...` command that
 * README.md and the pages of docs/ show (code blocks and inline code), checks that granary accepts each
 * command line (no unknown command, subcommand, benchmark or flag, no refused value), and runs
 * the concrete datagen/train/ckpt examples for real with small data and shards started on free
 * ports. Here: on a fixture page it rejects each kind of false command and names its line; on
 * the real tree it passes (so `make test` fails when a page shows a command that does not
 * work). Runs from the repository root, as scripts/run-tests does. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/ps_harness.h"

static char g_out[1 << 16];

/* Runs the checker (extra arguments appended) and returns its exit status; output in g_out. */
static int check(const char *extra)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 scripts/check-doc-commands --granary %s %s 2>&1",
             ps_test_granary_bin(), extra);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(g_out, 1, sizeof g_out - 1, p);
    g_out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_false_commands_are_caught(void **state)
{
    (void)state;
    char root[256], path[400], arg[300];
    assert_int_equal(ps_test_tmpdir(root, sizeof root), 0);
    snprintf(path, sizeof path, "%s/docs", root);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/README.md", root);
    put(path, "# x\n\n```sh\ngranary datagen --out /tmp/d --train-rows 100k --test-rows 1k\n"
              "granary bench train --workers 2 --json\n```\n");
    /* A page added later is read too. */
    snprintf(path, sizeof path, "%s/docs/later.md", root);
    put(path, "Run `granary trian --train F`, then `granary ckpt frob DIR`, `granary bench "
              "table|nope --json`,\n`granary train --train F --workers 2.5` and "
              "`granary server [--listen HOST:PORT] [--nope N]`.\n\n"
              "```\ngranary train --train FILE [--test FILE] [--mode async|sync] \\\n"
              "              [--max-examples N] [--max-steps N]\n```\n");
    snprintf(arg, sizeof arg, "--parse-only %s", root);
    assert_int_equal(check(arg), 1);
    const char *want[] = {
        "README.md:5: granary bench train --workers 2 --json",
        "unknown option --workers",
        "docs/later.md:1: granary trian --train F",
        "unknown command 'trian'",
        "docs/later.md:1: granary ckpt frob DIR",
        "unknown subcommand 'frob'",
        "unknown benchmark 'nope'",
        "--workers wants a whole number",
        "docs/later.md:2: granary server [--listen HOST:PORT] [--nope N]",
        "unknown option --nope",
        "check-doc-commands: 9 command(s) parsed, 0 run, 6 rejected",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(g_out, want[i])) fail_msg("the checker did not say '%s':\n%s", want[i], g_out);
    /* The good ones pass: datagen with a count suffix, a synopsis over two lines. */
    assert_null(strstr(g_out, "README.md:4"));
    assert_null(strstr(g_out, "docs/later.md:4"));
    ps_test_rmdir(root);
}

static void test_the_docs_are_true(void **state)
{
    (void)state;
    int rc = check("");
    if (rc != 0) fail_msg("a documented command is rejected (exit %d):\n%s", rc, g_out);
    /* It did check something, and ran the examples. */
    unsigned parsed = 0, ran = 0;
    const char *s = strstr(g_out, "check-doc-commands: ");
    assert_non_null(s);
    assert_int_equal(sscanf(s, "check-doc-commands: %u command(s) parsed, %u run", &parsed, &ran),
                     2);
    assert_true(parsed >= 50);
    assert_true(ran >= 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_false_commands_are_caught),
        cmocka_unit_test(test_the_docs_are_true),
    };
    return cmocka_run_group_tests_name("doc_commands", tests, NULL, NULL);
}
