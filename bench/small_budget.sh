#!/usr/bin/env bash
# Learning from few samples per node (docs/tuning.md, "Learning from few samples"): planted
# partitions of 2^SCALE nodes (64 blocks, avg degree 60, 30% of edges between blocks), DeepWalk at
# the billion-node budget (1 walk x 20, window 5, d 32, f16 rows, 1 process x THREADS threads),
# with the defaults against word2vec's rate (--lr 0.025, the default until 2026-12-07), SEEDS
# alternated; Micro-F1 at 50% labelled on 50,000 nodes drawn uniformly, and the medians.
#   SCALES="20 22" SEEDS="0 1 2" bench/small_budget.sh
# Needs a release build (make build) and python3. Work files go to WORK (default target/small_budget).
set -euo pipefail
cd "$(dirname "$0")/.."
GS=${GS:-target/release/graphscale}
WORK=${WORK:-target/small_budget}
SCALES=${SCALES:-20 22}
SEEDS=${SEEDS:-0 1 2}
THREADS=${THREADS:-2}
mkdir -p "$WORK"
flags="--walks-per-node 1 --walk-length 20 --window 5 --dim 32 --negatives 5 --dtype f16 --threads $THREADS"

micro() {
    "$GS" eval nodeclf --embeddings "$1" --labels "$2" --train-fractions 0.5 --repeats 2 --json |
        python3 -c 'import json, sys; print(round(100 * json.load(sys.stdin)["results"]["0.5"]["micro_f1"], 2))'
}

median() { python3 -c 'import statistics, sys; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }

for scale in $SCALES; do
    n=$((1 << scale))
    g="$WORK/sbm$scale.h5" l="$WORK/sbm$scale.tsv" s="$WORK/sample$scale.tsv"
    if [ ! -f "$g" ]; then
        "$GS" generate sbm --nodes "$n" --blocks 64 --avg-degree 60 --mix 0.3 -o "$g" --labels "$l" >/dev/null
        python3 - "$l" "$s" <<'EOF'
import random, sys
lines = open(sys.argv[1]).read().splitlines()
keep = sorted(random.Random(0).sample(range(len(lines)), min(50000, len(lines))))
open(sys.argv[2], "w").write("".join(lines[i] + "\n" for i in keep))
EOF
    fi
    new=() old=()
    for seed in $SEEDS; do
        for mode in defaults lr0.025; do
            extra=()
            [ "$mode" = lr0.025 ] && extra=(--lr 0.025)
            log="$WORK/run$scale.log"
            "$GS" --graph "$g" $flags --seed "$seed" "${extra[@]}" -o "$WORK/emb$scale.h5" >"$log" 2>&1
            f1=$(micro "$WORK/emb$scale.h5" "$s")
            stalled=$(grep -c "not learning" "$log" || true)
            rate=$(grep -o '[0-9]* pairs/s' "$log" | tail -1)
            echo "2^$scale $mode seed $seed: Micro-F1 $f1, $rate, stall warnings $stalled"
            if [ "$mode" = defaults ]; then new+=("$f1"); else old+=("$f1"); fi
        done
    done
    echo "2^$scale medians: defaults $(median "${new[@]}"), --lr 0.025 $(median "${old[@]}")"
done
