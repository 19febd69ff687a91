/* Table specs: defaults, validation, equality and the JSON form (cJSON) that the server,
 * checkpoints and job files reuse. Unknown JSON fields are errors so that typos never pass
 * silently. */
#include "table/table_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gr_table_spec_default(gr_table_spec *spec, const char *name, uint32_t dim)
{
    memset(spec, 0, sizeof *spec);
    if (name) snprintf(spec->name, sizeof spec->name, "%s", name);
    spec->dim = dim;
    spec->dtype = GR_DTYPE_F32;
    spec->init.kind = GR_INIT_ZEROS;
    spec->init.low = -0.01f;
    spec->init.high = 0.01f;
    spec->init.stddev = 0.01f;
    spec->opt.kind = GR_OPT_SGD;
    spec->opt.lr = 0.01f;
    spec->opt.eps = 1e-8f;
    spec->opt.beta1 = 0.9f;
    spec->opt.beta2 = 0.999f;
    spec->opt.beta = 1.0f;
    spec->admit_probability = 1.0f;
    spec->partitions = 256;
}

static const char *const dtype_names[] = {"f32", "f16"};
static const char *const init_names[] = {"zeros", "constant", "uniform", "trunc_normal"};
static const char *const opt_names[] = {"sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl"};
static const char *const nonfinite_names[] = {"reject", "clip"};

const char *gr_table_opt_name(gr_opt_kind kind)
{
    return (unsigned)kind < sizeof opt_names / sizeof opt_names[0] ? opt_names[kind] : "unknown";
}
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static bool finite_nonneg(float x) { return isfinite(x) && x >= 0.0f; }

int gr_table_spec_validate(const gr_table_spec *s)
{
    if (!s) return gr_seterr(GR_EINVAL, "table spec is NULL");
    size_t len = strnlen(s->name, GR_TABLE_NAME_MAX);
    if (len == 0 || len >= GR_TABLE_NAME_MAX)
        return gr_seterr(GR_EINVAL, "table name must have 1..%d characters",
                         GR_TABLE_NAME_MAX - 1);
    for (size_t i = 0; i < len; i++) {
        char c = s->name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == '-';
        if (!ok)
            return gr_seterr(GR_EINVAL,
                             "table name '%s' has character 0x%02x; use [A-Za-z0-9_.-]", s->name,
                             (unsigned char)c);
    }
    const char *n = s->name;
    if (s->dim < 1 || s->dim > GR_TABLE_DIM_MAX)
        return gr_seterr(GR_EINVAL, "table '%s': dim %u is out of range 1..%d", n, s->dim,
                         GR_TABLE_DIM_MAX);
    if ((unsigned)s->dtype >= NELEM(dtype_names))
        return gr_seterr(GR_EINVAL, "table '%s': unknown dtype %d", n, (int)s->dtype);
    const gr_init_spec *in = &s->init;
    if ((unsigned)in->kind >= NELEM(init_names))
        return gr_seterr(GR_EINVAL, "table '%s': unknown initializer %d", n, (int)in->kind);
    if (!isfinite(in->value) || !isfinite(in->low) || !isfinite(in->high) ||
        !isfinite(in->mean) || !isfinite(in->stddev))
        return gr_seterr(GR_EINVAL, "table '%s': initializer parameters must be finite", n);
    if (in->kind == GR_INIT_UNIFORM && !(in->low < in->high))
        return gr_seterr(GR_EINVAL, "table '%s': uniform initializer needs low < high (%g, %g)",
                         n, in->low, in->high);
    if (in->stddev < 0.0f)
        return gr_seterr(GR_EINVAL, "table '%s': initializer stddev %g is negative", n,
                         in->stddev);
    const gr_opt_spec *o = &s->opt;
    if ((unsigned)o->kind >= NELEM(opt_names))
        return gr_seterr(GR_EINVAL, "table '%s': unknown optimizer %d", n, (int)o->kind);
    if (!isfinite(o->lr) || !(o->lr > 0.0f))
        return gr_seterr(GR_EINVAL, "table '%s': optimizer lr must be > 0, got %g", n, o->lr);
    if (!finite_nonneg(o->eps))
        return gr_seterr(GR_EINVAL, "table '%s': optimizer eps must be >= 0, got %g", n, o->eps);
    if (!finite_nonneg(o->initial_accumulator))
        return gr_seterr(GR_EINVAL, "table '%s': initial_accumulator must be >= 0, got %g", n,
                         o->initial_accumulator);
    if (!finite_nonneg(o->beta1) || o->beta1 >= 1.0f || !finite_nonneg(o->beta2) ||
        o->beta2 >= 1.0f)
        return gr_seterr(GR_EINVAL, "table '%s': adam beta1/beta2 must be in [0, 1), got %g, %g",
                         n, o->beta1, o->beta2);
    if (!finite_nonneg(o->l1) || !finite_nonneg(o->l2) || !finite_nonneg(o->beta))
        return gr_seterr(GR_EINVAL, "table '%s': ftrl l1, l2 and beta must be >= 0", n);
    if (o->kind == GR_OPT_ADAM && o->eps == 0.0f)
        return gr_seterr(GR_EINVAL, "table '%s': adam needs eps > 0", n);
    if ((o->kind == GR_OPT_ADAGRAD || o->kind == GR_OPT_ROWWISE_ADAGRAD) && o->eps == 0.0f &&
        o->initial_accumulator == 0.0f)
        return gr_seterr(GR_EINVAL,
                         "table '%s': adagrad needs eps > 0 or initial_accumulator > 0", n);
    if (o->kind == GR_OPT_FTRL && o->beta == 0.0f && o->l2 == 0.0f)
        return gr_seterr(GR_EINVAL, "table '%s': ftrl needs beta > 0 or l2 > 0", n);
    if (!isfinite(s->admit_probability) || s->admit_probability < 0.0f ||
        s->admit_probability > 1.0f)
        return gr_seterr(GR_EINVAL, "table '%s': admit probability must be in [0, 1], got %g", n,
                         s->admit_probability);
    if ((unsigned)s->nonfinite >= NELEM(nonfinite_names))
        return gr_seterr(GR_EINVAL, "table '%s': unknown nonfinite policy %d", n,
                         (int)s->nonfinite);
    if (s->partitions != 0 &&
        ((s->partitions & (s->partitions - 1)) != 0 || s->partitions > 65536))
        return gr_seterr(GR_EINVAL,
                         "table '%s': partitions %u must be a power of two in 1..65536 (or 0)",
                         n, s->partitions);
    return GR_OK;
}

