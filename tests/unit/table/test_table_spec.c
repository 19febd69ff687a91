/* Unit tests for table specs: defaults, validation messages, the JSON form (parse, round trip,
 * unknown and duplicate fields, lists of tables) and state sizes per optimizer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/table.h"

static void expect_einval(const gr_table_spec *s, const char *needle)
{
    assert_int_equal(gr_table_spec_validate(s), GR_EINVAL);
    if (!strstr(gr_errmsg(), needle)) fail_msg("message '%s' lacks '%s'", gr_errmsg(), needle);
}

static void test_defaults_and_validate(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "user", 16);
    assert_string_equal(s.name, "user");
    assert_int_equal(s.dim, 16);
    assert_int_equal(s.dtype, GR_DTYPE_F32);
    assert_int_equal(s.init.kind, GR_INIT_ZEROS);
    assert_int_equal(s.opt.kind, GR_OPT_SGD);
    assert_true(s.opt.lr == 0.01f);
    assert_true(s.admit_probability == 1.0f);
    assert_int_equal(s.admit_min_count, 0);
    assert_true(s.ttl_s == 0 && s.capacity == 0 && s.mem_limit == 0);
    assert_int_equal(gr_table_spec_validate(&s), GR_OK);

    gr_table_spec b = s;
    b.dim = 0;
    expect_einval(&b, "dim 0");
    b.dim = 1025;
    expect_einval(&b, "dim 1025");
    b.dim = 1024;
    assert_int_equal(gr_table_spec_validate(&b), GR_OK);
    b = s;
    strcpy(b.name, "bad name");
    expect_einval(&b, "character");
    b.name[0] = '\0';
    expect_einval(&b, "name");
    b = s;
    b.partitions = 3;
    expect_einval(&b, "power of two");
    b.partitions = 0;
    assert_int_equal(gr_table_spec_validate(&b), GR_OK);
    b = s;
    b.admit_probability = 1.5f;
    expect_einval(&b, "probability");
    b = s;
    b.init.kind = GR_INIT_UNIFORM;
    b.init.low = 1.0f;
    b.init.high = 1.0f;
    expect_einval(&b, "low < high");
    b = s;
    b.opt.lr = -1.0f;
    expect_einval(&b, "lr");
    b = s;
    b.opt.kind = GR_OPT_ADAM;
    b.opt.beta1 = 1.0f;
    expect_einval(&b, "beta1");
    b = s;
    b.opt.kind = (gr_opt_kind)42;
    expect_einval(&b, "unknown optimizer");
    assert_int_equal(gr_table_spec_validate(NULL), GR_EINVAL);
}

static void test_state_floats(void **state)
{
    (void)state;
    gr_table_spec s;
    gr_table_spec_default(&s, "t", 10);
    assert_int_equal(gr_table_state_floats(&s), 0);
    s.opt.kind = GR_OPT_ADAGRAD;
    assert_int_equal(gr_table_state_floats(&s), 10);
    s.opt.kind = GR_OPT_ROWWISE_ADAGRAD;
    assert_int_equal(gr_table_state_floats(&s), 1);
    s.opt.kind = GR_OPT_ADAM;
    assert_int_equal(gr_table_state_floats(&s), 21);
    s.opt.kind = GR_OPT_FTRL;
    assert_int_equal(gr_table_state_floats(&s), 20);
}

static const char *example =
    "{\"name\":\"user\",\"id\":1,\"dim\":16,\"dtype\":\"f32\",\"seed\":7,"
    "\"init\":{\"kind\":\"uniform\",\"low\":-0.05,\"high\":0.05},"
    "\"optimizer\":{\"kind\":\"adagrad\",\"lr\":0.05,\"eps\":1e-8,\"initial_accumulator\":0.0},"
    "\"admit\":{\"min_count\":2,\"probability\":1.0},"
    "\"evict\":{\"ttl_s\":86400,\"capacity\":1000000},\"mem_limit\":\"4G\",\"partitions\":256}";

static void test_json_example(void **state)
{
    (void)state;
    gr_table_spec s;
    assert_int_equal(gr_table_spec_from_json(example, &s), GR_OK);
    assert_string_equal(s.name, "user");
    assert_int_equal(s.id, 1);
    assert_int_equal(s.dim, 16);
    assert_true(s.seed == 7);
    assert_int_equal(s.init.kind, GR_INIT_UNIFORM);
    assert_true(s.init.low == -0.05f && s.init.high == 0.05f);
    assert_int_equal(s.opt.kind, GR_OPT_ADAGRAD);
    assert_true(s.opt.lr == 0.05f && s.opt.eps == 1e-8f);
    assert_int_equal(s.admit_min_count, 2);
    assert_true(s.ttl_s == 86400 && s.capacity == 1000000);
    assert_true(s.mem_limit == 4ull << 30);
    assert_int_equal(s.partitions, 256);

    /* Round trip: to_json then from_json gives an equal spec. */
    char *txt = gr_table_spec_to_json(&s);
    assert_non_null(txt);
    gr_table_spec r;
    assert_int_equal(gr_table_spec_from_json(txt, &r), GR_OK);
    assert_true(gr_table_spec_equal(&s, &r));
    assert_non_null(strstr(txt, "\"lr\":0.05"));
    free(txt);

    /* Minimal spec takes the defaults. */
    gr_table_spec d, m;
    gr_table_spec_default(&d, "item", 8);
    assert_int_equal(gr_table_spec_from_json("{\"name\":\"item\",\"dim\":8}", &m), GR_OK);
    assert_true(gr_table_spec_equal(&d, &m));
    m.opt.lr = 0.02f;
    assert_false(gr_table_spec_equal(&d, &m));
}

