#!/usr/bin/env bash
# MPI baselines for Weft's point-to-point benchmarks: builds benches/mpi/osu_p2p.c (an
# OSU-equivalent latency, bw, bibw and message-rate program) with Debian's Open MPI and
# MPICH, runs each with 2 processes bound to different cores, and prints JSON lines in the
# schema of `weft bench latency|bw|bibw|mr --json` (plus "impl": "openmpi" | "mpich").
#
# usage: benches/scripts/mpi_compare.sh [--out FILE] [--impl openmpi|mpich|both]
#                                       [--sizes BYTES[,BYTES...]] [-- OSU_P2P_ARGS...]
#   --out FILE   write the JSON lines to FILE instead of stdout
#   --sizes L    sizes to measure (default: 0 and powers of two up to 4 MiB)
#   --impl I     only this MPI (default: both; a missing one is skipped with a reason)
#   OSU_P2P_ARGS passed to osu_p2p, e.g. -- --sizes 8,4194304 --bench latency,bw
#
# Installs nothing. Needs mpicc.openmpi/mpirun.openmpi (apt-get install openmpi-bin
# libopenmpi-dev) and/or mpicc.mpich/mpirun.mpich (apt-get install mpich libmpich-dev).
# Open MPI runs with --bind-to core --map-by core --allow-run-as-root and its shared-memory
# path only (OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1); MPICH with -bind-to core.
# Binaries go to target/osu_p2p.openmpi and target/osu_p2p.mpich.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() { sed -n '2,18s/^# \{0,1\}//p' "$0"; }

out=""
which="both"
sizes=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out)
      [ $# -ge 2 ] || { echo "mpi_compare.sh: --out needs a file" >&2; exit 2; }
      out="$2"; shift ;;
    --impl)
      [ $# -ge 2 ] || { echo "mpi_compare.sh: --impl needs a value" >&2; exit 2; }
      which="$2"; shift
      case "$which" in openmpi|mpich|both) ;; *)
        echo "mpi_compare.sh: --impl $which: expected openmpi, mpich or both" >&2; exit 2 ;;
      esac ;;
    --sizes)
      [ $# -ge 2 ] || { echo "mpi_compare.sh: --sizes needs a list" >&2; exit 2; }
      sizes=(--sizes "$2"); shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "mpi_compare.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
osu_args=("${sizes[@]}" "$@")

ncores=$(nproc 2>/dev/null || echo 1)
if [ "$ncores" -lt 2 ]; then
  echo "mpi_compare.sh: warning: $ncores core; the 2 processes share it, unbound" >&2
fi

mkdir -p target
if [ -n "$out" ]; then
  mkdir -p "$(dirname "$out")"
  : > "$out"
fi
emit() { if [ -n "$out" ]; then cat >> "$out"; else cat; fi; }

ran=0
failed=0
have() {  # have IMPL CC RUN PACKAGES
  local missing=""
  command -v "$2" >/dev/null 2>&1 || missing="$2"
  command -v "$3" >/dev/null 2>&1 || missing="$missing $3"
  if [ -n "$missing" ]; then
    echo "mpi_compare.sh: skipping $1: $missing not found (apt-get install $4)" >&2
    return 1
  fi
}

run_impl() {  # run_impl IMPL
  local impl="$1" cc run bin
  cc="mpicc.$impl"; run="mpirun.$impl"; bin="target/osu_p2p.$impl"
  local pkgs="openmpi-bin libopenmpi-dev"
  [ "$impl" = mpich ] && pkgs="mpich libmpich-dev"
  have "$impl" "$cc" "$run" "$pkgs" || return 0
  echo "mpi_compare.sh: building $bin with $cc" >&2
  "$cc" -O2 -Wall -o "$bin" benches/mpi/osu_p2p.c
  local cmd
  if [ "$impl" = openmpi ]; then
    cmd=(env OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}" OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}"
         "$run" --allow-run-as-root)
    if [ "$ncores" -ge 2 ]; then
      cmd+=(--bind-to core --map-by core)
    else
      cmd+=(--bind-to none --oversubscribe)
    fi
  else
    cmd=("$run")
    if [ "$ncores" -ge 2 ]; then cmd+=(-bind-to core); else cmd+=(-bind-to none); fi
  fi
  cmd+=(-n 2 "$bin")
  echo "mpi_compare.sh: ${cmd[*]} ${osu_args[*]}" >&2
  if "${cmd[@]}" "${osu_args[@]}" | emit; then
    ran=$((ran + 1))
  else
    echo "mpi_compare.sh: $impl run failed" >&2
    failed=$((failed + 1))
  fi
}

[ "$which" = mpich ] || run_impl openmpi
[ "$which" = openmpi ] || run_impl mpich

if [ "$failed" -gt 0 ]; then exit 1; fi
if [ "$ran" -eq 0 ]; then
  echo "mpi_compare.sh: no MPI found to compare against" >&2
  exit 1
fi
[ -n "$out" ] && echo "mpi_compare.sh: JSON lines in $out" >&2
exit 0
