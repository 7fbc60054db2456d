/* A PMIx client that says when PMIx_Init returned: under `weft run --stop-in-init` that
 * is when a debugger released it (cli/tests/tools.rs, benches/scripts/tool_attach.sh).
 * Prints "rank R init_done_us T" (CLOCK_MONOTONIC, which every process of the machine
 * shares), then finalizes half a second later (so that the processes released first do
 * not take the CPU from those still being released). */
#include <stdio.h>
#include <time.h>
#include <pmix.h>

int main(void)
{
    pmix_proc_t me;
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (PMIX_SUCCESS != rc) {
        fprintf(stderr, "pmix_held: PMIx_Init: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    printf("rank %u init_done_us %.0f\n", me.rank, ts.tv_sec * 1e6 + ts.tv_nsec / 1e3);
    fflush(stdout);
    struct timespec half = {0, 500 * 1000 * 1000};
    nanosleep(&half, NULL);
    PMIx_Finalize(NULL, 0);
    return 0;
}
