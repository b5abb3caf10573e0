#!/usr/bin/env python3
"""How much a cache of remote entity rows could save a knowledge-graph job: replays graphscale's
batched schedule over a triple file and counts, per rank, the remote head and tail rows a step
would fetch and how many of them the same rank fetched within the last R steps (a read cache
whose copies live R steps). Negatives are left out: with `--negatives-from shard` (the default)
they are the rank's own rows and are never fetched.

  python3 bench/kg_reuse.py ../shared/data/wn18rr/train.txt [--ranks 4] [--batch-size 1024]
      [--clocks 8 32 128] [--epochs 2] [--seed 0]

Schedule, as `Trainer::train_triples`: each epoch shuffles the triples; each rank takes a
contiguous share and steps through it `batch_size / ranks` triples at a time; a step fetches each
distinct remote entity once; entity e lives on rank e % ranks (`--partition striped`, the
default) with ids in order of first appearance (`graphscale convert`). Also prints the share of
all head/tail references that the most frequent entities hold.
"""
import argparse
import collections
import random


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("triples", help="head<TAB>relation<TAB>tail text")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--clocks", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    ids, triples = {}, []
    with open(a.triples) as f:
        for line in f:
            h, _, t = line.rstrip("\n").split("\t")
            triples.append((ids.setdefault(h, len(ids)), ids.setdefault(t, len(ids))))
    counts = collections.Counter(e for ht in triples for e in ht)
    freq = sorted(counts.values(), reverse=True)
    refs = 2 * len(triples)
    print(f"{len(triples)} triples, {len(counts)} entities referenced, {refs} references")
    for top in (100, 1000, 5000, 10000):
        print(f"  the {top} most frequent entities hold {sum(freq[:top]) / refs:.1%} of references")

    p, per_rank = a.ranks, max(1, -(-a.batch_size // a.ranks))
    for clock in a.clocks:
        rng = random.Random(a.seed)
        order = list(triples)
        fetches = hits = steps = 0
        for _ in range(a.epochs):
            rng.shuffle(order)
            share = -(-len(order) // p)
            for rank in range(p):
                mine = order[rank * share:(rank + 1) * share]
                read_at = {}
                for step, lo in enumerate(range(0, len(mine), per_rank)):
                    steps += 1
                    seen = set()
                    for h, t in mine[lo:lo + per_rank]:
                        for e in (h, t):
                            if e % p == rank or e in seen:
                                continue
                            seen.add(e)
                            fetches += 1
                            if e in read_at and step - read_at[e] <= clock:
                                hits += 1
                            else:
                                read_at[e] = step
        print(
            f"ranks {p}, batch {a.batch_size}, clock {clock} steps: {fetches / steps:.0f} remote rows "
            f"per rank and step, {hits / max(fetches, 1):.1%} of them held by a cache"
        )


if __name__ == "__main__":
    main()
