#!/usr/bin/python3
"""Client(coord="zk://...") against a coordinated job started by the test: Debian's ZooKeeper on
a free loopback port, two `granary server --coord` shards and a standby. The client finds the
shards through the layout and stamps its epoch; after a shard is killed and the standby takes
its index over (epoch + 1, a new address, rows restored from the job's checkpoint), a request
to the surviving shard is refused as stale and sent again under the new epoch by the stale
hook, a request to the lost shard fails with a GranaryError, and refresh() follows the layout
so every row reads back as checkpointed. Also: examples/torch_dlrm.py --coord trains against
such a job; the errors of coord= and refresh()."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import grtest

import numpy as np

SKIP = None if grtest.zk_available() else "ZooKeeper (java and %s) is not installed" % grtest.ZK_JAR


def wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError("timed out after %d s waiting for %s" % (timeout, what))


@unittest.skipIf(SKIP, SKIP)
class CoordTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gr_py_coord")
        cls.zk = grtest.ZooKeeper(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        cls.zk.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def start_job(self, name, standby):
        url = self.zk.url("/jobs/" + name)
        args = ["--shards", "2", "--threads", "1", "--session-timeout", "2000", "--ckpt-root",
                self.tmp, "--ckpt-dir", "ck-" + name]
        procs = [grtest.CoordServer(url, args, self.tmp) for _ in range(2)]
        if standby:
            procs.append(grtest.CoordServer(url, args + ["--standby"], self.tmp))
        for p in procs:
            self.addCleanup(p.kill)
        return url, procs

    def test_finds_shards_and_follows_a_takeover(self):
        import granary as g
        url, (s0, s1, standby) = self.start_job("takeover", standby=True)
        # A short connect timeout: each pull of a lost key below waits that long.
        c = g.Client(coord=url, connect_timeout_ms=300, request_timeout_ms=10000)
        self.addCleanup(c.close)
        st = grtest.cluster_status(url)
        self.assertEqual(c.shards, 2)
        self.assertEqual(c.epoch, st["epoch"])
        self.assertEqual([c.shard_addr(i) for i in range(2)],
                         [sh["address"] for sh in st["shards"]])
        self.assertEqual(sorted(c.shard_addr(i) for i in range(2)),
                         sorted([s0.address, s1.address]))
        c.create_table({"name": "t", "id": 5, "dim": 4, "init": {"kind": "zeros"},
                        "optimizer": {"kind": "sgd", "lr": 1.0}})
        keys = np.arange(1, 65, dtype=np.uint64)
        grads = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
        c.push(5, 4, keys, grads)
        want = -grads
        np.testing.assert_array_equal(c.pull(5, 4, keys), want)
        c.ckpt_save("ck-takeover", 1)

        lost = 1 if c.shard_addr(1) == s1.address else 0
        victim = s1 if lost == 1 else s0
        epoch0 = c.epoch
        victim.kill()
        st = wait_for(lambda: (lambda s: s if s["epoch"] > epoch0 and
                               s["shards"][lost]["address"] == standby.address else None)(
                                   grtest.cluster_status(url)), 30, "the standby's takeover")
        # The survivor refuses the old epoch; the stale hook re-reads the layout and sends the
        # request again. The lost shard's keys fail (its process is gone).
        ok, failed = [], []
        for i, k in enumerate(keys[:16]):
            try:
                row = c.pull(5, 4, [int(k)])
                np.testing.assert_array_equal(row[0], want[i])
                ok.append(i)
            except g.GranaryError as e:
                self.assertIn(e.name, ("GR_ECONN", "GR_ESTALE", "GR_ETIMEDOUT"), str(e))
                failed.append(i)
        self.assertTrue(ok and failed, "ok %d, failed %d" % (len(ok), len(failed)))
        self.assertEqual(c.epoch, st["epoch"])
        self.assertEqual(c.refresh(), 1)  # one shard moved
        self.assertEqual(c.shard_addr(lost), standby.address)
        self.assertEqual(c.epoch, st["epoch"])
        # Every row as checkpointed, the lost shard's from the standby's restore.
        np.testing.assert_array_equal(c.pull(5, 4, keys), want)
        c.push(5, 4, keys, np.ones((64, 4), np.float32))
        np.testing.assert_array_equal(c.pull(5, 4, keys), want - 1)
        self.assertEqual(c.refresh(), 0)

    def test_errors(self):
        import granary as g
        with self.assertRaises(ValueError):
            g.Client(servers="127.0.0.1:1", coord="zk://127.0.0.1:1/x")
        port = grtest.free_port()  # nothing listens there
        with self.assertRaises(g.GranaryError) as e:
            g.Client(coord="zk://127.0.0.1:%d/x" % port, connect_timeout_ms=300)
        self.assertIn("no ZooKeeper server answered", str(e.exception))
        with self.assertRaises(g.GranaryError) as e:
            g.Client(coord="zk://nopath", connect_timeout_ms=300)
        # A job whose shards never came: no served layout within the timeout, said so (the
        # timeout also bounds the ZooKeeper session's start, slow on a loaded machine).
        with self.assertRaises(g.GranaryError) as e:
            g.Client(coord=self.zk.url("/jobs/empty"), connect_timeout_ms=4000)
        self.assertEqual(e.exception.name, "GR_ETIMEDOUT")
        self.assertIn("no served layout", str(e.exception))
        cluster = g.LocalCluster(1)
        try:
            c = g.Client(servers=cluster.servers)
            with self.assertRaises(ValueError):
                c.refresh()  # not made with coord=
            self.assertEqual(c.epoch, 0)
            c.close()
        finally:
            cluster.stop()
        url, _ = self.start_job("errors", standby=False)
        c = g.Client(coord=url)
        c.create_table({"name": "u", "id": 6, "dim": 2})
        out = np.empty((3, 2), np.float32)
        op = c.pull_start(6, 2, [1, 2, 3], out)
        with self.assertRaises(RuntimeError):
            c.refresh()  # something in flight
        op.wait()
        self.assertEqual(c.refresh(), 0)
        c.close()

    def test_example_trains_with_coord(self):
        import granary as g
        url, _ = self.start_job("example", standby=False)
        data = os.path.join(self.tmp, "data")
        g.datagen(data, 4096, 1024)
        r = subprocess.run([sys.executable, os.path.join(grtest.REPO, "examples", "torch_dlrm.py"),
                            "--train", os.path.join(data, "train.tsv"), "--test",
                            os.path.join(data, "test.tsv"), "--coord", url, "--batch", "256",
                            "--max-steps", "8", "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300,
                           env=dict(os.environ, GR_BUILD_DIR=grtest.BUILD))
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        res = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual(res["examples"], 8 * 256)
        self.assertGreater(res["auc"], 0.5)
        c = g.Client(coord=url)
        self.assertGreater(c.describe_table("embeddings")["rows"], 1000)
        c.close()


if __name__ == "__main__":
    grtest.main()