static void test_json_roundtrip_all_kinds(void **state)
{
    (void)state;
    for (int k = 0; k < 5; k++) {
        gr_table_spec s;
        gr_table_spec_default(&s, "t.k-1_x", 3 + (uint32_t)k);
        s.id = 77 + (uint32_t)k;
        s.dtype = k & 1 ? GR_DTYPE_F16 : GR_DTYPE_F32;
        s.seed = 0xfedcba9876543210ull; /* beyond 2^53: written as a string */
        s.init.kind = (gr_init_kind)(k % 4);
        s.init.value = 0.1f * (float)k;
        s.init.mean = -0.3f;
        s.init.stddev = 0.123456789f;
        s.opt.kind = (gr_opt_kind)k;
        s.opt.lr = 1.0f / 3.0f;
        s.opt.eps = 1e-10f;
        s.opt.l1 = 0.25f;
        s.opt.l2 = 1e-3f;
        s.opt.beta = 0.5f;
        s.admit_min_count = 5;
        s.admit_probability = 0.3f;
        s.ttl_s = 1ull << 40;
        s.capacity = 123456789012345ull;
        s.mem_limit = (1ull << 62) + 1;
        s.partitions = 1u << k;
        assert_int_equal(gr_table_spec_validate(&s), GR_OK);
        char *txt = gr_table_spec_to_json(&s);
        assert_non_null(txt);
        gr_table_spec r;
        if (gr_table_spec_from_json(txt, &r) != GR_OK) fail_msg("%s: %s", txt, gr_errmsg());
        assert_true(gr_table_spec_equal(&s, &r));
        free(txt);
    }
}

static void expect_json_error(const char *json, const char *needle)
{
    gr_table_spec s;
    assert_int_equal(gr_table_spec_from_json(json, &s), GR_EINVAL);
    if (!strstr(gr_errmsg(), needle))
        fail_msg("for %s: message '%s' lacks '%s'", json, gr_errmsg(), needle);
}

