/*
 * The floor of a two-party exchange on this machine: two threads pinned to cores 0 and 1
 * hand a counter back and forth through cache lines, with no library in between. A
 * node-local barrier or 8 B allreduce of two processes cannot beat the "symmetric" figure
 * (each side publishes its flag, then waits for the other's: one line crossing each way,
 * overlapped); the ping-pong round trip is two crossings in a row.
 *
 *   cc -O2 -pthread -o target/cacheline_floor benches/c/cacheline_floor.c
 *   target/cacheline_floor [ITERS]        (default 2,000,000)
 *
 * Prints: `pingpong round trip X ns`, `symmetric exchange Y ns`, and the symmetric
 * exchange again with each side alternating between two flags 64 and 256 bytes apart
 * (the parities of Weft's node segment: they cost nothing here).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long iters = 2000000;
static _Alignas(128) _Atomic long ping;
static _Alignas(128) _Atomic long pong;
/* Two members' flags, 2 KiB apart; `stride` longs between a member's two parities. */
static _Alignas(4096) _Atomic long flags[512];
static int stride;

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *ponger(void *arg) {
    (void)arg;
    pin(1);
    for (long i = 1; i <= iters; i++) {
        while (atomic_load_explicit(&ping, memory_order_acquire) < i)
            ;
        atomic_store_explicit(&pong, i, memory_order_release);
    }
    return NULL;
}

static void *member(void *arg) {
    long me = (long)arg;
    pin((int)me);
    long mine = me * 256, other = (1 - me) * 256;
    for (long i = 1; i <= iters; i++) {
        long p = (i & 1) * stride;
        atomic_store_explicit(&flags[mine + p], i, memory_order_release);
        while (atomic_load_explicit(&flags[other + p], memory_order_acquire) < i)
            ;
    }
    return NULL;
}

static double symmetric(int s) {
    stride = s;
    for (int k = 0; k < 512; k++)
        atomic_store(&flags[k], 0);
    pthread_t t;
    pthread_create(&t, NULL, member, (void *)1);
    double t0 = now();
    member((void *)0);
    double t1 = now();
    pthread_join(t, NULL);
    return (t1 - t0) / iters * 1e9;
}

int main(int argc, char **argv) {
    if (argc > 1)
        iters = atol(argv[1]);
    if (iters <= 0) {
        fprintf(stderr, "usage: cacheline_floor [ITERS > 0]\n");
        return 2;
    }
    pthread_t t;
    pin(0);
    pthread_create(&t, NULL, ponger, NULL);
    double t0 = now();
    for (long i = 1; i <= iters; i++) {
        atomic_store_explicit(&ping, i, memory_order_release);
        while (atomic_load_explicit(&pong, memory_order_acquire) < i)
            ;
    }
    double t1 = now();
    pthread_join(t, NULL);
    printf("pingpong round trip %.1f ns\n", (t1 - t0) / iters * 1e9);
    printf("symmetric exchange %.1f ns\n", symmetric(0));
    printf("symmetric exchange, parities 64 B apart %.1f ns\n", symmetric(8));
    printf("symmetric exchange, parities 256 B apart %.1f ns\n", symmetric(32));
    return 0;
}
