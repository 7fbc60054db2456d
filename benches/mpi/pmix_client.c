/* A plain PMIx client (no MPI), for the tests of PMIx programs under `weft run`
 * (tests/mpi.rs) and the PMIx figures of benches/scripts/pmix_compare.sh. Build:
 *   cc -O2 -o pmix_client pmix_client.c $(pkg-config --cflags --libs pmix)
 *
 * `pmix_client test`: every rank checks, printing "rank R: WHAT ok" per check or
 * "rank R: WHAT FAILED: why" (and exits 1 at the end if one failed):
 *   job        the job keys Open MPI reads at init (job, universe and max size, nodes,
 *              local size and peers, local and node rank, app number, node id, host name,
 *              tmpdir and nsdir), each present and consistent;
 *   psets      PMIx_Query_info of PMIX_QUERY_PSET_NAMES names "weft://world", and of
 *              PMIX_QUERY_PSET_MEMBERSHIP of it gives every rank;
 *   late       rank 0 commits a key 300 ms late, with no fence; every rank gets it (its
 *              get waits for the commit);
 *   collect    put, commit, fence collecting data; every rank's key read back;
 *   sparse     new puts, commit, fence without collecting; every rank's key read back
 *              (from another node: the direct modex);
 *   again      new puts after those fences, a collecting fence; read back;
 *   group      PMIx_Group_construct of every rank asking for a context id: it succeeds,
 *              "rank R: group ctxid C" printed (the same C everywhere), a second group
 *              gets another id, PMIx_Group_destruct of both succeeds;
 *   missing    a key nobody put, with a 2 s PMIX_TIMEOUT: PMIX_ERR_NOT_FOUND (a process on
 *              another node, whose data came without it) or PMIX_ERR_TIMEOUT after the
 *              2 s (a process of this node, which might still put it), never a hang;
 * then a last fence and PMIx_Finalize.
 *
 * `pmix_client osub`: every rank prints "rank R: oversubscribed yes|no" (whether the job
 * info has PMIX_NODE_OVERSUBSCRIBED) and "rank R: OMPI_MCA_mpi_oversubscribe VALUE" (the
 * variable Open MPI 4.1 reads instead, or "unset").
 *
 * `pmix_client bench [ITERS] [KEYS] [BYTES]` (defaults 20, 32, 1024): every rank puts KEYS
 * keys of BYTES bytes, commits and joins a collecting fence, ITERS times (after one
 * warm-up fence); then times a PMIx_Get of every other rank's first key (the mean). Rank 0
 * prints one
 * JSON line: {"bench":"pmix_fence","impl":IMPL,"procs":N,"keys":K,"key_bytes":B,
 * "fence_us":mean,"get_us":...}; `pmix_client bench ITERS KEYS BYTES IMPL` names it (default "pmix"). */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pmix_proc_t me;
static int failed = 0;

static void check(int ok, const char *what, const char *why)
{
    if (ok) {
        printf("rank %u: %s ok\n", me.rank, what);
    } else {
        printf("rank %u: %s FAILED: %s\n", me.rank, what, why);
        failed = 1;
    }
    fflush(stdout);
}

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* A job-level (rank = wildcard) or own value as an unsigned integer; -1 if absent. */
static long get_uint(pmix_rank_t rank, const char *key)
{
    pmix_proc_t p;
    pmix_value_t *v = NULL;
    PMIX_LOAD_PROCID(&p, me.nspace, rank);
    if (PMIx_Get(&p, key, NULL, 0, &v) != PMIX_SUCCESS || v == NULL)
        return -1;
    long out = -1;
    switch (v->type) {
    case PMIX_UINT32: out = v->data.uint32; break;
    case PMIX_UINT16: out = v->data.uint16; break;
    case PMIX_PROC_RANK: out = v->data.rank; break;
    case PMIX_INT: out = v->data.integer; break;
    case PMIX_UINT64: out = (long)v->data.uint64; break;
    default: break;
    }
    PMIX_VALUE_RELEASE(v);
    return out;
}

