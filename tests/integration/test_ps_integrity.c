/* Integration: what a shard stores stays usable (issue 9). A multi-table push whose later
 * section holds NaN applies nothing, on every write path; updates that would make a row
 * non-finite are refused (or clipped) and counted in stats; the client refuses non-finite
 * gradients before sending them. Real `granary server` processes on loopback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "granary/client.h"
#include "granary/proto.h"
#include "tests/support/ps_harness.h"

static gr_client *client_for(const char *list)
{
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = list;
    cfg.connect_timeout_ms = 3000;
    gr_client *c = NULL;
    int rc = gr_client_create(&cfg, &c);
    if (rc) fprintf(stderr, "client: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    return c;
}

static void send_all(int fd, const void *p, size_t n)
{
    assert_int_equal(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

static int recv_all(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, (char *)p + got, n - got, 0);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* Reads one reply; returns its status and copies its error text (if any) to msg. */
static int read_reply(int fd, char *msg, size_t cap)
{
    uint8_t hb[24];
    assert_int_equal(recv_all(fd, hb, 24), 0);
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    gr_proto_header h;
    int rc = gr_proto_header_decode(hb, 24, &lim, &h, NULL);
    assert_true(rc == GR_OK || rc == GR_EAGAIN);
    assert_int_equal(h.kind, GR_PROTO_RESPONSE);
    uint8_t *body = malloc(h.body_len + 8);
    assert_int_equal(recv_all(fd, body, h.body_len), 0);
    if (msg && cap) msg[0] = '\0';
    if (h.status < 0 && msg) {
        const char *s;
        uint32_t n;
        assert_int_equal(gr_proto_decode_str(body, h.body_len, &lim, &s, &n), 0);
        snprintf(msg, cap, "%.*s", (int)n, s);
    }
    free(body);
    return h.status;
}

/* A two-section push (table 1 then table 2, key 5 each, dim 4) built by hand, so that the
 * client's own check cannot stop the bad value: section two's element 2 is `bad`. */
static int raw_two_table_push(uint16_t port, uint16_t op, float bad, char *msg, size_t cap)
{
    int fd = ps_test_connect(port);
    assert_true(fd >= 0);
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    uint64_t *keys;
    float *vals;
    assert_int_equal(gr_proto_begin(&b, GR_PROTO_REQUEST, op, 0, 0, 77), 0);
    assert_int_equal(gr_proto_put_batch_head(&b, 2), 0);
    for (uint32_t t = 1; t <= 2; t++) {
        assert_int_equal(gr_proto_put_section(&b, GR_PROTO_KEYS_VALUES, t, 4, 1, &keys, &vals), 0);
        keys[0] = 5;
        for (int i = 0; i < 4; i++) vals[i] = 1.0f;
        if (t == 2) vals[2] = bad;
    }
    assert_int_equal(gr_proto_end(&b, 0), 0);
    send_all(fd, b.data, b.len);
    gr_proto_buf_fini(&b);
    int rc = read_reply(fd, msg, cap);
    close(fd);
    return rc;
}

static const char *spec_fmt = "{\"name\":\"t%u\",\"id\":%u,\"dim\":4,"
                              "\"optimizer\":{\"kind\":\"sgd\",\"lr\":1}}";

/* A push or push-pull whose second section holds NaN or inf changes neither table. */
static void test_multi_table_push_is_all_or_nothing(void **state)
{
    (void)state;
    ps_test_server s;
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, NULL), 0);
    gr_client *c = client_for(s.addr);
    char spec[256];
    for (unsigned t = 1; t <= 2; t++) {
        snprintf(spec, sizeof spec, spec_fmt, t, t);
        assert_int_equal(gr_client_create_table(c, spec), 0);
    }
    const uint16_t ops[] = {GR_OP_PUSH, GR_OP_PUSH_PULL};
    const float bads[] = {NAN, INFINITY};
    for (int o = 0; o < 2; o++)
        for (int v = 0; v < 2; v++) {
            char msg[512];
            assert_int_equal(raw_two_table_push(s.port, ops[o], bads[v], msg, sizeof msg),
                             GR_EINVAL);
            assert_non_null(strstr(msg, "table 't2'"));
            assert_non_null(strstr(msg, "key 5"));
            assert_non_null(strstr(msg, "nothing in the request was applied"));
        }
    /* Row 5 of table 1 was never touched: zeros, as initialised (a pull creates it now). */
    uint64_t key = 5;
    float row[4];
    assert_int_equal(gr_client_pull(c, 1, 4, &key, 1, row), 0);
    for (int i = 0; i < 4; i++) assert_true(row[i] == 0.0f);
    /* A good two-section push applies both. */
    assert_int_equal(raw_two_table_push(s.port, GR_OP_PUSH, 1.0f, NULL, 0), 0);
    assert_int_equal(gr_client_pull(c, 1, 4, &key, 1, row), 0);
    for (int i = 0; i < 4; i++) assert_true(row[i] == -1.0f);
    gr_client_destroy(c);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
}

