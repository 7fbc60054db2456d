/* A PMIx tool that attaches to a running launcher and reads its jobs: what a parallel
 * debugger or a monitoring tool does first. Used by the tests (cli/tests/tools.rs) and
 * by benches/scripts/tool_attach.sh.
 *
 *   pmix_tool (--pid PID | --uri URI | --uri file:PATH | --system) [--local] [--repeat N]
 *             [--nspace NS] [--release]
 *
 * Connects (PMIx_tool_init), asks for the namespaces (PMIX_QUERY_NAMESPACES), then for
 * the first namespace's (or NS's) process table (PMIX_QUERY_PROC_TABLE, or the node's with
 * --local), and prints:
 *
 *   namespaces NS1,NS2
 *   proc NS RANK HOST EXE PID STATE
 *   ...
 *   attach_us T      (tool init to the namespaces' answer)
 *   ptable_us T      (the process table query; with --repeat N, the best of N)
 *
 * With --release it then releases that namespace's processes held in PMIx_Init
 * (PMIX_DEBUGGER_RELEASE to all of them) and prints "release_sent_us T" (CLOCK_MONOTONIC,
 * taken just before the event is sent).
 *
 * Exit status 0 on success, 1 with a message naming what failed otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <pmix_tool.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int query(const char *key, const char *nspace, pmix_info_t **res, size_t *nres)
{
    pmix_query_t *q;
    pmix_status_t rc;
    PMIX_QUERY_CREATE(q, 1);
    PMIX_ARGV_APPEND(rc, q[0].keys, key);
    if (NULL != nspace) {
        PMIX_QUERY_QUALIFIERS_CREATE(&q[0], 1);
        PMIX_INFO_LOAD(&q[0].qualifiers[0], PMIX_NSPACE, nspace, PMIX_STRING);
    }
    rc = PMIx_Query_info(q, 1, res, nres);
    PMIX_QUERY_FREE(q, 1);
    return rc;
}

int main(int argc, char **argv)
{
    pmix_info_t info[3];
    size_t ninfo = 0, nres = 0, i;
    pmix_info_t *res = NULL;
    pmix_proc_t me;
    pmix_status_t rc;
    int local = 0, repeat = 1, release = 0;
    pid_t pid;
    char nspace[PMIX_MAX_NSLEN + 1];
    const char *want = NULL;

    for (int a = 1; a < argc; a++) {
        if (0 == strcmp(argv[a], "--pid") && a + 1 < argc) {
            pid = (pid_t) atoi(argv[++a]);
            PMIX_INFO_LOAD(&info[ninfo], PMIX_SERVER_PIDINFO, &pid, PMIX_PID);
            ninfo++;
        } else if (0 == strcmp(argv[a], "--uri") && a + 1 < argc) {
            PMIX_INFO_LOAD(&info[ninfo], PMIX_SERVER_URI, argv[++a], PMIX_STRING);
            ninfo++;
        } else if (0 == strcmp(argv[a], "--system")) {
            PMIX_INFO_LOAD(&info[ninfo], PMIX_CONNECT_TO_SYSTEM, NULL, PMIX_BOOL);
            ninfo++;
        } else if (0 == strcmp(argv[a], "--local")) {
            local = 1;
        } else if (0 == strcmp(argv[a], "--nspace") && a + 1 < argc) {
            want = argv[++a];
        } else if (0 == strcmp(argv[a], "--release")) {
            release = 1;
        } else if (0 == strcmp(argv[a], "--repeat") && a + 1 < argc) {
            repeat = atoi(argv[++a]);
        } else {
            fprintf(stderr,
                    "usage: %s (--pid PID | --uri URI | --system) [--local] [--repeat N]"
                    " [--nspace NS] [--release]\n",
                    argv[0]);
            return 2;
        }
    }
    if (0 == ninfo) {
        fprintf(stderr, "pmix_tool: say which server (--pid, --uri or --system)\n");
        return 2;
    }

    double t0 = now_us();
    rc = PMIx_tool_init(&me, info, ninfo);
    if (PMIX_SUCCESS != rc) {
        fprintf(stderr, "pmix_tool: PMIx_tool_init: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    rc = query(PMIX_QUERY_NAMESPACES, NULL, &res, &nres);
    double t1 = now_us();
    if (PMIX_SUCCESS != rc || 1 != nres || PMIX_STRING != res[0].value.type) {
        fprintf(stderr, "pmix_tool: namespaces query: %s (%zu answers)\n", PMIx_Error_string(rc),
                nres);
        PMIx_tool_finalize();
        return 1;
    }
    printf("namespaces %s\n", res[0].value.data.string);
    /* the first namespace */
    memset(nspace, 0, sizeof(nspace));
    strncpy(nspace, res[0].value.data.string, PMIX_MAX_NSLEN);
    char *comma = strchr(nspace, ',');
    if (NULL != comma) {
        *comma = '\0';
    }
    if (NULL != want) {
        memset(nspace, 0, sizeof(nspace));
        strncpy(nspace, want, PMIX_MAX_NSLEN);
    }
    PMIX_INFO_FREE(res, nres);

    double best = -1;
    for (int r = 0; r < repeat; r++) {
        res = NULL;
        nres = 0;
        double s = now_us();
        rc = query(local ? PMIX_QUERY_LOCAL_PROC_TABLE : PMIX_QUERY_PROC_TABLE, nspace, &res, &nres);
        double e = now_us() - s;
        if (best < 0 || e < best) {
            best = e;
        }
        if (PMIX_SUCCESS != rc || 1 != nres || PMIX_DATA_ARRAY != res[0].value.type
            || NULL == res[0].value.data.darray
            || PMIX_PROC_INFO != res[0].value.data.darray->type) {
            fprintf(stderr, "pmix_tool: process table of %s: %s (%zu answers)\n", nspace,
                    PMIx_Error_string(rc), nres);
            PMIx_tool_finalize();
            return 1;
        }
        if (r + 1 < repeat) {
            PMIX_INFO_FREE(res, nres);
        }
    }
    pmix_proc_info_t *procs = (pmix_proc_info_t *) res[0].value.data.darray->array;
    for (i = 0; i < res[0].value.data.darray->size; i++) {
        printf("proc %s %u %s %s %d %s\n", procs[i].proc.nspace, procs[i].proc.rank,
               procs[i].hostname, procs[i].executable_name, (int) procs[i].pid,
               PMIx_Proc_state_string(procs[i].state));
    }
    PMIX_INFO_FREE(res, nres);
    printf("attach_us %.0f\n", t1 - t0);
    printf("ptable_us %.0f\n", best);
    fflush(stdout);
    if (release) {
        pmix_info_t ev[2];
        pmix_proc_t all;
        PMIX_LOAD_PROCID(&all, nspace, PMIX_RANK_WILDCARD);
        PMIX_INFO_LOAD(&ev[0], PMIX_EVENT_CUSTOM_RANGE, &all, PMIX_PROC);
        PMIX_INFO_LOAD(&ev[1], PMIX_EVENT_NON_DEFAULT, NULL, PMIX_BOOL);
        double s = now_us();
        rc = PMIx_Notify_event(PMIX_DEBUGGER_RELEASE, &me, PMIX_RANGE_CUSTOM, ev, 2, NULL, NULL);
        if (PMIX_SUCCESS != rc && PMIX_OPERATION_SUCCEEDED != rc) {
            fprintf(stderr, "pmix_tool: release of %s: %s\n", nspace, PMIx_Error_string(rc));
            PMIx_tool_finalize();
            return 1;
        }
        printf("release_sent_us %.0f\n", s);
        fflush(stdout);
    }
    PMIx_tool_finalize();
    return 0;
}
