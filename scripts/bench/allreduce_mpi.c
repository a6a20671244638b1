/* allreduce_mpi.c - the yardstick of scripts/bench/allreduce.lua: Open MPI's
 * own MPI_Allreduce (float32, sum, in place) from plain C, timed as the
 * needle side is timed: for each message size, a barrier, then reps calls;
 * the slowest rank's time per call. Prints "bytes seconds" lines on rank 0.
 * Built by allreduce.lua: mpicc -O2 allreduce_mpi.c */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int i = 1; i < argc; i++) {
        long n = atol(argv[i]); /* floats */
        float *buf = malloc((size_t)n * sizeof *buf);
        for (long k = 0; k < n; k++) buf[k] = 1.0f;
        int reps = (int)(200000000L / (n * 4 + 100000));
        if (reps < 5) reps = 5;
        if (reps > 2000) reps = 2000;
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); /* warm-up */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int r = 0; r < reps; r++)
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t = (MPI_Wtime() - t0) / reps, slowest;
        MPI_Reduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) printf("%ld %.9g\n", n * 4, slowest);
        free(buf);
    }
    MPI_Finalize();
    return 0;
}
