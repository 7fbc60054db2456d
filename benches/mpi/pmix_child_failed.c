/* A spawned job's failure reaches its parent job as a PMIx event (issue 33): every rank of
 * the job registers a handler for PMIX_ERR_PROC_ABORTED; rank 0 spawns 2 copies of this
 * program ("child"), whose rank 1 exits with code 3 without finalizing while rank 0 lives
 * on. Each parent rank prints "rank R: event PROC-ABORTED affected NSPACE:RANK" for every
 * event it gets and "rank R: child failure seen" once it saw the child's rank 1, or
 * "rank R: child failure NOT seen" after 5 s (and exits 1). Then the other ranks finalize
 * and end while rank 0 waits a second and prints "rank 0: events about this job: N" (an
 * orderly end is not a failure: N must be 0).
 * Build: cc -O2 -o pmix_child_failed pmix_child_failed.c $(pkg-config --cflags --libs pmix) */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pmix_proc_t me;
static volatile int seen = 0, own = 0;
static char child[PMIX_MAX_NSLEN + 1];

static void handler(size_t id, pmix_status_t st, const pmix_proc_t *src, pmix_info_t info[],
                    size_t ninfo, pmix_info_t *results, size_t nresults,
                    pmix_event_notification_cbfunc_fn_t cb, void *cbdata)
{
    (void)id; (void)src; (void)results; (void)nresults;
    for (size_t i = 0; i < ninfo; i++) {
        if (PMIX_CHECK_KEY(&info[i], PMIX_EVENT_AFFECTED_PROC)) {
            const pmix_proc_t *p = info[i].value.data.proc;
            printf("rank %u: event %s affected %s:%u\n", me.rank, PMIx_Error_string(st),
                   p->nspace, p->rank);
            fflush(stdout);
            /* The child job's name ends in ".2" (the first job a runtime spawns). */
            size_t n = strlen(p->nspace);
            if (p->rank == 1 && n > 2 && strcmp(p->nspace + n - 2, ".2") == 0)
                seen = 1;
            if (PMIX_CHECK_NSPACE(p->nspace, me.nspace))
                own++;
        }
    }
    if (cb)
        cb(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
}

int main(int argc, char **argv)
{
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "PMIx_Init: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "child") == 0) {
        if (me.rank == 1)
            exit(3);
        sleep(2);
        PMIx_Finalize(NULL, 0);
        return 0;
    }
    pmix_status_t code = PMIX_ERR_PROC_ABORTED;
    rc = PMIx_Register_event_handler(&code, 1, NULL, 0, handler, NULL, NULL);
    if (rc < 0) {
        fprintf(stderr, "PMIx_Register_event_handler: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    /* Every rank has its handler before the child starts. */
    PMIx_Fence(NULL, 0, NULL, 0);
    if (me.rank == 0) {
        pmix_app_t app;
        PMIX_APP_CONSTRUCT(&app);
        app.cmd = strdup(argv[0]);
        app.argv = calloc(3, sizeof(char *));
        app.argv[0] = strdup(argv[0]);
        app.argv[1] = strdup("child");
        app.maxprocs = 2;
        rc = PMIx_Spawn(NULL, 0, &app, 1, child);
        printf("rank 0: spawned %s: %s\n", child, PMIx_Error_string(rc));
        fflush(stdout);
    }
    for (int i = 0; i < 500 && !seen; i++)
        usleep(10000);
    printf("rank %u: child failure %s\n", me.rank, seen ? "seen" : "NOT seen");
    fflush(stdout);
    /* No rank leaves before every rank saw it. */
    PMIx_Fence(NULL, 0, NULL, 0);
    if (me.rank == 0) {
        /* The other ranks finalize and end now: an orderly end is no failure, so no
         * event may name them. */
        sleep(1);
        printf("rank 0: events about this job: %d\n", own);
        fflush(stdout);
    }
    PMIx_Finalize(NULL, 0);
    return seen ? 0 : 1;
}
