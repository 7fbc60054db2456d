/* MPI_Comm_spawn's time and where it goes (issue 33's target: at most 0.5x mpirun): a job
 * of one process spawns N copies of this program ITERS times (after one untimed), each from
 * MPI_COMM_SELF, with the intercommunicator made usable (a message each way), then
 * disconnected. Each child times its own MPI_Init (CLOCK_MONOTONIC around the call) and the
 * span from its exec to MPI_Init's return (from /proc/self/stat's start time); child 0
 * sends the largest of each to the parent. The parent prints, per timed spawn, the call's
 * time to return and the children's slowest MPI_Init and exec-to-init-return, then the
 * medians:
 *   median spawn T ms  children MPI_Init I ms  exec-to-init E ms  (N procs, ITERS spawns)
 * usage: comm_spawn_time [ITERS [N]]   (defaults 7 and 4)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_ms(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Milliseconds since this process started (CLOCK_BOOTTIME, as /proc's start time is). */
static double since_exec_ms(void) {
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return -1;
    char buf[2048];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return -1;
    /* Fields after the command: state is field 3; starttime is field 22. */
    int field = 2;
    unsigned long long start = 0;
    for (char *tok = strtok(p + 1, " "); tok; tok = strtok(NULL, " ")) {
        field++;
        if (field == 22) { start = strtoull(tok, NULL, 10); break; }
    }
    double hz = (double)sysconf(_SC_CLK_TCK);
    return now_ms(CLOCK_BOOTTIME) - start * 1e3 / hz;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv) {
    double t0 = now_ms(CLOCK_MONOTONIC);
    MPI_Init(&argc, &argv);
    double init_ms = now_ms(CLOCK_MONOTONIC) - t0;
    double exec_ms = since_exec_ms();
    MPI_Comm parent;
    MPI_Comm_get_parent(&parent);
    if (parent != MPI_COMM_NULL) {
        int rank;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        double mine[2] = {init_ms, exec_ms}, worst[2];
        MPI_Reduce(mine, worst, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) MPI_Send(worst, 2, MPI_DOUBLE, 0, 7, parent);
        int ack = 0;
        if (rank == 0) MPI_Recv(&ack, 1, MPI_INT, 0, 8, parent, MPI_STATUS_IGNORE);
        MPI_Comm_disconnect(&parent);
        MPI_Finalize();
        return 0;
    }
    int iters = argc > 1 ? atoi(argv[1]) : 7;
    int np = argc > 2 ? atoi(argv[2]) : 4;
    if (iters < 1 || iters > 1000 || np < 1 || np > 256) {
        fprintf(stderr, "usage: comm_spawn_time [ITERS [N]]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    double *spawn = calloc(iters, sizeof *spawn), *init = calloc(iters, sizeof *init),
           *exec = calloc(iters, sizeof *exec);
    for (int i = -1; i < iters; i++) {
        MPI_Comm inter;
        double s = now_ms(CLOCK_MONOTONIC);
        MPI_Comm_spawn(argv[0], MPI_ARGV_NULL, np, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter,
                       MPI_ERRCODES_IGNORE);
        double took = now_ms(CLOCK_MONOTONIC) - s;
        double worst[2];
        MPI_Recv(worst, 2, MPI_DOUBLE, 0, 7, inter, MPI_STATUS_IGNORE);
        int ack = 1;
        MPI_Send(&ack, 1, MPI_INT, 0, 8, inter);
        MPI_Comm_disconnect(&inter);
        if (i >= 0) {
            spawn[i] = took;
            init[i] = worst[0];
            exec[i] = worst[1];
            printf("spawn %d: %.1f ms, children MPI_Init %.1f ms, exec-to-init %.1f ms\n", i, took,
                   worst[0], worst[1]);
            fflush(stdout);
        }
    }
    printf("median spawn %.1f ms  children MPI_Init %.1f ms  exec-to-init %.1f ms  (%d procs, %d "
           "spawns)\n",
           median(spawn, iters), median(init, iters), median(exec, iters), np, iters);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
