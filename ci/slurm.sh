#!/usr/bin/env bash
# A real single-node Slurm on this machine, for running Weft programs under
# `srun --mpi=pmix`: Debian 12's slurmctld + slurmd (22.05, with its PMIx plugin loading
# libpmix from libpmix-dev) and munge, all on 127.0.0.1, configured in a private directory
# (nothing in /etc/slurm is touched; SLURM_CONF points at it).
#
#   ci/slurm.sh -- COMMAND [ARGS...]
#                        installs the Debian packages it needs (when missing), brings the
#                        cluster up, runs COMMAND with SLURM_CONF set (e.g. `srun --mpi=pmix
#                        -n 4 target/release/examples/fence_demo --mode sparse`), tears
#                        everything down (jobs, daemons, its directory), even on failure or
#                        Ctrl-C, and exits with COMMAND's status
#   ci/slurm.sh start    brings the cluster up and prints `export SLURM_CONF=...` (eval it)
#   ci/slurm.sh stop     tears down what `start` brought up
#   ci/slurm.sh env      prints the SLURM_CONF line
#
# The node offers WEFT_SLURM_CPUS (default 64) CPUs whatever the machine has, so `srun -n 16`
# runs on a laptop or a 2-core CI runner without --overcommit (the tasks share the cores).
# Needs root (the daemons run as root); run as another user, it asks sudo. Exit status 2:
# a usage error or a missing prerequisite.
set -euo pipefail
dir=${WEFT_SLURM_DIR:-/var/tmp/weft-slurm}
conf=$dir/slurm.conf
cpus=${WEFT_SLURM_CPUS:-64}
host=$(hostname -s)
PKGS=(slurmd slurmctld slurm-client munge libpmix-dev)

say() { echo "slurm.sh: $*" >&2; }
env_line() { echo "export SLURM_CONF=$conf"; }

need_root() {
  if [[ $(id -u) != 0 ]]; then
    command -v sudo >/dev/null || { say "needs root (the daemons run as root) and sudo is missing"; exit 2; }
    exec sudo -E "$0" "$@"
  fi
}

install() {
  local missing=() p
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update >&2
    apt-get install -y --no-install-recommends "${missing[@]}" >&2
  fi
}

# Waits up to 10 s for process $1 to go, then kills it.
reap() {
  local pid=$1
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
}

stop() {
  [[ -d $dir ]] || return 0
  # Jobs first (their step daemons and tasks), while the controller still answers.
  if [[ -f $dir/slurmctld.pid ]] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
    SLURM_CONF=$conf scancel --quiet --full --user="$(id -un)" 2>/dev/null || true
    SLURM_CONF=$conf scancel --quiet --full 2>/dev/null || true
  fi
  local d pid
  for d in slurmd slurmctld; do
    if [[ -f $dir/$d.pid ]]; then
      pid=$(cat "$dir/$d.pid")
      kill "$pid" 2>/dev/null || true
      reap "$pid"
    fi
  done
  # Step daemons of this cluster that outlived slurmd (they name its spool directory).
  pkill -9 -f "slurmstepd.*$dir" 2>/dev/null || true
  for pid in $(pgrep -x slurmstepd 2>/dev/null); do
    if grep -qs "$dir" "/proc/$pid/environ" "/proc/$pid/cmdline"; then kill -9 "$pid" 2>/dev/null || true; fi
  done
  if [[ -f $dir/munged.ours ]]; then
    pid=$(cat /run/munge/munged.pid 2>/dev/null || true)
    if [[ -n $pid ]]; then
      kill "$pid" 2>/dev/null || true
      reap "$pid"
    fi
  fi
  rm -rf "$dir"
}

start() {
  local tool
  for tool in slurmctld slurmd srun sinfo scancel munged; do
    command -v "$tool" >/dev/null || { say "$tool not found (apt-get install ${PKGS[*]}, or ci/deps.sh)"; exit 2; }
  done
  stop
  # A fresh controller numbers jobs from 1 again: the PMIx plugin's directories of an
  # earlier instance's steps would collide ("Cannot create directory
  # /tmp/spmix_appdir_0_15.0: File exists", the step fails to launch).
  rm -rf /tmp/spmix_appdir_* 2>/dev/null || true
  mkdir -p "$dir/state" "$dir/spool" /run/munge
  # munge: a key (the package makes one; make one if missing) and the daemon.
  if [[ ! -s /etc/munge/munge.key ]]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
  chmod 0400 /etc/munge/munge.key
  if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- munged --force
    touch "$dir/munged.ours"
  fi
  cat >"$conf" <<EOF
ClusterName=weft-ci
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
MpiDefault=pmix
ReturnToService=2
SchedulerType=sched/builtin
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=ci Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF
  export SLURM_CONF=$conf
  slurmctld -c -f "$conf"
  slurmd -c -f "$conf"
  for _ in $(seq 1 100); do
    if sinfo -h -o %t 2>/dev/null | grep -q -E '^(idle|mix|alloc)'; then
      return 0
    fi
    sleep 0.2
  done
  say "the node did not come up within 20 s"
  sinfo >&2 2>&1 || true
  tail -20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
  return 1
}

case "${1:-}" in
  --)
    shift
    [[ $# -gt 0 ]] || { say "usage: ci/slurm.sh -- COMMAND [ARGS...]"; exit 2; }
    need_root -- "$@"
    install
    trap stop EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    start || exit 1
    export SLURM_CONF=$conf
    status=0
    "$@" || status=$?
    exit "$status"
    ;;
  start)
    need_root start
    if start; then env_line; else stop; exit 1; fi
    ;;
  stop) need_root stop; stop ;;
  env) env_line ;;
  *) say "usage: ci/slurm.sh -- COMMAND [ARGS...] | start | stop | env"; exit 2 ;;
esac
