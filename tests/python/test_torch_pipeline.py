#!/usr/bin/python3
"""granary.torch.TrainPipeline's row staleness bound and scale_dense_lr.

With SGD lr 1 on the shards and a loss whose gradients are fixed weights, the rows a step sees
are exactly determined by the earlier steps' pushes. The pipeline with emb_staleness 0 (the
default) must show every step the rows a sequential loop shows (each forward after the previous
push landed), although it prefetches the rows the current batch does not touch; with
emb_staleness 1 (the whole next batch prefetched) the rows consecutive batches share come one
update behind, which the test also sees, so it can tell the two apart."""
import unittest

import grtest

import numpy as np

STEPS = 6


class PipelineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import granary
        import torch
        cls.g = granary
        cls.cluster = granary.LocalCluster(2)
        gen = torch.Generator().manual_seed(5)
        cls.batches = []
        for k in range(STEPS):
            # ids 0..23: consecutive batches share many, and each has ids the previous lacks
            item = torch.randint(0, 24, (20,), generator=gen)
            hist = torch.randint(100, 124, (15,), generator=gen)
            hist_off = torch.tensor([0, 4, 4, 9])             # bag 1 is empty
            w = {"items": torch.randn(20, 1, 4, generator=gen),
                 "hist": torch.randn(4, 3, generator=gen)}
            cls.batches.append(({"item": item, "hist": (hist, hist_off)}, w))

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def collection(self, base_id):
        from granary.torch import EmbeddingCollection, TableConfig
        c = self.g.Client(servers=self.cluster.servers)
        sgd = {"init": {"kind": "uniform", "low": -0.5, "high": 0.5}, "seed": 3,
               "optimizer": {"kind": "sgd", "lr": 1.0}}
        tables = [TableConfig("items%d" % base_id, base_id, 4, ["item"], pooling=None, spec=sgd),
                  TableConfig("hist%d" % base_id, base_id + 1, 3, ["hist"], pooling="sum",
                              spec=sgd)]
        return c, EmbeddingCollection(c, tables, stacked=True)

    def step_fn(self, ec, seen):
        def step(emb, w):
            seen.append({k: v.detach().clone() for k, v in emb.items()})
            names = {"items": ec.tables[0].name, "hist": "hist"}
            sum((emb[names[k]] * w[k]).sum() for k in w).backward()
        return step

    def final_rows(self, c, base_id):
        items = np.unique(np.concatenate([f["item"].numpy() for f, _ in self.batches]))
        hist = np.unique(np.concatenate([f["hist"][0].numpy() for f, _ in self.batches]))
        return (c.pull(base_id, 4, items, readonly=True).copy(),
                c.pull(base_id + 1, 3, hist, readonly=True).copy())

    def run_sequential(self, base_id):
        c, ec = self.collection(base_id)
        seen = []
        step = self.step_fn(ec, seen)
        for feats, w in self.batches:
            step(ec(feats), w)
        ec.finish()
        rows = self.final_rows(c, base_id)
        c.close()
        return seen, rows

    def run_pipeline(self, base_id, staleness):
        from granary.torch import TrainPipeline
        c, ec = self.collection(base_id)
        seen = []
        n = TrainPipeline(ec, iter(self.batches), emb_staleness=staleness).run(
            self.step_fn(ec, seen))
        self.assertEqual(n, STEPS)
        ec.finish()
        rows = self.final_rows(c, base_id)
        c.close()
        return seen, rows

    def test_staleness_0_sees_every_own_update(self):
        ref, ref_rows = self.run_sequential(40)
        got, rows = self.run_pipeline(42, 0)
        for k in range(STEPS):
            for name_ref, name in (("items40", "items42"), ("hist", "hist")):
                np.testing.assert_allclose(got[k][name].numpy(), ref[k][name_ref].numpy(),
                                           rtol=0, atol=1e-6, err_msg="step %d %s" % (k, name))
        for a, b in zip(rows, ref_rows):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)

    def test_staleness_1_misses_the_current_push(self):
        ref, ref_rows = self.run_sequential(44)
        got, rows = self.run_pipeline(46, 1)
        # The first step reads rows nothing was pushed to yet; from the second on, the rows
        # shared with the previous batch were prefetched before its push and lack its update.
        np.testing.assert_allclose(got[0]["items46"].numpy(), ref[0]["items44"].numpy(),
                                   rtol=0, atol=1e-6)
        diff = min(float((got[k]["items46"] - ref[k]["items44"]).abs().max())
                   for k in range(1, STEPS))
        self.assertGreater(diff, 0.1)
        # Nothing is lost, only read late: the gradients do not depend on the rows here, so
        # the final rows are the sequential loop's.
        for a, b in zip(rows, ref_rows):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)

    def test_split_puts_the_previous_batch_ids_last(self):
        import torch
        c, ec = self.collection(48)
        a = ec.prepare({"item": torch.tensor([5, 6, 7, 5]), "hist": torch.tensor([100, 101])})
        b = ec.prepare({"item": torch.tensor([9, 7, 9, 8, 6]), "hist": torch.tensor([101, 102])},
                       prev=a)
        self.assertEqual(b.fresh, [2, 1])
        uniq, inv = b.parts[0][1], b.parts[0][2]
        self.assertEqual(list(uniq), [9, 8, 7, 6])
        self.assertEqual(list(uniq[inv.reshape(-1)]), [9, 7, 9, 8, 6])
        self.assertEqual(list(b.parts[1][1]), [102, 101])
        self.assertEqual(list(b.parts[1][1][b.parts[1][2].numpy()]), [101, 102])
        self.assertEqual([len(t[2]) for t in b.batches("fresh")], [2, 1])
        self.assertEqual([len(t[2]) for t in b.batches("rest")], [2, 1])
        c.close()

    def test_split_sees_every_config_of_a_table(self):
        # Two configs on one table (a schema's pooled and categorical columns): an id the
        # previous batch touched through the other config is not fresh.
        import torch
        from granary.torch import EmbeddingCollection, TableConfig
        c = self.g.Client(servers=self.cluster.servers)
        ec = EmbeddingCollection(c, [TableConfig("shared", 52, 4, ["a"], pooling="sum"),
                                     TableConfig("shared", 52, 4, ["b"], pooling=None)])
        p = ec.prepare({"a": torch.tensor([1, 2]), "b": torch.tensor([3])})
        q = ec.prepare({"a": torch.tensor([3, 4]), "b": torch.tensor([1, 5])}, prev=p)
        self.assertEqual(q.fresh, [1, 1])
        self.assertEqual(list(q.parts[0][1]), [4, 3])
        self.assertEqual(list(q.parts[1][1]), [5, 1])
        c.close()

    def test_bad_staleness(self):
        from granary.torch import TrainPipeline
        c, ec = self.collection(50)
        for bad in (2, -1):
            with self.assertRaisesRegex(ValueError, "emb_staleness"):
                TrainPipeline(ec, iter([]), emb_staleness=bad)
        c.close()

    def test_scale_dense_lr(self):
        import torch
        from granary.torch import scale_dense_lr
        p = [torch.nn.Parameter(torch.zeros(3))]
        opt = torch.optim.Adam(p, lr=1e-3)
        self.assertEqual(scale_dense_lr(opt), 1.0)  # no process group: one worker
        self.assertEqual(opt.param_groups[0]["lr"], 1e-3)
        self.assertEqual(scale_dense_lr(opt, 4), 2.0)
        self.assertAlmostEqual(opt.param_groups[0]["lr"], 2e-3, places=12)
        scale_dense_lr(opt, 4)  # again: from the one-worker rate, not compounded
        self.assertAlmostEqual(opt.param_groups[0]["lr"], 2e-3, places=12)
        scale_dense_lr(opt, 4, rule="linear")
        self.assertAlmostEqual(opt.param_groups[0]["lr"], 4e-3, places=12)
        scale_dense_lr(opt, 4, rule="none")
        self.assertAlmostEqual(opt.param_groups[0]["lr"], 1e-3, places=12)
        with self.assertRaisesRegex(ValueError, "lr rule 'cube'"):
            scale_dense_lr(opt, 2, rule="cube")
        with self.assertRaisesRegex(ValueError, "workers 0"):
            scale_dense_lr(opt, 0)


if __name__ == "__main__":
    grtest.main()
