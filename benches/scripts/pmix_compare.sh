#!/usr/bin/env bash
# Hosting PMIx programs (issue 18, section 4): `weft run` against Open MPI's `mpirun` on
# this machine, same binaries, one run:
#   - startup: hyperfine (--warmup 2 --runs R) of benches/mpi/hello.c built with
#     mpicc.openmpi, `weft run -n N` against `mpirun -n N` (btl self,vader, pml ob1);
#   - PMIx: benches/mpi/pmix_client.c `bench` (16 processes by default, 32 keys of
#     1 KiB each, a collecting fence timed ITERS times, then a PMIx_Get of the next
#     rank's key) under `weft run` (1 and 2 logical nodes) and under `mpirun`, R times each,
#     printed as JSON lines, then the means and ratios.
#
# usage: benches/scripts/pmix_compare.sh [-n N] [--runs R] [--iters I] [--nodelay]
#   -n N       processes (default 16)
#   --runs R   repetitions (default 5)
#   --iters I  fences per pmix_client run (default 20)
#   --nodelay  also run everything with an LD_PRELOAD shim setting TCP_NODELAY on every
#              connect (OpenPMIx 4.2.2's client never sets it on its connection to the
#              server: small requests then wait for the server's delayed ACK, ~40 ms)
#
# Needs openmpi-bin, libopenmpi-dev, libpmix-dev, hyperfine, cc, and a release weft
# (built here). Installs nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() { sed -n '2,20s/^# \{0,1\}//p' "$0"; }
np=16
runs=5
iters=20
nodelay=0
while [ $# -gt 0 ]; do
  case "$1" in
    -n) np="${2:?-n needs a value}"; shift ;;
    --runs) runs="${2:?--runs needs a value}"; shift ;;
    --iters) iters="${2:?--iters needs a value}"; shift ;;
    --nodelay) nodelay=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "pmix_compare.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
for t in mpicc.openmpi mpirun.openmpi hyperfine cc pkg-config; do
  command -v "$t" >/dev/null || { echo "pmix_compare.sh: $t not found" >&2; exit 1; }
done
pkg-config --exists pmix || { echo "pmix_compare.sh: libpmix-dev not found" >&2; exit 1; }

cargo build --release --quiet --bin weft
mkdir -p target
mpicc.openmpi -O2 -o target/hello.openmpi benches/mpi/hello.c
# shellcheck disable=SC2046
cc -O2 -o target/pmix_client benches/mpi/pmix_client.c $(pkg-config --cflags --libs pmix)
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}" OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}"
mpirun=(mpirun.openmpi --allow-run-as-root --oversubscribe)

variants=("")
if [ "$nodelay" = 1 ]; then
  cat > target/nodelay.c <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
int connect(int fd, const struct sockaddr *a, socklen_t l)
{
    static int (*real)(int, const struct sockaddr *, socklen_t);
    if (!real)
        real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
    int r = real(fd, a, l);
    if (a->sa_family == AF_INET || a->sa_family == AF_INET6) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return r;
}
EOF
  cc -O2 -shared -fPIC -o target/nodelay.so target/nodelay.c -ldl
  variants+=("$PWD/target/nodelay.so")
fi

for pre in "${variants[@]}"; do
  wx=(); mx=(); tag=""
  if [ -n "$pre" ]; then wx=(-x "LD_PRELOAD=$pre"); mx=(-x "LD_PRELOAD=$pre"); tag=" +nodelay"; fi
  echo "== startup$tag: hello.c, $np processes" >&2
  hyperfine -N --warmup 2 --runs 10 \
    --command-name "weft run -n $np$tag" "target/release/weft run ${wx[*]} -n $np target/hello.openmpi" \
    --command-name "mpirun -n $np$tag" "${mpirun[*]} ${mx[*]} -n $np target/hello.openmpi" >&2
  echo "== PMIx fence and get$tag: $np processes, 32 keys x 1 KiB, $iters fences" >&2
  for _ in $(seq "$runs"); do
    target/release/weft run "${wx[@]}" -n "$np" target/pmix_client bench "$iters" 32 1024 "weft-1node$tag"
    target/release/weft run "${wx[@]}" --nodes 2 -n "$np" target/pmix_client bench "$iters" 32 1024 "weft-2nodes$tag"
    "${mpirun[@]}" "${mx[@]}" -n "$np" target/pmix_client bench "$iters" 32 1024 "mpirun$tag"
  done
done | tee target/pmix_compare.json
awk -F'[:,"]+' '
  /pmix_fence/ {
    for (i = 1; i < NF; i++) {
      if ($i == "impl") impl = $(i + 1)
      if ($i == "fence_us") f = $(i + 1)
      if ($i == "get_us") g = $(i + 1)
    }
    n[impl]++; fs[impl] += f; gs[impl] += g
  }
  END {
    printf "%-24s %12s %12s\n", "impl", "fence us", "get us" > "/dev/stderr"
    for (k in n) printf "%-24s %12.1f %12.2f\n", k, fs[k] / n[k], gs[k] / n[k] > "/dev/stderr"
  }' target/pmix_compare.json
echo "JSON lines: target/pmix_compare.json" >&2
