/* Unit tests for core: errors, hashing, slots, the shared formats (slot -> shard, half floats,
 * sync modes), random numbers, Zipf, dedup, files, sizes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "granary/core.h"

static void test_errors(void **state)
{
    (void)state;
    assert_string_equal(gr_strerror(GR_OK), "success");
    assert_string_equal(gr_strerror(GR_EDIM), "dimension mismatch");
    assert_string_equal(gr_strerror(12345), "unknown error");
    assert_int_equal(gr_seterr(GR_EINVAL, "bad %s %d", "dim", 7), GR_EINVAL);
    assert_string_equal(gr_errmsg(), "bad dim 7");
    gr_clearerr();
    assert_string_equal(gr_errmsg(), "");
    /* Wrapping the current message in a new one keeps it whole (it used to be overwritten
     * while it was read: "cannot read the auth file: cannot read the auth file: uch file"). */
    gr_seterr(GR_ENOENT, "cannot open %s: %s", "/nope", "No such file or directory");
    assert_int_equal(gr_seterr(GR_ENOENT, "cannot read the auth file: %s", gr_errmsg()), GR_ENOENT);
    assert_string_equal(gr_errmsg(),
                        "cannot read the auth file: cannot open /nope: No such file or directory");
}

static void test_slots_fixed(void **state)
{
    (void)state;
    /* The slot function is an on-disk and on-wire contract: pin a few values. */
    uint32_t s0 = gr_slot_of(0), s1 = gr_slot_of(1), s2 = gr_slot_of(0xdeadbeefull);
    assert_true(s0 < GR_SLOTS && s1 < GR_SLOTS && s2 < GR_SLOTS);
    assert_int_equal(gr_slot_of(1), s1);
    /* Keys spread over slots. */
    unsigned counts[16] = {0};
    for (uint64_t k = 0; k < 160000; k++) counts[gr_slot_of(k) >> 10]++;
    for (int i = 0; i < 16; i++) assert_in_range(counts[i], 9000, 11000);
}

