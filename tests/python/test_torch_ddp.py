#!/usr/bin/python3
"""Multi-process training (sync, ssp with staleness 2, async): 2 worker processes, dense DLRM layers under
DistributedDataParallel over gloo, embeddings on a 2-shard granary cluster started by this
test, each worker reading its own half of a generated data set. In sync mode the shards
average both workers' row gradients per step and DDP averages the dense ones, so both
workers end with bitwise equal dense weights; in async mode rows are pushed as they come.
Both runs must learn (the loss drops) and create exactly the rows of both workers' batches."""
import os
import shutil
import socket
import tempfile
import unittest

import grtest

import numpy as np

WORKERS, BATCH, STEPS = 2, 256, 40


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, servers, port, path, offsets, mode, outdir):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import granary
    from granary import dlrm
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=WORKERS)
    client = granary.Client(servers=servers)
    ec = dlrm.embedding_collection(client, mode=mode, worker=rank, workers=WORKERS,
                                   aggregate=WORKERS, staleness=2 if mode == "ssp" else 0)
    model = DDP(dlrm.DenseDLRM())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = dlrm.criteo_batches(path, BATCH, start=offsets[rank], end=offsets[rank + 1],
                                  max_batches=STEPS)
    losses, examples, _ = dlrm.train(ec, model, opt, batches, pipeline=True)
    np.save(os.path.join(outdir, "dense-%d.npy" % rank), model.module.to_flat())
    np.save(os.path.join(outdir, "loss-%d.npy" % rank), np.array(losses))
    dist.barrier()
    dist.destroy_process_group()
    client.close()


class DDPTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import granary
        cls.g = granary
        cls.dir = tempfile.mkdtemp(prefix="gr_pyddp")
        granary.datagen(cls.dir, WORKERS * STEPS * BATCH, 100, seed=11)
        cls.path = os.path.join(cls.dir, "train.tsv")
        # Byte ranges starting at line starts: each worker reads its half.
        with open(cls.path, "rb") as f:
            data = f.read()
        mid = data.index(b"\n", len(data) // 2) + 1
        cls.offsets = [0, mid, len(data)]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def run_job(self, mode):
        import torch.multiprocessing as mp
        from granary import dlrm
        cluster = self.g.LocalCluster(2)
        out = tempfile.mkdtemp(dir=self.dir)
        try:
            mp.start_processes(worker, args=(cluster.servers, free_port(), self.path,
                                             self.offsets, mode, out),
                               nprocs=WORKERS, join=True, start_method="spawn")
            c = self.g.Client(servers=cluster.servers)
            rows = c.describe_table("embeddings")["rows"]
            # Exactly the rows of both workers' batches exist on the shards.
            ids = [np.concatenate([np.stack([f[k].numpy() for k in dlrm.FEATURES]).ravel()
                                   for f, _ in dlrm.criteo_batches(
                                       self.path, BATCH, start=self.offsets[r],
                                       end=self.offsets[r + 1], max_batches=STEPS)])
                   for r in range(WORKERS)]
            self.assertEqual(rows, len(np.unique(np.concatenate(ids))))
            self.assertGreater(len(np.setdiff1d(ids[1], ids[0])), BATCH)
            c.close()
            dense = [np.load(os.path.join(out, "dense-%d.npy" % r)) for r in range(WORKERS)]
            losses = [np.load(os.path.join(out, "loss-%d.npy" % r)) for r in range(WORKERS)]
        finally:
            cluster.stop()
        print("%s: %d rows; losses %s" % (mode, rows, ["%.4f -> %.4f" % (l[0], l[-5:].mean())
                                                        for l in losses]))
        self.assertGreater(rows, 2 * BATCH)
        for l in losses:
            self.assertEqual(len(l), STEPS)
            self.assertLess(l[-5:].mean(), l[:3].mean() - 0.05)
        # DDP keeps the replicas' dense weights identical, bit for bit.
        np.testing.assert_array_equal(dense[0], dense[1])
        self.assertFalse(np.array_equal(dense[0], dlrm.DenseDLRM().to_flat()))

    def test_sync(self):
        self.run_job("sync")

    def test_async(self):
        self.run_job("async")

    def test_ssp(self):
        self.run_job("ssp")  # a worker may run 2 steps ahead of the other


if __name__ == "__main__":
    grtest.main()