static void test_json_errors(void **state)
{
    (void)state;
    expect_json_error("{\"name\":\"a\",\"dim\":4,\"colour\":1}", "unknown field 'colour'");
    expect_json_error("{\"name\":\"a\",\"dim\":4,\"init\":{\"kind\":\"zeros\",\"x\":1}}",
                      "unknown field 'init.x'");
    expect_json_error("{\"name\":\"a\",\"dim\":4,\"optimizer\":{\"kind\":\"sgd\",\"momentum\":1}}",
                      "unknown field 'optimizer.momentum'");
    expect_json_error("{\"name\":\"a\",\"dim\":4,\"admit\":{\"min\":1}}", "unknown field 'admit.min'");
    expect_json_error("{\"name\":\"a\",\"dim\":4,\"evict\":{\"ttl\":1}}", "unknown field 'evict.ttl'");
    expect_json_error("{\"name\":\"a\",\"dim\":0}", "dim 0");
    expect_json_error("{\"name\":\"a\",\"dim\":1025}", "dim 1025");
    expect_json_error("{\"name\":\"a\",\"dim\":4.5}", "dim");
    expect_json_error("{\"name\":\"a\"}", "'dim' is required");
    expect_json_error("{\"dim\":4}", "'name'");
    expect_json_error("{\"name\":\"a\",\"dim\":4,\"partitions\":12}", "power of two");
    expect_json_error("{\"name\":\"a\",\"dim\":4,\"dtype\":\"f64\"}", "expected one of f32, f16");
    expect_json_error("{\"name\":\"a\",\"dim\":4,\"optimizer\":{\"kind\":\"lamb\"}}", "lamb");
    expect_json_error("{\"name\":\"a\",\"dim\":4,\"optimizer\":{\"lr\":\"x\"}}", "must be a number");
    expect_json_error("{\"name\":\"a\",\"dim\":4,\"mem_limit\":\"4Q\"}", "not a size");
    expect_json_error("{\"name\":\"a\",\"dim\":4,\"dim\":5}", "appears twice");
    expect_json_error("{\"name\":\"a\",\"dim\":4,\"seed\":-1}", "seed");
    expect_json_error("{\"name\":\"a\",\"dim\":4,\"id\":4294967296}", "exceeds");
    expect_json_error("{\"name\":\"a\",\"dim\":4", "invalid JSON");
    expect_json_error("[1,2]", "must be a JSON object");
    gr_table_spec s;
    assert_int_equal(gr_table_spec_from_json(NULL, &s), GR_EINVAL);
    assert_int_equal(gr_table_spec_from_json("{}", NULL), GR_EINVAL);
}

static void test_json_list(void **state)
{
    (void)state;
    gr_table_spec *specs;
    size_t n;
    const char *doc = "{\"tables\":[{\"name\":\"a\",\"id\":1,\"dim\":4},"
                      "{\"name\":\"b\",\"id\":2,\"dim\":8,\"optimizer\":{\"kind\":\"adam\"}}]}";
    assert_int_equal(gr_table_specs_from_json(doc, &specs, &n), GR_OK);
    assert_int_equal(n, 2);
    assert_string_equal(specs[0].name, "a");
    assert_int_equal(specs[1].dim, 8);
    assert_int_equal(specs[1].opt.kind, GR_OPT_ADAM);
    free(specs);
    assert_int_equal(gr_table_specs_from_json("[{\"name\":\"a\",\"dim\":4}]", &specs, &n), GR_OK);
    assert_int_equal(n, 1);
    free(specs);
    assert_int_equal(gr_table_specs_from_json("[]", &specs, &n), GR_OK);
    assert_int_equal(n, 0);
    free(specs);
    assert_int_equal(gr_table_specs_from_json("[{\"name\":\"a\",\"id\":1,\"dim\":4},"
                                              "{\"name\":\"a\",\"id\":2,\"dim\":4}]",
                                              &specs, &n),
                     GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "appears twice"));
    assert_null(specs);
    assert_int_equal(gr_table_specs_from_json("[{\"name\":\"a\",\"id\":1,\"dim\":4},"
                                              "{\"name\":\"b\",\"id\":1,\"dim\":4}]",
                                              &specs, &n),
                     GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "share id 1"));
    assert_int_equal(gr_table_specs_from_json("[{\"name\":\"a\",\"dim\":4},{\"name\":\"b\"}]",
                                              &specs, &n),
                     GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "specs[1]"));
    assert_int_equal(gr_table_specs_from_json("{\"tables\":[],\"x\":1}", &specs, &n), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "unknown field 'x'"));
    assert_int_equal(gr_table_specs_from_json("{\"tablez\":[]}", &specs, &n), GR_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_validate),
        cmocka_unit_test(test_state_floats),
        cmocka_unit_test(test_json_example),
        cmocka_unit_test(test_json_roundtrip_all_kinds),
        cmocka_unit_test(test_json_errors),
        cmocka_unit_test(test_json_list),
    };
    return cmocka_run_group_tests_name("table_spec", tests, NULL, NULL);
}
