/* Integration: checkpoints through the parameter servers (CKPT_SAVE, CKPT_COMMIT, CKPT_LOAD).
 *  - a 2-shard cluster saves, a 3-shard cluster loads: every row, the optimizer state (checked
 *    by applying the same gradient on both and comparing bitwise) and the dense parameter
 *    (whose owner changes) come back; the metadata comes back;
 *  - deltas on top of a full save, retention, a refused spec, a damaged file, bad names and
 *    the --ckpt-root confinement, each leaving the target shard as it was;
 *  - kill -9 of a shard process while it writes its file: the save fails, nothing is
 *    committed, the previous checkpoint is still the newest and loads exactly;
 *  - pulls keep completing while their shard saves (counted while its file is written). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "granary/ckpt.h"
#include "granary/cluster.h"
#include "granary/client.h"
#include "granary/server.h"
#include "granary/train.h"
#include "tests/support/ps_harness.h"

#define USER_SPEC                                                                                 \
    "{\"name\":\"user\",\"id\":1,\"dim\":8,\"seed\":7,"                                           \
    "\"init\":{\"kind\":\"uniform\",\"low\":-0.05,\"high\":0.05},"                                \
    "\"optimizer\":{\"kind\":\"adagrad\",\"lr\":0.05,\"eps\":1e-8,\"initial_accumulator\":0.1}}"
#define ITEM_SPEC                                                                                 \
    "{\"name\":\"item\",\"id\":2,\"dim\":4,\"seed\":9,"                                           \
    "\"init\":{\"kind\":\"uniform\",\"low\":-0.1,\"high\":0.1},"                                  \
    "\"optimizer\":{\"kind\":\"adam\",\"lr\":0.01,\"beta1\":0.9,\"beta2\":0.999,\"eps\":1e-8}}"
#define MLP_SPEC "{\"name\":\"mlp\",\"size\":2500,\"optimizer\":{\"kind\":\"adam\",\"lr\":0.01}}"
#define MLP_SIZE 2500
#define NKEYS 3000

static char tmp[128];

static int setup(void **state)
{
    (void)state;
    if (!getenv("GRANARY_LOG")) gr_log_set_level(GR_LOG_WARN);
    return ps_test_tmpdir(tmp, sizeof tmp);
}

static int teardown(void **state)
{
    (void)state;
    ps_test_rmdir(tmp);
    return 0;
}

static gr_client *connect_to(const char *servers)
{
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = servers;
    cc.request_timeout_ms = 30000;
    gr_client *c = NULL;
    int rc = gr_client_create(&cc, &c);
    if (rc) fprintf(stderr, "client: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    return c;
}

static uint64_t key_of(size_t i) { return gr_hash_key(i, 1234) | 1; }

/* Deterministic gradients for round r. */
static void grads(float *g, size_t n, uint32_t dim, unsigned r)
{
    for (size_t i = 0; i < n * dim; i++)
        g[i] = (float)((double)((gr_hash_key(i * 7 + r, 99) % 2001)) / 1000.0 - 1.0);
}

/* Creates the tables and the dense parameter and trains them a few rounds. */
static void populate(gr_client *c, unsigned rounds)
{
    assert_int_equal(gr_client_create_table(c, USER_SPEC), 0);
    assert_int_equal(gr_client_create_table(c, ITEM_SPEC), 0);
    assert_int_equal(gr_client_dense_create(c, MLP_SPEC), 0);
    uint64_t *keys = malloc(NKEYS * sizeof *keys);
    float *g = malloc(NKEYS * 8 * sizeof *g);
    for (size_t i = 0; i < NKEYS; i++) keys[i] = key_of(i);
    for (unsigned r = 0; r < rounds; r++) {
        grads(g, NKEYS, 8, r);
        assert_int_equal(gr_client_push(c, 1, 8, keys, NKEYS, g), 0);
        grads(g, NKEYS / 2, 4, r + 100);
        assert_int_equal(gr_client_push(c, 2, 4, keys, NKEYS / 2, g), 0);
        grads(g, MLP_SIZE / 8 + 1, 8, r + 200);
        assert_int_equal(gr_client_dense_push(c, "mlp", g, MLP_SIZE), 0);
    }
    free(keys);
    free(g);
}

