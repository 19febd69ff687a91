#!/usr/bin/python3
"""granary.torch.EmbeddingCollection against torch.nn.EmbeddingBag on the same rows: pooled
sum and mean bags from offsets (empty bags included) and one row per id, two tables and three
features, in every sync mode. With SGD lr 1 on the shards, a row after the step is exactly its
value before minus EmbeddingBag's gradient for it, so the test checks the forward output, the
gradient and that it was summed over duplicate ids and applied once."""
import unittest

import grtest

import numpy as np


class EmbeddingCollectionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import granary
        cls.g = granary
        cls.cluster = granary.LocalCluster(2)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def run_mode(self, mode, base_id):
        import torch
        from granary.torch import EmbeddingCollection, TableConfig
        c = self.g.Client(servers=self.cluster.servers)
        sgd = {"init": {"kind": "uniform", "low": -0.5, "high": 0.5},
               "optimizer": {"kind": "sgd", "lr": 1.0}}
        tables = [TableConfig("u_" + mode, base_id, 8, ["user", "query"], pooling="sum", spec=sgd),
                  TableConfig("i_" + mode, base_id + 1, 4, ["item"], pooling=None, spec=sgd)]
        mean_t = TableConfig("m_" + mode, base_id + 2, 4, ["hist"], pooling="mean", spec=sgd)
        ec = EmbeddingCollection(c, tables + [mean_t], mode=mode, reset=True)
        g = torch.Generator().manual_seed(base_id)
        user = torch.randint(0, 30, (40,), generator=g)       # many duplicates
        user_off = torch.tensor([0, 5, 5, 17, 30])             # bag 1 is empty
        query = torch.randint(0, 30, (12,), generator=g)       # same table as user
        item = torch.randint(100, 120, (10,), generator=g)
        hist = torch.randint(0, 10, (9,), generator=g)
        hist_off = torch.tensor([0, 3, 4, 4, 9 - 1])
        feats = {"user": (user, user_off), "query": query, "item": item, "hist": (hist, hist_off)}

        def rows_of(tid, dim, keys):
            return torch.from_numpy(c.pull(tid, dim, keys.numpy(), readonly=True).copy())

        # Reference: EmbeddingBags holding the same rows (indexed by the ids themselves).
        ref = {}
        for name, tid, dim, ids in (("u", base_id, 8, torch.cat([user, query])),
                                    ("i", base_id + 1, 4, item), ("m", base_id + 2, 4, hist)):
            ids_u = torch.unique(ids)
            w = torch.zeros(int(ids_u.max()) + 1, dim)
            out = ec.client.pull(tid, dim, ids_u.numpy())  # creates them, as the forward would
            w[ids_u] = torch.from_numpy(out)
            ref[name] = (torch.nn.Parameter(w), ids_u, tid, dim)
        F = torch.nn.functional
        out = ec(feats)
        expect = {
            "user": F.embedding_bag(user, ref["u"][0], user_off, mode="sum"),
            "query": F.embedding_bag(query, ref["u"][0], torch.arange(12), mode="sum"),
            "item": F.embedding(item, ref["i"][0]),
            "hist": F.embedding_bag(hist, ref["m"][0], hist_off, mode="mean"),
        }
        self.assertEqual(set(out), set(expect))
        for k in expect:
            self.assertEqual(out[k].shape, expect[k].shape, k)
            torch.testing.assert_close(out[k], expect[k], rtol=0, atol=1e-6, msg=k)
        self.assertTrue(torch.all(out["user"][1] == 0))  # the empty bag
        # A loss touching every output with different weights.
        wts = {k: torch.randn(v.shape, generator=g) for k, v in expect.items()}
        sum(((out[k] * wts[k]).sum() for k in out)).backward()
        sum(((expect[k] * wts[k]).sum() for k in expect)).backward()
        ec.finish()
        for name, (w, ids_u, tid, dim) in ref.items():
            after = rows_of(tid, dim, ids_u)
            want = (w.detach() - w.grad)[ids_u]
            torch.testing.assert_close(after, want, rtol=0, atol=1e-5,
                                       msg="%s %s rows after the step" % (mode, name))
            self.assertTrue(torch.any(w.grad[ids_u] != 0))
        c.close()

    def test_async(self):
        self.run_mode("async", 100)

    def test_sync(self):
        self.run_mode("sync", 200)

    def test_semisync(self):
        self.run_mode("semisync", 300)

    def test_ssp(self):
        self.run_mode("ssp", 400)

    def test_stacked(self):
        """stacked=True: a table without pooling returns (ids per feature, features, dim) in one
        tensor, equal to stacking F.embedding per feature; the rows after an SGD step (lr 1) are
        the rows minus the gradient summed over every occurrence (the C segment sum)."""
        import torch
        from granary.torch import EmbeddingCollection, TableConfig
        F = torch.nn.functional
        c = self.g.Client(servers=self.cluster.servers)
        sgd = {"init": {"kind": "uniform", "low": -0.5, "high": 0.5},
               "optimizer": {"kind": "sgd", "lr": 1.0}}
        feats = ["f0", "f1", "f2"]
        ec = EmbeddingCollection(c, [TableConfig("st", 600, 4, feats, pooling=None, spec=sgd)],
                                 stacked=True)
        g = torch.Generator().manual_seed(6)
        ids = {f: torch.randint(0, 12, (50,), generator=g) for f in feats}  # many repeats
        allids = torch.unique(torch.cat(list(ids.values())))
        w = torch.zeros(12, 4)
        w[allids] = torch.from_numpy(c.pull(600, 4, allids.numpy()))
        w = torch.nn.Parameter(w)
        out = ec(ids)
        self.assertEqual(list(out), ["st"])
        self.assertEqual(tuple(out["st"].shape), (50, 3, 4))
        expect = torch.stack([F.embedding(ids[f], w) for f in feats], dim=1)
        torch.testing.assert_close(out["st"], expect, rtol=0, atol=0)
        wt = torch.randn(expect.shape, generator=g)
        (out["st"] * wt).sum().backward()
        (expect * wt).sum().backward()
        ec.finish()
        after = torch.from_numpy(c.pull(600, 4, allids.numpy(), readonly=True))
        torch.testing.assert_close(after, (w.detach() - w.grad)[allids], rtol=0, atol=1e-5)
        # One feature: (ids, 1, dim). Features of different lengths cannot stack.
        ec1 = EmbeddingCollection(c, [TableConfig("st", 600, 4, ["f0"], pooling=None, spec=sgd)],
                                  stacked=True)
        with torch.no_grad():
            self.assertEqual(tuple(ec1({"f0": ids["f0"]})["st"].shape), (50, 1, 4))
        with self.assertRaises(ValueError) as e:
            ec({"f0": ids["f0"], "f1": ids["f1"][:7], "f2": ids["f2"]})
        self.assertIn("f1 7", str(e.exception))
        c.close()

    def test_gather_and_segment_sum(self):
        import numpy as np
        g = self.g
        rows = np.arange(12, dtype=np.float32).reshape(4, 3)
        inv = np.array([2, 0, 2, 3, 2], dtype=np.int32)
        out = np.empty((5, 3), np.float32)
        g.gather_rows(out, inv, rows, 3)
        np.testing.assert_array_equal(out, rows[inv])
        grads = np.arange(15, dtype=np.float32).reshape(5, 3)
        sums = np.full((4, 3), 7, np.float32)  # overwritten, not added to
        g.segment_sum(grads, inv, sums, 3)
        want = np.zeros((4, 3), np.float32)
        np.add.at(want, inv, grads)
        np.testing.assert_array_equal(sums, want)
        bad = np.array([0, 4], dtype=np.int32)  # 4 is past the 4 rows
        with self.assertRaises(ValueError) as e:
            g.segment_sum(np.ones((2, 3), np.float32), bad, sums, 3)
        self.assertIn("inverse[1] = 4", str(e.exception))
        with self.assertRaises(ValueError):
            g.gather_rows(out, inv, rows, 0)  # dim
        with self.assertRaises(ValueError):
            g.gather_rows(np.empty((4, 3), np.float32), inv, rows, 3)  # out too small
        with self.assertRaises(ValueError):
            g.segment_sum(grads, inv, np.empty(10, np.float32), 3)  # not whole rows
        with self.assertRaises(TypeError):
            g.segment_sum(grads, inv.astype(np.int64), sums, 3)
        with self.assertRaises(TypeError):
            g.gather_rows(np.empty((5, 6), np.float32)[:, :3], inv, rows, 3)  # strided out
        np.testing.assert_array_equal(sums, want)  # untouched by the refused calls

    def test_bad_features(self):
        import torch
        from granary.torch import EmbeddingCollection, TableConfig
        c = self.g.Client(servers=self.cluster.servers)
        ec = EmbeddingCollection(c, [TableConfig("bf", 500, 4, ["a"], pooling="sum")])
        with self.assertRaises(KeyError):
            ec({"b": torch.tensor([1])})
        with self.assertRaises(TypeError):
            ec({"a": torch.tensor([1.0])})
        with self.assertRaises(ValueError):
            TableConfig("x", 1, 4, ["a"], pooling="max")
        with self.assertRaises(ValueError):
            EmbeddingCollection(c, [TableConfig("bf", 500, 4, ["a"]),
                                    TableConfig("bg", 501, 4, ["a"])])
        with self.assertRaises(self.g.GranaryError):  # same table id, another dim
            EmbeddingCollection(c, [TableConfig("bf", 500, 8, ["a"])])
        c.close()


if __name__ == "__main__":
    grtest.main()