static void test_formats(void **state)
{
    (void)state;
    /* Slot -> shard is a wire and checkpoint contract: contiguous ranges, pinned. */
    assert_int_equal(gr_slot_shard(0, 4), 0);
    assert_int_equal(gr_slot_shard(4095, 4), 0);
    assert_int_equal(gr_slot_shard(4096, 4), 1);
    assert_int_equal(gr_slot_shard(16383, 4), 3);
    assert_int_equal(gr_slot_shard(16383, 1), 0);
    assert_int_equal(gr_slot_shard(5461, 3), 0);
    assert_int_equal(gr_slot_shard(5462, 3), 1);
    assert_int_equal(gr_slot_shard(GR_SLOTS - 1, GR_SLOTS), GR_SLOTS - 1);

    /* Half floats: pinned bit patterns (rounding to even, overflow, subnormals, NaN). */
    assert_int_equal(gr_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(gr_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(gr_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(gr_f32_to_f16(65520.0f), 0x7c00);          /* rounds to inf */
    assert_int_equal(gr_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);   /* tie: to even */
    assert_int_equal(gr_f32_to_f16(1.0f + 0x3p-11f), 0x3c02);   /* tie: to even, up */
    assert_int_equal(gr_f32_to_f16(0x1p-24f), 0x0001);          /* smallest subnormal */
    assert_int_equal(gr_f32_to_f16(0x1p-25f), 0x0000);          /* tie with zero: even */
    assert_int_equal(gr_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(gr_f32_to_f16(__builtin_nanf("")) & 0x7e00, 0x7e00);
    for (uint32_t h = 0; h < 65536; h++) {
        float f = gr_f16_to_f32((uint16_t)h);
        if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) continue; /* NaN payloads: quietened */
        assert_int_equal(gr_f32_to_f16(f), h);
    }
    assert_true(gr_f16_to_f32(0x0001) == 0x1p-24f);

    /* Sync modes: wire values and names. */
    assert_int_equal(GR_SYNC_ASYNC, 0);
    assert_int_equal(GR_SYNC_SSP, 3);
    assert_string_equal(gr_sync_mode_name(GR_SYNC_SEMISYNC), "semisync");
    assert_string_equal(gr_sync_mode_name(4), "unknown");
    gr_sync_mode m = GR_SYNC_ASYNC;
    assert_int_equal(gr_sync_mode_parse("ssp", &m), GR_OK);
    assert_int_equal(m, GR_SYNC_SSP);
    assert_int_equal(gr_sync_mode_parse("bsp", &m), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "'bsp'"));
    assert_int_equal(GR_READONLY, 1);
}

static void test_rng_deterministic(void **state)
{
    (void)state;
    gr_rng a, b;
    gr_rng_seed(&a, 42);
    gr_rng_seed(&b, 42);
    for (int i = 0; i < 100; i++) assert_true(gr_rng_next(&a) == gr_rng_next(&b));
    double sum = 0, sq = 0;
    for (int i = 0; i < 100000; i++) {
        double x = gr_rng_normal(&a);
        sum += x;
        sq += x * x;
    }
    assert_true(sum / 100000 < 0.02 && sum / 100000 > -0.02);
    assert_true(sq / 100000 > 0.97 && sq / 100000 < 1.03);
}

/* Ids that two trainers must never share: nonzero and different call to call. */
static void test_random_id(void **state)
{
    (void)state;
    uint64_t seen[64];
    for (int i = 0; i < 64; i++) {
        seen[i] = gr_random_id();
        assert_true(seen[i] != 0);
        for (int j = 0; j < i; j++) assert_true(seen[i] != seen[j]);
    }
}

static void test_zipf(void **state)
{
    (void)state;
    gr_zipf z;
    assert_int_equal(gr_zipf_init(&z, 0, 1.0), GR_EINVAL);
    assert_int_equal(gr_zipf_init(&z, 1000, 1.05), GR_OK);
    gr_rng r;
    gr_rng_seed(&r, 1);
    unsigned c1 = 0, c2 = 0, n = 200000;
    for (unsigned i = 0; i < n; i++) {
        uint64_t k = gr_zipf_draw(&z, &r);
        assert_true(k >= 1 && k <= 1000);
        c1 += k == 1;
        c2 += k == 2;
    }
    /* P(1)/P(2) = 2^1.05 ~ 2.07 */
    double ratio = (double)c1 / c2;
    assert_true(ratio > 1.9 && ratio < 2.25);
}

static void test_dedup(void **state)
{
    (void)state;
    uint64_t keys[] = {5, 7, 5, 9, 7, 7, 0, UINT64_MAX, 0};
    size_t n = sizeof keys / sizeof keys[0];
    uint64_t uniq[9];
    uint32_t inv[9];
    long nu = gr_dedup(keys, n, uniq, inv, NULL);
    assert_int_equal(nu, 5);
    uint64_t want[] = {5, 7, 9, 0, UINT64_MAX};
    for (int i = 0; i < 5; i++) assert_true(uniq[i] == want[i]);
    for (size_t i = 0; i < n; i++) assert_true(uniq[inv[i]] == keys[i]);
    /* Large random input with a reused scratch. */
    gr_dedup_scratch sc = {0};
    size_t m = 100000;
    uint64_t *k2 = malloc(m * 8), *u2 = malloc(m * 8);
    uint32_t *i2 = malloc(m * 4);
    gr_rng r;
    gr_rng_seed(&r, 3);
    for (size_t i = 0; i < m; i++) k2[i] = gr_rng_next(&r) % 5000;
    for (int rep = 0; rep < 2; rep++) {
        nu = gr_dedup(k2, m, u2, i2, &sc);
        assert_int_equal(nu, 5000);
        for (size_t i = 0; i < m; i++) assert_true(u2[i2[i]] == k2[i]);
    }
    gr_dedup_scratch_fini(&sc);
    free(k2);
    free(u2);
    free(i2);
}

static void test_files(void **state)
{
    (void)state;
    char dir[] = "/tmp/gr_core_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/f.txt", dir);
    assert_int_equal(gr_write_file_atomic(path, "hello", 5), GR_OK);
    char *buf;
    size_t len;
    assert_int_equal(gr_read_file(path, &buf, &len), GR_OK);
    assert_int_equal(len, 5);
    assert_string_equal(buf, "hello");
    free(buf);
    unlink(path);
    assert_int_equal(gr_read_file(path, &buf, &len), GR_ENOENT);
    assert_non_null(strstr(gr_errmsg(), "f.txt"));
    /* A FIFO (a config or secret file an attacker replaced) fails at once instead of blocking
     * the reader forever; so does a directory. */
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_int_equal(gr_read_file(path, &buf, &len), GR_EINVAL);
    assert_non_null(strstr(gr_errmsg(), "not a regular file"));
    unlink(path);
    assert_int_equal(gr_read_file(dir, &buf, &len), GR_EINVAL);
    /* A sparse file past the limit is refused by its size, before any memory is taken. */
    int fd = open(path, O_CREAT | O_WRONLY, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)GR_READ_FILE_MAX + 1), 0);
    close(fd);
    assert_int_equal(gr_read_file(path, &buf, &len), GR_ETOOBIG);
    unlink(path);
    rmdir(dir);
}

static void test_sizes(void **state)
{
    (void)state;
    uint64_t v;
    assert_int_equal(gr_parse_size("64", &v), GR_OK);
    assert_true(v == 64);
    assert_int_equal(gr_parse_size("4k", &v), GR_OK);
    assert_true(v == 4096);
    assert_int_equal(gr_parse_size("2GB", &v), GR_OK);
    assert_true(v == 2ull << 30);
    assert_int_equal(gr_parse_size("2X", &v), GR_EINVAL);
    assert_int_equal(gr_parse_size("", &v), GR_EINVAL);
    assert_int_equal(gr_parse_size("99999999999999999999T", &v), GR_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),   cmocka_unit_test(test_slots_fixed),
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_rng_deterministic), cmocka_unit_test(test_zipf),
        cmocka_unit_test(test_random_id),
        cmocka_unit_test(test_dedup),    cmocka_unit_test(test_files),
        cmocka_unit_test(test_sizes),
    };
    return cmocka_run_group_tests_name("core", tests, NULL, NULL);
}
