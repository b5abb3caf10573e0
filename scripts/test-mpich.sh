#!/usr/bin/env bash
# The test suites under MPICH (MPICH 4 from Debian; the ABI family of Cray MPICH, Intel MPI and
# MVAPICH2): graphscale built against mpicc.mpich into target/mpich (mpi-sys does not rebuild when
# the MPI changes, so each library keeps its own target directory), the unit tests, then every
# integration suite with its ranks launched by mpiexec.mpich (tests/common: GRAPHSCALE_TEST_MPI).
#   bash scripts/test-mpich.sh                    every suite (make test-mpich runs set-up first)
#   bash scripts/test-mpich.sh --test mpi ...     the suites named (cargo test's selection)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v mpicc.mpich > /dev/null || { echo "test-mpich: no mpicc.mpich (bash scripts/setup.sh mpich)" >&2; exit 1; }
export MPICC=mpicc.mpich
export CARGO_TARGET_DIR="${MPICH_TARGET_DIR:-target/mpich}"
export GRAPHSCALE_TEST_MPI=mpich
sel=("$@")
[[ ${#sel[@]} -gt 0 ]] || sel=(--lib --bins --tests)
cargo test --no-run "${sel[@]}"
# The binary must really be linked against MPICH, not the Open MPI found first.
lib=$("$CARGO_TARGET_DIR/debug/graphscale" --version | grep "^MPI:" || true)
echo "test-mpich: $lib"
grep -qi mpich <<< "$lib" || { echo "test-mpich: the build is not linked against MPICH" >&2; exit 1; }
start=$(date +%s)
cargo test --no-fail-fast "${sel[@]}"
echo "test-mpich: passed in $(( $(date +%s) - start )) s"
