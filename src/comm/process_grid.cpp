#include "comm/process_grid.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace tessera {
namespace {

GridLayout make_layout(MPI_Comm world, GridDegrees d, const std::string& order) {
  int size = 1;
  MPI_Comm_size(world, &size);
  if (d.dp == 0) d.dp = GridLayout::infer_dp(size, d.tp, d.cp, d.pp);
  return GridLayout(d, order, size);
}

}  // namespace

ProcessGrid::ProcessGrid(MPI_Comm world, GridDegrees degrees, const std::string& order,
                         int ranks_per_node)
    : world_(world, "world"), layout_(make_layout(world, degrees, order)),
      emulated_nodes_(ranks_per_node > 0) {
  const int me = world_.rank();
  const GridLayout::Coord c = layout_.coord(me);
  for (Group g : kAllGroups) {
    // Within the dp group ranks are numbered by Coord::dp (ep fastest), whatever the order.
    const int key = g == Group::dp ? c.dp : me;
    MPI_Comm comm;
    MPI_Comm_split(world, layout_.group_index(me, g), key, &comm);
    groups_[size_t(g)] = Communicator(comm, to_string(g));
  }

  // Nodes: ranks sharing memory; a node's id is the smallest world rank on it.
  int leader = me / std::max(ranks_per_node, 1) * ranks_per_node;
  if (!emulated_nodes_) {
    MPI_Comm shared;
    MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &shared);
    leader = me;
    MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, shared);
    MPI_Comm_free(&shared);
  }
  node_of_rank_.assign(size_t(world_.size()), 0);
  MPI_Allgather(&leader, 1, MPI_INT, node_of_rank_.data(), 1, MPI_INT, world);
  std::vector<int> id(size_t(world_.size()), -1);  // renumber leaders 0..nodes-1
  nodes_ = 0;
  for (int& n : node_of_rank_) {
    if (id[size_t(n)] < 0) id[size_t(n)] = nodes_++;
    n = id[size_t(n)];
  }
}

int ProcessGrid::blocked_nodes(Group g) const {
  int nodes = -1;
  for (const std::vector<int>& members : layout_.all_groups(g)) {
    const size_t n = members.size();
    std::vector<int> seen;  // the nodes in order of first appearance
    for (size_t i = 0; i < n; ++i) {
      const int node = node_of_rank_[size_t(members[i])];
      if (i > 0 && node == node_of_rank_[size_t(members[i - 1])]) continue;
      if (std::find(seen.begin(), seen.end(), node) != seen.end()) return 0;  // not a block
      seen.push_back(node);
    }
    if (n % seen.size() != 0) return 0;
    const size_t block = n / seen.size();
    for (size_t i = 0; i < n; ++i)
      if (node_of_rank_[size_t(members[i])] != seen[i / block]) return 0;  // unequal blocks
    if (nodes >= 0 && nodes != int(seen.size())) return 0;
    nodes = int(seen.size());
  }
  return nodes < 0 ? 1 : nodes;
}

void ProcessGrid::split_ep_by_node(int nodes) {
  if (ep_nodes_ > 0) return;
  Communicator& ep = group(Group::ep);
  const int per_node = ep.size() / nodes, me = world_.rank();
  // Colours unique over the world: the ep group's index, then the block or the local index.
  const int g = layout_.group_index(me, Group::ep), block = ep.rank() / per_node;
  const int local = ep.rank() % per_node;
  MPI_Comm intra, cross;
  MPI_Comm_split(world_.raw(), g * nodes + block, ep.rank(), &intra);
  MPI_Comm_split(world_.raw(), g * per_node + local, ep.rank(), &cross);
  ep_intra_ = Communicator(intra, "ep_intra");
  ep_cross_ = Communicator(cross, "ep_cross");
  ep_intra_.set_trace(trace_);
  ep_cross_.set_trace(trace_);
  ep_nodes_ = nodes;
}

