#!/usr/bin/env bash
# Weft over verbs next to perftest on the same device in the same run (issue: verbs
# transport). Run inside the soft-RoCE VM:
#   ci/softroce.sh -- benches/scripts/verbs_compare.sh [ROUNDS]
# Prints perftest's ib_send_lat, ib_write_lat (8 bytes) and ib_write_bw (1 MiB) next to
# `WEFT_TRANSPORTS=verbs weft bench latency|bw`, interleaved ROUNDS times (default 5), and
# the ratios of the medians over the rounds. Latency is compared two ways, like with like:
# the mean (perftest's t_avg, OSU's figure) and the typical round trip (perftest's
# t_typical, weft's median with --percentiles), since under emulation a few slow round
# trips (the host preempting a vCPU) move a run's mean by 10% or more. Needs a release
# build (cargo build --release --bins).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-5}
W=target/release/weft
dev=${WEFT_VERBS_DEVICE:-rxe0}
addr=127.0.0.2
perf() { # TOOL ARGS... : server in the background, client against it
  local tool=$1; shift
  "$tool" -d "$dev" -x 1 "$@" >/dev/null 2>&1 &
  local srv=$!
  sleep 1
  timeout 120 "$tool" -d "$dev" -x 1 "$@" "$addr" || true
  wait "$srv" || true
}
# A number, or nothing (perftest prints inf when its clock calibration fails; such a
# sample is left out rather than counted).
num() { awk '$1 ~ /^[0-9.]+$/ && $1 + 0 > 0 {print $1}'; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR) print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
send_avg=(); send_typ=(); write_lat=(); write_bw=(); weft_avg=(); weft_typ=(); weft_bw=()
for r in $(seq 1 "$rounds"); do
  # perftest latency columns: 5 t_typical (the median), 6 t_avg (the mean), in µs; bw:
  # column 4 is BW average (MB/s, 2^20).
  sl=$(perf ib_send_lat -s 8 -n 5000 | awk '$1 == 8 {print $5, $6}')
  sa=$(echo "$sl" | awk '{print $2}' | num); st=$(echo "$sl" | awk '{print $1}' | num)
  wl=$(perf ib_write_lat -s 8 -n 5000 | awk '$1 == 8 {print $6}' | num)
  wb=$(perf ib_write_bw -s 1048576 -n 2000 | awk '$1 == 1048576 {printf "%.1f", $4 * 1.048576}' | num)
  fl=$(WEFT_TRANSPORTS=verbs timeout 120 $W bench latency --sizes 8 --no-limit --percentiles --json || true)
  fa=$(echo "$fl" | sed -n 's/.*"latency_us":\([0-9.]*\).*/\1/p' | num)
  ft=$(echo "$fl" | sed -n 's/.*"median_us":\([0-9.]*\).*/\1/p' | num)
  fb=$(WEFT_TRANSPORTS=verbs timeout 120 $W bench bw --sizes 1048576 --no-limit --json | sed -n 's/.*"bandwidth_mbs":\([0-9.]*\).*/\1/p' | num || true)
  [[ -n $sa ]] && send_avg+=("$sa"); [[ -n $st ]] && send_typ+=("$st"); [[ -n $wl ]] && write_lat+=("$wl")
  [[ -n $wb ]] && write_bw+=("$wb"); [[ -n $fa ]] && weft_avg+=("$fa"); [[ -n $ft ]] && weft_typ+=("$ft")
  [[ -n $fb ]] && weft_bw+=("$fb")
  echo "round $r: ib_send_lat ${sa:-failed} us (typical ${st:-failed}), ib_write_lat ${wl:-failed} us, weft latency ${fa:-failed} us (median ${ft:-failed}); ib_write_bw ${wb:-failed} MB/s, weft bw ${fb:-failed} MB/s"
done
m() { printf '%s\n' "$@" | median; }
ratio() { [[ -n $1 && -n $2 ]] && awk "BEGIN {printf \"%.2f\", $1 / $2}" || echo "n/a"; }
sa=$(m "${send_avg[@]}"); st=$(m "${send_typ[@]}"); wl=$(m "${write_lat[@]}")
fa=$(m "${weft_avg[@]}"); ft=$(m "${weft_typ[@]}"); wb=$(m "${write_bw[@]}"); fb=$(m "${weft_bw[@]}")
echo "medians over $rounds rounds (8 B latency µs, 1 MiB bandwidth MB/s = 10^6 B/s; samples: ib_send_lat ${#send_avg[@]}, weft ${#weft_avg[@]}):"
echo "  mean:    ib_send_lat $sa  ib_write_lat $wl  weft $fa  ratio weft/ib_send_lat $(ratio "$fa" "$sa")  weft/ib_write_lat $(ratio "$fa" "$wl")"
echo "  typical: ib_send_lat $st  weft median $ft  ratio weft/ib_send_lat $(ratio "$ft" "$st")"
echo "  ib_write_bw $wb  weft $fb  ratio weft/ib_write_bw $(ratio "$fb" "$wb")"
