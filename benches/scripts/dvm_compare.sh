#!/usr/bin/env bash
# Job turnaround: the wall time of a whole job of N processes of PROGRAM (default
# /bin/true), from the command to its exit, submitted to a persistent runtime
# (`weft run --dvm`), started by `weft run` (servers started for it), and started by Open
# MPI's `mpirun` (its daemon started for it; Debian's Open MPI 4.1 has no persistent
# runtime of its own), alternated in one run; the median, minimum and maximum of ITERS
# jobs per launcher and round (after one untimed).
#
# usage: benches/scripts/dvm_compare.sh [--rounds R] [--iters I] [-n N] [--nodes K] [PROGRAM ARGS...]
#   --rounds R  alternations (default 3)
#   --iters I   jobs per launcher and round (default 20)
#   -n N        processes per job (default 4)
#   --nodes K   logical nodes of the runtime and of weft run (default 1)
#
# Needs openmpi-bin; builds a release weft. Installs nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() { sed -n '2,15s/^# \{0,1\}//p' "$0"; }
rounds=3
iters=20
np=4
nodes=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="${2:?--rounds needs a value}"; shift ;;
    --iters) iters="${2:?--iters needs a value}"; shift ;;
    -n) np="${2:?-n needs a value}"; shift ;;
    --nodes) nodes="${2:?--nodes needs a value}"; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "dvm_compare.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
prog=("$@")
[ ${#prog[@]} -gt 0 ] || prog=(/bin/true)
command -v mpirun >/dev/null || { echo "dvm_compare.sh: mpirun not found" >&2; exit 2; }
cargo build --release -q -p weft-cli
weft=$PWD/target/release/weft
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d /tmp/weft-dvm-compare.XXXXXX)
uri=$tmp/uri
"$weft" dvm start --nodes "$nodes" --report-uri "$uri" >/dev/null 2>"$tmp/dvm.err" &
dvm=$!
cleanup() {
  "$weft" dvm stop --dvm "$uri" >/dev/null 2>&1 || kill "$dvm" 2>/dev/null || true
  wait "$dvm" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
for _ in $(seq 1 300); do [ -s "$uri" ] && break; sleep 0.02; done
[ -s "$uri" ] || { echo "dvm_compare.sh: the runtime did not start:" >&2; cat "$tmp/dvm.err" >&2; exit 1; }

# Times ITERS runs of "$@" (after one untimed); prints "median min max" in ms.
timed() {
  "$@" >/dev/null 2>&1 || { echo "dvm_compare.sh: failed: $*" >&2; exit 1; }
  local i t0 t1 all=()
  for i in $(seq 1 "$iters"); do
    t0=$(date +%s%N)
    "$@" >/dev/null 2>&1 || { echo "dvm_compare.sh: failed: $*" >&2; exit 1; }
    t1=$(date +%s%N)
    all+=($(( (t1 - t0) / 1000 )))
  done
  printf '%s\n' "${all[@]}" | sort -n | awk '{v[NR]=$1} END {printf "%.2f %.2f %.2f\n", v[int((NR+1)/2)]/1000, v[1]/1000, v[NR]/1000}'
}

printf '# job of %d processes of %s, %d logical node(s), %d jobs per row\n' "$np" "${prog[*]}" "$nodes" "$iters"
printf '%-6s %-22s %10s %10s %10s\n' round launcher median_ms min_ms max_ms
for r in $(seq 1 "$rounds"); do
  printf '%-6s %-22s %s\n' "$r" "weft run --dvm" "$(timed "$weft" run --dvm "$uri" -n "$np" "${prog[@]}" | awk '{printf "%10s %10s %10s", $1, $2, $3}')"
  printf '%-6s %-22s %s\n' "$r" "weft run" "$(timed "$weft" run --nodes "$nodes" -n "$np" "${prog[@]}" | awk '{printf "%10s %10s %10s", $1, $2, $3}')"
  printf '%-6s %-22s %s\n' "$r" "mpirun" "$(timed mpirun --oversubscribe -n "$np" "${prog[@]}" | awk '{printf "%10s %10s %10s", $1, $2, $3}')"
done
