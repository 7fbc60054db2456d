#!/usr/bin/env bash
# Two builds of Weft over shared memory and TCP, A/B in one run: judges a change that
# touches the engine or its setup by its old and new release binaries alternated (ABBA:
# old first in odd rounds, new first in even ones). Run on an idle machine:
#   benches/scripts/ab.sh OLD_RELEASE_DIR NEW_RELEASE_DIR [ROUNDS]
# Each RELEASE_DIR is a target/release of `cargo build --release --bins` (build the old
# one from a worktree: git worktree add ../old COMMIT). Measures `weft bench latency` 8 B
# (shm, 2 ranks on one node; median), `mr` 8 B, 64 B and 1 KiB and `bw` 1 MiB (shm), and with
# WEFT_TRANSPORTS=tcp the latency at 8 B and 4 MiB, ROUNDS times (default 9); prints every
# sample, then per benchmark the median over the rounds of each build, its min-max, and
# the ratio new/old. (verbs_ab.sh does the same for verbs inside the soft-RoCE VM.)
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: ab.sh OLD_RELEASE_DIR NEW_RELEASE_DIR [ROUNDS]" >&2; exit 2; }
old=$1 new=$2 rounds=${3:-9}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
one() { # LABEL DIR: one sample of every benchmark, as "LABEL NAME VALUE" lines
  local v=$1 d=$2 j
  j=$(timeout 120 "$d/weft" bench latency --sizes 8 --no-limit --percentiles --json)
  echo "$j" | sed -n 's/.*"size":\([0-9]*\),"latency_us":\([0-9.]*\).*"median_us":\([0-9.]*\).*/shm_lat\1_median \3/p' | sed "s/^/$v /"
  j=$(timeout 120 "$d/weft" bench mr --sizes 8,64,1024 --no-limit --json)
  echo "$j" | sed -n 's/.*"size":\([0-9]*\),"msg_rate":\([0-9.]*\).*/shm_mr\1 \2/p' | sed "s/^/$v /"
  j=$(timeout 120 "$d/weft" bench bw --sizes 1048576 --no-limit --json)
  echo "$j" | sed -n 's/.*"size":\([0-9]*\),"bandwidth_mbs":\([0-9.]*\).*/shm_bw\1 \2/p' | sed "s/^/$v /"
  j=$(WEFT_TRANSPORTS=tcp timeout 120 "$d/weft" bench latency --sizes 8,4194304 --no-limit --percentiles --json)
  echo "$j" | sed -n 's/.*"size":\([0-9]*\),"latency_us":\([0-9.]*\).*"median_us":\([0-9.]*\).*/tcp_lat\1_median \3/p' | sed "s/^/$v /"
}
uptime
for r in $(seq 1 "$rounds"); do
  if ((r % 2)); then one old "$old"; one new "$new"; else one new "$new"; one old "$old"; fi | tee -a "$out"
done
uptime
echo
awk '
  { s[$2, $1] = s[$2, $1] " " $3; names[$2] = 1 }
  function sorted(list, a,   n, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n
  }
  function median(list,   a, n) {
    n = sorted(list, a)
    return n ? ((n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2) : 0
  }
  function span(list,   a, n) { n = sorted(list, a); return n ? sprintf("%g-%g", a[1], a[n]) : "-" }
  END {
    printf "%-18s %12s %20s %12s %20s %8s\n", "benchmark", "old", "old min-max", "new", "new min-max", "new/old"
    for (k in names) {
      o = median(s[k, "old"]); n = median(s[k, "new"])
      printf "%-18s %12.4g %20s %12.4g %20s %8.3f\n", k, o, span(s[k, "old"]), n, span(s[k, "new"]), (o > 0) ? n / o : 0
    }
  }' "$out" | sort
