/* An MPI ring for the tests of MPI programs under `weft run` (tests/mpi.rs): a token goes
 * round the ring with MPI_Send/MPI_Recv, every rank adds its rank; an allreduce and a
 * barrier check the sum; prints "rank R ring ok". `ring die R`: rank R kills itself
 * (SIGKILL) after MPI_Init, the others wait in the ring. `ring sleep S`: every rank
 * prints "rank R sleeping" and sleeps S seconds after MPI_Init (for --timeout). `ring abort
 * R`: rank R calls MPI_Abort with error code 3 after MPI_Init. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank, size;
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        fprintf(stderr, "ring: MPI_Init failed\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc > 2 && !strcmp(argv[1], "die") && atoi(argv[2]) == rank)
        raise(SIGKILL);
    if (argc > 2 && !strcmp(argv[1], "abort") && atoi(argv[2]) == rank)
        MPI_Abort(MPI_COMM_WORLD, 3);
    if (argc > 2 && !strcmp(argv[1], "sleep")) {
        printf("rank %d sleeping\n", rank);
        fflush(stdout);
        sleep(atoi(argv[2]));
    }
    long token = 0;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    if (rank == 0) {
        MPI_Send(&token, 1, MPI_LONG, next, 7, MPI_COMM_WORLD);
        MPI_Recv(&token, 1, MPI_LONG, prev, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
        MPI_Recv(&token, 1, MPI_LONG, prev, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        token += rank;
        MPI_Send(&token, 1, MPI_LONG, next, 7, MPI_COMM_WORLD);
    }
    MPI_Bcast(&token, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    long mine = rank, sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    long want = (long)size * (size - 1) / 2;
    MPI_Barrier(MPI_COMM_WORLD);
    if (token != want || sum != want) {
        printf("rank %d ring wrong: token %ld, sum %ld, want %ld\n", rank, token, sum, want);
        MPI_Finalize();
        return 1;
    }
    printf("rank %d ring ok\n", rank);
    MPI_Finalize();
    return 0;
}