uint32_t gr_table_state_floats(const gr_table_spec *spec)
{
    switch (spec->opt.kind) {
    case GR_OPT_SGD: return 0;
    case GR_OPT_ADAGRAD: return spec->dim;
    case GR_OPT_ROWWISE_ADAGRAD: return 1;
    case GR_OPT_ADAM: return 2 * spec->dim + 1;
    case GR_OPT_FTRL: return 2 * spec->dim;
    }
    return 0;
}

static bool feq(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

bool gr_table_spec_equal(const gr_table_spec *a, const gr_table_spec *b)
{
    if (!a || !b) return a == b;
    return strncmp(a->name, b->name, GR_TABLE_NAME_MAX) == 0 && a->id == b->id &&
           a->dim == b->dim && a->dtype == b->dtype && a->seed == b->seed &&
           a->init.kind == b->init.kind && feq(a->init.value, b->init.value) &&
           feq(a->init.low, b->init.low) && feq(a->init.high, b->init.high) &&
           feq(a->init.mean, b->init.mean) && feq(a->init.stddev, b->init.stddev) &&
           a->opt.kind == b->opt.kind && feq(a->opt.lr, b->opt.lr) &&
           feq(a->opt.eps, b->opt.eps) &&
           feq(a->opt.initial_accumulator, b->opt.initial_accumulator) &&
           feq(a->opt.beta1, b->opt.beta1) && feq(a->opt.beta2, b->opt.beta2) &&
           feq(a->opt.l1, b->opt.l1) && feq(a->opt.l2, b->opt.l2) &&
           feq(a->opt.beta, b->opt.beta) && a->admit_min_count == b->admit_min_count &&
           feq(a->admit_probability, b->admit_probability) && a->ttl_s == b->ttl_s &&
           a->capacity == b->capacity && a->mem_limit == b->mem_limit &&
           a->partitions == b->partitions && a->nonfinite == b->nonfinite;
}

/* ---- JSON ---- */

static int bad(const char *where, const char *what)
{
    return gr_seterr(GR_EINVAL, "table spec: %s%s%s", where, *where ? ": " : "", what);
}

static int lookup_name(const cJSON *v, const char *const *names, size_t n, const char *field,
                       int *out)
{
    if (!cJSON_IsString(v))
        return gr_seterr(GR_EINVAL, "table spec: '%s' must be a string", field);
    for (size_t i = 0; i < n; i++)
        if (!strcmp(v->valuestring, names[i])) {
            *out = (int)i;
            return GR_OK;
        }
    char list[160] = "";
    for (size_t i = 0; i < n; i++) {
        strncat(list, names[i], sizeof list - strlen(list) - 1);
        if (i + 1 < n) strncat(list, ", ", sizeof list - strlen(list) - 1);
    }
    return gr_seterr(GR_EINVAL, "table spec: '%s' is '%s'; expected one of %s", field,
                     v->valuestring, list);
}

static int get_float(const cJSON *v, const char *field, float *out)
{
    if (!cJSON_IsNumber(v))
        return gr_seterr(GR_EINVAL, "table spec: '%s' must be a number", field);
    double d = v->valuedouble;
    if (!isfinite(d) || fabs(d) > 3.4e38)
        return gr_seterr(GR_EINVAL, "table spec: '%s' = %g is not a finite float", field, d);
    *out = (float)d;
    return GR_OK;
}

/* Unsigned integers: a JSON number that is an exact integer (up to 2^53), or a decimal
 * string (for 64-bit seeds beyond 2^53); `sizes` also accepts "4G"-style strings. */
static int get_uint(const cJSON *v, const char *field, uint64_t max, bool sizes, uint64_t *out)
{
    uint64_t x;
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (!(d >= 0) || d != floor(d) || d > 9007199254740992.0)
            return gr_seterr(GR_EINVAL, "table spec: '%s' = %g is not a non-negative integer",
                             field, d);
        x = (uint64_t)d;
    } else if (cJSON_IsString(v)) {
        const char *s = v->valuestring;
        if (sizes) {
            if (gr_parse_size(s, &x) != GR_OK)
                return gr_seterr(GR_EINVAL, "table spec: '%s' = '%s' is not a size", field, s);
        } else {
            char *end;
            errno = 0;
            if (*s < '0' || *s > '9')
                return gr_seterr(GR_EINVAL, "table spec: '%s' = '%s' is not an integer", field,
                                 s);
            unsigned long long u = strtoull(s, &end, 10);
            if (errno || *end)
                return gr_seterr(GR_EINVAL, "table spec: '%s' = '%s' is not an integer", field,
                                 s);
            x = u;
        }
    } else {
        return gr_seterr(GR_EINVAL, "table spec: '%s' must be an integer", field);
    }
    if (x > max)
        return gr_seterr(GR_EINVAL, "table spec: '%s' = %" PRIu64 " exceeds %" PRIu64, field, x,
                         max);
    *out = x;
    return GR_OK;
}

