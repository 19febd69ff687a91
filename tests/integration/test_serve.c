/* Serving replicas against real `granary server --publish-interval` shards: rows pushed on the
 * shards become visible on a subscribed replica; a replica started later (or restarted)
 * catches up by itself; a training shard that restarts is resubscribed; the replica's scores
 * of the test set give exactly the trainer's own test AUC and logloss; the HTTP and binary
 * faces answer bad input with 4xx / error frames and keep serving. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "granary/client.h"
#include "granary/http.h"
#include "granary/serve.h"
#include "support/ps_harness.h"
#include "support/train_fixture.h"

#define TABLE 3
#define DIM 4
#define NKEYS 200

static const char *const publish_args[] = {"--publish-interval", "50", NULL};
static const char *SPEC = "{\"name\":\"feat\",\"id\":3,\"dim\":4,"
                          "\"optimizer\":{\"kind\":\"sgd\",\"lr\":1.0}}";

static gr_client *connect_to(const char *servers)
{
    gr_client_config cc;
    gr_client_config_default(&cc);
    cc.servers = servers;
    cc.request_timeout_ms = 20000;
    gr_client *c = NULL;
    int rc = gr_client_create(&cc, &c);
    if (rc) fprintf(stderr, "client: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    return c;
}

/* Pushes a gradient of -g to every element of NKEYS keys (SGD lr 1: rows grow by g). */
static void push_all(gr_client *c, float g, uint64_t *keys)
{
    float grads[NKEYS * DIM];
    for (int i = 0; i < NKEYS; i++) keys[i] = 1000003u * (uint64_t)(i + 1);
    for (int i = 0; i < NKEYS * DIM; i++) grads[i] = -g * (float)(1 + i % 5);
    assert_int_equal(gr_client_push(c, TABLE, DIM, keys, NKEYS, grads), 0);
}

static gr_serve *replica(const char *from, const char *http, const char *listen, uint32_t max_batch,
                         size_t max_body)
{
    gr_model_config mc;
    gr_model_config_default(&mc, GR_MODEL_LR);
    gr_serve_config cfg;
    gr_serve_config_default(&cfg);
    cfg.model = &mc;
    cfg.from = from;
    cfg.http = http;
    cfg.listen = listen;
    cfg.poll_wait_ms = 200;
    if (max_batch) cfg.max_batch = max_batch;
    if (max_body) cfg.max_body = max_body;
    gr_serve *s = NULL;
    int rc = gr_serve_create(&cfg, &s);
    if (!rc) rc = gr_serve_start(s);
    if (rc) fprintf(stderr, "replica: %s\n", gr_errmsg());
    assert_int_equal(rc, 0);
    return s;
}

/* Waits (up to 15 s) until the replica's rows of keys equal the shards' rows (rounded to half
 * floats for a replica that asked for them). */
static bool wait_rows(gr_serve *s, gr_client *c, const uint64_t *keys, bool f16)
{
    float want[NKEYS * DIM], got[NKEYS * DIM];
    gr_client_batch pb = {.table = TABLE, .dim = DIM, .n = NKEYS, .keys = keys, .rows = want};
    assert_int_equal(gr_client_pull_many(c, &pb, 1, GR_READONLY), 0);
    for (int i = 0; f16 && i < NKEYS * DIM; i++) want[i] = gr_f16_to_f32(gr_f32_to_f16(want[i]));
    for (int i = 0; i < 1500; i++) {
        if (gr_serve_lookup(s, TABLE, keys, NKEYS, got, NULL) == GR_OK &&
            !memcmp(want, got, sizeof want))
            return true;
        usleep(10000);
    }
    return false;
}

static bool wait_same_rows(gr_serve *s, gr_client *c, const uint64_t *keys)
{
    return wait_rows(s, c, keys, false);
}

