/*
 * OSU-style collective latency for the MPI baselines of `weft bench coll`: barrier,
 * bcast, reduce, allreduce, allgather and alltoall, with the OSU micro-benchmarks'
 * semantics (root 0; reductions sum floats, sizes below 4 bytes skipped; 1000 timed
 * iterations up to 8 KiB and 100 above, after 200 and 10 untimed; the average time per
 * call over the iterations, averaged over the ranks), printed as one JSON object per line
 * in the schema of `weft bench coll --json` plus "impl".
 *
 * Build: mpicc -O2 -DIMPL='"openmpi"' -o osu_coll osu_coll.c
 * usage: mpirun -n N osu_coll [--sizes BYTES[,BYTES...]] [--bench NAME[,NAME...]]
 *                             [--iters N]
 * Our own program (no OSU code): the same loop as Weft's benchmark, so the figures compare.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef IMPL
#define IMPL "mpi"
#endif

#define MAX_SIZES 64
static const char *NAMES[] = {"barrier", "bcast", "reduce", "allreduce", "allgather", "alltoall"};
#define NBENCH 6

static int rank, nprocs;

static void die(const char *what, const char *arg)
{
    if (rank == 0)
        fprintf(stderr, "osu_coll: %s %s\n", what, arg);
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

static long parse_size(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 0)
        die("not a size:", s);
    if (*end == 'K' || *end == 'k') v <<= 10, end++;
    else if (*end == 'M' || *end == 'm') v <<= 20, end++;
    if (*end)
        die("not a size:", s);
    return v;
}

static double one_run(int b, long size, void *s, void *r, int iters, int warmup)
{
    int count = (int)(size / 4);
    double t0 = 0;
    for (int i = 0; i < warmup + iters; i++) {
        if (i == warmup) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        switch (b) {
        case 0: MPI_Barrier(MPI_COMM_WORLD); break;
        case 1: MPI_Bcast(s, (int)size, MPI_CHAR, 0, MPI_COMM_WORLD); break;
        case 2: MPI_Reduce(s, r, count, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD); break;
        case 3: MPI_Allreduce(s, r, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
        case 4: MPI_Allgather(s, (int)size, MPI_CHAR, r, (int)size, MPI_CHAR, MPI_COMM_WORLD); break;
        case 5: MPI_Alltoall(s, (int)size, MPI_CHAR, r, (int)size, MPI_CHAR, MPI_COMM_WORLD); break;
        }
    }
    double us = (MPI_Wtime() - t0) * 1e6 / iters;
    MPI_Barrier(MPI_COMM_WORLD);
    return us;
}

int main(int argc, char **argv)
{
    long sizes[MAX_SIZES];
    int nsizes = 0, fixed_iters = 0;
    int want[NBENCH] = {1, 1, 1, 1, 1, 1};
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            die("needs a value:", argv[i]);
        if (!strcmp(argv[i], "--sizes")) {
            char *list = strdup(argv[++i]);
            for (char *t = strtok(list, ","); t && nsizes < MAX_SIZES; t = strtok(NULL, ","))
                sizes[nsizes++] = parse_size(t);
            free(list);
        } else if (!strcmp(argv[i], "--bench")) {
            memset(want, 0, sizeof want);
            char *list = strdup(argv[++i]);
            for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
                int found = 0;
                for (int b = 0; b < NBENCH; b++)
                    if (!strcmp(t, NAMES[b])) want[b] = found = 1;
                if (!found)
                    die("unknown collective:", t);
            }
            free(list);
        } else if (!strcmp(argv[i], "--iters")) {
            fixed_iters = (int)parse_size(argv[++i]);
        } else
            die("unknown argument:", argv[i]);
    }
    if (nsizes == 0)
        for (long s = 1; s <= (1 << 20); s *= 2)
            sizes[nsizes++] = s;
    long max = 4;
    for (int i = 0; i < nsizes; i++)
        if (sizes[i] > max) max = sizes[i];
    char *s, *r;
    if (posix_memalign((void **)&s, 4096, (size_t)max * nprocs) ||
        posix_memalign((void **)&r, 4096, (size_t)max * nprocs))
        die("cannot allocate", "buffers");
    memset(s, 1, (size_t)max * nprocs);
    memset(r, 0, (size_t)max * nprocs);
    if (rank == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len;
        MPI_Get_library_version(version, &len);
        char *nl = strchr(version, '\n');
        if (nl) *nl = '\0';
        fprintf(stderr, "# osu_coll (%s): %s\n", IMPL, version);
    }
    for (int b = 0; b < NBENCH; b++) {
        if (!want[b])
            continue;
        int n = b == 0 ? 1 : nsizes;
        for (int i = 0; i < n; i++) {
            long size = b == 0 ? 0 : sizes[i];
            if ((b == 2 || b == 3) && size < 4)
                continue;
            int iters = fixed_iters ? fixed_iters : (size > 8192 ? 100 : 1000);
            int warmup = size > 8192 ? 10 : 200;
            double us = one_run(b, size, s, r, iters, warmup), sum = 0, lo = 0, hi = 0;
            MPI_Reduce(&us, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
            MPI_Reduce(&us, &lo, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
            MPI_Reduce(&us, &hi, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
            if (rank == 0)
                printf("{\"bench\":\"%s\",\"size\":%ld,\"procs\":%d,\"nodes\":1,"
                       "\"latency_us\":%.4f,\"min_us\":%.4f,\"max_us\":%.4f,\"iters\":%d,"
                       "\"impl\":\"%s\"}\n",
                       NAMES[b], size, nprocs, sum / nprocs, lo, hi, iters, IMPL);
            fflush(stdout);
        }
    }
    free(s);
    free(r);
    MPI_Finalize();
    return 0;
}
