#!/usr/bin/python3
"""Where a training step's CPU time goes, both sides of `granary bench torch` (docs/benchmarks.md).

    python3 bench/torch_stages.py --train DIR/train.tsv [--steps 60] [--threads 1] [--rounds 3]
    python3 bench/torch_stages.py --allreduce STEPS   # the two DDP runs' gloo all-reduces

Runs the same DLRM (dim 16, bottom 64,32, top 128,64, batch 1024) step by step, without the
pipeline, and times every stage of every step with the thread's CPU clock (time.thread_time,
which a loaded machine disturbs far less than the wall clock):

  plain PyTorch (bench/torch_dlrm.py's model: 26 nn.Embedding(sparse=True), Adagrad, dense Adam):
    lookup, dense forward (bottom MLP, interaction, top MLP, loss), backward (dense and the
    sparse embedding gradients), the embeddings' Adagrad step, Adam, zero_grad.
  PyTorch + granary (granary.dlrm, a 2-shard embedded cluster): prepare (dedup; the pipeline
    runs it on its loader thread), pull (the wait; prefetched in the pipeline), the
    collection's forward (gather), dense forward, backward (dense and the C segment sum),
    push (started, not waited for), Adam, the loss read-out. "other threads" is the process's
    CPU time beyond the main thread's: the shards serving pull and push, the client's I/O.

Prints the median per step of each stage over all rounds (the rounds alternate the two sides),
and the critical path the pipeline leaves on the main thread. With --json a last JSON line.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.environ.get("GR_BUILD_DIR") or os.path.join(REPO, "build"),
                                "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_dlrm  # noqa: E402
import granary  # noqa: E402
from granary import dlrm  # noqa: E402

B = 1024
tt = time.thread_time


class Stages:
    def __init__(self):
        self.per = {}

    def add(self, name, secs):
        self.per.setdefault(name, []).append(secs * 1e3)

    def medians(self):
        return {k: statistics.median(v) for k, v in self.per.items()}


def plain_round(st, y, d, c, steps):
    torch.manual_seed(1)
    model = torch_dlrm.DLRM([int(c[:, s].max()) + 1 for s in range(26)], 16, [64, 32], [128, 64])
    oe = torch.optim.Adagrad(list(model.emb.parameters()), lr=0.05,  # the benchmark's settings
                             initial_accumulator_value=torch_dlrm.ADAGRAD[0],
                             eps=torch_dlrm.ADAGRAD[1])
    od = torch.optim.Adam(list(model.bottom.parameters()) + list(model.top.parameters()), lr=1e-3)
    lossf = torch.nn.BCEWithLogitsLoss()
    for k in range(steps):
        i = k * B
        yy, dd, cc = y[i:i + B], d[i:i + B], c[i:i + B]
        t0 = tt()
        oe.zero_grad()
        od.zero_grad()
        t1 = tt()
        x = model.bottom(dd)
        t2 = tt()
        embs = [e(cc[:, s]) for s, e in enumerate(model.emb)]
        t3 = tt()
        t = torch.stack([x] + embs, dim=1)
        z = torch_dlrm.Gram.apply(t)
        out = model.top(torch.cat([x, z.flatten(1).index_select(1, model.pairs)], 1)).squeeze(1)
        loss = lossf(out, yy)
        t4 = tt()
        loss.backward()
        t5 = tt()
        oe.step()
        t6 = tt()
        od.step()
        t7 = tt()
        st.add("zero_grad", t1 - t0)
        st.add("lookup", t3 - t2)
        st.add("dense forward", (t2 - t1) + (t4 - t3))
        st.add("backward", t5 - t4)
        st.add("embedding Adagrad", t6 - t5)
        st.add("dense Adam", t7 - t6)
        st.add("total", t7 - t0)


def granary_round(st, path, steps, transport="unix"):
    cluster = granary.LocalCluster(2)
    # examples/torch_dlrm.py's default: the embedded shards over AF_UNIX
    client = granary.Client(servers=cluster.local_servers if transport == "unix"
                            else cluster.servers)
    ec = dlrm.embedding_collection(client, dim=16, seed=1, reset=True)
    model = dlrm.DenseDLRM(16, "64,32", "128,64", 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = list(dlrm.criteo_batches(path, B, max_batches=steps))
    push = [0.0]
    orig_push = ec._push

    def timed_push(prep, grads):
        a = tt()
        orig_push(prep, grads)
        push[0] += tt() - a
    ec._push = timed_push
    for features, (labels, dense) in batches:
        p0 = time.process_time()
        t0 = tt()
        prep = ec.prepare(features)
        t1 = tt()
        ec.start_pull(prep)
        prep.op.wait()
        prep.op = None
        t2 = tt()

        class Pulled:  # forward finds the rows in place
            def wait(self):
                pass
        prep.op = Pulled()
        emb = ec(None, prepared=prep)
        embs = dlrm.stacked_embeddings(ec, emb)
        t3 = tt()
        logits = model(dense, embs)
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        t4 = tt()
        push[0] = 0.0
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t5 = tt()
        opt.step()
        t6 = tt()
        float(loss)
        t7 = tt()
        ec.wait_pushes()
        p1 = time.process_time()
        st.add("prepare (loader thread)", t1 - t0)
        st.add("pull", t2 - t1)
        st.add("collection forward", t3 - t2)
        st.add("dense forward", t4 - t3)
        st.add("backward", t5 - t4 - push[0])
        st.add("push", push[0])
        st.add("dense Adam", t6 - t5)
        st.add("loss read-out", t7 - t6)
        main = tt() - t0
        st.add("total main thread", main)
        st.add("other threads", (p1 - p0) - main)
    ec.finish()
    client.close()
    cluster.stop()


def allreduce_worker(rank, port, calls, threads, out_path):
    """One of two gloo processes: per step, the dense DLRM gradient all-reduced as DDP sends it
    (one flat float32 tensor of every dense parameter), and the 26 sparse embedding gradients
    plain PyTorch's DDP run all-reduces (a sparse (vocab, 16) tensor of 1024 rows each)."""
    import torch.distributed as dist
    dlrm.set_threads(threads)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=2)
    n_dense = sum(p.numel() for p in dlrm.DenseDLRM().parameters())
    flat = torch.zeros(n_dense)
    g = torch.Generator().manual_seed(rank)
    sparse = [torch.sparse_coo_tensor(torch.randint(0, 20000, (1, B), generator=g),
                                      torch.randn(B, 16, generator=g), (20000, 16))
              for _ in range(26)]
    res = {"dense_floats": n_dense, "dense": [], "sparse": []}
    for _ in range(calls):
        t, c = time.perf_counter(), time.process_time()
        dist.all_reduce(flat)
        res["dense"].append((time.perf_counter() - t, time.process_time() - c))
        t, c = time.perf_counter(), time.process_time()
        for sp in sparse:
            dist.all_reduce(sp)
        res["sparse"].append((time.perf_counter() - t, time.process_time() - c))
    dist.barrier()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def allreduce_cost(calls, threads):
    """Median wall and process CPU ms per step of the two all-reduces (rank 0)."""
    import socket
    import tempfile
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mktemp(prefix="torch_allreduce", suffix=".json")
    mp.start_processes(allreduce_worker, args=(port, calls, threads, out), nprocs=2, join=True,
                       start_method="spawn")
    res = json.load(open(out))
    os.unlink(out)
    med = {k: (1e3 * statistics.median(w for w, _ in res[k]),
               1e3 * statistics.median(c for _, c in res[k])) for k in ("dense", "sparse")}
    print("gloo all-reduce between 2 processes, median ms per step over %d steps (wall, "
          "process CPU, every thread):" % calls)
    print("  dense gradient (%d floats, PyTorch + granary's DDP): %.3f, %.3f"
          % (res["dense_floats"], *med["dense"]))
    print("  26 sparse gradients of 1024 rows x 16 (plain PyTorch's DDP): %.3f, %.3f"
          % med["sparse"])
    return {"allreduce_dense_ms": med["dense"], "allreduce_sparse_ms": med["sparse"],
            "dense_floats": res["dense_floats"]}


