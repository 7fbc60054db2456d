/* PMIx_Job_control served by the host (issue 33), with 2 ranks: rank 1 puts its pid and
 * waits for SIGUSR1; rank 0 signals it (PMIX_JOB_CTRL_SIGNAL), then pauses it
 * (PMIX_JOB_CTRL_PAUSE: its state becomes T) and resumes it (PMIX_JOB_CTRL_RESUME), reading
 * its state from /proc (logical nodes share the machine). Each step prints a line:
 * "rank 1: got SIGUSR1", "rank 0: rank 1 paused", "rank 0: rank 1 resumed", or a line with
 * "FAILED". Finally rank 0 asks to terminate its own job (PMIX_JOB_CTRL_TERMINATE, no
 * target) and every rank sleeps: the launcher ends the job (weft run exits 143).
 * Build: cc -O2 -o pmix_jctrl pmix_jctrl.c $(pkg-config --cflags --libs pmix) */
#include <pmix.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pmix_proc_t me;
static volatile sig_atomic_t got = 0;

static void on_usr1(int s) { (void)s; got = 1; }

/* The state letter of process `pid` (from /proc/PID/stat), or '?'. */
static char state_of(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] && p[2] ? p[2] : '?';
}

/* Asks for one job control action on `target` (NULL: the own job). */
static pmix_status_t control(const pmix_proc_t *target, const char *key, int value)
{
    pmix_info_t info;
    bool on = true;
    if (strcmp(key, PMIX_JOB_CTRL_SIGNAL) == 0)
        PMIX_INFO_LOAD(&info, key, &value, PMIX_INT);
    else
        PMIX_INFO_LOAD(&info, key, &on, PMIX_BOOL);
    pmix_info_t *results = NULL;
    size_t nresults = 0;
    pmix_status_t rc = PMIx_Job_control(target, target ? 1 : 0, &info, 1, &results, &nresults);
    PMIX_INFO_DESTRUCT(&info);
    if (results)
        PMIX_INFO_FREE(results, nresults);
    return rc;
}

/* Waits up to 5 s for rank 1 (`pid`) to be (`want`) or not be (`!want`) stopped. */
static int wait_state(pid_t pid, int want)
{
    for (int i = 0; i < 500; i++) {
        if ((state_of(pid) == 'T') == want)
            return 1;
        usleep(10000);
    }
    return 0;
}

int main(void)
{
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "PMIx_Init: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    signal(SIGUSR1, on_usr1);
    pmix_value_t v;
    v.type = PMIX_INT32;
    v.data.int32 = (int32_t)getpid();
    PMIx_Put(PMIX_GLOBAL, "jctrl.pid", &v);
    PMIx_Commit();
    pmix_proc_t all;
    PMIX_LOAD_PROCID(&all, me.nspace, PMIX_RANK_WILDCARD);
    bool collect = true;
    pmix_info_t fi;
    PMIX_INFO_LOAD(&fi, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    if ((rc = PMIx_Fence(&all, 1, &fi, 1)) != PMIX_SUCCESS) {
        printf("rank %u: fence FAILED: %s\n", me.rank, PMIx_Error_string(rc));
        return 1;
    }
    if (me.rank == 1) {
        for (int i = 0; i < 1000 && !got; i++)
            usleep(10000);
        printf("rank 1: %s\n", got ? "got SIGUSR1" : "SIGUSR1 FAILED to arrive");
        fflush(stdout);
    } else if (me.rank == 0) {
        pmix_proc_t one;
        PMIX_LOAD_PROCID(&one, me.nspace, 1);
        pmix_value_t *pv = NULL;
        if ((rc = PMIx_Get(&one, "jctrl.pid", NULL, 0, &pv)) != PMIX_SUCCESS) {
            printf("rank 0: get pid FAILED: %s\n", PMIx_Error_string(rc));
            return 1;
        }
        pid_t pid = pv->data.int32;
        PMIX_VALUE_RELEASE(pv);
        if ((rc = control(&one, PMIX_JOB_CTRL_SIGNAL, SIGUSR1)) != PMIX_SUCCESS)
            printf("rank 0: signal FAILED: %s\n", PMIx_Error_string(rc));
        if ((rc = control(&one, PMIX_JOB_CTRL_PAUSE, 0)) != PMIX_SUCCESS)
            printf("rank 0: pause FAILED: %s\n", PMIx_Error_string(rc));
        printf("rank 0: rank 1 %s\n", wait_state(pid, 1) ? "paused" : "pause FAILED");
        fflush(stdout);
        if ((rc = control(&one, PMIX_JOB_CTRL_RESUME, 0)) != PMIX_SUCCESS)
            printf("rank 0: resume FAILED: %s\n", PMIx_Error_string(rc));
        printf("rank 0: rank 1 %s\n", wait_state(pid, 0) ? "resumed" : "resume FAILED");
        fflush(stdout);
    }
    if ((rc = PMIx_Fence(&all, 1, NULL, 0)) != PMIX_SUCCESS) {
        printf("rank %u: fence FAILED: %s\n", me.rank, PMIx_Error_string(rc));
        return 1;
    }
    if (me.rank == 0 && (rc = control(NULL, PMIX_JOB_CTRL_TERMINATE, 0)) != PMIX_SUCCESS)
        printf("rank 0: terminate FAILED: %s\n", PMIx_Error_string(rc));
    fflush(stdout);
    sleep(30);
    printf("rank %u: still there: terminate FAILED\n", me.rank);
    return 1;
}