static void test_deltas_visible_and_late_replica(void **state)
{
    (void)state;
    ps_test_server srv[2];
    char list[256];
    assert_int_equal(ps_test_cluster_start(srv, 2, publish_args, list, sizeof list), 0);
    gr_client *c = connect_to(list);
    assert_int_equal(gr_client_create_table(c, SPEC), 0);
    gr_serve *s = replica(list, NULL, NULL, 0, 0);
    uint64_t keys[NKEYS];
    push_all(c, 1.0f, keys);
    assert_true(wait_same_rows(s, c, keys));
    push_all(c, 0.5f, keys); /* a second delta moves the same rows again */
    assert_true(wait_same_rows(s, c, keys));
    gr_serve_stats st;
    gr_serve_get_stats(s, &st);
    assert_int_equal(st.shards_connected, 2);
    assert_true(st.publications >= 2);
    assert_true(st.rows_applied >= 2 * NKEYS);

    /* A replica restarted mid-stream (a new one, after more pushes) catches up by itself. */
    gr_serve_destroy(s);
    push_all(c, 0.25f, keys);
    s = replica(list, NULL, NULL, 0, 0);
    assert_true(wait_same_rows(s, c, keys));
    gr_serve_destroy(s);
    /* Rows as half floats on request (snapshot, then a delta). */
    gr_model_config mc;
    gr_model_config_default(&mc, GR_MODEL_LR);
    gr_serve_config hc;
    gr_serve_config_default(&hc);
    hc.model = &mc;
    hc.from = list;
    hc.f16 = true;
    assert_int_equal(gr_serve_create(&hc, &s), 0);
    assert_int_equal(gr_serve_start(s), 0);
    assert_true(wait_rows(s, c, keys, true));
    push_all(c, 0.3f, keys);
    assert_true(wait_rows(s, c, keys, true));
    gr_serve_destroy(s);
    gr_client_destroy(c);
    ps_test_cluster_stop(srv, 2);
}

/* A dense parameter that changes just before another replica takes its snapshot still reaches
 * the replica that follows the deltas (a snapshot must not consume the change). */
static void test_dense_reaches_every_replica(void **state)
{
    (void)state;
    const char *slow[] = {"--publish-interval", "1500", NULL};
    ps_test_server srv;
    assert_int_equal(ps_test_server_start(&srv, 0, 1, 0, slow), 0);
    gr_client *c = connect_to(srv.addr);
    assert_int_equal(gr_client_dense_create(c, "{\"name\":\"lr.dense\",\"size\":14,"
                                               "\"optimizer\":{\"kind\":\"sgd\",\"lr\":1}}"), 0);
    gr_serve *a = replica(srv.addr, NULL, NULL, 0, 0);
    gr_serve_stats st;
    for (int i = 0; i < 1000; i++) {
        gr_serve_get_stats(a, &st);
        if (st.dense_version) break;
        usleep(10000);
    }
    uint64_t first = st.dense_version;
    assert_true(first > 0);
    float g[14];
    for (int i = 0; i < 14; i++) g[i] = -0.5f;
    assert_int_equal(gr_client_dense_push(c, "lr.dense", g, 14), 0);
    gr_serve *b = replica(srv.addr, NULL, NULL, 0, 0); /* its snapshot comes first */
    for (int i = 0; i < 500; i++) {
        gr_serve_get_stats(a, &st);
        if (st.dense_version > first) break;
        usleep(10000);
    }
    assert_true(st.dense_version > first);
    gr_serve_destroy(a);
    gr_serve_destroy(b);
    gr_client_destroy(c);
    assert_int_equal(ps_test_server_stop(&srv, 0), 0);
}

/* A shard whose rows do not fit in one frame sends its snapshot in pages of slot ranges; the
 * replica asks for each next page and ends up with every row. */
