#!/usr/bin/env bash
# Submit scripts/slurm/run_deepwalk.slurm to a real, single-node Slurm started here (no systemd),
# and check that a good job completes with embeddings and a failing job ends FAILED, not hung.
#   bash scripts/slurm/selftest.sh          (as root on Debian 12; installs slurm-wlm and munge)
# Needs a release build (make build). Everything Slurm writes lives under a temporary directory;
# the daemons are stopped on exit. After the Open MPI jobs below (mpirun), a good and a failing
# job run again under every other launcher: srun with Open MPI (PMIx) and, when a build against
# MPICH exists (MPICH_BIN, default target/mpich/release/graphscale: make build-mpich),
# MPICH's mpirun.mpich and srun --mpi=pmi2.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$(pwd)"
BIN="$ROOT/target/release/graphscale"
[[ -x "$BIN" ]] || { echo "selftest: build first (make build)" >&2; exit 1; }

if ! command -v sbatch > /dev/null || ! command -v munged > /dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge > /dev/null
fi

W="$(mktemp -d /tmp/gs-slurm.XXXXXX)"
HOST="$(hostname -s)"
cleanup() {
  pkill -f "slurmctld -f $W/slurm.conf" 2> /dev/null || true
  pkill -f "slurmd -f $W/slurm.conf" 2> /dev/null || true
}
trap cleanup EXIT

# munge: the key is created by the package; start the daemon if it is not running.
if ! pgrep -x munged > /dev/null; then
  mkdir -p /run/munge && chown munge:munge /run/munge
  [[ -f /etc/munge/munge.key ]] || /usr/sbin/mungekey --create > /dev/null 2>&1 || true
  runuser -u munge -- /usr/sbin/munged
fi

mkdir -p "$W"/{state,spool,log}
cat > "$W/slurm.conf" <<EOF
ClusterName=gstest
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
StateSaveLocation=$W/state
SlurmdSpoolDir=$W/spool
SlurmctldPidFile=$W/slurmctld.pid
SlurmdPidFile=$W/slurmd.pid
SlurmctldLogFile=$W/log/slurmctld.log
SlurmdLogFile=$W/log/slurmd.log
SlurmctldPort=16817
SlurmdPort=16818
NodeName=$HOST CPUs=$(nproc) RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES OverSubscribe=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$W/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 30); do
  sinfo -h -o %T 2> /dev/null | grep -qE "idle|mixed" && break
  sleep 1
done
sinfo

"$BIN" generate sbm --nodes 2000 --blocks 10 --seed 1 -o "$W/g.h5" --labels "$W/labels.tsv" > /dev/null

# A good job: 4 ranks on this node (more tasks than CPUs need --overcommit), with checkpoints.
jid=$(sbatch --parsable --wait --ntasks 4 --overcommit --chdir "$W" --output "$W/good-%j.out" \
  --export=ALL,GRAPH="$W/g.h5",OUT="$W/emb.h5",BIN="$BIN",CKPT="$W/ck",CKPT_EVERY=20,EXTRA="--walks-per-node 4 --comm-timeout 60" \
  "$ROOT/scripts/slurm/run_deepwalk.slurm") || { cat "$W"/good-*.out; echo "selftest: good job failed" >&2; exit 1; }
state=$(scontrol show job "$jid" 2> /dev/null | grep -o "JobState=[A-Z]*" || echo "JobState=(purged)")
echo "good job $jid: $state"
[[ -f "$W/emb.h5" && -f "$W/ck/LATEST" ]] || { cat "$W"/good-*.out; echo "selftest: no embeddings or checkpoint" >&2; exit 1; }
"$BIN" eval nodeclf --embeddings "$W/emb.h5" --labels "$W/labels.tsv" --train-fractions 0.5 --repeats 2

# A hybrid job: 1 rank with 2 CPUs; mpirun must give the rank both (no sharing warning).
sbatch --parsable --wait --ntasks 1 --cpus-per-task 2 --chdir "$W" --output "$W/hybrid-%j.out" \
  --export=ALL,GRAPH="$W/g.h5",OUT="$W/hybrid.h5",BIN="$BIN",EXTRA="--walks-per-node 2 --comm-timeout 60" \
  "$ROOT/scripts/slurm/run_deepwalk.slurm" > /dev/null || { cat "$W"/hybrid-*.out; echo "selftest: hybrid job failed" >&2; exit 1; }
if grep -q "compute threads: they will share" "$W"/hybrid-*.out; then
  cat "$W"/hybrid-*.out; echo "selftest: the rank's 2 threads were bound to one CPU" >&2; exit 1
fi
echo "hybrid job: 1 rank x 2 threads, not bound to one core"

