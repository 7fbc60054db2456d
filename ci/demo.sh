#!/usr/bin/env bash
# Builds Weft and runs a small job: 4 processes on 2 logical nodes exchange cards with
# a Full fence and print what each learned. Extra arguments go to `weft run` first.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/deps.sh
cargo build --release --bins --examples
exec target/release/weft run --nodes 2 "$@" -n 4 target/release/examples/fence_demo --mode full
