/* The replica's HTTP/JSON API on the shared HTTP server (include/granary/http.h):
 * POST /v1/predict, POST /v1/lookup, GET /v1/model, GET /healthz, GET /metrics. Every example
 * goes through the trainer's own line parser (gr_criteo_parse_line), whichever body form it
 * came in, so a served score sees exactly the inputs training saw. Bad input gets a 4xx with a
 * message naming what was wrong; nothing a request carries can stop the replica. */
#include "serve/serve_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A growing text buffer for responses. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + (size_t)k + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

static void sb_send(sbuf *b, gr_http_response *resp, const char *type)
{
    if (b->oom || !b->p) {
        free(b->p);
        gr_http_error(resp, 500, "out of memory building the response");
        return;
    }
    gr_http_take(resp, 200, type, b->p, b->n);
}

/* ---- examples ---- */

typedef struct examples {
    size_t n;
    float *dense;  /* n * GR_CRITEO_DENSE */
    uint64_t *ids; /* n * GR_CRITEO_SPARSE */
} examples;

static void examples_free(examples *e)
{
    free(e->dense);
    free(e->ids);
}

/* Parses one example line (no label) into slot i of e. */
static int parse_line(examples *e, size_t i, const char *line, size_t len, char *err, size_t errlen)
{
    char small[1024]; /* a Criteo line is a few hundred bytes: no allocation per example */
    char *buf = len + 3 <= sizeof small ? small : malloc(len + 3);
    if (!buf) return snprintf(err, errlen, "out of memory"), GR_ENOMEM;
    buf[0] = '0';
    buf[1] = '\t';
    memcpy(buf + 2, line, len);
    float label;
    int rc = gr_criteo_parse_line(buf, len + 2, &label, e->dense + i * GR_CRITEO_DENSE,
                                  e->ids + i * GR_CRITEO_SPARSE);
    if (buf != small) free(buf);
    if (rc) {
        /* The parser counts the label as a field; the line a caller sent has none. */
        const char *m = gr_errmsg();
        int fields = 0;
        if (sscanf(m, "has %d fields", &fields) == 1)
            snprintf(err, errlen, "example %zu: has %d fields, expected %d (13 dense and 26 "
                     "categorical, tab-separated, no label)", i, fields - 1, GR_CRITEO_FIELDS - 1);
        else snprintf(err, errlen, "example %zu: %s", i, m);
    }
    return rc;
}

/* {"dense": [13 integers or null], "cat": [26 hex strings or null]} as a TSV line for the
 * parser. */
static int example_line(const cJSON *ex, size_t i, char *line, size_t cap, size_t *len, char *err,
                        size_t errlen)
{
    const cJSON *dense = cJSON_GetObjectItemCaseSensitive(ex, "dense");
    const cJSON *cat = cJSON_GetObjectItemCaseSensitive(ex, "cat");
    if (!cJSON_IsObject(ex) || !cJSON_IsArray(dense) || !cJSON_IsArray(cat))
        return snprintf(err, errlen, "example %zu: needs \"dense\" and \"cat\" arrays", i), GR_EINVAL;
    int nd = cJSON_GetArraySize(dense), nc = cJSON_GetArraySize(cat);
    if (nd != GR_CRITEO_DENSE || nc != GR_CRITEO_SPARSE)
        return snprintf(err, errlen, "example %zu: has %d dense and %d cat values, expected %d and %d",
                        i, nd, nc, GR_CRITEO_DENSE, GR_CRITEO_SPARSE), GR_EINVAL;
    size_t n = 0;
    int f = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, dense) {
        if (cJSON_IsNull(v)) {
        } else if (cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) &&
                   fabs(v->valuedouble) < 1e18) {
            n += (size_t)snprintf(line + n, cap - n, "%lld", (long long)v->valuedouble);
        } else {
            return snprintf(err, errlen, "example %zu: dense[%d] must be an integer or null", i, f),
                   GR_EINVAL;
        }
        n += (size_t)snprintf(line + n, cap - n, "\t");
        f++;
    }
    f = 0;
    cJSON_ArrayForEach(v, cat) {
        if (cJSON_IsString(v)) {
            if (strlen(v->valuestring) > 16)
                return snprintf(err, errlen, "example %zu: cat[%d] is longer than 8 hex digits", i, f),
                       GR_EINVAL;
            n += (size_t)snprintf(line + n, cap - n, "%s", v->valuestring);
        } else if (!cJSON_IsNull(v)) {
            return snprintf(err, errlen, "example %zu: cat[%d] must be a hex string or null", i, f),
                   GR_EINVAL;
        }
        if (++f < GR_CRITEO_SPARSE) n += (size_t)snprintf(line + n, cap - n, "\t");
    }
    *len = n;
    return GR_OK;
}

