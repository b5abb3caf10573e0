#!/usr/bin/env bash
# End-to-end benchmarks. Prints numbers and writes bench/results/*.json.
#   bench/run_benchmarks.sh load      convert + distributed load of an R-MAT graph (2^20 nodes, 16M edges)
#   bench/run_benchmarks.sh gensim    DeepWalk on BlogCatalog: graphscale vs walks+gensim, same run
#   bench/run_benchmarks.sh ranks     DeepWalk on BlogCatalog at 1, 2 and 4 ranks (2 cores shared)
# Both by default. Needs a release build (make build) and, for gensim, a Python with
# numpy scipy scikit-learn gensim numba h5py (PYTHON=..., default /tmp/anchors/bin/python).
# GS_FLAGS adds graphscale flags (e.g. GS_FLAGS='--max-staleness 1'); WALKS, LENGTH set the corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${BIN:-target/release/graphscale}"
OUT="${OUT:-bench/results}"
WORK="${WORK:-target/bench}"
PY="${PYTHON:-/tmp/anchors/bin/python}"
DATA="${DATA:-../shared/data}"
SCALE="${SCALE:-20}"
mkdir -p "$OUT" "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
what="${1:-all}"

# DeepWalk on BlogCatalog under mpirun -n R, threads 2/R per rank (1 at R >= 2): pairs/s and F1.
if [[ "$what" == ranks ]]; then
  W="${WALKS:-10}" L="${LENGTH:-80}"
  "$BIN" convert "$DATA/blogcatalog/edges.tsv" -o "$WORK/blog.h5" > /dev/null
  for n in ${RANKS:-1 2 4}; do
    t=$(( n == 1 ? 2 : 1 ))
    # mpirun would bind the single rank to one core: --map-by slot:PE=2 gives it both.
    bind=""; (( t > 1 )) && bind="--map-by slot:PE=$t"
    mpirun --oversubscribe $bind -n "$n" "$BIN" --graph "$WORK/blog.h5" --walks-per-node "$W" --walk-length "$L" \
      --window 10 --dim 128 --negatives 5 --threads "$t" --comm-timeout 600 ${GS_FLAGS:-} \
      -o "$WORK/r${n}_emb.h5" --metrics "$WORK/r${n}_metrics.jsonl" 2> "$WORK/r${n}.log"
    "$BIN" eval nodeclf --embeddings "$WORK/r${n}_emb.h5" --labels "$DATA/blogcatalog/labels.tsv" --repeats 5 --json > "$WORK/r${n}_f1.json"
  done
  python3 - "$WORK" "$OUT/blogcatalog_ranks.json" ${RANKS:-1 2 4} <<'PYEOF'
import json, os, sys
w, out, ranks = sys.argv[1], sys.argv[2], sys.argv[3:]
res = {"flags": os.environ.get("GS_FLAGS", ""), "runs": {}}
for n in ranks:
    ms = [json.loads(l) for l in open(os.path.join(w, f"r{n}_metrics.jsonl"))]
    train = max(m["train_seconds"] for m in ms)
    f1 = json.load(open(os.path.join(w, f"r{n}_f1.json")))["results"]
    ph = {k: round(max(m["seconds"][k] for m in ms), 2) for k in ms[0]["seconds"]}
    res["runs"][n] = {"train_seconds": round(train, 2), "pairs_per_second": round(sum(m["pairs"] for m in ms) / train),
                      "max_rank_phase_seconds": ph, "micro_f1": {k: round(v["micro_f1"] * 100, 2) for k, v in f1.items()}}
    print(f"{n} rank(s): {res['runs'][n]['pairs_per_second']} pairs/s, train {train:.1f} s, Micro-F1 {res['runs'][n]['micro_f1']}, phases {ph}")
json.dump(res, open(out, "w"), indent=1)
PYEOF
  exit 0
fi

if [[ "$what" == load || "$what" == all ]]; then
  echo "== R-MAT scale $SCALE, edge factor 16"
  "$BIN" generate rmat --scale "$SCALE" --edge-factor 16 --seed 1 -o "$WORK/rmat.h5"
  # A text copy to time `convert` on (written by h5dump-free Python when available).
  if [[ -x "$PY" ]]; then
    "$PY" - "$WORK/rmat.h5" "$WORK/rmat.tsv" <<'PYEOF'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1])
s, d = f["src"][:], f["dst"][:]
with open(sys.argv[2], "w") as out:
    for i in range(0, len(s), 1 << 20):
        np.savetxt(out, np.stack([s[i:i + (1 << 20)], d[i:i + (1 << 20)]], 1), fmt="%d", delimiter="\t")
PYEOF
    /usr/bin/env time -f '%M' -o "$WORK/convert.rss" "$BIN" convert "$WORK/rmat.tsv" -o "$WORK/rmat_conv.h5" | tee "$WORK/convert.txt"
  fi
  for n in 1 2 4; do
    if [[ $n == 1 ]]; then
      "$BIN" info --graph "$WORK/rmat.h5" --json > "$WORK/load$n.json"
    else
      mpirun --oversubscribe -n "$n" "$BIN" info --graph "$WORK/rmat.h5" --json --comm-timeout 300 > "$WORK/load$n.json"
    fi
    "${PY:-python3}" -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"load at $n ranks: {d['file_edges']/d['load_seconds']:.0f} edges/s, {d['load_seconds']:.2f} s, peak RSS per rank {d['peak_rss_bytes_max_rank']/2**20:.0f} MiB, adjacency max/mean {d['max_rank_entries']/d['mean_rank_entries']:.3f}\")" "$WORK/load$n.json" | tee -a "$WORK/load.txt"
  done
  cp "$WORK"/load*.json "$OUT/" 2>/dev/null || true
