#!/usr/bin/env bash
# End-to-end benchmarks. Prints numbers and writes bench/results/*.json.
#   bench/run_benchmarks.sh load      convert + distributed load of an R-MAT graph (2^20 nodes, 16M edges)
#   bench/run_benchmarks.sh gensim    DeepWalk on BlogCatalog: graphscale vs walks+gensim, same run
#   bench/run_benchmarks.sh ranks     DeepWalk on BlogCatalog at 1, 2 and 4 ranks (2 cores shared)
#   bench/run_benchmarks.sh nodes     DeepWalk on BlogCatalog at 1 node, 2, 4, 8 and 16 simulated nodes
#                                     (--ranks-per-node 1) and 4 nodes of 2 ranks over shared memory,
#                                     2 and 8 over forced TCP; NODE_RUNS alternated rounds (default 3,
#                                     medians; NODE_SCALE=0 skips 8, 16, 4x2 and TCP 8; NODE_ONLY="node1
#                                     shm8" runs only the settings named),
#                                     each also with the earlier remote path (no cache, f32, rma),
#                                     and 2 and 4 nodes on BlogCatalog relabelled by `reorder`
#   bench/run_benchmarks.sh kg        knowledge-graph completion on WN18RR: DistMult, ComplEx, TransE,
#                                     RotatE (inputs/kg/), 1 node and 4 simulated nodes, filtered MRR;
#                                     MODELS/RANKS rerun a subset: their entries in kg_wn18rr.json
#                                     are replaced, the others kept (each names its checkout)
#   bench/run_benchmarks.sh scaling   graphscale (sharded) against the data-parallel baseline
#                                     (--strategy replicated, sparse and dense sync) at 1, 2 and 4
#                                     simulated nodes over shared memory and forced TCP, DeepWalk and
#                                     LINE: cost on R-MAT 2^20, quality on a planted-partition graph;
#                                     ends in `graphscale report` (bench/results/scaling/)
#   bench/run_benchmarks.sh sage      GraphSAGE: graphscale (2 ranks) against DGL (2 threads) on Cora
#                                     and a contextual SBM of 2^20 nodes, 128 features (issue 34)
#   bench/run_benchmarks.sh outofcache  DeepWalk out of cache: R-MAT 2^22 relabelled by degree (1 walk
#                                     x 40) against BlogCatalog (40 walks x 40), d 64, window 5, 1 rank
#                                     x 2 threads, with --shared-negatives in SHARES (default "1 2"),
#                                     RUNS alternated rounds; QUALITY=1 adds BlogCatalog Micro-F1 per B
# load and gensim by default. Needs a release build (make build) and, for gensim, a Python with
# numpy scipy scikit-learn gensim numba h5py (PYTHON=..., default /tmp/anchors/bin/python).
# GS_FLAGS adds graphscale flags (e.g. GS_FLAGS='--max-staleness 1'); WALKS, LENGTH set the corpus;
# RUNS sets the gensim comparison's alternated rounds (default 3; medians are reported).
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

# Out-of-cache throughput (docs/scale.md): pairs/s of rows that do not fit in cache against rows
# that do, same flags, alternated rounds in one invocation.
if [[ "$what" == outofcache ]]; then
  S="${OOC_SCALE:-22}"
  "$BIN" convert "$DATA/blogcatalog/edges.tsv" -o "$WORK/blog.h5" > /dev/null
  if [[ ! -f "$WORK/rmat${S}_deg.h5" ]]; then
    "$BIN" generate rmat --scale "$S" --edge-factor 16 --seed 1 -o "$WORK/rmat${S}.h5" > /dev/null
    "$BIN" reorder --graph "$WORK/rmat${S}.h5" --by degree -o "$WORK/rmat${S}_deg.h5" > /dev/null
    rm -f "$WORK/rmat${S}.h5"
  fi
  run() {
    mpirun --oversubscribe -n 1 --map-by slot:PE=2 "$BIN" --dim 64 --walk-length 40 --window 5 --threads 2 \
      -o "$WORK/ooc_out.h5" ${GS_FLAGS:-} "$@" 2>&1 | grep -oE "[0-9]+ pairs/s" | tail -1 | grep -oE "[0-9]+"
  }
  : > "$WORK/ooc.tsv"
  for i in $(seq "${RUNS:-3}"); do
    for b in ${SHARES:-1 2}; do
      printf "blog\t%s\t%s\n" "$b" "$(run --graph "$WORK/blog.h5" --walks-per-node 40 --shared-negatives "$b")" >> "$WORK/ooc.tsv"
      printf "rmat\t%s\t%s\n" "$b" "$(run --graph "$WORK/rmat${S}_deg.h5" --walks-per-node 1 --shared-negatives "$b")" >> "$WORK/ooc.tsv"
      tail -2 "$WORK/ooc.tsv"
    done
  done
  if [[ "${QUALITY:-0}" == 1 ]]; then
    for b in ${SHARES:-1 2}; do
      mpirun --oversubscribe -n 1 --map-by slot:PE=2 "$BIN" --graph "$WORK/blog.h5" --walks-per-node 10 \
        --walk-length 80 --window 10 --dim 128 --threads 2 --shared-negatives "$b" -o "$WORK/ooc_q$b.h5" > /dev/null 2>&1
      "$BIN" eval nodeclf --embeddings "$WORK/ooc_q$b.h5" --labels "$DATA/blogcatalog/labels.tsv" --repeats 5 \
        --seed 3 --train-fractions 0.1,0.5,0.9 --json > "$WORK/ooc_q${b}_f1.json"
    done
  fi
  python3 - "$WORK" "$OUT/out_of_cache.json" "$S" <<'PYEOF'