typedef struct snapshot {
    float *user, *item, *mlp;
} snapshot;

static void snapshot_take(gr_client *c, snapshot *s)
{
    uint64_t *keys = malloc(NKEYS * sizeof *keys);
    for (size_t i = 0; i < NKEYS; i++) keys[i] = key_of(i);
    s->user = malloc(NKEYS * 8 * sizeof(float));
    s->item = malloc(NKEYS / 2 * 4 * sizeof(float));
    s->mlp = malloc(MLP_SIZE * sizeof(float));
    gr_client_batch b[2] = {{1, 8, NKEYS, keys, s->user, NULL, 0}, {2, 4, NKEYS / 2, keys, s->item, NULL, 0}};
    assert_int_equal(gr_client_pull_many(c, b, 2, GR_CLIENT_READONLY), 0);
    assert_int_equal(gr_client_dense_pull(c, "mlp", s->mlp, MLP_SIZE), 0);
    free(keys);
}

static void snapshot_free(snapshot *s)
{
    free(s->user);
    free(s->item);
    free(s->mlp);
}

static void assert_same(const snapshot *a, const snapshot *b)
{
    assert_memory_equal(a->user, b->user, NKEYS * 8 * sizeof(float));
    assert_memory_equal(a->item, b->item, NKEYS / 2 * 4 * sizeof(float));
    assert_memory_equal(a->mlp, b->mlp, MLP_SIZE * sizeof(float));
}

static void root_path(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", tmp, name);
}

static uint64_t table_rows(gr_client *c, const char *name)
{
    char *js = NULL;
    assert_int_equal(gr_client_describe_table(c, name, &js), 0);
    const char *p = strstr(js, "\"rows\":");
    assert_non_null(p);
    /* the summed "rows" is the last one in the document */
    const char *q;
    while ((q = strstr(p + 1, "\"rows\":"))) p = q;
    uint64_t rows = strtoull(p + 7, NULL, 10);
    free(js);
    return rows;
}