/* Through a shard: SGD lr 1, two pushes of 3e38 (the case) leave the row at -3e38,
 * the second push answers an error naming the key, stats count it; the same for a dense
 * parameter (a table on the shard). */
static void test_nonfinite_result_refused_on_shard(void **state)
{
    (void)state;
    ps_test_server s;
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, NULL), 0);
    gr_client *c = client_for(s.addr);
    char spec[256];
    snprintf(spec, sizeof spec, spec_fmt, 1u, 1u);
    assert_int_equal(gr_client_create_table(c, spec), 0);
    assert_int_equal(gr_client_dense_create(c, "{\"name\":\"mlp\",\"size\":3,"
                                               "\"optimizer\":{\"kind\":\"sgd\",\"lr\":1}}"),
                     0);
    uint64_t key = 42;
    float g[4] = {3e38f, 3e38f, 3e38f, 3e38f}, row[4];
    assert_int_equal(gr_client_push(c, 1, 4, &key, 1, g), 0);
    assert_int_equal(gr_client_push(c, 1, 4, &key, 1, g), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "key 42 would make its row non-finite"));
    assert_int_equal(gr_client_pull(c, 1, 4, &key, 1, row), 0);
    for (int i = 0; i < 4; i++) assert_true(row[i] == -3e38f);
    assert_int_equal(gr_client_dense_push(c, "mlp", g, 3), 0);
    assert_int_equal(gr_client_dense_push(c, "mlp", g, 3), GR_EINVAL);
    float d[3];
    assert_int_equal(gr_client_dense_pull(c, "mlp", d, 3), 0);
    for (int i = 0; i < 3; i++) assert_true(d[i] == -3e38f);
    char *js = NULL;
    assert_int_equal(gr_client_stats(c, 0, &js), 0);
    assert_non_null(strstr(js, "\"nonfinite_rejected\":1"));
    free(js);
    gr_client_destroy(c);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
}

/* A sync step whose first table's row would overflow: that row is refused and counted, the
 * rest of the step (the second table) is applied and the push succeeds (before: the push
 * failed and the second table's gradient was never applied). */
static void test_sync_step_with_a_refused_row(void **state)
{
    (void)state;
    ps_test_server s;
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, NULL), 0);
    gr_client *c = client_for(s.addr);
    char spec[256];
    for (unsigned t = 1; t <= 2; t++) {
        snprintf(spec, sizeof spec, spec_fmt, t, t);
        assert_int_equal(gr_client_create_table(c, spec), 0);
    }
    gr_client_sync_config sc = {GR_CLIENT_SYNC_SYNC, 1, 0, 0, 0};
    assert_int_equal(gr_client_sync_configure(c, &sc, 0, NULL), 0);
    uint64_t key = 5, want = 0, tag = 0;
    float big[4] = {3e38f, 3e38f, 3e38f, 3e38f}, one[4] = {1, 1, 1, 1}, row[4];
    uint32_t out = 9;
    for (int step = 0; step < 2; step++) {
        assert_int_equal(gr_client_sync_acquire(c, 0, &want, 5000, &tag, NULL), 0);
        gr_client_batch b[2] = {{.table = 1, .dim = 4, .n = 1, .keys = &key, .grads = big},
                                {.table = 2, .dim = 4, .n = 1, .keys = &key, .grads = one}};
        int rc = gr_client_push_step(c, 0, &tag, b, step == 0 ? 1 : 2, NULL, 0, &out);
        if (rc) fprintf(stderr, "push_step: %s\n", gr_errmsg());
        assert_int_equal(rc, 0);
        assert_int_equal(out, GR_CLIENT_PUSH_APPLIED);
        want = tag + 1;
    }
    assert_int_equal(gr_client_pull(c, 1, 4, &key, 1, row), 0);
    for (int i = 0; i < 4; i++) assert_true(row[i] == -3e38f);
    assert_int_equal(gr_client_pull(c, 2, 4, &key, 1, row), 0);
    for (int i = 0; i < 4; i++) assert_true(row[i] == -1.0f);
    char *js = NULL;
    assert_int_equal(gr_client_stats(c, 0, &js), 0);
    assert_non_null(strstr(js, "\"nonfinite_rejected\":1"));
    free(js);
    gr_client_destroy(c);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
}

