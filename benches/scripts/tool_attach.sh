#!/usr/bin/env bash
# A PMIx tool attaching to a running job (issue 35): how long from PMIx_tool_init to the
# first answer (the namespaces), and how long the job-wide process table takes, for a
# job of N processes on K logical nodes of this machine; how long after a debugger's
# release the last of N processes held in PMIx_Init (weft run --stop-in-init) goes on;
# then the same tool against Open MPI's mpirun (4.1, the same libpmix) for comparison.
#
# usage: benches/scripts/tool_attach.sh [N [K [ROUNDS]]]     (default 64 4 10)
# Needs cc and libpmix-dev; uses target/release/weft (cargo build --release -p weft-cli).
# Prints one line per round: "weft <how> attach_us A ptable_us P", and the medians.
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-64}
k=${2:-4}
rounds=${3:-10}
weft=$PWD/target/release/weft
[ -x "$weft" ] || { echo "build it first: cargo build --release -p weft-cli" >&2; exit 1; }
mkdir -p target
tool=$PWD/target/pmix_tool
cc -O2 -o "$tool" benches/mpi/pmix_tool.c $(pkg-config --cflags --libs pmix)
held=$PWD/target/pmix_held
cc -O2 -o "$held" benches/mpi/pmix_held.c $(pkg-config --cflags --libs pmix)

# A private TMPDIR: tools search it for rendezvous files (all of it, recursively).
tmp=$(mktemp -d /tmp/weft-tool-attach.XXXXXX)
launcher=
cleanup() {
  [ -n "$launcher" ] && kill -TERM "$launcher" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# Processes that only sleep (the machine stays quiet); ended with the launcher.
TMPDIR=$tmp "$weft" run --nodes "$k" -n "$n" --timeout 600 --report-pmix-uri "$tmp/uri" \
  sleep 600 &
launcher=$!
# Waits until the job whose URI is in file $1 has every pid in its table.
full_table() {
  for _ in $(seq 1 600); do
    if [ -e "$1" ] && TMPDIR=$tmp "$tool" --uri "file:$1" 2>/dev/null \
        | awk '/^proc /{ if ($6 == 0) z++; c++ } END { exit !(c == '"$n"' && z == 0) }'; then
      return
    fi
    sleep 0.1
  done
}
full_table "$tmp/uri"

median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
for how in pid uri; do
  : > "$tmp/$how.a"
  : > "$tmp/$how.p"
  for _ in $(seq 1 "$rounds"); do
    if [ "$how" = pid ]; then args=(--pid "$launcher"); else args=(--uri "file:$tmp/uri"); fi
    out=$(TMPDIR=$tmp "$tool" "${args[@]}" --repeat 5)
    a=$(awk '/^attach_us/{print $2}' <<<"$out")
    p=$(awk '/^ptable_us/{print $2}' <<<"$out")
    rows=$(grep -c '^proc ' <<<"$out")
    echo "weft $how attach_us $a ptable_us $p rows $rows"
    echo "$a" >> "$tmp/$how.a"
    echo "$p" >> "$tmp/$how.p"
  done
  echo "weft $how median: attach_us $(median < "$tmp/$how.a") ptable_us $(median < "$tmp/$how.p") (N=$n, K=$k)"
done
kill -TERM "$launcher"
wait "$launcher" 2>/dev/null || true
launcher=

# Held in init, then released: the last process's delay after the release was sent.
: > "$tmp/rel"
for _ in $(seq 1 "$rounds"); do
  rm -f "$tmp/huri"
  TMPDIR=$tmp "$weft" run --nodes "$k" -n "$n" --timeout 120 --stop-in-init \
    --report-pmix-uri "$tmp/huri" "$held" > "$tmp/held.out" &
  launcher=$!
  full_table "$tmp/huri"
  sent=$(TMPDIR=$tmp "$tool" --uri "file:$tmp/huri" --release | awk '/^release_sent_us/{print $2}')
  wait "$launcher"
  launcher=
  last=$(awk '/init_done_us/{ if ($4 > m) m = $4 } END { printf "%.0f", m }' "$tmp/held.out")
  first=$(awk '/init_done_us/{ if (m == "" || $4 < m) m = $4 } END { printf "%.0f", m }' "$tmp/held.out")
  echo "weft release: first of $n released $((first - sent)) us, last $((last - sent)) us after the release"
  echo "$((last - sent))" >> "$tmp/rel"
done
echo "weft release median: $(median < "$tmp/rel") us (N=$n, K=$k)"

# Open MPI's mpirun, same tool, same library.
if command -v mpirun.openmpi >/dev/null; then
  TMPDIR=$tmp mpirun.openmpi --allow-run-as-root --oversubscribe -n 2 sleep 30 >/dev/null 2>&1 &
  m=$!
  sleep 3
  out=$(TMPDIR=$tmp timeout 20 "$tool" --pid "$m" 2>&1) || true
  echo "mpirun pid: $(tr '\n' ' ' <<<"$out")"
  kill "$m" 2>/dev/null || true
  wait "$m" 2>/dev/null || true
fi
