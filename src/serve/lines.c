/* The common predict body, {"lines": ["TSV", ...]}, read without building a cJSON tree: each
 * string is unescaped straight into the line buffer the trainer's parser reads (one copy of
 * the body's bytes instead of three: cJSON's node, its string, the line), with no allocation
 * but the output arrays. It accepts only what it can read exactly as the cJSON path would
 * (sv_parse_predict_json): one key "lines", strings with the escapes \t \n \r \b \f \" \\ \/,
 * JSON whitespace, nothing after the object, every line parsing, at most max lines. Anything
 * else (another form, \u escapes, control bytes, a bad line, an error to report) it declines,
 * and the cJSON path answers, with its messages. tests/unit/serve/test_serve_lines.c and the
 * fuzz target fuzz_serve_predict check that both paths agree wherever this one answers. */
#include "serve/serve_int.h"

#include <stdlib.h>
#include <string.h>

#define LINE_MAX_BYTES 1024 /* a Criteo line is a few hundred bytes; longer ones decline */

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

/* Unescapes the JSON string at p (just past its opening quote) into out (cap bytes); returns
 * the position past the closing quote, or NULL to decline. */
static const char *read_string(const char *p, const char *end, char *out, size_t cap, size_t *len)
{
    size_t n = 0;
    while (p < end) {
        unsigned char c = (unsigned char)*p++;
        if (c == '"') {
            *len = n;
            return p;
        }
        if (c < 0x20 || n == cap) return NULL;
        if (c == '\\') {
            if (p == end) return NULL;
            switch (*p++) {
            case 't': c = '\t'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case '"': c = '"'; break;
            case '\\': c = '\\'; break;
            case '/': c = '/'; break;
            default: return NULL; /* \u (and anything cJSON may refuse) */
            }
        }
        out[n++] = (char)c;
    }
    return NULL;
}

/* Room for at least n + 1 examples in *dense and *ids. */
static bool reserve(size_t n, size_t *cap, float **dense, uint64_t **ids)
{
    if (n < *cap) return true;
    size_t c = *cap ? *cap * 2 : 1;
    float *d = realloc(*dense, c * GR_CRITEO_DENSE * sizeof *d);
    if (d) *dense = d;
    uint64_t *x = realloc(*ids, c * GR_CRITEO_SPARSE * sizeof *x);
    if (x) *ids = x;
    if (!d || !x) return false;
    *cap = c;
    return true;
}

bool sv_parse_lines_fast(const char *body, size_t len, uint32_t max, size_t *n_out, float **dense_out,
                         uint64_t **ids_out)
{
    static const char key[] = "\"lines\"";
    const char *p = body, *end = body + len;
    float *dense = NULL;
    uint64_t *ids = NULL;
    size_t n = 0, cap = 0;
    char line[LINE_MAX_BYTES + 2];
    p = skip_ws(p, end);
    if (p == end || *p++ != '{') goto decline;
    p = skip_ws(p, end);
    if ((size_t)(end - p) < sizeof key - 1 || memcmp(p, key, sizeof key - 1)) goto decline;
    p = skip_ws(p + sizeof key - 1, end);
    if (p == end || *p++ != ':') goto decline;
    p = skip_ws(p, end);
    if (p == end || *p++ != '[') goto decline;
    for (;;) {
        p = skip_ws(p, end);
        if (p == end || *p++ != '"' || n >= max) goto decline;
        /* The parser reads a labelled line: "0\t" in front, as parse_line writes it. */
        line[0] = '0';
        line[1] = '\t';
        size_t ll;
        if (!(p = read_string(p, end, line + 2, LINE_MAX_BYTES, &ll))) goto decline;
        /* cJSON's string ends at a NUL it unescaped from nothing (read_string refuses raw
         * control bytes), so the line is all of it. */
        if (!reserve(n, &cap, &dense, &ids)) goto decline;
        float label;
        if (gr_criteo_parse_line(line, ll + 2, &label, dense + n * GR_CRITEO_DENSE,
                                 ids + n * GR_CRITEO_SPARSE))
            goto decline;
        n++;
        p = skip_ws(p, end);
        if (p == end) goto decline;
        if (*p == ']') break;
        if (*p++ != ',') goto decline;
    }
    p = skip_ws(p + 1, end);
    if (p == end || *p++ != '}') goto decline;
    if (skip_ws(p, end) != end) goto decline;
    *n_out = n;
    *dense_out = dense;
    *ids_out = ids;
    return true;
decline:
    free(dense);
    free(ids);
    return false;
}
