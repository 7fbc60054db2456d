#!/usr/bin/env bash
# Runs a command as root inside a throwaway qemu VM (software emulation, TCG) whose stock Debian
# kernel has soft-RoCE loaded: device rxe0 on a dummy interface rxenet0 with the single address
# 127.0.0.2 (GID index 1 is its RoCE v2 IPv4 GID). The VM sees this machine's whole file tree
# over 9p (read-write) and starts in the current folder, so binaries built here run there
# unchanged. TMPDIR and /dev/shm inside are a private tmpfs (Unix sockets do not work on 9p).
# WEFT_* and RUST_* variables of the caller are passed into the VM.
#
#   ci/softroce.sh [-t SECONDS] [-m MEMORY_MB] -- COMMAND [ARGS...]
#
# Exit status: COMMAND's own; 125 if the VM or rxe0 could not be brought up; 124 if COMMAND
# started but the time limit (default 900 s) ended the VM first.
#
# Needs (Debian, see ci/deps.sh): qemu-system-x86 busybox-static cpio kmod rdma-core
# ibverbs-utils iproute2 (perftest for baselines). Downloads the stock kernel package once with
# `apt-get download` and caches it with the initramfs under ${WEFT_VM_CACHE:-~/.cache/weft-softroce}.
set -euo pipefail
timeout_s=900 mem=2048
while [[ $# -gt 0 ]]; do
  case $1 in
    -t) timeout_s=$2; shift 2 ;;
    -m) mem=$2; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[[ $# -gt 0 ]] || { echo "usage: ci/softroce.sh [-t SECONDS] [-m MB] -- COMMAND [ARGS...]" >&2; exit 2; }
for tool in qemu-system-x86_64 busybox cpio dpkg apt-get; do
  command -v "$tool" >/dev/null || { echo "softroce: $tool not found (run ci/deps.sh)" >&2; exit 125; }
done

cache=${WEFT_VM_CACHE:-$HOME/.cache/weft-softroce}
layout=1 # bump when the initramfs below changes
mkdir -p "$cache"
# One preparation at a time (parallel CI jobs share the cache).
exec 9>"$cache/lock"
flock 9
if [[ ! -f $cache/ready || $(sed -n 2p "$cache/ready") != "$layout" ]]; then
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  [[ -n $pkg ]] || { echo "softroce: no Debian kernel package found (apt-get update?)" >&2; exit 125; }
  echo "softroce: preparing $pkg under $cache (once)" >&2
  (cd "$cache" && rm -rf k ./*.deb && apt-get download "$pkg" >/dev/null && dpkg -x ./*.deb k && rm -f ./*.deb) ||
    { echo "softroce: could not download/extract $pkg" >&2; exit 125; }
  kver=$(ls "$cache/k/lib/modules")
  root=$cache/initrd
  rm -rf "$root" && mkdir -p "$root"/{bin,proc,sys,dev,mnt,mods}
  cp "$(command -v busybox)" "$root/bin/busybox" && ln -s busybox "$root/bin/sh"
  for m in drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_pci_legacy_dev \
           drivers/virtio/virtio_pci_modern_dev drivers/virtio/virtio_pci fs/netfs/netfs \
           fs/fscache/fscache net/9p/9pnet net/9p/9pnet_virtio fs/9p/9p; do
    cp "$cache/k/lib/modules/$kver/kernel/$m.ko" "$root/mods/" ||
      { echo "softroce: module $m missing from $pkg" >&2; exit 125; }
  done
  cat >"$root/init" <<'INIT'
#!/bin/sh
export PATH=/bin
busybox mount -t proc proc /proc; busybox mount -t sysfs sys /sys; busybox mount -t devtmpfs dev /dev
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci netfs fscache 9pnet 9pnet_virtio 9p; do
  busybox insmod /mods/$m.ko || echo "softroce: insmod $m failed"
done
busybox mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 hostroot /mnt || echo "softroce: 9p mount failed"
busybox mount -t proc proc /mnt/proc; busybox mount -t sysfs sys /mnt/sys; busybox mount -t devtmpfs dev /mnt/dev
busybox mkdir -p /mnt/dev/shm /mnt/dev/pts; busybox mount -t tmpfs shm /mnt/dev/shm
job=$(busybox sed -n 's/.*weftjob=\([^ ]*\).*/\1/p' /proc/cmdline)
busybox chroot /mnt /bin/bash "$job/inner.sh"
busybox poweroff -f
INIT
  chmod +x "$root/init"
  (cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip >"$cache/initrd.gz")
  printf '%s\n%s\n' "$kver" "$layout" >"$cache/ready"
fi
flock -u 9
kver=$(sed -n 1p "$cache/ready")
mods=$cache/k/lib/modules/$kver/kernel

job=$(mktemp -d /var/tmp/weft-softroce.XXXXXX)
trap 'rm -rf "$job"' EXIT
printf '%q ' "$@" >"$job/cmd"
# The caller's WEFT_* and RUST_* variables, re-exported inside.
export -p | grep -E '^declare -x (WEFT|RUST)_[A-Za-z0-9_]*=' >"$job/env" || true
cat >"$job/inner.sh" <<INNER
export PATH=/usr/local/cargo/bin:${HOME}/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=${HOME} TMPDIR=/dev/shm/tmp
mkdir -p \$TMPDIR
for m in crypto/crc32_generic drivers/infiniband/core/ib_core drivers/infiniband/core/ib_uverbs \
         net/ipv4/udp_tunnel net/ipv6/ip6_udp_tunnel drivers/infiniband/sw/rxe/rdma_rxe drivers/net/dummy; do
  insmod $mods/\$m.ko || { echo "softroce: insmod \$m failed"; exit; }
done
ip link set lo up
ip link add rxenet0 type dummy && ip addr add 127.0.0.2/8 dev rxenet0 && ip link set rxenet0 up
rdma link add rxe0 type rxe netdev rxenet0 || { echo "softroce: rxe0 not created"; exit; }
source $job/env
cd $(printf '%q' "$PWD")
echo "softroce: rxe0 up, running: \$(cat $job/cmd)"
echo started >$job/state
bash -c "\$(cat $job/cmd)"
echo \$? >$job/rc
echo done >$job/state
INNER
echo none >"$job/state"
start=$(date +%s)
timeout "$timeout_s" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m "$mem" -smp "$(nproc)" \
  -nographic -no-reboot -nic none -kernel "$cache/k/boot/vmlinuz-$kver" -initrd "$cache/initrd.gz" \
  -append "console=ttyS0 quiet panic=-1 weftjob=$job" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=passthrough,id=hostroot,multidevs=remap \
  </dev/null | sed -u -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g' -e 's/^c//' -e '/^SeaBIOS\|^Booting from\|^iPXE\|^$/d' || true
# The command's own status when it finished (124 included); else why it did not.
case $(cat "$job/state") in
  done) rc=$(cat "$job/rc") ;;
  started) rc=124; echo "softroce: time limit of $timeout_s s reached while the command ran" >&2 ;;
  *) rc=125; echo "softroce: the VM or rxe0 did not come up ($(($(date +%s) - start)) s)" >&2 ;;
esac
exit "$rc"