/* A string value (malloc'd) or NULL. */
static char *get_str(pmix_rank_t rank, const char *key)
{
    pmix_proc_t p;
    pmix_value_t *v = NULL;
    PMIX_LOAD_PROCID(&p, me.nspace, rank);
    if (PMIx_Get(&p, key, NULL, 0, &v) != PMIX_SUCCESS || v == NULL)
        return NULL;
    char *out = (v->type == PMIX_STRING && v->data.string) ? strdup(v->data.string) : NULL;
    PMIX_VALUE_RELEASE(v);
    return out;
}

static void put_str(const char *key, const char *val)
{
    pmix_value_t v;
    PMIX_VALUE_LOAD(&v, val, PMIX_STRING);
    if (PMIx_Put(PMIX_GLOBAL, key, &v) != PMIX_SUCCESS)
        check(0, "put", key);
    PMIX_VALUE_DESTRUCT(&v);
}

static pmix_status_t fence(int collect)
{
    pmix_proc_t all;
    pmix_info_t info;
    bool flag = collect ? true : false;
    PMIX_LOAD_PROCID(&all, me.nspace, PMIX_RANK_WILDCARD);
    PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &flag, PMIX_BOOL);
    pmix_status_t rc = PMIx_Fence(&all, 1, &info, 1);
    PMIX_INFO_DESTRUCT(&info);
    return rc;
}

/* Gets `prefix-R` of every rank R and compares it with `prefix-valR`. */
static void read_back(const char *what, const char *prefix, long size, int timeout_s)
{
    char key[64], want[64], why[256];
    int ok = 1;
    why[0] = 0;
    for (long r = 0; r < size; r++) {
        pmix_proc_t p;
        pmix_value_t *v = NULL;
        pmix_info_t info;
        int t = timeout_s;
        PMIX_LOAD_PROCID(&p, me.nspace, (pmix_rank_t)r);
        snprintf(key, sizeof key, "%s", prefix);
        snprintf(want, sizeof want, "%s-val%ld", prefix, r);
        PMIX_INFO_LOAD(&info, PMIX_TIMEOUT, &t, PMIX_INT);
        pmix_status_t rc = PMIx_Get(&p, key, &info, 1, &v);
        PMIX_INFO_DESTRUCT(&info);
        if (rc != PMIX_SUCCESS || v == NULL || v->type != PMIX_STRING
            || strcmp(v->data.string, want) != 0) {
            ok = 0;
            snprintf(why, sizeof why, "key %s of rank %ld: %s (got %s)", key, r,
                     PMIx_Error_string(rc),
                     (v && v->type == PMIX_STRING) ? v->data.string : "no string");
        }
        if (v)
            PMIX_VALUE_RELEASE(v);
        if (!ok)
            break;
    }
    check(ok, what, why);
}