static void test_paged_snapshot(void **state)
{
    (void)state;
    enum { BIG = 20000 };
    const char *small[] = {"--publish-interval", "50", "--max-body", "65536", NULL};
    ps_test_server srv;
    assert_int_equal(ps_test_server_start(&srv, 0, 1, 0, small), 0);
    gr_client *c = connect_to(srv.addr);
    assert_int_equal(gr_client_create_table(c, SPEC), 0);
    uint64_t *keys = malloc(BIG * sizeof *keys);
    float *grads = malloc(BIG * DIM * sizeof *grads), *want = malloc(BIG * DIM * sizeof *want),
          *got = malloc(BIG * DIM * sizeof *got);
    for (int i = 0; i < BIG; i++) keys[i] = 7777u * (uint64_t)(i + 1);
    for (int i = 0; i < BIG * DIM; i++) grads[i] = -(float)(i % 97);
    assert_int_equal(gr_client_push(c, TABLE, DIM, keys, BIG, grads), 0);
    gr_client_batch pb = {.table = TABLE, .dim = DIM, .n = BIG, .keys = keys, .rows = want};
    assert_int_equal(gr_client_pull_many(c, &pb, 1, GR_READONLY), 0);
    gr_serve *s = replica(srv.addr, NULL, NULL, 0, 0);
    bool same = false;
    for (int i = 0; i < 1500 && !same; i++) {
        usleep(10000);
        same = gr_serve_lookup(s, TABLE, keys, BIG, got, NULL) == GR_OK &&
               !memcmp(want, got, BIG * DIM * sizeof *got);
    }
    assert_true(same);
    gr_serve_stats st;
    gr_serve_get_stats(s, &st);
    assert_true(st.publications >= 8); /* 20000 x 24 bytes in pages of at most 32 KiB */
    char *json = NULL;
    assert_int_equal(gr_client_stats(c, 0, &json), 0);
    assert_non_null(strstr(json, "\"snapshots\":1,"));
    free(json);
    gr_serve_destroy(s);
    free(keys), free(grads), free(want), free(got);
    gr_client_destroy(c);
    assert_int_equal(ps_test_server_stop(&srv, 0), 0);
}

static void test_shard_restart_resubscribes(void **state)
{
    (void)state;
    ps_test_server srv;
    assert_int_equal(ps_test_server_start(&srv, 0, 1, 0, publish_args), 0);
    uint16_t port = srv.port;
    char addr[64];
    snprintf(addr, sizeof addr, "%s", srv.addr);
    gr_client *c = connect_to(addr);
    assert_int_equal(gr_client_create_table(c, SPEC), 0);
    gr_serve *s = replica(addr, NULL, NULL, 0, 0);
    uint64_t keys[NKEYS];
    push_all(c, 1.0f, keys);
    assert_true(wait_same_rows(s, c, keys));
    gr_client_destroy(c);
    assert_int_equal(ps_test_server_stop(&srv, 0), 0);
    gr_serve_stats st;
    for (int i = 0; i < 500; i++) {
        gr_serve_get_stats(s, &st);
        if (!st.shards_connected) break;
        usleep(10000);
    }
    assert_int_equal(st.shards_connected, 0);
    /* The shard comes back (same address, fresh state) and trains different rows: the replica
     * sees a new epoch, takes a snapshot and follows the new shard. */
    assert_int_equal(ps_test_server_start(&srv, 0, 1, port, publish_args), 0);
    c = connect_to(addr);
    assert_int_equal(gr_client_create_table(c, SPEC), 0);
    push_all(c, -3.0f, keys);
    assert_true(wait_same_rows(s, c, keys));
    gr_serve_get_stats(s, &st);
    assert_int_equal(st.shards_connected, 1);
    gr_serve_destroy(s);
    gr_client_destroy(c);
    assert_int_equal(ps_test_server_stop(&srv, 0), 0);
}

/* Scores the test file with a replica in batches of `batch`: AUC and logloss. */
static void replica_scores(gr_serve *s, const char *test, size_t batch, double *auc, double *ll,
                           size_t *count)
{
    gr_criteo_opts ro;
    gr_criteo_opts_default(&ro);
    ro.batch = batch;
    gr_criteo_reader *r;
    assert_int_equal(gr_criteo_open(test, &ro, &r), 0);
    gr_batch b;
    assert_int_equal(gr_batch_init(&b, batch), 0);
    float *probs = malloc(10000 * sizeof *probs), *labels = malloc(10000 * sizeof *labels);
    size_t n = 0;
    while (gr_criteo_next(r, &b) == 0 && b.n) {
        assert_int_equal(gr_serve_predict(s, b.n, b.dense, b.ids, probs + n, NULL), 0);
        memcpy(labels + n, b.labels, b.n * sizeof *labels);
        n += b.n;
    }
    gr_criteo_close(r);
    gr_batch_fini(&b);
    assert_int_equal(gr_auc(probs, labels, n, auc), 0);
    *ll = gr_logloss(probs, labels, n);
    *count = n;
    free(probs), free(labels);
}

