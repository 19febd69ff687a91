#!/usr/bin/python3
"""Round trips through granary's Python extension against an embedded cluster: pull and push
of every storage dtype and a range of dims, duplicates summed, async ops, dense parameters,
sync steps, checkpoints, stats, and bad arguments raising clear errors."""
import json
import os
import shutil
import tempfile
import unittest

import grtest

import numpy as np


def sgd_spec(name, tid, dim, dtype="f32", lr=1.0, init="zeros"):
    return {"name": name, "id": tid, "dim": dim, "dtype": dtype, "init": {"kind": init},
            "optimizer": {"kind": "sgd", "lr": lr}}


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import granary
        cls.g = granary
        cls.cluster = granary.LocalCluster(2)
        cls.c = granary.Client(servers=cls.cluster.servers)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.cluster.stop()

    def test_round_trip_every_dtype_and_dim(self):
        rng = np.random.default_rng(7)
        tid = 10
        for dtype in ("f32", "f16"):
            for dim in (1, 3, 16, 64, 257, 1024):
                tid += 1
                self.c.create_table(sgd_spec("rt_%s_%d" % (dtype, dim), tid, dim, dtype))
                keys = rng.integers(0, 2**63, size=300, dtype=np.int64).astype(np.uint64)
                keys[5] = 2**64 - 1  # the whole uint64 range is a key
                # Halves of f16-representable values so both dtypes read back exactly.
                grads = (rng.integers(-64, 64, size=(300, dim)) / 2.0).astype(np.float32)
                self.c.push(tid, dim, keys, grads)
                rows = self.c.pull(tid, dim, keys)
                np.testing.assert_array_equal(rows, -grads, err_msg="%s dim %d" % (dtype, dim))
                # The same through int64 keys and a preallocated output.
                out = np.zeros(300 * dim, dtype=np.float32)
                self.c.pull(tid, dim, keys.view(np.int64), out)
                np.testing.assert_array_equal(out.reshape(300, dim), -grads)

    def test_local_servers_reach_the_same_shards(self):
        # LocalCluster.local_servers: the same shards over AF_UNIX (what examples/torch_dlrm.py's
        # workers use by default): a push over TCP reads back over AF_UNIX and the other way.
        servers = self.cluster.local_servers
        self.assertEqual([s.split("@")[0] for s in servers.split(",")], ["unix:", "unix:"])
        self.assertEqual(len(set(servers.split(","))), 2)
        u = self.g.Client(servers=servers)
        try:
            self.assertEqual(u.shards, 2)
            self.c.create_table(sgd_spec("unix_rt", 95, 8))
            keys = np.arange(1, 201, dtype=np.uint64) * np.uint64(7919)
            g = (np.arange(200 * 8, dtype=np.float32).reshape(200, 8) / 4.0)
            self.c.push(95, 8, keys, g)
            np.testing.assert_array_equal(u.pull(95, 8, keys), -g)
            u.push(95, 8, keys[:100], g[:100])
            rows = self.c.pull(95, 8, keys)
            np.testing.assert_array_equal(rows[:100], -2 * g[:100])
            np.testing.assert_array_equal(rows[100:], -g[100:])
        finally:
            u.close()
        stopped = self.g.LocalCluster(1)
        stopped.stop()
        with self.assertRaisesRegex(ValueError, "stopped"):
            stopped.local_servers

    def test_duplicates_summed_and_unique_flag(self):
        self.c.create_table(sgd_spec("dups", 40, 4))
        keys = np.array([1, 2, 1, 1], dtype=np.uint64)
        g = np.arange(16, dtype=np.float32).reshape(4, 4)
        self.c.push(40, 4, keys, g)
        rows = self.c.pull(40, 4, np.array([1, 2], dtype=np.uint64))
        np.testing.assert_array_equal(rows[0], -(g[0] + g[2] + g[3]))
        np.testing.assert_array_equal(rows[1], -g[1])
        # unique=True: the caller promises unique keys; rows come back one per key.
        self.c.push(40, 4, np.array([3], dtype=np.uint64), np.ones(4, np.float32), unique=True)
        np.testing.assert_array_equal(self.c.pull(40, 4, [3], unique=True), -np.ones((1, 4)))

    def test_async_ops_and_many_tables(self):
        self.c.create_table(sgd_spec("m1", 41, 2))
        self.c.create_table(sgd_spec("m2", 42, 3))
        k1, k2 = np.arange(100, dtype=np.uint64), np.arange(50, dtype=np.uint64) + 7
        op = self.c.push_many_start([(41, 2, k1, np.full(200, 2.0, np.float32)),
                                     (42, 3, k2, np.full(150, 3.0, np.float32))])
        self.assertTrue(op.wait())
        self.assertTrue(op.done)
        r1, r2 = np.empty(200, np.float32), np.empty(150, np.float32)
        op = self.c.pull_many_start([(41, 2, k1, r1), (42, 3, k2, r2)])
        del r1  # the op holds the buffer it writes into until it finishes
        self.assertTrue(op.wait(timeout_ms=-1))
        np.testing.assert_array_equal(r2, np.full(150, -3.0, np.float32))
        r1 = np.empty(200, np.float32)
        self.c.pull_many([(41, 2, k1, r1)])
        np.testing.assert_array_equal(r1, np.full(200, -2.0, np.float32))
        # An op dropped without wait() is finished by its destructor.
        self.c.pull_start(41, 2, k1, np.empty(200, np.float32))

    def test_readonly_pull_creates_nothing(self):
        self.c.create_table(sgd_spec("ro", 43, 2, init="uniform"))
        before = self.c.describe_table("ro")["rows"]
        self.c.pull(43, 2, np.arange(10, dtype=np.uint64), readonly=True)
        self.assertEqual(self.c.describe_table("ro")["rows"], before)
        self.c.pull(43, 2, np.arange(10, dtype=np.uint64))
        self.assertEqual(self.c.describe_table("ro")["rows"], before + 10)

    def test_dense_parameters(self):
        self.c.dense_create({"name": "w", "size": 1000, "optimizer": {"kind": "sgd", "lr": 0.5}})
        vals = np.arange(1000, dtype=np.float32)
        self.c.dense_set("w", vals)
        self.c.dense_push("w", np.full(1000, 2.0, np.float32))
        out = self.c.dense_pull("w", np.empty(1000, np.float32))
        np.testing.assert_array_equal(out, vals - 1.0)
        with self.assertRaises(self.g.GranaryError):
            self.c.dense_pull("w", np.empty(999, np.float32))
        with self.assertRaises(self.g.GranaryError) as e:
            self.c.dense_pull("nope", np.empty(3, np.float32))
        self.assertIn("nope", str(e.exception))

    def test_sync_step(self):
        self.c.create_table(sgd_spec("st", 44, 2))
        self.c.sync_configure("sync", workers=1, reset=True)
        want = np.zeros(self.c.shards, np.uint64)
        tags = np.zeros(self.c.shards, np.uint64)
        step = self.c.sync_acquire(0, want, tags)
        self.assertEqual(step, 0)
        out = self.c.push_step(0, tags, [(44, 2, np.array([5, 6], np.uint64),
                                          np.ones(4, np.float32))])
        self.assertEqual(out, [self.g.PUSH_APPLIED] * self.c.shards)
        np.testing.assert_array_equal(self.c.pull(44, 2, [5, 6]), -np.ones((2, 2)))
        self.assertEqual(self.c.sync_acquire(0, tags + np.uint64(1), tags), 1)
        self.c.push_step(0, tags, [])  # a step with nothing for any shard
        self.c.sync_leave(0)
        self.c.sync_configure("sync", clear=True)

    def test_checkpoint_round_trip(self):
        d = tempfile.mkdtemp(prefix="gr_pyckpt")
        try:
            self.c.create_table(sgd_spec("ck", 45, 3))
            keys = np.arange(20, dtype=np.uint64)
            self.c.push(45, 3, keys, np.ones(60, np.float32))
            info = self.c.ckpt_save(d, 7, meta='{"who":"test"}')
            self.assertEqual(info["step"], 7)
            self.assertGreaterEqual(info["rows"], 20)
            self.c.push(45, 3, keys, np.ones(60, np.float32))
            np.testing.assert_array_equal(self.c.pull(45, 3, keys), np.full((20, 3), -2.0))
            loaded = self.c.ckpt_load(d)
            self.assertEqual(loaded["step"], 7)
            self.assertEqual(json.loads(loaded["meta"]), {"who": "test"})
            np.testing.assert_array_equal(self.c.pull(45, 3, keys), np.full((20, 3), -1.0))
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_stats_and_describe(self):
        self.c.create_table(sgd_spec("sd", 46, 5))
        self.c.pull(46, 5, np.arange(8, dtype=np.uint64))
        d = self.c.describe_table("sd")
        self.assertEqual(d["spec"]["dim"], 5)
        self.assertEqual(d["rows"], 8)
        self.assertIsInstance(self.c.stats(0), dict)
        st = self.c.client_stats()
        self.assertGreater(st["requests"], 0)
        self.assertEqual(self.c.shard_addr(1), self.cluster.servers.split(",")[1])

    def test_dedup(self):
        keys = np.array([9, 3, 9, 9, 4, 3], dtype=np.int64)
        u, inv = np.empty(6, np.int64), np.empty(6, np.int32)
        n = self.g.dedup(keys, u, inv)
        self.assertEqual(n, 3)
        np.testing.assert_array_equal(u[:n][inv], keys)

    def test_bad_arguments_raise(self):
        g, c = self.g, self.c
        c.create_table(sgd_spec("bad", 47, 4))
        k = np.arange(3, dtype=np.uint64)
        with self.assertRaises(TypeError) as e:  # float keys
            c.pull(47, 4, np.arange(3, dtype=np.float64))
        self.assertIn("keys", str(e.exception))
        with self.assertRaises(TypeError):  # float64 rows
            c.pull(47, 4, k, np.zeros(12, np.float64))
        with self.assertRaises(ValueError) as e:  # wrong size
            c.pull(47, 4, k, np.zeros(11, np.float32))
        self.assertIn("need 12", str(e.exception))
        with self.assertRaises(TypeError):  # read-only output
            ro = np.zeros(12, np.float32)
            ro.setflags(write=False)
            c.pull(47, 4, k, ro)
        with self.assertRaises(TypeError):  # not contiguous
            c.push(47, 4, k, np.zeros((3, 8), np.float32)[:, ::2])
        with self.assertRaises(g.GranaryError) as e:  # wrong dim
            c.pull(47, 5, k)
        self.assertEqual(e.exception.name, "GR_EDIM")
        self.assertIn("dim 4", str(e.exception))
        with self.assertRaises(g.GranaryError) as e:  # no such table
            c.pull(999, 4, k)
        with self.assertRaises(g.GranaryError) as e:  # bad spec
            c.create_table({"name": "x", "id": 48, "dim": 4, "optimizer": {"kind": "nadam"}})
        self.assertEqual(e.exception.name, "GR_EINVAL")
        with self.assertRaises(g.GranaryError):  # non-finite gradient refused
            c.push(47, 4, k, np.full(12, np.nan, np.float32))
        np.testing.assert_array_equal(c.pull(47, 4, k), np.zeros((3, 4)))  # nothing applied
        with self.assertRaises(ValueError):
            c.sync_acquire(0, np.zeros(5, np.uint64), np.zeros(5, np.uint64))
        with self.assertRaises(TypeError):
            c.push_many([(47, 4, k)])
        with self.assertRaises(IndexError):
            c.shard_addr(9)
        with self.assertRaises(ValueError):
            g.Client()
        with self.assertRaises(ValueError):  # one of servers=, cluster_file=, coord=
            g.Client(servers=self.cluster.servers, coord="zk://127.0.0.1:2181/granary")
        with self.assertRaises(g.GranaryError) as e:  # nobody listens there
            g.Client(servers="127.0.0.1:1", connect_timeout_ms=200)
        with self.assertRaises(g.GranaryError):
            g.CriteoReader("/nonexistent/train.tsv", 16)
        # The client still serves after all that.
        np.testing.assert_array_equal(c.pull(47, 4, k), np.zeros((3, 4)))

    def test_no_buffer_or_reference_leaks(self):
        """Every call releases the buffers it took, on success and on every error path (ASan
        runs with detect_leaks=0 for the interpreter, so this is the leak check for the
        extension's Python side)."""
        import sys
        self.c.create_table(sgd_spec("lk", 50, 4))
        keys = np.arange(64, dtype=np.uint64)
        rows = np.empty(256, np.float32)
        grads = np.ones(256, np.float32)
        small = np.empty(255, np.float32)
        arrays = (keys, rows, grads, small)
        before = [sys.getrefcount(a) for a in arrays]
        for _ in range(200):
            self.c.pull(50, 4, keys, rows)
            self.c.push(50, 4, keys, grads)
            self.c.pull_start(50, 4, keys, rows).wait()
            self.c.push_start(50, 4, keys, grads).wait()
            self.c.pull_many([(50, 4, keys, rows)])
            self.c.pull_many_start([(50, 4, keys, rows)]).wait()
            for bad in (lambda: self.c.pull(50, 4, keys, small),
                        lambda: self.c.pull(50, 5, keys, np.empty(320, np.float32)),
                        lambda: self.c.push_many([(50, 4, keys, grads), (50, 4, keys, small)]),
                        lambda: self.c.pull_many([(50, 4, keys, rows), (999, 4, keys, rows)])):
                with self.assertRaises((ValueError, self.g.GranaryError)):
                    bad()
        self.assertEqual([sys.getrefcount(a) for a in arrays], before)
        # A buffer export left behind would keep an array from being resized.
        fresh = np.empty(256, np.float32)
        self.c.pull_many_start([(50, 4, keys, fresh)]).wait()
        with self.assertRaises(ValueError):
            self.c.pull_many([(50, 4, keys, fresh), (50, 4, keys, small)])
        fresh.resize(512, refcheck=True)

    def test_closed_client_raises(self):
        self.c.create_table(sgd_spec("cl", 49, 2))
        c2 = self.g.Client(servers=self.cluster.servers)
        out = np.empty(6, np.float32)
        op = c2.pull_start(49, 2, np.arange(3, dtype=np.uint64), out)
        c2.close()  # an op is in flight: the connections close once it is done
        self.assertTrue(op.wait())
        np.testing.assert_array_equal(out, np.zeros(6))
        with self.assertRaises(ValueError):
            c2.pull(49, 2, [1])
        c2.close()  # twice is fine


if __name__ == "__main__":
    grtest.main()
