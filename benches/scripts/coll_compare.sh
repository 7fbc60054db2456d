#!/usr/bin/env bash
# Collective baselines for `weft bench coll`: builds benches/mpi/osu_coll.c with Debian's
# Open MPI (default coll selection) and MPICH, runs each and Weft with N processes bound
# to cores (oversubscribed past the core count), and prints JSON lines in the schema of
# `weft bench coll --json` (plus "impl": "openmpi" | "mpich" | "weft"), then a table of
# Weft's ratios to the faster MPI (stderr).
#
# usage: benches/scripts/coll_compare.sh [--out FILE] [--np N] [--sizes BYTES[,BYTES...]]
#                                        [--bench NAME[,NAME...]] [--impl openmpi,mpich,weft]
#   --np N      processes (default 2)
#   --sizes L   sizes (default 8,1K,64K,1M; K and M suffixes)
#   --bench L   collectives (default barrier,bcast,reduce,allreduce,allgather,alltoall)
#
# Installs nothing. Needs mpicc.openmpi/mpirun.openmpi (apt-get install openmpi-bin
# libopenmpi-dev) and/or mpicc.mpich/mpirun.mpich (apt-get install mpich libmpich-dev), and
# a release weft (cargo build --release --bin weft). Open MPI runs with its shared-memory
# path (btl self,vader, pml ob1) and its default collective selection; a missing MPI is
# skipped with a reason. Binaries: target/osu_coll.openmpi, target/osu_coll.mpich.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() { sed -n '2,17s/^# \{0,1\}//p' "$0"; }

out=""
np=2
sizes="8,1K,64K,1M"
benches="barrier,bcast,reduce,allreduce,allgather,alltoall"
impls="openmpi,mpich,weft"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:?--out needs a file}"; shift ;;
    --np) np="${2:?--np needs a number}"; shift ;;
    --sizes) sizes="${2:?--sizes needs a list}"; shift ;;
    --bench) benches="${2:?--bench needs a list}"; shift ;;
    --impl) impls="${2:?--impl needs a list}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "coll_compare.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[ -n "$out" ] && exec >"$out"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
cores=$(nproc)
status=0
for impl in ${impls//,/ }; do
  case "$impl" in
    openmpi|mpich)
      if ! command -v "mpicc.$impl" >/dev/null || ! command -v "mpirun.$impl" >/dev/null; then
        echo "coll_compare.sh: $impl skipped: mpicc.$impl or mpirun.$impl not found" >&2
        continue
      fi
      bin="target/osu_coll.$impl"
      mkdir -p target
      "mpicc.$impl" -O2 -DIMPL="\"$impl\"" -o "$bin" benches/mpi/osu_coll.c
      if [ "$impl" = openmpi ]; then
        over=""; [ "$np" -gt "$cores" ] && over="--oversubscribe"
        bind=core; [ "$np" -gt "$cores" ] && bind=none
        OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 mpirun.openmpi --allow-run-as-root $over \
          --bind-to "$bind" -n "$np" "$bin" --sizes "$sizes" --bench "$benches" \
          | tee -a "$tmp" || status=1
      else
        bind=core; [ "$np" -gt "$cores" ] && bind=none
        mpirun.mpich -bind-to "$bind" -n "$np" "$bin" --sizes "$sizes" --bench "$benches" \
          | tee -a "$tmp" || status=1
      fi ;;
    weft)
      [ -x target/release/weft ] || { echo "coll_compare.sh: build target/release/weft first" >&2; exit 2; }
      if [ "$np" -eq 2 ]; then
        target/release/weft bench coll --json --sizes "$sizes" --bench "$benches"
      else
        bind=core; [ "$np" -gt "$cores" ] && bind=none
        target/release/weft run --bind-to "$bind" -n "$np" target/release/weft bench coll \
          --json --sizes "$sizes" --bench "$benches"
      fi | sed 's/}$/,"impl":"weft"}/' | tee -a "$tmp" || status=1 ;;
    *) echo "coll_compare.sh: --impl $impl: expected openmpi, mpich or weft" >&2; exit 2 ;;
  esac
done
# Ratios weft / faster MPI per (bench, size).
python3 - "$tmp" >&2 <<'PY' || true
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
best, weft = {}, {}
for r in rows:
    k = (r["bench"], r["size"])
    if r["impl"] == "weft":
        weft[k] = r["latency_us"]
    else:
        b = best.get(k)
        if b is None or r["latency_us"] < b[0]:
            best[k] = (r["latency_us"], r["impl"])
print(f"{'bench':<10} {'size':>8} {'weft us':>10} {'best MPI us':>12} {'which':>8} {'ratio':>6}")
for k in sorted(weft, key=lambda k: (k[0], k[1])):
    if k in best:
        b, who = best[k]
        print(f"{k[0]:<10} {k[1]:>8} {weft[k]:>10.2f} {b:>12.2f} {who:>8} {weft[k]/b:>6.2f}")
PY
exit $status
