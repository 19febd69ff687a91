/* Data schemas: which column of a delimited text file is the label, which are dense floats,
 * categorical ids and lists of ids (docs/data.md). A schema is parsed from a small JSON file,
 * checked once, and then drives the reader's line parser and the models' shapes. The built-in
 * Criteo schema keeps its own fast parser and ids (criteo.c), so Criteo runs stay bitwise
 * what they were. */
#include "granary/train.h"

#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Part of the feature-id contract of schema files: changing it changes every id. */
#define SCHEMA_SEED 0x736368656d613031ull  /* "schema01" */
#define MISSING_SEED 0x6d697373696e6731ull /* "missing1" */
#define MAX_NUMBER_TEXT 64                  /* a longer dense field is not a number */

struct gr_schema {
    bool criteo; /* the built-in layout: criteo.c parses it */
    char delim;
    bool header;
    uint32_t ncols, n_dense, n_sparse, max_ids;
    bool lists;
    gr_schema_column *cols;
    uint64_t *slot_seed;  /* per sparse slot: the column's salt (from its name) */
    uint64_t *missing_id; /* per sparse slot */
};

/* ---- accessors ---------------------------------------------------------------------------- */

bool gr_schema_is_criteo(const gr_schema *s) { return s->criteo; }
uint32_t gr_schema_n_columns(const gr_schema *s) { return s->ncols; }
const gr_schema_column *gr_schema_column_at(const gr_schema *s, uint32_t i)
{
    return i < s->ncols ? &s->cols[i] : NULL;
}
uint32_t gr_schema_n_dense(const gr_schema *s) { return s->n_dense; }
uint32_t gr_schema_n_sparse(const gr_schema *s) { return s->n_sparse; }
char gr_schema_delimiter(const gr_schema *s) { return s->delim; }
bool gr_schema_header(const gr_schema *s) { return s->header; }
bool gr_schema_has_lists(const gr_schema *s) { return s->lists; }
uint32_t gr_schema_max_ids(const gr_schema *s) { return s->max_ids; }

static const char *type_name(gr_col_type t)
{
    static const char *names[] = {"ignore", "label", "dense", "categorical", "list"};
    return (unsigned)t < 5 ? names[t] : "?";
}

void gr_schema_destroy(gr_schema *s)
{
    if (!s || s == gr_schema_criteo()) return;
    free(s->cols);
    free(s->slot_seed);
    free(s->missing_id);
    free(s);
}

/* Counts the kinds, numbers the dense features and sparse slots, and derives each slot's
 * salt. The salt comes from the column's name, not its position, so adding a column to a
 * schema keeps the other columns' feature ids (and a model's rows) valid. */
static int finish(gr_schema *s)
{
    s->n_dense = s->n_sparse = s->max_ids = 0;
    s->lists = false;
    for (uint32_t i = 0; i < s->ncols; i++) {
        gr_schema_column *c = &s->cols[i];
        c->index = 0;
        if (c->type == GR_COL_DENSE) c->index = s->n_dense++;
        if (c->type == GR_COL_CATEGORICAL || c->type == GR_COL_LIST) {
            c->index = s->n_sparse++;
            s->max_ids += c->type == GR_COL_LIST ? c->max_items : 1;
            s->lists |= c->type == GR_COL_LIST;
        }
    }
    s->slot_seed = calloc(s->n_sparse ? s->n_sparse : 1, sizeof *s->slot_seed);
    s->missing_id = calloc(s->n_sparse ? s->n_sparse : 1, sizeof *s->missing_id);
    if (!s->slot_seed || !s->missing_id) return gr_seterr(GR_ENOMEM, "schema: out of memory");
    for (uint32_t i = 0; i < s->ncols; i++) {
        const gr_schema_column *c = &s->cols[i];
        if (c->type != GR_COL_CATEGORICAL && c->type != GR_COL_LIST) continue;
        uint64_t seed = gr_hash64(c->name, strlen(c->name), SCHEMA_SEED);
        s->slot_seed[c->index] = seed;
        s->missing_id[c->index] = gr_hash_key(seed, MISSING_SEED);
    }
    return GR_OK;
}

/* ---- the built-in Criteo schema ----------------------------------------------------------- */

