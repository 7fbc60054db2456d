#!/usr/bin/env bash
# PMIx_Spawn under `weft run` against Open MPI's `mpirun` on this machine (issue 33's
# target), alternated in one run: benches/c/spawn_pmix.c spawns N processes ITERS times
# (after 2 untimed) from a job of one process and prints the median, minimum and maximum
# of the call's time to its return. Each launcher is run with children that initialize at
# once (DELAY 0: the children of one spawn start while the next is timed, competing for
# the cores) and with children that sleep DELAY ms first (the spawn alone), then Weft's
# native `weft bench spawn`.
#
# usage: benches/scripts/spawn_compare.sh [--rounds R] [--iters I] [-n N] [--delay MS]
#   --rounds R  alternations (default 2)
#   --iters I   timed spawns per run (default 20)
#   -n N        processes per spawn (default 4)
#   --delay MS  the children's sleep in the second setting (default 300)
#
# Needs openmpi-bin, libpmix-dev, cc, and builds a release weft. Installs nothing. Open
# MPI 4.1's mpirun does not end after such a job: it is stopped once the program printed.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() { sed -n '2,17s/^# \{0,1\}//p' "$0"; }
rounds=2
iters=20
np=4
delay=300
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="${2:?--rounds needs a value}"; shift ;;
    --iters) iters="${2:?--iters needs a value}"; shift ;;
    -n) np="${2:?-n needs a value}"; shift ;;
    --delay) delay="${2:?--delay needs a value}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "spawn_compare.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
for t in mpirun cc pkg-config; do
  command -v "$t" >/dev/null || { echo "spawn_compare.sh: $t not found" >&2; exit 2; }
done
cargo build --release -q -p weft-cli
weft=$PWD/target/release/weft
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -o "$work/spawn_pmix" benches/c/spawn_pmix.c $(pkg-config --cflags --libs pmix)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# mpirun, stopped once the program printed its line (or after 120 s).
run_mpirun() {
  local out=$work/mpirun.out
  : > "$out"
  mpirun --oversubscribe -n 1 "$work/spawn_pmix" "$iters" "$np" "$1" < /dev/null > "$out" 2>&1 &
  local pid=$! i
  for i in $(seq 1200); do
    grep -q median "$out" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  grep median "$out" || { echo "mpirun printed:"; cat "$out"; }
}

for r in $(seq "$rounds"); do
  for d in 0 "$delay"; do
    echo "round $r, children sleep $d ms:"
    printf '  weft run: '
    timeout 120 "$weft" run -n 1 "$work/spawn_pmix" "$iters" "$np" "$d"
    printf '  mpirun:   '
    run_mpirun "$d"
  done
  echo "round $r, weft bench spawn (Client::spawn):"
  "$weft" bench spawn --procs "$np" --iters "$iters" --json
done