/* The client refuses non-finite gradients before sending: push (any batch of several),
 * push-pull, dense push; the shard sees no request at all. */
static void test_client_refuses_nonfinite(void **state)
{
    (void)state;
    ps_test_server s;
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, NULL), 0);
    gr_client *c = client_for(s.addr);
    char spec[256];
    for (unsigned t = 1; t <= 2; t++) {
        snprintf(spec, sizeof spec, spec_fmt, t, t);
        assert_int_equal(gr_client_create_table(c, spec), 0);
    }
    assert_int_equal(gr_client_dense_create(c, "{\"name\":\"mlp\",\"size\":10}"), 0);
    uint64_t k1[2] = {1, 2}, k2[2] = {7, 8};
    float g1[8], g2[8], rows[8];
    for (int i = 0; i < 8; i++) g1[i] = g2[i] = 0.5f;
    g2[6] = INFINITY;
    gr_client_batch b[2] = {{.table = 1, .dim = 4, .n = 2, .keys = k1, .rows = rows, .grads = g1},
                            {.table = 2, .dim = 4, .n = 2, .keys = k2, .rows = rows, .grads = g2}};
    assert_int_equal(gr_client_push_many(c, b, 2), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "table 2, key 8 (row 1, element 2)"));
    assert_non_null(strstr(gr_errmsg(), "nothing was sent"));
    gr_client_op *op = (gr_client_op *)1;
    assert_int_equal(gr_client_push_pull_start(c, b, 2, &op), GR_EINVAL);
    assert_null(op);
    float dg[10] = {0};
    dg[9] = NAN;
    assert_int_equal(gr_client_dense_push(c, "mlp", dg, 10), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "dense gradient 'mlp' element 9"));
    assert_int_equal(gr_client_dense_push_start(c, "mlp", dg, 10, &op), GR_EINVAL);
    /* Nothing reached the shard. */
    char *js = NULL;
    assert_int_equal(gr_client_stats(c, 0, &js), 0);
    assert_non_null(strstr(js, "\"push\":{\"count\":0"));
    assert_non_null(strstr(js, "\"push_pull\":{\"count\":0"));
    assert_non_null(strstr(js, "\"dense_push\":{\"count\":0"));
    free(js);
    gr_client_destroy(c);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
}

/* `granary server` without --ckpt-root keeps checkpoints under its working directory: an
 * absolute path, a '..' and a symlink out are refused and create nothing; a relative root is
 * created under the working directory. */
static void test_default_ckpt_root_is_working_dir(void **state)
{
    (void)state;
    char dir[128], outside[128], here[PATH_MAX], bin[PATH_MAX], path[512];
    assert_int_equal(ps_test_tmpdir(dir, sizeof dir), 0);
    assert_int_equal(ps_test_tmpdir(outside, sizeof outside), 0);
    /* The harness finds the binary relative to the working directory: pin it first. */
    assert_non_null(realpath(ps_test_granary_bin(), bin));
    *strrchr(bin, '/') = '\0';
    setenv("GR_BUILD_DIR", bin, 1);
    assert_non_null(getcwd(here, sizeof here));
    assert_int_equal(chdir(dir), 0);
    ps_test_server s;
    int started = ps_test_server_start(&s, 0, 1, 0, NULL);
    assert_int_equal(chdir(here), 0);
    assert_int_equal(started, 0);
    gr_client *c = client_for(s.addr);
    char spec[256];
    snprintf(spec, sizeof spec, spec_fmt, 1u, 1u);
    assert_int_equal(gr_client_create_table(c, spec), 0);
    snprintf(path, sizeof path, "%s/escape", dir);
    assert_int_equal(symlink(outside, path), 0);
    snprintf(path, sizeof path, "%s/abs", outside);
    const char *bad[] = {path, "../x", "escape/x"};
    for (int i = 0; i < 3; i++) {
        gr_client_ckpt_opts o = {.root = bad[i], .step = 1};
        assert_int_equal(gr_client_ckpt_save(c, &o, NULL), GR_EINVAL);
    }
    snprintf(path, sizeof path, "%s/abs", outside);
    assert_int_equal(access(path, F_OK), -1);
    snprintf(path, sizeof path, "%s/x", outside);
    assert_int_equal(access(path, F_OK), -1);
    gr_client_ckpt_opts o = {.root = "jobs", .step = 1};
    assert_int_equal(gr_client_ckpt_save(c, &o, NULL), 0);
    snprintf(path, sizeof path, "%s/jobs/step-000000000001/manifest.json", dir);
    assert_int_equal(access(path, F_OK), 0);
    gr_client_destroy(c);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
    ps_test_rmdir(dir);
    ps_test_rmdir(outside);
}

