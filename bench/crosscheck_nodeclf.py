#!/usr/bin/env python3
"""Cross-check `graphscale eval nodeclf` against the reference protocol (scikit-learn liblinear,
../shared/anchors/eval_nodeclf.py) on the same embeddings and the same splits.

  python bench/crosscheck_nodeclf.py --bin target/release/graphscale --emb emb.h5 \
      --labels labels.tsv [--fractions 0.1 0.5 0.9] [--shuffles 3] [--tolerance 0.5]

Prints both results and the differences in F1 points; exits 1 when any Micro- or Macro-F1
differs by more than --tolerance points. Needs numpy, scipy, scikit-learn and h5py.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ANCHORS = os.environ.get("ANCHORS", os.path.join(HERE, "..", "..", "shared", "anchors"))
if not os.path.exists(os.path.join(ANCHORS, "eval_nodeclf.py")):
    sys.exit(f"crosscheck: {ANCHORS}/eval_nodeclf.py not found (set ANCHORS=...)")
sys.path.insert(0, ANCHORS)
from eval_nodeclf import evaluate  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--emb", required=True)
    ap.add_argument("--labels", required=True)
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.5, 0.9])
    ap.add_argument("--shuffles", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tolerance", type=float, default=0.5)
    a = ap.parse_args()

    X = h5py.File(a.emb, "r")["embeddings"][:].astype(np.float64)
    n = X.shape[0]
    names = {}
    Y = []
    for line in open(a.labels):
        t = line.split()
        if len(t) != 2 or t[0].startswith("#"):
            continue
        Y.append((int(t[0]), names.setdefault(t[1], len(names))))
    L = np.zeros((n, len(names)), dtype=np.int8)
    for i, l in Y:
        L[i, l] = 1
    # The reference's splits: permutations of the labeled nodes from numpy's default_rng(seed).
    labeled = np.flatnonzero(L.sum(1) > 0)
    rng = np.random.default_rng(a.seed)
    perms = [labeled[rng.permutation(len(labeled))].tolist() for _ in range(a.shuffles)]
    ref, _ = evaluate(X, L, a.fractions, a.shuffles, a.seed, 1.0, 2)

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"perms": perms}, f)
        splits = f.name
    try:
        out = subprocess.run(
            [a.bin, "eval", "nodeclf", "--embeddings", a.emb, "--labels", a.labels,
             "--train-fractions", ",".join(str(x) for x in a.fractions), "--splits", splits, "--json"],
            check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(splits)
    ours = json.loads(out)["results"]

    worst = 0.0
    rows = []
    for fr in a.fractions:
        r, o = ref[str(fr)], ours[str(fr)]
        dmi = 100 * (o["micro_f1"] - r["micro_f1_mean"])
        dma = 100 * (o["macro_f1"] - r["macro_f1_mean"])
        worst = max(worst, abs(dmi), abs(dma))
        rows.append({"fraction": fr, "sklearn_micro": round(100 * r["micro_f1_mean"], 2),
                     "graphscale_micro": round(100 * o["micro_f1"], 2), "diff_micro": round(dmi, 3),
                     "sklearn_macro": round(100 * r["macro_f1_mean"], 2),
                     "graphscale_macro": round(100 * o["macro_f1"], 2), "diff_macro": round(dma, 3)})
    print(json.dumps({"shuffles": a.shuffles, "tolerance_points": a.tolerance,
                      "max_abs_diff_points": round(worst, 3), "rows": rows}, indent=1))
    sys.exit(0 if worst <= a.tolerance else 1)


if __name__ == "__main__":
    main()