static int run_test(void)
{
    char why[512], val[64];
    long size = get_uint(PMIX_RANK_WILDCARD, PMIX_JOB_SIZE);
    long univ = get_uint(PMIX_RANK_WILDCARD, PMIX_UNIV_SIZE);
    long maxp = get_uint(PMIX_RANK_WILDCARD, PMIX_MAX_PROCS);
    long nodes = get_uint(PMIX_RANK_WILDCARD, PMIX_NUM_NODES);
    long lsize = get_uint(PMIX_RANK_WILDCARD, PMIX_LOCAL_SIZE);
    long lrank = get_uint(me.rank, PMIX_LOCAL_RANK);
    long nrank = get_uint(me.rank, PMIX_NODE_RANK);
    long appnum = get_uint(me.rank, PMIX_APPNUM);
    long nodeid = get_uint(me.rank, PMIX_NODEID);
    char *peers = get_str(PMIX_RANK_WILDCARD, PMIX_LOCAL_PEERS);
    char *host = get_str(me.rank, PMIX_HOSTNAME);
    char *tmpdir = get_str(PMIX_RANK_WILDCARD, PMIX_TMPDIR);
    char *nsdir = get_str(PMIX_RANK_WILDCARD, PMIX_NSDIR);
    /* Is my rank among the local peers? */
    int in_peers = 0;
    if (peers) {
        char *copy = strdup(peers), *save = NULL;
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
            if (atol(t) == (long)me.rank)
                in_peers = 1;
        free(copy);
    }
    snprintf(why, sizeof why,
             "size %ld univ %ld max %ld nodes %ld local_size %ld local_rank %ld node_rank %ld "
             "appnum %ld nodeid %ld peers %s host %s tmpdir %s nsdir %s",
             size, univ, maxp, nodes, lsize, lrank, nrank, appnum, nodeid,
             peers ? peers : "-", host ? host : "-", tmpdir ? tmpdir : "-", nsdir ? nsdir : "-");
    printf("rank %u: job %s\n", me.rank, why);
    check(size > 0 && univ == size && maxp >= size && nodes >= 1 && lsize >= 1 && lsize <= size
              && lrank >= 0 && lrank < lsize && nrank >= 0 && appnum == 0 && nodeid >= 0
              && nodeid < nodes && in_peers && host && tmpdir && nsdir,
          "job", why);
    free(peers);
    free(host);
    free(tmpdir);
    free(nsdir);
    if (size <= 0)
        return 1;

    /* The process sets, by query. */
    {
        pmix_query_t q;
        pmix_info_t *res = NULL;
        size_t nres = 0;
        int ok = 0;
        pmix_status_t arc;
        PMIX_QUERY_CONSTRUCT(&q);
        PMIX_ARGV_APPEND(arc, q.keys, PMIX_QUERY_PSET_NAMES);
        pmix_status_t qrc = PMIx_Query_info(&q, 1, &res, &nres);
        snprintf(why, sizeof why, "names: %s", PMIx_Error_string(qrc));
        for (size_t n = 0; n < nres; n++)
            if (PMIX_CHECK_KEY(&res[n], PMIX_QUERY_PSET_NAMES) && res[n].value.type == PMIX_STRING) {
                snprintf(why, sizeof why, "names: %s", res[n].value.data.string);
                ok = strstr(res[n].value.data.string, "weft://world") != NULL;
            }
        if (res)
            PMIX_INFO_FREE(res, nres);
        PMIX_QUERY_DESTRUCT(&q);
        if (ok) {
            ok = 0;
            PMIX_QUERY_CONSTRUCT(&q);
            PMIX_ARGV_APPEND(arc, q.keys, PMIX_QUERY_PSET_MEMBERSHIP);
            PMIX_QUERY_QUALIFIERS_CREATE(&q, 1);
            PMIX_INFO_LOAD(&q.qualifiers[0], PMIX_PSET_NAME, "weft://world", PMIX_STRING);
            res = NULL;
            nres = 0;
            qrc = PMIx_Query_info(&q, 1, &res, &nres);
            snprintf(why, sizeof why, "members: %s", PMIx_Error_string(qrc));
            for (size_t n = 0; n < nres; n++)
                if (PMIX_CHECK_KEY(&res[n], PMIX_QUERY_PSET_MEMBERSHIP)
                    && res[n].value.type == PMIX_DATA_ARRAY && res[n].value.data.darray) {
                    size_t m = res[n].value.data.darray->size;
                    snprintf(why, sizeof why, "members: %zu of %ld", m, size);
                    ok = (long)m == size;
                }
            if (res)
                PMIX_INFO_FREE(res, nres);
            PMIX_QUERY_DESTRUCT(&q);
        }
        (void)arc;
        check(ok, "psets", why);
    }

    /* A key committed late, with no fence: the get waits for it. */
    if (me.rank == 0) {
        usleep(300 * 1000);
        put_str("late", "late-val0");
        PMIx_Commit();
    }
    {
        pmix_proc_t p;
        pmix_value_t *v = NULL;
        pmix_info_t info;
        int t = 20;
        PMIX_LOAD_PROCID(&p, me.nspace, 0);
        PMIX_INFO_LOAD(&info, PMIX_TIMEOUT, &t, PMIX_INT);
        pmix_status_t rc = PMIx_Get(&p, "late", &info, 1, &v);
        PMIX_INFO_DESTRUCT(&info);
        snprintf(why, sizeof why, "%s", PMIx_Error_string(rc));
        check(rc == PMIX_SUCCESS && v && v->type == PMIX_STRING
                  && !strcmp(v->data.string, "late-val0"),
              "late", why);
        if (v)
            PMIX_VALUE_RELEASE(v);
    }

    /* Collecting fence. */
    snprintf(val, sizeof val, "collect-val%u", me.rank);
    put_str("collect", val);
    PMIx_Commit();
    pmix_status_t rc = fence(1);
    check(rc == PMIX_SUCCESS, "collect fence", PMIx_Error_string(rc));
    read_back("collect", "collect", size, 20);

    /* Fence without data: remote keys come by direct modex. */
    snprintf(val, sizeof val, "sparse-val%u", me.rank);
    put_str("sparse", val);
    PMIx_Commit();
    rc = fence(0);
    check(rc == PMIX_SUCCESS, "sparse fence", PMIx_Error_string(rc));
    read_back("sparse", "sparse", size, 20);

    /* New puts after the fences, another collecting fence. */
    snprintf(val, sizeof val, "again-val%u", me.rank);
    put_str("again", val);
    PMIx_Commit();
    rc = fence(1);
    check(rc == PMIX_SUCCESS, "again fence", PMIx_Error_string(rc));
    read_back("again", "again", size, 20);

    /* Groups with context ids. */
    {
        pmix_proc_t all;
        pmix_info_t dir;
        bool yes = true;
        size_t ctx[2] = {0, 0};
        int ok = 1;
        const char *names[2] = {"pmix-client-group-a", "pmix-client-group-b"};
        PMIX_LOAD_PROCID(&all, me.nspace, PMIX_RANK_WILDCARD);
        for (int g = 0; g < 2 && ok; g++) {
            pmix_info_t *res = NULL;
            size_t nres = 0;
            PMIX_INFO_LOAD(&dir, PMIX_GROUP_ASSIGN_CONTEXT_ID, &yes, PMIX_BOOL);
            rc = PMIx_Group_construct(names[g], &all, 1, &dir, 1, &res, &nres);
            PMIX_INFO_DESTRUCT(&dir);
            int found = 0;
            for (size_t n = 0; n < nres; n++)
                if (PMIX_CHECK_KEY(&res[n], PMIX_GROUP_CONTEXT_ID)) {
                    PMIX_VALUE_GET_NUMBER(rc, &res[n].value, ctx[g], size_t);
                    found = 1;
                }
            if (res)
                PMIX_INFO_FREE(res, nres);
            snprintf(why, sizeof why, "construct %s: %s, context id %s", names[g],
                     PMIx_Error_string(rc), found ? "given" : "missing");
            ok = rc == PMIX_SUCCESS && found;
        }
        if (ok) {
            printf("rank %u: group ctxid %zu %zu\n", me.rank, ctx[0], ctx[1]);
            snprintf(why, sizeof why, "the two groups got the same context id %zu", ctx[0]);
            ok = ctx[0] != ctx[1];
        }
        for (int g = 0; g < 2 && ok; g++) {
            rc = PMIx_Group_destruct(names[g], NULL, 0);
            snprintf(why, sizeof why, "destruct %s: %s", names[g], PMIx_Error_string(rc));
            ok = rc == PMIX_SUCCESS;
        }
        check(ok, "group", why);
    }

    /* A key nobody put. */
    {
        pmix_proc_t p;
        pmix_value_t *v = NULL;
        pmix_info_t info;
        int t = 2;
        double t0 = now_us();
        PMIX_LOAD_PROCID(&p, me.nspace, (me.rank + 1) % size);
        PMIX_INFO_LOAD(&info, PMIX_TIMEOUT, &t, PMIX_INT);
        rc = PMIx_Get(&p, "nobody-put-this", &info, 1, &v);
        PMIX_INFO_DESTRUCT(&info);
        snprintf(why, sizeof why, "%s after %.0f ms", PMIx_Error_string(rc),
                 (now_us() - t0) / 1e3);
        double ms = (now_us() - t0) / 1e3;
        check(rc == PMIX_ERR_NOT_FOUND || (rc == PMIX_ERR_TIMEOUT && ms >= 1500 && ms < 6000),
              "missing", why);
        if (v)
            PMIX_VALUE_RELEASE(v);
    }
    rc = fence(0);
    check(rc == PMIX_SUCCESS, "last fence", PMIx_Error_string(rc));
    return failed;
}