static int read_examples(uint32_t max_batch, const cJSON *root, examples *e, char *err,
                         size_t errlen)
{
    const cJSON *exs = cJSON_GetObjectItemCaseSensitive(root, "examples");
    const cJSON *lines = cJSON_GetObjectItemCaseSensitive(root, "lines");
    const cJSON *arr = exs ? exs : lines;
    if (!cJSON_IsObject(root) || (exs && lines) || !cJSON_IsArray(arr))
        return snprintf(err, errlen, "the body needs one of \"examples\" (objects with \"dense\" "
                        "and \"cat\") or \"lines\" (TSV strings without a label)"), GR_EINVAL;
    int n = cJSON_GetArraySize(arr);
    if (n == 0) return snprintf(err, errlen, "no examples"), GR_EINVAL;
    if ((uint32_t)n > max_batch)
        return snprintf(err, errlen, "%d examples is over the limit of %u per request", n,
                        max_batch), GR_ETOOBIG;
    e->n = (size_t)n;
    e->dense = malloc(e->n * GR_CRITEO_DENSE * sizeof *e->dense);
    e->ids = malloc(e->n * GR_CRITEO_SPARSE * sizeof *e->ids);
    if (!e->dense || !e->ids) return snprintf(err, errlen, "out of memory"), GR_ENOMEM;
    char line[1024];
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) {
        int rc;
        if (exs) {
            size_t len;
            if ((rc = example_line(v, i, line, sizeof line, &len, err, errlen))) return rc;
            rc = parse_line(e, i, line, len, err, errlen);
        } else if (!cJSON_IsString(v)) {
            return snprintf(err, errlen, "line %zu is not a string", i), GR_EINVAL;
        } else {
            rc = parse_line(e, i, v->valuestring, strlen(v->valuestring), err, errlen);
        }
        if (rc) return rc;
        i++;
    }
    return GR_OK;
}

static int status_of(int rc)
{
    switch (rc) {
    case GR_ETOOBIG: return 413;
    case GR_ENOENT: return 404;
    case GR_ENOMEM: return 503;
    default: return 400;
    }
}

int gr_serve_parse_predict(const char *body, size_t len, uint32_t max, size_t *n, float **dense,
                           uint64_t **ids, char *err, size_t errlen)
{
    if (sv_parse_lines_fast(body, len, max, n, dense, ids)) return GR_OK;
    return sv_parse_predict_json(body, len, max, n, dense, ids, err, errlen);
}

int sv_parse_predict_json(const char *body, size_t len, uint32_t max, size_t *n, float **dense,
                          uint64_t **ids, char *err, size_t errlen)
{
    *n = 0;
    *dense = NULL;
    *ids = NULL;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) return snprintf(err, errlen, "the body is not valid JSON"), GR_EINVAL;
    examples e = {0};
    int rc = read_examples(max, root, &e, err, errlen);
    cJSON_Delete(root);
    if (rc) {
        examples_free(&e);
        return rc;
    }
    *n = e.n;
    *dense = e.dense;
    *ids = e.ids;
    return GR_OK;
}