/* Files in a checkpoint directory that are not what they claim: a FIFO named manifest.json,
 * user.json or dense.json is refused at once (the checkpoint thread never waits on it), a
 * 1 GiB sparse user.json is refused by its size before it is read, and SIGTERM still stops
 * the shard promptly afterwards. */
static void test_hostile_checkpoint_files(void **state)
{
    (void)state;
    char dir[128], path[512];
    assert_int_equal(ps_test_tmpdir(dir, sizeof dir), 0);
    const char *extra[] = {"--ckpt-root", dir, NULL};
    ps_test_server s;
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, extra), 0);
    gr_client_config cfg;
    gr_client_config_default(&cfg);
    cfg.servers = s.addr;
    cfg.request_timeout_ms = 5000; /* before the fix a FIFO stalled the load forever */
    gr_client *c = NULL;
    assert_int_equal(gr_client_create(&cfg, &c), 0);
    char spec[256];
    snprintf(spec, sizeof spec, spec_fmt, 1u, 1u);
    assert_int_equal(gr_client_create_table(c, spec), 0);
    gr_client_ckpt_opts o = {.root = "good", .step = 1, .meta = "{\"a\":1}"};
    assert_int_equal(gr_client_ckpt_save(c, &o, NULL), 0);
    gr_client_ckpt_loaded ld;
    /* A FIFO in place of the manifest. */
    snprintf(path, sizeof path, "%s/fifo", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/fifo/step-000000000001", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/fifo/step-000000000001/manifest.json", dir);
    assert_int_equal(mkfifo(path, 0644), 0);
    assert_int_equal(gr_client_ckpt_load(c, "fifo", "step-000000000001", false, &ld),
                     GR_ECORRUPT);
    assert_non_null(strstr(gr_errmsg(), "not a regular file"));
    /* A FIFO in place of user.json, then of the dense index, in a good checkpoint. */
    const char *names[] = {"user.json", "dense-00000-of-00001/dense.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/good/step-000000000001/%s", dir, names[i]);
        char keep[600];
        snprintf(keep, sizeof keep, "%s.keep", path);
        assert_int_equal(rename(path, keep), 0);
        assert_int_equal(mkfifo(path, 0644), 0);
        assert_int_equal(gr_client_ckpt_load(c, "good", "step-000000000001", false, &ld),
                         GR_ECORRUPT);
        assert_non_null(strstr(gr_errmsg(), names[i]));
        assert_int_equal(unlink(path), 0);
        assert_int_equal(rename(keep, path), 0);
    }
    /* A 1 GiB sparse user.json: refused by its size. */
    snprintf(path, sizeof path, "%s/good/step-000000000001/user.json", dir);
    assert_int_equal(truncate(path, 1ll << 30), 0);
    assert_int_equal(gr_client_ckpt_load(c, "good", "step-000000000001", false, &ld),
                     GR_ETOOBIG);
    assert_non_null(strstr(gr_errmsg(), "1073741824 bytes"));
    assert_int_equal(truncate(path, 7), 0);
    assert_int_equal(gr_client_ckpt_load(c, "good", "step-000000000001", false, &ld), 0);
    assert_string_equal(ld.meta, "{\"a\":1}");
    free(ld.meta);
    gr_client_destroy(c);
    /* The shard is not stuck anywhere: SIGTERM stops it, exit status 0. */
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
    ps_test_rmdir(dir);
}

/* Pulls dense parameter "mlp" (10 floats) and row 5 of table 1 into one array of 14. */
static void snapshot(gr_client *c, float *out)
{
    uint64_t key = 5;
    assert_int_equal(gr_client_dense_pull(c, "mlp", out, 10), 0);
    assert_int_equal(gr_client_pull(c, 1, 4, &key, 1, out + 10), 0);
}

