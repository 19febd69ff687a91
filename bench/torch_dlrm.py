#!/usr/bin/env python3
"""PyTorch DLRM baseline for `granary bench train`: the same model shape as granary's DLRM,
trained on the same TSV files, on CPU. Embeddings: nn.Embedding(sparse=True) with Adagrad
(granary's table settings: initial accumulator 1e-7, eps 1e-8); dense layers: Adam. A test
value training never saw reads a row of zeros (granary reads zeros for a row never created).
Prints one JSON line: examples_per_sec, auc, logloss, examples.

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
UNSEEN = [0]  # test values training never saw (counted by load)
# The embeddings' Adagrad (initial accumulator, eps): granary's default table optimizer
# (`granary.dlrm_table_spec`: 1e-7, 1e-8), which both granary sides use. torch's defaults (0,
# 1e-10) make a row's first step lr * sign(g) whatever |g|, so the many rows seen once or twice
# jump by 0.05 on a gradient of 1e-5: test AUC 0.77682 against 0.77997 with the shards'
# settings (seed-1 data, 200 k rows; docs/benchmarks.md, session 6).
ADAGRAD = [1e-7, 1e-8]


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


def load(path, vocabs, grow, unseen="zero"):
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
                        # unseen in training: "zero" / "own", one untrained row per slot past
                        # the vocabulary (zeros, or initialised); "row0", the slot's first
                        # value seen (before: a trained row of another value)
                        idx = len(voc) if unseen != "row0" else 0
                        UNSEEN[0] += 1
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


def mlp(sizes, relu_last=False):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or relu_last:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, vocab_sizes, dim, bottom, top, init="torch", bottom_relu_last=False,
                 zero_last_rows=False):
        super().__init__()
        self.emb = nn.ModuleList([nn.Embedding(max(v, 1), dim, sparse=True) for v in vocab_sizes])
        for e in self.emb:
            nn.init.uniform_(e.weight, -0.05, 0.05)
            if zero_last_rows:  # the unseen values' row (never trained: no gradient reaches it)
                with torch.no_grad():
                    e.weight[-1].zero_()
        # DLRM's bottom MLP, as granary's (src/train/model.c, granary.dlrm.DenseDLRM): a ReLU
        # after every layer, the last included (bottom_relu_last False: none after the last)
        self.bottom = mlp([NUM_DENSE] + bottom + [dim], relu_last=bottom_relu_last)
        n = NUM_CAT + 1
        self.li, self.lj = torch.tril_indices(n, n, offset=-1)
        # The pairs as positions in the flattened products: one index_select (backward one
        # index_add) instead of advanced indexing, whose backward zero-fills and scatters
        # through index_put; the same in granary.dlrm, so both sides get the faster form.
        self.pairs = self.li * n + self.lj
        self.top = mlp([dim + n * (n - 1) // 2] + top + [1])
        if init == "dlrm":
            # The DLRM reference's initializer, which granary's C DLRM (src/train/model.c) and
            # so the PyTorch + granary side use: W ~ N(0, sqrt(2 / (in + out))), b ~ N(0,
            # sqrt(1 / out)); "torch" keeps nn.Linear's default (before).
            for l in list(self.bottom) + list(self.top):
                if isinstance(l, nn.Linear):
                    nn.init.normal_(l.weight, 0.0, math.sqrt(2.0 / (l.in_features + l.out_features)))
                    nn.init.normal_(l.bias, 0.0, math.sqrt(1.0 / l.out_features))

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


def train_loop(model, ytr, dtr, ctr, batch, lr_emb, lr_dense, epochs):
    """The timed loop: Adagrad on the (sparse) embeddings, Adam on the dense layers. model may
    be a DDP wrapper (then its gradients, the embeddings' sparse ones included, are averaged
    over the workers by DDP before the optimizers step). Returns (examples, seconds, CPU
    seconds of this process, all its threads)."""
    inner = getattr(model, "module", model)
    opt_emb = torch.optim.Adagrad(list(inner.emb.parameters()), lr=lr_emb,
                                  initial_accumulator_value=ADAGRAD[0], eps=ADAGRAD[1])
    opt_dense = torch.optim.Adam(list(inner.bottom.parameters()) + list(inner.top.parameters()),
                                 lr=lr_dense)
    lossf = nn.BCEWithLogitsLoss()
    n = len(ytr)
    t0, c0 = time.time(), time.process_time()
    seen = 0
    for _ in range(epochs):
        for i in range(0, n, batch):
            y, d, c = ytr[i:i + batch], dtr[i:i + batch], ctr[i:i + batch]
            opt_emb.zero_grad()
            opt_dense.zero_grad()
            loss = lossf(model(d, c), y)
            loss.backward()
            opt_emb.step()
            opt_dense.step()
            seen += len(y)
    return seen, time.time() - t0, time.process_time() - c0


def ddp_worker(rank, a, port, vocab_sizes, ytr, dtr, ctr, result_path):
    """One of --workers processes: the whole model replicated (embedding tables included),
    DDP over gloo averaging every gradient (the embeddings' sparse ones as sparse tensors),
    this worker's contiguous share of the training rows. Dense Adam's lr is scaled by
    sqrt(workers) for the larger global batch, as the PyTorch + granary side does."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    set_threads(a.threads)
    ADAGRAD[:] = [a.adagrad_init_acc, a.adagrad_eps]  # a spawned process re-imports this file
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=a.workers)
    torch.manual_seed(1)
    bottom = [int(x) for x in a.bottom.split(",") if x]
    top = [int(x) for x in a.top.split(",") if x]
    model = DLRM(vocab_sizes, a.dim, bottom, top, a.init, a.bottom_relu_last,
                 a.unseen == "zero")
    # As the PyTorch + granary side's DDP (examples/torch_dlrm.py): no per-step broadcast of
    # buffers (this model has none: its index tensors are plain attributes), gradients in the
    # buckets.
    ddp = DistributedDataParallel(model, broadcast_buffers=False, gradient_as_bucket_view=True)
    n = len(ytr)
    lo, hi = n * rank // a.workers, n * (rank + 1) // a.workers
    dist.barrier()
    seen, secs, cpu = train_loop(ddp, ytr[lo:hi], dtr[lo:hi], ctr[lo:hi], a.batch, a.lr_emb,
                                 a.lr_dense * a.workers ** 0.5, a.epochs)
    dist.barrier()
    with open(result_path % rank, "w") as f:
        json.dump({"examples": seen, "seconds": secs, "cpu_seconds": cpu}, f)
    if rank == 0:
        torch.save(model.state_dict(), result_path % rank + ".pt")
    dist.destroy_process_group()


