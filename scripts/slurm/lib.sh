# Shared by the graphscale Slurm scripts (sourced, not run). Slurm runs a copy of the batch
# script from its spool directory, so the scripts find this file through GS_HOME (default: the
# submit directory, a graphscale checkout).
#
# gs_setup            site settings (SITE_ENV, default $GS_HOME/scripts/slurm/site.env), the binary
#                     (BIN), the launcher (LAUNCHER=mpirun|srun; MPIRUN names the mpirun, e.g.
#                     mpirun.mpich, for a build against MPICH) and the threads per rank
# gs_launch K N ARGS  run graphscale with N ranks on the first K nodes of the allocation (or, with
#                     SIMULATE_NODES=1, all on this node with --ranks-per-node N/K: every group of
#                     ranks its own node, as a scaling study on one machine)
# gs_nodes            the node counts of a scaling study: NODE_COUNTS, or 1 2 4 ... up to the
#                     allocation's nodes

gs_setup() {
  GS_HOME="${GS_HOME:-${SLURM_SUBMIT_DIR:-.}}"
  SITE_ENV="${SITE_ENV:-$GS_HOME/scripts/slurm/site.env}"
  if [[ -f "$SITE_ENV" ]]; then
    echo "graphscale: site settings from $SITE_ENV"
    # shellcheck disable=SC1090
    source "$SITE_ENV"
  fi
  BIN="${BIN:-$GS_HOME/target/release/graphscale}"
  [[ -x "$BIN" ]] || { echo "graphscale: no binary at $BIN (build it: make build, or set BIN)" >&2; exit 1; }
  LAUNCHER="${LAUNCHER:-mpirun}"
  MPIRUN="${MPIRUN:-mpirun}"
  THREADS="${SLURM_CPUS_PER_TASK:-1}"
  # MPICH's launcher (Hydra: MPICH, Intel MPI, MVAPICH2) takes other flags than Open MPI's.
  MPI_FLAVOUR=openmpi
  if [[ "$LAUNCHER" == mpirun ]] && "$MPIRUN" --version 2>&1 | grep -qi hydra; then MPI_FLAVOUR=hydra; fi
  if [[ "$LAUNCHER" == mpirun && "$MPI_FLAVOUR" == openmpi ]]; then
    export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
    if [[ "$(id -u)" == 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
  fi
}

# gs_train MODEL     one training job over the whole allocation: GRAPH (required), OUT, CONFIG,
#                     CKPT (checkpoints on a shared filesystem; a resubmitted job resumes),
#                     CKPT_EVERY, EXTRA (more flags, word-split)
gs_train() {
  local model="$1"
  : "${GRAPH:?set GRAPH to an HDF5 edge file (graphscale convert edges.tsv -o edges.h5)}"
  OUT="${OUT:-emb-${SLURM_JOB_ID:-local}.h5}"
  local args=(--graph "$GRAPH" --model "$model" -o "$OUT" --threads "$THREADS" --metrics "${OUT%.h5}.metrics.jsonl")
  [[ -n "${CONFIG:-}" ]] && args+=(--config "$CONFIG")
  [[ -n "${CKPT:-}" ]] && args+=(--checkpoint-dir "$CKPT" --checkpoint-every "${CKPT_EVERY:-10m}" --resume-if-present "$CKPT")
  # shellcheck disable=SC2206
  [[ -n "${EXTRA:-}" ]] && args+=($EXTRA)
  echo "graphscale: $model, ${SLURM_NTASKS:-4} ranks on ${SLURM_JOB_NODELIST:-localhost}; graph $GRAPH -> $OUT"
  local rc=0 before=""
  [[ -f "$OUT" ]] && before=$(stat -c %Y "$OUT")
  gs_launch "${SLURM_JOB_NUM_NODES:-1}" "${SLURM_NTASKS:-4}" "${args[@]}" || rc=$?
  # Hydra before MPICH 4.2 (mpirun.mpich of Debian 12's 4.0.2) can report exit status 0 for a
  # job it passed a signal to, though every rank exited 4: a "success" that wrote no new
  # embeddings while the checkpoint directory holds a committed checkpoint was that stop.
  if [[ $rc == 0 && -n "${CKPT:-}" && -f "$CKPT/LATEST" ]] \
    && { [[ ! -f "$OUT" ]] || [[ "$(stat -c %Y "$OUT")" == "$before" ]]; }; then
    echo "graphscale: the launcher reported success but no embeddings were written: stopped at a checkpoint (exit 4)"
    rc=4
  fi
  if [[ $rc == 4 && "${REQUEUE:-0}" == 1 && -n "${SLURM_JOB_ID:-}" ]]; then
    echo "graphscale: stopped at a committed checkpoint; requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
  fi
  return "$rc"
}

gs_nodes() {
  if [[ -n "${NODE_COUNTS:-}" ]]; then
    echo "$NODE_COUNTS"
    return
  fi
  local max="${SIM_NODES:-${SLURM_JOB_NUM_NODES:-1}}" k=1 out=""
  while (( k <= max )); do out+="$k "; k=$(( k * 2 )); done
  echo "$out"
}

# The launcher runs in the background so that the script can pass on Slurm's warning signal
# (`#SBATCH --signal=B:USR1@T`, or a TERM): graphscale commits a checkpoint at its next step and
# exits 4. mpirun forwards SIGUSR1 to every rank; srun forwards it to its tasks.
gs_launch() {
  local rc=0
  _gs_launch "$@" &
  local pid=$!
  trap 'echo "graphscale: signal received: asking the ranks to checkpoint and stop"; kill -USR1 "$pid" 2>/dev/null || true' USR1 TERM
  wait "$pid" || rc=$?
  # A trapped signal interrupts wait (status > 128): wait again for the job itself.
  while kill -0 "$pid" 2>/dev/null; do rc=0; wait "$pid" || rc=$?; done
  trap - USR1 TERM
  return "$rc"
}

_gs_launch() {
  local k="$1" n="$2"
  shift 2
  local per=$(( n / k ))
  (( per >= 1 && per * k == n )) || { echo "graphscale: $n ranks do not split over $k nodes" >&2; return 1; }
  local extra=()
  [[ "${SIMULATE_NODES:-0}" == 1 ]] && extra=(--ranks-per-node "$per")
  local how="node(s)"
  [[ "${SIMULATE_NODES:-0}" == 1 ]] && how="simulated node(s) on this machine"
  echo "graphscale: $n ranks, $per per node, on $k $how: ${*}"
  if [[ "$LAUNCHER" == srun ]]; then
    # The whole step dies when one task fails. srun does not inherit the batch job's
    # --cpus-per-task (Slurm 22.05 and later): without it a rank's THREADS share one CPU.
    if [[ "${SIMULATE_NODES:-0}" == 1 ]]; then
      exec srun --kill-on-bad-exit=1 --mpi="${SRUN_MPI:-pmix}" -N 1 -n "$n" --cpus-per-task "$THREADS" --overcommit "$BIN" "$@" "${extra[@]}"
    else
      exec srun --kill-on-bad-exit=1 --mpi="${SRUN_MPI:-pmix}" -N "$k" -n "$n" --ntasks-per-node "$per" --cpus-per-task "$THREADS" "$BIN" "$@"
    fi
    return
  fi
  local hosts=""
  if [[ "${SIMULATE_NODES:-0}" != 1 && -n "${SLURM_JOB_NODELIST:-}" ]]; then
    hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n "$k" | paste -sd, -)
  fi
  local place=()
  if [[ "$MPI_FLAVOUR" == hydra ]]; then
    # Hydra kills the job when a rank fails, binds nothing by default (a rank's threads are
    # free to use its task's CPUs) and runs more ranks than cores without being asked.
    [[ -n "$hosts" ]] && place+=(-hosts "$hosts" -ppn "$per")
    exec "$MPIRUN" "${place[@]}" -n "$n" "$BIN" "$@" "${extra[@]}"
  fi
  # Open MPI's mpirun aborts the job when a rank exits non-zero or calls MPI_Abort. It binds a
  # rank to one core by default: a rank gets all of its task's CPUs.
  [[ "$THREADS" -gt 1 ]] && place=(--map-by "slot:PE=$THREADS")
  [[ -n "$hosts" ]] && place+=(--host "$(echo "$hosts" | sed "s/,/:$per,/g; s/\$/:$per/")")
  # More ranks than the allocation's slots only where asked (OVERSUBSCRIBE=1) or simulated: on
  # a cluster it hides a mis-sized allocation (ranks sharing cores, at a fraction of the speed).
  [[ "${OVERSUBSCRIBE:-0}" == 1 || "${SIMULATE_NODES:-0}" == 1 ]] && place+=(--oversubscribe)
  # exec: the launcher is the background process gs_launch signals.
  exec "$MPIRUN" "${place[@]}" -n "$n" "$BIN" "$@" "${extra[@]}"
}
