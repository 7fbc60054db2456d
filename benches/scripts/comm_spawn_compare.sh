#!/usr/bin/env bash
# MPI_Comm_spawn under `weft run` against Open MPI's `mpirun` (issue 33's target: at most
# 0.5x), alternated in one run: benches/mpi/comm_spawn_time.c spawns N processes ITERS
# times (after one untimed) from a job of one process, the intercommunicator used both
# ways and disconnected, and prints the medians of the call's time and of the children's
# own MPI_Init and exec-to-MPI_Init-return (the part no launcher can remove).
#
# usage: benches/scripts/comm_spawn_compare.sh [--rounds R] [--iters I] [-n N]
#   --rounds R  alternations (default 2)
#   --iters I   timed spawns per run (default 7)
#   -n N        processes per spawn (default 4)
#
# Needs openmpi-bin and libopenmpi-dev (mpicc); builds a release weft. Installs nothing.
# Open MPI 4.1's mpirun may not end after such a job: it is stopped once the program
# printed its medians.
set -euo pipefail
cd "$(dirname "$0")/../.."
usage() { sed -n '2,15s/^# \{0,1\}//p' "$0"; }
rounds=2
iters=7
np=4
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="${2:?--rounds needs a value}"; shift ;;
    --iters) iters="${2:?--iters needs a value}"; shift ;;
    -n) np="${2:?-n needs a value}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "comm_spawn_compare.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
for t in mpirun mpicc; do
  command -v "$t" >/dev/null || { echo "comm_spawn_compare.sh: $t not found" >&2; exit 2; }
done
cargo build --release -q -p weft-cli
weft=$PWD/target/release/weft
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpicc -O2 -o "$work/comm_spawn_time" benches/mpi/comm_spawn_time.c
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# LAUNCHER...: runs the program, stopped once it printed its medians (or after 300 s).
run() {
  local out=$work/out
  : > "$out"
  "$@" "$work/comm_spawn_time" "$iters" "$np" < /dev/null > "$out" 2>&1 &
  local pid=$! i
  for i in $(seq 3000); do
    grep -q '^median' "$out" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  sleep 0.5
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  grep '^median' "$out" || { echo "it printed:"; cat "$out"; }
}

for r in $(seq "$rounds"); do
  echo "round $r:"
  printf '  weft run: '
  run "$weft" run -n 1
  printf '  mpirun:   '
  run mpirun --oversubscribe -n 1
done
