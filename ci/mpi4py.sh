#!/usr/bin/env bash
# mpi4py's own test suite under `weft run` and under Open MPI's `mpirun`, test by test.
#
# Debian's python3-mpi4py (built on Open MPI) runs its suite from the `test/` folder of the
# same version's source package (fetched once from PyPI with pip, cached under
# ${WEFT_MPI4PY_CACHE:-~/.cache/weft-mpi4py}). For each process count, every test that
# passes on every rank under `mpirun` must pass on every rank under `weft run`; the script
# prints each one that does not, with its outcome, and exits 1 if there is any.
#
#   ci/mpi4py.sh [-n "1 2 4"] [--weft PATH] [--spawn | --dynamic]
#
# --spawn runs the dynamic-process tests too (test_spawn: MPI_Comm_spawn and
# spawn_multiple; test_dynproc: publish/lookup, accept/connect, join); without it they are
# excluded from both runs. --dynamic runs only those. mpi4py 3.1.4 runs them whenever
# runtests.py is not told to exclude them (MPI4PY_TEST_SPAWN, set too, is for later
# versions). Open MPI's mpirun hangs in them at 2 processes and more (it never finishes a
# spawn's connect), so its run is cut after WEFT_MPI4PY_MPIRUN_TIMEOUT seconds (1200; 240
# with --dynamic): what it passed before is what weft run must pass.
# Needs: python3-mpi4py, python3-pip, openmpi-bin (ci/deps.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
counts="1 2 4" weft=$PWD/target/debug/weft spawn=0 only=0
while [[ $# -gt 0 ]]; do
  case $1 in
    -n) counts=$2; shift 2 ;;
    --weft) weft=$2; shift 2 ;;
    --spawn) spawn=1; shift ;;
    --dynamic) spawn=1 only=1; shift ;;
    *) echo "usage: ci/mpi4py.sh [-n \"1 2 4\"] [--weft PATH] [--spawn | --dynamic]" >&2; exit 2 ;;
  esac
done
mpirun_timeout=${WEFT_MPI4PY_MPIRUN_TIMEOUT:-$([[ $only == 1 ]] && echo 240 || echo 1200)}
[[ -x $weft ]] || { echo "mpi4py: $weft is not built (cargo build --bins)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "mpi4py: mpirun not found (openmpi-bin)" >&2; exit 2; }
py=/usr/bin/python3
ver=$($py -c 'import mpi4py; print(mpi4py.__version__)') ||
  { echo "mpi4py: python3 cannot import mpi4py (python3-mpi4py)" >&2; exit 2; }

cache=${WEFT_MPI4PY_CACHE:-$HOME/.cache/weft-mpi4py}
src=$cache/mpi4py-$ver
if [[ ! -f $src/test/runtests.py ]]; then
  mkdir -p "$cache"
  $py -m pip download --quiet --no-deps --no-binary :all: --dest "$cache" "mpi4py==$ver"
  tar -xzf "$cache/mpi4py-$ver.tar.gz" -C "$cache"
fi
[[ -f $src/test/runtests.py ]] || { echo "mpi4py: no test/runtests.py in $src" >&2; exit 2; }

out=$(mktemp -d /var/tmp/weft-mpi4py.XXXXXX)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
excl=(-e spawn -e dynproc)
if [[ $spawn == 1 ]]; then excl=(); export MPI4PY_TEST_SPAWN=1; fi
if [[ $only == 1 ]]; then excl=(-i spawn -i dynproc); fi
# Each rank writes its verbose unittest output to its own file (the rank comes from the
# launcher's environment: Open MPI's, or the PMIx/PMI/Weft names weft run sets).
cat >"$out/rank.sh" <<'EOF'
#!/bin/sh
r=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${PMI_RANK:-${WEFT_RANK:-x}}}}
exec "$@" 2>"$MPI4PY_OUT.$r"
EOF
chmod +x "$out/rank.sh"

fail=0
for n in $counts; do
  for launcher in mpirun weft; do
    dir=$out/$launcher-$n
    mkdir -p "$dir"
    cmd=("$out/rank.sh" $py "$src/test/runtests.py" -v --no-builddir "${excl[@]}")
    start=$(date +%s)
    rc=0
    if [[ $launcher == mpirun ]]; then
      MPI4PY_OUT=$dir/r timeout "$mpirun_timeout" mpirun -x MPI4PY_OUT -n "$n" "${cmd[@]}" >"$dir/stdout" 2>&1 || rc=$?
    else
      MPI4PY_OUT=$dir/r timeout 1200 "$weft" run -n "$n" "${cmd[@]}" >"$dir/stdout" 2>&1 || rc=$?
    fi
    files=("$dir"/r.*)
    [[ -e ${files[0]} ]] || { echo "mpi4py: $launcher -n $n wrote no results (exit $rc)"; tail -20 "$dir/stdout"; fail=1; continue; }
    # "test (module.Class.test) ... outcome": the outcome of each test on each rank.
    for f in "${files[@]}"; do
      sed -n 's/^\(test[^ ]* ([^)]*)\) \.\.\. \([a-zA-Z]*\).*/\1 \2/p' "$f"
    done | sort | uniq -c >"$dir/outcomes"
    summary=$(for f in "${files[@]}"; do grep -h '^Ran \|^OK\|^FAILED' "$f" | tr '\n' ' '; echo; done | sort | uniq -c | tr -s ' ')
    echo "mpi4py -n $n under $launcher: exit $rc in $(($(date +%s) - start)) s;$summary"
  done
  m=$out/mpirun-$n/outcomes w=$out/weft-$n/outcomes
  [[ -f $m && -f $w ]] || continue
  # Tests ok on all n ranks under mpirun, and what weft made of them.
  awk -v n="$n" '$1 == n && $NF == "ok" {$1 = ""; $NF = ""; print}' "$m" | sed 's/^ //; s/ $//' | sort >"$out/pass-m"
  awk -v n="$n" '$1 == n && $NF == "ok" {$1 = ""; $NF = ""; print}' "$w" | sed 's/^ //; s/ $//' | sort >"$out/pass-w"
  lost=$(comm -23 "$out/pass-m" "$out/pass-w")
  echo "mpi4py -n $n: $(wc -l <"$out/pass-m") tests pass on every rank under mpirun, $(wc -l <"$out/pass-w") under weft run"
  if [[ -n $lost ]]; then
    fail=1
    echo "mpi4py -n $n: these pass under mpirun but not under weft run:"
    while read -r t; do
      echo "  $t: $(grep -F "$t ..." "$out"/weft-"$n"/r.* | sed 's/.* \.\.\. //' | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
    done <<<"$lost"
  fi
done
echo "mpi4py: $([[ $fail == 0 ]] && echo "weft run passes everything mpirun passes" || echo FAILED)"
exit "$fail"
