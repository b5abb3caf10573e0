#!/usr/bin/env bash
# PyTorch-BigGraph's DistMult or ComplEx on WN18RR on this machine, scored by `graphscale eval kg`
# (PBG's own evaluator is not filtered). Needs a Python with torch, torchbiggraph, h5py and
# setuptools<81 (PY=..., default /tmp/pbg/bin/python) and the converted WN18RR files of
# `bench/run_benchmarks.sh kg` (target/bench/kg). MODEL=distmult|complex (default distmult),
# EPOCHS (default 30).
#   [MODEL=complex] [EPOCHS=60] bench/pbg/run.sh [LR]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PY:-/tmp/pbg/bin/python}"
BIN="${BIN:-target/release/graphscale}"
K="${K:-target/bench/kg}"
MODEL="${MODEL:-distmult}" EPOCHS="${EPOCHS:-30}"
export PBG_TRAIN="$PWD/../shared/data/wn18rr/train.txt" PBG_MODEL="$MODEL" PBG_EPOCHS="$EPOCHS" PBG_LR="${1:-0.5}"
export PBG_OUT="$PWD/target/bench/pbg_${MODEL}_e${EPOCHS}_lr${1:-0.5}"
rm -rf "$PBG_OUT"; mkdir -p "$PBG_OUT"
bindir="$(dirname "$PY")"
"$bindir/torchbiggraph_import_from_tsv" --lhs-col=0 --rel-col=1 --rhs-col=2 bench/pbg/wn18rr.py "$PBG_TRAIN" > /dev/null
/usr/bin/time -f "PBG training: %e s wall, %M KiB peak" "$bindir/torchbiggraph_train" bench/pbg/wn18rr.py > "$PBG_OUT/train.log" 2> "$PBG_OUT/train.err" || { tail "$PBG_OUT/train.err"; exit 1; }
tail -1 "$PBG_OUT/train.err"
"$PY" bench/pbg/to_graphscale.py "$K/train.h5" "$PBG_OUT/pbg.h5" "$MODEL" "$EPOCHS" "$PBG_OUT/model" "$PBG_OUT/data" "$PBG_TRAIN"
"$BIN" eval kg --embeddings "$PBG_OUT/pbg.h5" --test "$K/test.h5" --filter "$K/train.h5,$K/valid.h5"