/* cJSON keeps duplicate keys; a duplicated field is almost always a mistake, so refuse it. */
static int check_dups(const cJSON *o, const char *where)
{
    for (const cJSON *f = o->child; f; f = f->next)
        for (const cJSON *g = o->child; g != f; g = g->next)
            if (!strcmp(f->string, g->string))
                return gr_seterr(GR_EINVAL, "table spec: field '%s%s%s' appears twice", where,
                                 *where ? "." : "", f->string);
    return GR_OK;
}

static int parse_init(const cJSON *o, gr_init_spec *in)
{
    if (!cJSON_IsObject(o)) return bad("", "'init' must be an object");
    int rc = check_dups(o, "init");
    for (const cJSON *f = o->child; f && !rc; f = f->next) {
        const char *k = f->string;
        int kind = 0;
        if (!strcmp(k, "kind")) {
            rc = lookup_name(f, init_names, NELEM(init_names), "init.kind", &kind);
            if (!rc) in->kind = (gr_init_kind)kind;
        } else if (!strcmp(k, "value")) rc = get_float(f, "init.value", &in->value);
        else if (!strcmp(k, "low")) rc = get_float(f, "init.low", &in->low);
        else if (!strcmp(k, "high")) rc = get_float(f, "init.high", &in->high);
        else if (!strcmp(k, "mean")) rc = get_float(f, "init.mean", &in->mean);
        else if (!strcmp(k, "stddev")) rc = get_float(f, "init.stddev", &in->stddev);
        else rc = gr_seterr(GR_EINVAL, "table spec: unknown field 'init.%s'", k);
    }
    return rc;
}