import json, os, statistics, sys
w, out, scale = sys.argv[1], sys.argv[2], sys.argv[3]
runs = {}
for line in open(os.path.join(w, "ooc.tsv")):
    g, b, v = line.split("\t")
    runs.setdefault((g, b), []).append(int(v))
base = statistics.mean(runs[("blog", "1")]) if ("blog", "1") in runs else None
res = {"scale": int(scale), "runs": {}}
for (g, b), v in sorted(runs.items()):
    m = statistics.mean(v)
    r = {"pairs_per_second": v, "mean": m}
    if g == "rmat":
        r["of_blogcatalog_default"] = round(m / base, 3) if base else None
        same = runs.get(("blog", b))
        r["of_blogcatalog_same_flags"] = round(m / statistics.mean(same), 3) if same else None
    f = os.path.join(w, f"ooc_q{b}_f1.json")
    if g == "blog" and os.path.exists(f):
        d = json.load(open(f))["results"]
        r["micro_f1"] = {k: round(100 * d[k]["micro_f1"], 2) for k in d}
    res["runs"][f"{g}_shared{b}"] = r
    print(f"{g:5s} --shared-negatives {b}: {m / 1e6:5.2f}M pairs/s", *(f"{k} {r[k]}" for k in r if k.startswith("of_") or k == "micro_f1"))
json.dump(res, open(out, "w"), indent=1)
PYEOF
  exit 0
fi

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

# The path between nodes on one machine: every rank its own node (--ranks-per-node 1), 1 thread
# per rank; 1 node is 1 rank x 2 threads. BASELINE=0 skips the earlier path's runs (no cache,
# f32 on the wire, one-sided fetch: what the remote path was before the cache).
if [[ "$what" == nodes ]]; then
  W="${WALKS:-10}" L="${LENGTH:-80}"
  "$BIN" convert "$DATA/blogcatalog/edges.tsv" -o "$WORK/blog.h5" > /dev/null
  TCP="--mca pml ob1 --mca btl tcp,self --mca osc ucx -x UCX_TLS=tcp,self"
  OLD="--cache-rows 0 --wire-dtype f32 --fetch rma"
  # tcp2_pt: the same with Open MPI's TCP progress thread (docs/tuning.md), so that messages
  # move while the ranks compute.
  runs=("node1|1|||" "shm2|2|||" "shm4|4|||" "tcp2|2|$TCP||" "tcp2_pt|2|$TCP --mca btl_tcp_progress_thread 1||")
  # NODE_SCALE, not SCALE: SCALE is the R-MAT scale of the other benchmarks (default 20).
  if [[ "${NODE_SCALE:-1}" == 1 ]]; then
    runs+=("shm8|8|||" "shm4x2|8|||" "shm16|16|||" "tcp8|8|$TCP||")
  fi
  if [[ "${BASELINE:-1}" == 1 ]]; then
    runs+=("shm2_before|2||$OLD|" "shm4_before|4||$OLD|" "tcp2_before|2|$TCP|$OLD|")
  fi
  # REORDER=0 skips the runs on the graph relabelled by `graphscale reorder --parts N`.
  if [[ "${REORDER:-1}" == 1 ]]; then
    for p in 2 4; do
      "$BIN" reorder --graph "$WORK/blog.h5" -o "$WORK/blog_r$p.h5" --parts "$p" --json > "$WORK/reorder_$p.json"
    done
    runs+=("shm2_reordered|2||--partition block|blog_r2" "shm4_reordered|4||--partition block|blog_r4")
  fi
  if [[ -n "${NODE_ONLY:-}" ]]; then
    kept=()
    for r in "${runs[@]}"; do
      [[ " $NODE_ONLY " == *" ${r%%|*} "* ]] && kept+=("$r")
    done
    runs=("${kept[@]}")
  fi
  names=()
  for round in $(seq "${NODE_RUNS:-3}"); do
  for r in "${runs[@]}"; do
    IFS='|' read -r base n net flags graph <<< "$r"
    graph="${graph:-blog}" name="${base}@$round"
    if [[ $n == 1 ]]; then
      place="--map-by slot:PE=2" threads=2 nodes=""
    elif [[ $base == *x2* ]]; then
      place="" threads=1 nodes="--ranks-per-node 2"
    else
      place="" threads=1 nodes="--ranks-per-node 1"
    fi
    echo "== $name: $n rank(s) $nodes $flags ${net:+(forced TCP)}"
    timeout 1800 mpirun --oversubscribe $place $net -n "$n" "$BIN" --graph "$WORK/$graph.h5" --walks-per-node "$W" \
      --walk-length "$L" --window 10 --dim 128 --negatives 5 --threads "$threads" $nodes $flags --comm-timeout 600 \
      ${GS_FLAGS:-} -o "$WORK/n_${name}.h5" --metrics "$WORK/n_${name}.jsonl" 2> "$WORK/n_${name}.log"
    "$BIN" eval nodeclf --embeddings "$WORK/n_${name}.h5" --labels "$DATA/blogcatalog/labels.tsv" --repeats 5 --seed 3 \
      --json > "$WORK/n_${name}_f1.json"
    names+=("$name")
  done
  done
  python3 - "$WORK" "$OUT/blogcatalog_nodes.json" "${names[@]}" <<'PYEOF'
