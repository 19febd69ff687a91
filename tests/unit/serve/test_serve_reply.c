/* The predict reply's float formatter (src/serve/reply.c): every float it writes reads back
 * (strtof, and strtod then a cast to float, as a JSON client does) as exactly that float,
 * sign of zero included; edge values (0, -0, the smallest denormal, the largest denormal,
 * 1e-45, 0.5, 1, the floats either side of 1, FLT_MAX) and a sweep over bit patterns; the text
 * is a JSON number; NaN and infinities are null; the reply holds every probability in order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/serve.h"
#include "serve/serve_int.h"

/* JSON's number grammar: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? */
static bool json_number(const char *s)
{
    if (*s == '-') s++;
    if (*s == '0') s++;
    else if (*s >= '1' && *s <= '9') while (isdigit((unsigned char)*s)) s++;
    else return false;
    if (*s == '.') {
        s++;
        if (!isdigit((unsigned char)*s)) return false;
        while (isdigit((unsigned char)*s)) s++;
    }
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-') s++;
        if (!isdigit((unsigned char)*s)) return false;
        while (isdigit((unsigned char)*s)) s++;
    }
    return *s == '\0';
}

static float from_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* Formats f and checks the round trip; returns the text's length. */
static size_t check_one(float f, char *text)
{
    char buf[GR_SERVE_FLOAT_CHARS + 1];
    size_t n = gr_serve_format_float(f, buf);
    assert_true(n > 0 && n <= GR_SERVE_FLOAT_CHARS);
    buf[n] = '\0';
    if (text) strcpy(text, buf);
    if (!json_number(buf)) fail_msg("%a: '%s' is not a JSON number", (double)f, buf);
    float back = strtof(buf, NULL), back_d = (float)strtod(buf, NULL);
    if (memcmp(&back, &f, sizeof f) || memcmp(&back_d, &f, sizeof f))
        fail_msg("%a (%.9g) written as '%s' reads back as %a", (double)f, (double)f, buf,
                 (double)back);
    return n;
}

static void test_edge_values(void **state)
{
    (void)state;
    char t[32];
    check_one(0.0f, t);
    assert_string_equal(t, "0");
    check_one(-0.0f, t);
    assert_string_equal(t, "-0");
    check_one(1.0f, t);
    assert_string_equal(t, "1");
    check_one(0.5f, t);
    assert_string_equal(t, "0.5");
    check_one(1e-45f, t); /* the smallest denormal, 1.40129846e-45 */
    assert_string_equal(t, "1.40129846e-45");
    check_one(from_bits(0x007fffffu), NULL); /* the largest denormal */
    check_one(FLT_MIN, NULL);
    check_one(FLT_MAX, NULL);
    check_one(-FLT_MAX, NULL);
    check_one(nextafterf(1.0f, 0.0f), t); /* 0.99999994 */
    assert_string_equal(t, "0.99999994");
    check_one(nextafterf(1.0f, 2.0f), t);
    assert_string_equal(t, "1.00000012");
    check_one(0.1f, t);
    assert_string_equal(t, "0.100000001");
    check_one(1e-5f, NULL);
    check_one(123456789.0f, NULL);
    check_one(1e9f, NULL);
    check_one(3.0e38f, NULL);
    check_one(0.533948839f, t);
    assert_string_equal(t, "0.533948839");
    /* Not numbers in JSON. */
    char buf[GR_SERVE_FLOAT_CHARS];
    assert_int_equal(gr_serve_format_float(NAN, buf), 4);
    assert_memory_equal(buf, "null", 4);
    assert_int_equal(gr_serve_format_float(-INFINITY, buf), 4);
    assert_memory_equal(buf, "null", 4);
}

/* Every power of ten a float holds and its neighbours: where the exponent estimate and the
 * scaling switch over. */
static void test_powers_of_ten(void **state)
{
    (void)state;
    for (int e = -45; e <= 38; e++) {
        char lit[16];
        snprintf(lit, sizeof lit, "1e%d", e);
        float p = strtof(lit, NULL);
        if (p == 0 || isinf(p)) continue;
        check_one(p, NULL);
        check_one(nextafterf(p, 0.0f), NULL);
        check_one(nextafterf(p, INFINITY), NULL);
        check_one(-p, NULL);
    }
}

/* Bit patterns across the whole range (every exponent, denormals included) and the
 * probabilities a model gives: all in (0, 1). */
static void test_sweep(void **state)
{
    (void)state;
    size_t n = 0, chars = 0;
    for (uint64_t b = 1; b < 0x7f800000u; b += 1237) {
        chars += check_one(from_bits((uint32_t)b), NULL);
        n++;
    }
    for (uint32_t i = 0; i < 200000; i++) check_one((float)i / 200000.0f, NULL);
    assert_true(n > 1000000);
    assert_true(chars / n <= 15);
}

static void test_reply(void **state)
{
    (void)state;
    const float probs[4] = {0.25f, 0x1p-10f, 0x1p-20f, -0.0f};
    char *body;
    size_t len;
    assert_int_equal(sv_predict_reply(probs, 4, 18446744073709551615ull, &body, &len), GR_OK);
    const char *want = "{\"predictions\":[0.25,0.0009765625,9.53674316e-7,-0],\"model_version\":18446744073709551615}";
    assert_int_equal(len, strlen(want));
    assert_memory_equal(body, want, len);
    free(body);
    assert_int_equal(sv_predict_reply(probs, 1, 0, &body, &len), GR_OK);
    assert_int_equal(len, strlen("{\"predictions\":[0.25],\"model_version\":0}"));
    assert_memory_equal(body, "{\"predictions\":[0.25],\"model_version\":0}", len);
    free(body);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edge_values),
        cmocka_unit_test(test_powers_of_ten),
        cmocka_unit_test(test_sweep),
        cmocka_unit_test(test_reply),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
