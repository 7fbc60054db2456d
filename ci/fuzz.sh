#!/usr/bin/env bash
# Hostile input, for a fixed time per target (issue 14): the wire-up frame decoders, the
# server's request and peer handlers (weft-runtime) through the real decoding path, the server's data
# state machine, a live server under hostile requests over its socket, the datastore
# reader and the inbox consumer under corrupted segments, the verbs handshake decoder,
# the fabric engine under hostile frames from a peer, and a live TCP endpoint taking
# connection after connection of mutated handshakes and record streams.
# Saved inputs (*/fuzz/corpus/) are replayed by every test run as well.
#
#   ci/fuzz.sh [SECONDS_PER_TARGET]     (default 30; WEFT_FUZZ_SEED picks the inputs)
set -euo pipefail
cd "$(dirname "$0")/.."
export WEFT_FUZZ_SECS=${1:-${WEFT_FUZZ_SECS:-30}}
log=$(mktemp /var/tmp/weft-fuzz.XXXXXX)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
run() { cargo test "$@" -- --nocapture --test-threads=2 2>&1 | tee -a "$log" | grep -E '^fuzz |test result|panicked|FAILED' || true; }
run -p weft-wireup --test fuzz fuzz_
run -p weft-runtime --lib fuzz_
run -p weft-shm --lib fuzz_
run -p weft-verbs --lib fuzz_
run -p weft-fabric --lib fuzz_
run -p weft-tcp --test fuzz fuzz_
cargo build -q -p weft-testkit --bins
run -p weft-cli --test wireup a_server_under_hostile_requests
echo
echo "ci/fuzz.sh: $WEFT_FUZZ_SECS s per target, $(($(date +%s) - start)) s in all:"
grep -E '^fuzz ' "$log" | sed 's/^/  /'
if grep -qE 'panicked|FAILED|test result: FAILED' "$log"; then
  echo "ci/fuzz.sh: a target failed (see above; rerun with its seed: WEFT_FUZZ_SEED=...)"
  exit 1
fi
[[ $(grep -c 'test result: ok' "$log") -ge 6 ]] || { echo "ci/fuzz.sh: some targets did not run"; exit 1; }
echo "ci/fuzz.sh: no findings"