static int parse_opt(const cJSON *o, gr_opt_spec *op)
{
    if (!cJSON_IsObject(o)) return bad("", "'optimizer' must be an object");
    int rc = check_dups(o, "optimizer");
    for (const cJSON *f = o->child; f && !rc; f = f->next) {
        const char *k = f->string;
        int kind = 0;
        if (!strcmp(k, "kind")) {
            rc = lookup_name(f, opt_names, NELEM(opt_names), "optimizer.kind", &kind);
            if (!rc) op->kind = (gr_opt_kind)kind;
        } else if (!strcmp(k, "lr")) rc = get_float(f, "optimizer.lr", &op->lr);
        else if (!strcmp(k, "eps")) rc = get_float(f, "optimizer.eps", &op->eps);
        else if (!strcmp(k, "initial_accumulator"))
            rc = get_float(f, "optimizer.initial_accumulator", &op->initial_accumulator);
        else if (!strcmp(k, "beta1")) rc = get_float(f, "optimizer.beta1", &op->beta1);
        else if (!strcmp(k, "beta2")) rc = get_float(f, "optimizer.beta2", &op->beta2);
        else if (!strcmp(k, "l1")) rc = get_float(f, "optimizer.l1", &op->l1);
        else if (!strcmp(k, "l2")) rc = get_float(f, "optimizer.l2", &op->l2);
        else if (!strcmp(k, "beta")) rc = get_float(f, "optimizer.beta", &op->beta);
        else rc = gr_seterr(GR_EINVAL, "table spec: unknown field 'optimizer.%s'", k);
    }
    return rc;
}

static int parse_spec_obj(const cJSON *o, gr_table_spec *spec)
{
    if (!cJSON_IsObject(o)) return bad("", "a table spec must be a JSON object");
    int rc = check_dups(o, "");
    if (rc) return rc;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (!cJSON_IsString(name)) return bad("", "'name' (a string) is required");
    if (strlen(name->valuestring) >= GR_TABLE_NAME_MAX)
        return gr_seterr(GR_EINVAL, "table spec: name '%.20s...' is longer than %d characters",
                         name->valuestring, GR_TABLE_NAME_MAX - 1);
    const cJSON *dim = cJSON_GetObjectItemCaseSensitive(o, "dim");
    uint64_t u;
    if (!dim) return gr_seterr(GR_EINVAL, "table spec '%s': 'dim' is required", name->valuestring);
    rc = get_uint(dim, "dim", UINT32_MAX, false, &u);
    if (rc) return rc;
    gr_table_spec_default(spec, name->valuestring, (uint32_t)u);
    for (const cJSON *f = o->child; f && !rc; f = f->next) {
        const char *k = f->string;
        if (!strcmp(k, "name") || !strcmp(k, "dim")) continue;
        if (!strcmp(k, "id")) {
            rc = get_uint(f, "id", UINT32_MAX, false, &u);
            spec->id = (uint32_t)u;
        } else if (!strcmp(k, "dtype")) {
            int d = 0;
            rc = lookup_name(f, dtype_names, NELEM(dtype_names), "dtype", &d);
            spec->dtype = (gr_dtype)d;
        } else if (!strcmp(k, "seed")) {
            rc = get_uint(f, "seed", UINT64_MAX, false, &spec->seed);
        } else if (!strcmp(k, "init")) {
            rc = parse_init(f, &spec->init);
        } else if (!strcmp(k, "optimizer")) {
            rc = parse_opt(f, &spec->opt);
        } else if (!strcmp(k, "admit")) {
            if (!cJSON_IsObject(f)) return bad("", "'admit' must be an object");
            if ((rc = check_dups(f, "admit"))) return rc;
            for (const cJSON *g = f->child; g && !rc; g = g->next) {
                if (!strcmp(g->string, "min_count")) {
                    rc = get_uint(g, "admit.min_count", UINT32_MAX, false, &u);
                    spec->admit_min_count = (uint32_t)u;
                } else if (!strcmp(g->string, "probability")) {
                    rc = get_float(g, "admit.probability", &spec->admit_probability);
                } else {
                    rc = gr_seterr(GR_EINVAL, "table spec: unknown field 'admit.%s'", g->string);
                }
            }
        } else if (!strcmp(k, "evict")) {
            if (!cJSON_IsObject(f)) return bad("", "'evict' must be an object");
            if ((rc = check_dups(f, "evict"))) return rc;
            for (const cJSON *g = f->child; g && !rc; g = g->next) {
                if (!strcmp(g->string, "ttl_s")) rc = get_uint(g, "evict.ttl_s", UINT64_MAX, false, &spec->ttl_s);
                else if (!strcmp(g->string, "capacity"))
                    rc = get_uint(g, "evict.capacity", UINT64_MAX, false, &spec->capacity);
                else rc = gr_seterr(GR_EINVAL, "table spec: unknown field 'evict.%s'", g->string);
            }
        } else if (!strcmp(k, "mem_limit")) {
            rc = get_uint(f, "mem_limit", UINT64_MAX, true, &spec->mem_limit);
        } else if (!strcmp(k, "partitions")) {
            rc = get_uint(f, "partitions", UINT32_MAX, false, &u);
            spec->partitions = (uint32_t)u;
        } else if (!strcmp(k, "nonfinite")) {
            int d = 0;
            rc = lookup_name(f, nonfinite_names, NELEM(nonfinite_names), "nonfinite", &d);
            spec->nonfinite = (gr_nonfinite)d;
        } else {
            rc = gr_seterr(GR_EINVAL, "table spec '%s': unknown field '%s'", spec->name, k);
        }
    }
    if (rc) return rc;
    return gr_table_spec_validate(spec);
}