/* The predict reply, or its error (counted here unless gr_serve_predict counted it). */
static void predict_answer(gr_serve *s, int rc, bool counted, const char *err, const float *probs,
                           size_t n, uint64_t version, gr_http_response *resp)
{
    if (rc) {
        if (!counted) atomic_fetch_add(&s->errors, 1);
        gr_http_error(resp, rc == GR_ENOENT ? 503 : status_of(rc), "%s", err);
        return;
    }
    char *body;
    size_t len;
    if (sv_predict_reply(probs, n, version, &body, &len))
        gr_http_error(resp, 500, "out of memory building the response");
    else gr_http_take(resp, 200, "application/json", body, len);
}

/* Scores parsed examples now and answers. */
static void predict_now(gr_serve *s, const examples *e, gr_http_response *resp)
{
    char err[512] = "";
    float *probs = malloc(e->n * sizeof *probs);
    uint64_t version = 0;
    int rc = GR_OK;
    bool counted = false; /* gr_serve_predict counts its own failures */
    if (!probs) rc = GR_ENOMEM, snprintf(err, sizeof err, "out of memory");
    else if ((rc = gr_serve_predict(s, e->n, e->dense, e->ids, probs, &version))) {
        snprintf(err, sizeof err, "%s", gr_errmsg());
        counted = true;
    }
    predict_answer(s, rc, counted, err, probs, e->n, version, resp);
    free(probs);
}

static void do_predict(gr_serve *s, const gr_http_request *req, gr_http_response *resp)
{
    examples e = {0};
    char err[512];
    int rc = gr_serve_parse_predict(req->body, req->body_len, s->cfg.max_batch, &e.n, &e.dense,
                                    &e.ids, err, sizeof err);
    if (rc) predict_answer(s, rc, false, err, NULL, 0, 0, resp);
    else predict_now(s, &e, resp);
    examples_free(&e);
}

/* ---- coalesced one-example predicts (gr_http park / run / reply) ----
 * A one-example predict is parsed when its handler thread reads it and parked; at the
 * thread's next pass every request it parked is scored in one gr_serve_predict_each (one pass
 * over the layers' weights for several examples, each score bitwise what it gets alone), and
 * each is answered. Everything else, predicts of several examples and bad bodies included, is
 * answered at once as without coalescing. */

typedef struct sv_job {
    examples e; /* one example */
    float prob;
    uint64_t version;
    int rc;
    char err[256];
} sv_job;

int sv_http_park(void *ctx, const gr_http_request *req, gr_http_response *resp, void **job)
{
    gr_serve *s = ctx;
    if (strcmp(req->path, "/v1/predict") || strcmp(req->method, "POST")) return GR_HTTP_DECLINED;
    examples e = {0};
    char err[512];
    int rc = gr_serve_parse_predict(req->body, req->body_len, s->cfg.max_batch, &e.n, &e.dense,
                                    &e.ids, err, sizeof err);
    sv_job *j = !rc && e.n == 1 ? malloc(sizeof *j) : NULL;
    if (!j) {
        if (rc) predict_answer(s, rc, false, err, NULL, 0, 0, resp);
        else predict_now(s, &e, resp);
        examples_free(&e);
        return GR_HTTP_ANSWERED;
    }
    j->e = e;
    j->rc = GR_OK;
    *job = j;
    return GR_HTTP_PARKED;
}

