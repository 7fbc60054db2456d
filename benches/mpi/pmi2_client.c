/* A PMI-2 client on Slurm's PMI-2 library (Debian's libpmi2-0-dev), for the test of the
 * PMI-2 wire protocol under `weft run` (tests/mpi.rs). Build:
 *   cc -O2 -o pmi2_client pmi2_client.c -lpmi2 -lpthread
 *
 * Every rank prints "rank R: WHAT ok" per check, or "rank R: WHAT FAILED: why" (and exits
 * 1 at the end if one failed):
 *   init      PMI2_Init gives a rank and size matching PMI_RANK and PMI_SIZE, app 0;
 *   jobid     PMI2_Job_GetId gives a non-empty id;
 *   mapping   PMI2_Info_GetJobAttr("PMI_process_mapping") is found, "(vector,...)";
 *   nodeattr  local rank 0 of each node puts a node attribute, every rank of the node
 *             gets it (waiting for it);
 *   kvs       every rank puts "key-R", PMI2_KVS_Fence, gets "key-(R+1)" with the value
 *             its owner put; a key nobody put is not found;
 * then PMI2_Finalize.
 *
 * `pmi2_client spawn`: rank 0 publishes the name "weft-svc" (PMI2_Nameserv_publish, as
 * MPI_Publish_name does), then spawns 2 processes of `pmi2_client child A B` with
 * PMI2_Job_Spawn, preputting PARENT_ROOT_PORT_NAME (as MPICH's MPI_Comm_spawn does), and
 * prints "parent: publish rc R" and "parent: spawn rc R jobid J errors E,E"; each child
 * prints "child R/S: spawned F appnum A args A B parent port P" (P: what PMI2_KVS_Get of
 * that key returns) and "child R: lookup rc R port P" (PMI2_Nameserv_lookup of the name
 * published by the other job). */
#include <slurm/pmi2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank = -1, failed = 0;

static void check(int ok, const char *what, const char *why)
{
    if (ok) {
        printf("rank %d: %s ok\n", rank, what);
    } else {
        printf("rank %d: %s FAILED: %s\n", rank, what, why);
        failed = 1;
    }
    fflush(stdout);
}

/* The spawn test (see above). */
static int spawn_test(int argc, char **argv, int spawned, int size, int appnum)
{
    char val[PMI2_MAX_VALLEN], jobid[256];
    int len = 0;
    if (argc > 1 && !strcmp(argv[1], "child")) {
        val[0] = 0;
        int rc = PMI2_KVS_Get(NULL, PMI2_ID_NULL, "PARENT_ROOT_PORT_NAME", val, sizeof val, &len);
        printf("child %d/%d: spawned %d appnum %d args %s %s parent port %s\n", rank, size,
               spawned, appnum, argc > 2 ? argv[2] : "-", argc > 3 ? argv[3] : "-",
               rc == PMI2_SUCCESS ? val : "(not found)");
        val[0] = 0;
        rc = PMI2_Nameserv_lookup("weft-svc", NULL, val, sizeof val);
        printf("child %d: lookup rc %d port %s\n", rank, rc, rc == PMI2_SUCCESS ? val : "-");
        fflush(stdout);
        return PMI2_Finalize() != PMI2_SUCCESS;
    }
    if (rank == 0) {
        const char *cmds[1] = {argv[0]};
        const char *args[3] = {"child", "a b", "c=d"};
        const char **argvs[1] = {args};
        int argcs[1] = {3}, maxprocs[1] = {2}, infos[1] = {0}, errors[2] = {-1, -1};
        struct MPID_Info port = {0};
        port.key = "PARENT_ROOT_PORT_NAME";
        port.value = "tag#0$port-of-parent$";
        const struct MPID_Info *preput[1] = {&port};
        int rc = PMI2_Nameserv_publish("weft-svc", NULL, "port;by=name");
        printf("parent: publish rc %d\n", rc);
        jobid[0] = 0;
        rc = PMI2_Job_Spawn(1, cmds, argcs, argvs, maxprocs, infos, NULL, 1, preput, jobid,
                                sizeof jobid, errors);
        printf("parent: spawn rc %d jobid %s errors %d,%d\n", rc, jobid[0] ? jobid : "-",
               errors[0], errors[1]);
        fflush(stdout);
    }
    return PMI2_Finalize() != PMI2_SUCCESS;
}

