"""DLRM in PyTorch with its embeddings on granary: the same model as granary's C DLRM
(src/train/model.c: bottom MLP with ReLU on every layer, 351 pairwise dot products among the
bottom output and the 26 embeddings, top MLP), its dense parameters in the C trainer's flat
layout (so weights move between the two), the Criteo batches of granary's own reader, and a
training loop shared by examples/torch_dlrm.py, the tests and bench/torch_granary.py.
"""
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import granary
from granary.torch import EmbeddingCollection, TableConfig, TrainPipeline, scale_dense_lr

NUM_DENSE, NUM_CAT = 13, 26
FEATURES = ["C%d" % (i + 1) for i in range(NUM_CAT)]


def set_threads(n):
    """torch.set_num_threads(n), and the same limit for OpenBLAS, which Debian's PyTorch calls
    for its matrix products (BLAS_INFO=generic) and which otherwise starts a thread per core
    whatever torch was told: `--threads 1` then still ran every large product on two cores."""
    import ctypes
    torch.set_num_threads(n)
    for name in ("libblas.so.3", "libopenblas.so.0"):
        try:
            f = getattr(ctypes.CDLL(name), "openblas_set_num_threads", None)
        except OSError:
            continue
        if f is not None:
            f(int(n))


def parse_layers(s):
    return [int(x) for x in s.split(",") if x] if isinstance(s, str) else list(s)


class Gram(torch.autograd.Function):
    """t t^T per example (the interaction's pairwise dot products) with the backward of a
    symmetric product: (G + G^T) t, one batched matmul instead of autograd's two. The same
    function is in bench/torch_dlrm.py, so both PyTorch sides of `granary bench torch` get it."""

    @staticmethod
    def forward(ctx, t):
        ctx.save_for_backward(t)
        return torch.bmm(t, t.transpose(1, 2))

    @staticmethod
    def backward(ctx, g):
        t, = ctx.saved_tensors
        return torch.bmm(g + g.transpose(1, 2), t)


