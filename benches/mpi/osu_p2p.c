/*
 * MPI baseline for Weft's point-to-point benchmarks: a small equivalent of the OSU
 * micro-benchmarks osu_latency, osu_bw, osu_bibw and osu_mbw_mr (2 processes), printing
 * one JSON object per line in the schema of `weft bench latency|bw|bibw|mr --json`:
 *
 *   {"bench":"latency","size":8,"latency_us":0.41,"impl":"openmpi","iters":1000}
 *   {"bench":"bw","size":4194304,"bandwidth_mbs":9876.5,"impl":"mpich","iters":20,"window":64}
 *   {"bench":"mr","size":8,"msg_rate":1234567.8,"bandwidth_mbs":9.9,"impl":"openmpi",...}
 *
 * Semantics (as in OSU):
 *   latency  ping-pong of MPI_Send/MPI_Recv; half the round trip, averaged over the timed
 *            iterations after the warm-up ones.
 *   bw       rank 0 posts a window of MPI_Isend, rank 1 a window of MPI_Irecv, both
 *            MPI_Waitall, then rank 1 sends a 4-byte ack; bytes / time in MB/s (10^6 B/s).
 *   bibw     both ranks post a window of MPI_Irecv and one of MPI_Isend, then MPI_Waitall;
 *            bytes of both directions / time.
 *   mr       osu_mbw_mr with one pair: like bw, reported as messages per second.
 * Iterations: latency 1000 timed after 100 warm-up for sizes up to 8 KiB, 100 after 10
 * above; bw, bibw and mr 100 windows after 10, 20 after 2 above 8 KiB. --iters N sets the
 * small-size count (large sizes use N/10, warm-up a tenth of each).
 *
 * usage: mpirun -n 2 osu_p2p [--sizes BYTES[,BYTES...]] [--bench NAME[,NAME...]]
 *                            [--iters N] [--window W]
 *   sizes: default 0 and powers of two up to 4 MiB (K and M suffixes: powers of 1024);
 *          bw and bibw skip size 0.
 *   bench: latency, bw, bibw, mr (default: all four).
 * `impl` is "openmpi" or "mpich", from the mpi.h it was built with.
 */
#include <mpi.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* MPICH defines MPI_STATUSES_IGNORE as (MPI_Status *)1, which GCC 12 mistakes for a
 * zero-sized array passed to MPI_Waitall. */
#if defined(__GNUC__) && !defined(__clang__) && defined(MPICH_VERSION)
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif

#if defined(OPEN_MPI)
#define IMPL "openmpi"
#elif defined(MPICH_VERSION) || defined(MPICH)
#define IMPL "mpich"
#else
#define IMPL "unknown"
#endif

#define MAX_DEFAULT_SIZE (4L << 20)
#define MAX_SIZE (1L << 30)
#define MAX_SIZES 64
#define MAX_WINDOW 1024
#define LARGE_MESSAGE 8192
#define TAG_DATA 100
#define TAG_ACK 101

enum { LATENCY = 1, BW = 2, BIBW = 4, MR = 8 };

static int rank;

static void die(const char *fmt, const char *what)
{
    if (rank == 0) {
        fprintf(stderr, "osu_p2p: ");
        fprintf(stderr, fmt, what);
        fprintf(stderr, "\n");
    }
    MPI_Finalize();
    exit(2);
}

/* One size: digits with an optional K, M or G suffix (powers of 1024). */
static long parse_size(const char *s)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || errno != 0 || v < 0)
        return -1;
    if (*end == 'K' || *end == 'k') { v <<= 10; end++; }
    else if (*end == 'M') { v <<= 20; end++; }
    else if (*end == 'G') { v <<= 30; end++; }
    if (*end != '\0' || v > MAX_SIZE)
        return -1;
    return v;
}

static int cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

static int parse_sizes(char *list, long *sizes)
{
    int n = 0;
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        long v = parse_size(tok);
        if (v < 0)
            die("--sizes: bad size \"%s\" (a number of bytes, K/M/G suffixes, at most 1G)", tok);
        if (n == MAX_SIZES)
            die("--sizes: too many sizes (at most 64)%s", "");
        sizes[n++] = v;
    }
    if (n == 0)
        die("--sizes names no size%s", "");
    qsort(sizes, n, sizeof sizes[0], cmp_long);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (m == 0 || sizes[m - 1] != sizes[i])
            sizes[m++] = sizes[i];
    return m;
}

