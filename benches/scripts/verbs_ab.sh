#!/usr/bin/env bash
# Two builds of Weft over verbs, A/B in one VM boot: judges a change to the verbs path by
# its old and new release binaries alternated in the same run. Rounds alternate the order
# (ABBA: old first in odd rounds, new first in even ones), since under emulation the second
# run of a pair can be systematically slower or faster. Run inside the soft-RoCE VM:
#   ci/softroce.sh -- benches/scripts/verbs_ab.sh OLD_RELEASE_DIR NEW_RELEASE_DIR [ROUNDS]
# Each RELEASE_DIR is a target/release of `cargo build --release --bins --examples` plus
# `cargo build --release -p weft-verbs --example verbs_pingpong --example verbs_readbw`
# (build the old one from a worktree: git worktree add ../old COMMIT). Measures
# `WEFT_TRANSPORTS=verbs weft bench latency` (8 B and 64 KiB, medians and means) and
# `bw` (8 KiB, 1 MiB), the raw endpoint's verbs_pingpong (32 B) and verbs_readbw (1 MiB
# read and write), ROUNDS times (default 6); prints every sample, then per benchmark the
# median over the rounds of each build and the ratio new/old.
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: verbs_ab.sh OLD_RELEASE_DIR NEW_RELEASE_DIR [ROUNDS]" >&2; exit 2; }
old=$1 new=$2 rounds=${3:-6}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
one() { # LABEL DIR: one sample of every benchmark, as "LABEL NAME VALUE" lines
  local v=$1 d=$2 j
  j=$(WEFT_TRANSPORTS=verbs timeout 120 "$d/weft" bench latency --sizes 8,65536 --no-limit --percentiles --json)
  echo "$j" | sed -n 's/.*"size":\([0-9]*\),"latency_us":\([0-9.]*\).*"median_us":\([0-9.]*\).*/lat\1_mean \2\nlat\1_median \3/p' | sed "s/^/$v /"
  j=$(WEFT_TRANSPORTS=verbs timeout 120 "$d/weft" bench bw --sizes 8192,1048576 --no-limit --json)
  echo "$j" | sed -n 's/.*"size":\([0-9]*\),"bandwidth_mbs":\([0-9.]*\).*/bw\1 \2/p' | sed "s/^/$v /"
  timeout 120 "$d/examples/verbs_pingpong" 32 3000 | awk -v v="$v" 'END {print v, "pingpong32", $3}'
  timeout 120 "$d/examples/verbs_readbw" 1048576 200 16 | awk -v v="$v" 'END {print v, "readbw1m", $5}'
  timeout 120 "$d/examples/verbs_readbw" 1048576 200 16 write | awk -v v="$v" 'END {print v, "writebw1m", $5}'
}
for r in $(seq 1 "$rounds"); do
  if ((r % 2)); then one old "$old"; one new "$new"; else one new "$new"; one old "$old"; fi | tee -a "$out"
done
echo
awk '
  { s[$2, $1] = s[$2, $1] " " $3; names[$2] = 1 }
  function median(list,   a, n, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n ? ((n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2) : 0
  }
  END {
    printf "%-14s %10s %10s %8s\n", "benchmark", "old", "new", "new/old"
    for (k in names) {
      o = median(s[k, "old"]); n = median(s[k, "new"])
      printf "%-14s %10.2f %10.2f %8.3f\n", k, o, n, (o > 0) ? n / o : 0
    }
  }' "$out" | sort
