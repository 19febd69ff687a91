"""PyTorch modules whose embedding tables live on granary (docs/python.md).

EmbeddingCollection maps feature names to tables, the way TorchRec's EmbeddingBagCollection
does: each table serves one or more features, and each feature's ids come as a bag per example
(pooled "sum" or "mean" from offsets) or as one row per id (pooling None). forward() deduplicates
each table's ids in C, pulls the unique rows of every table in one request per shard, and
returns ordinary tensors; backward sums the gradients of duplicate ids (embedding_bag's backward
over the unique rows) and pushes them to the shards, whose optimizer applies them. The sync
modes of the C trainer work the same way: in sync, semisync and ssp a step token is taken from
every shard before the pull and the step's gradients of all tables go out in one PUSH_STEP per
shard. Dense layers stay ordinary torch.nn modules (trained with DDP across processes).

TrainPipeline overlaps the next batch's reading, dedup and (in async mode) pull with the
current batch's compute, like TorchRec's TrainPipelineSparseDist.
"""
import threading

import numpy as np
import torch
import torch.nn.functional as F

import granary

__all__ = ["TableConfig", "EmbeddingCollection", "TrainPipeline", "scale_dense_lr"]


class TableConfig:
    """One table: name, numeric id, dim, the features it serves, and pooling ("sum", "mean" or
    None for one row per id). spec: further table spec fields (initializer, optimizer, ...,
    docs/table.md) used when the collection creates the table."""

    def __init__(self, name, table_id, dim, features, pooling="sum", spec=None):
        if pooling not in ("sum", "mean", None):
            raise ValueError("table %r: pooling %r: want 'sum', 'mean' or None" % (name, pooling))
        if not features:
            raise ValueError("table %r serves no features" % name)
        self.name, self.table_id, self.dim = name, int(table_id), int(dim)
        self.features, self.pooling = list(features), pooling
        self.spec = dict(spec or {})

    def spec_dict(self):
        s = dict(self.spec)
        s.update({"name": self.name, "id": self.table_id, "dim": self.dim})
        return s


class _Prepared:
    """One batch's ids, deduplicated per table, and the buffers its rows are pulled into."""

    def __init__(self, tables, features, stacked=False, prev=None):
        # per table: (cfg, uniq int64[nu], inverse, [(feature, lo, hi, offsets)]); inverse is
        # an int32 numpy array for tables without pooling (the C gather and segment sum use
        # it; stacked: in (ids per feature, features) order) and an int64 tensor for bags.
        # prev: the batch trained just before this one. Then each table's unique ids are put
        # in two runs, first those prev does not touch (fresh[t] of them), then those it does:
        # a pipeline may pull the first run while prev computes, the second only after prev's
        # push has landed (the staleness bound 0 of `granary train`'s hybrid mode).
        self.parts = []
        self.rows = []    # per table: float32 numpy (nu, dim)
        self.fresh = None  # per table: how many leading unique ids prev does not touch
        self.op = None    # a started pull
        self.rest = False  # the ids prev touches are still to be pulled (after its push)
        self.token = None  # sync modes: the step tags this batch's pull ran under
        prev_ids = {}  # table id -> prev's unique ids of it (of every config on that table)
        for pcfg, puniq, _, _ in (prev.parts if prev is not None else []):
            prev_ids.setdefault(pcfg.table_id, []).append(puniq)
        for cfg in tables:
            ids, spans, at = [], [], 0
            for f in cfg.features:
                if f not in features:
                    raise KeyError("feature %r (table %r) is missing from the batch" % (f, cfg.name))
                v = features[f]
                vals, offs = (v if isinstance(v, tuple) else (v, None))
                vals = vals.reshape(-1)
                if vals.dtype != torch.int64:
                    raise TypeError("feature %r: ids must be int64, got %s" % (f, vals.dtype))
                if cfg.pooling is not None and offs is None:
                    offs = torch.arange(vals.numel(), dtype=torch.int64)
                ids.append(vals)
                spans.append((f, at, at + vals.numel(), offs))
                at += vals.numel()
            allids = torch.cat(ids) if len(ids) > 1 else ids[0].contiguous()
            n = allids.numel()
            uniq = np.empty(n, dtype=np.int64)
            inv = np.empty(n, dtype=np.int32)
            nu = granary.dedup(allids.numpy(), uniq, inv)
            uniq = uniq[:nu]
            if prev is not None:
                if self.fresh is None:
                    self.fresh = []
                p = prev_ids.get(cfg.table_id, [])
                uniq, inv, k = _split_fresh(uniq, inv, p[0] if len(p) == 1 else np.concatenate(
                    p or [np.empty(0, dtype=np.int64)]))
                self.fresh.append(k)
            if cfg.pooling is not None:
                inv = torch.from_numpy(inv).long()
            elif stacked and len(spans) > 1:
                per = spans[0][2]
                if any(hi - lo != per for _, lo, hi, _ in spans):
                    raise ValueError("stacked: the features of table %r have different numbers "
                                     "of ids (%s)" % (cfg.name, ", ".join(
                                         "%s %d" % (f, hi - lo) for f, lo, hi, _ in spans)))
                inv = np.ascontiguousarray(inv.reshape(len(spans), per).T)
            self.parts.append((cfg, uniq, inv, spans))
            self.rows.append(np.empty((nu, cfg.dim), dtype=np.float32))

    def batches(self, part=None):
        """The pull's (table, dim, keys, rows) per table: all unique ids (part None), only those
        the previous batch does not touch ("fresh") or only those it does ("rest")."""
        out = []
        for t, ((cfg, uniq, _, _), rows) in enumerate(zip(self.parts, self.rows)):
            lo, hi = 0, len(uniq)
            if part == "fresh":
                hi = self.fresh[t]
            elif part == "rest":
                lo = self.fresh[t]
            if hi > lo:
                out.append((cfg.table_id, cfg.dim, uniq[lo:hi], rows[lo:hi]))
        return out


