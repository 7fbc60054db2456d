/*
 * Bare C TCP reference for Weft's TCP transport: the floor that plain blocking sockets
 * reach on loopback, measured with the semantics of benches/mpi/osu_p2p.c (the OSU-like
 * MPI baseline) and printed in the schema of `weft bench latency|bw --json`:
 *
 *   {"bench":"latency","size":8,"latency_us":12.3456,"impl":"c-tcp","iters":1000}
 *   {"bench":"bw","size":4194304,"bandwidth_mbs":4567.8,"impl":"c-tcp","iters":20,"window":64}
 *
 * Processes: the program is started once and forks. Before the fork it listens on
 * 127.0.0.1 (an ephemeral port, loopback only); the parent is rank 0, the child rank 1,
 * which connects; the parent accepts. One TCP connection, blocking, TCP_NODELAY on both
 * ends, the kernel's default (autotuned) socket buffers. Rank 0 is pinned to core 0 and
 * rank 1 to core 1 with sched_setaffinity (when core 0 or 1 is not in the allowed set, the
 * first two allowed CPUs are used, with a warning); --no-bind leaves both unbound. Rank 0
 * times with clock_gettime(CLOCK_MONOTONIC) and prints; rank 1 only answers. The exit
 * status is non-zero when either process fails.
 *
 * Semantics (as in osu_p2p.c and OSU):
 *   latency  ping-pong: rank 0 sends SIZE bytes, rank 1 reads them all and sends SIZE
 *            bytes back; half the round trip, averaged over the timed iterations after
 *            the warm-up ones.
 *   bw       rank 0 writes a window of W messages of SIZE bytes, rank 1 reads them all,
 *            then sends a 4-byte ack; bytes / time of rank 0 in MB/s (10^6 B/s).
 * Every message is read fully (recv() looped on short reads) and written with one send()
 * of the whole message (looped on short writes). Before each size both ranks exchange one
 * byte (the barrier).
 * --poll: the same calls with MSG_DONTWAIT, retried at once on EAGAIN (a busy-polling
 * receiver and sender, like MPI progress engines; "impl": "c-tcp-poll"). Blocking calls
 * put a waiting process to sleep, and waking it on the other core costs an inter-processor
 * interrupt (in a VM, a vCPU halt and wake-up), which can dominate small-message latency.
 * Iterations: latency 1000 timed after 100 warm-up for sizes up to 8 KiB, 100 after 10
 * above; bw 100 windows after 10, 20 after 2 above 8 KiB. --iters N sets the small-size
 * count (large sizes use N/10, warm-up a tenth of each).
 *
 * usage: tcp_ref [--json] [--no-bind] [--poll] [--sizes BYTES[,BYTES...]]
 *                [--bench latency,bw] [--iters N] [--window W]
 *   sizes: default powers of two from 1 B up to 4 MiB (K, M and G suffixes: powers of
 *          1024). Size 0 is skipped: a byte stream carries no empty message.
 *   bench: latency, bw (default: both).
 *   --json prints one JSON object per line; otherwise an OSU-style table.
 * build: cc -O2 -o target/tcp_ref benches/c/tcp_ref.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEFAULT_SIZE (4L << 20)
#define MAX_SIZE (1L << 30)
#define MAX_SIZES 64
#define MAX_WINDOW 1024
#define LARGE_MESSAGE 8192

enum { LATENCY = 1, BW = 2 };

static int rank = 0;
static int poll_flag = 0;        /* --poll: MSG_DONTWAIT, spinning on EAGAIN */
static const char *impl = "c-tcp";

static void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "tcp_ref: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(2);
}

static void die_errno(const char *what)
{
    fprintf(stderr, "tcp_ref (rank %d): %s: %s\n", rank, what, strerror(errno));
    exit(1);
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
            die("--sizes: too many sizes (at most 64)");
        sizes[n++] = v;
    }
    if (n == 0)
        die("--sizes names no size");
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
        else die("--bench: unknown benchmark \"%s\" (latency, bw)", tok);
    }
    if (mask == 0)
        die("--bench names no benchmark");
    return mask;
}

static char *sbuf, *rbuf;
static int window = 64;
static long small_iters = 0; /* 0: the defaults */