import json, os, statistics, sys
w, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
res = {"flags": os.environ.get("GS_FLAGS", ""), "runs": {}, "rounds": {}}
med = lambda xs: round(statistics.median(xs), 3)
for name in names:
    ms = [json.loads(l) for l in open(os.path.join(w, f"n_{name}.jsonl"))]
    train = max(m["train_seconds"] for m in ms)
    pairs = sum(m["pairs"] for m in ms)
    moved = sum(m["comm_bytes_sent"] + m.get("one_sided_bytes", 0) for m in ms)
    rows = sum(m["fetch_bytes"] + m["push_bytes_sent"] for m in ms)
    f1 = json.load(open(os.path.join(w, f"n_{name}_f1.json")))["results"]
    res["rounds"][name] = {
        "ranks": len(ms), "train_seconds": round(train, 2), "pairs_per_second": round(pairs / train),
        # CPU seconds of all ranks' processes while training, per million pairs.
        "cpu_seconds_per_mpair": round(sum(m.get("cpu_seconds_process_train", 0) for m in ms) / pairs * 1e6, 3),
        "bytes_moved_per_pair": round(moved / pairs, 1), "row_bytes_per_pair": round(rows / pairs, 1),
        "loss_per_term": round(sum(m["loss_sum"] for m in ms) / max(1, sum(m["loss_terms"] for m in ms)), 4),
        "max_rank_phase_seconds": {k: round(max(m["seconds"][k] for m in ms), 2) for k in ms[0]["seconds"]},
        "cache_hits": sum(m.get("cache_hits", 0) for m in ms), "rows_read": sum(m["remote_rows"] for m in ms),
        "walker_crossings_per_token": round(sum(m.get("walker_crossings", 0) for m in ms) / max(1, sum(m["tokens"] for m in ms)), 3),
        "micro_f1": {k: round(v["micro_f1"] * 100, 2) for k, v in f1.items()}}
# Per setting: the medians over its rounds (and each round's value beside them).
for base in dict.fromkeys(n.split("@")[0] for n in names):
    rs = [r for n, r in res["rounds"].items() if n.split("@")[0] == base]
    r = {k: med([x[k] for x in rs]) for k in ("train_seconds", "pairs_per_second", "cpu_seconds_per_mpair",
                                              "bytes_moved_per_pair", "row_bytes_per_pair", "loss_per_term",
                                              "walker_crossings_per_token")}
    r["ranks"] = rs[0]["ranks"]
    r["micro_f1"] = {k: med([x["micro_f1"][k] for x in rs]) for k in rs[0]["micro_f1"]}
    r["micro_f1_50_rounds"] = [x["micro_f1"]["0.5"] for x in rs if "0.5" in x["micro_f1"]]
    r["pairs_per_second_rounds"] = [x["pairs_per_second"] for x in rs]
    r["max_rank_phase_seconds"] = {k: med([x["max_rank_phase_seconds"][k] for x in rs]) for k in rs[0]["max_rank_phase_seconds"]}
    res["runs"][base] = r
one = res["runs"].get("node1", {}).get("pairs_per_second")
for name, r in res["runs"].items():
    if one:
        r["of_one_node"] = round(r["pairs_per_second"] / one, 2)
    ph = r["max_rank_phase_seconds"]
    print(f"{name:12s} {r['pairs_per_second'] / 1e6:5.2f}M pairs/s ({r.get('of_one_node', 0):.2f}x of 1 node), "
          f"{r['cpu_seconds_per_mpair']:.3f} CPU s/Mpair, {r['bytes_moved_per_pair']:6.1f} B moved/pair, loss {r['loss_per_term']:.3f}, "
          f"train {r['train_seconds']:.1f} s, Micro-F1 {r['micro_f1']} (50%: {r['micro_f1_50_rounds']}), phases sample {ph['sample']} "
          f"fetch {ph['fetch']} compute {ph['compute']} push {ph['push']} apply {ph['apply']} idle {ph.get('idle', 0)}")