def _split_fresh(uniq, inv, prev_uniq):
    """Reorders uniq so that the ids not in prev_uniq come first; returns (uniq, inverse
    remapped to the new order, how many come first). The membership test is one dedup in C
    over both batches' unique ids (first-seen order: an id of uniq is in prev_uniq exactly when
    its index is below len(prev_uniq))."""
    n1, nu = len(prev_uniq), len(uniq)
    both = np.concatenate((prev_uniq, uniq))
    u = np.empty(n1 + nu, dtype=np.int64)
    where = np.empty(n1 + nu, dtype=np.int32)
    granary.dedup(both, u, where)
    seen = where[n1:] < n1
    order = np.concatenate((np.flatnonzero(~seen), np.flatnonzero(seen)))
    pos = np.empty(nu, dtype=np.int32)
    pos[order] = np.arange(nu, dtype=np.int32)
    return uniq[order], pos[inv], nu - int(seen.sum())


class _Gather(torch.autograd.Function):
    """rows[inverse] (one row per id) whose backward sums each unique row's gradients over its
    occurrences in C (granary.segment_sum), without the GIL."""

    @staticmethod
    def forward(ctx, w, inv, shape):
        ctx.inv, ctx.nu = inv, w.shape[0]
        out = torch.empty(shape + (w.shape[1],), dtype=torch.float32)
        granary.gather_rows(out.numpy(), inv, w.detach().numpy(), w.shape[1])
        return out

    @staticmethod
    def backward(ctx, grad):
        g = grad.contiguous()
        dim = g.shape[-1]
        out = torch.empty((ctx.nu, dim), dtype=torch.float32)
        granary.segment_sum(g.numpy(), ctx.inv, out.numpy(), dim)
        return out, None, None


class _Rows(torch.autograd.Function):
    """Identity on the pulled unique rows whose backward hands the rows' gradients (already
    summed over duplicate ids by embedding_bag's backward) to the collection to push."""

    @staticmethod
    def forward(ctx, owner, prep, *rows):
        ctx.owner, ctx.prep = owner, prep
        return tuple(r.detach() for r in rows) if len(rows) > 1 else rows[0].detach()

    @staticmethod
    def backward(ctx, *grads):
        ctx.owner._push(ctx.prep, grads)
        return (None, None) + tuple(None for _ in grads)


