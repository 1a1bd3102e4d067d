#include "comm/raw_comm.hpp"

#include <algorithm>

namespace tessera::mpi {

int rank(MPI_Comm comm) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}

int size(MPI_Comm comm) {
  int n = 1;
  MPI_Comm_size(comm, &n);
  return n;
}

void all_reduce_min(MPI_Comm comm, int64_t* value) {
  MPI_Allreduce(MPI_IN_PLACE, value, 1, MPI_INT64_T, MPI_MIN, comm);
}

void broadcast(MPI_Comm comm, void* data, int64_t bytes, int root) {
  constexpr int64_t kPiece = int64_t(1) << 30;
  char* p = static_cast<char*>(data);
  for (int64_t done = 0; done < bytes; done += kPiece)
    MPI_Bcast(p + done, int(std::min(kPiece, bytes - done)), MPI_BYTE, root, comm);
}

}  // namespace tessera::mpi
