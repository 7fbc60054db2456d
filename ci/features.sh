#!/usr/bin/env bash
# Runs what an application gets without the default features (ci/test.sh calls it after
# the clippy checks; it needs the debug `weft` command, which it builds if missing):
#  (a) `weft` with only `tcp`: no shared-memory path, no verbs. Two ranks on this node
#      must talk over TCP: pingpong runs; an invalid WEFT_TCP_* tunable makes init fail
#      (so the TCP transport was opened: nothing else could carry the messages), and
#      WEFT_TRANSPORTS=shm is refused naming the missing `shm` feature.
#  (b) `weft` with `shm` and `collectives`: no TCP, no verbs. A collective example runs
#      over shared memory, and WEFT_TRANSPORTS=tcp is refused naming the `tcp` feature.
# The examples are built into the normal target dir (the dependencies stay cached) and
# copied aside; the default-featured examples are built again at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
weft=$PWD/target/debug/weft
[ -x "$weft" ] || cargo build -p weft-cli --bin weft
out=$(mktemp -d /tmp/weft-features.XXXXXX)
trap 'rm -rf "$out"' EXIT

fail() {
  echo "ci/features.sh: FAILED: $*" >&2
  exit 1
}

# Builds the weft package's examples with the given features; copies them to $out/$1.
build() {
  local name=$1
  shift
  echo "== cargo build -p weft --examples --no-default-features $*"
  cargo build -p weft --examples --no-default-features "$@"
  mkdir -p "$out/$name"
  find target/debug/examples -maxdepth 1 -type f -executable ! -name '*-*' \
    -exec cp {} "$out/$name/" \;
}

# Runs `weft run -n 2 ...` with a time limit; its output in $log, its status returned.
run2() {
  log=$(timeout 120 "$weft" run -n 2 "$@" 2>&1) && return 0 || return $?
}

# Each transport alone stays clean too.
for f in tcp shm; do
  cargo clippy -p weft -p weft-fabric --no-default-features --features $f --lib -- -D warnings
done

# (a) TCP only.
build tcp --features tcp
[ -x "$out/tcp/pingpong" ] || fail "(a) the pingpong example was not built"
run2 "$out/tcp/pingpong" --sizes 8,65536,1048576 || fail "(a) pingpong over TCP: $log"
echo "$log"
grep -q "pingpong ok" <<<"$log" || fail "(a) pingpong did not say ok: $log"
# The TCP transport is the one opened: its tunables are read (and a bad one refused).
if run2 env WEFT_TCP_MAX_FRAME=not-a-size "$out/tcp/pingpong" --sizes 8; then
  fail "(a) a bad WEFT_TCP_MAX_FRAME was accepted: the TCP transport was not opened"
fi
grep -q "WEFT_TCP_MAX_FRAME" <<<"$log" || fail "(a) the failure does not name WEFT_TCP_MAX_FRAME: $log"
echo "(a) the TCP transport carried the messages (a bad WEFT_TCP_MAX_FRAME is refused)"
if run2 env WEFT_TRANSPORTS=shm "$out/tcp/pingpong" --sizes 8; then
  fail "(a) WEFT_TRANSPORTS=shm ran in a build without shm"
fi
# (The examples print an error's Debug form: the variant, InitError::ShmNotBuilt, whose
# message names the feature.)
grep -qE 'ShmNotBuilt|the `shm` feature of weft-fabric is off' <<<"$log" ||
  fail "(a) WEFT_TRANSPORTS=shm is not refused naming the shm feature: $log"
echo "(a) WEFT_TRANSPORTS=shm is refused: the \`shm\` feature is named"

# (b) Shared memory and collectives, no TCP.
build shm --features shm,collectives
[ -x "$out/shm/readme_collectives" ] || fail "(b) the readme_collectives example was not built"
run2 "$out/shm/readme_collectives" || fail "(b) readme_collectives over shm: $log"
echo "$log"
[ "$(grep -c 'of a node of 2: total 2, scan' <<<"$log")" -eq 2 ] ||
  fail "(b) readme_collectives: not both ranks reported the allreduce's total: $log"
grep -q 'sum \[2.0, 2.0, 2.0, 2.0\]' <<<"$log" || fail "(b) readme_collectives: wrong sum: $log"
if run2 env WEFT_TRANSPORTS=tcp "$out/shm/readme_collectives"; then
  fail "(b) WEFT_TRANSPORTS=tcp ran in a build without TCP"
fi
grep -qE 'TcpNotBuilt|the `tcp` feature of weft-fabric is off' <<<"$log" ||
  fail "(b) WEFT_TRANSPORTS=tcp is not refused naming the tcp feature: $log"
echo "(b) WEFT_TRANSPORTS=tcp is refused: the \`tcp\` feature is named"

# The examples the other tests run are the default-featured ones again.
cargo build -p weft --examples
echo "ci/features.sh: all green"
