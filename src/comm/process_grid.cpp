#include "comm/process_grid.hpp"

#include <sstream>

namespace tessera {

ProcessGrid::ProcessGrid(MPI_Comm world) : world_(world, "world") {
  MPI_Comm dup;
  MPI_Comm_dup(world, &dup);
  dp_ = Communicator(dup, "dp");

  // Nodes: ranks sharing memory; a node's id is the smallest world rank on it.
  MPI_Comm shared;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, world_.rank(), MPI_INFO_NULL, &shared);
  int leader = world_.rank();
  MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, shared);
  MPI_Comm_free(&shared);
  node_of_rank_.assign(size_t(world_.size()), 0);
  MPI_Allgather(&leader, 1, MPI_INT, node_of_rank_.data(), 1, MPI_INT, world);
  // Renumber leaders 0..nodes-1 in rank order.
  std::vector<int> id(size_t(world_.size()), -1);
  nodes_ = 0;
  for (int& n : node_of_rank_) {
    if (id[size_t(n)] < 0) id[size_t(n)] = nodes_++;
    n = id[size_t(n)];
  }
  node_ = node_of_rank_[size_t(world_.rank())];
}

std::string ProcessGrid::describe() const {
  std::ostringstream os;
  os << "layout: " << world_.size() << " rank(s) on " << nodes_ << " node(s); dp = "
     << dp_.size() << "\n  dp group 0: ranks";
  for (int r = 0; r < world_.size(); ++r) os << " " << r << "@node" << node_of_rank_[size_t(r)];
  return os.str();
}

}  // namespace tessera
