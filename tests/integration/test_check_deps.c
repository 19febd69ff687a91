/* Tests for scripts/check-deps, the dependency check of CI: on a small fixture tree written
 * here (a doc with the table, three parts), each kind of bad include makes it fail and name the
 * file and line, the allowed ones pass, an exception row lets one file through; and the real
 * tree passes (so `make test` fails when a change breaks docs/architecture.md's table). Runs
 * from the repository root, as scripts/run-tests does. */
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

static char g_root[64];
static char g_out[8192];

static const char *k_doc =
    "# Architecture\n\n## Dependencies between parts\n\nProse.\n\n"
    "| part | may include |\n| --- | --- |\n| core | nothing |\n| table | core |\n"
    "| server | table, core |\n| cli | everything |\n\n### Exceptions\n\n"
    "| file | includes | why |\n| --- | --- | --- |\n%s\n## Next section\n\n"
    "| part | may include |\n| --- | --- |\n| table | server |\n";

static void put(const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_root, rel);
    for (char *s = strchr(path + strlen(g_root) + 1, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        mkdir(path, 0755);
        *s = '/';
    }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void put_doc(const char *exception_rows)
{
    char doc[2048];
    snprintf(doc, sizeof doc, k_doc, exception_rows);
    put("docs/architecture.md", doc);
}

/* A tree whose every include is allowed. */
static int setup(void **state)
{
    (void)state;
    snprintf(g_root, sizeof g_root, "/tmp/gr-deps-XXXXXX");
    assert_non_null(mkdtemp(g_root));
    put_doc("");
    put("include/granary/core.h", "#include <stdint.h>\n");
    put("include/granary/table.h", "#include \"granary/core.h\"\n");
    put("include/granary/server.h", "#include \"granary/table.h\"\n#include <granary/core.h>\n");
    put("src/core/core.c", "#include \"granary/core.h\"\n");
    put("src/table/table_internal.h", "#include \"granary/table.h\"\n");
    put("src/table/table.c", "#include \"table_internal.h\"\n#include \"table/table_internal.h\"\n");
    put("src/server/server.c", "#include <stdio.h>\n#include \"granary/server.h\"\n"
                               "#include \"granary/table.h\"\n");
    put("src/cli/main.c", "#include \"granary/server.h\"\n#include \"granary/table.h\"\n");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_root);
    return system(cmd) == 0 ? 0 : -1;
}

/* Runs the checker on root; returns its exit status, its output in g_out. */
static int check(const char *root)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "scripts/check-deps %s 2>&1", root);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(g_out, 1, sizeof g_out - 1, f);
    g_out[n] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void expect_fail(const char *want1, const char *want2)
{
    assert_int_equal(check(g_root), 1);
    if (!strstr(g_out, want1) || (want2 && !strstr(g_out, want2)))
        fail_msg("check-deps output should name '%s' and '%s':\n%s", want1, want2 ? want2 : "",
                 g_out);
}

static void test_clean_tree_passes(void **state)
{
    (void)state;
    if (check(g_root) != 0) fail_msg("clean fixture failed:\n%s", g_out);
}

static void test_public_header_of_disallowed_part(void **state)
{
    (void)state;
    put("src/table/evict.c", "#include \"granary/table.h\"\n\n#include \"granary/server.h\"\n");
    expect_fail("src/table/evict.c:3: part 'table' includes granary/server.h of part 'server'",
                "'table' may include: core");
}

static void test_internal_header_of_allowed_part(void **state)
{
    (void)state;
    /* server may use table, but only through granary/table.h. */
    put("src/server/dispatch.c", "#include \"table/table_internal.h\"\n");
    expect_fail("src/server/dispatch.c:1: includes table/table_internal.h, an internal header of "
                "part 'table'", NULL);
}

static void test_relative_path_to_internal_header(void **state)
{
    (void)state;
    put("src/server/dispatch.c", "# include \"../table/table_internal.h\"\n");
    expect_fail("src/server/dispatch.c:1", "internal header of part 'table'");
}

static void test_public_header_breaking_the_table(void **state)
{
    (void)state;
    put("include/granary/table.h", "#include \"granary/core.h\"\n#include \"granary/server.h\"\n");
    expect_fail("include/granary/table.h:2: part 'table' includes granary/server.h", NULL);
}

static void test_part_without_a_row(void **state)
{
    (void)state;
    put("src/cluster/cluster.c", "#include \"granary/core.h\"\n");
    expect_fail("src/cluster/cluster.c: part 'cluster' has no row", NULL);
}

static void test_exception_row_lets_one_file_through(void **state)
{
    (void)state;
    put("src/table/evict.c", "#include \"granary/server.h\"\n");
    put("src/table/scan.c", "#include \"granary/server.h\"\n");
    put_doc("| src/table/evict.c | server | moving out |\n");
    expect_fail("src/table/scan.c:1", NULL);
    assert_null(strstr(g_out, "evict.c:"));
    char path[512];
    snprintf(path, sizeof path, "%s/src/table/scan.c", g_root);
    unlink(path);
    assert_int_equal(check(g_root), 0);
    /* Once the include is gone the row is reported as unused, without failing. */
    snprintf(path, sizeof path, "%s/src/table/evict.c", g_root);
    unlink(path);
    assert_int_equal(check(g_root), 0);
    assert_non_null(strstr(g_out, "warning: the exception 'src/table/evict.c includes server'"));
}

static void test_doc_without_table(void **state)
{
    (void)state;
    put("docs/architecture.md", "# Architecture\n\nNo table.\n");
    assert_int_equal(check(g_root), 2);
    assert_non_null(strstr(g_out, "no \"part | may include\" table"));
}

static void test_real_tree_passes(void **state)
{
    (void)state;
    if (check(".") != 0) fail_msg("the repository breaks docs/architecture.md's table:\n%s", g_out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_clean_tree_passes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_public_header_of_disallowed_part, setup, teardown),
        cmocka_unit_test_setup_teardown(test_internal_header_of_allowed_part, setup, teardown),
        cmocka_unit_test_setup_teardown(test_relative_path_to_internal_header, setup, teardown),
        cmocka_unit_test_setup_teardown(test_public_header_breaking_the_table, setup, teardown),
        cmocka_unit_test_setup_teardown(test_part_without_a_row, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exception_row_lets_one_file_through, setup, teardown),
        cmocka_unit_test_setup_teardown(test_doc_without_table, setup, teardown),
        cmocka_unit_test(test_real_tree_passes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
