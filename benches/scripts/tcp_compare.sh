#!/usr/bin/env bash
# TCP references for Weft's TCP transport, on loopback: a bare C program on blocking
# sockets (benches/c/tcp_ref.c, "impl": "c-tcp"), Open MPI forced onto its TCP BTL
# (benches/mpi/osu_p2p.c, "impl": "openmpi-tcp") and `WEFT_TRANSPORTS=tcp weft bench
# latency|bw` ("impl": "weft-tcp"), printed as JSON lines in the schema of `weft bench
# latency|bw --json`, then a table of weft's ratios to the two references (stderr).
#
# usage: benches/scripts/tcp_compare.sh [--out FILE] [--sizes BYTES[,BYTES...] | --full]
#                                       [--impl c-tcp,openmpi,weft] [--iters N] [--poll]
#   --out FILE   write the JSON lines to FILE instead of stdout
#   --sizes L    sizes to measure (default: 8,1048576,4194304; K and M suffixes)
#   --full       the full sweep: powers of two from 1 B to 4 MiB
#   --impl L     only these (default: all three; a missing one is skipped with a reason)
#   --iters N    small-size iterations for c-tcp and openmpi (large sizes N/10); weft
#                keeps its own OSU defaults (its --iters means every size)
#   --poll       also c-tcp-poll: tcp_ref --poll, the same with busy-polling MSG_DONTWAIT
#                calls instead of sleeping in recv/send (MPI libraries poll; see tcp_ref.c)
#
# Installs nothing. Needs cc; Open MPI (apt-get install openmpi-bin libopenmpi-dev); a
# release weft (cargo build --release --bins), used when target/release/weft exists.
# Open MPI runs with --bind-to core --map-by core --allow-run-as-root --mca btl tcp,self
# --mca pml ob1 --mca btl_tcp_if_include lo: no vader (shared memory), no UCX. c-tcp binds
# its 2 processes to cores 0 and 1, weft uses its --bind-to auto. A failed run is reported
# and the others still run; the exit status is then 1. Each run is limited to
# TCP_COMPARE_TIMEOUT seconds (default 900). Binaries: target/tcp_ref, target/osu_p2p.openmpi.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() { sed -n '2,26s/^# \{0,1\}//p' "$0"; }