static void test_scores_equal_trainer(void **state)
{
    (void)state;
    tr_fixture fx;
    assert_int_equal(tr_fixture_make(&fx, "serve", 5), 0);
    ps_test_server srv;
    const char *args[] = {"--publish-interval", "50", "--ckpt-root", fx.dir, NULL};
    assert_int_equal(ps_test_server_start(&srv, 0, 1, 0, args), 0);
    gr_client *c = connect_to(srv.addr);
    gr_ps_backend_opts po;
    gr_ps_backend_opts_default(&po);
    po.client = c;
    gr_train_backend be;
    assert_int_equal(gr_ps_backend_create(&po, &be), 0);
    gr_train_opts o;
    tr_fixture_small_dlrm(&fx, &o, GR_MODE_ASYNC, 1);
    o.ckpt_dir = "ck"; /* under the shard's --ckpt-root: fx.dir/ck */
    gr_train_result res;
    assert_int_equal(gr_train_run(&o, &be, &res), 0);
    gr_train_backend_destroy(&be);

    /* A replica of the trained model, fed by the shard only. */
    gr_serve_config cfg;
    gr_serve_config_default(&cfg);
    cfg.model = &o.model;
    cfg.from = srv.addr;
    gr_serve *s = NULL;
    assert_int_equal(gr_serve_create(&cfg, &s), 0);
    assert_int_equal(gr_serve_start(s), 0);
    gr_serve_stats st;
    for (int i = 0; i < 1500; i++) {
        gr_serve_get_stats(s, &st);
        if (st.publications && st.dense_version) break;
        usleep(10000);
    }
    assert_true(st.dense_version > 0);
    double auc, ll;
    size_t n;
    replica_scores(s, fx.test, o.batch, &auc, &ll, &n);
    fprintf(stderr, "trainer AUC %.9f logloss %.9f, replica AUC %.9f logloss %.9f\n",
            res.test_auc, res.test_logloss, auc, ll);
    assert_int_equal(n, res.test_examples);
    assert_true(auc == res.test_auc);
    assert_true(ll == res.test_logloss);
    assert_true(auc > 0.6);
    gr_serve_destroy(s);

    /* Bootstrap from the checkpoint the run saved, without any shard: the same scores, from
     * the root (its newest checkpoint) and from the checkpoint itself. */
    char root[256], one[512];
    snprintf(root, sizeof root, "%s/ck", fx.dir);
    snprintf(one, sizeof one, "%s/%s", root, res.ckpt_last);
    const char *dirs[2] = {root, one};
    for (int i = 0; i < 2; i++) {
        gr_serve_config bc;
        gr_serve_config_default(&bc);
        bc.model_dir = dirs[i];
        int rc = gr_serve_create(&bc, &s);
        if (rc) fprintf(stderr, "bootstrap %s: %s\n", dirs[i], gr_errmsg());
        assert_int_equal(rc, 0);
        double a2, l2;
        replica_scores(s, fx.test, o.batch, &a2, &l2, &n);
        assert_true(a2 == res.test_auc && l2 == res.test_logloss);
        gr_serve_stats bs;
        gr_serve_get_stats(s, &bs);
        assert_true(bs.rows > 1000 && bs.dense_version == 1);
        gr_serve_destroy(s);
    }
    gr_serve_config bad;
    gr_serve_config_default(&bad);
    bad.model_dir = fx.train; /* a file, not a saved model */
    assert_int_not_equal(gr_serve_create(&bad, &s), 0);
    gr_serve_config_default(&bad);
    assert_int_equal(bad.slice_us, 0); /* the kernel's slice unless asked (--slice-us) */
    bad.model_dir = root;
    bad.slice_us = 50; /* under the kernel's 0.1 ms floor: refused, naming the option */
    assert_int_equal(gr_serve_create(&bad, &s), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "--slice-us 50"));
    gr_client_destroy(c);
    assert_int_equal(ps_test_server_stop(&srv, 0), 0);
    tr_fixture_remove(&fx);
}

/* ---- the HTTP and binary faces ---- */

static int post(uint16_t port, const char *path, const char *body, gr_http_result *r)
{
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", port, path);
    return gr_http_fetch("POST", url, "Content-Type: application/json\r\n", body, strlen(body), 10000, r);
}

