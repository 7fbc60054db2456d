/* Allocation sessions through PMIx (issue 33), run as 1 process on 2 logical nodes
 * (weft run --nodes 2 -n 2: rank 0 on node 0 does the work, rank 1 waits): rank 0 asks
 * for allocation "A" of 1 node and "B" of 1 node (the runtime's two), fails to extend A
 * (no node free), spawns 2 processes into B (PMIX_ALLOC_ID in the job info: they print
 * the node they run on), releases B, extends A by 1 node, reads A's state with
 * PMIX_QUERY_ALLOC_STATUS, spawns a long sleep into A and releases A: the sleep is
 * terminated with its session. Each step prints one line; a failure prints "FAILED".
 * With the argument "gone SECS": rank 0 asks for allocation "G", spawns `sleep SECS` into
 * it, finds the sleep's pid, prints "parent ends at T pid P" (CLOCK_REALTIME, ns) and every
 * rank exits at once: the
 * session ends with the job, and the sleep with it (benches/scripts/session_gone.sh).
 * Build: cc -O2 -o pmix_alloc pmix_alloc.c $(pkg-config --cflags --libs pmix) */
#include <dirent.h>
#include <pmix.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pmix_proc_t me;

/* The pid of the process whose command line is `sleep SECS` (waiting up to 5 s), or 0. */
static long find_sleep(const char *secs)
{
    for (int tries = 0; tries < 500; tries++) {
        DIR *d = opendir("/proc");
        struct dirent *e;
        while (d && (e = readdir(d))) {
            char path[300], buf[256];
            snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
            FILE *f = fopen(path, "r");
            if (!f)
                continue;
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = 0;
            if (n > 6 && strcmp(buf, "sleep") == 0 && strcmp(buf + 6, secs) == 0) {
                long pid = atol(e->d_name);
                closedir(d);
                return pid;
            }
        }
        if (d)
            closedir(d);
        usleep(10000);
    }
    return 0;
}

/* One allocation request; prints its status and what came back. */
static pmix_status_t alloc(pmix_alloc_directive_t dir, const char *id, uint64_t nodes)
{
    pmix_info_t info[2];
    size_t n = 0;
    PMIX_INFO_LOAD(&info[n], PMIX_ALLOC_ID, id, PMIX_STRING);
    n++;
    if (nodes) {
        PMIX_INFO_LOAD(&info[n], PMIX_ALLOC_NUM_NODES, &nodes, PMIX_UINT64);
        n++;
    }
    pmix_info_t *res = NULL;
    size_t nres = 0;
    pmix_status_t rc = PMIx_Allocation_request(dir, info, n, &res, &nres);
    printf("alloc %d %s %lu: %s", (int)dir, id, (unsigned long)nodes, PMIx_Error_string(rc));
    for (size_t i = 0; i < nres; i++) {
        if (PMIX_CHECK_KEY(&res[i], PMIX_SESSION_ID))
            printf(" session %u", res[i].value.data.uint32);
        else if (PMIX_CHECK_KEY(&res[i], PMIX_ALLOC_NODE_LIST))
            printf(" nodes %s", res[i].value.data.string);
    }
    printf("\n");
    fflush(stdout);
    for (size_t i = 0; i < n; i++)
        PMIX_INFO_DESTRUCT(&info[i]);
    if (res)
        PMIX_INFO_FREE(res, nres);
    return rc;
}

/* Spawns `np` copies of `sh -c script` into allocation `id`. */
static pmix_status_t spawn_into(const char *id, int np, const char *script)
{
    pmix_app_t app;
    PMIX_APP_CONSTRUCT(&app);
    pmix_status_t rc;
    app.cmd = strdup("/bin/sh");
    PMIX_ARGV_APPEND(rc, app.argv, "/bin/sh");
    PMIX_ARGV_APPEND(rc, app.argv, "-c");
    PMIX_ARGV_APPEND(rc, app.argv, script);
    app.maxprocs = np;
    pmix_info_t info;
    PMIX_INFO_LOAD(&info, PMIX_ALLOC_ID, id, PMIX_STRING);
    char child[PMIX_MAX_NSLEN + 1];
    rc = PMIx_Spawn(&info, 1, &app, 1, child);
    printf("spawn into %s: %s\n", id, PMIx_Error_string(rc));
    fflush(stdout);
    PMIX_INFO_DESTRUCT(&info);
    PMIX_APP_DESTRUCT(&app);
    return rc;
}

