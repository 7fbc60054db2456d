#!/usr/bin/env bash
# Weft under each engine that can start it, in one run (issue 17's figures): wall time of
# examples/init_fence_exit (init, commit, one Full fence, finalize) with N processes under
# `weft run`, Open MPI's `mpirun` and Slurm's `srun --mpi=pmix` (hyperfine --warmup 2
# --runs 10), then rank 0's median time of put + commit + Full fence (64-byte card) from
# `weft bench fence` under each.
#
# usage: benches/scripts/hosts.sh [-n N]      (default 16)
#
# Slurm: uses the cluster SLURM_CONF names when one answers `sinfo`; otherwise run it as
# `ci/slurm.sh -- benches/scripts/hosts.sh`. Needs hyperfine, openmpi-bin and jq or python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
np=16
while [ $# -gt 0 ]; do
  case "$1" in
    -n) [ $# -ge 2 ] || { echo "hosts.sh: -n needs a value" >&2; exit 2; }; np="$2"; shift ;;
    -h|--help) sed -n '2,11s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "hosts.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ "$np" =~ ^[1-9][0-9]*$ ]] || { echo "hosts.sh: -n $np is not a positive number" >&2; exit 2; }
for t in hyperfine mpirun.openmpi; do
  command -v "$t" >/dev/null || { echo "hosts.sh: $t not found" >&2; exit 1; }
done
slurm=0
if command -v srun >/dev/null && sinfo -h -o %t 2>/dev/null | grep -q -E '^(idle|mix|alloc)'; then
  slurm=1
else
  echo "hosts.sh: no running Slurm (run under ci/slurm.sh --): srun skipped" >&2
fi
if command -v jq >/dev/null 2>&1; then
  mean() { jq -r ".results[$2].mean" "$1"; }
else
  mean() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["results"][int(sys.argv[2])]["mean"])' "$1" "$2"; }
fi
cargo build --release --quiet --bin weft --example init_fence_exit
root=""
[ "$(id -u)" = 0 ] && root="--allow-run-as-root"
prog=target/release/examples/init_fence_exit
weft_cmd="target/release/weft run -n $np $prog"
mpi_cmd="mpirun.openmpi $root --oversubscribe --bind-to none -n $np $prog"
srun_cmd="srun --mpi=pmix -n $np $prog"
names=("weft run" "mpirun")
runs=("$weft_cmd" "$mpi_cmd")
if [ $slurm = 1 ]; then
  names+=("srun")
  runs+=("$srun_cmd")
fi
cmds=()
for i in "${!names[@]}"; do
  # One checked run of each first: hyperfine only says "non-zero exit code".
  ${runs[$i]} >/dev/null || { echo "hosts.sh: '${runs[$i]}' failed" >&2; exit 1; }
  cmds+=(--command-name "${names[$i]}" "${runs[$i]}")
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
hyperfine --warmup 2 --runs 10 --export-json "$out" "${cmds[@]}" >&2
echo "# init_fence_exit, $np processes: wall time per job"
for i in "${!names[@]}"; do
  printf '%-10s %8.1f ms\n' "${names[$i]}" "$(awk -v m="$(mean "$out" "$i")" 'BEGIN{print m*1000}')"
done
echo "# weft bench fence --modes full --card 64, $np processes: rank 0's median (us)"
bench="target/release/weft bench fence --modes full --card 64 --iters 50"
full() { awk '$1 == "full" && $2 == 64 { print $3 }'; }
printf '%-10s %8s us\n' "weft run" "$($bench -n "$np" | full)"
printf '%-10s %8s us\n' "mpirun" "$(mpirun.openmpi $root --oversubscribe --bind-to none -n "$np" $bench | full)"
if [ $slurm = 1 ]; then
  printf '%-10s %8s us\n' "srun" "$(srun --mpi=pmix -n "$np" $bench | full)"
fi