static void expect(uint16_t port, const char *method, const char *path, const char *body,
                   int status, const char *needle)
{
    gr_http_result r;
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", port, path);
    assert_int_equal(gr_http_fetch(method, url, NULL, body, body ? strlen(body) : 0, 10000, &r), 0);
    if (r.status != status || (needle && !strstr(r.body, needle)))
        fprintf(stderr, "%s %s: got %d %s\n", method, path, r.status, r.body);
    assert_int_equal(r.status, status);
    if (needle) assert_non_null(strstr(r.body, needle));
    gr_http_result_free(&r);
}

static const char *LINE0 = "1\t2\t\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13\t"
                           "68fd1e64\t\t0\t1\t2\t3\t4\t5\t6\t7\t8\t9\ta\tb\tc\td\te\tf\t10\t11\t12\t13\t14\t15\t16\t17";

static void test_http_and_binary_faces(void **state)
{
    (void)state;
    gr_serve *s = replica(NULL, "127.0.0.1:0", "127.0.0.1:0", 4, 4096);
    uint16_t hp = gr_serve_http_port(s);
    size_t np = gr_model_dense_size(gr_serve_model(s));
    float *params = calloc(np, sizeof *params);
    for (size_t i = 0; i < np; i++) params[i] = 0.01f * (float)i;
    uint64_t id0 = gr_criteo_feature_id(0, 0x68fd1e64);
    float w = 0.7f;
    /* Before any dense parameters: predict says the model is not there yet. */
    char body[2048];
    snprintf(body, sizeof body, "{\"lines\":[\"%s\"]}", LINE0);
    expect(hp, "POST", "/v1/predict", body, 503, "no dense parameters");
    assert_int_equal(gr_serve_set_dense(s, params, np, 1), 0);
    assert_int_equal(gr_serve_put_rows(s, GR_TRAIN_EMB_TABLE, 1, &id0, 1, &w, 2), 0);

    /* Both body forms give the same score, equal to the library's. */
    gr_http_result r;
    assert_int_equal(post(hp, "/v1/predict", body, &r), 0);
    assert_int_equal(r.status, 200);
    double p_lines = -1;
    char *at = strstr(r.body, "\"predictions\":[");
    assert_non_null(at);
    p_lines = strtod(at + 15, NULL);
    assert_non_null(strstr(r.body, "\"model_version\":2"));
    gr_http_result_free(&r);
    const char *ex = "{\"examples\":[{\"dense\":[1,2,null,4,5,6,7,8,9,10,11,12,13],"
                     "\"cat\":[\"68fd1e64\",null,\"0\",\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\","
                     "\"9\",\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"10\",\"11\",\"12\",\"13\",\"14\","
                     "\"15\",\"16\",\"17\"]}]}";
    assert_int_equal(post(hp, "/v1/predict", ex, &r), 0);
    assert_int_equal(r.status, 200);
    at = strstr(r.body, "\"predictions\":[");
    double p_ex = strtod(at + 15, NULL);
    gr_http_result_free(&r);
    float label, dense[GR_CRITEO_DENSE], prob;
    uint64_t ids[GR_CRITEO_SPARSE];
    char full[1024];
    snprintf(full, sizeof full, "0\t%s", LINE0);
    assert_int_equal(gr_criteo_parse_line(full, strlen(full), &label, dense, ids), 0);
    assert_int_equal(gr_serve_predict(s, 1, dense, ids, &prob, NULL), 0);
    assert_true((float)p_lines == prob && (float)p_ex == prob);

    /* Bad input: 4xx with a message; the replica keeps serving. */
    expect(hp, "POST", "/v1/predict", "{\"lines\":[", 400, "not valid JSON");
    expect(hp, "POST", "/v1/predict", "{\"lines\":[\"1\\t2\"]}", 400, "has 2 fields, expected 39");
    expect(hp, "POST", "/v1/predict", "{\"rows\":[]}", 400, "\\\"examples\\\"");
    expect(hp, "POST", "/v1/predict", "{\"examples\":[{\"dense\":[1],\"cat\":[]}]}", 400,
           "1 dense and 0 cat values");
    expect(hp, "POST", "/v1/predict",
           "{\"examples\":[{\"dense\":[1.5,2,null,4,5,6,7,8,9,10,11,12,13],\"cat\":[null,null,null,"
           "null,null,null,null,null,null,null,null,null,null,null,null,null,null,null,null,null,"
           "null,null,null,null,null,null]}]}", 400, "dense[0] must be an integer");
    snprintf(body, sizeof body, "{\"lines\":[\"%s\",\"%s\",\"%s\",\"%s\",\"%s\"]}", LINE0, LINE0,
             LINE0, LINE0, LINE0);
    expect(hp, "POST", "/v1/predict", body, 413, "over the limit of 4");
    char *big = malloc(8192);
    memset(big, ' ', 8191);
    big[8191] = 0;
    expect(hp, "POST", "/v1/predict", big, 413, NULL);
    free(big);
    expect(hp, "POST", "/v1/lookup", "{\"table\":\"nope\",\"ids\":[1]}", 404, "no table named 'nope'");
    expect(hp, "POST", "/v1/lookup", "{\"table\":1,\"ids\":[-1]}", 400, "ids[0]");
    expect(hp, "GET", "/v1/predict", NULL, 405, "takes POST");
    expect(hp, "GET", "/v2/x", NULL, 404, "no endpoint /v2/x");
    char lk[128];
    snprintf(lk, sizeof lk, "{\"table\":1,\"ids\":[\"%llu\",5]}", (unsigned long long)id0);
    expect(hp, "POST", "/v1/lookup", lk, 200, "\"rows\":[[0.699999988],[0]],\"found\":[true,false]");
    expect(hp, "GET", "/v1/model", NULL, 200, "\"kind\":\"lr\"");
    expect(hp, "GET", "/healthz", NULL, 200, "ok");
    expect(hp, "GET", "/metrics", NULL, 200, "granary_serve_errors_total 11");

    /* The binary protocol: predict and lookup, an opcode it does not answer, then more. */
    int fd = ps_test_connect(gr_serve_port(s));
    assert_true(fd >= 0);
    for (int round = 0; round < 2; round++) {
        gr_proto_buf b;
        gr_proto_buf_init(&b);
        uint16_t op = round ? GR_OP_PUSH : GR_OP_PREDICT;
        gr_proto_predict q = {.n = 1, .ndense = GR_CRITEO_DENSE, .nsparse = GR_CRITEO_SPARSE,
                              .dense = dense, .ids = ids};
        assert_int_equal(gr_proto_begin(&b, GR_PROTO_REQUEST, op, 0, 0, 7 + round), 0);
        assert_int_equal(gr_proto_put_predict(&b, &q), 0);
        assert_int_equal(gr_proto_end(&b, 0), 0);
        assert_int_equal(write(fd, b.data, b.len), (ssize_t)b.len);
        uint8_t hb[GR_PROTO_HEADER_SIZE];
        assert_int_equal(read(fd, hb, sizeof hb), (ssize_t)sizeof hb);
        gr_proto_header h;
        gr_proto_limits lim;
        gr_proto_limits_default(&lim);
        gr_proto_header_decode(hb, sizeof hb, &lim, &h, NULL);
        uint8_t *rb = malloc(h.body_len + 8);
        size_t got = 0;
        while (got < h.body_len) got += (size_t)read(fd, rb + got, h.body_len - got);
        assert_int_equal(h.id, 7 + round);
        if (!round) {
            assert_int_equal(h.status, 0);
            uint64_t ver;
            const float *pp;
            uint32_t n;
            assert_int_equal(gr_proto_decode_predict_reply(rb, h.body_len, &ver, &pp, &n), 0);
            assert_true(n == 1 && pp[0] == prob && ver == 2);
        } else {
            assert_int_equal(h.status, GR_EPROTO);
        }
        free(rb);
        gr_proto_buf_fini(&b);
    }
    close(fd);
    free(params);
    gr_serve_destroy(s);
}

