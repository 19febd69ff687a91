/* Job specs (every field's error names the field; paths stay under the data root; flags the
 * controller owns are refused) and bearer tokens (file format, roles, lookup). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "platform/platform_int.h"

static char root[256];

/* A stand-in for the cli's option knowledge: --train/--test/--ckpt-dir take paths, --batch a
 * value, --strict nothing; anything else is unknown. */
static gr_job_flag_kind flag_info(const char *kind, const char *flag)
{
    (void)kind;
    if (!strcmp(flag, "train") || !strcmp(flag, "test") || !strcmp(flag, "ckpt-dir") ||
        !strcmp(flag, "config"))
        return GR_JOB_FLAG_PATH;
    if (!strcmp(flag, "batch") || !strcmp(flag, "servers")) return GR_JOB_FLAG_VALUE;
    if (!strcmp(flag, "strict")) return GR_JOB_FLAG_SWITCH;
    return GR_JOB_FLAG_UNKNOWN;
}

static int check_args(const char *kind, int argc, char **argv, char *err, size_t errcap)
{
    (void)kind;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--batch") && i + 1 < argc && atoi(argv[i + 1]) <= 0) {
            snprintf(err, errcap, "--batch: expected a whole number in 1..1048576");
            return -1;
        }
    return 0;
}

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/gr_spec_XXXXXX");
    assert_non_null(mkdtemp(root));
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/data", root);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/data/sub", root);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/data/escape", root);
    assert_int_equal(symlink("/etc", p), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

/* Parses body; returns the error text ("" when accepted). */
static const char *parse(const char *body)
{
    static char err[1024];
    err[0] = '\0';
    gr_controller_config cfg = {.capacity = 4, .check_args = check_args, .flag_info = flag_info};
    char data[PATH_MAX];
    snprintf(data, sizeof data, "%s/data", root);
    job *j = calloc(1, sizeof *j);
    int rc = spec_parse(body, &cfg, data, j, err, sizeof err);
    if (rc == 0) {
        assert_non_null(j->spec_json);
        err[0] = '\0';
    } else {
        assert_int_equal(rc, GR_EINVAL);
        assert_true(err[0] != '\0');
    }
    job_free(j);
    return err;
}

static void test_good_specs(void **state)
{
    (void)state;
    assert_string_equal(parse("{\"name\":\"a\",\"kind\":\"train\",\"args\":[\"--train\","
                              "\"d/t.tsv\",\"--batch\",\"64\",\"--strict\"],\"priority\":3,"
                              "\"cores\":2}"), "");
    assert_string_equal(parse("{\"name\":\"s-1.x\",\"kind\":\"serve\",\"args\":[],"
                              "\"min_replicas\":1,\"max_replicas\":4}"), "");
    /* A path inside the root through ".." of a directory that exists: still inside. A ".."
     * in the part that does not exist yet is refused (it could be made a link later). */
    assert_string_equal(parse("{\"name\":\"a\",\"kind\":\"train\",\"args\":"
                              "[\"--train=sub/../t.tsv\"]}"), "");
    assert_non_null(strstr(parse("{\"name\":\"a\",\"kind\":\"train\",\"args\":"
                                 "[\"--train=new/../t.tsv\"]}"), "not under the data root"));
}

static void test_each_bad_field_is_named(void **state)
{
    (void)state;
    assert_non_null(strstr(parse("[1]"), "not a JSON object"));
    assert_non_null(strstr(parse("{\"name\":\"a\",\"kind\":\"train\",\"args\":[],\"x\":1}"),
                           "x: unknown field"));
    assert_non_null(strstr(parse("{\"kind\":\"train\",\"args\":[]}"), "name:"));
    assert_non_null(strstr(parse("{\"name\":\"a b\",\"kind\":\"train\",\"args\":[]}"), "name:"));
    assert_non_null(strstr(parse("{\"name\":\"a\",\"kind\":\"bake\",\"args\":[]}"), "kind:"));
    assert_non_null(strstr(parse("{\"name\":\"a\",\"kind\":\"train\"}"), "args:"));
    assert_non_null(strstr(parse("{\"name\":\"a\",\"kind\":\"train\",\"args\":[1]}"), "args[0]"));
    assert_non_null(strstr(parse("{\"name\":\"a\",\"kind\":\"train\",\"args\":[],"
                                 "\"priority\":1.5}"), "priority:"));
    assert_non_null(strstr(parse("{\"name\":\"a\",\"kind\":\"train\",\"args\":[],\"cores\":5}"),
                           "cores: expected an integer in 1..4"));
    assert_non_null(strstr(parse("{\"name\":\"a\",\"kind\":\"train\",\"args\":[],"
                                 "\"max_replicas\":2}"), "replicas"));
    assert_non_null(strstr(parse("{\"name\":\"a\",\"kind\":\"serve\",\"args\":[],"
                                 "\"min_replicas\":3,\"max_replicas\":2}"), "max_replicas"));
    assert_non_null(strstr(parse("{\"name\":\"a\",\"kind\":\"serve\",\"args\":[],\"cores\":2,"
                                 "\"max_replicas\":3}"), "exceed the capacity"));
}

static void test_arguments_are_checked(void **state)
{
    (void)state;
    assert_non_null(strstr(parse("{\"name\":\"a\",\"kind\":\"train\",\"args\":[\"--bogus\"]}"),
                           "has no option --bogus"));
    assert_non_null(strstr(parse("{\"name\":\"a\",\"kind\":\"train\",\"args\":[\"--batch\","
                                 "\"0\"]}"), "--batch"));
    assert_non_null(strstr(parse("{\"name\":\"a\",\"kind\":\"train\",\"args\":[\"--servers\","
                                 "\"h:1\"]}"), "set by the controller"));
    assert_non_null(strstr(parse("{\"name\":\"a\",\"kind\":\"train\",\"args\":[\"--config\","
                                 "\"c.json\"]}"), "set by the controller"));
    assert_non_null(strstr(parse("{\"name\":\"a\",\"kind\":\"train\",\"args\":[\"--train\"]}"),
                           "needs a value"));
}

static void test_paths_stay_under_the_data_root(void **state)
{
    (void)state;
    const char *outside[] = {
        "[\"--train\",\"/etc/passwd\"]",
        "[\"--train\",\"../x.tsv\"]",
        "[\"--train=x/../../y\"]",
        "[\"--ckpt-dir\",\"escape/ckpt\"]", /* a symbolic link out of the root */
        "[\"--test\",\"a.tsv,/etc/shadow\"]",
        "[\"--ckpt-dir\",\"new/../../out\"]",
    };
    for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"name\":\"a\",\"kind\":\"train\",\"args\":%s}", outside[i]);
        const char *err = parse(body);
        if (!strstr(err, "not under the data root")) fail_msg("%s: got '%s'", outside[i], err);
    }
    char abs_ok[PATH_MAX + 128];
    snprintf(abs_ok, sizeof abs_ok, "{\"name\":\"a\",\"kind\":\"train\",\"args\":[\"--train\","
             "\"%s/data/t.tsv\"]}", root);
    assert_string_equal(parse(abs_ok), "");
}