static gr_schema criteo_schema;
static gr_schema_column criteo_cols[GR_CRITEO_FIELDS];
static uint64_t criteo_seed[GR_CRITEO_SPARSE], criteo_missing[GR_CRITEO_SPARSE];
static pthread_once_t criteo_once = PTHREAD_ONCE_INIT;

static void criteo_init(void)
{
    gr_schema *s = &criteo_schema;
    s->criteo = true;
    s->delim = '\t';
    s->ncols = GR_CRITEO_FIELDS;
    s->cols = criteo_cols;
    for (int f = 0; f < GR_CRITEO_FIELDS; f++) {
        gr_schema_column *c = &criteo_cols[f];
        if (f == 0) {
            snprintf(c->name, sizeof c->name, "label");
            c->type = GR_COL_LABEL;
        } else if (f <= GR_CRITEO_DENSE) {
            snprintf(c->name, sizeof c->name, "I%d", f);
            c->type = GR_COL_DENSE;
            c->transform = GR_TRANSFORM_LOG1P;
        } else {
            snprintf(c->name, sizeof c->name, "C%d", f - GR_CRITEO_DENSE);
            c->type = GR_COL_CATEGORICAL;
            c->encoding = GR_ENC_HEX;
        }
    }
    s->n_dense = GR_CRITEO_DENSE;
    s->n_sparse = s->max_ids = GR_CRITEO_SPARSE;
    for (unsigned k = 0; k < GR_CRITEO_SPARSE; k++) {
        criteo_cols[1 + GR_CRITEO_DENSE + k].index = k;
        criteo_missing[k] = gr_criteo_missing_id(k);
    }
    for (unsigned j = 0; j < GR_CRITEO_DENSE; j++) criteo_cols[1 + j].index = j;
    s->slot_seed = criteo_seed;
    s->missing_id = criteo_missing;
}

const gr_schema *gr_schema_criteo(void)
{
    pthread_once(&criteo_once, criteo_init);
    return &criteo_schema;
}

/* ---- JSON --------------------------------------------------------------------------------- */

static int bad(const char *fmt, const char *a, const char *b)
{
    return gr_seterr(GR_EINVAL, fmt, a, b);
}

/* One character: the text itself, or a word for the usual ones. */
static int parse_char(const cJSON *v, const char *what, const char *col, char *out)
{
    if (!cJSON_IsString(v))
        return gr_seterr(GR_EINVAL, "schema%s%s: %s must be a one-character string", col ? ": column " : "",
                         col ? col : "", what);
    const char *t = v->valuestring;
    static const struct { const char *word; char c; } words[] = {
        {"tab", '\t'}, {"comma", ','}, {"semicolon", ';'}, {"space", ' '}, {"pipe", '|'}};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (!strcmp(t, words[i].word)) {
            *out = words[i].c;
            return GR_OK;
        }
    if (strlen(t) != 1 || t[0] == '\n' || t[0] == '\r' || t[0] == '"' || (unsigned char)t[0] >= 0x80)
        return gr_seterr(GR_EINVAL, "schema%s%s: %s '%s' must be one character other than a line end "
                         "or a quote (or tab, comma, semicolon, space, pipe)", col ? ": column " : "",
                         col ? col : "", what, t);
    *out = t[0];
    return GR_OK;
}

static int parse_word(const cJSON *v, const char *key, const char *col, const char *const *words,
                      int n, int *out)
{
    if (cJSON_IsString(v))
        for (int i = 0; i < n; i++)
            if (!strcmp(v->valuestring, words[i])) {
                *out = i;
                return GR_OK;
            }
    char list[128] = "";
    for (int i = 0; i < n; i++) {
        strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, words[i], sizeof list - strlen(list) - 1);
    }
    return gr_seterr(GR_EINVAL, "schema: column '%s': %s must be one of %s, got '%s'", col, key, list,
                     cJSON_IsString(v) ? v->valuestring : "(not a string)");
}