/* The command line refuses what it cannot serve, naming why. */
/* ---- coalesced one-example predicts ---- */

enum { CO_THREADS = 8, CO_EACH = 30, CO_N = CO_THREADS * CO_EACH };

typedef struct co_case {
    uint16_t port;
    char (*lines)[1024];
    const float *want;
    int first, count;
    atomic_int bad;
} co_case;

static void *co_client(void *arg)
{
    co_case *c = arg;
    for (int i = c->first; i < c->first + c->count; i++) {
        char body[1200];
        snprintf(body, sizeof body, "{\"lines\":[\"%s\"]}", c->lines[i]);
        gr_http_result r;
        if (post(c->port, "/v1/predict", body, &r) || r.status != 200) {
            atomic_fetch_add(&c->bad, 1);
            continue;
        }
        const char *at = strstr(r.body, "\"predictions\":[");
        if (!at || (float)strtod(at + 15, NULL) != c->want[i]) atomic_fetch_add(&c->bad, 1);
        gr_http_result_free(&r);
    }
    return NULL;
}

/* A DLRM replica answers one-example predicts from 8 clients at once (its handler threads
 * coalesce what they read together): every reply is the score the example gets alone, to the
 * bit, and each request counts as one predict; gr_serve_predict_each over all of them equals
 * gr_serve_predict one by one. */
