#!/usr/bin/env bash
# Reproduce the published node-classification numbers (issue 4). Each case trains with graphscale
# (1 rank, 2 threads), evaluates with the built-in protocol (5 repeats) and appends one JSON line
# to $OUT/reproduce.jsonl:
#   bench/reproduce.sh deepwalk-paper     BlogCatalog, DeepWalk 80 walks x 40, window 10, d 128
#   bench/reproduce.sh node2vec-grid      BlogCatalog, node2vec 10 x 80, p, q in P_Q (default 4 pairs)
#   bench/reproduce.sh line               BlogCatalog, LINE 1st + 2nd order (d 64 each) concatenated
#   bench/reproduce.sh planetoid          Cora, CiteSeer, PubMed: DeepWalk 10 x 80 beside walks+gensim
# GS_FLAGS adds graphscale flags to every run. Needs a release build; line and planetoid need a
# Python with numpy and h5py (PYTHON=..., default /tmp/anchors/bin/python), planetoid also gensim.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${BIN:-target/release/graphscale}"
OUT="${OUT:-bench/results}"
WORK="${WORK:-target/reproduce}"
PY="${PYTHON:-/tmp/anchors/bin/python}"
DATA="${DATA:-../shared/data}"
mkdir -p "$OUT" "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1

graph() { # dataset -> converted HDF5 path
  local g="$WORK/$1.h5"
  [[ -f "$g" ]] || "$BIN" convert "$DATA/$1/edges.tsv" -o "$g" > /dev/null
  echo "$g"
}

# record NAME DATASET EMB.h5 SECONDS: evaluate and append a JSON line.
record() {
  local f1
  f1=$("$BIN" eval nodeclf --embeddings "$3" --labels "$DATA/$2/labels.tsv" --repeats 5 --json)
  python3 - "$1" "$2" "$4" "$f1" "${GS_FLAGS:-}" >> "$OUT/reproduce.jsonl" <<'PYEOF'
import json, sys
name, data, secs, f1, flags = sys.argv[1:6]
r = json.loads(f1)["results"]
pct = lambda k: {f: round(100 * v[k], 2) for f, v in r.items()}
print(json.dumps({"case": name, "dataset": data, "flags": flags, "seconds": float(secs),
                  "micro_f1": pct("micro_f1"), "macro_f1": pct("macro_f1"),
                  "micro_f1_std": pct("micro_f1_std"), "macro_f1_std": pct("macro_f1_std")}))
PYEOF
  tail -n 1 "$OUT/reproduce.jsonl"
}

# train NAME DATASET FLAGS...: train on 1 rank, then record.
train() {
  local name=$1 data=$2 g
  shift 2
  g=$(graph "$data")
  local start end
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$BIN" --graph "$g" --threads 2 -o "$WORK/$name.h5" --metrics "$WORK/$name.jsonl" "$@" ${GS_FLAGS:-} 2> "$WORK/$name.log"
  end=$(date +%s.%N)
  record "$name" "$data" "$WORK/$name.h5" "$(python3 -c "print($end - $start)")"
}

case "${1:-}" in
  deepwalk-paper)
    train deepwalk-80x40 blogcatalog --walks-per-node 80 --walk-length 40 --window 10 --dim 128
    ;;
  node2vec-grid)
    for pq in ${P_Q:-0.25,0.25 0.25,1 1,0.25 4,0.25}; do
      p=${pq%,*} q=${pq#*,}
      train "node2vec-p$p-q$q" blogcatalog --model node2vec --p "$p" --q "$q" \
        --walks-per-node 10 --walk-length 80 --window 10 --dim 128
    done
    ;;
  line)
    # The LINE paper: first and second order trained separately (d/2 each), rows concatenated.
    for o in 1 2; do
      "$BIN" --graph "$(graph blogcatalog)" --threads 2 --model line --order "$o" --dim 64 \
        --line-samples "${LINE_SAMPLES:-300}" -o "$WORK/line$o.h5" ${GS_FLAGS:-} 2> "$WORK/line$o.log"
      record "line-order$o" blogcatalog "$WORK/line$o.h5" 0
    done
    "$PY" - "$WORK/line1.h5" "$WORK/line2.h5" "$WORK/line12.h5" <<'PYEOF'
import sys, h5py, numpy as np
a, b = (h5py.File(p)["embeddings"][:] for p in sys.argv[1:3])
n = lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
h5py.File(sys.argv[3], "w")["embeddings"] = np.hstack([n(a), n(b)]).astype(np.float32)
PYEOF
    record "line-1+2" blogcatalog "$WORK/line12.h5" 0
    ;;
  planetoid)
    for d in cora citeseer pubmed; do
      train "deepwalk-$d" "$d" --walks-per-node 10 --walk-length 80 --window 10 --dim 128
      start=$(date +%s.%N)
      "$PY" "$DATA/../anchors/baseline_deepwalk.py" --graph "$DATA/$d/edges.tsv" --num-walks 10 \
        --walk-length 80 --out "$WORK/gensim-$d.npy" --workers 2 > /dev/null 2>&1
      end=$(date +%s.%N)
      "$PY" - "$WORK/gensim-$d.npy" "$WORK/gensim-$d.h5" <<'PYEOF'
import sys, h5py, numpy as np
h5py.File(sys.argv[2], "w")["embeddings"] = np.load(sys.argv[1]).astype(np.float32)
PYEOF
      record "gensim-deepwalk-$d" "$d" "$WORK/gensim-$d.h5" "$(python3 -c "print($end - $start)")"
    done
    ;;
  *)
    sed -n '2,12p' "$0"
    exit 2
    ;;
esac
