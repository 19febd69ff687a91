#!/usr/bin/python3
"""DLRM on Criteo TSV files in PyTorch with its embedding tables on granary.

    make python
    build/granary datagen --out /tmp/d --train-rows 200000 --test-rows 20000
    python3 examples/torch_dlrm.py --train /tmp/d/train.tsv --test /tmp/d/test.tsv

By default it starts an embedded local cluster of --shards shards in this process (through the
extension); --servers host:port,... uses running `granary server`s instead, and --coord
zk://HOSTS/PATH the shards of a coordinated job (`granary server --coord`, docs/coord.md),
found through its layout. The dense layers are ordinary
torch.nn modules; with --workers N it starts N processes that train them under
DistributedDataParallel over gloo, each reading its share of the file, while the rows go through
granary in the chosen --mode. Prints the test AUC and the training examples/s, and with --json a
final JSON line.
"""
import argparse
import json
import os
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# `make python` (GR_BUILD_DIR names another build, e.g. build/address)
sys.path.insert(0, os.path.join(os.environ.get("GR_BUILD_DIR") or
                                os.path.join(os.path.dirname(HERE), "build"), "python"))

import torch  # noqa: E402

import granary  # noqa: E402
from granary import dlrm  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", required=True)
    p.add_argument("--test")
    p.add_argument("--servers", help="host:port,... of running granary servers")
    p.add_argument("--coord", help="zk://HOSTS/PATH: the shards of a coordinated job")
    p.add_argument("--shards", type=int, default=2, help="embedded cluster size (default 2)")
    p.add_argument("--transport", default="unix", choices=["unix", "tcp"],
                   help="how the workers reach the embedded cluster: its AF_UNIX sockets "
                        "(default; the same protocol without the TCP stack) or loopback TCP")
    p.add_argument("--workers", type=int, default=1, help="worker processes (DDP over gloo)")
    p.add_argument("--schema", help="the files' layout: a schema file (docs/data.md); default "
                   "Criteo TSV")
    p.add_argument("--mode", default="async", choices=sorted(granary.SYNC_MODES))
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--bottom", default="64,32")
    p.add_argument("--top", default="128,64")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dense-lr", type=float, default=1e-3,
                   help="Adam's one-worker lr (default 0.001); with W workers the training "
                        "loop scales it by --lr-rule for the W-times larger global batch")
    p.add_argument("--lr-rule", default="sqrt", choices=["sqrt", "linear", "none"],
                   help="dense lr with W workers: lr * sqrt(W) (default, as granary train), "
                        "lr * W, or lr")
    p.add_argument("--emb-staleness", type=int, default=0, choices=[0, 1],
                   help="own row updates a prefetched pull may miss (0: none, the rows the "
                        "current batch touches are pulled after its push; 1: one step)")
    p.add_argument("--max-steps", type=int, default=0, help="per worker (0: the whole file)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--no-pipeline", action="store_true", help="no prefetch of the next batch")
    p.add_argument("--preload", action="store_true",
                   help="parse this worker's share of the file into tensors before the timed "
                        "loop (as bench/torch_dlrm.py does for plain PyTorch), instead of "
                        "reading it batch by batch inside the loop")
    p.add_argument("--interaction", default="granary", choices=["granary", "torch"],
                   help="DLRM's interaction: granary's C kernel (the trainer's own, default) or "
                        "torch's batched matmuls")
    p.add_argument("--json", action="store_true", help="print a final JSON line")
    return p.parse_args(argv)


