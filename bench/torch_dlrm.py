#!/usr/bin/env python3
"""PyTorch DLRM baseline for `granary bench train`: the same model shape as granary's DLRM,
trained on the same TSV files, on CPU. Embeddings: nn.Embedding(sparse=True) with Adagrad;
dense layers: Adam. Prints one JSON line: examples_per_sec, auc, logloss, examples.

Preprocessing (reading the TSV, building per-slot vocabularies) is not timed; the timed part is
the training loop over prepared tensors, which favours PyTorch.
Run with Debian's python3 (/usr/bin/python3), which has python3-torch."""
import argparse
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn as nn

NUM_DENSE, NUM_CAT = 13, 26


def set_threads(n):
    """torch.set_num_threads(n), and the same limit for OpenBLAS, which Debian's PyTorch calls
    for its matrix products (BLAS_INFO=generic) and which otherwise starts a thread per core
    whatever torch was told: `--threads 1` then still ran every large product on two cores.
    granary.dlrm.set_threads is the same function (this file must not need granary)."""
    import ctypes
    torch.set_num_threads(n)
    for name in ("libblas.so.3", "libopenblas.so.0"):
        try:
            f = getattr(ctypes.CDLL(name), "openblas_set_num_threads", None)
        except OSError:
            continue
        if f is not None:
            f(int(n))


def load(path, vocabs, grow):
    labels, dense, cats = [], [], []
    with open(path, "r") as f:
        for line in f:
            parts = line.rstrip("\r\n").split("\t")
            if len(parts) != 1 + NUM_DENSE + NUM_CAT:
                continue
            labels.append(float(parts[0]))
            d = []
            for x in parts[1:1 + NUM_DENSE]:
                v = float(x) if x else 0.0
                d.append(math.log1p(max(v, 0.0)))
            dense.append(d)
            row = []
            for s, x in enumerate(parts[1 + NUM_DENSE:]):
                voc = vocabs[s]
                idx = voc.get(x)
                if idx is None:
                    if grow:
                        idx = len(voc)
                        voc[x] = idx
                    else:
                        idx = 0  # unseen in training: row 0 (the first value seen)
                row.append(idx)
            cats.append(row)
    return (torch.tensor(labels, dtype=torch.float32), torch.tensor(dense, dtype=torch.float32),
            torch.tensor(cats, dtype=torch.int64))


class Gram(torch.autograd.Function):
    """t t^T per example with the backward of a symmetric product, (G + G^T) t: one batched
    matmul instead of autograd's two (granary.dlrm.Gram is the same function)."""

    @staticmethod
    def forward(ctx, t):
        ctx.save_for_backward(t)
        return torch.bmm(t, t.transpose(1, 2))

    @staticmethod
    def backward(ctx, g):
        t, = ctx.saved_tensors
        return torch.bmm(g + g.transpose(1, 2), t)


def mlp(sizes, last_sigmoid=False):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, vocab_sizes, dim, bottom, top):
        super().__init__()
        self.emb = nn.ModuleList([nn.Embedding(max(v, 1), dim, sparse=True) for v in vocab_sizes])
        for e in self.emb:
            nn.init.uniform_(e.weight, -0.05, 0.05)
        self.bottom = mlp([NUM_DENSE] + bottom + [dim])
        n = NUM_CAT + 1
        self.li, self.lj = torch.tril_indices(n, n, offset=-1)
        # The pairs as positions in the flattened products: one index_select (backward one
        # index_add) instead of advanced indexing, whose backward zero-fills and scatters
        # through index_put; the same in granary.dlrm, so both sides get the faster form.
        self.pairs = self.li * n + self.lj
        self.top = mlp([dim + n * (n - 1) // 2] + top + [1])

    def forward(self, dense, cats):
        x = self.bottom(dense)
        embs = [e(cats[:, s]) for s, e in enumerate(self.emb)]
        t = torch.stack([x] + embs, dim=1)
        z = Gram.apply(t)
        inter = z.flatten(1).index_select(1, self.pairs)
        return self.top(torch.cat([x, inter], dim=1)).squeeze(1)


def auc(labels, scores):
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s), dtype=np.float64)
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2.0 + 1.0
        i = j + 1
    y = labels[order]
    p = y.sum()
    n = len(y) - p
    if p == 0 or n == 0:
        return 0.5
    return float((ranks[y == 1].sum() - p * (p + 1) / 2.0) / (p * n))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--bottom", default="64,32")
    ap.add_argument("--top", default="128,64")
    ap.add_argument("--lr-emb", type=float, default=0.05)
    ap.add_argument("--lr-dense", type=float, default=0.001)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=1)
    a = ap.parse_args()
    set_threads(a.threads)
    torch.manual_seed(1)
    vocabs = [dict() for _ in range(NUM_CAT)]
    ytr, dtr, ctr = load(a.train, vocabs, True)
    yte, dte, cte = load(a.test, vocabs, False)
    bottom = [int(x) for x in a.bottom.split(",") if x]
    top = [int(x) for x in a.top.split(",") if x]
    model = DLRM([len(v) for v in vocabs], a.dim, bottom, top)
    emb_params = list(model.emb.parameters())
    dense_params = list(model.bottom.parameters()) + list(model.top.parameters())
    opt_emb = torch.optim.Adagrad(emb_params, lr=a.lr_emb)
    opt_dense = torch.optim.Adam(dense_params, lr=a.lr_dense)
    lossf = nn.BCEWithLogitsLoss()
    n = len(ytr)
    t0 = time.time()
    seen = 0
    for _ in range(a.epochs):
        for i in range(0, n, a.batch):
            y, d, c = ytr[i:i + a.batch], dtr[i:i + a.batch], ctr[i:i + a.batch]
            opt_emb.zero_grad()
            opt_dense.zero_grad()
            loss = lossf(model(d, c), y)
            loss.backward()
            opt_emb.step()
            opt_dense.step()
            seen += len(y)
    secs = time.time() - t0
    with torch.no_grad():
        p = torch.sigmoid(torch.cat([model(dte[i:i + 8192], cte[i:i + 8192])
                                     for i in range(0, len(yte), 8192)])).numpy().astype(np.float64)
    yv = yte.numpy().astype(np.float64)
    pc = np.clip(p, 1e-7, 1 - 1e-7)
    ll = float(-np.mean(yv * np.log(pc) + (1 - yv) * np.log(1 - pc)))
    print(json.dumps({"examples_per_sec": seen / secs, "auc": auc(yv, p), "logloss": ll,
                      "examples": seen, "seconds": secs, "threads": a.threads}))


if __name__ == "__main__":
    sys.exit(main())