/* 2 shards save, 3 shards load: rows, optimizer state, dense parameter, metadata. */
static void test_save_2_load_3(void **state)
{
    (void)state;
    char root[256];
    root_path(root, sizeof root, "r23");
    gr_local_cluster *a, *b;
    assert_int_equal(gr_local_cluster_start(2, 2, &a), 0);
    gr_client *ca = connect_to(gr_local_cluster_servers(a));
    populate(ca, 3);
    snapshot sa;
    snapshot_take(ca, &sa);

    gr_client_ckpt_opts o = {.root = root, .step = 30, .meta = "{\"who\":\"test\",\"n\":[1,2]}",
                             .zstd_level = 1};
    gr_client_ckpt_info info;
    int rc = gr_client_ckpt_save(ca, &o, &info);
    if (rc) fprintf(stderr, "save: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    assert_string_equal(info.name, "step-000000000030");
    assert_false(info.delta);
    assert_int_equal(info.rows, NKEYS + NKEYS / 2);
    assert_int_equal(info.dense, 1);
    assert_false(info.sync_job);
    assert_true(info.bytes > 0);
    /* A complete, verifiable checkpoint: 2 shard files, 2 dense parts (a shard file and
     * dense.json each) and user.json, all read by verify; the dense parameter's 3 chunk rows
     * count with the sparse rows. */
    char dir[400];
    snprintf(dir, sizeof dir, "%s/%s", root, info.name);
    gr_ckpt_verify_stats vs;
    assert_int_equal(gr_ckpt_verify(dir, true, &vs), 0);
    assert_int_equal(vs.files, 7);
    assert_int_equal(vs.rows, NKEYS + NKEYS / 2 + (MLP_SIZE + 1023) / 1024);
    char latest[GR_CKPT_NAME_MAX];
    uint64_t step = 0;
    assert_int_equal(gr_ckpt_latest(root, latest, &step), 0);
    assert_int_equal(step, 30);
    /* Saving the same step again is refused: a complete checkpoint is never rewritten. */
    assert_int_equal(gr_client_ckpt_save(ca, &o, NULL), GR_EEXIST);

    assert_int_equal(gr_local_cluster_start(3, 2, &b), 0);
    gr_client *cb = connect_to(gr_local_cluster_servers(b));
    gr_client_ckpt_loaded ld;
    rc = gr_client_ckpt_load(cb, root, NULL, false, &ld);
    if (rc) fprintf(stderr, "load: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    assert_string_equal(ld.name, "step-000000000030");
    assert_int_equal(ld.step, 30);
    assert_int_equal(ld.shards, 2);
    assert_non_null(ld.meta);
    assert_string_equal(ld.meta, "{\"who\":\"test\",\"n\":[1,2]}");
    /* Every sparse row once, plus the dense parameter's 3 chunk rows on its new owner. */
    assert_int_equal(ld.rows, NKEYS + NKEYS / 2 + 3);
    free(ld.meta);
    assert_int_equal(table_rows(cb, "user"), NKEYS);
    assert_int_equal(table_rows(cb, "item"), NKEYS / 2);
    snapshot sb;
    snapshot_take(cb, &sb);
    assert_same(&sa, &sb);
    /* The optimizer state came along: the same next step gives the same rows. */
    populate(ca, 1);
    populate(cb, 1);
    snapshot_free(&sa);
    snapshot_free(&sb);
    snapshot_take(ca, &sa);
    snapshot_take(cb, &sb);
    assert_same(&sa, &sb);
    /* resolve_only names the checkpoint and loads nothing. */
    assert_int_equal(gr_client_ckpt_load(cb, root, NULL, true, &ld), 0);
    assert_int_equal(ld.rows, 0);
    assert_int_equal(ld.step, 30);
    free(ld.meta);
    snapshot_free(&sa);
    snapshot_free(&sb);
    gr_client_destroy(ca);
    gr_client_destroy(cb);
    gr_local_cluster_stop(a);
    gr_local_cluster_stop(b);
}

/* Deltas, retention, and refusals that must leave the target untouched. */
static void test_deltas_retention_refusals(void **state)
{
    (void)state;
    char root[256];
    root_path(root, sizeof root, "delta");
    gr_local_cluster *a, *b;
    assert_int_equal(gr_local_cluster_start(2, 2, &a), 0);
    gr_client *ca = connect_to(gr_local_cluster_servers(a));
    populate(ca, 2);
    gr_client_ckpt_opts o = {.root = root, .step = 1, .incremental = true, .keep = 2};
    gr_client_ckpt_info info;
    assert_int_equal(gr_client_ckpt_save(ca, &o, &info), 0);
    assert_false(info.delta); /* nothing to build on yet */
    /* Change a few rows only. */
    uint64_t few[5] = {key_of(1), key_of(2), key_of(3), key_of(4), key_of(5)};
    float g[5 * 8];
    grads(g, 5, 8, 77);
    assert_int_equal(gr_client_push(ca, 1, 8, few, 5, g), 0);
    o.step = 2;
    o.parent = "step-000000000001";
    assert_int_equal(gr_client_ckpt_save(ca, &o, &info), 0);
    assert_true(info.delta);
    assert_int_equal(info.rows, 5);
    gr_ckpt_manifest *m;
    char dir[400];
    snprintf(dir, sizeof dir, "%s/step-000000000002", root);
    assert_int_equal(gr_ckpt_manifest_read(dir, &m), 0);
    assert_int_equal(m->kind, GR_CKPT_DELTA);
    assert_string_equal(m->parent, "step-000000000001");
    gr_ckpt_manifest_destroy(m);
    /* A third save on the delta; keep 2 must keep the full one the chain needs. */
    grads(g, 5, 8, 78);
    assert_int_equal(gr_client_push(ca, 1, 8, few, 5, g), 0);
    o.step = 3;
    o.parent = "step-000000000002";
    assert_int_equal(gr_client_ckpt_save(ca, &o, &info), 0);
    assert_true(info.delta);
    snprintf(dir, sizeof dir, "%s/step-000000000001/manifest.json", root);
    struct stat st;
    assert_int_equal(stat(dir, &st), 0);
    snapshot sa;
    snapshot_take(ca, &sa);

    assert_int_equal(gr_local_cluster_start(1, 2, &b), 0);
    gr_client *cb = connect_to(gr_local_cluster_servers(b));
    /* A table of that name with another spec: refused, naming the field, nothing loaded. */
    const char *other = "{\"name\":\"user\",\"id\":1,\"dim\":8,\"seed\":7,"
                        "\"init\":{\"kind\":\"uniform\",\"low\":-0.05,\"high\":0.05},"
                        "\"optimizer\":{\"kind\":\"adagrad\",\"lr\":0.5,\"eps\":1e-8,"
                        "\"initial_accumulator\":0.1}}";
    assert_int_equal(gr_client_create_table(cb, other), 0);
    gr_client_ckpt_loaded ld;
    int rc = gr_client_ckpt_load(cb, root, NULL, false, &ld);
    assert_int_equal(rc, GR_EINVAL);
    fprintf(stderr, "refused as expected: %s\n", gr_errmsg());
    assert_non_null(strstr(gr_errmsg(), "optimizer"));
    assert_int_equal(table_rows(cb, "user"), 0);
    char *js = NULL;
    assert_int_equal(gr_client_describe_table(cb, "item", &js), GR_ENOENT);
    assert_int_equal(gr_client_drop_table(cb, "user"), 0);
    /* Bad names and missing checkpoints. */
    assert_int_equal(gr_client_ckpt_load(cb, root, "../x", false, &ld), GR_EINVAL);
    assert_int_equal(gr_client_ckpt_load(cb, root, "step-000000000009", false, &ld), GR_ENOENT);
    char nothing[256];
    root_path(nothing, sizeof nothing, "nothing-here");
    assert_int_equal(gr_client_ckpt_load(cb, nothing, NULL, false, &ld), GR_ENOENT);
    /* The chain (full + 2 deltas) onto 1 shard. */
    rc = gr_client_ckpt_load(cb, root, NULL, false, &ld);
    if (rc) fprintf(stderr, "load: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    assert_int_equal(ld.step, 3);
    free(ld.meta);
    snapshot sb;
    snapshot_take(cb, &sb);
    assert_same(&sa, &sb);
    /* A checkpoint directory given directly (the root is itself a checkpoint). */
    snprintf(dir, sizeof dir, "%s/step-000000000001", root);
    assert_int_equal(gr_client_ckpt_load(cb, dir, NULL, false, &ld), 0);
    assert_int_equal(ld.step, 1);
    assert_string_equal(ld.name, "step-000000000001");
    free(ld.meta);
    /* A damaged file: refused, and the shard keeps what it had (step 1's rows). */
    snapshot s1;
    snapshot_take(cb, &s1);
    char f[400];
    snprintf(f, sizeof f, "%s/step-000000000003/shard-00001-of-00002.gck", root);
    FILE *fp = fopen(f, "r+b");
    assert_non_null(fp);
    fseek(fp, 200, SEEK_SET);
    int ch = fgetc(fp);
    fseek(fp, 200, SEEK_SET);
    fputc(ch ^ 0x5a, fp);
    fclose(fp);
    rc = gr_client_ckpt_load(cb, root, NULL, false, &ld);
    assert_true(rc == GR_ECORRUPT || rc == GR_EIO);
    fprintf(stderr, "damaged file refused: %s\n", gr_errmsg());
    snapshot s2;
    snapshot_take(cb, &s2);
    assert_same(&s1, &s2);
    snapshot_free(&sa);
    snapshot_free(&sb);
    snapshot_free(&s1);
    snapshot_free(&s2);
    gr_client_destroy(ca);
    gr_client_destroy(cb);
    gr_local_cluster_stop(a);
    gr_local_cluster_stop(b);
}

/* A shard started with ckpt_root only writes under it. */
static void test_ckpt_root_confinement(void **state)
{
    (void)state;
    char base[256];
    root_path(base, sizeof base, "confined");
    assert_int_equal(mkdir(base, 0755), 0);
    gr_server_config cfg;
    gr_server_config_default(&cfg);
    cfg.threads = 2;
    cfg.ckpt_root = base;
    gr_server *s;
    assert_int_equal(gr_server_create(&cfg, &s), 0);
    assert_int_equal(gr_server_start(s), 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", gr_server_port(s));
    gr_client *c = connect_to(addr);
    assert_int_equal(gr_client_create_table(c, USER_SPEC), 0);
    gr_client_ckpt_opts o = {.root = "/tmp", .step = 1};
    assert_int_equal(gr_client_ckpt_save(c, &o, NULL), GR_EINVAL);
    fprintf(stderr, "refused as expected: %s\n", gr_errmsg());
    o.root = "a/../../b";
    assert_int_equal(gr_client_ckpt_save(c, &o, NULL), GR_EINVAL);
    o.root = "jobs/one";
    int rc = gr_client_ckpt_save(c, &o, NULL);
    if (rc) fprintf(stderr, "save: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    char dir[400];
    snprintf(dir, sizeof dir, "%s/jobs/one/step-000000000001", base);
    assert_int_equal(gr_ckpt_verify(dir, true, NULL), 0);
    /* A symlink inside the root that leads out of it: refused for a root under it, for the
     * checkpoint directory itself, and for a load; nothing is created outside. */
    char outside[256], link[400], made[600];
    root_path(outside, sizeof outside, "outside");
    assert_int_equal(mkdir(outside, 0755), 0);
    snprintf(link, sizeof link, "%s/escape", base);
    assert_int_equal(symlink(outside, link), 0);
    o.root = "escape/deeper";
    assert_int_equal(gr_client_ckpt_save(c, &o, NULL), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "leaves this shard's checkpoint root"));
    snprintf(made, sizeof made, "%s/deeper", outside);
    assert_int_equal(access(made, F_OK), -1);
    snprintf(link, sizeof link, "%s/jobs/one/step-000000000002", base);
    assert_int_equal(symlink(outside, link), 0);
    o.root = "jobs/one";
    o.step = 2;
    assert_int_equal(gr_client_ckpt_save(c, &o, NULL), GR_EINVAL);
    o.step = 1;
    assert_int_equal(unlink(link), 0);
    gr_client_ckpt_loaded bad;
    assert_int_equal(gr_client_ckpt_load(c, "escape", NULL, false, &bad), GR_EINVAL);
    gr_client_ckpt_loaded ld;
    assert_int_equal(gr_client_ckpt_load(c, "jobs/one", NULL, false, &ld), 0);
    assert_int_equal(ld.step, 1);
    free(ld.meta);
    /* The stats report the saves. */
    char *js = NULL;
    assert_int_equal(gr_client_stats(c, 0, &js), 0);
    assert_non_null(strstr(js, "\"ckpt\":{\"saves\":1"));
    free(js);
    gr_client_destroy(c);
    gr_server_destroy(s);
}

/* A checkpoint request whose body does not decode: error reply, then the server closes the
 * connection (as for any malformed frame); one that decodes but is invalid keeps it. */
static void test_malformed_request(void **state)
{
    (void)state;
    gr_local_cluster *a;
    assert_int_equal(gr_local_cluster_start(1, 1, &a), 0);
    const char *servers = gr_local_cluster_servers(a);
    uint16_t port = (uint16_t)atoi(strrchr(servers, ':') + 1);
    int fd = ps_test_connect(port);
    assert_true(fd >= 0);
    gr_proto_buf b;
    gr_proto_buf_init(&b);
    /* zstd level 25: invalid, answered, connection kept. */
    gr_proto_ckpt_save sv = {1, 0, 0, 0, {"/tmp/x", 6}, {"step-1", 6}, {"", 0}};
    assert_int_equal(gr_proto_begin(&b, GR_PROTO_REQUEST, GR_OP_CKPT_SAVE, 0, 0, 7), 0);
    assert_int_equal(gr_proto_put_ckpt_save(&b, &sv), 0);
    assert_int_equal(gr_proto_end(&b, 0), 0);
    b.data[GR_PROTO_HEADER_SIZE + 12] = 25;
    size_t first = b.len;
    /* Then a CKPT_LOAD body of 8 bytes: truncated. */
    assert_int_equal(gr_proto_begin(&b, GR_PROTO_REQUEST, GR_OP_CKPT_LOAD, 0, 0, 8), 0);
    assert_int_equal(gr_proto_put_u64(&b, 0), 0);
    assert_int_equal(gr_proto_end(&b, first), 0);
    assert_int_equal(write(fd, b.data, b.len), (ssize_t)b.len);
    gr_proto_buf_fini(&b);
    gr_proto_limits lim;
    gr_proto_limits_default(&lim);
    for (uint64_t want = 7; want <= 8; want++) {
        uint8_t hb[GR_PROTO_HEADER_SIZE], body[600];
        size_t got = 0;
        while (got < sizeof hb) {
            ssize_t r = read(fd, hb + got, sizeof hb - got);
            assert_true(r > 0);
            got += (size_t)r;
        }
        gr_proto_header h;
        assert_int_equal(gr_proto_header_decode(hb, sizeof hb, &lim, &h, NULL), GR_EAGAIN);
        assert_int_equal(h.id, want);
        assert_int_equal(h.status, want == 7 ? GR_EINVAL : GR_EPROTO);
        assert_true(h.body_len < sizeof body);
        for (got = 0; got < h.body_len;) {
            ssize_t r = read(fd, body + got, h.body_len - got);
            assert_true(r > 0);
            got += (size_t)r;
        }
    }
    char x;
    ssize_t r = read(fd, &x, 1); /* closed after the malformed one: EOF (or a reset) */
    if (r != 0) fprintf(stderr, "read after close: %zd (%s)\n", r, strerror(errno));
    assert_true(r == 0 || (r < 0 && errno == ECONNRESET));
    close(fd);
    gr_local_cluster_stop(a);
}

/* ---- kill -9 mid-save ---- */

typedef struct save_arg {
    gr_client *c;
    gr_client_ckpt_opts o;
    int rc;
    char msg[512];
    atomic_bool done;
} save_arg;

static void *save_main(void *p)
{
    save_arg *a = p;
    a->rc = gr_client_ckpt_save(a->c, &a->o, NULL);
    if (a->rc) snprintf(a->msg, sizeof a->msg, "%s", gr_errmsg());
    atomic_store(&a->done, true);
    return NULL;
}

/* True when dir holds a temporary file of shard 1 (its save is writing). */
static bool shard1_writing(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return false;
    bool found = false;
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "shard-00001-of-00002.gck.tmp.", 29)) found = true;
    closedir(d);
    return found;
}

static void fill_big(gr_client *c, size_t n)
{
    const size_t chunk = 20000;
    uint64_t *keys = malloc(chunk * sizeof *keys);
    float *g = malloc(chunk * 16 * sizeof *g);
    for (size_t i = 0; i < chunk * 16; i++) g[i] = 0.01f * (float)(i % 7);
    for (size_t at = 0; at < n; at += chunk) {
        for (size_t i = 0; i < chunk; i++) keys[i] = gr_hash_key(at + i, 5);
        assert_int_equal(gr_client_push(c, 9, 16, keys, chunk, g), 0);
    }
    free(keys);
    free(g);
}

static void test_kill_shard_mid_save(void **state)
{
    (void)state;
    char root[256];
    root_path(root, sizeof root, "killed");
    ps_test_server srv[2];
    char list[256];
    /* `granary server` confines checkpoints to its root: the same folder, named relatively. */
    const char *confine[] = {"--ckpt-root", tmp, NULL};
    assert_int_equal(ps_test_cluster_start(srv, 2, confine, list, sizeof list), 0);
    gr_client *c = connect_to(list);
    assert_int_equal(gr_client_create_table(c, "{\"name\":\"big\",\"id\":9,\"dim\":16,"
                                               "\"optimizer\":{\"kind\":\"adagrad\",\"lr\":0.1}}"),
                     0);
    assert_int_equal(gr_client_dense_create(c, MLP_SPEC), 0);
    fill_big(c, 400000);
    /* The checkpoint that must survive. */
    gr_client_ckpt_opts o = {.root = "killed", .step = 1, .keep = 3};
    int rc = gr_client_ckpt_save(c, &o, NULL);
    if (rc) fprintf(stderr, "save: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    uint64_t probe[64];
    float before[64 * 16], mlp[MLP_SIZE];
    for (int i = 0; i < 64; i++) probe[i] = gr_hash_key((uint64_t)i * 6151, 5);
    assert_int_equal(gr_client_pull(c, 9, 16, probe, 64, before), 0);
    assert_int_equal(gr_client_dense_pull(c, "mlp", mlp, MLP_SIZE), 0);
    /* Change everything, then kill shard 1 while it writes step 2. */
    fill_big(c, 400000);
    bool killed = false;
    for (uint64_t step = 2; step < 8 && !killed; step++) {
        save_arg a = {.c = c, .o = o};
        a.o.step = step;
        char dir[400];
        snprintf(dir, sizeof dir, "%s/step-%012llu", root, (unsigned long long)step);
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, save_main, &a), 0);
        while (!atomic_load(&a.done)) {
            if (shard1_writing(dir)) {
                assert_int_equal(ps_test_server_stop(&srv[1], SIGKILL), 128 + SIGKILL);
                killed = true;
                break;
            }
            usleep(200);
        }
        pthread_join(t, NULL);
        if (!killed) {
            /* The save was faster than the poll: it is complete, and the one to keep. */
            assert_int_equal(a.rc, 0);
            fprintf(stderr, "save of step %llu finished before the kill; again\n",
                    (unsigned long long)step);
            assert_int_equal(gr_client_pull(c, 9, 16, probe, 64, before), 0);
            assert_int_equal(gr_client_dense_pull(c, "mlp", mlp, MLP_SIZE), 0);
            fill_big(c, 400000);
            continue;
        }
        assert_int_not_equal(a.rc, 0);
        fprintf(stderr, "save of step %llu with shard 1 killed: %s\n", (unsigned long long)step,
                a.msg);
        /* Nothing was committed. */
        char mp[512];
        snprintf(mp, sizeof mp, "%s/manifest.json", dir);
        struct stat st;
        assert_int_not_equal(stat(mp, &st), 0);
    }
    assert_true(killed);
    gr_client_destroy(c);
    ps_test_cluster_stop(srv, 2);
    /* The newest complete checkpoint is the previous one, it verifies, and it loads. */
    char latest[GR_CKPT_NAME_MAX], dir[400];
    uint64_t step = 0;
    assert_int_equal(gr_ckpt_latest(root, latest, &step), 0);
    snprintf(dir, sizeof dir, "%s/%s", root, latest);
    assert_int_equal(gr_ckpt_verify(dir, true, NULL), 0);
    gr_local_cluster *b;
    assert_int_equal(gr_local_cluster_start(2, 2, &b), 0);
    gr_client *cb = connect_to(gr_local_cluster_servers(b));
    gr_client_ckpt_loaded ld;
    assert_int_equal(gr_client_ckpt_load(cb, root, NULL, false, &ld), 0);
    assert_int_equal(ld.step, step);
    free(ld.meta);
    float after[64 * 16], mlp2[MLP_SIZE];
    assert_int_equal(gr_client_pull(cb, 9, 16, probe, 64, after), 0);
    assert_memory_equal(before, after, sizeof before);
    assert_int_equal(gr_client_dense_pull(cb, "mlp", mlp2, MLP_SIZE), 0);
    assert_memory_equal(mlp, mlp2, sizeof mlp);
    /* The next save on a healthy cluster succeeds, and retention clears the broken one. */
    gr_client_ckpt_opts o2 = {.root = root, .step = 20, .keep = 1};
    assert_int_equal(gr_client_ckpt_save(cb, &o2, NULL), 0);
    DIR *d = opendir(root);
    assert_non_null(d);
    unsigned entries = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') entries++;
    closedir(d);
    assert_int_equal(entries, 1);
    gr_client_destroy(cb);
    gr_local_cluster_stop(b);
}

/* ---- pulls keep completing while their shard saves ---- */

/* The puller brackets each pull with two looks at the shard file the save is writing (its
 * temporary name, <dir>/<shard file>.tmp.<pid>, renamed when the file is complete; the
 * cluster runs in this process). A pull counts as done during the save when the same
 * temporary file is there before and after it. This counts progress, not latency: it holds
 * however slow the machine is, and it stays 0 if pulls wait for the shard file to be written
 * (as they would if the save held the table or the connection loop meanwhile). `step` is the
 * step being saved while the test's save call is in flight, 0 otherwise. */
typedef struct puller {
    gr_client *c;
    const char *root;
    atomic_bool stop;
    atomic_ullong step;
    atomic_uint during_save; /* pulls done while a shard file was being written */
    uint64_t n;
    int err;
} puller;

static bool writing_ino(const char *root, uint64_t step, ino_t *ino)
{
    char name[GR_CKPT_NAME_MAX], file[GR_CKPT_NAME_MAX], path[512];
    gr_ckpt_name(step, name);
    gr_ckpt_shard_file_name(0, 1, file);
    snprintf(path, sizeof path, "%s/%s/%s.tmp.%d", root, name, file, (int)getpid());
    struct stat st;
    if (stat(path, &st) != 0) return false;
    *ino = st.st_ino;
    return true;
}

static void *pull_main(void *p)
{
    puller *pl = p;
    uint64_t keys[256];
    float rows[256 * 16];
    uint64_t x = 1;
    while (!atomic_load(&pl->stop)) {
        for (int i = 0; i < 256; i++) keys[i] = gr_hash_key((x++ * 2654435761u) % 300000, 5);
        uint64_t step = atomic_load(&pl->step);
        ino_t a = 0, b = 0;
        bool before = step && writing_ino(pl->root, step, &a);
        if (gr_client_pull(pl->c, 9, 16, keys, 256, rows) != 0) {
            pl->err = 1;
            break;
        }
        if (before && writing_ino(pl->root, step, &b) && a == b)
            atomic_fetch_add(&pl->during_save, 1);
        pl->n++;
    }
    return NULL;
}

static void test_pause_while_saving(void **state)
{
    (void)state;
    char root[256];
    root_path(root, sizeof root, "pause");
    gr_local_cluster *a;
    assert_int_equal(gr_local_cluster_start(1, 2, &a), 0);
    gr_client *c = connect_to(gr_local_cluster_servers(a));
    assert_int_equal(gr_client_create_table(c, "{\"name\":\"big\",\"id\":9,\"dim\":16,"
                                               "\"optimizer\":{\"kind\":\"adagrad\",\"lr\":0.1}}"),
                     0);
    fill_big(c, 300000);
    gr_client *c2 = connect_to(gr_local_cluster_servers(a));
    puller pl = {.c = c2, .root = root};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, pull_main, &pl), 0);
    /* Save until the puller saw pulls complete inside a save (normally the first save does):
     * a loaded machine may keep the puller off the CPU for one save, not for many. A save that
     * stops pulls fails all of them. */
    const unsigned want = 3, max_saves = 30;
    unsigned saves = 0;
    gr_client_ckpt_info info;
    while (saves < max_saves && atomic_load(&pl.during_save) < want && !pl.err) {
        gr_client_ckpt_opts o = {.root = root, .step = (uint64_t)saves + 1, .keep = 1};
        atomic_store(&pl.step, o.step);
        assert_int_equal(gr_client_ckpt_save(c, &o, &info), 0);
        atomic_store(&pl.step, 0);
        saves++;
    }
    atomic_store(&pl.stop, true);
    pthread_join(t, NULL);
    fprintf(stderr,
            "pause: %llu pulls of 256 keys, %u of them while the shard file was written, over %u "
            "save(s) of 300000 rows (%.1f MB, the last took %.3f s)\n",
            (unsigned long long)pl.n, atomic_load(&pl.during_save), saves,
            (double)info.bytes / 1e6, info.seconds);
    assert_int_equal(pl.err, 0);
    assert_true(atomic_load(&pl.during_save) >= want);
    /* The saves completed: the newest is the last one, and it verifies. */
    char latest[GR_CKPT_NAME_MAX], dir[400];
    uint64_t step = 0;
    assert_int_equal(gr_ckpt_latest(root, latest, &step), 0);
    assert_int_equal(step, saves);
    snprintf(dir, sizeof dir, "%s/%s", root, latest);
    assert_int_equal(gr_ckpt_verify(dir, true, NULL), 0);
    gr_client_destroy(c);
    gr_client_destroy(c2);
    gr_local_cluster_stop(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_save_2_load_3),
        cmocka_unit_test(test_deltas_retention_refusals),
        cmocka_unit_test(test_ckpt_root_confinement),
        cmocka_unit_test(test_malformed_request),
        cmocka_unit_test(test_kill_shard_mid_save),
        cmocka_unit_test(test_pause_while_saving),
    };
    return cmocka_run_group_tests_name("ckpt_server", tests, setup, teardown);
}
