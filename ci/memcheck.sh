#!/usr/bin/env bash
# The unsafe code of the frame codecs and the shared-memory layout under valgrind's
# memcheck: the unit tests that drive it on heap memory (fastbox rings, the datastore's
# layout, segments, the pair-line copies, the collective tree words, claims; the fabric's
# header codec, hostile frames and schedule casts; the wire-up frame and protocol codecs).
# An invalid read or write, a use after free or a branch on uninitialised bytes fails the
# step even where the test's own assertions pass.
#
# This stands in for miri, which the issue asks for and this machine cannot run (its
# nightly toolchain has no miri component and none can be downloaded here): memcheck
# has no aliasing model and does not see bounds inside one mmap'd segment, so it covers
# the heap-backed tests only. Multi-threaded spinning tests are left out (valgrind runs
# one thread at a time; they would take minutes).
#
#   ci/memcheck.sh            (exit status 0 when clean; ~1 min)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "memcheck: valgrind not found (ci/deps.sh installs it)" >&2; exit 1; }
bin() { # PACKAGE[:TEST]: the path of its library unit-test binary, or of its integration
  # test TEST (built if needed)
  local target=--lib
  [[ $1 == *:* ]] && target="--test ${1#*:}"
  # shellcheck disable=SC2086
  cargo test -p "${1%%:*}" $target --no-run --message-format=json 2>/dev/null |
    grep '"test":true' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | head -1
}
fail=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
run() { # PACKAGE FILTERS...
  local pkg=$1 b; shift
  b=$(bin "$pkg")
  [[ -n $b ]] || { echo "memcheck: no test binary for $pkg"; fail=1; return; }
  echo "=== memcheck $pkg: $*"
  local rc=0
  valgrind -q --error-exitcode=99 "$b" --test-threads=1 "$@" >"$log" 2>&1 || rc=$?
  grep -E "^==[0-9]+== [A-Z]|test result" "$log" | head -20
  [[ $rc -eq 0 ]] || { echo "memcheck: $pkg: FAILED (status $rc)"; fail=1; }
}
run weft-shm fastbox:: store:: segment:: pair::tests::copy_short coll::tests::tree_words claim:: \
  --skip concurrent_reader
run weft-fabric headers_round_trip short_headers fuzz_hostile sched::tests::casts sched::tests::pair
run weft-wireup frame:: proto::
run weft-wireup:fuzz fuzz_
[[ $fail -eq 0 ]] && echo "memcheck: clean"
exit "$fail"
