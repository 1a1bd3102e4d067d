#include "comm/mpi_env.hpp"

#include <mpi.h>

#include <cstdlib>

namespace tessera::mpi {

void init(int* argc, char*** argv) {
  // Open MPI 4.1's shared-file-pointer component `lockedfile` overflows a fixed buffer (and
  // aborts) in MPI_File_open for paths of about 240 characters or more; tessera uses no
  // shared file pointers, so it is left out unless the user set the parameter.
  setenv("OMPI_MCA_sharedfp", "^lockedfile", 0);
  MPI_Init(argc, argv);
}

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