def train_ddp(a, vocab_sizes, ytr, dtr, ctr):
    """Runs --workers DDP processes; returns (the trained model, examples, seconds of the
    slowest, CPU seconds of all)."""
    import os
    import shutil
    import socket
    import tempfile
    import torch.multiprocessing as mp
    tmp = tempfile.mkdtemp(prefix="torch_dlrm_ddp")
    result_path = os.path.join(tmp, "worker-%d.json")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.start_processes(ddp_worker, args=(a, port, vocab_sizes, ytr, dtr, ctr, result_path),
                           nprocs=a.workers, join=True, start_method="spawn")
        res = [json.load(open(result_path % r)) for r in range(a.workers)]
        bottom = [int(x) for x in a.bottom.split(",") if x]
        top = [int(x) for x in a.top.split(",") if x]
        model = DLRM(vocab_sizes, a.dim, bottom, top, a.init, a.bottom_relu_last,
                     a.unseen == "zero")
        model.load_state_dict(torch.load(result_path % 0 + ".pt"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return (model, sum(r["examples"] for r in res), max(r["seconds"] for r in res),
            sum(r["cpu_seconds"] for r in res))


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
    ap.add_argument("--workers", type=int, default=1,
                    help="processes (DDP over gloo, every table replicated, sparse gradients "
                         "all-reduced); batch per worker")
    ap.add_argument("--init", default="torch", choices=["dlrm", "torch"],
                    help="dense layers' initializer: nn.Linear's default (default), or the DLRM "
                         "reference's, as granary's side (AUC 0.0028 lower on the seed-1 data)")
    ap.add_argument("--unseen", default="zero", choices=["zero", "own", "row0"],
                    help="a test value training never saw: one row of zeros per slot past the "
                         "vocabulary (default: granary's side reads zeros for a row training "
                         "never created), one initialised untrained row, or the slot's row 0 "
                         "(a trained row of another value; before)")
    ap.add_argument("--bottom-relu-last", type=int, default=0, choices=[0, 1],
                    help="1: a ReLU after the bottom MLP's last layer too, as DLRM's and "
                         "granary's model (AUC 0.0008 lower on the seed-1 data); 0 (default): "
                         "none there")
    ap.add_argument("--adagrad-init-acc", type=float, default=ADAGRAD[0],
                    help="embeddings' Adagrad initial accumulator (default 1e-7: granary's)")
    ap.add_argument("--adagrad-eps", type=float, default=ADAGRAD[1],
                    help="embeddings' Adagrad eps (default 1e-8: granary's)")
    a = ap.parse_args()
    ADAGRAD[:] = [a.adagrad_init_acc, a.adagrad_eps]
    set_threads(a.threads)
    torch.manual_seed(1)
    vocabs = [dict() for _ in range(NUM_CAT)]
    ytr, dtr, ctr = load(a.train, vocabs, True)
    yte, dte, cte = load(a.test, vocabs, False, a.unseen)
    # "own": one more row per slot, the untrained row of the values training never saw
    vocab_sizes = [len(v) + (a.unseen != "row0") for v in vocabs]
    bottom = [int(x) for x in a.bottom.split(",") if x]
    top = [int(x) for x in a.top.split(",") if x]
    if a.workers > 1:
        model, seen, secs, cpu = train_ddp(a, vocab_sizes, ytr, dtr, ctr)
    else:
        model = DLRM(vocab_sizes, a.dim, bottom, top, a.init, a.bottom_relu_last,
                     a.unseen == "zero")
        seen, secs, cpu = train_loop(model, ytr, dtr, ctr, a.batch, a.lr_emb, a.lr_dense,
                                     a.epochs)
    with torch.no_grad():
        p = torch.sigmoid(torch.cat([model(dte[i:i + 8192], cte[i:i + 8192])
                                     for i in range(0, len(yte), 8192)])).numpy().astype(np.float64)
    yv = yte.numpy().astype(np.float64)
    pc = np.clip(p, 1e-7, 1 - 1e-7)
    ll = float(-np.mean(yv * np.log(pc) + (1 - yv) * np.log(1 - pc)))
    print(json.dumps({"examples_per_sec": seen / secs, "auc": auc(yv, p), "logloss": ll,
                      "examples": seen, "seconds": secs, "threads": a.threads,
                      "workers": a.workers, "cpu_seconds": cpu, "init": a.init,
                      "unseen": a.unseen, "test_unseen_values": UNSEEN[0],
                      "adagrad_initial_accumulator": ADAGRAD[0], "adagrad_eps": ADAGRAD[1],
                      "cpu_ms_per_1024": 1e3 * cpu * 1024 / max(seen, 1)}))


if __name__ == "__main__":
    sys.exit(main())