static void test_coalesced_predicts_equal_alone(void **state)
{
    (void)state;
    gr_model_config mc;
    gr_model_config_default(&mc, GR_MODEL_DLRM);
    gr_serve_config cfg;
    gr_serve_config_default(&cfg);
    cfg.model = &mc;
    cfg.http = "127.0.0.1:0";
    cfg.threads = 2;
    cfg.coalesce = true;
    gr_serve *s = NULL;
    assert_int_equal(gr_serve_create(&cfg, &s), 0);
    assert_int_equal(gr_serve_start(s), 0);
    const gr_model *m = gr_serve_model(s);
    uint16_t hp = gr_serve_http_port(s);
    char one[1200];
    snprintf(one, sizeof one, "{\"lines\":[\"%s\"]}", LINE0);
    /* Parked, then refused by the run: no model yet (503, one error). */
    expect(hp, "POST", "/v1/predict", one, 503, "no dense parameters");
    size_t np = gr_model_dense_size(m);
    float *params = malloc(np * sizeof *params);
    gr_model_init_dense(m, params);
    assert_int_equal(gr_serve_set_dense(s, params, np, 1), 0);
    /* Answered without parking: a bad body, and a predict of two examples. */
    expect(hp, "POST", "/v1/predict", "{\"lines\":[\"1\\t2\"]}", 400, "has 2 fields");
    char two[2400];
    snprintf(two, sizeof two, "{\"lines\":[\"%s\",\"%s\"]}", LINE0, LINE0);
    expect(hp, "POST", "/v1/predict", two, 200, "\"predictions\":[");
    expect(hp, "GET", "/v1/predict", NULL, 405, "takes POST");
    gr_serve_stats sb;
    gr_serve_get_stats(s, &sb);
    assert_int_equal(sb.coalesced_requests, 1); /* only the first */
    assert_int_equal(sb.errors, 3);
    gr_rng r;
    gr_rng_seed(&r, 31);
    char(*lines)[1024] = malloc(CO_N * sizeof *lines);
    float *dense = malloc(CO_N * GR_CRITEO_DENSE * sizeof *dense), *want = malloc(CO_N * sizeof *want);
    uint64_t *ids = malloc(CO_N * GR_CRITEO_SPARSE * sizeof *ids);
    for (int i = 0; i < CO_N; i++) {
        int len = 0;
        for (int f = 0; f < GR_CRITEO_DENSE; f++)
            len += snprintf(lines[i] + len, 1024 - (size_t)len, "%u\t", (unsigned)(gr_rng_next(&r) % 50));
        for (int f = 0; f < GR_CRITEO_SPARSE; f++)
            len += snprintf(lines[i] + len, 1024 - (size_t)len, "%x%s", (unsigned)(gr_rng_next(&r) % 40),
                            f + 1 < GR_CRITEO_SPARSE ? "\t" : "");
        char full[1100];
        float label;
        snprintf(full, sizeof full, "0\t%s", lines[i]);
        assert_int_equal(gr_criteo_parse_line(full, strlen(full), &label, dense + i * GR_CRITEO_DENSE,
                                              ids + i * GR_CRITEO_SPARSE), 0);
    }
    /* Rows for most ids (a few stay absent and read zeros). */
    for (int i = 0; i < CO_N * GR_CRITEO_SPARSE; i += 2) {
        float row[16];
        for (int k = 0; k < 16; k++) row[k] = (float)(gr_rng_uniform(&r) - 0.5);
        assert_int_equal(gr_serve_put_rows(s, GR_TRAIN_EMB_TABLE, 16, ids + i, 1, row, 1), 0);
    }
    for (int i = 0; i < CO_N; i++)
        assert_int_equal(gr_serve_predict(s, 1, dense + i * GR_CRITEO_DENSE,
                                          ids + i * GR_CRITEO_SPARSE, want + i, NULL), 0);
    float *each = malloc(CO_N * sizeof *each);
    uint64_t ver = 0;
    assert_int_equal(gr_serve_predict_each(s, CO_N, dense, ids, each, &ver), 0);
    assert_int_equal(memcmp(each, want, CO_N * sizeof *want), 0);
    assert_int_equal(ver, 1);
    gr_serve_stats st0, st1;
    gr_serve_get_stats(s, &st0);
    co_case cases[CO_THREADS];
    pthread_t t[CO_THREADS];
    for (int k = 0; k < CO_THREADS; k++) {
        cases[k] = (co_case){.port = hp, .lines = lines, .want = want,
                             .first = k * CO_EACH, .count = CO_EACH};
        assert_int_equal(pthread_create(&t[k], NULL, co_client, &cases[k]), 0);
    }
    int bad = 0;
    for (int k = 0; k < CO_THREADS; k++) {
        pthread_join(t[k], NULL);
        bad += atomic_load(&cases[k].bad);
    }
    assert_int_equal(bad, 0);
    gr_serve_get_stats(s, &st1);
    assert_int_equal(st1.predicts - st0.predicts, CO_N);
    assert_int_equal(st1.predict_examples - st0.predict_examples, CO_N);
    assert_int_equal(st1.errors, st0.errors);
    /* Every one of them was parked; runs hold one or more. */
    assert_int_equal(st1.coalesced_requests - st0.coalesced_requests, CO_N);
    assert_true(st1.coalesced_runs > st0.coalesced_runs);
    assert_true(st1.coalesced_runs - st0.coalesced_runs <= CO_N);
    fprintf(stderr, "coalesced: %llu requests in %llu runs\n",
            (unsigned long long)(st1.coalesced_requests - st0.coalesced_requests),
            (unsigned long long)(st1.coalesced_runs - st0.coalesced_runs));
    gr_serve_destroy(s);
    free(params), free(lines), free(dense), free(want), free(ids), free(each);
}