for p in (2, 4):
    f = os.path.join(w, f"reorder_{p}.json")
    if os.path.exists(f):
        res[f"reorder_{p}"] = json.load(open(f))
json.dump(res, open(out, "w"), indent=1)
PYEOF
  exit 0
fi

# The scaling study of docs/scaling.md. Every rank its own node (--ranks-per-node 1, 1 thread);
# 1 node is 1 rank x 2 threads. Dense sync runs under a time limit (DENSE_LIMIT seconds): where it
# does not finish, its rate at the limit (the last progress line) is recorded.
if [[ "$what" == scaling ]]; then
  TCP="--mca pml ob1 --mca btl tcp,self --mca osc ucx -x UCX_TLS=tcp,self"
  [[ -f "$WORK/rmat20.h5" ]] || "$BIN" generate rmat --scale 20 --edge-factor 16 --seed 1 -o "$WORK/rmat20.h5" > /dev/null
  "$BIN" generate sbm --nodes 20000 --blocks 10 --avg-degree 10 --mix 0.1 --seed 3 -o "$WORK/sbm20k.h5" \
    --labels "$WORK/sbm20k_labels.tsv" > /dev/null
  DW="--model deepwalk --walks-per-node 1 --walk-length 20 --dim 64"
  LINE="--model line --line-samples 4 --dim 64 --lr 0.05"
  QDW="--model deepwalk --walks-per-node 10 --walk-length 40 --dim 64"
  QLINE="--model line --line-samples 100 --dim 64 --lr 0.05"
  # name|graph|ranks|network|flags
  runs=()
  for m in dw line; do
    if [[ $m == dw ]]; then f="$DW" q="$QDW"; else f="$LINE" q="$QLINE"; fi
    for st in sharded replicated; do
      for n in 1 2 4; do runs+=("cost_${m}_${st}_shm$n|rmat20|$n|shm|$f --strategy $st"); done
      for n in 2 4; do runs+=("cost_${m}_${st}_tcp$n|rmat20|$n|tcp|$f --strategy $st"); done
      runs+=("quality_${m}_${st}_shm4|sbm20k|4|shm|$q --strategy $st")
    done
    runs+=("cost_${m}_dense_shm2|rmat20|2|shm|$f --strategy replicated --sync dense")
    runs+=("quality_${m}_dense_shm4|sbm20k|4|shm|$q --strategy replicated --sync dense")
    runs+=("quality_${m}_sharded_shm1|sbm20k|1|shm|$q")
  done
  names=()
  for r in "${runs[@]}"; do
    IFS='|' read -r name graph n net flags <<< "$r"
    [[ -n "${ONLY:-}" && ! "$name" =~ $ONLY ]] && continue
    if [[ $n == 1 ]]; then place="--map-by slot:PE=2" threads=2 nodes=""; else place="" threads=1 nodes="--ranks-per-node 1"; fi
    netflags=""; [[ $net == tcp ]] && netflags="$TCP"
    limit=3600; [[ "$flags" == *dense* && $graph == rmat20 ]] && limit="${DENSE_LIMIT:-300}"
    echo "== $name: $n rank(s) $net $flags"
    rc=0
    timeout -k 10 "$limit" mpirun --oversubscribe $place $netflags -n "$n" "$BIN" --graph "$WORK/$graph.h5" $flags \
      --threads "$threads" $nodes --comm-timeout 600 ${GS_FLAGS:-} -o "$WORK/s_${name}.h5" \
      --metrics "$WORK/s_${name}.jsonl" 2> "$WORK/s_${name}.log" || rc=$?
    if [[ $rc != 0 ]]; then
      echo "   stopped (exit $rc): $(grep -E 'pairs/s' "$WORK/s_${name}.log" | tail -1)"
      rm -f "$WORK/s_${name}.jsonl"
      echo "$rc" > "$WORK/s_${name}.stopped"
    else
      rm -f "$WORK/s_${name}.stopped"
      if [[ $graph == sbm20k ]]; then
        "$BIN" eval nodeclf --embeddings "$WORK/s_${name}.h5" --labels "$WORK/sbm20k_labels.tsv" --repeats 5 --seed 3 \
          --train-fractions 0.5 --json > "$WORK/s_${name}_f1.json"
      fi
    fi
    names+=("$name")
  done
  # Every run whose metrics are in $WORK (ONLY=REGEX re-runs some and keeps the others).
  python3 bench/scaling_summary.py "$WORK" "$OUT/scaling.json"
  # The planner calibrated from the 1- and 2-node runs against every run (docs/scaling.md).
  python3 bench/plan_check.py "$WORK" "$BIN" > "$OUT/plan_check.md" || echo "plan_check failed"
  files=("$WORK"/s_cost_*.jsonl)
  if (( ${#files[@]} )); then
    for m in dw line; do
      sel=(); for f in "${files[@]}"; do [[ $f == *cost_${m}_* && $f != *tcp* ]] && sel+=("$f"); done
      (( ${#sel[@]} )) && "$BIN" report "${sel[@]}" -o "$OUT/scaling/${m}_shm"
      sel=(); for f in "${files[@]}"; do [[ $f == *cost_${m}_* && ( $f == *tcp* || $f == *shm1* ) ]] && sel+=("$f"); done
      (( ${#sel[@]} )) && "$BIN" report "${sel[@]}" -o "$OUT/scaling/${m}_tcp"
    done
    rm -f "$OUT"/scaling/*/*.png
  fi
  exit 0
fi

# Knowledge-graph completion on WN18RR: every model with its run file (inputs/kg/), at 1 rank x 2
# threads and at 4 simulated nodes; filtered MRR/Hits@k of the test set (eval kg), training time
# and triples/s. MODELS selects models (default: all four); RANKS the rank counts (default
# "1 4": 1 rank x 2 threads, and 4 simulated nodes of 1 rank x 1 thread).
if [[ "$what" == kg ]]; then
  K="$WORK/kg"; mkdir -p "$K"
  rev=$(git describe --always --dirty 2> /dev/null || echo unknown)
  W="$DATA/wn18rr"
  "$BIN" convert --triples "$W/train.txt" --names-from "$W/valid.txt,$W/test.txt" -o "$K/train.h5" > /dev/null
  for f in valid test; do
    "$BIN" convert --triples "$W/$f.txt" --vocab-from "$K/train.h5" -o "$K/$f.h5" > /dev/null
  done
  for m in ${MODELS:-distmult complex transe rotate}; do
    for n in ${RANKS:-1 4}; do
      if [[ $n == 1 ]]; then place="--map-by slot:PE=2" threads=2 nodes=""; else place="" threads=1 nodes="--ranks-per-node 1"; fi
      name="${m}_$n"
      echo "== $name"
      # shellcheck disable=SC2086
      timeout 7200 mpirun --oversubscribe $place -n "$n" "$BIN" --graph "$K/train.h5" --config "inputs/kg/wn18rr_$m.toml" \
        --threads "$threads" $nodes --comm-timeout 600 ${GS_FLAGS:-} -o "$K/$name.h5" --metrics "$K/$name.jsonl" 2> "$K/$name.log"
      "$BIN" eval kg --embeddings "$K/$name.h5" --test "$K/test.h5" --filter "$K/train.h5,$K/valid.h5" --json > "$K/${name}_test.json"
      echo "$rev" > "$K/$name.commit"
      cat "$K/${name}_test.json"
    done
  done
  python3 - "$K" "$OUT/kg_wn18rr.json" <<'PYEOF'
import glob, json, os, sys
k, out = sys.argv[1], sys.argv[2]
# Runs this work directory holds replace their entries; the others (models or rank counts not
# rerun, MODELS/RANKS) stay as the file had them.
res = json.load(open(out)) if os.path.exists(out) else {}
for f in sorted(glob.glob(os.path.join(k, "*_test.json"))):
    name = os.path.basename(f)[:-len("_test.json")]
    ms = [json.loads(l) for l in open(os.path.join(k, name + ".jsonl"))]
    train = max(m["train_seconds"] for m in ms)
    triples = sum(m["pairs"] for m in ms)
    res[name] = {"test": json.load(open(f)), "train_seconds": train, "triples_per_second": triples / train,
                 "ranks": len(ms), "peak_rss_bytes_max": max(m["peak_rss_bytes"] for m in ms),
                 # as the run's report: collectives sent plus one-sided reads, per triple and epoch
                 "bytes_per_triple": sum(m["comm_bytes_sent"] + m["one_sided_bytes"] for m in ms) / max(triples, 1),
                 # the checkout when the bench started (its `.commit` file, written beside the run)
                 "commit": open(os.path.join(k, name + ".commit")).read().strip() if os.path.exists(os.path.join(k, name + ".commit")) else None}
    t = res[name]["test"]
    print(f"{name:12s} MRR {t['mrr']:.4f}  H@1 {t['hits@1']:.4f}  H@10 {t['hits@10']:.4f}  train {train:.0f} s  {triples / train / 1e3:.1f}k triples/s  {res[name]['bytes_per_triple']:.0f} B/triple")
json.dump(res, open(out, "w"), indent=1)
PYEOF
fi

# GraphSAGE side by side with DGL (issue 34): the same model, fan-out, step, optimizer and
# epochs on the same 2 cores: graphscale as 2 ranks x 1 thread (mpirun -n 2, sharded), DGL 2.1
# (its C++ neighbour sampler; bench/sage_dgl.py) with torch.set_num_threads(2). Cora's public
# split (100 epochs, the defaults) and a contextual SBM of 2^SAGE_SCALE nodes (default 20) with
# 128 features (signal 0.5, mix 0.3; SAGE_EPOCHS, default 2). RUNS alternated rounds (default
# 3, seed = round), medians. Seeds/s count the training steps alone (not the per-epoch
# validation). DGL's venv (SAGE_VENV, default target/bench/dglenv) is made when missing.
# SAGE_DTYPE=f16 runs the SBM with f16 feature rows (results in sage_vs_dgl_f16.json).
# Page size: DGL's features are a numpy array, which numpy advises for transparent huge pages
# (2 MiB); graphscale's node-shared rows live in an MPI shared-memory file in /dev/shm, a tmpfs
# mounted huge=never by default, so they sit on 4 KiB pages (graphscale warns; docs/tuning.md,
# "Huge pages"). SAGE_SHM_PAGES=huge (root) remounts /dev/shm with huge=advise for the run and
# restores its options at the end (results in sage_vs_dgl_huge.json); every result records the
# mount options it ran under and whether graphscale's rows were on 4 KiB pages.
# SAGE_COMPUTE=bf16 runs both sides' dense products with bf16 operands: graphscale with
# --compute-dtype bf16, DGL's forward under torch.autocast(bfloat16) (results tagged _bf16).
if [[ "$what" == sage ]]; then
  S="$WORK/sage"; mkdir -p "$S"
  VENV="${SAGE_VENV:-$WORK/dglenv}"
  if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "numpy<2" torch==2.2.1 dgl==2.1.0 torchdata==0.7.1 pyyaml pydantic h5py "pandas<2.3"
  fi
  "$BIN" convert "$DATA/cora/edges.tsv" --features "$DATA/cora/features.tsv" --labels "$DATA/cora/labels.tsv" \
    --split "$DATA/cora/split.tsv" -o "$S/cora.h5" > /dev/null
  # SAGE_DTYPE=f16 stores the SBM's features as f16 (the same draws rounded): graphscale gathers
  # the 2-byte rows, DGL reads them into f32 tensors (the same values).
  sdt="${SAGE_DTYPE:-f32}"
  sc="${SAGE_SCALE:-20}"
  tag=""
  [[ "$sdt" == f32 ]] || { sc="$sc$sdt"; tag="_$sdt"; }
  gs_bf=(); dgl_bf=()
  if [[ "${SAGE_COMPUTE:-f32}" == bf16 ]]; then gs_bf=(--compute-dtype bf16); dgl_bf=(--bf16); tag="${tag}_bf16"; fi
  [[ -f "$S/csbm$sc.h5" ]] || "$BIN" generate sbm --nodes $((1 << ${SAGE_SCALE:-20})) --blocks 8 --features 128 \
    --signal 0.5 --mix 0.3 --dtype "$sdt" -o "$S/csbm$sc.h5" > /dev/null
  if [[ "${SAGE_SHM_PAGES:-}" == huge ]]; then
    shm_was="$(findmnt -no OPTIONS /dev/shm)"
    mount -o remount,huge=advise /dev/shm || { echo "SAGE_SHM_PAGES=huge: remounting /dev/shm needs root" >&2; exit 1; }
    # Restore the mount's huge= option (its other options are untouched by the remount).
    trap 'mount -o "remount,huge=$(sed -n "s/.*huge=\([a-z_]*\).*/\1/p" <<< "$shm_was" | grep . || echo never)" /dev/shm' EXIT
    tag="${tag}_huge"
  fi
  # The last of stacked mounts is the one processes see (and the one remounted above).
  findmnt -no OPTIONS /dev/shm | tail -1 > "$S/dev_shm_options" || true
  rounds="${RUNS:-3}"
  for r in $(seq 1 "$rounds"); do
    for g in cora "csbm$sc"; do
      if [[ $g == cora ]]; then ep=100; else ep="${SAGE_EPOCHS:-2}"; fi
      gs() {
        timeout 7200 mpirun --oversubscribe -n 2 "$BIN" --graph "$S/$g.h5" --model sage --epochs "$ep" --threads 1 \
          --seed "$r" "${gs_bf[@]}" --metrics "$S/gs_${g}_$r.jsonl" 2> "$S/gs_${g}_$r.log"
      }
      dgl() {
        timeout 7200 "$VENV/bin/python" bench/sage_dgl.py --graph "$S/$g.h5" --epochs "$ep" --threads 2 --seed "$r" "${dgl_bf[@]}" \
          2> "$S/dgl_${g}_$r.log" | tail -1 > "$S/dgl_${g}_$r.json"
      }
      echo "== round $r, $g"
      rm -f "$S/gs_${g}_$r.jsonl"
      if (( r % 2 )); then dgl; gs; else gs; dgl; fi
    done
  done
  python3 - "$S" "$OUT/sage_vs_dgl$tag.json" "$rounds" "$sc" <<'PYEOF'
import json, os, re, statistics, sys
s, out, rounds, sc = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
opts = os.path.join(s, "dev_shm_options")
res = {"rounds": rounds, "compute_dtype": os.environ.get("SAGE_COMPUTE", "f32"), "dev_shm_options": open(opts).read().strip() if os.path.exists(opts) else None,
       "graphs": {}}
for g in ["cora", "csbm" + sc]:
    gs, dgl = [], []
    for r in range(1, rounds + 1):
        ms = [json.loads(l) for l in open(os.path.join(s, f"gs_{g}_{r}.jsonl"))]
        steps = max(m["train_seconds"] - m.get("eval_seconds", 0.0) for m in ms)
        seeds = sum(m["pairs"] for m in ms)
        log = open(os.path.join(s, f"gs_{g}_{r}.log")).read()
        acc = float(re.search(r"test accuracy ([0-9.]+)", log).group(1))
        gs.append({"seeds_per_s": seeds / steps, "steps_seconds": steps, "test_accuracy": acc,
                   "rows_on_4k_pages": "on 4 KiB pages" in log,
                   "peak_rss_bytes_max": max(m["peak_rss_bytes"] for m in ms)})
        dgl.append(json.load(open(os.path.join(s, f"dgl_{g}_{r}.json"))))
    med = lambda xs, k: statistics.median(x[k] for x in xs)
    e = {"graphscale": gs, "dgl": dgl,
         "median": {"graphscale_seeds_per_s": med(gs, "seeds_per_s"), "dgl_seeds_per_s": med(dgl, "seeds_per_s"),
                    "graphscale_test_accuracy": med(gs, "test_accuracy"), "dgl_test_accuracy": med(dgl, "test_accuracy")},
         "ratio_per_round": [a["seeds_per_s"] / b["seeds_per_s"] for a, b in zip(gs, dgl)]}
    e["median"]["ratio"] = statistics.median(e["ratio_per_round"])
    res["graphs"][g] = e
    m = e["median"]
    print(f"{g}: graphscale {m['graphscale_seeds_per_s']:.0f} seeds/s, test {m['graphscale_test_accuracy']:.3f}; "
          f"DGL {m['dgl_seeds_per_s']:.0f} seeds/s, test {m['dgl_test_accuracy']:.3f}; ratio {m['ratio']:.2f}x "
          f"(rounds: " + ", ".join(f"{x:.2f}" for x in e["ratio_per_round"]) + ")")
json.dump(res, open(out, "w"), indent=1)
PYEOF
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
  W="${WALKS:-10}" L="${LENGTH:-80}" R="${RUNS:-3}"
  echo "== BlogCatalog DeepWalk ($W walks x $L, window 10, d=128, 5 negatives, 2 cores), $R alternated rounds"
  "$BIN" convert "$DATA/blogcatalog/edges.tsv" -o "$WORK/blog.h5" > /dev/null
  have_gensim=0
  [[ -x "$PY" ]] && "$PY" -c "import gensim" 2>/dev/null && have_gensim=1
  rm -f "$WORK"/gs_*.wall "$WORK"/base_*.json
  # Rounds alternate the two tools, so that a slow spell of this shared machine hits both.
  for i in $(seq "$R"); do
    start=$(date +%s.%N)
    /usr/bin/env time -f '%M' -o "$WORK/gs_$i.rss" "$BIN" --graph "$WORK/blog.h5" --walks-per-node "$W" --walk-length "$L" \
      --window 10 --dim 128 --negatives 5 --threads 2 ${GS_FLAGS:-} -o "$WORK/gs_emb_$i.h5" --metrics "$WORK/gs_metrics_$i.jsonl" 2> "$WORK/gs_$i.log"
    echo "$start $(date +%s.%N)" > "$WORK/gs_$i.wall"
    # Same splits for both (fixed seed); 10 repeats: at 90% the 5-split std was about 1 point.
    "$BIN" eval nodeclf --embeddings "$WORK/gs_emb_$i.h5" --labels "$DATA/blogcatalog/labels.tsv" --repeats 10 --seed 3 --json > "$WORK/gs_f1_$i.json"
    if (( have_gensim )); then
      /usr/bin/env time -f '%M' -o "$WORK/base_$i.rss" "$PY" "$DATA/../anchors/baseline_deepwalk.py" --graph "$DATA/blogcatalog/edges.tsv" \
        --num-walks "$W" --walk-length "$L" --out "$WORK/base_$i.npy" --workers 2 --json "$WORK/base_$i.json" > /dev/null 2>&1
      "$PY" - "$WORK/base_$i.npy" "$WORK/base_$i.h5" <<'PYEOF'
import sys, h5py, numpy as np
h5py.File(sys.argv[2], "w")["embeddings"] = np.load(sys.argv[1]).astype(np.float32)
PYEOF
      "$BIN" eval nodeclf --embeddings "$WORK/base_$i.h5" --labels "$DATA/blogcatalog/labels.tsv" --repeats 10 --seed 3 --json > "$WORK/base_f1_$i.json"
    fi
    echo "round $i done"
  done
  python3 - "$WORK" "$R" "$OUT/blogcatalog_vs_gensim.json" <<'PYEOF'
import json, os, sys, statistics
w, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
med = statistics.median
def gs_run(i):
    ms = [json.loads(l) for l in open(os.path.join(w, f"gs_metrics_{i}.jsonl"))]
    train = max(m["train_seconds"] for m in ms)
    start, end = map(float, open(os.path.join(w, f"gs_{i}.wall")).read().split())
    return {"wall_seconds": end - start, "train_seconds": train,
            "pairs_per_second": sum(m["pairs"] for m in ms) / train, "tokens_per_second": sum(m["tokens"] for m in ms) / train,
            "peak_rss_kib": int(open(os.path.join(w, f"gs_{i}.rss")).read().split()[-1]),
            "f1": json.load(open(os.path.join(w, f"gs_f1_{i}.json")))["results"]}
def base_run(i):
    b = json.load(open(os.path.join(w, f"base_{i}.json")))
    return {"raw": b, "wall_seconds": b["walk_phase_s"] + b["train_phase_s"], "tokens_per_second": b["train_tokens_per_s"],
            "pairs_per_second_upper": b["est_sg_pairs_per_s_upper"],
            "peak_rss_kib": int(open(os.path.join(w, f"base_{i}.rss")).read().split()[-1]),
            "f1": json.load(open(os.path.join(w, f"base_f1_{i}.json")))["results"]}
def summary(runs, keys):
    s = {k: med(r[k] for r in runs) for k in keys}
    s["micro_f1_mean"] = {f: statistics.mean(r["f1"][f]["micro_f1"] for r in runs) for f in runs[0]["f1"]}
    return s
res = {"rounds": rounds, "flags": os.environ.get("GS_FLAGS", ""), "graphscale": {"runs": [gs_run(i) for i in range(1, rounds + 1)]}}
res["graphscale"]["median"] = summary(res["graphscale"]["runs"], ["wall_seconds", "train_seconds", "pairs_per_second", "tokens_per_second", "peak_rss_kib"])
if os.path.exists(os.path.join(w, "base_1.json")):
    res["gensim"] = {"runs": [base_run(i) for i in range(1, rounds + 1)]}
    res["gensim"]["median"] = summary(res["gensim"]["runs"], ["wall_seconds", "tokens_per_second", "pairs_per_second_upper", "peak_rss_kib"])
    g, b = res["graphscale"], res["gensim"]
    res["ratio"] = {
        "tokens_per_second": g["median"]["tokens_per_second"] / b["median"]["tokens_per_second"],
        "tokens_per_second_per_round": [x["tokens_per_second"] / y["tokens_per_second"] for x, y in zip(g["runs"], b["runs"])],
        "wall_seconds": g["median"]["wall_seconds"] / b["median"]["wall_seconds"],
        "wall_seconds_per_round": [x["wall_seconds"] / y["wall_seconds"] for x, y in zip(g["runs"], b["runs"])],
        "peak_rss": g["median"]["peak_rss_kib"] / b["median"]["peak_rss_kib"],
        "micro_f1_points": {f: 100 * (g["median"]["micro_f1_mean"][f] - b["median"]["micro_f1_mean"][f]) for f in g["median"]["micro_f1_mean"]}}
json.dump(res, open(out, "w"), indent=1)
f1 = lambda s: " / ".join(f"{100 * s['micro_f1_mean'][f]:.2f}" for f in sorted(s["micro_f1_mean"]))
g = res["graphscale"]["median"]
print(f"graphscale (median of {rounds}): {g['wall_seconds']:.1f} s wall, {g['tokens_per_second'] / 1e3:.1f}k tokens/s, "
      f"{g['pairs_per_second'] / 1e6:.2f}M pairs/s, peak RSS {g['peak_rss_kib'] / 1024:.0f} MiB, mean Micro-F1 {f1(g)}")
if "gensim" in res:
    b, r = res["gensim"]["median"], res["ratio"]
    print(f"walks+gensim (median of {rounds}): {b['wall_seconds']:.1f} s (walks + training), {b['tokens_per_second'] / 1e3:.1f}k tokens/s, "
          f"<= {b['pairs_per_second_upper'] / 1e6:.2f}M pairs/s, peak RSS {b['peak_rss_kib'] / 1024:.0f} MiB, mean Micro-F1 {f1(b)}")
    print(f"ratio graphscale/gensim: {r['tokens_per_second']:.2f}x tokens/s (rounds: "
          + ", ".join(f"{x:.2f}" for x in r["tokens_per_second_per_round"])
          + f"), {r['wall_seconds']:.2f}x wall time (rounds: " + ", ".join(f"{x:.2f}" for x in r["wall_seconds_per_round"])
          + f"), {r['peak_rss']:.2f}x peak RSS, Micro-F1 " + " / ".join(f"{v:+.2f}" for _, v in sorted(r["micro_f1_points"].items())))
PYEOF
fi
