#!/usr/bin/env python3
"""PyTorch baseline for `granary bench table`: an nn.EmbeddingBag(sparse=True, mode='sum') of
rows x dim, one bag of `bag` ids per example, batches of `batch` examples, ids drawn Zipf(s)
over the rows and spread by the same fixed permutation as the C benchmark's flat baseline.
Each step is forward + backward + torch.optim.Adagrad.step() (which coalesces duplicate ids,
like granary's dedup + sum). Prints one JSON line: ids_per_sec, batches, threads, seconds.

Run with Debian's python3 (/usr/bin/python3), which has python3-torch. The id pool is drawn
before timing starts; only the training steps are timed."""
import argparse
import json
import sys
import time

import numpy as np
import torch
import torch.nn as nn

PERM_MUL = 2654435761  # same as bench/table.c: row = ((rank - 1) * PERM_MUL) % rows


def zipf_pool(rows, s, n_batches, ids_per_batch, seed):
    """Bounded Zipf over ranks 1..rows by inverse CDF, mapped to rows by the permutation."""
    ranks = np.arange(1, rows + 1, dtype=np.float64)
    cdf = np.cumsum(ranks ** -s)
    cdf /= cdf[-1]
    del ranks
    rng = np.random.default_rng(seed)
    pool = []
    for _ in range(n_batches):
        u = rng.random(ids_per_batch)
        r = np.searchsorted(cdf, u, side="left").astype(np.int64)  # rank - 1
        np.minimum(r, rows - 1, out=r)
        pool.append(torch.from_numpy((r * PERM_MUL) % rows))
    return pool


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--bag", type=int, default=26)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--zipf", type=float, default=1.05)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.rows < 1 or a.batches < 1 or a.batch < 1 or a.bag < 1:
        print("torch_embedding: rows, batches, batch and bag must be >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    ids_per_batch = a.batch * a.bag
    pool = zipf_pool(a.rows, a.zipf, min(a.batches, 8), ids_per_batch, a.seed)
    emb = nn.EmbeddingBag(a.rows, a.dim, mode="sum", sparse=True)
    with torch.no_grad():
        emb.weight.uniform_(-0.01, 0.01)
    opt = torch.optim.Adagrad(emb.parameters(), lr=a.lr)
    offsets = torch.arange(0, ids_per_batch, a.bag, dtype=torch.int64)

    def step(ids):
        opt.zero_grad(set_to_none=True)
        out = emb(ids, offsets)
        out.sum().backward()
        opt.step()

    for i in range(a.warmup):
        step(pool[i % len(pool)])
    t0 = time.perf_counter()
    for i in range(a.batches):
        step(pool[i % len(pool)])
    secs = time.perf_counter() - t0
    print(json.dumps({"ids_per_sec": a.batches * ids_per_batch / secs, "batches": a.batches,
                      "threads": a.threads, "seconds": secs, "torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