static void test_serve_command_errors(void **state)
{
    (void)state;
    char out[4096];
    const char *none[] = {"serve", "--model", "/tmp", NULL};
    assert_int_equal(ps_test_run_granary(none, out, sizeof out), 2);
    assert_non_null(strstr(out, "--http"));
    const char *zk[] = {"serve", "--from", "zk://h:2181/x", "--http", "127.0.0.1:0", NULL};
    assert_int_equal(ps_test_run_granary(zk, out, sizeof out), 2);
    assert_non_null(strstr(out, "ZooKeeper"));
    const char *nothing[] = {"serve", "--http", "127.0.0.1:0", NULL};
    assert_int_equal(ps_test_run_granary(nothing, out, sizeof out), 2);
    assert_non_null(strstr(out, "--model DIR"));
    const char *missing[] = {"serve", "--model", "/nonexistent/granary", "--http", "127.0.0.1:0", NULL};
    assert_int_equal(ps_test_run_granary(missing, out, sizeof out), 1);
    assert_non_null(strstr(out, "/nonexistent/granary"));
    const char *badnum[] = {"serve", "--from", "127.0.0.1:1", "--http", "127.0.0.1:0",
                            "--max-batch", "0", NULL};
    assert_int_equal(ps_test_run_granary(badnum, out, sizeof out), 2);
    assert_non_null(strstr(out, "--max-batch"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deltas_visible_and_late_replica),
        cmocka_unit_test(test_dense_reaches_every_replica),
        cmocka_unit_test(test_paged_snapshot),
        cmocka_unit_test(test_shard_restart_resubscribes),
        cmocka_unit_test(test_scores_equal_trainer),
        cmocka_unit_test(test_http_and_binary_faces),
        cmocka_unit_test(test_coalesced_predicts_equal_alone),
        cmocka_unit_test(test_serve_command_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
