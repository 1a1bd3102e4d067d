// The process grid: MPI_COMM_WORLD split into the groups each parallel dimension needs.
// Today every rank is a data-parallel replica (world = dp); tensor, pipeline, context and
// expert groups join this grid as those dimensions land.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace tessera {

class ProcessGrid {
 public:
  explicit ProcessGrid(MPI_Comm world);

  Communicator& world() { return world_; }
  Communicator& dp() { return dp_; }
  int node() const { return node_; }  // index of this rank's shared-memory node
  int nodes() const { return nodes_; }

  // One line per group: its global ranks and the node each is on (rank 0 prints it).
  std::string describe() const;

 private:
  Communicator world_, dp_;
  int node_ = 0, nodes_ = 1;
  std::vector<int> node_of_rank_;
};

// What a layer needs to know about parallelism: its groups. Passed explicitly, never global.
struct ParallelContext {
  Communicator& dp;
};

}  // namespace tessera
