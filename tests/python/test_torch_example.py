#!/usr/bin/python3
"""examples/torch_dlrm.py as `granary bench torch` runs it: --preload (the file parsed into
tensors before the timed loop, as plain PyTorch's side does) must train exactly what reading
batch by batch inside the loop trains, and two DDP worker processes (no per-step buffer
broadcast, gradients as bucket views) must train every example to a useful model."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import grtest


class ExampleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="test_torch_example")
        subprocess.run([grtest.GRANARY_BIN, "datagen", "--out", cls.tmp, "--train-rows", "6000",
                        "--test-rows", "2000", "--seed", "3"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_example(self, *extra):
        r = subprocess.run([sys.executable, os.path.join(grtest.REPO, "examples", "torch_dlrm.py"),
                            "--train", os.path.join(self.tmp, "train.tsv"),
                            "--test", os.path.join(self.tmp, "test.tsv"), "--batch", "256",
                            "--shards", "2", "--threads", "1", "--json"] + list(extra),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300,
                           env=dict(os.environ, GR_BUILD_DIR=grtest.BUILD, GRANARY_LOG="warn"))
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        return json.loads(r.stdout.strip().splitlines()[-1])

    def test_preload_trains_the_same(self):
        # One worker, async with the staleness bound 0: the steps see exactly the rows a
        # sequential loop sees, so both runs are deterministic and must agree to the bit.
        streamed = self.run_example("--workers", "1")
        preloaded = self.run_example("--workers", "1", "--preload")
        self.assertFalse(streamed["preload"])
        self.assertTrue(preloaded["preload"])
        self.assertEqual(preloaded["examples"], 6000)
        self.assertEqual(streamed["examples"], 6000)
        self.assertEqual(preloaded["auc"], streamed["auc"])
        self.assertEqual(preloaded["logloss"], streamed["logloss"])
        self.assertGreater(preloaded["auc"], 0.6)

    def test_unix_transport_trains_the_same(self):
        # The workers reach the embedded shards over AF_UNIX by default (--transport unix):
        # the same protocol, so one deterministic worker trains bit for bit what it does over
        # loopback TCP.
        unix = self.run_example("--workers", "1", "--preload")
        tcp = self.run_example("--workers", "1", "--preload", "--transport", "tcp")
        self.assertEqual(unix["transport"], "unix")
        self.assertEqual(tcp["transport"], "tcp")
        self.assertEqual(unix["examples"], 6000)
        self.assertEqual(unix["auc"], tcp["auc"])
        self.assertEqual(unix["logloss"], tcp["logloss"])

    def test_two_ddp_workers_preloaded(self):
        res = self.run_example("--workers", "2", "--preload")
        self.assertEqual(res["workers"], 2)
        self.assertEqual(res["transport"], "unix")
        self.assertEqual(res["examples"], 6000)
        self.assertEqual(len(res["worker_cpu_seconds"]), 2)
        self.assertGreater(res["shards_cpu_seconds"], 0.0)
        self.assertGreater(res["auc"], 0.6)


if __name__ == "__main__":
    grtest.main()