static int run_bench(int iters, int keys, int bytes, const char *impl)
{
    long size = get_uint(PMIX_RANK_WILDCARD, PMIX_JOB_SIZE);
    char *buf = malloc(bytes > 0 ? bytes : 1);
    char key[64];
    memset(buf, 'a' + me.rank % 26, bytes);
    if (fence(0) != PMIX_SUCCESS) {
        fprintf(stderr, "pmix_client: warm-up fence failed\n");
        return 1;
    }
    double total = 0;
    for (int i = 0; i < iters; i++) {
        for (int k = 0; k < keys; k++) {
            pmix_value_t v;
            pmix_byte_object_t bo = { .bytes = buf, .size = (size_t)bytes };
            snprintf(key, sizeof key, "bench%d", k);
            buf[0] = (char)i;
            PMIX_VALUE_LOAD(&v, &bo, PMIX_BYTE_OBJECT);
            PMIx_Put(PMIX_GLOBAL, key, &v);
            PMIX_VALUE_DESTRUCT(&v);
        }
        PMIx_Commit();
        double t0 = now_us();
        pmix_status_t rc = fence(1);
        total += now_us() - t0;
        if (rc != PMIX_SUCCESS) {
            fprintf(stderr, "pmix_client: fence failed: %s\n", PMIx_Error_string(rc));
            return 1;
        }
    }
    /* A get of every other rank's first key, after the fences: the mean. */
    double get_total = 0;
    for (long k = 1; k < size; k++) {
        pmix_proc_t p;
        pmix_value_t *v = NULL;
        PMIX_LOAD_PROCID(&p, me.nspace, (pmix_rank_t)((me.rank + k) % size));
        double t0 = now_us();
        pmix_status_t rc = PMIx_Get(&p, "bench0", NULL, 0, &v);
        get_total += now_us() - t0;
        if (rc != PMIX_SUCCESS || v == NULL || v->type != PMIX_BYTE_OBJECT
            || v->data.bo.size != (size_t)bytes) {
            fprintf(stderr, "pmix_client: get failed: %s\n", PMIx_Error_string(rc));
            return 1;
        }
        PMIX_VALUE_RELEASE(v);
    }
    double get_us = size > 1 ? get_total / (size - 1) : 0;
    if (me.rank == 0)
        printf("{\"bench\":\"pmix_fence\",\"impl\":\"%s\",\"procs\":%ld,\"keys\":%d,"
               "\"key_bytes\":%d,\"iters\":%d,\"fence_us\":%.1f,\"get_us\":%.2f}\n",
               impl, size, keys, bytes, iters, total / iters, get_us);
    fence(0);
    free(buf);
    return 0;
}

