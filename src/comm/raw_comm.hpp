// Collectives on a raw MPI communicator, for code handed an MPI_Comm rather than a
// Communicator (io/token_dataset: the layout of a sharded dataset, read on rank 0, goes to
// every rank). Untimed and uncounted: for set-up, not for steps.
#pragma once

#include <mpi.h>

#include <cstdint>

namespace tessera::mpi {

int rank(MPI_Comm comm);
int size(MPI_Comm comm);
// value becomes the minimum over the ranks.
void all_reduce_min(MPI_Comm comm, int64_t* value);
// bytes from root's data to every rank's (in pieces, so that any size fits MPI's int counts).
void broadcast(MPI_Comm comm, void* data, int64_t bytes, int root);

}  // namespace tessera::mpi