static void bump(gr_client *c, float by)
{
    uint64_t key = 5;
    float g[10];
    for (int i = 0; i < 10; i++) g[i] = by;
    assert_int_equal(gr_client_dense_push(c, "mlp", g, 10), 0);
    assert_int_equal(gr_client_push(c, 1, 4, &key, 1, g), 0);
}

static int run_verify(const char *dir, char *out, size_t cap)
{
    const char *args[] = {"ckpt", "verify", dir, NULL};
    return ps_test_run_granary(args, out, cap);
}

/* A checkpoint whose dense part was deleted is refused as incomplete by the load and by
 * verify, and the load changes nothing (before: the sparse tables were restored and the dense
 * parameters silently kept newer values). A flipped byte in a dense part fails verify. */
static void test_dense_part_is_part_of_the_checkpoint(void **state)
{
    (void)state;
    char dir[128], path[512], out[4096];
    assert_int_equal(ps_test_tmpdir(dir, sizeof dir), 0);
    const char *extra[] = {"--ckpt-root", dir, NULL};
    ps_test_server s;
    assert_int_equal(ps_test_server_start(&s, 0, 1, 0, extra), 0);
    gr_client *c = client_for(s.addr);
    char spec[256];
    snprintf(spec, sizeof spec, spec_fmt, 1u, 1u);
    assert_int_equal(gr_client_create_table(c, spec), 0);
    assert_int_equal(gr_client_dense_create(c, "{\"name\":\"mlp\",\"size\":10,"
                                               "\"optimizer\":{\"kind\":\"sgd\",\"lr\":1}}"),
                     0);
    bump(c, 1.0f);
    gr_client_ckpt_opts o = {.root = "r", .step = 1};
    assert_int_equal(gr_client_ckpt_save(c, &o, NULL), 0);
    o.step = 2;
    assert_int_equal(gr_client_ckpt_save(c, &o, NULL), 0);
    snprintf(path, sizeof path, "%s/r/step-000000000001", dir);
    assert_int_equal(run_verify(path, out, sizeof out), 0);
    bump(c, 2.0f);
    float before[14], after[14];
    snapshot(c, before);
    /* Delete step 1's dense part. */
    snprintf(path, sizeof path, "%s/r/step-000000000001/dense-00000-of-00001", dir);
    ps_test_rmdir(path);
    gr_client_ckpt_loaded ld;
    assert_int_equal(gr_client_ckpt_load(c, "r", "step-000000000001", false, &ld), GR_ENOENT);
    assert_non_null(strstr(gr_errmsg(), "incomplete checkpoint"));
    snapshot(c, after);
    assert_memory_equal(before, after, sizeof before);
    snprintf(path, sizeof path, "%s/r/step-000000000001", dir);
    assert_int_equal(run_verify(path, out, sizeof out), 1);
    assert_non_null(strstr(out, "dense-00000-of-00001 is missing"));
    /* Flip a byte in step 2's dense shard file: verify reads it and fails. */
    snprintf(path, sizeof path, "%s/r/step-000000000002/dense-00000-of-00001/"
                                "shard-00000-of-00001.gck", dir);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 100, SEEK_SET), 0);
    int ch = fgetc(f);
    assert_int_equal(fseek(f, 100, SEEK_SET), 0);
    fputc(ch ^ 0x5a, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/r/step-000000000002", dir);
    assert_int_equal(run_verify(path, out, sizeof out), 1);
    assert_non_null(strstr(out, "dense-00000-of-00001"));
    assert_int_equal(gr_client_ckpt_load(c, "r", "step-000000000002", false, &ld), GR_ECORRUPT);
    snapshot(c, after);
    assert_memory_equal(before, after, sizeof before);
    gr_client_destroy(c);
    assert_int_equal(ps_test_server_stop(&s, 0), 0);
    ps_test_rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multi_table_push_is_all_or_nothing),
        cmocka_unit_test(test_client_refuses_nonfinite),
        cmocka_unit_test(test_nonfinite_result_refused_on_shard),
        cmocka_unit_test(test_sync_step_with_a_refused_row),
        cmocka_unit_test(test_default_ckpt_root_is_working_dir),
        cmocka_unit_test(test_hostile_checkpoint_files),
        cmocka_unit_test(test_dense_part_is_part_of_the_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
