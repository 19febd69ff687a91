/* Tests for `granary ckpt`: inspect (text and --json), verify (ok, and exit 1 with the
 * message on a damaged file), reshard, export, latest and retain, run as a child process
 * ($GR_BUILD_DIR/granary, as the test runner sets it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ckpt/ckpt_internal.h"
#include "granary/ckpt.h"

static char g_tmp[256], g_bin[512];

static int setup(void **state)
{
    (void)state;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/gr-ckpt-cli-XXXXXX");
    assert_non_null(mkdtemp(g_tmp));
    const char *dir = getenv("GR_BUILD_DIR");
    snprintf(g_bin, sizeof g_bin, "%s/granary", dir && *dir ? dir : "build");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    ck_rmtree(g_tmp);
    return 0;
}

/* Runs `granary ARGS` with stdout and stderr captured; returns the exit status. */
static int run(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int run(char *out, size_t cap, const char *fmt, ...)
{
    char args[2048], cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", g_bin, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A root with a full checkpoint (step 1) and a delta (step 2) of two tables. */
static void make_root(const char *root)
{
    gr_table_spec a, b;
    gr_table_spec_default(&a, "user", 8);
    a.opt.kind = GR_OPT_ADAGRAD;
    a.opt.lr = 0.05f;
    a.partitions = 8;
    gr_table_spec_default(&b, "item", 4);
    b.id = 2;
    b.partitions = 8;
    gr_table *t[2];
    assert_int_equal(gr_table_create(&a, &t[0]), GR_OK);
    assert_int_equal(gr_table_create(&b, &t[1]), GR_OK);
    uint64_t k[600];
    static float buf[600 * 8];
    for (int i = 0; i < 600; i++) k[i] = 17 + (uint64_t)i * 1009;
    assert_int_equal(gr_table_lookup(t[0], k, 600, buf, 0), GR_OK);
    assert_int_equal(gr_table_lookup(t[1], k, 300, buf, 0), GR_OK);
    for (int i = 0; i < 600 * 8; i++) buf[i] = 0.25f;
    assert_int_equal(gr_table_apply(t[0], k, 600, buf), GR_OK);
    gr_ckpt_saver_opts so = {0, 1, true, 0, 0, 0};
    gr_ckpt_saver *s;
    assert_int_equal(gr_ckpt_saver_create(root, &so, &s), GR_OK);
    assert_int_equal(gr_ckpt_saver_save(s, 1, t, 2, NULL, NULL), GR_OK);
    assert_int_equal(gr_table_apply(t[0], k, 5, buf), GR_OK);
    assert_int_equal(gr_ckpt_saver_save(s, 2, t, 2, NULL, NULL), GR_OK);
    gr_ckpt_saver_destroy(s);
    gr_table_destroy(t[0]);
    gr_table_destroy(t[1]);
}

static void test_cli(void **state)
{
    (void)state;
    struct stat st;
    if (stat(g_bin, &st) != 0) {
        print_message("%s not built: skipping the CLI checks\n", g_bin);
        skip();
    }
    char root[512], d1[600], d2[600], out[65536];
    snprintf(root, sizeof root, "%s/root", g_tmp);
    snprintf(d1, sizeof d1, "%s/step-000000000001", root);
    snprintf(d2, sizeof d2, "%s/step-000000000002", root);
    make_root(root);

    assert_int_equal(run(out, sizeof out, "ckpt inspect %s", d2), 0);
    assert_non_null(strstr(out, "kind        delta"));
    assert_non_null(strstr(out, "parents     step-000000000001"));
    assert_non_null(strstr(out, "rows 5  live keys 600"));

    assert_int_equal(run(out, sizeof out, "ckpt inspect --json %s", d1), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    const cJSON *m = cJSON_GetObjectItem(j, "manifest");
    assert_int_equal(cJSON_GetObjectItem(m, "step")->valuedouble, 1);
    assert_string_equal(cJSON_GetObjectItem(m, "kind")->valuestring, "full");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(m, "tables")), 2);
    cJSON_Delete(j);

    assert_int_equal(run(out, sizeof out, "ckpt verify %s", d2), 0);
    assert_non_null(strstr(out, "ok: "));
    assert_non_null(strstr(out, "2 checkpoint(s), 2 file(s)"));
    assert_int_equal(run(out, sizeof out, "ckpt latest %s", root), 0);
    assert_non_null(strstr(out, "step-000000000002"));

    /* reshard the chain onto 3 shards and load it back */
    char r3[600];
    snprintf(r3, sizeof r3, "%s/r3", g_tmp);
    assert_int_equal(run(out, sizeof out, "ckpt reshard %s --shards 3 --out %s", d2, r3), 0);
    assert_int_equal(run(out, sizeof out, "ckpt verify --json %s", r3), 0);
    j = cJSON_Parse(out);
    assert_non_null(j);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "ok")));
    assert_int_equal(cJSON_GetObjectItem(j, "files")->valuedouble, 3);
    assert_int_equal(cJSON_GetObjectItem(j, "rows")->valuedouble, 900);
    cJSON_Delete(j);

    /* export with f16 weights */
    char ex[600];
    snprintf(ex, sizeof ex, "%s/export", g_tmp);
    assert_int_equal(run(out, sizeof out, "ckpt export %s --out %s --f16", d2, ex), 0);
    gr_ckpt_manifest *man;
    assert_int_equal(gr_ckpt_manifest_read(ex, &man), GR_OK);
    assert_int_equal(man->kind, GR_CKPT_EXPORT);
    assert_true(man->weights_f16);
    assert_int_equal(man->step, 2);
    gr_ckpt_manifest_destroy(man);

    /* a damaged file: exit 1 and the message names it */
    char fp[700];
    snprintf(fp, sizeof fp, "%s/shard-00001-of-00003.gck", r3);
    int fd = open(fp, O_RDWR);
    assert_true(fd >= 0);
    unsigned char b = 0;
    assert_int_equal(pread(fd, &b, 1, 300), 1);
    b ^= 1;
    assert_int_equal(pwrite(fd, &b, 1, 300), 1);
    close(fd);
    assert_int_equal(run(out, sizeof out, "ckpt verify %s", r3), 1);
    assert_non_null(strstr(out, "shard-00001-of-00003.gck"));
    assert_non_null(strstr(out, "checksum mismatch"));
    assert_int_equal(run(out, sizeof out, "ckpt verify --json %s", r3), 1);
    assert_non_null(strstr(out, "\"ok\":false"));

    /* retain: step 2 needs step 1, so keeping 1 deletes nothing */
    assert_int_equal(run(out, sizeof out, "ckpt retain %s --keep 1", root), 0);
    assert_non_null(strstr(out, "0 checkpoint(s) deleted"));
    assert_int_equal(stat(d1, &st), 0);

    /* usage errors */
    assert_int_equal(run(out, sizeof out, "ckpt reshard %s", d2), 2);
    assert_int_equal(run(out, sizeof out, "ckpt frob %s", d2), 2);
    assert_int_equal(run(out, sizeof out, "ckpt inspect %s/none", g_tmp), 1);
    assert_non_null(strstr(out, "no such checkpoint directory"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
