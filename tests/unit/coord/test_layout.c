/* Unit tests for the coord layout value and its JSON form (the layout znode and the static
 * cluster file): round trips, the default slot map, the client's plain cluster file, and a
 * clear error for every malformed field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "granary/coord.h"

static void test_init_default_map(void **state)
{
    (void)state;
    gr_coord_layout l;
    assert_int_equal(gr_coord_layout_init(&l, 3), 0);
    assert_int_equal(l.epoch, 1);
    assert_int_equal(l.version, -1);
    assert_int_equal(l.n_shards, 3);
    for (uint32_t s = 0; s < GR_SLOTS; s++) assert_int_equal(l.slot_map[s], gr_slot_shard(s, 3));
    assert_int_equal(l.shards[2].index, 2);
    assert_string_equal(l.shards[2].address, "");
    gr_coord_layout_fini(&l);
    gr_coord_layout_fini(&l); /* zeroed: a no-op */
    assert_int_equal(gr_coord_layout_init(&l, 0), GR_EINVAL);
    assert_int_equal(gr_coord_layout_init(&l, GR_SLOTS + 1), GR_EINVAL);
}

static void test_round_trip(void **state)
{
    (void)state;
    gr_coord_layout l, back;
    assert_int_equal(gr_coord_layout_init(&l, 2), 0);
    l.epoch = 7;
    strcpy(l.shards[0].address, "10.0.0.1:7000");
    strcpy(l.shards[0].member, "m-0000000000000001-0000000003");
    strcpy(l.shards[1].address, "[::1]:7001");
    /* A moved slot: the ranges must carry it exactly. */
    l.slot_map[5] = 1;
    l.slot_map[GR_SLOTS - 1] = 0;
    char *json = gr_coord_layout_encode(&l);
    assert_non_null(json);
    assert_non_null(strstr(json, "\"slots\":[[0,4,0],[5,5,1],[6,8191,0],[8192,16382,1],"
                                 "[16383,16383,0]]"));
    assert_int_equal(gr_coord_layout_decode(json, strlen(json), &back), 0);
    assert_int_equal(back.epoch, 7);
    assert_int_equal(back.version, -1);
    assert_int_equal(back.n_shards, 2);
    assert_string_equal(back.shards[0].address, "10.0.0.1:7000");
    assert_string_equal(back.shards[0].member, "m-0000000000000001-0000000003");
    assert_string_equal(back.shards[1].address, "[::1]:7001");
    assert_memory_equal(back.slot_map, l.slot_map, GR_SLOTS * sizeof *l.slot_map);
    char servers[64];
    assert_int_equal(gr_coord_layout_servers(&back, servers, sizeof servers), 0);
    assert_string_equal(servers, "10.0.0.1:7000,[::1]:7001");
    assert_int_equal(gr_coord_layout_servers(&back, servers, 10), GR_ETOOBIG);
    gr_coord_layout copy;
    assert_int_equal(gr_coord_layout_copy(&copy, &back), 0);
    assert_memory_equal(copy.shards, back.shards, 2 * sizeof *back.shards);
    gr_coord_layout_fini(&copy);
    free(json);
    gr_coord_layout_fini(&back);
    gr_coord_layout_fini(&l);
}

static void test_client_cluster_file(void **state)
{
    (void)state;
    /* The client's cluster file: plain strings, no epoch, no slots, extra keys. */
    const char *j = "{\"shards\":[\"a:1\",\"b:2\",\"c:3\"],\"auth_file\":\"secret\"}";
    gr_coord_layout l;
    assert_int_equal(gr_coord_layout_decode(j, strlen(j), &l), 0);
    assert_int_equal(l.n_shards, 3);
    assert_int_equal(l.epoch, 1);
    assert_string_equal(l.shards[2].address, "c:3");
    assert_int_equal(l.slot_map[GR_SLOTS - 1], 2);
    gr_coord_layout_fini(&l);
}

static void expect_bad(const char *json, const char *words)
{
    gr_coord_layout l;
    int rc = gr_coord_layout_decode(json, strlen(json), &l);
    if (rc != GR_EINVAL || !strstr(gr_errmsg(), words))
        fail_msg("decode(%s) = %d '%s'; wanted EINVAL with '%s'", json, rc, gr_errmsg(), words);
    assert_null(l.shards);
}

static void test_bad_input(void **state)
{
    (void)state;
    expect_bad("", "not valid JSON");
    expect_bad("[1]", "not a JSON object");
    expect_bad("{}", "needs \"shards\"");
    expect_bad("{\"shards\":[]}", "needs \"shards\"");
    expect_bad("{\"shards\":[1]}", "shards[0] must be an object");
    expect_bad("{\"shards\":[{\"index\":1}]}", "shards[0] has \"index\" other than 0");
    expect_bad("{\"shards\":[{\"address\":7}]}", "shards[0].address must be a string");
    expect_bad("{\"shards\":[\"a:1\"],\"epoch\":0}", "\"epoch\" must be a whole number");
    expect_bad("{\"shards\":[\"a:1\"],\"epoch\":1.5}", "\"epoch\" must be a whole number");
    expect_bad("{\"shards\":[\"a:1\"],\"slots\":{}}", "\"slots\" must be an array");
    expect_bad("{\"shards\":[\"a:1\"],\"slots\":[[0,16383]]}", "slots[0] must be [first");
    expect_bad("{\"shards\":[\"a:1\"],\"slots\":[[1,16383,0]]}", "slot 0 comes next");
    expect_bad("{\"shards\":[\"a:1\"],\"slots\":[[0,100,0]]}", "not all 16384 slots");
    expect_bad("{\"shards\":[\"a:1\"],\"slots\":[[0,16383,1]]}", "names shard 1 of 1");
    expect_bad("{\"shards\":[\"a:1\"],\"slots\":[[0,9,0],[5,16383,0]]}", "slot 10 comes next");
    expect_bad("{\"shards\":[\"a:1\"],\"slots\":[[0,16384,0]]}", "slots[0] must be");
    char big[600];
    memset(big, 'x', sizeof big);
    big[sizeof big - 1] = '\0';
    char json[800];
    snprintf(json, sizeof json, "{\"shards\":[\"%s\"]}", big);
    expect_bad(json, "longer than 255 bytes");
    /* Not NUL-terminated: only len bytes are read. */
    const char *j = "{\"shards\":[\"a:1\"]}garbage";
    gr_coord_layout l;
    assert_int_equal(gr_coord_layout_decode(j, 18, &l), 0);
    gr_coord_layout_fini(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_default_map),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_client_cluster_file),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
