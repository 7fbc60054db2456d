#!/usr/bin/env bash
# The verbs tests on a real soft-RoCE device. Builds here, then boots the VM (ci/softroce.sh)
# and runs inside it, each step with a time limit:
#   1. ibv_devinfo and `weft info` (device, port, GIDs, MTU, inline, tunables);
#   2. every weft-verbs test binary, with WEFT_VERBS_REQUIRE_DEVICE=1 (a missing device
#      fails instead of skipping);
#   3. the fabric's conformance suite over verbs (each test alone), and the verbs adapter's
#      own suite (path::tests::verbs);
#   4. multi-process jobs through `weft run` on 2 logical nodes, verbs between them: a ring
#      with 1 MiB payloads, sessions_demo, sessions on 4 threads per process, peers
#      killed mid-transfer (the survivor's error must name the peer within 2 s), and every
#      collective up to 4 MiB (coll_check, 2 + 1 processes); QPs and MRs are all released afterwards;
#   5. a benchmark smoke: perftest (ib_send_lat, ib_write_bw) next to
#      `WEFT_TRANSPORTS=verbs weft bench latency|bw`, and the raw endpoint examples.
#
#   ci/verbs-vm.sh            (from anywhere; exit status 0 when everything passed)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
if [[ ${1:-} != --inside ]]; then
  # Host side: build, list the test binaries, hand over to the VM.
  list=$(mktemp /var/tmp/weft-verbs-tests.XXXXXX)
  trap 'rm -f "$list" "$list".*' EXIT
  tests() { cargo test "$@" --no-run --message-format=json | grep '"test":true' |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p'; }
  tests -p weft-verbs >"$list"
  tests -p weft-fabric --test conformance >"$list.conformance"
  tests -p weft-fabric --lib >"$list.adapters"
  # Jobs and benchmarks use the release build (what a user runs and measures).
  cargo build --release --workspace --bins --examples
  cargo build --release -p weft-verbs --example verbs_pingpong --example verbs_readbw
  echo "${CARGO_TARGET_DIR:-$PWD/target}/release" >"$list.release"
  [[ -s $list && -s $list.conformance && -s $list.adapters ]] || { echo "verbs-vm: no test binaries built" >&2; exit 1; }
  echo "verbs-vm: built in $(($(date +%s) - start)) s"
  rc=0
  ci/softroce.sh -t "${WEFT_VERBS_VM_TIMEOUT:-840}" -- ci/verbs-vm.sh --inside "$list" || rc=$?
  echo "verbs-vm: finished with status $rc after $(($(date +%s) - start)) s"
  exit "$rc"
fi

# Inside the VM (root, rxe0 up).
list=$2
R=$(cat "$list.release")
examples=$R/examples
fail=0
step() { echo; echo "=== $*"; }
bad() { echo "verbs-vm: FAILED: $*"; fail=1; }
export WEFT_VERBS_REQUIRE_DEVICE=1 RUST_BACKTRACE=1

step "ibv_devinfo, weft info"
ibv_devinfo -d rxe0 || bad "ibv_devinfo"
timeout 30 "$R/weft" info || bad "weft info"

while read -r bin; do
  step "$(basename "$bin")"
  # One test at a time: the VM has few (emulated) CPUs and some tests count verbs objects.
  timeout 600 "$bin" --test-threads=1 || bad "$(basename "$bin")"
done <"$list"

step "fabric conformance over verbs"
conf=$(cat "$list.conformance")
n=0
for t in $("$conf" verbs --list 2>/dev/null | sed -n 's/: test$//p'); do
  n=$((n + 1))
  # Each test alone, so a hang shows as that test's failure and the others still run.
  if out=$(timeout 120 "$conf" "$t" --exact --test-threads=1 2>&1); then
    echo "ok   $t"
  else
    echo "$out" | tail -15; bad "conformance $t"
  fi
done
[[ $n -ge 20 ]] || bad "only $n conformance tests over verbs were found"

step "the verbs adapter's suite (frames, a full connection, the RDMA-read rendezvous)"
adapters=$(cat "$list.adapters")
if out=$(timeout 300 "$adapters" path::tests::verbs --test-threads=1 2>&1); then
  echo "$out" | grep -E "^test |test result"
  [[ $(echo "$out" | grep -c "^test .* ok$") -ge 5 ]] || bad "only $(echo "$out" | grep -c "^test .* ok$") adapter tests over verbs passed"
else
  echo "$out" | tail -15; bad "the verbs adapter suite"
fi

step "multi-process jobs on 2 logical nodes, verbs between them"
baseline=$(rdma resource show 2>/dev/null | tr -s ' ' | tr '\n' ' ')
job() { # NAME EXPECTED-EXIT ARGS...: runs weft run ARGS, shows its output
  local name=$1 want=$2 rc=0; shift 2
  out=$(timeout 120 "$R/weft" run --nodes 2 --map-by node "$@" 2>&1) || rc=$?
  echo "$out" | sed "s/^/[$name] /"
  [[ $rc == "$want" ]] || bad "$name: exit status $rc, expected $want"
}
job ring 0 -n 4 "$examples/ring"
echo "$out" | grep -q "ring ok" || bad "ring did not complete"
job sessions 0 -n 4 "$examples/sessions_demo"
[[ $(echo "$out" | grep -c " size 4 pgcid ") == 8 ]] || bad "sessions_demo: expected 8 comm lines"
# Four threads per process make sessions and communicators at once and talk over them
# (verbs between the nodes, shared memory within), also all on one communicator.
job threads 0 -n 4 "$R/session_probe" thread
[[ $(echo "$out" | grep -c "threads ok provided single,funneled,serialized,multiple") == 4 ]] || bad "threads: expected 4 ok lines"
# Rank 1 (node 1) dies while rank 0 (node 0) waits on it: in a receive, and in a 4 MiB
# rendezvous send over verbs. The survivor's error names rank 1 within 2 s.
for scenario in dead-peer dead-peer-rendezvous; do
  job "$scenario" 137 -n 2 "$R/fabric_probe" "$scenario"
  ms=$(echo "$out" | sed -n 's/.* gone after \([0-9]*\) ms.*/\1/p' | head -1)
  [[ -n $ms && $ms -lt 2000 ]] || bad "$scenario: the survivor did not report rank 1 gone within 2 s (${ms:-never})"
done
# A first send to a peer that is blocked in a fence, or busy outside any call for longer
# than the handshake timeout, completes: a live peer is never reported gone.
for scenario in first-send-to-a-fencing-peer first-send-to-a-busy-peer; do
  job "$scenario" 0 -n 2 -x WEFT_VERBS_HANDSHAKE_TIMEOUT_MS=1000 "$R/fabric_probe" "$scenario"
  [[ $(echo "$out" | grep -c " ok$") == 2 ]] || bad "$scenario: expected 2 ok lines"
done
# A first send waiting for a busy peer's handshake lets the process's other thread go on.
job busy-peer 0 -n 3 -x WEFT_TRANSPORTS=verbs "$R/fabric_probe" busy-peer
m=$(echo "$out" | sed -n 's/.* ms, \([0-9]*\) round trips.*/\1/p' | head -1)
[[ -n $m && $m -ge 100 ]] || bad "busy-peer: rank 0's other thread was stalled while its first send waited (${m:-no} round trips)"
# Every collective (0 B to 4 MiB) checked against point-to-point references on 2 + 1 processes (uneven),
# verbs between the nodes and shared memory within.
job coll 0 -n 3 "$R/coll_check" --max 524288
[[ $(echo "$out" | grep -c "coll ok") == 3 ]] || bad "coll_check: expected 3 ok lines"
sleep 1
after=$(rdma resource show 2>/dev/null | tr -s ' ' | tr '\n' ' ')
echo "rdma resources before: $baseline"
echo "rdma resources after:  $after"
[[ $after == "$baseline" ]] || bad "verbs resources (QPs, MRs, ...) left behind by the jobs"

step "benchmark smoke: perftest and weft on rxe0 (emulated: only ratios mean anything)"
perf() { # TOOL ARGS...: server in the background, client against it at 127.0.0.2
  local tool=$1; shift
  "$tool" -d rxe0 -x 1 "$@" >/dev/null 2>&1 &
  local srv=$!
  sleep 3 # the server must listen first: under emulation it has taken over 1 s
  timeout 120 "$tool" -d rxe0 -x 1 "$@" 127.0.0.2 || bad "$tool"
  wait "$srv" || true
}
pt=$(perf ib_send_lat -s 8 -n 2000 | awk '$1 == 8 {print $5, $6}')
pl=$(echo "$pt" | awk '$2 ~ /^[0-9.]+$/ {print $2}'); pt=$(echo "$pt" | awk '$1 ~ /^[0-9.]+$/ {print $1}')
pb=$(perf ib_write_bw -s 1048576 -n 200 | awk '$1 == 1048576 {printf "%.1f", $4 * 1.048576}')
wl=$(WEFT_TRANSPORTS=verbs timeout 120 "$R/weft" bench latency --sizes 8,65536 --no-limit --percentiles --json) || bad "weft bench latency"
wb=$(WEFT_TRANSPORTS=verbs timeout 120 "$R/weft" bench bw --sizes 8192,1048576 --no-limit --json) || bad "weft bench bw"
echo "$wl"; echo "$wb"
l8=$(echo "$wl" | sed -n 's/.*"size":8,"latency_us":\([0-9.]*\).*/\1/p')
t8=$(echo "$wl" | sed -n 's/.*"size":8,.*"median_us":\([0-9.]*\).*/\1/p')
b1=$(echo "$wb" | sed -n 's/.*"size":1048576,"bandwidth_mbs":\([0-9.]*\).*/\1/p')
[[ -n $l8 && -n $b1 ]] || bad "weft bench printed no 8 B latency or 1 MiB bandwidth"
if [[ -n $pl && -n $l8 && -n $pb && -n $b1 ]]; then
  echo "8 B latency (mean): weft $l8 us, ib_send_lat $pl us (t_avg), ratio $(awk "BEGIN {printf \"%.2f\", $l8 / $pl}")"
  [[ -n $t8 && -n $pt ]] && echo "8 B latency (typical): weft median $t8 us, ib_send_lat t_typical $pt us, ratio $(awk "BEGIN {printf \"%.2f\", $t8 / $pt}")"
  echo "1 MiB bandwidth: weft $b1 MB/s, ib_write_bw $pb MB/s, ratio $(awk "BEGIN {printf \"%.2f\", $b1 / $pb}")"
fi
timeout 120 "$examples/verbs_pingpong" 32 2000 || bad "verbs_pingpong"
timeout 120 "$examples/verbs_readbw" 1048576 200 16 write || bad "verbs_readbw"

echo
echo "verbs-vm: inside the VM took $(($(date +%s) - start)) s; status $fail"
exit "$fail"