static int parse_benches(char *list)
{
    int mask = 0;
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        if (!strcmp(tok, "latency")) mask |= LATENCY;
        else if (!strcmp(tok, "bw")) mask |= BW;
        else if (!strcmp(tok, "bibw")) mask |= BIBW;
        else if (!strcmp(tok, "mr")) mask |= MR;
        else die("--bench: unknown benchmark \"%s\" (latency, bw, bibw, mr)", tok);
    }
    return mask;
}

static char *sbuf, *rbuf;
static int window = 64;
static long small_iters = 0; /* 0: the defaults */

/* Timed iterations at `size`: `small` up to LARGE_MESSAGE, `large` above (with --iters N:
 * N and N/10); a tenth of them untimed first. */
static long iters_for(long size, long small, long large, long *skip)
{
    long n;
    if (small_iters > 0)
        n = size > LARGE_MESSAGE ? (small_iters / 10 > 0 ? small_iters / 10 : 1) : small_iters;
    else
        n = size > LARGE_MESSAGE ? large : small;
    *skip = n / 10;
    return n;
}

static double latency(long size, long *iters_out)
{
    long skip, iters = iters_for(size, 1000, 100, &skip);
    double t0 = 0.0;
    int peer = 1 - rank;
    MPI_Barrier(MPI_COMM_WORLD);
    for (long i = 0; i < iters + skip; i++) {
        if (i == skip)
            t0 = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(sbuf, (int)size, MPI_CHAR, peer, TAG_DATA, MPI_COMM_WORLD);
            MPI_Recv(rbuf, (int)size, MPI_CHAR, peer, TAG_DATA, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(rbuf, (int)size, MPI_CHAR, peer, TAG_DATA, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(sbuf, (int)size, MPI_CHAR, peer, TAG_DATA, MPI_COMM_WORLD);
        }
    }
    double t = MPI_Wtime() - t0;
    *iters_out = iters;
    return t * 1e6 / (2.0 * iters);
}

/* Windows of non-blocking sends from rank 0 to rank 1, each acknowledged; returns the
 * time of the timed windows (seconds, rank 0). Used by bw and mr. */
static double unidirectional(long size, long iters, long skip)
{
    MPI_Request req[MAX_WINDOW];
    double t0 = 0.0;
    MPI_Barrier(MPI_COMM_WORLD);
    for (long i = 0; i < iters + skip; i++) {
        if (i == skip)
            t0 = MPI_Wtime();
        if (rank == 0) {
            for (int j = 0; j < window; j++)
                MPI_Isend(sbuf, (int)size, MPI_CHAR, 1, TAG_DATA, MPI_COMM_WORLD, &req[j]);
            MPI_Waitall(window, req, MPI_STATUSES_IGNORE);
            MPI_Recv(rbuf, 4, MPI_CHAR, 1, TAG_ACK, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            for (int j = 0; j < window; j++)
                MPI_Irecv(rbuf, (int)size, MPI_CHAR, 0, TAG_DATA, MPI_COMM_WORLD, &req[j]);
            MPI_Waitall(window, req, MPI_STATUSES_IGNORE);
            MPI_Send(sbuf, 4, MPI_CHAR, 0, TAG_ACK, MPI_COMM_WORLD);
        }
    }
    return MPI_Wtime() - t0;
}

static double bibw(long size, long iters, long skip)
{
    MPI_Request req[2 * MAX_WINDOW];
    int peer = 1 - rank;
    double t0 = 0.0;
    MPI_Barrier(MPI_COMM_WORLD);
    for (long i = 0; i < iters + skip; i++) {
        if (i == skip)
            t0 = MPI_Wtime();
        for (int j = 0; j < window; j++)
            MPI_Irecv(rbuf, (int)size, MPI_CHAR, peer, TAG_DATA, MPI_COMM_WORLD, &req[j]);
        for (int j = 0; j < window; j++)
            MPI_Isend(sbuf, (int)size, MPI_CHAR, peer, TAG_DATA, MPI_COMM_WORLD, &req[window + j]);
        MPI_Waitall(2 * window, req, MPI_STATUSES_IGNORE);
    }
    return MPI_Wtime() - t0;
}

int main(int argc, char **argv)
{
    int size_world;
    long sizes[MAX_SIZES];
    int nsizes = 0;
    int benches = LATENCY | BW | BIBW | MR;

    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        fprintf(stderr, "osu_p2p: MPI_Init failed\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size_world);

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (rank == 0)
                printf("usage: mpirun -n 2 osu_p2p [--sizes BYTES[,BYTES...]] "
                       "[--bench latency,bw,bibw,mr] [--iters N] [--window W]\n");
            MPI_Finalize();
            return 0;
        }
        if (i + 1 >= argc)
            die("%s needs a value", a);
        if (!strcmp(a, "--sizes")) nsizes = parse_sizes(argv[++i], sizes);
        else if (!strcmp(a, "--bench")) benches = parse_benches(argv[++i]);
        else if (!strcmp(a, "--iters")) {
            small_iters = parse_size(argv[++i]);
            if (small_iters <= 0) die("--iters \"%s\": expected a positive number", argv[i]);
        } else if (!strcmp(a, "--window")) {
            long w = parse_size(argv[++i]);
            if (w <= 0 || w > MAX_WINDOW) die("--window \"%s\": expected 1 to 1024", argv[i]);
            window = (int)w;
        } else
            die("unknown argument \"%s\"", a);
    }
    if (size_world != 2)
        die("needs exactly 2 processes%s", "");
    if (nsizes == 0) {
        sizes[nsizes++] = 0;
        for (long s = 1; s <= MAX_DEFAULT_SIZE; s *= 2)
            sizes[nsizes++] = s;
    }
    long max = sizes[nsizes - 1] > 4 ? sizes[nsizes - 1] : 4;
    if (posix_memalign((void **)&sbuf, 4096, (size_t)max) ||
        posix_memalign((void **)&rbuf, 4096, (size_t)max))
        die("cannot allocate the buffers%s", "");
    memset(sbuf, 'a', (size_t)max);
    memset(rbuf, 'b', (size_t)max);

    if (rank == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len;
        MPI_Get_library_version(version, &len);
        char *nl = strchr(version, '\n');
        if (nl)
            *nl = '\0';
        fprintf(stderr, "# osu_p2p (%s): %s\n", IMPL, version);
    }

    for (int k = 0; k < nsizes && (benches & LATENCY); k++) {
        long iters;
        double us = latency(sizes[k], &iters);
        if (rank == 0)
            printf("{\"bench\":\"latency\",\"size\":%ld,\"latency_us\":%.4f,\"impl\":\"%s\","
                   "\"iters\":%ld}\n", sizes[k], us, IMPL, iters);
        fflush(stdout);
    }
    for (int k = 0; k < nsizes && (benches & BW); k++) {
        long skip, iters = iters_for(sizes[k], 100, 20, &skip);
        if (sizes[k] == 0)
            continue;
        double t = unidirectional(sizes[k], iters, skip);
        if (rank == 0)
            printf("{\"bench\":\"bw\",\"size\":%ld,\"bandwidth_mbs\":%.4f,\"impl\":\"%s\","
                   "\"iters\":%ld,\"window\":%d}\n",
                   sizes[k], (double)sizes[k] * iters * window / t / 1e6, IMPL, iters, window);
        fflush(stdout);
    }
    for (int k = 0; k < nsizes && (benches & BIBW); k++) {
        long skip, iters = iters_for(sizes[k], 100, 20, &skip);
        if (sizes[k] == 0)
            continue;
        double t = bibw(sizes[k], iters, skip);
        /* Rank 0's time; both directions' bytes. */
        if (rank == 0)
            printf("{\"bench\":\"bibw\",\"size\":%ld,\"bandwidth_mbs\":%.4f,\"impl\":\"%s\","
                   "\"iters\":%ld,\"window\":%d}\n",
                   sizes[k], 2.0 * sizes[k] * iters * window / t / 1e6, IMPL, iters, window);
        fflush(stdout);
    }
    for (int k = 0; k < nsizes && (benches & MR); k++) {
        long skip, iters = iters_for(sizes[k], 100, 20, &skip);
        double t = unidirectional(sizes[k], iters, skip);
        double rate = (double)iters * window / t;
        if (rank == 0)
            printf("{\"bench\":\"mr\",\"size\":%ld,\"msg_rate\":%.1f,\"bandwidth_mbs\":%.4f,"
                   "\"impl\":\"%s\",\"iters\":%ld,\"window\":%d}\n",
                   sizes[k], rate, rate * sizes[k] / 1e6, IMPL, iters, window);
        fflush(stdout);
    }
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return 0;
}