fi

if [[ "$what" == gensim || "$what" == all ]]; then
  W="${WALKS:-10}" L="${LENGTH:-80}"
  echo "== BlogCatalog DeepWalk ($W walks x $L, window 10, d=128, 5 negatives, 2 cores)"
  "$BIN" convert "$DATA/blogcatalog/edges.tsv" -o "$WORK/blog.h5" > /dev/null
  start=$(date +%s.%N)
  /usr/bin/env time -f '%M' -o "$WORK/gs.rss" "$BIN" --graph "$WORK/blog.h5" --walks-per-node "$W" --walk-length "$L" \
    --window 10 --dim 128 --negatives 5 --threads 2 ${GS_FLAGS:-} -o "$WORK/gs_emb.h5" --metrics "$WORK/gs_metrics.jsonl" 2> "$WORK/gs.log"
  end=$(date +%s.%N)
  "$BIN" eval nodeclf --embeddings "$WORK/gs_emb.h5" --labels "$DATA/blogcatalog/labels.tsv" --repeats 5 --json > "$WORK/gs_f1.json"
  if [[ -x "$PY" ]] && "$PY" -c "import gensim" 2>/dev/null; then
    /usr/bin/env time -f '%M' -o "$WORK/base.rss" "$PY" "$DATA/../anchors/baseline_deepwalk.py" --graph "$DATA/blogcatalog/edges.tsv" \
      --num-walks "$W" --walk-length "$L" --out "$WORK/base.npy" --workers 2 --json "$WORK/base.json" > /dev/null 2>&1
    "$PY" - "$WORK/base.npy" "$WORK/base.h5" <<'PYEOF'
import sys, h5py, numpy as np
h5py.File(sys.argv[2], "w")["embeddings"] = np.load(sys.argv[1]).astype(np.float32)
PYEOF
    "$BIN" eval nodeclf --embeddings "$WORK/base.h5" --labels "$DATA/blogcatalog/labels.tsv" --repeats 5 --json > "$WORK/base_f1.json"
  fi
  python3 - "$WORK" "$start" "$end" "$OUT/blogcatalog_vs_gensim.json" <<'PYEOF'
import json, os, sys
w, start, end, out = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
ms = [json.loads(l) for l in open(os.path.join(w, "gs_metrics.jsonl"))]
pairs = sum(m["pairs"] for m in ms); train = max(m["train_seconds"] for m in ms)
tokens = sum(m["tokens"] for m in ms)
res = {"graphscale": {"flags": os.environ.get("GS_FLAGS", ""), "wall_seconds": end - start, "train_seconds": train, "pairs_per_second": pairs / train,
       "tokens_per_second": tokens / train, "peak_rss_kib": int(open(os.path.join(w, "gs.rss")).read().split()[-1]),
       "f1": json.load(open(os.path.join(w, "gs_f1.json")))["results"]}}
if os.path.exists(os.path.join(w, "base.json")):
    b = json.load(open(os.path.join(w, "base.json")))
    res["gensim"] = {"raw": b, "peak_rss_kib": int(open(os.path.join(w, "base.rss")).read().split()[-1]),
                     "f1": json.load(open(os.path.join(w, "base_f1.json")))["results"]}
    g, base = res["graphscale"], res["gensim"]
    base_wall = b["walk_phase_s"] + b["train_phase_s"]
    res["ratio"] = {"tokens_per_second": g["tokens_per_second"] / b["train_tokens_per_s"],
                    "wall_seconds": g["wall_seconds"] / base_wall,
                    "peak_rss": g["peak_rss_kib"] / base["peak_rss_kib"],
                    "micro_f1_points": {f: 100 * (g["f1"][f]["micro_f1"] - base["f1"][f]["micro_f1"]) for f in g["f1"]}}
json.dump(res, open(out, "w"), indent=1)
print(json.dumps(res, indent=1))
f1 = lambda r: " / ".join(f"{100 * r['f1'][f]['micro_f1']:.2f}" for f in sorted(r["f1"]))
g = res["graphscale"]
print(f"graphscale: {g['wall_seconds']:.1f} s wall, {g['tokens_per_second'] / 1e3:.1f}k tokens/s, "
      f"{g['pairs_per_second'] / 1e6:.2f}M pairs/s, peak RSS {g['peak_rss_kib'] / 1024:.0f} MiB, Micro-F1 {f1(g)}")
if "gensim" in res:
    b, r = res["gensim"]["raw"], res["ratio"]
    print(f"walks+gensim: {b['walk_phase_s'] + b['train_phase_s']:.1f} s (walks + training), "
          f"{b['train_tokens_per_s'] / 1e3:.1f}k tokens/s, <= {b['est_sg_pairs_per_s_upper'] / 1e6:.2f}M pairs/s, "
          f"peak RSS {res['gensim']['peak_rss_kib'] / 1024:.0f} MiB, Micro-F1 {f1(res['gensim'])}")
    print(f"ratio graphscale/gensim: {r['tokens_per_second']:.2f}x tokens/s, {r['wall_seconds']:.2f}x wall time, "
          f"{r['peak_rss']:.2f}x peak RSS, Micro-F1 "
          + " / ".join(f"{v:+.2f}" for _, v in sorted(r["micro_f1_points"].items())))
PYEOF
fi
