#!/usr/bin/env bash
# Job startup: `weft run -n N` of examples/init_fence_exit (init, commit, one Full fence,
# finalize) against `mpirun -n N` of benches/mpi/hello.c (MPI_Init, rank/size, printf,
# MPI_Finalize), timed with hyperfine (--warmup 2 --runs 10). Prints both means and the ratio.
#
# usage: benches/scripts/startup.sh [-n N] [--json [FILE]]
#   -n N           processes per job (default 16)
#   --json [FILE]  also export hyperfine's JSON (default FILE: target/startup-hyperfine.json)
#
# Needs Debian's openmpi-bin and libopenmpi-dev (mpicc, mpirun), hyperfine, and jq or
# python3. Open MPI runs with the shared-memory and self transports and the ob1 PML
# (OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1, unless already set): what a single host
# needs, and faster than letting it probe UCX/OFI/openib at every start.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() { sed -n '2,13s/^# \{0,1\}//p' "$0"; }

np=16
json=""
while [ $# -gt 0 ]; do
  case "$1" in
    -n)
      [ $# -ge 2 ] || { echo "startup.sh: -n needs a value" >&2; exit 2; }
      np="$2"; shift ;;
    --json)
      json="target/startup-hyperfine.json"
      if [ $# -ge 2 ] && [[ "$2" != -* ]]; then json="$2"; shift; fi ;;
    -h|--help) usage; exit 0 ;;
    *) echo "startup.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[[ "$np" =~ ^[1-9][0-9]*$ ]] || { echo "startup.sh: -n $np is not a positive number" >&2; exit 2; }

need() {
  command -v "$1" >/dev/null 2>&1 || { echo "startup.sh: $1 not found: $2" >&2; exit 1; }
}
need mpicc "install Debian's MPI compiler wrapper: apt-get install libopenmpi-dev openmpi-bin"
need mpirun "install Debian's Open MPI launcher: apt-get install openmpi-bin"
need hyperfine "install it: apt-get install hyperfine"
need cargo "install Rust (stable, 1.85 or newer)"
if command -v jq >/dev/null 2>&1; then
  mean() { jq -r ".results[$2].mean" "$1"; }
elif command -v python3 >/dev/null 2>&1; then
  mean() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["results"][int(sys.argv[2])]["mean"])' "$1" "$2"; }
else
  echo "startup.sh: neither jq nor python3 found (needed to read hyperfine's JSON)" >&2
  exit 1
fi

cargo build --release --quiet --bin weft --example init_fence_exit
mkdir -p target
mpicc -O2 -o target/hello benches/mpi/hello.c

export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
export OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}"

weft_cmd="target/release/weft run -n $np target/release/examples/init_fence_exit"
mpi_cmd="mpirun --allow-run-as-root --oversubscribe -n $np target/hello"

# One checked run of each first: hyperfine only says "non-zero exit code".
$weft_cmd || { echo "startup.sh: '$weft_cmd' failed (exit $?)" >&2; exit 1; }
$mpi_cmd >/dev/null || { echo "startup.sh: '$mpi_cmd' failed (exit $?)" >&2; exit 1; }

out=$(mktemp)
trap 'rm -f "$out"' EXIT
hyperfine --warmup 2 --runs 10 --export-json "$out" \
  --command-name "weft run -n $np" "$weft_cmd" \
  --command-name "mpirun -n $np" "$mpi_cmd"

weft_mean=$(mean "$out" 0)
mpi_mean=$(mean "$out" 1)
awk -v w="$weft_mean" -v m="$mpi_mean" -v n="$np" 'BEGIN {
  printf "weft run -n %d (init, commit, Full fence, finalize): mean %.1f ms\n", n, w * 1000
  printf "mpirun   -n %d (MPI_Init, hello, MPI_Finalize):     mean %.1f ms\n", n, m * 1000
  printf "ratio weft/mpirun: %.3f (mpirun takes %.1fx as long)\n", w / m, m / w
}'
if [ -n "$json" ]; then
  mkdir -p "$(dirname "$json")"
  cp "$out" "$json"
  echo "hyperfine JSON: $json"
fi