void sv_http_run(void *ctx, void **jobs, size_t n)
{
    gr_serve *s = ctx;
    const size_t nd = GR_CRITEO_DENSE, ns = GR_CRITEO_SPARSE;
    atomic_fetch_add(&s->coalesced_runs, 1);
    atomic_fetch_add(&s->coalesced_requests, n);
    float *dense = malloc(n * nd * sizeof *dense), *probs = malloc(n * sizeof *probs);
    uint64_t *ids = malloc(n * ns * sizeof *ids);
    size_t chunk = s->cfg.max_batch < n ? s->cfg.max_batch : n;
    for (size_t at = 0; at < n; at += chunk) {
        size_t m = n - at < chunk ? n - at : chunk;
        uint64_t version = 0;
        int rc = dense && probs && ids ? GR_OK : gr_seterr(GR_ENOMEM, "out of memory");
        for (size_t i = 0; !rc && i < m; i++) {
            const sv_job *j = jobs[at + i];
            memcpy(dense + i * nd, j->e.dense, nd * sizeof *dense);
            memcpy(ids + i * ns, j->e.ids, ns * sizeof *ids);
        }
        if (!rc) rc = gr_serve_predict_each(s, m, dense, ids, probs, &version);
        else atomic_fetch_add(&s->errors, m);
        for (size_t i = 0; i < m; i++) {
            sv_job *j = jobs[at + i];
            j->rc = rc;
            if (rc) snprintf(j->err, sizeof j->err, "%s", gr_errmsg());
            else j->prob = probs[i], j->version = version;
        }
    }
    free(dense), free(probs), free(ids);
}

void sv_http_reply(void *ctx, void *job, gr_http_response *resp)
{
    sv_job *j = job;
    if (resp) predict_answer(ctx, j->rc, true, j->err, &j->prob, 1, j->version, resp);
    examples_free(&j->e);
    free(j);
}

/* An id as a JSON number (exact up to 2^53) or a decimal string (any u64). */
static bool read_id(const cJSON *v, uint64_t *out)
{
    if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 9007199254740992.0 &&
        v->valuedouble == floor(v->valuedouble)) {
        *out = (uint64_t)v->valuedouble;
        return true;
    }
    if (cJSON_IsString(v) && v->valuestring[0] >= '0' && v->valuestring[0] <= '9') {
        char *end;
        errno = 0;
        unsigned long long x = strtoull(v->valuestring, &end, 10);
        if (*end || errno) return false;
        *out = x;
        return true;
    }
    return false;
}

static void do_lookup(gr_serve *s, const gr_http_request *req, gr_http_response *resp)
{
    cJSON *root = cJSON_ParseWithLength(req->body, req->body_len);
    char err[512] = "";
    int status = 0;
    uint32_t id = 0, dim = 0;
    uint64_t *keys = NULL;
    float *rows = NULL;
    bool *found = NULL;
    int n = 0;
    const cJSON *tab = root ? cJSON_GetObjectItemCaseSensitive(root, "table") : NULL;
    const cJSON *ids = root ? cJSON_GetObjectItemCaseSensitive(root, "ids") : NULL;
    if (!root) {
        status = 400, snprintf(err, sizeof err, "the body is not valid JSON");
    } else if (!cJSON_IsArray(ids) || !(cJSON_IsString(tab) || cJSON_IsNumber(tab))) {
        status = 400, snprintf(err, sizeof err, "the body needs \"table\" (a name or id) and \"ids\" (an array)");
    } else if (cJSON_IsString(tab) && gr_serve_table_find(s, tab->valuestring, &id, &dim)) {
        status = 404, snprintf(err, sizeof err, "%s", gr_errmsg());
    } else if (cJSON_IsNumber(tab)) {
        sv_table *t = tab->valuedouble >= 0 && tab->valuedouble < 4294967296.0
                          ? sv_find_table(s, (uint32_t)tab->valuedouble) : NULL;
        if (!t) status = 404, snprintf(err, sizeof err, "the replica has no table with id %g", tab->valuedouble);
        else id = t->id, dim = t->dim;
    }
    if (!status) {
        n = cJSON_GetArraySize(ids);
        if ((uint64_t)n * dim > (uint64_t)s->cfg.max_batch * 64)
            status = 413, snprintf(err, sizeof err, "%d ids is over the limit of %llu values per request", n,
                                   (unsigned long long)s->cfg.max_batch * 64 / dim);
    }
    if (!status) {
        keys = malloc((n ? n : 1) * sizeof *keys);
        rows = malloc((n ? n : 1) * (size_t)dim * sizeof *rows);
        found = malloc((n ? n : 1) * sizeof *found);
        if (!keys || !rows || !found) status = 503, snprintf(err, sizeof err, "out of memory");
        int i = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, ids) {
            if (status) break;
            if (!read_id(v, &keys[i]))
                status = 400, snprintf(err, sizeof err, "ids[%d] is not an id (a whole number up to 2^53, or a decimal string)", i);
            i++;
        }
    }
    if (!status && gr_serve_lookup(s, id, keys, (size_t)n, rows, found))
        status = 404, snprintf(err, sizeof err, "%s", gr_errmsg());
    if (status) {
        atomic_fetch_add(&s->errors, 1);
        gr_http_error(resp, status, "%s", err);
    } else {
        sbuf b = {0};
        sv_table *t = sv_find_table(s, id);
        sb_printf(&b, "{\"table\":\"%s\",\"id\":%u,\"dim\":%u,\"rows\":[", t->name, id, dim);
        for (int i = 0; i < n; i++) {
            sb_printf(&b, "%s[", i ? "," : "");
            for (uint32_t j = 0; j < dim; j++) sb_printf(&b, "%s%.9g", j ? "," : "", rows[(size_t)i * dim + j]);
            sb_printf(&b, "]");
        }
        sb_printf(&b, "],\"found\":[");
        for (int i = 0; i < n; i++) sb_printf(&b, "%s%s", i ? "," : "", found[i] ? "true" : "false");
        sb_printf(&b, "]}");
        sb_send(&b, resp, "application/json");
    }
    free(keys), free(rows), free(found);
    cJSON_Delete(root);
}