static int parse_column(const cJSON *o, uint32_t i, gr_schema_column *c)
{
    memset(c, 0, sizeof *c);
    char at[32];
    snprintf(at, sizeof at, "%u", i + 1);
    if (!cJSON_IsObject(o)) return bad("schema: column %s%s is not an object", at, "");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (!cJSON_IsString(name) || !name->valuestring[0])
        return bad("schema: column %s%s has no \"name\"", at, "");
    if (strlen(name->valuestring) >= GR_SCHEMA_MAX_NAME)
        return gr_seterr(GR_EINVAL, "schema: column %s: name '%.40s...' is longer than %d bytes", at,
                         name->valuestring, GR_SCHEMA_MAX_NAME - 1);
    for (const char *p = name->valuestring; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == '"' || *p == '\\')
            return bad("schema: column %s: name '%s' has a control character or quote", at,
                       name->valuestring);
    snprintf(c->name, sizeof c->name, "%s", name->valuestring);
    static const char *const types[] = {"ignore", "label", "dense", "categorical", "list"};
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "type");
    int t = 0;
    if (!type)
        return bad("schema: column '%s' has no \"type\" (label, dense, categorical, list or "
                   "ignore)%s", c->name, "");
    if (parse_word(type, "type", c->name, types, 5, &t)) return GR_EINVAL;
    c->type = (gr_col_type)t;
    c->max_items = c->type == GR_COL_LIST ? GR_SCHEMA_DEFAULT_ITEMS : 0;
    bool ids = c->type == GR_COL_CATEGORICAL || c->type == GR_COL_LIST;
    const cJSON *k;
    cJSON_ArrayForEach(k, o)
    {
        const char *key = k->string;
        int w = 0;
        if (!strcmp(key, "name") || !strcmp(key, "type") || !strcmp(key, "comment")) continue;
        if (!strcmp(key, "transform") && c->type == GR_COL_DENSE) {
            static const char *const tr[] = {"none", "log1p"};
            if (parse_word(k, key, c->name, tr, 2, &w)) return GR_EINVAL;
            c->transform = (gr_transform)w;
        } else if (!strcmp(key, "fill") && c->type == GR_COL_DENSE) {
            if (!cJSON_IsNumber(k) || !isfinite(k->valuedouble) || fabs(k->valuedouble) > FLT_MAX)
                return bad("schema: column '%s': fill must be a finite number%s", c->name, "");
            c->fill = (float)k->valuedouble;
        } else if (!strcmp(key, "encoding") && ids) {
            static const char *const enc[] = {"string", "int", "hex"};
            if (parse_word(k, key, c->name, enc, 3, &w)) return GR_EINVAL;
            c->encoding = (gr_col_encoding)w;
        } else if (!strcmp(key, "separator") && c->type == GR_COL_LIST) {
            if (parse_char(k, "separator", c->name, &c->separator)) return GR_EINVAL;
        } else if (!strcmp(key, "pooling") && c->type == GR_COL_LIST) {
            static const char *const pool[] = {"sum", "mean"};
            if (parse_word(k, key, c->name, pool, 2, &w)) return GR_EINVAL;
            c->pooling = (gr_pooling)w;
        } else if (!strcmp(key, "max_items") && c->type == GR_COL_LIST) {
            double v = cJSON_IsNumber(k) ? k->valuedouble : -1;
            if (v < 1 || v > GR_SCHEMA_MAX_ITEMS || v != floor(v))
                return gr_seterr(GR_EINVAL, "schema: column '%s': max_items must be a whole number "
                                 "in 1..%d", c->name, GR_SCHEMA_MAX_ITEMS);
            c->max_items = (uint32_t)v;
        } else {
            bool known = !strcmp(key, "transform") || !strcmp(key, "fill") ||
                         !strcmp(key, "encoding") || !strcmp(key, "separator") ||
                         !strcmp(key, "pooling") || !strcmp(key, "max_items");
            if (known)
                return gr_seterr(GR_EINVAL, "schema: column '%s': key \"%s\" does not apply to a %s "
                                 "column", c->name, key, type_name(c->type));
            return gr_seterr(GR_EINVAL, "schema: column '%s': unknown key \"%s\" (known: name, type, "
                             "transform, fill, encoding, separator, pooling, max_items, comment)",
                             c->name, key);
        }
    }
    if (c->type == GR_COL_LIST && !c->separator)
        return bad("schema: column '%s' is a list: it needs a \"separator\" (e.g. \"|\")%s", c->name,
                   "");
    return GR_OK;
}