static void test_tokens(void **state)
{
    (void)state;
    tokens t;
    assert_int_equal(tokens_parse("# team\nadmintoken1 root admin\n\nusertoken22 alice user # me\n"
                                  "viewtoken333 vic viewer\n", &t), 0);
    assert_int_equal(t.n, 3);
    const token_entry *e = tokens_find(&t, "usertoken22");
    assert_non_null(e);
    assert_string_equal(e->user, "alice");
    assert_int_equal(e->role, ROLE_USER);
    assert_null(tokens_find(&t, "usertoken2"));   /* a prefix is not the token */
    assert_null(tokens_find(&t, "usertoken222")); /* nor a longer one */
    assert_null(tokens_find(&t, ""));
    assert_null(tokens_find(&t, NULL));
    assert_int_equal(tokens_find(&t, "viewtoken333")->role, ROLE_VIEWER);
    tokens_free(&t);
    assert_int_equal(tokens_parse("tok12345 bob superuser\n", &t), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "line 1: role must be"));
    assert_int_equal(tokens_parse("tok12345 bob\n", &t), GR_EINVAL);
    assert_int_equal(tokens_parse("short bob user\n", &t), GR_EINVAL);
    assert_int_equal(tokens_parse("tok12345 a user\ntok12345 b admin\n", &t), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "again"));
    assert_int_equal(tokens_parse("# nothing\n", &t), GR_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_specs),
        cmocka_unit_test(test_each_bad_field_is_named),
        cmocka_unit_test(test_arguments_are_checked),
        cmocka_unit_test(test_paths_stay_under_the_data_root),
        cmocka_unit_test(test_tokens),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