int main(int argc, char **argv)
{
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "PMIx_Init: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    if (argc > 2 && strcmp(argv[1], "gone") == 0) {
        if (me.rank == 0) {
            char script[64];
            snprintf(script, sizeof script, "exec sleep %s", argv[2]);
            if (alloc(PMIX_ALLOC_NEW, "G", 1) != PMIX_SUCCESS || spawn_into("G", 1, script) != PMIX_SUCCESS)
                printf("FAILED\n");
            long pid = find_sleep(argv[2]);
            struct timespec t;
            clock_gettime(CLOCK_REALTIME, &t);
            printf("parent ends at %lld pid %ld\n", (long long)t.tv_sec * 1000000000LL + t.tv_nsec, pid);
            fflush(stdout);
        }
        _exit(0);
    }
    if (me.rank == 0) {
        if (alloc(PMIX_ALLOC_NEW, "A", 1) != PMIX_SUCCESS ||
            alloc(PMIX_ALLOC_NEW, "B", 1) != PMIX_SUCCESS)
            printf("new FAILED\n");
        if (alloc(PMIX_ALLOC_EXTEND, "A", 1) != PMIX_ERR_OUT_OF_RESOURCE)
            printf("extend without a free node FAILED to fail\n");
        if (spawn_into("B", 2, "echo \"child on node $WEFT_NODE\"") != PMIX_SUCCESS)
            printf("spawn FAILED\n");
        if (spawn_into("nope", 1, "true") == PMIX_SUCCESS)
            printf("spawn into no allocation FAILED to fail\n");
        sleep(1);
        if (alloc(PMIX_ALLOC_RELEASE, "B", 0) != PMIX_SUCCESS)
            printf("release FAILED\n");
        if (alloc(PMIX_ALLOC_EXTEND, "A", 1) != PMIX_SUCCESS)
            printf("extend FAILED\n");
        pmix_query_t *q;
        PMIX_QUERY_CREATE(q, 1);
        PMIX_ARGV_APPEND(rc, q[0].keys, PMIX_QUERY_ALLOC_STATUS);
        PMIX_INFO_CREATE(q[0].qualifiers, 1);
        q[0].nqual = 1;
        PMIX_INFO_LOAD(&q[0].qualifiers[0], PMIX_ALLOC_ID, "A", PMIX_STRING);
        pmix_info_t *res = NULL;
        size_t nres = 0;
        rc = PMIx_Query_info(q, 1, &res, &nres);
        if (rc == PMIX_SUCCESS && nres == 1 && res[0].value.type == PMIX_STRING)
            printf("status of A: %s\n", res[0].value.data.string);
        else
            printf("query FAILED: %s\n", PMIx_Error_string(rc));
        if (res)
            PMIX_INFO_FREE(res, nres);
        PMIX_QUERY_FREE(q, 1);
        if (spawn_into("A", 1, "exec sleep 30") != PMIX_SUCCESS)
            printf("spawn FAILED\n");
        if (alloc(PMIX_ALLOC_RELEASE, "A", 0) != PMIX_SUCCESS)
            printf("release FAILED\n");
        fflush(stdout);
    }
    pmix_proc_t all;
    PMIX_LOAD_PROCID(&all, me.nspace, PMIX_RANK_WILDCARD);
    PMIx_Fence(&all, 1, NULL, 0);
    PMIx_Finalize(NULL, 0);
    return 0;
}
