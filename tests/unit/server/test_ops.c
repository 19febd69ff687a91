/* Unit tests for the server's table of operations (src/server/ops.c): every opcode the
 * protocol declares has exactly one row, each row has exactly one kind of handler and one
 * that fits where it runs, and the header flag bits and pre-authentication rights are the
 * protocol's. A new opcode without its row fails here, not on a live shard. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "server/server_int.h"

static void test_every_opcode_has_a_row(void **state)
{
    (void)state;
    unsigned known = 0;
    for (unsigned op = 0; op < GR_PROTO_OP_LIMIT; op++) {
        const srv_op_row *row = srv_op_row_of(op);
        if (!gr_proto_op_name(op)) {
            assert_null(row);
            continue;
        }
        known++;
        assert_non_null(row);
        /* One handler: built replies (handle) or answered by the callee (take). */
        assert_true((row->handle != NULL) != (row->take != NULL));
        if (row->where == SRV_RUN_POOL) assert_non_null(row->handle);
        if (row->where == SRV_RUN_PARKED || row->where == SRV_RUN_CKPT) assert_non_null(row->take);
        if (row->inline_body) assert_int_equal(row->where, SRV_RUN_POOL);
    }
    assert_true(known >= 23);
    assert_null(srv_op_row_of(GR_PROTO_OP_LIMIT));
    assert_null(srv_op_row_of(63));
}

static void test_where_flags_and_auth(void **state)
{
    (void)state;
    assert_int_equal(srv_op_row_of(GR_OP_HELLO)->where, SRV_RUN_LOOP);
    assert_int_equal(srv_op_row_of(GR_OP_STATS)->where, SRV_RUN_LOOP);
    assert_int_equal(srv_op_row_of(GR_OP_PUSH)->where, SRV_RUN_POOL);
    assert_int_equal(srv_op_row_of(GR_OP_SYNC_ACQUIRE)->where, SRV_RUN_PARKED);
    assert_int_equal(srv_op_row_of(GR_OP_CKPT_SAVE)->where, SRV_RUN_CKPT);
    /* Only a pull may carry READONLY; every other flag bit of every opcode must be 0. */
    for (unsigned op = 1; op < GR_PROTO_OP_LIMIT; op++) {
        const srv_op_row *row = srv_op_row_of(op);
        if (!row) continue;
        assert_int_equal(row->flags, op == GR_OP_PULL ? GR_PROTO_F_READONLY : 0);
        /* Only the handshake is allowed before authentication. */
        assert_int_equal(row->preauth, op == GR_OP_HELLO || op == GR_OP_AUTH);
    }
    /* Small pulls skip the hop to the pool; nothing else does. */
    assert_true(srv_op_row_of(GR_OP_PULL)->inline_body > 0);
    assert_int_equal(srv_op_row_of(GR_OP_PUSH)->inline_body, 0);
}

/* A fenced shard still answers the handshake, stats and shutdown; only pulls, descriptions and
 * the replicas' subscriptions pass a write fence; everything else changes state and is stopped
 * by any fence. */
static void test_fence_classes(void **state)
{
    (void)state;
    for (unsigned op = 1; op < GR_PROTO_OP_LIMIT; op++) {
        const srv_op_row *row = srv_op_row_of(op);
        if (!row) continue;
        srv_fence_class want = SRV_FENCE_WRITE;
        if (op == GR_OP_HELLO || op == GR_OP_AUTH || op == GR_OP_STATS || op == GR_OP_SHUTDOWN)
            want = SRV_FENCE_NEVER;
        else if (op == GR_OP_PULL || op == GR_OP_DENSE_PULL || op == GR_OP_DESCRIBE_TABLE ||
                 op == GR_OP_SUBSCRIBE)
            want = SRV_FENCE_READ;
        assert_int_equal(row->fence, want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_opcode_has_a_row),
        cmocka_unit_test(test_fence_classes),
        cmocka_unit_test(test_where_flags_and_auth),
    };
    return cmocka_run_group_tests_name("server_ops", tests, NULL, NULL);
}