static int parse_object(const cJSON *root, gr_schema *s)
{
    if (!cJSON_IsObject(root)) return gr_seterr(GR_EINVAL, "schema: the JSON must be an object");
    const cJSON *k;
    cJSON_ArrayForEach(k, root)
    {
        if (strcmp(k->string, "columns") && strcmp(k->string, "delimiter") &&
            strcmp(k->string, "header") && strcmp(k->string, "builtin") &&
            strcmp(k->string, "name") && strcmp(k->string, "comment"))
            return bad("schema: unknown key \"%s\" (known: columns, delimiter, header, builtin, "
                       "name, comment)%s", k->string, "");
    }
    s->delim = '\t';
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "delimiter");
    if (d && parse_char(d, "delimiter", NULL, &s->delim)) return GR_EINVAL;
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(root, "header");
    if (h && !cJSON_IsBool(h)) return gr_seterr(GR_EINVAL, "schema: header must be true or false");
    s->header = cJSON_IsTrue(h);
    const cJSON *cols = cJSON_GetObjectItemCaseSensitive(root, "columns");
    if (!cJSON_IsArray(cols) || cJSON_GetArraySize(cols) == 0)
        return gr_seterr(GR_EINVAL, "schema: \"columns\" must be a non-empty array of columns");
    int n = cJSON_GetArraySize(cols);
    if (n > GR_SCHEMA_MAX_COLUMNS)
        return gr_seterr(GR_EINVAL, "schema: %d columns, at most %d", n, GR_SCHEMA_MAX_COLUMNS);
    s->cols = calloc((size_t)n, sizeof *s->cols);
    if (!s->cols) return gr_seterr(GR_ENOMEM, "schema: out of memory");
    s->ncols = (uint32_t)n;
    uint32_t i = 0, labels = 0, features = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cols)
    {
        int rc = parse_column(c, i, &s->cols[i]);
        if (rc) return rc;
        const gr_schema_column *col = &s->cols[i];
        for (uint32_t j = 0; j < i; j++)
            if (!strcmp(s->cols[j].name, col->name))
                return gr_seterr(GR_EINVAL, "schema: duplicate column name '%s' (columns %u and %u)",
                                 col->name, j + 1, i + 1);
        if (col->type == GR_COL_LIST && col->separator == s->delim)
            return gr_seterr(GR_EINVAL, "schema: column '%s': its separator '%c' is the file's "
                             "delimiter; a list's items need another one", col->name, col->separator);
        labels += col->type == GR_COL_LABEL;
        features += col->type == GR_COL_DENSE || col->type == GR_COL_CATEGORICAL ||
                    col->type == GR_COL_LIST;
        i++;
    }
    if (labels == 0)
        return gr_seterr(GR_EINVAL, "schema: no label column: one column needs \"type\": \"label\"");
    if (labels > 1)
        return gr_seterr(GR_EINVAL, "schema: %u label columns, exactly one is needed", labels);
    if (!features)
        return gr_seterr(GR_EINVAL, "schema: no feature column (dense, categorical or list)");
    return finish(s);
}

int gr_schema_parse(const char *json, size_t len, gr_schema **out)
{
    *out = NULL;
    if (!json) return gr_seterr(GR_EINVAL, "schema: no text");
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return gr_seterr(GR_ECORRUPT, "schema: not valid JSON");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, "builtin");
    if (b) {
        int rc = cJSON_IsString(b) && !strcmp(b->valuestring, "criteo")
                     ? GR_OK
                     : gr_seterr(GR_EINVAL, "schema: unknown builtin '%s' (known: criteo)",
                                 cJSON_IsString(b) ? b->valuestring : "(not a string)");
        cJSON_Delete(root);
        if (!rc) *out = (gr_schema *)gr_schema_criteo();
        return rc;
    }
    gr_schema *s = calloc(1, sizeof *s);
    if (!s) {
        cJSON_Delete(root);
        return gr_seterr(GR_ENOMEM, "schema: out of memory");
    }
    int rc = parse_object(root, s);
    cJSON_Delete(root);
    if (rc) {
        gr_schema_destroy(s);
        return rc;
    }
    *out = s;
    return GR_OK;
}

int gr_schema_load(const char *path, gr_schema **out)
{
    *out = NULL;
    if (!path) return gr_seterr(GR_EINVAL, "schema: no path");
    if (!strcmp(path, "criteo")) {
        *out = (gr_schema *)gr_schema_criteo();
        return GR_OK;
    }
    char *text = NULL;
    size_t len = 0;
    int rc = gr_read_file(path, &text, &len);
    if (rc) return gr_seterr(rc, "schema %s: %s", path, gr_errmsg());
    rc = gr_schema_parse(text, len, out);
    free(text);
    if (rc) return gr_seterr(rc, "%s: %s", path, gr_errmsg());
    return GR_OK;
}