class Interaction(torch.autograd.Function):
    """DLRM's interaction with granary's kernel (`gr_dlrm_interact_forward`/`_backward`, the C
    trainer's own): (bot (B, d), embs (B, ns, d)) -> [bot, <va, vb> for a > b] (B, d + pairs),
    each dot summed in element order, examples 16 at a time in vector lanes; the backward
    likewise. Where torch computes the same with two batched matmuls of 27 x d matrices (1024
    small BLAS calls each way), an index_select and a concatenation."""

    @staticmethod
    def forward(ctx, bot, embs):
        bot = bot.detach().contiguous()
        embs = embs.detach().contiguous()
        n, ns, d = embs.shape
        nvec = ns + 1
        z = torch.empty((n, d + nvec * (nvec - 1) // 2), dtype=torch.float32)
        granary.dlrm_interact(bot.numpy(), embs.numpy(), z.numpy(), n, d, ns)
        ctx.save_for_backward(bot, embs)
        return z

    @staticmethod
    def backward(ctx, dz):
        bot, embs = ctx.saved_tensors
        n, ns, d = embs.shape
        dz = dz.contiguous()
        dbot = torch.empty_like(bot)
        gemb = torch.empty_like(embs)
        granary.dlrm_interact_backward(dz.numpy(), bot.numpy(), embs.numpy(), dbot.numpy(),
                                       gemb.numpy(), n, d, ns)
        return dbot, gemb


class DenseDLRM(nn.Module):
    """The dense part of DLRM. forward(dense (B, n_dense), embs (B, n_sparse, dim)) -> logits
    (B,); Criteo's 13 and 26 by default (a schema's counts otherwise: Batches.n_dense,
    .n_sparse). Initialised like `granary train --seed SEED` (the C initializer, through the
    extension)."""

    def __init__(self, dim=16, bottom=(64, 32), top=(128, 64), seed=1, n_dense=NUM_DENSE,
                 n_sparse=NUM_CAT, interaction="granary"):
        super().__init__()
        if interaction not in ("granary", "torch"):
            raise ValueError("interaction must be 'granary' or 'torch', not %r" % (interaction,))
        self.interaction = interaction
        self.dim, self.bottom_sizes, self.top_sizes = dim, parse_layers(bottom), parse_layers(top)
        self.seed, self.n_dense, self.n_sparse = seed, n_dense, n_sparse
        sizes = [n_dense] + self.bottom_sizes + [dim]
        self.bottom = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        n = n_sparse + 1
        li, lj = torch.tril_indices(n, n, offset=-1)  # (a, b) with a > b, in the C order
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)
        # The same pairs as positions in the flattened (n x n) products: one index_select
        # (backward: one index_add) instead of advanced indexing with two index tensors, whose
        # backward zero-fills and scatters through index_put (bench/torch_dlrm.py does the same).
        self.register_buffer("pairs", li * n + lj, persistent=False)
        sizes = [dim + n * (n - 1) // 2] + self.top_sizes + [1]
        self.top = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.load_flat(self.granary_init())

    def _layout_args(self):
        return (self.dim, ",".join(map(str, self.bottom_sizes)),
                ",".join(map(str, self.top_sizes)))

    def granary_init(self):
        """The C trainer's initial dense parameters for this shape and seed (flat float32)."""
        shape = {"n_dense": self.n_dense, "n_sparse": self.n_sparse}
        size, _ = granary.dlrm_dense(*self._layout_args(), self.seed, **shape)
        flat = np.empty(size, dtype=np.float32)
        granary.dlrm_dense(*self._layout_args(), self.seed, out=flat, **shape)
        return flat

    def _layers(self):
        return list(self.bottom) + list(self.top)

    def load_flat(self, flat):
        """Loads the C layout: per layer W (out x in, row-major) then b; bottom, then top."""
        flat = torch.as_tensor(np.asarray(flat, dtype=np.float32))
        at = 0
        with torch.no_grad():
            for l in self._layers():
                nw = l.weight.numel()
                l.weight.copy_(flat[at:at + nw].view_as(l.weight))
                at += nw
                l.bias.copy_(flat[at:at + l.bias.numel()])
                at += l.bias.numel()
        if at != flat.numel():
            raise ValueError("dense parameters: %d floats, this DLRM has %d" % (flat.numel(), at))

    def to_flat(self):
        return torch.cat([t.detach().reshape(-1) for l in self._layers()
                          for t in (l.weight, l.bias)]).numpy()

    def forward(self, dense, embs):
        x = dense
        for l in self.bottom:
            x = F.relu(l(x))  # DLRM in granary: ReLU on every bottom layer, the last included
        if self.interaction == "granary":
            x = Interaction.apply(x, embs)
        else:
            t = torch.cat([x.unsqueeze(1), embs], dim=1)
            z = Gram.apply(t)
            x = torch.cat([x, z.flatten(1).index_select(1, self.pairs)], dim=1)
        for i, l in enumerate(self.top):
            x = l(x)
            if i < len(self.top) - 1:
                x = F.relu(x)
        return x.squeeze(1)


class Batches:
    """(features, (labels, dense)) per batch from granary's reader: the same parsing, feature
    ids and batch order as `granary train` with one worker. schema: None or "criteo" (Criteo
    TSV, features C1..C26), a schema file's path or its JSON text (docs/data.md): then the
    features are the schema's sparse columns by name, a categorical column one id per example
    and a list column a bag (ids, offsets). .features, .poolings (None or the list's "sum" /
    "mean" per feature), .n_dense and .n_sparse describe them before the first batch."""

    def __init__(self, path, batch, threads=0, start=0, end=0, max_batches=0, schema=None):
        self.reader = granary.CriteoReader(path, batch, threads, start, end, schema=schema)
        r = self.reader
        cols = r.sparse_columns
        self.features = FEATURES if r.is_criteo else [c[0] for c in cols]
        self.poolings = [c[2] for c in cols]
        self.n_dense, self.n_sparse = r.n_dense, r.n_sparse
        self.batch, self.max_batches = batch, max_batches

    def __iter__(self):
        r, batch, S = self.reader, self.batch, self.n_sparse
        labels = np.empty(batch, dtype=np.float32)
        dense = np.empty((batch, max(self.n_dense, 1)), dtype=np.float32)
        ids = np.empty(batch * r.max_ids, dtype=np.int64)
        bag_off = np.empty(batch * S + 1, dtype=np.uint32) if r.has_lists else None
        k = 0
        try:
            while not self.max_batches or k < self.max_batches:
                n = r.next(labels, dense, ids) if bag_off is None else \
                    r.next(labels, dense, ids, bag_off)
                if n == 0:
                    break
                yield self._features(n, ids, bag_off), (
                    torch.from_numpy(labels[:n].copy()),
                    torch.from_numpy(dense[:n, :self.n_dense].copy()))
                k += 1
        finally:
            r.close()

    def _features(self, n, ids, bag_off):
        S = self.n_sparse
        if bag_off is None:
            # feature-major: one contiguous row each
            cat = torch.from_numpy(ids[:n * S].reshape(n, S).T.copy())
            return {f: cat[s] for s, f in enumerate(self.features)}
        off = bag_off[:n * S + 1].astype(np.int64)
        lens = np.diff(off).reshape(n, S)
        starts = off[:-1].reshape(n, S)
        out = {}
        for s, f in enumerate(self.features):
            ln, st = lens[:, s], starts[:, s]
            # positions of column s's ids: each example's bag, in example order
            pos = np.repeat(st - np.concatenate(([0], np.cumsum(ln)[:-1])), ln) + \
                np.arange(int(ln.sum()))
            vals = torch.from_numpy(ids[pos].copy())
            if self.poolings[s] is None:
                out[f] = vals
            else:
                out[f] = (vals, torch.from_numpy(np.concatenate(([0], np.cumsum(ln)[:-1]))))
        return out


def criteo_batches(path, batch, threads=0, start=0, end=0, max_batches=0, schema=None):
    """Batches(...) as an iterator (the name kept from when only Criteo was read)."""
    return iter(Batches(path, batch, threads, start, end, max_batches, schema))


def embedding_collection(client, dim=16, seed=1, mode="async", worker=0, workers=1,
                         aggregate=0, staleness=0, spec=None, reset=False, features=None,
                         poolings=None):
    """The features (Criteo's 26 by default; a Batches' .features and .poolings otherwise) on
    one table, as `granary train` keeps them (table 'embeddings', id 1, its default optimizer
    and initializer for this seed). Without list columns the forward returns {table name:
    (batch, features, dim)} (stacked); a list column's bags are pooled ("sum" or "mean"), and
    then every feature comes by name (categorical ones as bags of one id)."""
    import json
    full = json.loads(spec) if isinstance(spec, str) else (spec or
                                                           json.loads(granary.dlrm_table_spec(dim, seed)))
    extra = {k: v for k, v in full.items() if k not in ("name", "id", "dim")}
    features = list(features or FEATURES)
    poolings = list(poolings or [None] * len(features))
    name, tid = full.get("name", "embeddings"), full.get("id", 1)
    if all(p is None for p in poolings):
        cfgs = [TableConfig(name, tid, dim, features, pooling=None, spec=extra)]
    else:
        # One table, seen as one config per pooling (a categorical column is a bag of one).
        by = {}
        for f, p in zip(features, poolings):
            by.setdefault(p or "sum", []).append(f)
        cfgs = [TableConfig(name, tid, dim, fs, pooling=p, spec=extra) for p, fs in by.items()]
    ec = EmbeddingCollection(client, cfgs, mode=mode, worker=worker, workers=workers,
                             aggregate=aggregate, staleness=staleness, reset=reset,
                             stacked=len(cfgs) == 1 and cfgs[0].pooling is None)
    ec.feature_order = features
    return ec


def stacked_embeddings(ec, emb):
    """The (batch, features, dim) embeddings from a forward of the collection: the stacked
    tensor of embedding_collection's table, or its features stacked in order."""
    if ec.stacked and len(ec.tables) == 1 and ec.tables[0].pooling is None:
        return emb[ec.tables[0].name]
    return torch.stack([emb[f] for f in getattr(ec, "feature_order", FEATURES)], dim=1)


def logloss_from_logits(logits, labels):
    """The C trainer's loss (mean of softplus(z) - y z), in double."""
    z, y = logits.detach().double(), labels.double()
    return float((F.softplus(z) - y * z).mean())


def train(ec, model, optimizer, batches, pipeline=True, on_step=None, lr_rule="sqrt",
          emb_staleness=0):
    """Trains over batches; returns (per-step losses, examples, seconds). model may be a DDP
    wrapper of DenseDLRM. on_step(step, loss) is called after each step. optimizer's rate is
    the one-worker rate: with W DDP workers it is scaled for the W-times larger global batch by
    lr_rule (granary.torch.scale_dense_lr: "sqrt" by default, "linear", "none").
    emb_staleness: the pipeline's bound on the worker's own row updates a pull may miss
    (TrainPipeline: 0 by default)."""
    scale_dense_lr(optimizer, rule=lr_rule)
    losses = []
    examples = [0]
    t0 = time.perf_counter()

    def step(emb, extra):
        labels, dense = extra
        embs = stacked_embeddings(ec, emb)
        logits = model(dense, embs)
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        # The step's loss as computed (float32 BCE; the C trainer's double-precision mean agrees
        # within 1e-6 relative): re-evaluating it in double cost the critical path 0.1 ms.
        losses.append(float(loss))
        examples[0] += labels.numel()
        if on_step:
            on_step(len(losses), losses[-1])

    if pipeline:
        TrainPipeline(ec, batches, emb_staleness=emb_staleness).run(step)
    else:
        for features, extra in batches:
            step(ec(features), extra)
    ec.finish()
    return losses, examples[0], time.perf_counter() - t0


def evaluate(ec, model, batches):
    """(AUC, logloss, examples) over batches, rows read without creating any."""
    scores, labels_all = [], []
    with torch.no_grad():
        for features, (labels, dense) in batches:
            emb = ec(features)
            embs = stacked_embeddings(ec, emb)
            scores.append(torch.sigmoid(model(dense, embs)))
            labels_all.append(labels)
    if not scores:
        return math.nan, math.nan, 0
    s, y = torch.cat(scores), torch.cat(labels_all)
    p = s.double().clamp(1e-7, 1 - 1e-7)
    ll = float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())
    return granary.auc(s.float().numpy(), y.float().numpy()), ll, y.numel()
