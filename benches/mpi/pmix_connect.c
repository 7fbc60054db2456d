/* PMIx_Connect across jobs under a PMIx server (Weft's test of issue 33).
 *
 * Run as `pmix_connect [NCHILD]` (default 2): rank 0 of the first job spawns NCHILD copies
 * of this program (PARENT_NS set to its namespace) and publishes the child job's namespace
 * ("conn-child-ns"); the other ranks look it up, waiting. A child prints its job's
 * PMIX_PARENT_ID ("parent NSPACE:RANK"). Every process puts "who"
 * ("nspace:rank"), commits (rank 0 publishes the name twice and prints the second status), then connects its job with the other (both namespaces whole),
 * reads "who" of the other job's rank 0, and disconnects. Each step prints one line; any
 * failure prints "FAILED" and exits 1. `pmix_connect N die`: the children exit (code 3)
 * half a second after PMIx_Init instead (the parents wait in their connect by then), so
 * the parents' connect must fail, neither hang nor complete without them.
 */
#define _GNU_SOURCE
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pmix_proc_t me;

static void fail(const char *what, pmix_status_t rc)
{
    printf("%s:%u FAILED %s: %s\n", me.nspace, me.rank, what, PMIx_Error_string(rc));
    fflush(stdout);
    exit(1);
}

int main(int argc, char **argv)
{
    pmix_status_t rc;
    char other[PMIX_MAX_NSLEN + 1] = {0};
    const char *parent = getenv("PARENT_NS");
    int nchild = argc > 1 ? atoi(argv[1]) : 2;
    int die = argc > 2 && 0 == strcmp(argv[2], "die");

    if (PMIX_SUCCESS != (rc = PMIx_Init(&me, NULL, 0))) {
        fail("PMIx_Init", rc);
    }
    char who[PMIX_MAX_NSLEN + 32];
    snprintf(who, sizeof who, "%s:%u", me.nspace, me.rank);
    pmix_value_t v;
    v.type = PMIX_STRING;
    v.data.string = who;
    if (PMIX_SUCCESS != (rc = PMIx_Put(PMIX_GLOBAL, "who", &v)) ||
        PMIX_SUCCESS != (rc = PMIx_Commit())) {
        fail("put", rc);
    }
    if (parent != NULL && getenv("CHILD_DIES") != NULL) {
        /* Late enough that the parents wait in their connect already. */
        usleep(500000);
        printf("%s:%u exits before connecting\n", me.nspace, me.rank);
        fflush(stdout);
        exit(3);
    }
    if (parent != NULL) {
        snprintf(other, sizeof other, "%s", parent);
        /* The job information names the process that spawned this job. */
        pmix_proc_t wild;
        pmix_value_t *pv = NULL;
        PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
        if (PMIX_SUCCESS != (rc = PMIx_Get(&wild, PMIX_PARENT_ID, NULL, 0, &pv))) {
            fail("get PMIX_PARENT_ID", rc);
        }
        if (pv->type != PMIX_PROC) {
            fail("PMIX_PARENT_ID's type", PMIX_ERR_TYPE_MISMATCH);
        }
        printf("%s:%u parent %s:%u\n", me.nspace, me.rank, pv->data.proc->nspace,
               pv->data.proc->rank);
        PMIX_VALUE_RELEASE(pv);
    } else if (me.rank == 0) {
        pmix_app_t app;
        PMIX_APP_CONSTRUCT(&app);
        app.cmd = strdup(argv[0]);
        app.argv = calloc(2, sizeof(char *));
        app.argv[0] = strdup(argv[0]);
        app.env = calloc(3, sizeof(char *));
        if (asprintf(&app.env[0], "PARENT_NS=%s", me.nspace) < 0) {
            exit(1);
        }
        if (die) {
            app.env[1] = strdup("CHILD_DIES=1");
        }
        app.maxprocs = nchild;
        pmix_nspace_t child;
        if (PMIX_SUCCESS != (rc = PMIx_Spawn(NULL, 0, &app, 1, child))) {
            fail("PMIx_Spawn", rc);
        }
        snprintf(other, sizeof other, "%s", child);
        printf("%s:%u spawned %s\n", me.nspace, me.rank, other);
        pmix_info_t pub;
        PMIX_INFO_LOAD(&pub, "conn-child-ns", other, PMIX_STRING);
        if (PMIX_SUCCESS != (rc = PMIx_Publish(&pub, 1))) {
            fail("PMIx_Publish", rc);
        }
        /* Published already: Open MPI expects PMIX_EXISTS (MPI_ERR_FILE_EXISTS). */
        rc = PMIx_Publish(&pub, 1);
        printf("%s:%u published again: %d\n", me.nspace, me.rank, rc);
    } else {
        pmix_pdata_t pd;
        PMIX_PDATA_CONSTRUCT(&pd);
        PMIX_LOAD_KEY(pd.key, "conn-child-ns");
        pmix_info_t wait;
        bool yes = true;
        PMIX_INFO_LOAD(&wait, PMIX_WAIT, &yes, PMIX_BOOL);
        if (PMIX_SUCCESS != (rc = PMIx_Lookup(&pd, 1, &wait, 1))) {
            fail("PMIx_Lookup", rc);
        }
        snprintf(other, sizeof other, "%s", pd.value.data.string);
    }
    pmix_proc_t procs[2];
    PMIX_LOAD_PROCID(&procs[0], parent != NULL ? other : me.nspace, PMIX_RANK_WILDCARD);
    PMIX_LOAD_PROCID(&procs[1], parent != NULL ? me.nspace : other, PMIX_RANK_WILDCARD);
    if (PMIX_SUCCESS != (rc = PMIx_Connect(procs, 2, NULL, 0))) {
        fail("PMIx_Connect", rc);
    }
    printf("%s:%u connected with %s\n", me.nspace, me.rank, other);
    pmix_proc_t peer;
    PMIX_LOAD_PROCID(&peer, other, 0);
    pmix_value_t *got = NULL;
    if (PMIX_SUCCESS != (rc = PMIx_Get(&peer, "who", NULL, 0, &got))) {
        fail("PMIx_Get of the other job's rank 0", rc);
    }
    printf("%s:%u read who=%s\n", me.nspace, me.rank, got->data.string);
    PMIX_VALUE_RELEASE(got);
    if (PMIX_SUCCESS != (rc = PMIx_Disconnect(procs, 2, NULL, 0))) {
        fail("PMIx_Disconnect", rc);
    }
    printf("%s:%u disconnected\n", me.nspace, me.rank);
    fflush(stdout);
    PMIx_Finalize(NULL, 0);
    return 0;
}
