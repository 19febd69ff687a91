#!/usr/bin/env python3
"""Scores a Criteo-layout TSV file through a serving replica's POST /v1/predict (batches of
1000 lines, label stripped) and prints the AUC of the served predictions and the examples/s.
Usage: scripts/serve-auc.py HOST:PORT FILE   (standard library only)"""
import json
import sys
import time
import urllib.request


def auc(scores, labels):
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):  # tied scores share their average rank
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    pos = sum(labels)
    neg = len(labels) - pos
    return (sum(r for r, y in zip(ranks, labels) if y) - pos * (pos + 1) / 2) / (pos * neg)


def main():
    addr, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        rows = [line.rstrip("\n").split("\t", 1) for line in f if line.strip()]
    labels = [int(r[0]) for r in rows]
    preds = []
    t0 = time.time()
    for i in range(0, len(rows), 1000):
        body = json.dumps({"lines": [r[1] for r in rows[i:i + 1000]]}).encode()
        req = urllib.request.Request("http://%s/v1/predict" % addr, body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req) as r:
            preds += json.load(r)["predictions"]
    dt = time.time() - t0
    print("%.6f %d %.0f" % (auc(preds, labels), len(preds), len(preds) / dt))


if __name__ == "__main__":
    main()
