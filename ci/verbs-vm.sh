#!/usr/bin/env bash
# The verbs tests on a real soft-RoCE device: builds the weft-verbs test binaries here, then
# boots the VM (ci/softroce.sh) and runs, inside it: ibv_devinfo, a perftest smoke
# (ib_send_lat server and client on rxe0 at 127.0.0.2), and every weft-verbs test binary with
# WEFT_VERBS_REQUIRE_DEVICE=1 (a missing device fails instead of skipping).
#
#   ci/verbs-vm.sh            (from anywhere; exit status 0 when everything passed)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
if [[ ${1:-} != --inside ]]; then
  # Host side: build, list the test binaries, hand over to the VM.
  list=$(mktemp /var/tmp/weft-verbs-tests.XXXXXX)
  trap 'rm -f "$list"' EXIT
  # Test binaries: artifacts of the test profile that have an executable.
  cargo test -p weft-verbs --no-run --message-format=json | grep '"test":true' |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' >"$list"
  # The latency smoke next to ib_send_lat (release build: what a benchmark measures).
  cargo build --release -p weft-verbs --example verbs_pingpong --example verbs_readbw
  echo "${CARGO_TARGET_DIR:-$PWD/target}/release/examples" >"$list.examples"
  trap 'rm -f "$list" "$list.examples"' EXIT
  [[ -s $list ]] || { echo "verbs-vm: no test binaries built" >&2; exit 1; }
  echo "verbs-vm: built $(wc -l <"$list") test binaries in $(($(date +%s) - start)) s"
  rc=0
  ci/softroce.sh -t "${WEFT_VERBS_VM_TIMEOUT:-840}" -- ci/verbs-vm.sh --inside "$list" || rc=$?
  echo "verbs-vm: finished with status $rc after $(($(date +%s) - start)) s"
  exit "$rc"
fi

# Inside the VM (root, rxe0 up).
list=$2
fail=0
step() { echo; echo "=== $*"; }
step "ibv_devinfo"
ibv_devinfo -d rxe0 || fail=1
step "rdma link"
rdma link show
step "perftest smoke: ib_send_lat -d rxe0 -x 1 -s 32 at 127.0.0.2"
ib_send_lat -d rxe0 -x 1 -s 32 -n 2000 >/tmp/perf-server.log 2>&1 &
server=$!
sleep 2
perf=""
if perf=$(timeout 120 ib_send_lat -d rxe0 -x 1 -s 32 -n 2000 127.0.0.2); then
  echo "$perf"
  echo "perftest: ok"
else
  echo "$perf"; echo "perftest: ib_send_lat client failed"; fail=1
fi
wait "$server" || { echo "perftest: server failed:"; cat /tmp/perf-server.log; fail=1; }
step "weft-verbs pingpong, 32-byte frames (same device, same run)"
examples=$(cat "$list.examples")
if weft=$(timeout 120 "$examples/verbs_pingpong" 32 2000); then
  echo "$weft"
  p=$(echo "$perf" | awk '$1 == 32 {print $6}')
  w=$(echo "$weft" | awk '$1 == 32 {print $3}')
  [[ -n $p && -n $w ]] && echo "latency: weft-verbs $w us, ib_send_lat $p us, ratio $(awk "BEGIN {printf \"%.2f\", $w / $p}")"
else
  echo "pingpong failed"; fail=1
fi
step "bandwidth at 1 MiB: ib_write_bw and weft-verbs RDMA write/read (window 16)"
ib_write_bw -d rxe0 -x 1 -s 1048576 -n 200 >/tmp/perf-server.log 2>&1 &
server=$!
sleep 2
if perf=$(timeout 120 ib_write_bw -d rxe0 -x 1 -s 1048576 -n 200 127.0.0.2); then
  echo "$perf"
else
  echo "$perf"; echo "perftest: ib_write_bw client failed"; fail=1
fi
wait "$server" || { echo "perftest: ib_write_bw server failed:"; cat /tmp/perf-server.log; fail=1; }
p=$(echo "$perf" | awk '$1 == 1048576 {print $4}')
for op in write read; do
  if weft=$(timeout 120 "$examples/verbs_readbw" 1048576 200 16 "$op"); then
    echo "$weft"
    w=$(echo "$weft" | awk '$1 == 1048576 {print $5}')
    [[ -n $p && -n $w ]] && echo "bandwidth: weft-verbs RDMA $op $w MB/s, ib_write_bw $p MB/s, ratio $(awk "BEGIN {printf \"%.2f\", $w / $p}")"
  else
    echo "readbw $op failed"; fail=1
  fi
done
export WEFT_VERBS_REQUIRE_DEVICE=1 RUST_BACKTRACE=1
while read -r bin; do
  step "$(basename "$bin")"
  # One test at a time: the VM has few (emulated) CPUs and some tests count verbs objects.
  if ! timeout 600 "$bin" --test-threads=1; then
    echo "verbs-vm: $(basename "$bin") FAILED"; fail=1
  fi
done <"$list"
echo
echo "verbs-vm: inside the VM took $(($(date +%s) - start)) s; status $fail"
exit "$fail"
