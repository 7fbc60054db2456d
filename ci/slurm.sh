#!/usr/bin/env bash
# A real single-node Slurm on this machine, for the tests of Weft under `srun --mpi=pmix`:
# Debian 12's slurmctld + slurmd (22.05, with its PMIx plugin loading libpmix from
# libpmix-dev) and munge, all on 127.0.0.1, configured in a private directory (nothing in
# /etc/slurm is touched; SLURM_CONF points at it).
#
#   ci/slurm.sh start    starts munged (if not running), slurmctld and slurmd; waits until
#                        the node is idle; prints `export SLURM_CONF=...`
#   ci/slurm.sh stop     stops the daemons this script started
#   ci/slurm.sh env      prints the SLURM_CONF line
#
# Needs root (the daemons run as root) and the packages of ci/deps.sh (slurmd slurmctld
# slurm-client munge). Exit status 0 when the cluster is up (start) or down (stop).
set -euo pipefail
dir=${WEFT_SLURM_DIR:-/var/tmp/weft-slurm}
conf=$dir/slurm.conf
host=$(hostname -s)

env_line() { echo "export SLURM_CONF=$conf"; }

stop() {
  for d in slurmd slurmctld; do
    if [[ -f $dir/$d.pid ]]; then
      kill "$(cat "$dir/$d.pid")" 2>/dev/null || true
      rm -f "$dir/$d.pid"
    fi
  done
}

start() {
  for tool in slurmctld slurmd srun sinfo munged; do
    command -v "$tool" >/dev/null || { echo "slurm.sh: $tool not found (ci/deps.sh installs it)" >&2; exit 2; }
  done
  [[ $(id -u) == 0 ]] || { echo "slurm.sh: needs root (the daemons run as root)" >&2; exit 2; }
  stop
  mkdir -p "$dir/state" "$dir/spool" /run/munge
  # munge: a key (the package makes one; make one if missing) and the daemon.
  if [[ ! -s /etc/munge/munge.key ]]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
  chmod 0400 /etc/munge/munge.key
  if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- munged --force
  fi
  local cpus
  cpus=$(nproc)
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
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
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
      env_line
      return 0
    fi
    sleep 0.2
  done
  echo "slurm.sh: the node did not come up within 20 s" >&2
  sinfo 2>&1 >&2 || true
  tail -20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
  exit 1
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env) env_line ;;
  *) echo "usage: ci/slurm.sh start|stop|env" >&2; exit 2 ;;
esac
