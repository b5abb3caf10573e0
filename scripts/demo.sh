#!/usr/bin/env bash
# The main job, end to end: generate a graph with planted communities, train DeepWalk on it
# under mpirun, evaluate the embeddings against the planted blocks, print the result.
set -euo pipefail
RANKS="${RANKS:-4}"
DIR="${DEMO_DIR:-target/demo}"
BIN="${BIN:-target/release/graphscale}"
mkdir -p "$DIR"

echo "== generate: planted partition, 20000 nodes, 20 blocks"
"$BIN" generate sbm --nodes 20000 --blocks 20 --avg-degree 12 --mix 0.2 --seed 1 \
  -o "$DIR/sbm.h5" --labels "$DIR/sbm_labels.tsv"

echo "== info: load over $RANKS ranks"
mpirun --oversubscribe -n "$RANKS" "$BIN" info --graph "$DIR/sbm.h5" --comm-timeout 60

echo "== train: DeepWalk under mpirun -n $RANKS"
mpirun --oversubscribe -n "$RANKS" "$BIN" --graph "$DIR/sbm.h5" --config inputs/demo_deepwalk.toml \
  --threads 1 -o "$DIR/emb.h5" --metrics "$DIR/metrics.jsonl" --comm-timeout 120

echo "== evaluate: node classification of the planted blocks"
"$BIN" eval nodeclf --embeddings "$DIR/emb.h5" --labels "$DIR/sbm_labels.tsv" \
  --train-fractions 0.1,0.5,0.9 --repeats 3
