"""GraphSAGE in DGL on a graphscale graph file, with graphscale's model and schedule: the
side-by-side baseline of `bench/run_benchmarks.sh sage` (issue 34).

Same as `graphscale --model sage` with its defaults: GraphSAGE-mean (DGL's SAGEConv 'mean':
W_self h_v + W_neigh mean(h_u) + b), 2 layers, hidden 128, ReLU and dropout 0.5 after the
hidden layer, 25 neighbours sampled at the seeds' hop and 10 at the next (DGL lists fan-outs
from the input layer: [10, 25]), Adam at 0.01 with weight decay 5e-4 (L2 in the gradient, as
graphscale's), mean cross-entropy over a step's seeds, rows scaled to sum 1 when no feature is
negative (graphscale's --feature-norm auto). Each epoch scores the validation split with every
neighbour (full-graph layers) and the test accuracy is that of the best validation epoch's
parameters. Neighbour sampling is DGL's own (C++), in the training process (num_workers 0).

Prints one JSON line: seeds per second of the training steps alone (sampling, forward,
backward, optimizer; not the per-epoch validation), test and validation accuracy, versions.

Needs torch and dgl (DGL 2.1.0 on PyPI wheels for torch <= 2.2.1, with torchdata 0.7.1 and
pyyaml, pandas), numpy < 2 and h5py; `bench/run_benchmarks.sh sage` makes that venv.
"""

import argparse
import json
import time

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import dgl
from dgl.nn import SAGEConv


def load(path):
    with h5py.File(path, "r") as f:
        src = f["src"][:].astype(np.int64)
        dst = f["dst"][:].astype(np.int64)
        x = f["features"][:].astype(np.float32)
        offsets = f["label_offsets"][:]
        ids = f["label_ids"][:]
        split = f["split"][:]
    n = x.shape[0]
    g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=n)
    g = dgl.to_bidirected(g)
    if (x >= 0).all():
        s = x.sum(axis=1, keepdims=True)
        x = np.divide(x, s, out=np.zeros_like(x), where=s > 0)
    has = offsets[1:] > offsets[:-1]
    y = np.zeros(n, dtype=np.int64)
    y[has] = ids[offsets[:-1][has]]
    return g, torch.from_numpy(x), torch.from_numpy(y), split


class Sage(nn.Module):
    def __init__(self, dims, dropout):
        super().__init__()
        self.layers = nn.ModuleList(
            SAGEConv(a, b, "mean") for a, b in zip(dims[:-1], dims[1:])
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks, h):
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i + 1 < len(self.layers):
                h = self.dropout(F.relu(h))
        return h


def accuracy(model, g, x, y, idx):
    model.eval()
    with torch.no_grad():
        h = model([g] * len(model.layers), x)
    model.train()
    return (h[idx].argmax(1) == y[idx]).float().mean().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graph", required=True)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=0, help="0: graphscale's default rule")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--fanout", default="25,10", help="seeds' hop first, as graphscale")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--weight-decay", type=float, default=5e-4)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bf16", action="store_true",
                    help="the steps' forward under torch.autocast(bfloat16) (graphscale's --compute-dtype bf16)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    dgl.seed(a.seed)
    g, x, y, split = load(a.graph)
    train = torch.from_numpy(np.flatnonzero(split == 1))
    valid = torch.from_numpy(np.flatnonzero(split == 2))
    test = torch.from_numpy(np.flatnonzero(split == 3))
    batch = a.batch_size or min(512, -(-len(train) // 4))
    classes = max(int(y.max()) + 1, 2)
    dims = [x.shape[1], a.hidden, classes]
    model = Sage(dims, a.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    fanout = [int(f) for f in a.fanout.split(",")][::-1]
    sampler = dgl.dataloading.NeighborSampler(fanout)
    loader = dgl.dataloading.DataLoader(
        g, train, sampler, batch_size=batch, shuffle=True, drop_last=False, num_workers=0
    )
    best, best_state, steps_s = -1.0, None, 0.0
    for _ in range(a.epochs):
        t = time.perf_counter()
        for _, seeds, blocks in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                out = model(blocks, x[blocks[0].srcdata[dgl.NID]])
                loss = F.cross_entropy(out.float(), y[seeds])
            opt.zero_grad()
            loss.backward()
            opt.step()
        steps_s += time.perf_counter() - t
        v = accuracy(model, g, x, y, valid)
        if v > best:
            best = v
            best_state = {k: t.clone() for k, t in model.state_dict().items()}
    model.load_state_dict(best_state)
    print(
        json.dumps(
            {
                "system": "dgl",
                "dgl": dgl.__version__,
                "torch": torch.__version__,
                "threads": a.threads,
                "autocast_bf16": a.bf16,
                "graph": a.graph,
                "epochs": a.epochs,
                "batch_size": batch,
                "train_seeds": int(len(train)) * a.epochs,
                "steps_seconds": steps_s,
                "seeds_per_s": len(train) * a.epochs / steps_s,
                "valid_accuracy": best,
                "test_accuracy": accuracy(model, g, x, y, test),
            }
        )
    )


if __name__ == "__main__":
    main()