/* Timed iterations for SIZE and (in *skip) the warm-up ones before them. SMALL and LARGE
 * are the defaults up to 8 KiB and above; --iters N replaces them by N and N/10. */
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

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The whole of [buf, buf + len): one send() call, repeated on a short write. */
static void send_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | poll_flag);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
                continue;
            die_errno("send");
        }
        buf += n;
        len -= (size_t)n;
    }
}

/* Exactly len bytes, looping on short reads. */
static void recv_all(int fd, char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = recv(fd, buf, len, poll_flag);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
                continue;
            die_errno("recv");
        }
        if (n == 0) {
            fprintf(stderr, "tcp_ref (rank %d): peer closed the connection\n", rank);
            exit(1);
        }
        buf += n;
        len -= (size_t)n;
    }
}

/* One byte each way (a byte fits in the socket buffer, so both may send first). */
static void barrier(int fd)
{
    char b = 'x';
    send_all(fd, &b, 1);
    recv_all(fd, &b, 1);
}

static double latency(int fd, long size, long *iters_out)
{
    long skip, iters = iters_for(size, 1000, 100, &skip);
    double t0 = 0.0;
    barrier(fd);
    for (long i = 0; i < iters + skip; i++) {
        if (i == skip)
            t0 = now();
        if (rank == 0) {
            send_all(fd, sbuf, (size_t)size);
            recv_all(fd, rbuf, (size_t)size);
        } else {
            recv_all(fd, rbuf, (size_t)size);
            send_all(fd, sbuf, (size_t)size);
        }
    }
    double t = now() - t0;
    *iters_out = iters;
    return t * 1e6 / (2.0 * iters);
}

/* Windows of messages from rank 0 to rank 1, each window acknowledged with 4 bytes;
 * returns the time of the timed windows (seconds, meaningful on rank 0). */
static double bw(int fd, long size, long iters, long skip)
{
    double t0 = 0.0;
    barrier(fd);
    for (long i = 0; i < iters + skip; i++) {
        if (i == skip)
            t0 = now();
        if (rank == 0) {
            for (int j = 0; j < window; j++)
                send_all(fd, sbuf, (size_t)size);
            recv_all(fd, rbuf, 4);
        } else {
            for (int j = 0; j < window; j++)
                recv_all(fd, rbuf, (size_t)size);
            send_all(fd, sbuf, 4);
        }
    }
    return now() - t0;
}

/* Pins this process to the (rank)-th of cores 0 and 1, or of the first two allowed CPUs
 * when those are not both allowed. Returns the CPU, or -1 when left unbound. */
static int bind_rank(void)
{
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        die_errno("sched_getaffinity");
    int cpus[2] = {0, 1};
    if (!CPU_ISSET(0, &allowed) || !CPU_ISSET(1, &allowed)) {
        int n = 0;
        for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
            if (CPU_ISSET(c, &allowed))
                cpus[n++] = c;
        if (n < 2) {
            if (rank == 0)
                fprintf(stderr, "tcp_ref: warning: fewer than 2 CPUs allowed; "
                                "both processes run unbound\n");
            return -1;
        }
        if (rank == 0)
            fprintf(stderr, "tcp_ref: warning: cores 0 and 1 not both allowed; "
                            "binding to CPUs %d and %d\n", cpus[0], cpus[1]);
    }
    CPU_ZERO(&one);
    CPU_SET(cpus[rank], &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0)
        die_errno("sched_setaffinity");
    return cpus[rank];
}

static void set_nodelay(int fd)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
        die_errno("setsockopt TCP_NODELAY");
}

