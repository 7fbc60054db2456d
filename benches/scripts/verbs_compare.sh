#!/usr/bin/env bash
# Weft over verbs next to perftest on the same device in the same run (issue: verbs
# transport). Run inside the soft-RoCE VM:
#   ci/softroce.sh -- benches/scripts/verbs_compare.sh [ROUNDS]
# Prints perftest's ib_send_lat, ib_write_lat (8 bytes) and ib_write_bw (1 MiB) next to
# `WEFT_TRANSPORTS=verbs weft bench latency|bw`, interleaved ROUNDS times (default 3), and
# the ratios of the medians. Needs a release build (cargo build --release --bins).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
W=target/release/weft
dev=${WEFT_VERBS_DEVICE:-rxe0}
addr=127.0.0.2
perf() { # TOOL ARGS... : server in the background, client against it
  local tool=$1; shift
  "$tool" -d "$dev" -x 1 "$@" >/dev/null 2>&1 &
  local srv=$!
  sleep 1
  timeout 120 "$tool" -d "$dev" -x 1 "$@" "$addr"
  wait "$srv" || true
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
send_lat=(); write_lat=(); write_bw=(); weft_lat=(); weft_bw=()
for r in $(seq 1 "$rounds"); do
  # perftest latency: column 6 is t_avg (µs; column 5 is t_typical, the median), a mean like weft's; bw: column 4 is BW average (MB/s, 2^20).
  send_lat+=("$(perf ib_send_lat -s 8 -n 5000 | awk '$1 == 8 {print $6}')")
  write_lat+=("$(perf ib_write_lat -s 8 -n 5000 | awk '$1 == 8 {print $6}')")
  write_bw+=("$(perf ib_write_bw -s 1048576 -n 2000 | awk '$1 == 1048576 {printf "%.1f", $4 * 1.048576}')")
  weft_lat+=("$(WEFT_TRANSPORTS=verbs timeout 120 $W bench latency --sizes 8 --no-limit --json | sed -n 's/.*"latency_us":\([0-9.]*\).*/\1/p')")
  weft_bw+=("$(WEFT_TRANSPORTS=verbs timeout 120 $W bench bw --sizes 1048576 --no-limit --json | sed -n 's/.*"bandwidth_mbs":\([0-9.]*\).*/\1/p')")
  echo "round $r: ib_send_lat ${send_lat[-1]} us, ib_write_lat ${write_lat[-1]} us, weft latency ${weft_lat[-1]} us; ib_write_bw ${write_bw[-1]} MB/s, weft bw ${weft_bw[-1]} MB/s"
done
m() { printf '%s\n' "$@" | median; }
sl=$(m "${send_lat[@]}"); wl=$(m "${write_lat[@]}"); fl=$(m "${weft_lat[@]}")
wb=$(m "${write_bw[@]}"); fb=$(m "${weft_bw[@]}")
echo "medians over $rounds rounds (8 B latency µs, 1 MiB bandwidth MB/s = 10^6 B/s):"
echo "  ib_send_lat $sl  ib_write_lat $wl  weft $fl  ratio weft/ib_send_lat $(awk "BEGIN {printf \"%.2f\", $fl / $sl}")  weft/ib_write_lat $(awk "BEGIN {printf \"%.2f\", $fl / $wl}")"
echo "  ib_write_bw $wb  weft $fb  ratio weft/ib_write_bw $(awk "BEGIN {printf \"%.2f\", $fb / $wb}")"
