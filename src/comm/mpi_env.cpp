#include "comm/mpi_env.hpp"

#include <mpi.h>

#include <cstdlib>

namespace tessera::mpi {

void init(int* argc, char*** argv) { MPI_Init(argc, argv); }

void finalize() {
  int done = 0;
  MPI_Finalized(&done);
  if (!done) MPI_Finalize();
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

double wtime() { return MPI_Wtime(); }

void abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);  // not reached: MPI_Abort does not return
}

}  // namespace tessera::mpi
