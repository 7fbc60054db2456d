/* PMIx_Spawn of N processes, timed from the call to its return (the reference for
 * `weft bench spawn`): run as `mpirun --oversubscribe -n 1 ./spawn_pmix [ITERS [N [DELAY]]]`.
 * Children (argv[1] == "child") initialize and finalize, after sleeping DELAY ms (0 by
 * default: at once; a delay longer than a spawn keeps the children of one spawn from
 * competing for the cores with the spawns that follow). Prints the median, minimum and
 * maximum of ITERS timed spawns after 2 untimed, in microseconds.
 * Build: cc -O2 -o spawn_pmix spawn_pmix.c $(pkg-config --cflags --libs pmix) */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    pmix_proc_t me;
    if (argc > 2 && strcmp(argv[1], "child") == 0) usleep(1000 * atoi(argv[2]));
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "PMIx_Init: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "child") == 0) {
        PMIx_Finalize(NULL, 0);
        return 0;
    }
    int iters = argc > 1 ? atoi(argv[1]) : 20, np = argc > 2 ? atoi(argv[2]) : 4;
    const char *delay = argc > 3 ? argv[3] : "0";
    if (iters < 1 || np < 1 || atoi(delay) < 0) {
        fprintf(stderr, "usage: spawn_pmix [ITERS [N [DELAY_MS]]]\n");
        return 2;
    }
    double *t = calloc(iters, sizeof *t);
    pmix_app_t app;
    PMIX_APP_CONSTRUCT(&app);
    app.cmd = strdup(argv[0]);
    app.argv = calloc(4, sizeof(char *));
    app.argv[0] = strdup(argv[0]);
    app.argv[1] = strdup("child");
    app.argv[2] = strdup(delay);
    app.maxprocs = np;
    char nspace[PMIX_MAX_NSLEN + 1];
    for (int i = 0; i < iters + 2; i++) {
        double t0 = now_us();
        rc = PMIx_Spawn(NULL, 0, &app, 1, nspace);
        double t1 = now_us();
        if (rc != PMIX_SUCCESS) {
            fprintf(stderr, "PMIx_Spawn: %s\n", PMIx_Error_string(rc));
            return 1;
        }
        if (i >= 2) t[i - 2] = t1 - t0;
    }
    qsort(t, iters, sizeof *t, cmp);
    double med = iters % 2 ? t[iters / 2] : (t[iters / 2 - 1] + t[iters / 2]) / 2;
    printf("PMIx_Spawn of %d: median %.1f us, min %.1f, max %.1f (%d spawns)\n", np, med,
           t[0], t[iters - 1], iters);
    PMIx_Finalize(NULL, 0);
    return 0;
}
