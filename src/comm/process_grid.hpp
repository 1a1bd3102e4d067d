// The process grid: MPI_COMM_WORLD split into one communicator per group of the layout
// (doc/architecture.md, "Process grid"; the rank arithmetic is in grid_layout.hpp). Each parallel dimension's layers
// receive the groups they talk to through a ParallelContext; nothing is global.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/grid_layout.hpp"

namespace tessera {

class ProcessGrid {
 public:
  // degrees.dp = 0 means auto: world / (tp * cp * pp).
  // ranks_per_node > 0 treats each ranks_per_node consecutive world ranks as one node
  // instead of asking MPI which ranks share memory (to see on one machine how a layout
  // would map onto nodes).
  ProcessGrid(MPI_Comm world, GridDegrees degrees = {1, 1, 1, 0, 1},
              const std::string& order = GridLayout::kDefaultOrder, int ranks_per_node = 0);

  Communicator& world() { return world_; }
  Communicator& group(Group g) { return groups_[size_t(g)]; }
  Communicator& dp() { return group(Group::dp); }
  const GridLayout& layout() const { return layout_; }
  GridLayout::Coord coord() const { return layout_.coord(world_.rank()); }
  int node() const { return node_of_rank_[size_t(world_.rank())]; }
  int nodes() const { return nodes_; }
  // The nodes each group of g spans when every group sits on its nodes in equal blocks of
  // consecutive group ranks, all groups on the same number (1 for one node); 0 otherwise. The
  // expert->node map of node-limited routing (doc/moe.md).
  int blocked_nodes(Group g) const;

  // The two-level expert dispatch's pair of groups (doc/moe.md, "Two-level dispatch"), made
  // once, collectively over the world, when the ep group is `nodes` blocks of consecutive ep
  // ranks: ep_intra, the ep ranks of this rank's block (one node), and ep_cross, the ep ranks
  // with this rank's local index in every block (one per node). Null until made.
  void split_ep_by_node(int nodes);
  Communicator* ep_intra() { return ep_nodes_ > 0 ? &ep_intra_ : nullptr; }
  Communicator* ep_cross() { return ep_nodes_ > 0 ? &ep_cross_ : nullptr; }
  // The ranks holding the same routed experts, over which their gradients are summed (and ZeRO
  // shards them; doc/moe.md, "Expert memory"): edp, or with context parallelism edp x cp, the
  // dp_cp ranks with this rank's ep index (ranked as in dp_cp), made at the first call,
  // collectively over dp_cp.
  Communicator& expert_replicas();

  // Every group's collectives (the world's too) become spans of trace (null: none).
  void set_trace(Trace* trace);

  // The layout for the log: every group with its global ranks and the node of each.
  std::string describe() const;
  // Traffic per group (calls, bytes, seconds) as a table, this rank's counts; extra lists
  // groups made outside the grid (e.g. HSDP's shard and replica groups).
  std::string traffic_table(const std::vector<const Communicator*>& extra = {}) const;
  // hardware.device = cuda: every group can move device tensors, and with link.nccl every
  // group of more than one rank gets its NCCL communicator (Communicator::attach_device;
  // collective over the world, groups in one order). Groups split later inherit the link.
  void attach_device(const DeviceLink& link);
  // The same counters as JSON, with the bytes split by kind of operation (traffic.json):
  // {"group": {"calls": ., "bytes": ., "seconds": ., "kinds": {"all_reduce": ., ...}}, ...}
  std::string traffic_json(const std::vector<const Communicator*>& extra = {}) const;

 private:
  Communicator world_;
  GridLayout layout_;
  std::array<Communicator, kAllGroups.size()> groups_;
  Communicator ep_intra_, ep_cross_;  // split_ep_by_node
  Communicator edp_cp_;               // expert_replicas with cp > 1
  bool edp_cp_made_ = false;
  int ep_nodes_ = 0;
  Trace* trace_ = nullptr;
  std::vector<int> node_of_rank_;
  int nodes_ = 1;
  bool emulated_nodes_ = false;
};

// How much of a layer's point-to-point traffic was hidden behind its compute (context
// parallelism's ring): in_flight sums, per transfer, the time from posting to the first test
// that found it complete (or to the end of its wait); exposed sums the time blocked waiting
// after the compute it overlapped. hidden = 1 - exposed / in_flight.
struct OverlapTiming {
  double in_flight = 0, exposed = 0;
  int64_t transfers = 0;
};

// What a layer needs to know about parallelism: its groups. Passed explicitly, never global.
struct ParallelContext {
  Communicator& dp;
  Communicator& tp;
  bool sequence_parallel = false;
  Communicator* cp = nullptr;  // context parallelism (null: none)
  OverlapTiming* cp_timing = nullptr;  // the ring's overlap, when someone keeps it
  Communicator* ep = nullptr;  // expert parallelism (null: none)
  // The two-level dispatch's groups (ProcessGrid::split_ep_by_node; null: flat dispatch).
  Communicator* ep_intra = nullptr;
  Communicator* ep_cross = nullptr;
  OverlapTiming* ep_timing = nullptr;  // the experts' overlapped all-to-alls (model/moe.cpp)
};

}  // namespace tessera
