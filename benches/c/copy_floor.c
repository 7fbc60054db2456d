/*
 * The floor of a two-process node-local allgather (and alltoall) of B bytes per process on
 * this machine, with no library in between: what any implementation must do at least.
 *
 * Two processes (fork), pinned to cores 0 and 1, share one page of flags (MAP_SHARED |
 * MAP_ANONYMOUS, set up before the fork). Each iteration, each process:
 *   1. says its send buffer is ready (its flag = 2i - 1) and waits for the other's;
 *   2. copies its own block from its send buffer into its receive buffer (memcpy);
 *   3. reads the other's block straight from the other's send buffer into its receive
 *      buffer with one process_vm_readv (cross-memory attach: a single copy);
 *   4. says it is done reading (flag = 2i) and waits for the other's, so that neither
 *      reuses its send buffer while the other still reads it.
 * That is the shape of Weft's node segment (and of Open MPI's two-process allgather over
 * vader with CMA): two flag exchanges, one local copy and one single-copy read.
 *
 *   cc -O2 -o target/copy_floor benches/c/copy_floor.c
 *   target/copy_floor [BYTES [ITERS]]      (defaults 65536 and 20000)
 *
 * Prints `allgather floor B bytes: X us per call (copy Y us, read Z us, sync W us)`: the
 * mean over the iterations after 10% warm-up, and the mean time of each step (from
 * rank 0's clock; the steps are timed in separate runs so that the clock reads do not
 * add to the total).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct shared {
    _Alignas(128) _Atomic long flag[2][16];
    _Alignas(128) _Atomic unsigned long addr[2];
    _Alignas(128) _Atomic int pid[2];
    double result[4];
};

static void pin(int cpu)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s) != 0)
        perror("copy_floor: sched_setaffinity (running unpinned)");
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void sync_on(struct shared *sh, int me, long v)
{
    atomic_store_explicit(&sh->flag[me][0], v, memory_order_release);
    while (atomic_load_explicit(&sh->flag[1 - me][0], memory_order_acquire) < v)
        ;
}

/* mode: 0 everything, 1 only the copy, 2 only the read, 3 only the syncs. */
static double run(struct shared *sh, int me, char *send, char *recv, size_t b, long iters,
                  int mode, long *seq)
{
    int other = 1 - me;
    struct iovec local = {recv + (size_t)other * b, b};
    struct iovec remote = {(void *)atomic_load(&sh->addr[other]), b};
    pid_t peer = atomic_load(&sh->pid[other]);
    long warm = iters / 10;
    double t0 = 0;
    for (long i = 0; i < iters + warm; i++) {
        if (i == warm)
            t0 = now();
        if (mode == 0 || mode == 3)
            sync_on(sh, me, ++*seq);
        if (mode == 0 || mode == 1)
            memcpy(recv + (size_t)me * b, send, b);
        if (mode == 0 || mode == 2) {
            ssize_t got = process_vm_readv(peer, &local, 1, &remote, 1, 0);
            if (got != (ssize_t)b) {
                fprintf(stderr, "copy_floor: process_vm_readv: %s\n",
                        got < 0 ? strerror(errno) : "short read");
                exit(1);
            }
        }
        if (mode == 0 || mode == 3)
            sync_on(sh, me, ++*seq);
    }
    return (now() - t0) / iters * 1e6;
}

int main(int argc, char **argv)
{
    size_t b = argc > 1 ? strtoul(argv[1], NULL, 10) : 65536;
    long iters = argc > 2 ? strtol(argv[2], NULL, 10) : 20000;
    if (b == 0 || iters < 10) {
        fprintf(stderr, "usage: copy_floor [BYTES [ITERS]] (BYTES > 0, ITERS >= 10)\n");
        return 2;
    }
    struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("copy_floor: mmap");
        return 1;
    }
    pid_t child = fork();
    if (child < 0) {
        perror("copy_floor: fork");
        return 1;
    }
    int me = child == 0 ? 1 : 0;
    pin(me);
    char *send = malloc(b), *recv = malloc(2 * b);
    if (!send || !recv) {
        fprintf(stderr, "copy_floor: out of memory\n");
        return 1;
    }
    memset(send, me + 1, b);
    memset(recv, 0, 2 * b);
    atomic_store(&sh->addr[me], (unsigned long)send);
    atomic_store(&sh->pid[me], getpid());
    long seq = 0;
    sync_on(sh, me, ++seq);
    for (int mode = 0; mode < 4; mode++) {
        sync_on(sh, me, ++seq);
        double us = run(sh, me, send, recv, b, iters, mode, &seq);
        if (me == 0)
            sh->result[mode] = us;
    }
    if (recv[(size_t)(1 - me) * b] != 2 - me || recv[(size_t)me * b] != me + 1) {
        fprintf(stderr, "copy_floor: rank %d received wrong bytes\n", me);
        return 1;
    }
    sync_on(sh, me, ++seq);
    if (me == 1)
        return 0;
    int status = 0;
    waitpid(child, &status, 0);
    printf("allgather floor %zu bytes: %.3f us per call (copy %.3f us, read %.3f us, "
           "sync %.3f us)\n",
           b, sh->result[0], sh->result[1], sh->result[2], sh->result[3]);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