int main(int argc, char **argv)
{
    int spawned = 0, size = 0, appnum = -1, found = 0, len = 0;
    char why[2048], val[PMI2_MAX_VALLEN], key[PMI2_MAX_KEYLEN], jobid[256];
    int rc = PMI2_Init(&spawned, &size, &rank, &appnum);
    if (argc > 1)
        return rc == PMI2_SUCCESS ? spawn_test(argc, argv, spawned, size, appnum) : 1;
    const char *er = getenv("PMI_RANK"), *es = getenv("PMI_SIZE");
    snprintf(why, sizeof why, "rc %d rank %d size %d appnum %d (PMI_RANK %s PMI_SIZE %s)", rc,
             rank, size, appnum, er ? er : "-", es ? es : "-");
    check(rc == PMI2_SUCCESS && er && es && rank == atoi(er) && size == atoi(es) && appnum == 0,
          "init", why);
    if (rc != PMI2_SUCCESS)
        return 1;

    rc = PMI2_Job_GetId(jobid, sizeof jobid);
    snprintf(why, sizeof why, "rc %d jobid %s", rc, jobid);
    check(rc == PMI2_SUCCESS && jobid[0], "jobid", why);

    rc = PMI2_Info_GetJobAttr("PMI_process_mapping", val, sizeof val, &found);
    snprintf(why, sizeof why, "rc %d found %d value %s", rc, found, found ? val : "-");
    check(rc == PMI2_SUCCESS && found && !strncmp(val, "(vector,", 8), "mapping", why);
    if (found)
        printf("rank %d: mapping %s\n", rank, val);

    /* The node's first process (the lowest rank of its node, given by the mapping's
     * placement: weft run gives it PMI local rank order) puts, the others wait. */
    const char *lr = getenv("WEFT_LOCAL_RANK");
    if (lr && atoi(lr) == 0) {
        snprintf(val, sizeof val, "attr-from-%d", rank);
        rc = PMI2_Info_PutNodeAttr("weft-test-attr", val);
        snprintf(why, sizeof why, "put rc %d", rc);
        if (rc != PMI2_SUCCESS)
            check(0, "nodeattr", why);
    }
    val[0] = 0;
    rc = PMI2_Info_GetNodeAttr("weft-test-attr", val, sizeof val, &found, 1);
    snprintf(why, sizeof why, "rc %d found %d value %s", rc, found, val);
    check(rc == PMI2_SUCCESS && found && !strncmp(val, "attr-from-", 10), "nodeattr", why);

    snprintf(key, sizeof key, "key-%d", rank);
    snprintf(val, sizeof val, "value;of=%d", rank);
    rc = PMI2_KVS_Put(key, val);
    int frc = PMI2_KVS_Fence();
    int next = (rank + 1) % size;
    char want[64];
    snprintf(key, sizeof key, "key-%d", next);
    snprintf(want, sizeof want, "value;of=%d", next);
    val[0] = 0;
    int grc = PMI2_KVS_Get(jobid, PMI2_ID_NULL, key, val, sizeof val, &len);
    snprintf(why, sizeof why, "put rc %d fence rc %d get rc %d value %s (want %s)", rc, frc, grc,
             val, want);
    int ok = rc == PMI2_SUCCESS && frc == PMI2_SUCCESS && grc == PMI2_SUCCESS && !strcmp(val, want);
    grc = PMI2_KVS_Get(jobid, PMI2_ID_NULL, "nobody-put-this", val, sizeof val, &len);
    if (ok && grc == PMI2_SUCCESS) {
        snprintf(why, sizeof why, "a key nobody put was found: %s", val);
        ok = 0;
    }
    check(ok, "kvs", why);

    rc = PMI2_Finalize();
    snprintf(why, sizeof why, "rc %d", rc);
    check(rc == PMI2_SUCCESS, "finalize", why);
    return failed;
}
