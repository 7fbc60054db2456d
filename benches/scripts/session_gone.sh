#!/usr/bin/env bash
# How soon a child session is gone after its parent job ends (issue 33's target: within
# 100 ms): benches/mpi/pmix_alloc.c "gone" asks for a session, spawns a sleep into it,
# prints the time and the sleep's pid and exits; this script polls /proc every 0.2 ms until
# that process is gone (or a zombie), ROUNDS times, and prints each delay and the median (ms). The sleep is sent
# SIGTERM (it dies of it) when the session ends with its job.
#
# usage: benches/scripts/session_gone.sh [--rounds R] [--nodes K]
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=10
nodes=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="${2:?--rounds needs a value}"; shift ;;
    --nodes) nodes="${2:?--nodes needs a value}"; shift ;;
    -h|--help) sed -n '2,8s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "session_gone.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
cargo build --release -q -p weft-cli
tmp=$(mktemp -d /tmp/weft-session-gone.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2046
cc -O2 -o "$tmp/pmix_alloc" benches/mpi/pmix_alloc.c $(pkg-config --cflags --libs pmix)
WEFT="$PWD/target/release/weft" PROG="$tmp/pmix_alloc" ROUNDS="$rounds" NODES="$nodes" python3 - <<'PY'
import os, subprocess, time, statistics
weft, prog, rounds, nodes = os.environ["WEFT"], os.environ["PROG"], int(os.environ["ROUNDS"]), os.environ["NODES"]
delays = []
for r in range(rounds):
    secs = f"61.{os.getpid()}{r}"
    p = subprocess.Popen([weft, "run", "--nodes", nodes, "-n", nodes, prog, "gone", secs],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ends, pid = None, None
    for line in p.stdout:
        if line.startswith("parent ends at"):
            w = line.split()
            ends, pid = int(w[3]), w[5]
            break
    if pid in (None, "0"):
        raise SystemExit(f"round {r + 1}: the sleep of the session was not seen")
    gone = time.time_ns()
    while pid is not None:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if ") Z " in f.read():
                    gone = time.time_ns()
                    break
        except OSError:
            gone = time.time_ns()
            break
        time.sleep(0.0002)
    p.wait()
    delays.append((gone - ends) / 1e6)
    print(f"round {r + 1}: the session's sleep was gone {delays[-1]:.1f} ms after its parent's end")
print(f"median {statistics.median(delays):.1f} ms, max {max(delays):.1f} ms over {rounds} rounds")
PY