Communicator& ProcessGrid::expert_replicas() {
  if (layout_.group_size(Group::cp) == 1) return group(Group::edp);
  if (!edp_cp_made_) {
    const Communicator& dp_cp = group(Group::dp_cp);
    edp_cp_ = dp_cp.split(coord().ep, dp_cp.rank(), "edp_cp");
    edp_cp_.set_trace(trace_);
    edp_cp_made_ = true;
  }
  return edp_cp_;
}

std::string ProcessGrid::describe() const {
  std::ostringstream os;
  os << "layout: " << layout_.describe() << " on " << nodes_ << " node(s)"
     << (emulated_nodes_ ? " (emulated: hardware.ranks_per_node)" : "");
  constexpr size_t kShown = 8;  // groups listed per kind; the rest are summarised
  for (Group g : kAllGroups) {
    const auto groups = layout_.all_groups(g);
    if (groups.front().size() == 1 && g != Group::dp) continue;  // trivial groups: not shown
    os << "\n  " << to_string(g) << " (" << groups.size() << " x " << groups.front().size()
       << "):";
    for (size_t i = 0; i < groups.size() && i < kShown; ++i) {
      os << " [";
      for (size_t j = 0; j < groups[i].size(); ++j)
        os << (j ? " " : "") << groups[i][j] << "@n" << node_of_rank_[size_t(groups[i][j])];
      os << "]";
    }
    if (groups.size() > kShown) os << " ... (" << groups.size() - kShown << " more)";
  }
  return os.str();
}

void ProcessGrid::set_trace(Trace* trace) {
  trace_ = trace;
  if (ep_nodes_ > 0) ep_intra_.set_trace(trace), ep_cross_.set_trace(trace);
  if (edp_cp_made_) edp_cp_.set_trace(trace);
  world_.set_trace(trace);
  for (Communicator& g : groups_) g.set_trace(trace);
}

std::string ProcessGrid::traffic_table(const std::vector<const Communicator*>& extra) const {
  std::ostringstream os;
  char line[128];
  std::snprintf(line, sizeof line, "%-15s %8s %14s %10s   (rank 0)\n", "group", "calls", "bytes",
                "seconds");
  os << line;
  auto row = [&](const Communicator& c) {
    const TrafficStats& s = c.stats();
    if (c.size() == 1 && s.calls == 0) return;
    std::snprintf(line, sizeof line, "%-15s %8lld %14lld %10.3f\n", c.name().c_str(),
                  (long long)s.calls, (long long)s.bytes, s.seconds);
    os << line;
  };
  row(world_);
  for (const Communicator& c : groups_) row(c);
  if (ep_nodes_ > 0) row(ep_intra_), row(ep_cross_);
  if (edp_cp_made_) row(edp_cp_);
  for (const Communicator* c : extra) row(*c);
  return os.str();
}

void ProcessGrid::attach_device(const DeviceLink& link) {
  world_.attach_device(link);
  if (ep_nodes_ > 0) ep_intra_.attach_device(link), ep_cross_.attach_device(link);
  if (edp_cp_made_) edp_cp_.attach_device(link);
  for (Communicator& c : groups_) c.attach_device(link);
}

std::string ProcessGrid::traffic_json(const std::vector<const Communicator*>& extra) const {
  std::ostringstream os;
  os.precision(15);
  os << "{";
  const char* sep = "\n";
  auto group = [&](const Communicator& c) {
    const TrafficStats& s = c.stats();
    if (c.size() == 1 && s.calls == 0) return;
    os << sep << "  \"" << c.name() << "\": {\"calls\": " << s.calls << ", \"bytes\": " << s.bytes
       << ", \"seconds\": " << s.seconds << ", \"kinds\": {";
    for (int k = 0; k < kCommKinds; ++k)
      os << (k ? ", " : "") << "\"" << comm_kind_name(CommKind(k)) << "\": " << s.kind_bytes[size_t(k)];
    os << "}}";
    sep = ",\n";
  };
  group(world_);
  for (const Communicator& c : groups_) group(c);
  if (ep_nodes_ > 0) group(ep_intra_), group(ep_cross_);
  if (edp_cp_made_) group(edp_cp_);
  for (const Communicator* c : extra) group(*c);
  os << "\n}\n";
  return os.str();
}

}  // namespace tessera
