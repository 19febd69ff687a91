#!/usr/bin/python3
"""The PyTorch path reads any data layout through granary's schemas (docs/data.md): the reader
with schema= (a file, its JSON text, or "criteo") gives the schema's dense features, one id per
categorical column and a bag per list column, as `granary train --schema` reads them;
granary.dlrm.Batches turns that into features by column name, and examples/torch_dlrm.py
--schema trains DLRM on generated files of examples/schema.json (categorical and list columns,
mean pooling, a header, commas) to about the AUC `granary train --schema` reaches. A bad schema
or a list schema read without bag offsets is refused with a message naming the problem."""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import grtest

import numpy as np

SCHEMA = {"delimiter": ",", "header": True, "columns": [
    {"name": "y", "type": "label"},
    {"name": "price", "type": "dense"},
    {"name": "views", "type": "dense", "transform": "log1p", "fill": 2.5},
    {"name": "user", "type": "categorical"},
    {"name": "skip", "type": "ignore"},
    {"name": "items", "type": "list", "separator": "|", "pooling": "mean", "max_items": 3}]}
ROWS = ["y,price,views,user,skip,items",
        "1,0.5,3,u1,x,a|b",
        "0,-2,,u2,x,c",
        "1,1e1,0,u1,x,a|b|c|d",
        "0,7,9,,x,"]


class SchemaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gr_py_schema")
        cls.csv = os.path.join(cls.tmp, "small.csv")
        with open(cls.csv, "w") as f:
            f.write("\n".join(ROWS) + "\n")
        cls.schema = os.path.join(cls.tmp, "schema.json")
        with open(cls.schema, "w") as f:
            json.dump(SCHEMA, f)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_reader_follows_the_schema(self):
        import granary as g
        for schema in (self.schema, json.dumps(SCHEMA)):  # a file or the JSON text
            r = g.CriteoReader(self.csv, 8, schema=schema)
            self.assertEqual((r.n_dense, r.n_sparse, r.has_lists, r.is_criteo),
                             (2, 2, True, False))
            self.assertEqual(r.max_ids, 1 + 3)
            self.assertEqual(r.sparse_columns, [("user", "categorical", None),
                                                ("items", "list", "mean")])
            self.assertEqual(r.dense_columns, ["price", "views"])
            labels, dense = np.empty(8, np.float32), np.empty(16, np.float32)
            ids, off = np.empty(32, np.int64), np.empty(17, np.uint32)
            with self.assertRaises(ValueError) as e:  # lists need the bag offsets
                r.next(labels, dense, ids)
            self.assertIn("bag_off", str(e.exception))
            with self.assertRaises(ValueError):  # too small for a batch of 8
                r.next(labels, dense, ids, np.empty(5, np.uint32))
            n = r.next(labels, dense, ids, off)
            self.assertEqual(n, 4)
            np.testing.assert_array_equal(labels[:4], [1, 0, 1, 0])
            np.testing.assert_allclose(dense[:8].reshape(4, 2),
                                       [[0.5, math.log(4)], [-2, 2.5], [10, 0], [7, math.log(10)]],
                                       rtol=1e-6)
            # Bags: user (1 id) then items (up to 3, an empty list its missing id).
            self.assertEqual(np.diff(off[:9].astype(int)).tolist(), [1, 2, 1, 1, 1, 3, 1, 1])
            o = off.astype(int)
            user = [ids[o[2 * i]] for i in range(4)]
            self.assertEqual(user[0], user[2])                 # u1 twice
            self.assertNotEqual(user[0], user[1])
            self.assertEqual(len({user[0], user[1], user[3]}), 3)  # empty: the missing id
            items = [ids[o[2 * i + 1]:o[2 * i + 2]].tolist() for i in range(4)]
            self.assertEqual(items[2], items[0] + [items[1][0]])  # a|b|c (d cut by max_items)
            self.assertEqual(r.next(labels, dense, ids, off), 0)
            r.close()

    def test_batches_by_column_name(self):
        import torch
        from granary import dlrm
        b = dlrm.Batches(self.csv, 3, schema=self.schema)
        self.assertEqual(b.features, ["user", "items"])
        self.assertEqual(b.poolings, [None, "mean"])
        got = list(b)
        self.assertEqual(len(got), 2)
        feats, (labels, dense) = got[0]
        self.assertEqual(tuple(dense.shape), (3, 2))
        self.assertEqual(feats["user"].shape, (3,))
        vals, offs = feats["items"]
        self.assertEqual(offs.tolist(), [0, 2, 3])
        self.assertEqual(vals.numel(), 6)
        self.assertEqual(vals.dtype, torch.int64)
        # Criteo by default, named C1..C26.
        self.assertEqual(dlrm.Batches(self.csv, 3).features, dlrm.FEATURES)

    def test_bad_schemas(self):
        import granary as g
        bad = dict(SCHEMA, columns=SCHEMA["columns"] + [{"name": "y2", "type": "label"}])
        with self.assertRaises(g.GranaryError) as e:
            g.CriteoReader(self.csv, 8, schema=json.dumps(bad))
        self.assertIn("label", str(e.exception))
        with self.assertRaises(g.GranaryError) as e:
            g.CriteoReader(self.csv, 8, schema=os.path.join(self.tmp, "missing.json"))
        self.assertIn("missing.json", str(e.exception))
        with self.assertRaises(ValueError):
            g.dlrm_dense(16, "64,32", "128,64", 1, n_dense=3)  # n_sparse missing

    def test_example_trains_on_a_schema(self):
        import granary as g
        data = os.path.join(self.tmp, "gen")
        schema = os.path.join(grtest.REPO, "examples", "schema.json")
        subprocess.run([grtest.GRANARY_BIN, "datagen", "--out", data, "--train-rows", "8000",
                        "--test-rows", "2000", "--schema", schema], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        train, test = os.path.join(data, "train.csv"), os.path.join(data, "test.csv")
        r = subprocess.run([sys.executable, os.path.join(grtest.REPO, "examples", "torch_dlrm.py"),
                            "--train", train, "--test", test, "--schema", schema, "--batch", "256",
                            "--shards", "1", "--json"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=300,
                           env=dict(os.environ, GR_BUILD_DIR=grtest.BUILD))
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        res = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual(res["examples"], 8000)
        c = subprocess.run([grtest.GRANARY_BIN, "train", "--schema", schema, "--train", train,
                            "--test", test, "--batch", "256", "--local", "--workers", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
        self.assertEqual(c.returncode, 0, c.stderr[-3000:])
        c_auc = float(c.stdout.split("auc ")[1].split()[0])
        print("schema: PyTorch + granary AUC %.4f, granary train %.4f" % (res["auc"], c_auc))
        self.assertGreater(res["auc"], 0.6)
        self.assertLess(abs(res["auc"] - c_auc), 0.03)


if __name__ == "__main__":
    grtest.main()
