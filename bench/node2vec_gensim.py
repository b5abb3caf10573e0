#!/usr/bin/env python
"""node2vec as the reference implementation runs it: second-order walks + gensim Word2Vec with
its defaults (skip-gram, 5 negatives, sample 1e-3), written as HDF5 for `graphscale eval`.

Usage: python bench/node2vec_gensim.py --graph ../shared/data/blogcatalog/edges.tsv --p 0.25 --q 0.25 \
           --out n2v.h5 [--num-walks 10 --walk-length 80 --dim 128 --window 10 --workers 2 --seed 0]

It answers whether a number graphscale misses is reached by the reference pipeline on the same
data and machine (docs/results.md). Walks use exact rejection sampling (KnightKing): propose a
uniform neighbour x of v, accept with a(t, x) / max(1/p, 1, 1/q), where a is 1/p for x = t, 1 for
x adjacent to t and 1/q otherwise. Needs numpy, numba, scipy, gensim, h5py and
../shared/anchors/graphio.py.
"""
import argparse
import json
import os
import sys
import time

import h5py
import numpy as np
from numba import njit, prange

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "anchors"))
from graphio import load_graph  # noqa: E402


@njit(cache=False)
def _has_edge(indptr, indices, t, x):
    lo, hi = indptr[t], indptr[t + 1]
    while lo < hi:
        mid = (lo + hi) // 2
        if indices[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo < indptr[t + 1] and indices[lo] == x


@njit(parallel=True, cache=False)
def _node2vec_walks(indptr, indices, starts, walk_length, p, q, seed):
    out = np.empty((starts.shape[0], walk_length), dtype=np.int32)
    lengths = np.empty(starts.shape[0], dtype=np.int32)
    ip, iq = 1.0 / p, 1.0 / q
    amax = max(ip, 1.0, iq)
    for i in prange(starts.shape[0]):
        np.random.seed(seed + i)
        cur, prev = starts[i], -1
        out[i, 0] = cur
        length = 1
        for step in range(1, walk_length):
            s, e = indptr[cur], indptr[cur + 1]
            if e == s:
                break
            while True:
                x = indices[s + np.random.randint(0, e - s)]
                if prev < 0:
                    break
                u = np.random.random() * amax
                if x == prev:
                    a = ip
                elif _has_edge(indptr, indices, prev, x):
                    a = 1.0
                else:
                    a = iq
                if u < a:
                    break
            prev, cur = cur, x
            out[i, step] = cur
            length += 1
        lengths[i] = length
    return out, lengths


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graph", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--p", type=float, default=1.0)
    ap.add_argument("--q", type=float, default=1.0)
    ap.add_argument("--num-walks", type=int, default=10)
    ap.add_argument("--walk-length", type=int, default=80)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from gensim.models import Word2Vec

    A, _ = load_graph(args.graph)
    A.sort_indices()
    n = A.shape[0]
    indptr, indices = A.indptr.astype(np.int64), A.indices.astype(np.int32)
    rng = np.random.default_rng(args.seed)
    starts = np.concatenate([rng.permutation(n) for _ in range(args.num_walks)]).astype(np.int32)
    t0 = time.perf_counter()
    walks, lengths = _node2vec_walks(indptr, indices, starts, args.walk_length, args.p, args.q, args.seed)
    t_walk = time.perf_counter() - t0
    sentences = [list(map(str, w[:L].tolist())) for w, L in zip(walks, lengths)]
    t1 = time.perf_counter()
    model = Word2Vec(sentences=sentences, vector_size=args.dim, window=args.window, min_count=0, sg=1,
                     workers=args.workers, epochs=1, seed=args.seed)
    t_train = time.perf_counter() - t1
    emb = np.zeros((n, args.dim), np.float32)
    for key, idx in model.wv.key_to_index.items():
        emb[int(key)] = model.wv.vectors[idx]
    with h5py.File(args.out, "w") as f:
        f.create_dataset("embeddings", data=emb)
    print(json.dumps(dict(p=args.p, q=args.q, walk_s=round(t_walk, 1), train_s=round(t_train, 1),
                          tokens=int(lengths.sum()))))


if __name__ == "__main__":
    main()