def main(argv=None):
    ap = argparse.ArgumentParser(description="per-stage CPU time of both PyTorch sides")
    ap.add_argument("--train")
    ap.add_argument("--allreduce", type=int, default=0, metavar="STEPS",
                    help="instead: time the gloo all-reduces of the two DDP runs of `granary "
                         "bench torch` over STEPS steps")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--transport", default="unix", choices=["unix", "tcp", "both"],
                    help="how the granary side reaches its shards (default unix, as "
                         "examples/torch_dlrm.py); both: alternate the two, side by side")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.allreduce:
        res = allreduce_cost(a.allreduce, a.threads)
        if a.json:
            print(json.dumps(res))
        return res
    if not a.train:
        ap.error("--train is required (unless --allreduce)")
    dlrm.set_threads(a.threads)  # torch's and OpenBLAS's (bench/torch_dlrm.py does the same)
    vocabs = [dict() for _ in range(26)]
    y, d, c = torch_dlrm.load(a.train, vocabs, True)
    steps = min(a.steps, len(y) // B)
    ps, gs, gt = Stages(), Stages(), Stages()
    for _ in range(a.rounds):
        plain_round(ps, y, d, c, steps)
        granary_round(gs, a.train, steps, "tcp" if a.transport == "tcp" else "unix")
        if a.transport == "both":
            granary_round(gt, a.train, steps, "tcp")
    pm, gm = ps.medians(), gs.medians()
    print("median CPU ms per step of %d (%d steps x %d rounds, %d torch thread(s))"
          % (B, steps, a.rounds, a.threads))
    print("plain PyTorch:")
    for k, v in pm.items():
        print("  %-26s %7.2f" % (k, v))
    if a.transport == "both":
        tm = gt.medians()
        print("PyTorch + granary:            unix      tcp")
        for k, v in gm.items():
            print("  %-26s %7.2f  %7.2f" % (k, v, tm[k]))
    else:
        print("PyTorch + granary (%s):" % a.transport)
        for k, v in gm.items():
            print("  %-26s %7.2f" % (k, v))
    crit = gm["total main thread"] - gm["prepare (loader thread)"] - gm["pull"]
    res = {"plain": pm, "granary": gm, "granary_critical_path_ms": crit,
           "transport": a.transport,
           "plain_total_ms": pm["total"],
           "bound_ratio": pm["total"] / max(crit, gm["other threads"] +
                                            gm["prepare (loader thread)"])}
    print("critical path of the pipelined main thread %.2f ms; plain / that = %.2fx (the bound "
          "when the other core absorbs the loader and the shards)" % (crit, res["bound_ratio"]))
    if a.transport == "both":
        res["granary_tcp"] = tm
    if a.json:
        print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
