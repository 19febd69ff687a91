/* The predict body's fast path for {"lines": [...]} (src/serve/lines.c) against the cJSON
 * path: wherever the fast path answers, the cJSON path answers the same (same examples, bit
 * for bit); the bodies a client sends (the benchmark's, with whitespace, escapes, several
 * lines) do take the fast path; everything it must not read (other forms, \u escapes, other
 * keys, trailing bytes, bad lines, too many lines) it declines, and gr_serve_parse_predict
 * then gives the cJSON path's answer and message; random byte mutations of valid bodies never
 * make the two disagree. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/serve.h"
#include "serve/serve_int.h"

#define LINE "1\\t2\\t\\t4\\t5\\t6\\t7\\t8\\t9\\t10\\t11\\t12\\t13\\t68fd1e64\\t\\t0\\t1\\t2\\t3\\t4\\t5" \
             "\\t6\\t7\\t8\\t9\\ta\\tb\\tc\\td\\te\\tf\\t10\\t11\\t12\\t13\\t14\\t15\\t16\\t17"
#define LINE2 "0\\t\\t3\\t4\\t5\\t6\\t7\\t8\\t9\\t10\\t11\\t12\\t99\\t1\\t2\\t3\\t4\\t5\\t6\\t7\\t8" \
              "\\t9\\ta\\tb\\tc\\td\\te\\tf\\t10\\t11\\t12\\t13\\t14\\t15\\t16\\t17\\t18\\t19\\t20"

/* Both paths on one body; returns whether the fast path answered. */
static bool compare(const char *body, size_t len, uint32_t max)
{
    size_t nf = 0, ns = 0;
    float *df = NULL, *ds = NULL;
    uint64_t *xf = NULL, *xs = NULL;
    char err[512] = "", err2[512] = "";
    bool fast = sv_parse_lines_fast(body, len, max, &nf, &df, &xf);
    int rs = sv_parse_predict_json(body, len, max, &ns, &ds, &xs, err, sizeof err);
    if (fast) {
        if (rs != GR_OK) fail_msg("fast path read '%.*s', the cJSON path says %s", (int)len, body, err);
        assert_int_equal(nf, ns);
        assert_memory_equal(df, ds, nf * GR_CRITEO_DENSE * sizeof *df);
        assert_memory_equal(xf, xs, nf * GR_CRITEO_SPARSE * sizeof *xf);
    } else {
        assert_null(df);
        assert_null(xf);
    }
    /* The public entry answers as the cJSON path does, message included. */
    size_t n = 0;
    float *d = NULL;
    uint64_t *x = NULL;
    int r = gr_serve_parse_predict(body, len, max, &n, &d, &x, err2, sizeof err2);
    assert_int_equal(r, rs);
    assert_int_equal(n, ns);
    if (rs) assert_string_equal(err2, err);
    else assert_memory_equal(d, ds, n * GR_CRITEO_DENSE * sizeof *d);
    free(df), free(xf), free(ds), free(xs), free(d), free(x);
    return fast;
}

static bool cmp_str(const char *body, uint32_t max) { return compare(body, strlen(body), max); }

static void test_fast_bodies(void **state)
{
    (void)state;
    assert_true(cmp_str("{\"lines\":[\"" LINE "\"]}", 10));
    assert_true(cmp_str(" \r\n{ \"lines\" :\t[ \"" LINE "\" , \"" LINE2 "\" ] }\n ", 10));
    assert_true(cmp_str("{\"lines\":[\"" LINE "\",\"" LINE2 "\",\"" LINE "\"]}", 3));
    /* Every JSON escape the fast path knows, in a line that then fails (its message comes
     * from the cJSON path, reading the same bytes). */
    assert_false(cmp_str("{\"lines\":[\"1\\t2\\/\\\"\\\\\\b\\f\\n\\r\"]}", 10));
}

static void test_declined_bodies(void **state)
{
    (void)state;
    static const char *const bodies[] = {
        "{\"lines\":[\"" LINE "\"]} trailing",             /* cJSON reads past nothing after */
        "{\"lines\":[\"" LINE "\"],\"lines\":[]}",          /* a second key */
        "{\"examples\":[]}", "{\"lines\":[]}", "{\"lines\":[1]}", "[]", "", "{", "{\"lines\":[",
        "{\"lines\":[\"\\u0031\\t2\"]}",                      /* \u: the cJSON path's */
        "{\"lines\":[\"1\\t2\"]}",                            /* a bad line: its message */
        "{\"lines\":[\"" LINE "\",\"" LINE "\"]}",          /* over max (1) */
        "{\"lines\":[\"1\x01\"]}",                            /* a raw control byte */
        "{\"lines\" [\"" LINE "\"]}", "{\"lines\":[\"" LINE "\",]}", "{\"lines\":[\"" LINE "\"}",
        "\v{\"lines\":[\"" LINE "\"]}",                      /* whitespace only cJSON skips */
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
        if (cmp_str(bodies[i], 1)) fail_msg("the fast path read body %zu: %s", i, bodies[i]);
    /* A NUL after the object (cJSON stops there; the fast path declines). */
    static const char nul[] = "{\"lines\":[\"" LINE "\"]}";
    assert_false(compare(nul, sizeof nul, 1));
    /* The same body is read once its count fits. */
    assert_true(cmp_str("{\"lines\":[\"" LINE "\",\"" LINE "\"]}", 2));
}

/* Random mutations (a byte changed, dropped or doubled) of valid bodies. */
static void test_mutations(void **state)
{
    (void)state;
    const char *seed = "{ \"lines\": [\"" LINE "\", \"" LINE2 "\"] }";
    size_t sl = strlen(seed), fast = 0;
    gr_rng r;
    gr_rng_seed(&r, 12);
    static const char alphabet[] = "{}[]\":,\\ \t\nlinesu0123456789abcdef/tnr\x01\x7f\xc3";
    char *buf = malloc(sl * 2 + 8);
    for (int it = 0; it < 20000; it++) {
        memcpy(buf, seed, sl);
        size_t len = sl;
        for (int m = 1 + (int)(gr_rng_next(&r) % 3); m > 0; m--) {
            size_t at = gr_rng_next(&r) % len;
            switch (gr_rng_next(&r) % 3) {
            case 0: buf[at] = alphabet[gr_rng_next(&r) % (sizeof alphabet - 1)]; break;
            case 1: memmove(buf + at, buf + at + 1, len - at - 1), len--; break;
            default: memmove(buf + at + 1, buf + at, len - at), len++; break;
            }
        }
        fast += compare(buf, len, 4);
    }
    free(buf);
    assert_true(fast > 100); /* some mutations stay readable (a changed digit) */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fast_bodies),
        cmocka_unit_test(test_declined_bodies),
        cmocka_unit_test(test_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