char *gr_schema_to_json(const gr_schema *s)
{
    static const char *const enc[] = {"string", "int", "hex"};
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    if (s->criteo) cJSON_AddStringToObject(o, "builtin", "criteo");
    char d[2] = {s->delim, 0};
    cJSON_AddStringToObject(o, "delimiter", d);
    cJSON_AddBoolToObject(o, "header", s->header);
    cJSON *cols = cJSON_AddArrayToObject(o, "columns");
    for (uint32_t i = 0; cols && i < s->ncols; i++) {
        const gr_schema_column *c = &s->cols[i];
        cJSON *j = cJSON_CreateObject();
        if (!j || !cJSON_AddItemToArray(cols, j)) {
            cJSON_Delete(j);
            break;
        }
        cJSON_AddStringToObject(j, "name", c->name);
        cJSON_AddStringToObject(j, "type", type_name(c->type));
        if (c->type == GR_COL_DENSE) {
            cJSON_AddStringToObject(j, "transform", c->transform == GR_TRANSFORM_LOG1P ? "log1p" : "none");
            cJSON_AddNumberToObject(j, "fill", c->fill);
        }
        if (c->type == GR_COL_CATEGORICAL || c->type == GR_COL_LIST)
            cJSON_AddStringToObject(j, "encoding", enc[c->encoding]);
        if (c->type == GR_COL_LIST) {
            char sep[2] = {c->separator, 0};
            cJSON_AddStringToObject(j, "separator", sep);
            cJSON_AddStringToObject(j, "pooling", c->pooling == GR_POOL_MEAN ? "mean" : "sum");
            cJSON_AddNumberToObject(j, "max_items", c->max_items);
        }
    }
    char *txt = cJSON_Print(o);
    cJSON_Delete(o);
    return txt;
}

int gr_schema_clone(const gr_schema *s, gr_schema **out)
{
    *out = NULL;
    if (s->criteo) {
        *out = (gr_schema *)gr_schema_criteo();
        return GR_OK;
    }
    gr_schema *c = calloc(1, sizeof *c);
    if (!c) return gr_seterr(GR_ENOMEM, "schema: out of memory");
    *c = *s;
    c->slot_seed = c->missing_id = NULL;
    c->cols = malloc(s->ncols * sizeof *c->cols);
    if (c->cols) memcpy(c->cols, s->cols, s->ncols * sizeof *c->cols);
    int rc = c->cols ? finish(c) : gr_seterr(GR_ENOMEM, "schema: out of memory");
    if (rc) {
        gr_schema_destroy(c);
        return rc;
    }
    *out = c;
    return GR_OK;
}

bool gr_schema_equal(const gr_schema *a, const gr_schema *b)
{
    if (a == b) return true;
    if (!a || !b || a->criteo != b->criteo || a->delim != b->delim || a->header != b->header ||
        a->ncols != b->ncols)
        return false;
    for (uint32_t i = 0; i < a->ncols; i++) {
        const gr_schema_column *x = &a->cols[i], *y = &b->cols[i];
        if (strcmp(x->name, y->name) || x->type != y->type || x->encoding != y->encoding ||
            x->transform != y->transform || x->fill != y->fill || x->separator != y->separator ||
            x->pooling != y->pooling || x->max_items != y->max_items)
            return false;
    }
    return true;
}

/* ---- values ------------------------------------------------------------------------------- */

static void trim(const char **p, size_t *n)
{
    while (*n && (**p == ' ' || **p == '\t')) {
        (*p)++;
        (*n)--;
    }
    while (*n && ((*p)[*n - 1] == ' ' || (*p)[*n - 1] == '\t')) (*n)--;
}

/* A float in any C syntax (decimal, exponent, hex), finite and within float range. */
static bool parse_number(const char *p, size_t n, double *out)
{
    trim(&p, &n);
    if (n == 0 || n >= MAX_NUMBER_TEXT) return false;
    char buf[MAX_NUMBER_TEXT];
    memcpy(buf, p, n);
    buf[n] = 0;
    char *end;
    double v = strtod(buf, &end);
    if (end != buf + n || !isfinite(v) || fabs(v) > FLT_MAX) return false;
    *out = v;
    return true;
}