class EmbeddingCollection(torch.nn.Module):
    """Feature names -> tables on granary. forward(features) takes a dict feature ->
    int64 ids tensor, or (ids, offsets) for bags (offsets as nn.EmbeddingBag takes them: the
    start of each bag), and returns a dict feature -> tensor: (bags, dim) pooled, or (ids, dim)
    for a table without pooling.

    mode: "async" (pushes applied on arrival), "sync", "semisync", "ssp" (step tokens; the job
    is configured on the shards with workers/aggregate/staleness). worker: this process's
    worker index in the job. Call finish() when this worker has no more batches.
    create: create the tables on the shards (an existing equal table is fine).
    stacked: a table without pooling returns one tensor under its own name, (ids per feature,
    features, dim), instead of one per feature (its features must have as many ids each): what
    a model that stacks the features (DLRM's interaction) wants, without the split and stack."""

    def __init__(self, client, tables, mode="async", worker=0, workers=1, aggregate=0,
                 staleness=0, create=True, timeout_ms=60000, reset=False, stacked=False):
        super().__init__()
        if mode not in granary.SYNC_MODES:
            raise ValueError("mode %r: want one of %s" % (mode, ", ".join(granary.SYNC_MODES)))
        names = set()
        for t in tables:
            for f in t.features:
                if f in names:
                    raise ValueError("feature %r is served by two tables" % f)
                names.add(f)
        self.client, self.tables, self.mode = client, list(tables), mode
        self.worker, self.timeout_ms = int(worker), int(timeout_ms)
        self.stacked = bool(stacked)
        self._pending = []        # async pushes started and not yet waited for
        self._tags = None         # sync modes: the tags of this worker's last step per shard
        self._left = False
        if create:
            for t in self.tables:
                client.create_table(t.spec_dict())
        if mode != "async":
            if not aggregate:  # as the C trainer: K = N - 1 (one backup worker), or 1 alone
                aggregate = workers - 1 if workers > 1 else 1
            client.sync_configure(mode, workers=workers, aggregate=aggregate,
                                  staleness=staleness, reset=reset)

    # The step machinery -------------------------------------------------------------------------
    def prepare(self, features, prev=None):
        """Deduplicates a batch's ids (the CPU part of forward), for a pipeline to run ahead.
        prev: the prepared batch trained just before this one; start_pull then pulls only the
        rows prev does not touch, and forward the rest once prev's push has landed."""
        return _Prepared(self.tables, features, self.stacked, prev)

    def wait_pushes(self):
        """Waits for the async pushes already started (the next pull then sees them)."""
        pending, self._pending = self._pending, []
        for op in pending:
            op.wait()

    def start_pull(self, prep):
        """Starts the pull of a prepared batch (async mode only: in the sync modes the pull
        needs this step's token, taken by forward)."""
        if self.mode != "async":
            raise RuntimeError("start_pull: only in async mode (sync modes pull under a token)")
        if prep.op is None:
            # The pushes started so far have landed before any row is read: a prefetched row
            # misses at most the current batch's push, and none at all when the batch was
            # prepared against the current one (then only the rows it does not touch go now).
            self.wait_pushes()
            if prep.fresh is not None:
                prep.rest = True
                fresh = prep.batches("fresh")
                if not fresh:
                    return
                prep.op = self.client.pull_many_start(fresh)
            else:
                prep.op = self.client.pull_many_start(prep.batches())

    def _acquire(self):
        n = self.client.shards
        want = np.zeros(n, dtype=np.uint64) if self._tags is None else self._tags + np.uint64(1)
        tags = np.zeros(n, dtype=np.uint64)
        self.client.sync_acquire(self.worker, want, tags, timeout_ms=self.timeout_ms)
        return tags

    def _pull(self, prep, train):
        if prep.op is not None or prep.rest:
            if prep.op is not None:
                prep.op.wait()
                prep.op = None
            if prep.rest:
                # The rows the previous batch touched: read after its push has landed.
                prep.rest = False
                self.wait_pushes()
                rest = prep.batches("rest")
                if rest:
                    self.client.pull_many(rest)
            return
        if not train:
            # Evaluation: the rows as they are, nothing created, no step token.
            self.wait_pushes()
            self.client.pull_many(prep.batches(), readonly=True)
            return
        if self.mode == "async":
            self.wait_pushes()
        else:
            prep.token = self._acquire()
        self.client.pull_many(prep.batches())

    def _push(self, prep, grads):
        batches = []
        for (cfg, uniq, _, _), g in zip(prep.parts, grads):
            if g is None:
                g = torch.zeros((len(uniq), cfg.dim))
            g = g.detach().to(torch.float32).contiguous().numpy()
            batches.append((cfg.table_id, cfg.dim, uniq, g))
        if self.mode == "async":
            self._pending.append(self.client.push_many_start(batches, unique=True))
        else:
            self.client.push_step(self.worker, prep.token, batches, unique=True)
            self._tags = prep.token

    def forward(self, features, prepared=None):
        prep = prepared if prepared is not None else self.prepare(features)
        train = torch.is_grad_enabled()
        self._pull(prep, train)
        rows = [torch.from_numpy(r) for r in prep.rows]
        if train:
            rows = [r.requires_grad_() for r in rows]
            out = _Rows.apply(self, prep, *rows)
            rows = list(out) if isinstance(out, tuple) else [out]
        result = {}
        for (cfg, _, inv, spans), w in zip(prep.parts, rows):
            # One lookup per table for all its features (one backward, one gradient buffer),
            # then split per feature.
            if cfg.pooling is None:
                if self.stacked:
                    shape = tuple(inv.shape) if inv.ndim == 2 else (len(inv), 1)
                    result[cfg.name] = _Gather.apply(w, inv, shape)
                    continue
                out = _Gather.apply(w, inv, (len(inv),))
                sizes = [hi - lo for _, lo, hi, _ in spans]
            else:
                offs = torch.cat([o + lo for _, lo, _, o in spans]) if len(spans) > 1 \
                    else spans[0][3]
                out = F.embedding_bag(inv, w, offs, mode=cfg.pooling)
                sizes = [o.numel() for _, _, _, o in spans]
            for (f, _, _, _), part in zip(spans, torch.split(out, sizes)):
                result[f] = part
        return result

    def finish(self):
        """This worker has no more batches: waits for its pushes and, in the sync modes,
        leaves the job so the others stop waiting for it."""
        self.wait_pushes()
        if self.mode != "async" and not self._left:
            self.client.sync_leave(self.worker)
            self._left = True


