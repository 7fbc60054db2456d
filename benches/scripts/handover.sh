#!/usr/bin/env bash
# How fast one process can hand the CPU to another that waits for it (issue 34: what a
# waiting loop should do when processes outnumber cores): two processes ping-pong a
# shared-memory word 200,000 times, each waiting for its turn by sched_yield or by futex
# wait/wake, both on CPU 0 (one core shared: the oversubscribed case) and unpinned (a
# core each). Prints the time per round trip (two hand-overs).
#
# usage: benches/scripts/handover.sh
# Needs cc. Installs nothing; builds target/handover.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p target
cat > target/handover.c <<'C'
#define _GNU_SOURCE
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int use_futex;
static void wait_for(_Atomic int *f, int want) {
    int x;
    while ((x = atomic_load(f)) != want) {
        if (use_futex)
            syscall(SYS_futex, f, FUTEX_WAIT, x, 0, 0, 0);
        else
            sched_yield();
    }
}
static void set(_Atomic int *f, int v) {
    atomic_store(f, v);
    if (use_futex)
        syscall(SYS_futex, f, FUTEX_WAKE, 1, 0, 0, 0);
}
int main(int argc, char **argv) {
    int n = 200000, pin = argc > 2 && !strcmp(argv[2], "pin");
    use_futex = argc > 1 && !strcmp(argv[1], "futex");
    _Atomic int *f = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (pin) {
        cpu_set_t s;
        CPU_ZERO(&s);
        CPU_SET(0, &s);
        sched_setaffinity(0, sizeof s, &s);
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (fork() == 0) {
        for (int i = 0; i < n; i++) {
            wait_for(f, 2 * i + 1);
            set(f, 2 * i + 2);
        }
        exit(0);
    }
    for (int i = 0; i < n; i++) {
        set(f, 2 * i + 1);
        wait_for(f, 2 * i + 2);
    }
    wait(0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%-6s %-11s %8.3f us per round trip\n", use_futex ? "futex" : "yield",
           pin ? "one core" : "two cores",
           ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 1e3 / n);
    return 0;
}
C
cc -O2 -o target/handover target/handover.c
for how in yield futex; do
  for where in pin free; do
    target/handover "$how" "$where"
  done
done