/* The canonical text of an integer (no '+', no leading zeros, "-0" is "0") or of a hex number
 * (lower case, no "0x", no leading zeros), into buf; false when it is not one. */
static bool canonical_number(gr_col_encoding enc, const char *p, size_t n, char *buf, size_t *len)
{
    trim(&p, &n);
    bool neg = false;
    if (enc == GR_ENC_INT && n && (*p == '-' || *p == '+')) {
        neg = *p == '-';
        p++;
        n--;
    }
    if (enc == GR_ENC_HEX && n >= 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        p += 2;
        n -= 2;
    }
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        bool ok = enc == GR_ENC_INT ? (ch >= '0' && ch <= '9')
                                    : ((ch >= '0' && ch <= '9') || ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f'));
        if (!ok) return false;
    }
    while (n > 1 && *p == '0') {
        p++;
        n--;
    }
    size_t at = 0;
    if (neg && !(n == 1 && *p == '0')) buf[at++] = '-';
    for (size_t i = 0; i < n; i++) buf[at++] = enc == GR_ENC_HEX ? (char)(p[i] | 0x20) : p[i];
    *len = at;
    return true;
}

/* The id of one non-empty value of sparse column c; false when the text does not fit its
 * encoding. */
static bool value_id(const gr_schema *s, const gr_schema_column *c, const char *p, size_t n,
                     uint64_t *id)
{
    uint64_t seed = s->slot_seed[c->index];
    if (c->encoding == GR_ENC_STRING) {
        *id = gr_hash64(p, n, seed);
        return true;
    }
    /* The canonical text is at most the field plus a sign: fields can be long (any width). */
    char small[64];
    char *buf = n + 1 <= sizeof small ? small : malloc(n + 1);
    size_t len;
    bool ok = buf && canonical_number(c->encoding, p, n, buf, &len);
    if (ok) *id = gr_hash64(buf, len, seed);
    if (buf != small) free(buf);
    return ok;
}

int gr_schema_feature_id(const gr_schema *s, uint32_t slot, const char *text, size_t len,
                         uint64_t *id)
{
    if (slot >= s->n_sparse)
        return gr_seterr(GR_EINVAL, "schema: sparse slot %u does not exist (%u slots)", slot,
                         s->n_sparse);
    if (len == 0) {
        *id = s->missing_id[slot];
        return GR_OK;
    }
    if (s->criteo) {
        uint32_t v = 0;
        if (len > 8) return gr_seterr(GR_EINVAL, "more than 8 hex digits");
        for (size_t i = 0; i < len; i++) {
            unsigned char ch = (unsigned char)text[i];
            int h = ch >= '0' && ch <= '9' ? ch - '0'
                  : (ch | 0x20) >= 'a' && (ch | 0x20) <= 'f' ? (ch | 0x20) - 'a' + 10 : -1;
            if (h < 0) return gr_seterr(GR_EINVAL, "not hex: '%.*s'", (int)len, text);
            v = (v << 4) | (uint32_t)h;
        }
        *id = gr_criteo_feature_id(slot, v);
        return GR_OK;
    }
    for (uint32_t i = 0; i < s->ncols; i++) {
        const gr_schema_column *c = &s->cols[i];
        if ((c->type == GR_COL_CATEGORICAL || c->type == GR_COL_LIST) && c->index == slot) {
            if (!value_id(s, c, text, len, id))
                return gr_seterr(GR_EINVAL, "column '%s': not %s: '%.*s'", c->name,
                                 c->encoding == GR_ENC_INT ? "an integer" : "hex",
                                 len > 24 ? 24 : (int)len, text);
            return GR_OK;
        }
    }
    return gr_seterr(GR_EINVAL, "schema: sparse slot %u not found", slot);
}

/* ---- lines -------------------------------------------------------------------------------- */

static int bad_column(uint32_t i, const gr_schema_column *c, const char *what, const char *p,
                      size_t n)
{
    int shown = n > 24 ? 24 : (int)n;
    return gr_seterr(GR_ECORRUPT, "column %u '%s' (%s): %s: '%.*s%s'", i + 1, c->name,
                     type_name(c->type), what, shown, p, n > 24 ? "..." : "");
}

