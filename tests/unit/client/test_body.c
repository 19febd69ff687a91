/* cl_body: a streamed reply body received into the scratch buffer as much at a time as it
 * holds, taken in pieces. Over a socketpair: pieces that straddle what one receive brought
 * (the rest moves to the front), never a byte past the body's end (the next frame stays in
 * the socket), and the failures: past the end, a hang-up mid-body, a stall past the deadline. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client/conn.h"

static void pair(int sv[2]) { assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0); }

static cl_body body_of(int fd, size_t len, uint8_t *scratch, size_t cap, uint64_t wait_ms)
{
    cl_body b = {fd, len, gr_now_ns() + wait_ms * 1000000u, scratch, cap, 0, 0, 0, false};
    return b;
}

static void test_pieces_across_receives(void **state)
{
    (void)state;
    int sv[2];
    pair(sv);
    uint8_t data[1000], next[4] = {9, 9, 9, 9};
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 7 + 1);
    assert_int_equal(write(sv[1], data, sizeof data), (ssize_t)sizeof data);
    assert_int_equal(write(sv[1], next, sizeof next), 4); /* the next frame */
    uint8_t scratch[64];
    cl_body b = body_of(sv[0], sizeof data, scratch, sizeof scratch, 1000);
    /* Pieces of 24 and 40 bytes through a 64-byte buffer: most straddle two receives. */
    size_t off = 0;
    for (int k = 0; off < sizeof data; k++) {
        size_t n = k % 2 ? 40 : 24;
        if (n > sizeof data - off) n = sizeof data - off;
        assert_int_equal(cl_body_fill(&b, n), GR_OK);
        assert_true(cl_body_avail(&b) >= n);
        assert_memory_equal(cl_body_take(&b, n), data + off, n);
        off += n;
    }
    assert_int_equal(b.left, 0);
    assert_int_equal(cl_body_avail(&b), 0);
    /* Nothing past the body was consumed. */
    uint8_t got[4];
    assert_int_equal(read(sv[0], got, 4), 4);
    assert_memory_equal(got, next, 4);
    /* Asking for more than the body holds fails the stream. */
    assert_int_equal(cl_body_fill(&b, 1), GR_EPROTO);
    assert_true(b.failed);
    assert_int_equal(cl_body_fill(&b, 1), GR_ECONN);
    close(sv[0]);
    close(sv[1]);
}

static void test_hangup_mid_body(void **state)
{
    (void)state;
    int sv[2];
    pair(sv);
    uint8_t data[100] = {1};
    assert_int_equal(write(sv[1], data, sizeof data), (ssize_t)sizeof data);
    close(sv[1]);
    uint8_t scratch[256];
    cl_body b = body_of(sv[0], 200, scratch, sizeof scratch, 1000);
    assert_int_equal(cl_body_fill(&b, 50), GR_OK); /* what arrived is usable */
    assert_int_equal(cl_body_avail(&b), 100);
    cl_body_take(&b, 100);
    assert_int_equal(cl_body_fill(&b, 8), GR_ECONN);
    assert_non_null(strstr(gr_errmsg(), "closed in the middle of a reply"));
    close(sv[0]);
}

static void test_stall_past_deadline(void **state)
{
    (void)state;
    int sv[2];
    pair(sv);
    uint8_t data[10] = {0};
    assert_int_equal(write(sv[1], data, sizeof data), (ssize_t)sizeof data);
    uint8_t scratch[64];
    cl_body b = body_of(sv[0], 40, scratch, sizeof scratch, 50);
    uint64_t t0 = gr_now_ns();
    assert_int_equal(cl_body_fill(&b, 16), GR_ETIMEDOUT);
    assert_true(gr_now_ns() - t0 >= 40u * 1000000u);
    assert_true(b.failed);
    close(sv[0]);
    close(sv[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_across_receives),
        cmocka_unit_test(test_hangup_mid_body),
        cmocka_unit_test(test_stall_past_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
