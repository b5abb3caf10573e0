#!/usr/bin/env bash
# Installs the system packages graphscale needs on Debian 12 (idempotent).
# Open MPI, serial HDF5, libclang (for rsmpi's bindgen), pkg-config, and a Python
# with numpy/scikit-learn for the optional cross-checks in bench/, and DejaVu Sans for the PNG
# plots of `graphscale report`.
#   bash scripts/setup.sh           the packages `make build/test/demo` need
#   bash scripts/setup.sh mpich     also MPICH beside Open MPI (`make test-mpich`); Open MPI stays
#                                   the default mpicc/mpirun, MPICH is reached as mpicc.mpich and
#                                   mpiexec.mpich
set -euo pipefail

pkgs=(openmpi-bin libopenmpi-dev libhdf5-dev hdf5-tools libclang-dev clang pkg-config make time fonts-dejavu-core)
[[ "${1:-}" == mpich ]] && pkgs+=(mpich libmpich-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: system packages present"
fi
