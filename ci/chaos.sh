#!/usr/bin/env bash
# Chaos runs (issue 14): repeated jobs on 1 to 4 logical nodes running
# testkit/src/bin/chaos_probe.rs (fences in every mode, gets, communicators from groups, rings of
# eager and rendezvous messages, collectives on the world), each with one random action
# at a random moment: nothing, SIGKILL of a rank, SIGKILL of a server, a pause (SIGSTOP,
# then SIGCONT 0.3-2 s later), or a rank that ends cleanly (exit status 0, or finalize)
# at a random round just before its collectives (CHAOS_END, with --keep-going). Every
# run must end within its bound (by itself: the job's --timeout is a hang); runs without
# a kill or an end must give every rank's "ok" (the program checks all data itself);
# after a kill or an end every survivor's error must name the lost process (or a rank
# that failed because of it), and after an end every survivor must fail; no segment,
# socket directory or process may be left behind.
#
#   ci/chaos.sh [RUNS] [SEED]      (default 20 runs, a random seed; the long run: 300)
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
seed=${2:-$(( $(date +%s) % 32768 ))}
RANDOM=$seed
cargo build --workspace --bins --examples -q || exit 1
bin=${CARGO_TARGET_DIR:-$PWD/target}/debug
tmp=$(mktemp -d /var/tmp/weft-chaos.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export TMPDIR=$tmp
uid=$(id -u)
ran=0 kills=0 server_kills=0 pauses=0 clean_ends=0 hangs=0 leaks=0 wrong=0 misnamed=0 late=0
start=$(date +%s)

# A random number of milliseconds in [lo, hi), slept.
nap() { sleep "$(printf '0.%03d' $(( $1 + RANDOM % ($2 - $1) )))"; }
# Ranks of the running job: "pid rank" lines.
ranks() {
  for p in $(pgrep -f "$bin/chaos_probe" || true); do
    r=$(tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | sed -n 's/^WEFT_RANK=//p')
    [[ -n $r ]] && echo "$p $r"
  done
}
# Every error line must match LOST (it names the lost process), or name a rank whose own
# error came first (it failed because of it).
check_named() { # LOST
  local failed line f named
  failed=$(sed -n 's/^rank \([0-9]*\) error: .*/\1/p' "$tmp/out" | tr '\n' ' ')
  while read -r line; do
    [[ -z $line ]] && continue
    named=0
    grep -qE "$1" <<<"$line" && named=1
    for f in $failed; do
      grep -qE "rank $f[^0-9]" <<<"$line" && named=1
    done
    ((named)) || fail misnamed "an error does not name the lost process: $line"
  done < <(grep ' error: ' "$tmp/out")
}
fail() { # KIND NAME: counts and shows a failed run
  eval "$1=\$(( $1 + 1 ))"
  echo "chaos: run $i ($desc): $2"
  sed 's/^/    | /' "$tmp/out" "$tmp/err" | head -40
}

for i in $(seq 1 "$runs"); do
  nodes=$((1 + RANDOM % 4))
  n=$((nodes + 1 + RANDOM % 6))
  iters=$((150 + RANDOM % 150))
  map=slot; ((RANDOM % 2)) && map=node
  job=chaos$seed-$i
  # 0-3 nothing, 4-6 kill a rank, 7 kill a server, 8-9 pause a rank, 10-11 a rank ends
  # cleanly (exit status 0, or finalize) at a random round, just before its collectives
  action=$((RANDOM % 12))
  victim="" what="none" extra=()
  if ((action >= 10)); then
    victim=$((RANDOM % n))
    what=exit0; ((RANDOM % 2)) && what=finalize
    extra=(--keep-going -x "CHAOS_END=$victim:$((RANDOM % iters)):$what")
  fi
  timeout -s KILL 90 "$bin/weft" run --job-id "$job" --timeout 60 --nodes "$nodes" -n "$n" \
    --map-by "$map" "${extra[@]}" "$bin/chaos_probe" "$iters" >"$tmp/out" 2>"$tmp/err" &
  launcher=$! t0=$(date +%s)
  if ((action >= 4 && action <= 9)); then
    nap 50 600
    case $action in
      7)
        pids=($(pgrep -f "$bin/weft server .*--job-dir [^ ]*/$job" || true))
        if ((${#pids[@]})); then
          p=${pids[$((RANDOM % ${#pids[@]}))]}
          victim=$(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | sed -n 's/.*--node \([0-9]*\).*/\1/p')
          kill -KILL "$p" 2>/dev/null && what="kill-server"
        fi ;;
      *)
        mapfile -t live < <(ranks)
        if ((${#live[@]})); then
          read -r p victim <<<"${live[$((RANDOM % ${#live[@]}))]}"
          if ((action >= 8)); then
            kill -STOP "$p" 2>/dev/null && what="pause"
            nap 300 999; ((RANDOM % 2)) && nap 0 999
            kill -CONT "$p" 2>/dev/null
          else
            kill -KILL "$p" 2>/dev/null && what="kill-rank"
          fi
        fi ;;
    esac
    [[ $what == none ]] && late=$((late + 1))
  fi
  wait "$launcher"; rc=$?
  ran=$((ran + 1))
  desc="--nodes $nodes -n $n --map-by $map, $iters rounds, $what${victim:+ $victim}, exit $rc"
  case $what in
    kill-rank) kills=$((kills + 1)) ;;
    kill-server) server_kills=$((server_kills + 1)) ;;
    pause) pauses=$((pauses + 1)) ;;
    exit0|finalize) clean_ends=$((clean_ends + 1)) ;;
  esac
  # The job's own limit is 60 s (weft run --timeout); past 85 s it hung.
  if (( $(date +%s) - t0 >= 85 )) || ((rc == 124)); then
    fail hangs "the job did not end by itself (exit $rc after $(( $(date +%s) - t0 )) s)"
  fi
  oks=$(grep -c ' ok$' "$tmp/out")
  case $what in
    none|pause)
      ((rc == 0 && oks == n)) || fail wrong "expected $n ok lines and exit 0, got $oks" ;;
    exit0|finalize)
      # The victim ended at its round; every other rank must fail (its next collective
      # needs the victim), naming it (or a rank that failed because of it).
      grep -q "^rank $victim ended: $what\$" "$tmp/out" || fail wrong "rank $victim did not end as told"
      errs=$(grep -c ' error: ' "$tmp/out")
      ((errs == n - 1 && oks == 0)) || fail wrong "expected $((n - 1)) errors and no ok, got $errs errors and $oks ok"
      check_named "rank $victim[^0-9]|\[$victim[],]|, $victim[],]" ;;
    kill-rank) check_named "rank $victim[^0-9]|\[$victim[],]|, $victim[],]" ;;
    kill-server) check_named "node $victim[^0-9]|node $victim\$" ;;
  esac
  # Leftovers: segments, the job's socket directory, processes.
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    left=$(pgrep -f "$bin/chaos_probe|--job-dir [^ ]*/$job" || true)
    [[ -z $left ]] && break
    sleep 0.5
  done
  segs=$(ls /dev/shm | grep "^weft-$job-" || true)
  if [[ -n $left || -n $segs || -e $tmp/weft-$uid/$job ]]; then
    fail leaks "left behind: processes [$left] segments [$segs] $(ls -d "$tmp/weft-$uid/$job" 2>/dev/null)"
    [[ -n $left ]] && kill -KILL $left 2>/dev/null
    for s in $segs; do rm -f "/dev/shm/$s"; done
  fi
done
echo "chaos: seed $seed, $(($(date +%s) - start)) s: runs $ran, rank kills $kills, server kills $server_kills, pauses $pauses, clean ends $clean_ends (actions too late to land: $late), hangs $hangs, leaks $leaks, wrong answers $wrong, misnamed errors $misnamed"
((hangs + leaks + wrong + misnamed == 0))