# Scaling studies on simulated nodes (every rank its own node), both strategies, to their report.
for kind in strong weak; do
  sbatch --parsable --wait --nodes 1 --ntasks 2 --ntasks-per-node 2 --overcommit --chdir "$W" --output "$W/$kind-%j.out" \
    --export=ALL,GRAPH="$W/g.h5",BIN="$BIN",GS_HOME="$ROOT",SIMULATE_NODES=1,SIM_NODES=2,RANKS_PER_NODE=1,BASE_SCALE=10,OUTDIR="$W/$kind",EXTRA="--walks-per-node 2 --walk-length 20 --dim 16 --comm-timeout 60" \
    "$ROOT/scripts/slurm/${kind}_scaling.slurm" > /dev/null || { cat "$W"/$kind-*.out; echo "selftest: $kind scaling job failed" >&2; exit 1; }
  rows=$(( $(wc -l < "$W/$kind/report/runs.csv") - 1 ))
  [[ $rows == 4 && -f "$W/$kind/report/speedup.svg" ]] || { cat "$W"/$kind-*.out; echo "selftest: $kind scaling report has $rows runs, 4 expected" >&2; exit 1; }
  echo "$kind scaling job: 4 runs (1 and 2 simulated nodes x sharded, replicated) and their report"
done

# A failing job: one rank is killed mid-run (SIGKILL at step 20); the whole job must end FAILED, well before its limit.
# (EXTRA holds commas, which --export would split: it travels in the environment instead.)
start=$(date +%s)
export EXTRA="--comm-timeout 20 --inject-fault rank=2,step=20,kind=kill"
if sbatch --parsable --wait --ntasks 4 --overcommit --time 5 --chdir "$W" --output "$W/bad-%j.out" \
  --export=ALL,GRAPH="$W/g.h5",OUT="$W/bad.h5",BIN="$BIN" \
  "$ROOT/scripts/slurm/run_deepwalk.slurm" > "$W/bad.jid"; then
  cat "$W"/bad-*.out; echo "selftest: a job with a killed rank reported success" >&2; exit 1
fi
echo "failing job $(cat "$W/bad.jid") ended non-zero after $(( $(date +%s) - start )) s"
grep -q "injecting fault" "$W"/bad-*.out || { cat "$W"/bad-*.out; echo "selftest: the job failed for another reason" >&2; exit 1; }
grep -h "signal 9" "$W"/bad-*.out | head -2 || true

# launcher_jobs NAME BIN VAR=value...: a good job and a failing job with the launcher settings
# given (LAUNCHER, SRUN_MPI, MPIRUN), each checked as above.
launcher_jobs() {
  local name="$1" bin="$2"
  shift 2
  local t0 jid
  jid=$(env "$@" EXTRA="--walks-per-node 2 --comm-timeout 60" sbatch --parsable --wait --ntasks 4 --overcommit --chdir "$W" \
    --output "$W/$name-good-%j.out" --export=ALL,GRAPH="$W/g.h5",OUT="$W/$name.h5",BIN="$bin" \
    "$ROOT/scripts/slurm/run_deepwalk.slurm") || { cat "$W/$name"-good-*.out; echo "selftest: $name: good job failed" >&2; exit 1; }
  [[ -f "$W/$name.h5" ]] || { cat "$W/$name"-good-*.out; echo "selftest: $name: no embeddings" >&2; exit 1; }
  echo "$name: good job $jid wrote $name.h5 with 4 ranks"
  t0=$(date +%s)
  if env "$@" EXTRA="--comm-timeout 20 --inject-fault rank=2,step=20,kind=kill" sbatch --parsable --wait --ntasks 4 --overcommit --time 5 \
    --chdir "$W" --output "$W/$name-bad-%j.out" --export=ALL,GRAPH="$W/g.h5",OUT="$W/$name-bad.h5",BIN="$bin" \
    "$ROOT/scripts/slurm/run_deepwalk.slurm" > /dev/null; then
    cat "$W/$name"-bad-*.out; echo "selftest: $name: a job with a killed rank reported success" >&2; exit 1
  fi
  grep -q "injecting fault" "$W/$name"-bad-*.out || { cat "$W/$name"-bad-*.out; echo "selftest: $name: the job failed for another reason" >&2; exit 1; }
  echo "$name: failing job ended non-zero after $(( $(date +%s) - t0 )) s"
}
launcher_jobs openmpi-srun "$BIN" LAUNCHER=srun SRUN_MPI=pmix
MPICH_BIN="${MPICH_BIN:-$ROOT/target/mpich/release/graphscale}"
if [[ -x "$MPICH_BIN" ]] && "$MPICH_BIN" --version | grep MPICH > /dev/null; then
  launcher_jobs mpich-mpirun "$MPICH_BIN" LAUNCHER=mpirun MPIRUN=mpirun.mpich
  launcher_jobs mpich-srun "$MPICH_BIN" LAUNCHER=srun SRUN_MPI=pmi2
else
  echo "selftest: no MPICH build at $MPICH_BIN: MPICH's launchers not checked (make build-mpich)"
fi
echo "selftest: OK ($W)"