static double freshness_s(const gr_serve_stats *st)
{
    if (!st->last_apply_wall_ns) return -1;
    uint64_t now = sv_wall_ns();
    return now > st->model_version ? (double)(now - st->model_version) / 1e9 : 0;
}

static void do_model(gr_serve *s, gr_http_response *resp)
{
    gr_serve_stats st;
    gr_serve_get_stats(s, &st);
    const gr_model_config *mc = gr_model_get_config(s->model);
    sbuf b = {0};
    sb_printf(&b, "{\"model\":{\"kind\":\"%s\",\"dim\":%u,\"dense_size\":%zu,\"dense_name\":\"%s\"},",
              mc->kind == GR_MODEL_DLRM ? "dlrm" : "lr", gr_model_emb_dim(s->model),
              gr_model_dense_size(s->model), gr_model_dense_name(s->model));
    sb_printf(&b, "\"source\":\"%s\",\"from\":\"%s\",", s->model_dir ? s->model_dir : "",
              s->from ? s->from : "");
    sb_printf(&b, "\"model_version\":%llu,\"dense_version\":%llu,\"publications\":%llu,",
              (unsigned long long)st.model_version, (unsigned long long)st.dense_version,
              (unsigned long long)st.publications);
    sb_printf(&b, "\"rows_applied\":%llu,\"rows_ignored\":%llu,\"freshness_s\":%.6f,"
              "\"shards_connected\":%u,\"tables\":[",
              (unsigned long long)st.rows_applied, (unsigned long long)st.rows_ignored,
              freshness_s(&st), st.shards_connected);
    pthread_mutex_lock(&s->mu);
    sv_table **ts = s->tables;
    size_t nt = s->ntables;
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < nt; i++)
        sb_printf(&b, "%s{\"name\":\"%s\",\"id\":%u,\"dim\":%u,\"rows\":%llu}", i ? "," : "",
                  ts[i]->name, ts[i]->id, ts[i]->dim, (unsigned long long)sv_table_rows(ts[i]));
    sb_printf(&b, "]}");
    sb_send(&b, resp, "application/json");
}

