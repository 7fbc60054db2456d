/* MPI_Comm_spawn under a PMIx launcher (Weft's test of issue 33): the job spawns 2 copies
 * of this program; the parents' rank 0 sends 42 to child 0 over the intercommunicator, both
 * sides merge it (MPI_Intercomm_merge) and allreduce a 1 from every process (the sum is the
 * merged size), then disconnect (MPI_Comm_disconnect: a fence over both jobs). Each process
 * prints one line of what it saw. With an argument N the parents do it N times, waiting half
 * a second after each disconnect (the children's job ends in between).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm parent, inter;
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_get_parent(&parent);
    int rounds = argc > 1 ? atoi(argv[1]) : 1;
    for (int round = 0; parent == MPI_COMM_NULL && round < rounds; round++) {
        if (round > 0) usleep(500000);
        int errs[4];
        MPI_Comm_spawn(argv[0], MPI_ARGV_NULL, 2, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter, errs);
        int rsize; MPI_Comm_remote_size(inter, &rsize);
        printf("parent %d/%d: spawned %d\n", rank, size, rsize); fflush(stdout);
        int v = 42 + rank;
        if (rank == 0) MPI_Send(&v, 1, MPI_INT, 0, 7, inter);
        MPI_Comm merged; MPI_Intercomm_merge(inter, 0, &merged);
        int msize; MPI_Comm_size(merged, &msize);
        int sum; int one = 1; MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, merged);
        printf("parent %d: merged size %d sum %d\n", rank, msize, sum); fflush(stdout);
        MPI_Comm_free(&merged);
        MPI_Comm_disconnect(&inter);
    }
    if (parent != MPI_COMM_NULL) {
        int v = 0;
        if (rank == 0) MPI_Recv(&v, 1, MPI_INT, 0, 7, parent, MPI_STATUS_IGNORE);
        MPI_Comm merged; MPI_Intercomm_merge(parent, 1, &merged);
        int msize; MPI_Comm_size(merged, &msize);
        int sum; int one = 1; MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, merged);
        printf("child %d/%d: got %d merged size %d sum %d\n", rank, size, v, msize, sum); fflush(stdout);
        MPI_Comm_free(&merged);
        MPI_Comm_disconnect(&parent);
    }
    MPI_Finalize();
    return 0;
}