static int run_osub(void)
{
    pmix_proc_t wild;
    PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
    pmix_info_t opt;
    PMIX_INFO_LOAD(&opt, PMIX_OPTIONAL, NULL, PMIX_BOOL);
    pmix_value_t *val = NULL;
    pmix_status_t rc = PMIx_Get(&wild, PMIX_NODE_OVERSUBSCRIBED, &opt, 1, &val);
    printf("rank %u: oversubscribed %s\n", me.rank, rc == PMIX_SUCCESS ? "yes" : "no");
    if (val != NULL) {
        PMIX_VALUE_RELEASE(val);
    }
    const char *v = getenv("OMPI_MCA_mpi_oversubscribe");
    printf("rank %u: OMPI_MCA_mpi_oversubscribe %s\n", me.rank, v != NULL ? v : "unset");
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "pmix_client: PMIx_Init failed: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    int out;
    if (argc > 1 && !strcmp(argv[1], "bench")) {
        out = run_bench(argc > 2 ? atoi(argv[2]) : 20, argc > 3 ? atoi(argv[3]) : 32,
                        argc > 4 ? atoi(argv[4]) : 1024, argc > 5 ? argv[5] : "pmix");
    } else if (argc > 1 && !strcmp(argv[1], "osub")) {
        out = run_osub();
    } else {
        out = run_test();
    }
    PMIx_Finalize(NULL, 0);
    return out;
}
