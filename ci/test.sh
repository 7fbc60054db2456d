#!/usr/bin/env bash
# The test command (README.md, .ci/run): lint, then every test of the workspace.
# Multi-process tests go through the real launcher and servers; each has a timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
ci/deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The library an application gets without the verbs feature (no rdma bindings) stays clean.
cargo clippy -p weft -p weft-fabric -p weft-wireup --no-default-features --lib -- -D warnings
ci/features.sh
before=$(ls /dev/shm | grep -c '^weft-' || true)
# Processes of this workspace's binaries (servers, launchers, ranks) still running.
ours() { ps -eo pid=,args= | grep -E "^ *[0-9]+ $PWD/target/" || true; }
procs_before=$(ours | wc -l)
# Weft under foreign PMIx hosts (cli/tests/pmix.rs): Open MPI's mpirun, and a real Slurm
# started here on 127.0.0.1 (ci/slurm.sh); those tests fail instead of skipping.
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
eval "$($SUDO ci/slurm.sh start)"
trap '$SUDO ci/slurm.sh stop' EXIT
export WEFT_REQUIRE_PMIX_HOSTS=1 WEFT_REQUIRE_MPICH=1 WEFT_REQUIRE_OPENMPI=1 WEFT_REQUIRE_PMI2=1 WEFT_REQUIRE_GDB=1
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
else
  echo "cargo-nextest not found; using cargo test"
  cargo test --workspace --no-fail-fast
fi
cargo test --workspace --doc
# Unmodified outside programs: mpi4py's own test suite (Debian's build on Open MPI) under
# weft run and mpirun at 1, 2 and 4 processes; every test mpirun passes must pass.
ci/mpi4py.sh -n "1 2 4"
# Its dynamic-process tests (MPI_Comm_spawn, spawn_multiple, publish/lookup, accept/connect,
# join) alone: mpirun hangs in them from 2 processes on and is cut after 240 s; every test it
# passed before must pass under weft run.
ci/mpi4py.sh --dynamic -n "1 2 4"
# The one-shot form users and the acceptance checks run (ci/slurm.sh -- COMMAND): its own
# cluster, COMMAND's status, no daemon left after.
$SUDO ci/slurm.sh stop
$SUDO ci/slurm.sh -- srun --mpi=pmix -n 4 target/debug/examples/fence_demo --mode sparse \
  | tee /tmp/weft-slurm-oneshot.out
[ "$(grep -c ' ok$' /tmp/weft-slurm-oneshot.out)" = 4 ] || { echo "ci/slurm.sh --: expected 4 ok lines"; exit 1; }
if pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null; then
  echo "ci/slurm.sh -- left a Slurm daemon running"; exit 1
fi
rm -f /tmp/weft-slurm-oneshot.out
# Hostile input for a fixed time per target (decoders, server handlers, corrupted
# segments, a live server under hostile requests).
ci/fuzz.sh "${WEFT_FUZZ_SECS:-30}"
# Jobs with a rank or server killed or paused at random: they end, name the lost process,
# leave nothing behind, and give exact data when nothing is killed (the long run: 300).
ci/chaos.sh "${WEFT_CHAOS_RUNS:-24}"
# Job families (issue 33): a parent that spawns, into a session or not, with a child, a
# parent or the spawning rank killed at random: no hang, no orphan, no leak.
ci/chaos-family.sh "${WEFT_CHAOS_FAMILY_RUNS:-16}"
# The fastbox publish/consume protocol under loom's model checker.
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p weft-shm --lib --release loom
# The unsafe code of the frame codecs and the shared-memory layout under valgrind's memcheck
# (miri's stand-in here: no miri component on this toolchain).
ci/memcheck.sh
# Verbs for real: weft-verbs tests, the fabric conformance suite over verbs, jobs on 2 logical
# nodes with verbs between them, and a benchmark smoke next to perftest, on soft-RoCE in a
# qemu VM (~2-3 min; outside the VM the verbs tests above skip with a printed reason).
ci/verbs-vm.sh
after=$(ls /dev/shm | grep -c '^weft-' || true)
if [ "$after" -gt "$before" ]; then
  echo "leaked shared-memory segments:"; ls -l /dev/shm | grep ' weft-'
  exit 1
fi
# Jobs end with their tests; a few seconds' grace for the last ones to wind down.
for _ in $(seq 1 10); do
  [ "$(ours | wc -l)" -le "$procs_before" ] && break
  sleep 1
done
if [ "$(ours | wc -l)" -gt "$procs_before" ]; then
  echo "processes left behind by the tests:"; ours
  exit 1
fi
echo "ci/test.sh: all green"
