#!/usr/bin/env bash
# Chaos runs of job families (issue 33): a job of testkit's `wireup_probe family` (rank 0
# spawns a job of chaos_probe, half the time into an allocation session of one node that
# it asks for first; every parent rank fences 20 times, 50 ms apart) with one random action
# at a random moment: nothing, SIGKILL of a child rank, SIGKILL of a parent rank, or SIGKILL
# of the spawning rank 0. Every run must end by itself within its bound. Without an action,
# every parent and child prints ok and weft run exits 0. A killed child fails its own job
# only: every parent is ok, weft run exits 0, and the other children's errors name the lost
# one (in a session, children still running when the parents finish end with the session,
# which ends with the job that asked for it). A killed parent fails the family: weft run exits non-zero, the parents' errors name
# it, and its children (not spawned separate) and its session end with it. No process,
# segment or socket directory of the family may be left behind.
# A third of the runs are connected families (issue 33's intercommunicators): the job is
# testkit's `intercomm_probe chaos-parent`, whose world spawns its children with
# `Communicator::spawn` and exchanges messages with them every round (8 times the rounds;
# 8 B, every tenth 64 KiB), then merges, sums and disconnects. There a killed child also fails its parents'
# exchange: each parent prints ok or an error naming the lost child (ns2:RANK), and weft run
# still exits 0.
#
#   ci/chaos-family.sh [RUNS] [SEED]      (default 12 runs, a random seed)
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-12}
seed=${2:-$(( $(date +%s) % 32768 ))}
RANDOM=$seed
cargo build --workspace --bins --examples -q || exit 1
bin=${CARGO_TARGET_DIR:-$PWD/target}/debug
tmp=$(mktemp -d /var/tmp/weft-chaosf.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export TMPDIR=$tmp
uid=$(id -u)
ran=0 child_kills=0 parent_kills=0 spawner_kills=0 sessions=0 connected=0 hangs=0 leaks=0 wrong=0 misnamed=0 late=0
start=$(date +%s)

# Sleeps a random number of milliseconds in [lo, hi).
nap() { local ms=$(( $1 + RANDOM % ($2 - $1) )); sleep "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"; }
# "pid rank" of the running processes of PATTERN.
procs_of() {
  for p in $(pgrep -f "$1" || true); do
    r=$( (tr '\0' '\n' </proc/"$p"/environ) 2>/dev/null | sed -n 's/^WEFT_RANK=//p')
    [[ -n $r ]] && echo "$p $r"
  done
}
fail() { # KIND WHY
  eval "$1=\$(( $1 + 1 ))"
  echo "chaos-family: run $i ($desc): $2"
  sed 's/^/    | /' "$tmp/out" "$tmp/err" | head -40
}
# Every error line of WHO ("parent" or "rank") must match NAMED, or name a process of the
# same job whose own error came first.
check_named() { # WHO NAMED
  local failed line f named
  failed=$(sed -n "s/^$1 \([0-9]*\) error: .*/\1/p" "$tmp/out" | tr '\n' ' ')
  while read -r line; do
    [[ -z $line ]] && continue
    named=0
    grep -qE "$2" <<<"$line" && named=1
    for f in $failed; do grep -qE "rank $f[^0-9]" <<<"$line" && named=1; done
    ((named)) || fail misnamed "an error does not name the lost process: $line"
  done < <(grep "^$1 [0-9]* error: " "$tmp/out")
}

for i in $(seq 1 "$runs"); do
  nodes=$((1 + RANDOM % 3))
  n=$((nodes + RANDOM % 3))
  nchild=$((2 + RANDOM % 3))
  iters=$((80 + RANDOM % 120))
  job=chaosf$seed-$i
  mode=""
  if ((RANDOM % 3 == 0)); then
    mode=connect; connected=$((connected + 1))
  elif ((nodes >= 2 && RANDOM % 2)); then
    mode=session; sessions=$((sessions + 1))
  fi
  # 0-2 nothing, 3-5 kill a child, 6-7 kill a parent rank, 8 kill rank 0 (the spawner)
  action=$((RANDOM % 9))
  if [[ $mode == connect ]]; then
    parents="$bin/intercomm_probe chaos-parent" children="$bin/intercomm_probe chaos-child"
    timeout -s KILL 90 "$bin/weft" run --job-id "$job" --timeout 60 --nodes "$nodes" \
      -n "$n" $parents "$nchild" "$((iters * 8))" >"$tmp/out" 2>"$tmp/err" &
  else
    parents="$bin/wireup_probe family" children="$bin/chaos_probe"
    timeout -s KILL 90 "$bin/weft" run --job-id "$job" --timeout 60 --nodes "$nodes" \
      -n "$n" $parents "$nchild" "$iters" $mode >"$tmp/out" 2>"$tmp/err" &
  fi
  launcher=$! t0=$(date +%s)
  what=none victim=""
  if ((action >= 3)); then
    nap 50 900
    if ((action <= 5)); then
      mapfile -t live < <(procs_of "$children")
      role=child
    else
      mapfile -t live < <(procs_of "$parents")
      role=parent
      if ((action == 8)); then
        mapfile -t live < <(printf '%s\n' "${live[@]}" | awk '$2 == 0')
        role=spawner
      fi
    fi
    if ((${#live[@]})) && [[ -n ${live[0]} ]]; then
      read -r p victim <<<"${live[$((RANDOM % ${#live[@]}))]}"
      kill -KILL "$p" 2>/dev/null && what="kill-$role"
    fi
    [[ $what == none ]] && late=$((late + 1))
  fi
  wait "$launcher"; rc=$?
  ran=$((ran + 1))
  desc="--nodes $nodes -n $n, $nchild children${mode:+ ($mode)}, $iters rounds, $what${victim:+ $victim}, exit $rc"
  case $what in
    kill-child) child_kills=$((child_kills + 1)) ;;
    kill-parent) parent_kills=$((parent_kills + 1)) ;;
    kill-spawner) spawner_kills=$((spawner_kills + 1)) ;;
  esac
  if (( $(date +%s) - t0 >= 85 )) || ((rc == 124)); then
    fail hangs "the family did not end by itself (exit $rc after $(( $(date +%s) - t0 )) s)"
  fi
  pok=$(grep -c '^parent [0-9]* ok$' "$tmp/out")
  perr=$(grep -c '^parent [0-9]* error: ' "$tmp/out")
  cok=$(grep -c '^rank [0-9]* ok$' "$tmp/out")
  if [[ $mode == connect && $what == kill-child ]]; then
    # The parents are connected with the lost child: their exchange may fail, naming it.
    ((rc == 0 && pok + perr == n)) ||
      fail wrong "a child's loss: expected exit 0 and $n parents ok or failed, got $pok ok and $perr failed"
    ((cok < nchild)) || fail wrong "every child ok although child $victim was killed"
    check_named parent "ns[0-9]+:$victim[^0-9]"
    what=connected-kill-child
  fi
  case $what in
    none)
      # A session ends with the job that asked for it: children still running in it when
      # the parents finish are terminated then (said on weft run's stderr).
      ended=0
      [[ $mode == session ]] && grep -q "its session 1 ended; terminating the job" "$tmp/err" && ended=1
      ((rc == 0 && pok == n && (cok == nchild || ended))) ||
        fail wrong "expected exit 0, $n parent and $nchild child ok lines, got $pok and $cok" ;;
    kill-child)
      ((rc == 0 && pok == n)) || fail wrong "a child's loss failed the parents: $pok of $n ok"
      ((cok < nchild)) || fail wrong "every child ok although child $victim was killed"
      check_named rank "rank $victim[^0-9]|\[$victim[],]|, $victim[],]" ;;
    kill-parent|kill-spawner)
      ((rc != 0)) || fail wrong "the family succeeded although parent $victim was killed"
      ((pok < n)) || fail wrong "every parent ok although parent $victim was killed"
      check_named parent "rank $victim[^0-9]|\[$victim[],]|, $victim[],]" ;;
  esac
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    left=$(pgrep -f "$bin/chaos_probe|$bin/wireup_probe family|$bin/intercomm_probe chaos-|--job-dir [^ ]*/$job" || true)
    [[ -z $left ]] && break
    sleep 0.5
  done
  segs=$(ls /dev/shm | grep "^weft-$job" || true)
  if [[ -n $left || -n $segs || -e $tmp/weft-$uid/$job ]]; then
    fail leaks "left behind: processes [$left] segments [$segs] $(ls -d "$tmp/weft-$uid/$job" 2>/dev/null)"
    [[ -n $left ]] && kill -KILL $left 2>/dev/null
    for s in $segs; do rm -f "/dev/shm/$s"; done
  fi
done
echo "chaos-family: seed $seed, $(($(date +%s) - start)) s: runs $ran (in a session: $sessions, connected: $connected), child kills $child_kills, parent kills $parent_kills, spawner kills $spawner_kills (actions too late to land: $late), hangs $hangs, leaks $leaks, wrong answers $wrong, misnamed errors $misnamed"
((hangs + leaks + wrong + misnamed == 0))