int main(int argc, char **argv)
{
    long sizes[MAX_SIZES];
    int nsizes = 0;
    int benches = LATENCY | BW;
    int json = 0, do_bind = 1;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: tcp_ref [--json] [--no-bind] [--poll] [--sizes BYTES[,BYTES...]] "
                   "[--bench latency,bw] [--iters N] [--window W]\n");
            return 0;
        }
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--no-bind")) { do_bind = 0; continue; }
        if (!strcmp(a, "--poll")) { poll_flag = MSG_DONTWAIT; impl = "c-tcp-poll"; continue; }
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
    if (nsizes == 0)
        for (long s = 1; s <= MAX_DEFAULT_SIZE; s *= 2)
            sizes[nsizes++] = s;
    if (sizes[0] == 0) {
        fprintf(stderr, "tcp_ref: skipping size 0 (a byte stream carries no empty message)\n");
        memmove(sizes, sizes + 1, (size_t)(nsizes - 1) * sizeof sizes[0]);
        if (--nsizes == 0)
            die("--sizes: nothing to measure but size 0");
    }
    long max = sizes[nsizes - 1] > 4 ? sizes[nsizes - 1] : 4;
    if (posix_memalign((void **)&sbuf, 4096, (size_t)max) ||
        posix_memalign((void **)&rbuf, 4096, (size_t)max))
        die("cannot allocate the buffers");
    memset(sbuf, 'a', (size_t)max);
    memset(rbuf, 'b', (size_t)max);
    signal(SIGPIPE, SIG_IGN);

    /* Listen before the fork, so that the child's connect cannot come too early. */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (lfd < 0)
        die_errno("socket");
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) != 0)
        die_errno("bind 127.0.0.1");
    socklen_t alen = sizeof addr;
    if (getsockname(lfd, (struct sockaddr *)&addr, &alen) != 0)
        die_errno("getsockname");
    if (listen(lfd, 1) != 0)
        die_errno("listen");
    fflush(stdout);
    fflush(stderr);

    pid_t child = fork();
    if (child < 0)
        die_errno("fork");
    int fd;
    if (child == 0) {
        rank = 1;
        close(lfd);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
            die_errno("socket");
        set_nodelay(fd);
        if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0)
            die_errno("connect");
    } else {
        fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            die_errno("accept");
        close(lfd);
        set_nodelay(fd);
    }
    int cpu = do_bind ? bind_rank() : -1;
    /* Rank 1 reports its CPU to rank 0 for the header line. */
    int cpus[2] = {cpu, -1};
    if (rank == 1)
        send_all(fd, (const char *)&cpu, sizeof cpu);
    else
        recv_all(fd, (char *)&cpus[1], sizeof cpus[1]);
    if (rank == 0) {
        if (cpus[0] >= 0)
            fprintf(stderr, "# tcp_ref (%s): 127.0.0.1:%d, TCP_NODELAY, %s; "
                    "ranks on CPUs %d and %d\n", impl, ntohs(addr.sin_port),
                    poll_flag ? "busy-polling" : "blocking", cpus[0], cpus[1]);
        else
            fprintf(stderr, "# tcp_ref (%s): 127.0.0.1:%d, TCP_NODELAY, %s; unbound\n",
                    impl, ntohs(addr.sin_port), poll_flag ? "busy-polling" : "blocking");
    }

    if (benches & LATENCY) {
        if (rank == 0 && !json)
            printf("# %s latency (loopback TCP)\n# %-10s %16s\n", impl, "Size",
                   "Latency (us)");
        for (int k = 0; k < nsizes; k++) {
            long iters;
            double us = latency(fd, sizes[k], &iters);
            if (rank == 0) {
                if (json)
                    printf("{\"bench\":\"latency\",\"size\":%ld,\"latency_us\":%.4f,"
                           "\"impl\":\"%s\",\"iters\":%ld}\n", sizes[k], us, impl, iters);
                else
                    printf("%-12ld %16.2f\n", sizes[k], us);
                fflush(stdout);
            }
        }
    }
    if (benches & BW) {
        if (rank == 0 && !json)
            printf("# %s bandwidth (loopback TCP, window %d)\n# %-10s %16s\n", impl,
                   window, "Size", "Bandwidth (MB/s)");
        for (int k = 0; k < nsizes; k++) {
            long skip, iters = iters_for(sizes[k], 100, 20, &skip);
            double t = bw(fd, sizes[k], iters, skip);
            double mbs = (double)sizes[k] * iters * window / t / 1e6;
            if (rank == 0) {
                if (json)
                    printf("{\"bench\":\"bw\",\"size\":%ld,\"bandwidth_mbs\":%.4f,"
                           "\"impl\":\"%s\",\"iters\":%ld,\"window\":%d}\n",
                           sizes[k], mbs, impl, iters, window);
                else
                    printf("%-12ld %16.2f\n", sizes[k], mbs);
                fflush(stdout);
            }
        }
    }
    /* A last barrier, so that neither side closes while the other still reads. */
    barrier(fd);
    close(fd);
    free(sbuf);
    free(rbuf);
    if (rank == 1)
        return 0;
    int status;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR)
            die_errno("waitpid");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "tcp_ref: rank 1 failed (status %d)\n", status);
        return 1;
    }
    return 0;
}