out=""
sizes="8,1048576,4194304"
full_sizes="1,2,4,8,16,32,64,128,256,512,1K,2K,4K,8K,16K,32K,64K,128K,256K,512K,1M,2M,4M"
impls="c-tcp,openmpi,weft"
iters=()
poll=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out)
      [ $# -ge 2 ] || { echo "tcp_compare.sh: --out needs a file" >&2; exit 2; }
      out="$2"; shift ;;
    --sizes)
      [ $# -ge 2 ] || { echo "tcp_compare.sh: --sizes needs a list" >&2; exit 2; }
      sizes="$2"; shift ;;
    --full) sizes="$full_sizes" ;;
    --poll) poll=1 ;;
    --impl)
      [ $# -ge 2 ] || { echo "tcp_compare.sh: --impl needs a list" >&2; exit 2; }
      impls="$2"; shift
      for i in ${impls//,/ }; do
        case "$i" in c-tcp|openmpi|weft) ;; *)
          echo "tcp_compare.sh: --impl $i: expected c-tcp, openmpi or weft" >&2; exit 2 ;;
        esac
      done ;;
    --iters)
      [ $# -ge 2 ] || { echo "tcp_compare.sh: --iters needs a number" >&2; exit 2; }
      iters=(--iters "$2"); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "tcp_compare.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
wants() { case ",$impls," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

ncores=$(nproc 2>/dev/null || echo 1)
if [ "$ncores" -lt 2 ]; then
  echo "tcp_compare.sh: warning: $ncores core; the 2 processes share it, unbound" >&2
fi
limit=${TCP_COMPARE_TIMEOUT:-900}

mkdir -p target
if [ -n "$out" ]; then
  mkdir -p "$(dirname "$out")"
  : > "$out"
fi
all=$(mktemp)
trap 'rm -f "$all"' EXIT
# The JSON lines go to stdout or FILE, and to $all for the ratios.
emit() { if [ -n "$out" ]; then tee -a "$all" >> "$out"; else tee -a "$all"; fi; }
# relabel FROM TO: the "impl" of osu_p2p's and weft's lines, naming the TCP path.
relabel() { sed -u "s/\"impl\":\"$1\"/\"impl\":\"$2\"/"; }

ran=0
failed=0
run() {  # run NAME FROM TO CMD...: CMD's JSON lines, "impl" FROM renamed TO, to emit
  local name="$1" from="$2" to="$3"; shift 3
  echo "tcp_compare.sh: $name: $*" >&2
  if timeout "$limit" "$@" | relabel "$from" "$to" | emit; then
    ran=$((ran + 1))
  else
    echo "tcp_compare.sh: $name failed (exit status $?)" >&2
    failed=$((failed + 1))
  fi
}

if wants c-tcp; then
  if command -v cc >/dev/null 2>&1; then
    echo "tcp_compare.sh: building target/tcp_ref with cc" >&2
    cc -O2 -Wall -o target/tcp_ref benches/c/tcp_ref.c
    bind=()
    [ "$ncores" -ge 2 ] || bind=(--no-bind)
    run c-tcp c-tcp c-tcp target/tcp_ref --json --bench latency,bw --sizes "$sizes" \
      "${iters[@]}" "${bind[@]}"
    if [ "$poll" = 1 ]; then
      run c-tcp-poll c-tcp-poll c-tcp-poll target/tcp_ref --poll --json --bench latency,bw \
        --sizes "$sizes" "${iters[@]}" "${bind[@]}"
    fi
  else
    echo "tcp_compare.sh: skipping c-tcp: cc not found (apt-get install gcc)" >&2
  fi
fi

if wants openmpi; then
  if command -v mpicc.openmpi >/dev/null 2>&1 && command -v mpirun.openmpi >/dev/null 2>&1
  then
    echo "tcp_compare.sh: building target/osu_p2p.openmpi with mpicc.openmpi" >&2
    mpicc.openmpi -O2 -Wall -o target/osu_p2p.openmpi benches/mpi/osu_p2p.c
    # Only the TCP BTL (and self, for a rank's messages to itself), over lo; ob1, since
    # the UCX PML would bypass the BTLs. The environment's OMPI_MCA_* cannot widen it:
    # command-line --mca values take precedence.
    cmd=(mpirun.openmpi -n 2 --allow-run-as-root --mca btl tcp,self --mca pml ob1
         --mca btl_tcp_if_include lo)
    if [ "$ncores" -ge 2 ]; then
      cmd+=(--bind-to core --map-by core)
    else
      cmd+=(--bind-to none --oversubscribe)
    fi
    run openmpi-tcp openmpi openmpi-tcp "${cmd[@]}" target/osu_p2p.openmpi \
      --bench latency,bw --sizes "$sizes" "${iters[@]}"
  else
    echo "tcp_compare.sh: skipping openmpi: mpicc.openmpi/mpirun.openmpi not found" \
         "(apt-get install openmpi-bin libopenmpi-dev)" >&2
  fi
fi

if wants weft; then
  if [ -x target/release/weft ]; then
    for b in latency bw; do
      run "weft-tcp $b" weft weft-tcp env WEFT_TRANSPORTS=tcp target/release/weft bench "$b" \
        --json --no-limit --sizes "$sizes"
    done
  else
    echo "tcp_compare.sh: skipping weft: no target/release/weft" \
         "(cargo build --release --bins)" >&2
  fi
fi

# The ratios: latency at 8 B (weft/ref > 1: weft slower), bandwidth at 1 and 4 MiB
# (weft/ref < 1: weft slower). c-tcp-poll, when measured, gets a column of its own.
awk '
  function field(k,   m) {
    if (match($0, "\"" k "\":\"?[^,\"}]*")) {
      m = substr($0, RSTART, RLENGTH); sub("^\"" k "\":\"?", "", m); return m
    }
    return ""
  }
  { v[field("bench") "/" field("size") "/" field("impl")] = \
      field("bench") == "latency" ? field("latency_us") : field("bandwidth_mbs") }
  { if (field("impl") == "c-tcp-poll") poll = 1 }
  function show(x) { return x == "" ? "-" : sprintf("%.2f", x) }
  function ratio(a, b) { return (a == "" || b == "" || b + 0 == 0) ? "-" : sprintf("%.3f", a / b) }
  END {
    printf "%-16s %12s", "", "c-tcp" > "/dev/stderr"
    if (poll) printf " %12s", "c-tcp-poll" > "/dev/stderr"
    printf " %12s %12s %12s %12s\n", "openmpi-tcp", "weft-tcp", "weft/c-tcp",
           "weft/openmpi" > "/dev/stderr"
    n = split("latency/8/us bw/1048576/MB/s bw/4194304/MB/s", rows, " ")
    for (i = 1; i <= n; i++) {
      split(rows[i], p, "/"); k = p[1] "/" p[2]
      c = v[k "/c-tcp"]; o = v[k "/openmpi-tcp"]; w = v[k "/weft-tcp"]
      label = p[1] == "latency" ? "latency 8 B, us" : \
              sprintf("bw %d MiB, MB/s", p[2] / 1048576)
      printf "%-16s %12s", label, show(c) > "/dev/stderr"
      if (poll) printf " %12s", show(v[k "/c-tcp-poll"]) > "/dev/stderr"
      printf " %12s %12s %12s %12s\n", show(o), show(w), ratio(w, c),
             ratio(w, o) > "/dev/stderr"
    }
  }' "$all"

[ -n "$out" ] && echo "tcp_compare.sh: JSON lines in $out" >&2
if [ "$failed" -gt 0 ]; then
  echo "tcp_compare.sh: $failed run(s) failed" >&2
  exit 1
fi
if [ "$ran" -eq 0 ]; then
  echo "tcp_compare.sh: nothing ran" >&2
  exit 1
fi
exit 0
