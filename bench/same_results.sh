#!/usr/bin/env bash
# Same seed, same embeddings: trains with two builds on every update path whose result is
# reproducible (one thread per rank) and compares the written matrices bit for bit. For
# refactors that must not change results (e.g. moving a model onto the `Model` trait).
#   bench/same_results.sh OLD_BINARY NEW_BINARY
# Exits 1 if any case differs. Cases that are not reproducible even with one build (the batched
# path's overlap races with the pool) are not run. The row cache's cases (across simulated nodes)
# are reproducible with builds from 2026-12-06 on, where `--threads 1` trains on the main thread.
set -euo pipefail
OLD="$1" NEW="$2"
WORK="${WORK:-target/bench/same}"
mkdir -p "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
"$NEW" generate sbm --nodes 20000 --blocks 10 --avg-degree 10 --mix 0.1 --seed 3 -o "$WORK/sbm.h5" \
  --labels "$WORK/sbm_labels.tsv" > /dev/null
# A knowledge graph (WN18RR's training triples) for the KG models, where ../shared/data has it.
KG="${DATA:-../shared/data}/wn18rr/train.txt"
[[ -f "$KG" ]] && "$NEW" convert --triples "$KG" -o "$WORK/kg.h5" > /dev/null
cases=(
  "1|--model deepwalk"
  "1|--model deepwalk --kernel pair"
  "1|--model node2vec --p 0.5 --q 2"
  "1|--model line --order 1 --epochs 2"
  "1|--model line --order 2 --epochs 2"
  "1|--model deepwalk --update batched --optimizer adagrad"
  "2|--model deepwalk --ranks-per-node 1 --cache-rows 0"
  "2|--model node2vec --p 0.5 --q 2 --ranks-per-node 1 --cache-rows 0"
  "3|--model deepwalk --ranks-per-node 1"
  "3|--model line --order 2 --epochs 2 --ranks-per-node 1"
  "2|--model deepwalk --strategy replicated"
  "2|--model line --strategy replicated --sync dense --epochs 2"
  "1|--model distmult --epochs 1 --negatives 64"
  "2|--model rotate --epochs 1 --negatives 64 --ranks-per-node 1"
)
bad=0
for c in "${cases[@]}"; do
  IFS='|' read -r n flags <<< "$c"
  for v in old new; do
    bin="$OLD"; [[ $v == new ]] && bin="$NEW"
    # Walk flags only for the walk models (LINE refuses them).
    walks="--walks-per-node 2 --walk-length 20" graph="$WORK/sbm.h5"
    [[ $flags == *"--model line"* ]] && walks=""
    if [[ $flags =~ --model\ (distmult|complex|transe|rotate) ]]; then
      walks="" graph="$WORK/kg.h5"
      [[ -f $graph ]] || { echo "skipped -n $n $flags: no $KG"; continue 2; }
    fi
    # shellcheck disable=SC2086
    timeout 300 mpirun --oversubscribe -n "$n" "$bin" --graph "$graph" $walks \
      --dim 32 --seed 5 --threads 1 $flags -o "$WORK/$v.h5" > /dev/null 2> "$WORK/$v.log" \
      || { echo "FAILED  -n $n $flags ($v): $(tail -1 "$WORK/$v.log")"; exit 1; }
    rm -f "$WORK/$v.bin"
    h5dump -d /embeddings -b LE -o "$WORK/$v.bin" "$WORK/$v.h5" > /dev/null
  done
  if cmp -s "$WORK/old.bin" "$WORK/new.bin"; then
    echo "same    -n $n $flags"
  else
    echo "DIFFER  -n $n $flags"
    bad=1
  fi
done
exit $bad