class TrainPipeline:
    """Runs train_step over batches while the next batch is read and deduplicated on a
    background thread and, in async mode, its rows are pulled (started right after the current
    batch's rows arrived, so they overlap its compute).

    emb_staleness: how many of this worker's own pushes a row it reads may miss (the C
    trainer's --emb-staleness of hybrid mode). 0 (default): the prefetch pulls only the rows
    the current batch does not touch; the others are pulled after the current batch's push has
    landed, so no row misses this worker's own updates (other workers' pushes land on arrival,
    as in async). 1: the whole next batch is prefetched, and a row the current batch touches
    comes without that batch's update (one step stale), as before; with several workers that
    cost AUC (docs/python.md).

    batches: an iterator of (features, extra) where features is the dict forward takes; extra
    is handed to train_step(result_of_forward, extra) with the forward's output.
    """

    def __init__(self, collection, batches, prefetch_rows=True, emb_staleness=0):
        if emb_staleness not in (0, 1):
            raise ValueError("emb_staleness %r: want 0 (no own update missed) or 1 (one step "
                             "stale)" % (emb_staleness,))
        self.ec = collection
        self.it = iter(batches)
        self.prefetch_rows = prefetch_rows and collection.mode == "async"
        self.emb_staleness = emb_staleness
        self._next = None
        self._thread = None
        self._error = None

    def _load(self, prev):
        try:
            item = next(self.it, None)
            self._next = None if item is None else (self.ec.prepare(item[0], prev), item[1])
        except BaseException as e:  # handed to the caller's thread
            self._error = e

    def _start_load(self, cur=None):
        # Split the next batch's ids against the current one's only where it pays: rows are
        # prefetched and must not miss the current batch's push.
        prev = cur[0] if cur is not None and self.prefetch_rows and self.emb_staleness == 0 \
            else None
        self._thread = threading.Thread(target=self._load, args=(prev,), daemon=True)
        self._thread.start()

    def _take(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._next

    def run(self, train_step):
        """Calls train_step(embeddings, extra) for every batch; returns how many ran."""
        self._start_load()
        cur = self._take()
        if cur is not None:
            self._start_load(cur)
        steps = 0
        while cur is not None:
            prep, extra = cur
            emb = self.ec(None, prepared=prep)
            nxt = self._take()
            if nxt is not None and self.prefetch_rows:
                self.ec.start_pull(nxt[0])
            train_step(emb, extra)
            steps += 1
            cur = nxt
            if cur is not None:
                self._start_load(cur)
        return steps


LR_RULES = {"sqrt": lambda w: w ** 0.5, "linear": float, "none": lambda w: 1.0}


def scale_dense_lr(optimizer, workers=None, rule="sqrt"):
    """Sets the learning rate of every parameter group of a dense optimizer for W workers that
    average their gradients (DDP): W times fewer steps, each over a W times larger batch. The
    rate the group was built with is the one-worker rate; it becomes rate * sqrt(W) ("sqrt",
    Adam's usual rule and what `granary train` gives its dense parameters in sync and hybrid
    modes), rate * W ("linear", SGD's) or stays ("none"). workers: default torch.distributed's
    world size (1 when no process group is up). The one-worker rate is kept in the group
    ("granary_base_lr"), so calling this again does not compound. Returns the factor. The
    embedding rows need nothing: each row's optimizer step on the shards depends on its own
    gradients, and a row gets as many updates whatever W."""
    if rule not in LR_RULES:
        raise ValueError("lr rule %r: want one of %s" % (rule, ", ".join(sorted(LR_RULES))))
    if workers is None:
        import torch.distributed as dist
        workers = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if int(workers) < 1:
        raise ValueError("workers %r: want at least 1" % (workers,))
    factor = LR_RULES[rule](int(workers))
    for g in optimizer.param_groups:
        base = g.setdefault("granary_base_lr", g["lr"])
        g["lr"] = base * factor
    return factor
