#!/usr/bin/python3
"""The PyTorch path computes what `granary train` computes: DLRM on generated data, 1 worker,
200 steps, the same batches (granary's Criteo reader), the same initial weights (embedding rows
from the table's deterministic initializer; dense weights from the C initializer through the
extension), the same optimizers (Adagrad on the shards for the rows, SGD for the dense layers:
torch.optim.SGD on one side, the shard's SGD on the other). `granary train --loss-log` gives
the C trainer's per-step losses.

Per-step losses must agree within 1e-4 (relative) at every step and every row the batches
touched within 1e-4 at the end (measured: 4e-8 and 9e-8). Why SGD for the dense layers and
embedding lr 0.01: the two sides' float32 arithmetic differs in summation order (~1e-8
relative); with Adam's sign-like first steps, or Adagrad at lr 0.05, such differences grow to
1e-3 within 200 steps even between two PyTorch runs whose initial weights differ by 1e-7
(measured), so no implementation could hold the 1e-4 bound there (docs/python.md,
"Consistency with granary train")."""
import os
import shutil
import subprocess
import tempfile
import unittest

import grtest

import numpy as np

STEPS, BATCH, EMB_LR, DENSE_LR = 200, 256, 0.01, 0.1


class ConsistencyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import granary
        cls.g = granary
        cls.dir = tempfile.mkdtemp(prefix="gr_pyconsist")
        granary.datagen(cls.dir, STEPS * BATCH + 1000, 1000, seed=5)
        cls.train = os.path.join(cls.dir, "train.tsv")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def c_trainer(self, servers, mode):
        log = os.path.join(self.dir, "loss-%s.log" % mode)
        cmd = [grtest.GRANARY_BIN, "train", "--servers", servers, "--train", self.train,
               "--workers", "1", "--mode", mode, "--batch", str(BATCH), "--max-steps",
               str(STEPS), "--lr", str(EMB_LR), "--dense-optimizer", "sgd", "--dense-lr",
               str(DENSE_LR), "--seed", "3", "--progress", "0", "--loss-log", log]
        if mode == "async":
            cmd.append("--no-pipeline")  # the pipeline prefetches rows one step stale
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=300)
        lines = [l.split() for l in open(log)]
        self.assertEqual([int(l[1]) for l in lines], list(range(1, STEPS + 1)))
        return np.array([float(l[2]) for l in lines])

    def torch_path(self, client, spec, mode, pipeline):
        import torch
        from granary import dlrm
        ec = dlrm.embedding_collection(client, dim=16, seed=3, mode=mode, spec=spec)
        model = dlrm.DenseDLRM(dim=16, seed=3)
        opt = torch.optim.SGD(model.parameters(), lr=DENSE_LR)
        losses, examples, _ = dlrm.train(
            ec, model, opt, dlrm.criteo_batches(self.train, BATCH, max_batches=STEPS),
            pipeline=pipeline)
        self.assertEqual(examples, STEPS * BATCH)
        return np.array(losses)

    def compare(self, mode, pipeline):
        import torch
        from granary import dlrm
        a, b = self.g.LocalCluster(2), self.g.LocalCluster(2)
        try:
            closs = self.c_trainer(a.servers, mode)
            ca, cb = self.g.Client(servers=a.servers), self.g.Client(servers=b.servers)
            spec = ca.describe_table("embeddings")["spec"]
            self.assertAlmostEqual(spec["optimizer"]["lr"], EMB_LR)
            ploss = self.torch_path(cb, spec, mode, pipeline)
            self.assertEqual(len(ploss), STEPS)
            rel = np.abs(ploss - closs) / np.abs(closs)
            print("%s: per-step loss max relative difference %.3g (step %d); losses %.4f -> %.4f"
                  % (mode, rel.max(), rel.argmax() + 1, closs[0], closs[-1]))
            self.assertLess(rel.max(), 1e-4, "step %d: torch %.7f, granary train %.7f"
                            % (rel.argmax() + 1, ploss[rel.argmax()], closs[rel.argmax()]))
            self.assertLess(closs[-20:].mean(), closs[:5].mean() - 0.1)  # it learned
            # Every row the 200 batches touched, on both clusters.
            keys = np.unique(np.concatenate([
                torch.stack([f[k] for k in dlrm.FEATURES]).reshape(-1).numpy()
                for f, _ in dlrm.criteo_batches(self.train, BATCH, max_batches=STEPS)]))
            ra = ca.pull(1, 16, keys, readonly=True)
            rb = cb.pull(1, 16, keys, readonly=True)
            diff = np.abs(ra - rb).max(axis=1)
            off = int((diff > 1e-4).sum())
            print("%s: %d rows, %d differ by more than 1e-4 (max %.3g)"
                  % (mode, len(keys), off, diff.max()))
            self.assertGreater(len(keys), 10000)
            self.assertEqual(off, 0)
            ca.close()
            cb.close()
        finally:
            a.stop()
            b.stop()

    def test_async_sequential(self):
        self.compare("async", pipeline=False)

    def test_sync_pipelined(self):
        self.compare("sync", pipeline=True)


if __name__ == "__main__":
    grtest.main()
