// The MPI environment of a tessera program: start, rank and size of the world, orderly end,
// abort. The programs in app/ use these so that every MPI call stays inside comm/.
#pragma once

namespace tessera::mpi {

// MPI_Init, after leaving out Open MPI's sharedfp/lockedfile component (see mpi_env.cpp).
void init(int* argc, char*** argv);
void finalize();
int world_rank();
int world_size();
double wtime();  // seconds, MPI's clock
[[noreturn]] void abort(int code);  // stops every rank of the job

}  // namespace tessera::mpi
