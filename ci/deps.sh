#!/usr/bin/env bash
# Installs the Debian packages Weft needs to build and test (idempotent; quick when
# everything is already there). Needs root or sudo when something is missing.
set -euo pipefail
PKGS=(build-essential pkg-config libhwloc-dev libudev-dev
  # weft-verbs: rdma-mummy-sys builds its stub libibverbs with cmake and bindgen (libclang)
  cmake libclang1-14 libclang-common-14-dev
  # the verbs run time (libibverbs1, the rxe provider in ibverbs-providers) and tools
  rdma-core libibverbs1 ibverbs-providers ibverbs-utils perftest libibverbs-dev iproute2
  # weft-pmix: OpenPMIx's client and server libraries and headers (bindgen, above); Open
  # MPI's mpirun hosts a PMIx server for the tests of Weft under a foreign engine, and its
  # mpicc builds the Open MPI programs run under `weft run` (cli/tests/mpi.rs)
  libpmix-dev openmpi-bin libopenmpi-dev
  # PMIx tools and a debugger attached to a running job (cli/tests/tools.rs): OpenPMIx's
  # command-line tools (pps, ...) and gdb, which reads the launcher's MPIR table
  libpmix-bin gdb
  # MPICH programs under `weft run` (PMI-1, cli/tests/mpi.rs), and Slurm's PMI-2 client
  # library for the PMI-2 test
  mpich libmpich-dev libpmi2-0-dev
  # ci/mpi4py.sh: mpi4py's own test suite under weft run and mpirun (its test/ folder comes
  # from the same version's source package on PyPI, fetched with pip)
  python3-mpi4py python3-pip
  # a real single-node Slurm (ci/slurm.sh) for the tests under srun --mpi=pmix
  slurmd slurmctld slurm-client munge
  # ci/memcheck.sh: the codecs' and shared-memory layout's unsafe code under memcheck
  valgrind
  # ci/softroce.sh: the soft-RoCE VM
  qemu-system-x86 busybox-static cpio kmod)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