static int parse_doc(const char *json, cJSON **root)
{
    if (!json) return gr_seterr(GR_EINVAL, "table spec: JSON text is NULL");
    const char *end = NULL;
    *root = cJSON_ParseWithOpts(json, &end, 1);
    if (!*root) {
        const char *at = end ? end : cJSON_GetErrorPtr();
        long off = at ? (long)(at - json) : -1;
        return gr_seterr(GR_EINVAL, "table spec: invalid JSON near byte %ld", off);
    }
    return GR_OK;
}

int gr_table_spec_from_json(const char *json, gr_table_spec *spec)
{
    if (!spec) return gr_seterr(GR_EINVAL, "table spec: output is NULL");
    cJSON *root;
    int rc = parse_doc(json, &root);
    if (rc) return rc;
    gr_table_spec tmp;
    rc = parse_spec_obj(root, &tmp);
    cJSON_Delete(root);
    if (!rc) *spec = tmp;
    return rc;
}

int gr_table_specs_from_json(const char *json, gr_table_spec **specs, size_t *n)
{
    if (!specs || !n) return gr_seterr(GR_EINVAL, "table specs: output is NULL");
    *specs = NULL;
    *n = 0;
    cJSON *root;
    int rc = parse_doc(json, &root);
    if (rc) return rc;
    const cJSON *arr = root;
    if (cJSON_IsObject(root)) {
        for (const cJSON *f = root->child; f; f = f->next)
            if (strcmp(f->string, "tables")) {
                rc = gr_seterr(GR_EINVAL, "table specs: unknown field '%s' (expected 'tables')",
                               f->string);
                cJSON_Delete(root);
                return rc;
            }
        arr = cJSON_GetObjectItemCaseSensitive(root, "tables");
    }
    if (!cJSON_IsArray(arr)) {
        cJSON_Delete(root);
        return gr_seterr(GR_EINVAL, "table specs: expected {\"tables\":[...]} or an array");
    }
    size_t cnt = (size_t)cJSON_GetArraySize(arr);
    gr_table_spec *out = calloc(cnt ? cnt : 1, sizeof *out);
    if (!out) {
        cJSON_Delete(root);
        return gr_seterr(GR_ENOMEM, "table specs: cannot allocate %zu specs", cnt);
    }
    size_t i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        rc = parse_spec_obj(e, &out[i]);
        if (rc) {
            char msg[400];
            snprintf(msg, sizeof msg, "%s", gr_errmsg());
            gr_seterr(rc, "table specs[%zu]: %s", i, msg);
            break;
        }
        for (size_t j = 0; j < i && !rc; j++) {
            if (!strcmp(out[j].name, out[i].name))
                rc = gr_seterr(GR_EINVAL, "table specs: name '%s' appears twice", out[i].name);
            else if (out[j].id == out[i].id)
                rc = gr_seterr(GR_EINVAL, "table specs: tables '%s' and '%s' share id %u",
                               out[j].name, out[i].name, out[i].id);
        }
        if (rc) break;
    }
    cJSON_Delete(root);
    if (rc) {
        free(out);
        return rc;
    }
    *specs = out;
    *n = cnt;
    return GR_OK;
}