def split_file(path, parts):
    """Byte offsets cutting the file into parts ranges at line starts."""
    size = os.path.getsize(path)
    offs = [0]
    with open(path, "rb") as f:
        for i in range(1, parts):
            f.seek(max(size * i // parts, offs[-1]))
            f.readline()
            offs.append(min(f.tell(), size))
    return offs + [size]


def connect(args, servers):
    return granary.Client(coord=args.coord) if args.coord else granary.Client(servers=servers)


def run_worker(rank, args, servers, port, offsets, result_path):
    dlrm.set_threads(args.threads)  # torch's and OpenBLAS's
    ddp = args.workers > 1
    if ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                                world_size=args.workers)
    client = connect(args, servers)
    batches = dlrm.Batches(args.train, args.batch, start=offsets[rank], end=offsets[rank + 1],
                           max_batches=args.max_steps, schema=args.schema)
    ec = dlrm.embedding_collection(client, dim=args.dim, seed=args.seed, mode=args.mode,
                                   features=batches.features, poolings=batches.poolings,
                                   worker=rank, workers=args.workers)
    model = dlrm.DenseDLRM(args.dim, args.bottom, args.top, args.seed, n_dense=batches.n_dense,
                           n_sparse=batches.n_sparse, interaction=args.interaction)
    # broadcast_buffers off: the model's buffers are constant index tensors (the interaction's
    # pairs), and DDP's default broadcasts every buffer from rank 0 before each forward, a
    # collective that made the workers wait for each other once per step on top of the
    # gradients' all-reduce (examples/s +29 % and +44 % in two alternating pairs, the same CPU
    # per example; docs/benchmarks.md, session 6). The gradients live in DDP's buckets.
    trained = DistributedDataParallel(model, broadcast_buffers=False,
                                      gradient_as_bucket_view=True) if ddp else model
    opt = torch.optim.Adam(trained.parameters(), lr=args.dense_lr)
    if args.preload:
        # Parsed ahead of the clock, as plain PyTorch's tensors are (the ids are still
        # deduplicated and pulled inside the loop); features and poolings stay on `batches`.
        batches = list(batches)
        if ddp:
            dist.barrier()  # both clocks start together, not one while the other parses
    cpu0 = time.process_time()
    losses, examples, secs = dlrm.train(ec, trained, opt, batches, pipeline=not args.no_pipeline,
                                        lr_rule=args.lr_rule, emb_staleness=args.emb_staleness)
    if ddp:
        import torch.distributed as dist
        dist.barrier()  # every worker has pushed: evaluation sees the final rows
    res = {"examples": examples, "seconds": secs, "last_loss": losses[-1] if losses else None,
           "cpu_seconds": time.process_time() - cpu0}
    if rank == 0 and args.test:
        auc, logloss, n = dlrm.evaluate(ec, model, dlrm.Batches(args.test, args.batch,
                                                                schema=args.schema))
        res.update(auc=auc, logloss=logloss, test_examples=n)
    with open(result_path % rank, "w") as f:
        json.dump(res, f)
    if ddp:
        dist.destroy_process_group()
    client.close()


def main(argv=None):
    args = parse_args(argv)
    if args.coord and args.servers:
        raise SystemExit("torch_dlrm: give --servers or --coord, not both")
    cluster = None
    servers = args.servers
    if not servers and not args.coord:
        cluster = granary.LocalCluster(args.shards)
        # The workers are on this machine: AF_UNIX skips loopback TCP's stack and wake-ups
        # (docs/benchmarks.md, session 7).
        servers = cluster.local_servers if args.transport == "unix" else cluster.servers
    import tempfile
    tmp = tempfile.mkdtemp(prefix="torch_dlrm")
    result_path = os.path.join(tmp, "worker-%d.json")
    offsets = split_file(args.train, args.workers)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    try:
        if args.workers == 1:
            run_worker(0, args, servers, 0, offsets, result_path)
        else:
            import torch.multiprocessing as mp
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            mp.start_processes(run_worker, args=(args, servers, port, offsets, result_path),
                               nprocs=args.workers, join=True, start_method="spawn")
    finally:
        if cluster:
            cluster.stop()
    wall = time.perf_counter() - t0
    # This process's CPU: with several workers, the embedded shards' (the workers' own is in
    # their results); with one worker it is the worker, counted there.
    own_cpu = time.process_time() - cpu0 if args.workers > 1 and cluster else 0.0
    res = [json.load(open(result_path % r)) for r in range(args.workers)]
    examples = sum(r["examples"] for r in res)
    train_s = max(r["seconds"] for r in res)
    out = {"examples": examples, "train_seconds": train_s,
           "examples_per_sec": examples / train_s if train_s > 0 else 0.0,
           "auc": res[0].get("auc"), "logloss": res[0].get("logloss"),
           "workers": args.workers, "mode": args.mode, "wall_seconds": wall,
           "lr_rule": args.lr_rule, "emb_staleness": args.emb_staleness,
           "preload": args.preload, "interaction": args.interaction,
           "transport": args.transport if cluster else None,
           # CPU seconds of every process and thread while training (the workers' training
           # loops, and with several workers the embedded shards' whole run, evaluation's
           # pulls included): a figure the machine's load changes little
           "cpu_seconds": sum(r["cpu_seconds"] for r in res) + own_cpu,
           "worker_cpu_seconds": [r["cpu_seconds"] for r in res], "shards_cpu_seconds": own_cpu}
    out["cpu_ms_per_1024"] = 1e3 * out["cpu_seconds"] * 1024 / max(examples, 1)
    print("torch_dlrm: %d examples in %.1f s (%.0f examples/s), %d worker(s), mode %s%s"
          % (examples, train_s, out["examples_per_sec"], args.workers, args.mode,
             ", test AUC %.4f logloss %.4f" % (out["auc"], out["logloss"])
             if out["auc"] is not None else ""))
    if args.json:
        print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