/* The Prometheus text format (0.0.4), written directly: a handful of counters and gauges. */
static void do_metrics(gr_serve *s, gr_http_response *resp)
{
    gr_serve_stats st;
    gr_serve_get_stats(s, &st);
    sbuf b = {0};
#define COUNTER(name, help, v)                                                                     \
    sb_printf(&b, "# HELP " name " " help "\n# TYPE " name " counter\n" name " %llu\n",          \
              (unsigned long long)(v))
#define GAUGE(name, help, fmt, v)                                                                  \
    sb_printf(&b, "# HELP " name " " help "\n# TYPE " name " gauge\n" name " " fmt "\n", v)
    COUNTER("granary_serve_predict_requests_total", "Predict requests answered.", st.predicts);
    COUNTER("granary_serve_predict_examples_total", "Examples scored.", st.predict_examples);
    COUNTER("granary_serve_coalesced_runs_total",
            "Runs that scored the one-example predicts a handler thread parked together.",
            st.coalesced_runs);
    COUNTER("granary_serve_coalesced_requests_total", "Predict requests answered by those runs.",
            st.coalesced_requests);
    COUNTER("granary_serve_lookup_requests_total", "Lookup requests answered.", st.lookups);
    COUNTER("granary_serve_errors_total", "Requests refused or failed.", st.errors);
    COUNTER("granary_serve_publications_applied_total", "Publications from training shards applied.",
            st.publications);
    COUNTER("granary_serve_rows_applied_total", "Rows written by publications.", st.rows_applied);
    COUNTER("granary_serve_rows_ignored_total", "Rows skipped as not newer than the replica's copy.",
            st.rows_ignored);
    GAUGE("granary_serve_rows", "Rows held, all tables.", "%llu", (unsigned long long)st.rows);
    GAUGE("granary_serve_model_version", "Newest version applied (ns since the epoch).", "%llu",
          (unsigned long long)st.model_version);
    GAUGE("granary_serve_freshness_seconds", "Age of the newest applied update (-1: none).", "%.6f",
          freshness_s(&st));
    GAUGE("granary_serve_shards_connected", "Training shards whose last poll succeeded.", "%u",
          st.shards_connected);
#undef COUNTER
#undef GAUGE
    sb_send(&b, resp, "text/plain; version=0.0.4");
}

static bool has_dense(gr_serve *s)
{
    gr_serve_stats st;
    gr_serve_get_stats(s, &st);
    return st.dense_version > 0; /* loads and publications are versions >= 1 */
}

void sv_http_handle(void *ctx, const gr_http_request *req, gr_http_response *resp)
{
    gr_serve *s = ctx;
    bool get = !strcmp(req->method, "GET"), post = !strcmp(req->method, "POST");
    const char *p = req->path;
    if (!strcmp(p, "/v1/predict") || !strcmp(p, "/v1/lookup")) {
        if (!post) {
            atomic_fetch_add(&s->errors, 1);
            gr_http_error(resp, 405, "%s takes POST", p);
            return;
        }
        if (!strcmp(p, "/v1/predict")) do_predict(s, req, resp);
        else do_lookup(s, req, resp);
    } else if (!strcmp(p, "/v1/model") || !strcmp(p, "/healthz") || !strcmp(p, "/metrics")) {
        if (!get) {
            atomic_fetch_add(&s->errors, 1);
            gr_http_error(resp, 405, "%s takes GET", p);
            return;
        }
        if (!strcmp(p, "/v1/model")) do_model(s, resp);
        else if (!strcmp(p, "/metrics")) do_metrics(s, resp);
        else if (!has_dense(s)) gr_http_printf(resp, 503, "text/plain", "no model yet\n");
        else gr_http_printf(resp, 200, "text/plain", "ok\n");
    } else {
        atomic_fetch_add(&s->errors, 1);
        gr_http_error(resp, 404, "no endpoint %s (POST /v1/predict, POST /v1/lookup, GET /v1/model, "
                      "GET /healthz, GET /metrics)", p);
    }
}