/* A float as the shortest decimal that reads back as the same float. */
static double short_float(float f)
{
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    return strtod(buf, NULL);
}

static bool add_num(cJSON *o, const char *k, double v)
{
    return cJSON_AddNumberToObject(o, k, v) != NULL;
}

static bool add_u64(cJSON *o, const char *k, uint64_t v)
{
    if (v <= 9007199254740992ull) return add_num(o, k, (double)v);
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    return cJSON_AddStringToObject(o, k, buf) != NULL;
}

char *gr_table_spec_to_json(const gr_table_spec *s)
{
    if (!s) return NULL;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    char name[GR_TABLE_NAME_MAX];
    snprintf(name, sizeof name, "%.*s", GR_TABLE_NAME_MAX - 1, s->name);
    unsigned dt = (unsigned)s->dtype < NELEM(dtype_names) ? (unsigned)s->dtype : 0;
    unsigned ik = (unsigned)s->init.kind < NELEM(init_names) ? (unsigned)s->init.kind : 0;
    unsigned ok = (unsigned)s->opt.kind < NELEM(opt_names) ? (unsigned)s->opt.kind : 0;
    bool good = cJSON_AddStringToObject(o, "name", name) && add_num(o, "id", s->id) &&
                add_num(o, "dim", s->dim) && cJSON_AddStringToObject(o, "dtype", dtype_names[dt]) &&
                add_u64(o, "seed", s->seed);
    cJSON *in = cJSON_AddObjectToObject(o, "init");
    good = good && in && cJSON_AddStringToObject(in, "kind", init_names[ik]) &&
           add_num(in, "value", short_float(s->init.value)) &&
           add_num(in, "low", short_float(s->init.low)) &&
           add_num(in, "high", short_float(s->init.high)) &&
           add_num(in, "mean", short_float(s->init.mean)) &&
           add_num(in, "stddev", short_float(s->init.stddev));
    cJSON *op = cJSON_AddObjectToObject(o, "optimizer");
    good = good && op && cJSON_AddStringToObject(op, "kind", opt_names[ok]) &&
           add_num(op, "lr", short_float(s->opt.lr)) &&
           add_num(op, "eps", short_float(s->opt.eps)) &&
           add_num(op, "initial_accumulator", short_float(s->opt.initial_accumulator)) &&
           add_num(op, "beta1", short_float(s->opt.beta1)) &&
           add_num(op, "beta2", short_float(s->opt.beta2)) &&
           add_num(op, "l1", short_float(s->opt.l1)) && add_num(op, "l2", short_float(s->opt.l2)) &&
           add_num(op, "beta", short_float(s->opt.beta));
    cJSON *ad = cJSON_AddObjectToObject(o, "admit");
    good = good && ad && add_num(ad, "min_count", s->admit_min_count) &&
           add_num(ad, "probability", short_float(s->admit_probability));
    cJSON *ev = cJSON_AddObjectToObject(o, "evict");
    good = good && ev && add_u64(ev, "ttl_s", s->ttl_s) && add_u64(ev, "capacity", s->capacity);
    good = good && add_u64(o, "mem_limit", s->mem_limit) && add_num(o, "partitions", s->partitions);
    /* Written only when not the default, so specs (and the checkpoints holding them) written
     * before the setting existed read back byte for byte the same. */
    if (s->nonfinite == GR_NONFINITE_CLIP)
        good = good && cJSON_AddStringToObject(o, "nonfinite", nonfinite_names[1]);
    char *txt = good ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return txt;
}