/* "has 3 fields, expected 8", with a hint when the line looks delimited by something else. */
static int bad_count(const gr_schema *s, const char *line, size_t len, size_t fields)
{
    const char *hint = "";
    if (fields == 1) {
        if (s->delim != ',' && memchr(line, ',', len))
            hint = " (the line has commas: a CSV file needs a schema with \"delimiter\": \",\")";
        else if (s->delim != '\t' && memchr(line, '\t', len))
            hint = " (the line has tabs: is the schema's delimiter right?)";
    }
    return gr_seterr(GR_ECORRUPT, "has %zu field%s, expected %u%s", fields, fields == 1 ? "" : "s",
                     s->ncols, hint);
}

static size_t count_fields(const char *p, size_t n, char delim)
{
    size_t k = 1;
    for (size_t i = 0; i < n; i++) k += p[i] == delim;
    return k;
}

int gr_schema_parse_line(const gr_schema *s, const char *line, size_t len, float *label,
                         float *dense, uint64_t *ids, uint32_t *bag_len, size_t *n_ids)
{
    if (s->criteo) {
        /* gr_criteo_parse_line drops one trailing '\r' itself: "...\r\r" stays a bad line. */
        int rc = gr_criteo_parse_line(line, len, label, dense, ids);
        if (len && line[len - 1] == '\r') len--;
        /* A wrong field count says more than whichever field happened to fail first. */
        size_t fields = rc == GR_ECORRUPT ? count_fields(line, len, '\t') : GR_CRITEO_FIELDS;
        if (fields != GR_CRITEO_FIELDS) return bad_count(s, line, len, fields);
        if (rc) return rc;
        if (bag_len)
            for (unsigned k = 0; k < GR_CRITEO_SPARSE; k++) bag_len[k] = 1;
        *n_ids = GR_CRITEO_SPARSE;
        return GR_OK;
    }
    if (len && line[len - 1] == '\r') len--;
    const char *p = line, *end = line + len;
    size_t at = 0;
    for (uint32_t i = 0; i < s->ncols; i++) {
        const gr_schema_column *c = &s->cols[i];
        const char *q = memchr(p, s->delim, (size_t)(end - p));
        if (!q) q = end;
        if (i + 1 < s->ncols && q == end) return bad_count(s, line, len, i + 1);
        if (i + 1 == s->ncols && q != end) return bad_count(s, line, len, count_fields(line, len, s->delim));
        size_t n = (size_t)(q - p);
        double v;
        switch (c->type) {
        case GR_COL_IGNORE:
            break;
        case GR_COL_LABEL:
            if (!parse_number(p, n, &v) || (v != 0.0 && v != 1.0))
                return bad_column(i, c, "the label must be 0 or 1", p, n);
            *label = (float)v;
            break;
        case GR_COL_DENSE: {
            const char *t = p;
            size_t tn = n;
            trim(&t, &tn);
            if (tn == 0) {
                dense[c->index] = c->fill;
                break;
            }
            if (!parse_number(t, tn, &v)) return bad_column(i, c, "not a number", p, n);
            if (c->transform == GR_TRANSFORM_LOG1P) v = log1p(v > 0 ? v : 0);
            dense[c->index] = (float)v;
            break;
        }
        case GR_COL_CATEGORICAL:
            if (n == 0) {
                ids[at++] = s->missing_id[c->index];
            } else if (!value_id(s, c, p, n, &ids[at++])) {
                return bad_column(i, c, c->encoding == GR_ENC_INT ? "not an integer" : "not hex",
                                  p, n);
            }
            if (bag_len) bag_len[c->index] = 1;
            break;
        case GR_COL_LIST: {
            uint32_t k = 0;
            const char *a = p;
            while (a <= q && k < c->max_items) {
                const char *b = memchr(a, c->separator, (size_t)(q - a));
                if (!b) b = q;
                /* Empty items ("a||b", a trailing separator) are no items. */
                if (b > a) {
                    if (!value_id(s, c, a, (size_t)(b - a), &ids[at + k]))
                        return bad_column(i, c, c->encoding == GR_ENC_INT ? "an item is not an integer"
                                                                          : "an item is not hex",
                                          a, (size_t)(b - a));
                    k++;
                }
                a = b + 1;
            }
            /* An empty list is one id of its own, so a bag is never empty (mean pooling). */
            if (k == 0) ids[at + k++] = s->missing_id[c->index];
            at += k;
            if (bag_len) bag_len[c->index] = k;
            break;
        }
        }
        p = q + 1;
    }
    *n_ids = at;
    return GR_OK;
}
