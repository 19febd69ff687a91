#!/usr/bin/python3
"""Benchmark: PyTorch with its embeddings on granary, against plain PyTorch and `granary train`.

DLRM dim 16 (bottom 64,32, top 128,64), batch 1024, on the same generated Criteo files:
  torch          plain PyTorch: nn.Embedding(sparse=True) + Adagrad, dense Adam
                 (bench/torch_dlrm.py, the training benchmark's baseline), run in one process
                 and in --torch-workers DDP processes (tables replicated, sparse gradients
                 all-reduced over gloo); the faster is the baseline
  torch_granary  PyTorch with an EmbeddingCollection on a 2-shard embedded granary cluster:
                 rows pulled and deduplicated in C, Adagrad on the shards, dense Adam in
                 PyTorch under DDP in --workers processes (default 2), the next batch
                 prefetched without missing the worker's own updates (examples/torch_dlrm.py)
  granary        `granary train` on a 2-shard embedded cluster (C DLRM, OpenBLAS)
Each prints its training examples/s (training loop only: both PyTorch sides parse the TSV into
tensors before their clocks start, plain PyTorch also building its vocabularies; with
--preload 0 granary's side parses inside its pipeline) and test AUC. Plain PyTorch's Adagrad is
the shards' (initial accumulator 1e-7, eps 1e-8) and a test value training never saw reads a
row of zeros on both sides (bench/torch_dlrm.py).
Run as `python3 bench/torch_granary.py --json` or `granary bench torch --json`; the final line
is JSON with torch_examples_per_sec, torch_auc, torch_granary_examples_per_sec,
torch_granary_auc, granary_examples_per_sec, granary_auc and the ratios.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PY = "/usr/bin/python3"


def run_json(cmd, env=None):
    """Runs cmd; returns the last stdout line that parses as a JSON object."""
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit("bench torch: %s failed (%d):\n%s" % (cmd[1] if cmd[0] == PY else cmd[0],
                                                              r.returncode, r.stderr[-2000:]))
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit("bench torch: no JSON line from %s" % " ".join(cmd))


def main(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch + granary vs PyTorch vs granary train")
    ap.add_argument("--rows", type=int, default=200000, help="training rows (default 200000)")
    ap.add_argument("--test-rows", type=int, default=20000)
    ap.add_argument("--data", help="use DIR/train.tsv and DIR/test.tsv instead of generating")
    # 1 by default: on 2 cores both PyTorch runs were faster with 1 thread than with 2 (plain
    # PyTorch 2.4-2.8x, PyTorch + granary 1.7x; docs/benchmarks.md, session 4).
    ap.add_argument("--threads", type=int, default=1, help="torch threads (both PyTorch runs)")
    ap.add_argument("--workers", type=int, default=2,
                    help="PyTorch + granary worker processes (DDP; default 2: docs/python.md)")
    # Plain PyTorch's other configuration: N processes under DDP, every table replicated, the
    # sparse gradients all-reduced over gloo. The faster of it and the one-process run is the
    # baseline (a baseline may only get stronger). 0 or 1: only the one-process run.
    ap.add_argument("--torch-workers", type=int, default=2,
                    help="plain PyTorch DDP processes also tried (0: skip)")
    ap.add_argument("--granary-workers", type=int, default=2, help="granary train --workers")
    # Both PyTorch sides get the same data treatment: plain PyTorch's TSV is parsed into
    # tensors before its clock starts, so PyTorch + granary parses its share before its clock
    # too (examples/torch_dlrm.py --preload); 0 times granary's parsing inside its loop (before).
    ap.add_argument("--preload", type=int, default=1, choices=[0, 1],
                    help="PyTorch + granary parses its data before its timed loop, as plain "
                         "PyTorch does (default 1)")
    # The granary side's DLRM interaction: granary's C kernel (the C trainer's, exposed by the
    # module as granary.dlrm.Interaction) or torch's batched matmuls, as plain PyTorch computes it.
    ap.add_argument("--interaction", default="granary", choices=["granary", "torch"],
                    help="PyTorch + granary's DLRM interaction (default granary's C kernel)")
    ap.add_argument("--build", default=os.environ.get("GR_BUILD_DIR", os.path.join(REPO, "build")))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    granary_bin = os.path.join(a.build, "granary")
    env = dict(os.environ, GRANARY_LOG=os.environ.get("GRANARY_LOG", "warn"))
    tmp = None
    data = a.data
    if not data:
        tmp = data = tempfile.mkdtemp(prefix="bench_torch_granary")
        subprocess.run([granary_bin, "datagen", "--out", data, "--train-rows", str(a.rows),
                        "--test-rows", str(a.test_rows)], check=True, stdout=subprocess.DEVNULL)
    train, test = os.path.join(data, "train.tsv"), os.path.join(data, "test.tsv")
    try:
        plain = [PY, os.path.join(HERE, "torch_dlrm.py"), "--train", train, "--test", test,
                 "--threads", str(a.threads), "--dim", "16", "--bottom", "64,32", "--top",
                 "128,64", "--lr-emb", "0.05", "--lr-dense", "0.001", "--batch", "1024"]
        print("bench torch: plain PyTorch (bench/torch_dlrm.py) ...", file=sys.stderr)
        t1 = run_json(plain, env)
        tddp = None
        if a.torch_workers > 1:
            print("bench torch: plain PyTorch, %d DDP processes ..." % a.torch_workers,
                  file=sys.stderr)
            tddp = run_json(plain + ["--workers", str(a.torch_workers)], env)
        t = t1 if tddp is None or t1["examples_per_sec"] >= tddp["examples_per_sec"] else tddp
        print("bench torch: PyTorch + granary (examples/torch_dlrm.py) ...", file=sys.stderr)
        tg = run_json([PY, os.path.join(REPO, "examples", "torch_dlrm.py"), "--train", train,
                       "--test", test, "--shards", "2", "--threads", str(a.threads),
                       "--workers", str(a.workers), "--batch", "1024", "--json",
                       "--interaction", a.interaction] +
                      (["--preload"] if a.preload else []), env)
        print("bench torch: granary train ...", file=sys.stderr)
        mfile = os.path.join(data, "granary-metrics.json")
        subprocess.run([granary_bin, "train", "--train", train, "--test", test, "--shards", "2",
                        "--workers", str(a.granary_workers), "--batch", "1024", "--progress",
                        "0", "--metrics-out", mfile], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=env)
        gm = json.load(open(mfile))
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    res = {
        "torch_examples_per_sec": t["examples_per_sec"], "torch_auc": t["auc"],
        "torch_granary_examples_per_sec": tg["examples_per_sec"], "torch_granary_auc": tg["auc"],
        "granary_examples_per_sec": gm["examples_per_sec"], "granary_auc": gm["auc"],
        "torch_granary_vs_torch": tg["examples_per_sec"] / t["examples_per_sec"],
        "torch_granary_auc_minus_torch": tg["auc"] - t["auc"],
        "granary_vs_torch": gm["examples_per_sec"] / t["examples_per_sec"],
        "rows": a.rows if not a.data else None, "threads": a.threads,
        "torch_granary_workers": a.workers, "granary_workers": a.granary_workers,
        # the baseline's configuration, and both plain PyTorch runs
        "torch_workers": t.get("workers", 1),
        "torch_1p_examples_per_sec": t1["examples_per_sec"], "torch_1p_auc": t1["auc"],
        "torch_granary_vs_torch_1p": tg["examples_per_sec"] / t1["examples_per_sec"],
        "torch_ddp_workers": a.torch_workers if tddp else 0,
        "torch_ddp_examples_per_sec": tddp["examples_per_sec"] if tddp else None,
        "torch_ddp_auc": tddp["auc"] if tddp else None,
        "torch_granary_vs_torch_ddp": tg["examples_per_sec"] / tddp["examples_per_sec"]
        if tddp else None,
        "torch_granary_lr_rule": tg.get("lr_rule"),
        "torch_granary_emb_staleness": tg.get("emb_staleness"),
        # CPU milliseconds per 1024 training examples, every process and thread of each run
        # (the load changes them far less than examples/s)
        "torch_1p_cpu_ms_per_1024": t1.get("cpu_ms_per_1024"),
        "torch_ddp_cpu_ms_per_1024": tddp.get("cpu_ms_per_1024") if tddp else None,
        "torch_granary_cpu_ms_per_1024": tg.get("cpu_ms_per_1024"),
        "torch_granary_preload": bool(tg.get("preload")),
        "torch_granary_interaction": tg.get("interaction"),
        # how the workers reach the embedded shards ("unix": AF_UNIX, session 7; "tcp" before)
        "torch_granary_transport": tg.get("transport"),
        "torch_granary_shards_cpu_ms_per_1024": 1e3 * tg["shards_cpu_seconds"] * 1024 /
        max(tg["examples"], 1) if tg.get("shards_cpu_seconds") is not None else None,
    }
    print("%-52s %12s %8s" % ("DLRM dim 16, batch 1024", "examples/s", "AUC"))
    print("%-52s %12.0f %8.4f" % ("PyTorch, nn.Embedding sparse + Adagrad (%d threads)"
                                  % a.threads, t1["examples_per_sec"], t1["auc"]))
    if tddp:
        print("%-52s %12.0f %8.4f" % ("PyTorch, the same, %d DDP processes" % a.torch_workers,
                                      tddp["examples_per_sec"], tddp["auc"]))
    print("%-52s %12.0f %8.4f" % ("PyTorch + granary, 2 shards (%d worker(s))" % a.workers,
                                  tg["examples_per_sec"], tg["auc"]))
    print("%-52s %12.0f %8.4f" % ("granary train, 2 shards, %d workers" % a.granary_workers,
                                  gm["examples_per_sec"], gm["auc"]))
    print("PyTorch + granary / PyTorch (its faster run, %d process(es)): %.2fx examples/s "
          "(target >= 2), AUC %+.4f (target within 0.002)"
          % (res["torch_workers"], res["torch_granary_vs_torch"],
             res["torch_granary_auc_minus_torch"]))
    if a.json:
        print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
