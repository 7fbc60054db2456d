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
  # Test binaries are the artifacts with an executable (the crate has no bin targets).
  cargo test -p weft-verbs --no-run --message-format=json |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' >"$list"
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
step "perftest smoke: ib_send_lat -d rxe0 -x 1 at 127.0.0.2"
ib_send_lat -d rxe0 -x 1 -n 200 >/tmp/perf-server.log 2>&1 &
server=$!
sleep 2
if timeout 120 ib_send_lat -d rxe0 -x 1 -n 200 127.0.0.2; then
  echo "perftest: ok"
else
  echo "perftest: ib_send_lat client failed"; fail=1
fi
wait "$server" || { echo "perftest: server failed:"; cat /tmp/perf-server.log; fail=1; }
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
