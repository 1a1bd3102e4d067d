// Placement: where the members of each group of a layout sit on the machine, and what one
// collective over such a group costs.
//
// Ranks fill node 0 first (ranks 0 .. a-1 on node 0 for a accelerators per node), then node
// 1, ...; pods hold pod.nodes consecutive nodes. Which ranks form a group follows from the
// layout's rank order (comm/grid_layout.hpp, the same arithmetic tessera's ProcessGrid uses):
// with tp-cp-ep-dp-pp a TP group is tp consecutive ranks, with tp-cp-pp-dp-ep the pipeline
// stages of one model replica are neighbours and data parallelism is the slowest axis.
//
// A group's collectives run level by level (NCCL's trees, hierarchical all-reduce): with its
// n members spread over k nodes, g_max members on the fullest node and g_min on the emptiest,
// and (with pods) over P pods of at most q nodes and at least r members each, a
// reduce-scatter of B bytes takes
//   (g_max - 1)/g_max x B / bw_node                        inside each node
// + (q - 1)/q x (B / g_min) / bw_network                   across the nodes of a pod
// + (P - 1)/P x (B / r) / bw_pod                           across pods
// plus (fan - 1) latencies per level: only the share of the bytes that crosses a boundary
// travels on the slower link, spread over the NICs of the members on each side (the node
// with the fewest members is the bottleneck). A group inside one node is the plain ring on
// the node's link; a group of one member per node the plain ring on the network.
// All-gather is the same, all-reduce twice. All-to-all cannot be split into levels: of the
// (n-1)/n x B each member sends, (g-1)/n stays in the node and (n-g)/n crosses, the two
// shares moving at once on their links (the slower share sets the time).
// A point-to-point message crosses the slowest link between neighbouring members.
//
// Groups of one kind have the same size but not always the same placement (a TP group of 6 on
// 8-accelerator nodes lies inside node 0 for ranks 0-5 but spans nodes 0 and 1 for ranks
// 6-11); the step waits for the slowest, so each kind is costed by its worst group.
#pragma once

#include <string>
#include <vector>

#include "perf/cluster.hpp"

namespace tessera {

// Where one group's members sit.
struct GroupPlacement {
  int members = 1;
  int nodes = 1;                           // nodes holding at least one member
  int per_node_max = 1, per_node_min = 1;  // members on one of those nodes
  int pods = 1;                            // pods holding at least one member (1: no pods)
  int nodes_per_pod_max = 1;               // of the group's nodes, the most in one pod
  int per_pod_min = 1;                     // members in the pod holding the fewest
  bool operator==(const GroupPlacement&) const = default;
};
// The placement of the group of world ranks `ranks` on cluster c.
GroupPlacement place_group(const std::vector<int>& ranks, const Cluster& c);

// The links one group's collectives use: its placement and the cluster's link per level.
struct GroupLink {
  GroupPlacement place;
  Link node, network, pod;  // the cluster's three levels
  // The slowest link between neighbouring members (what a point-to-point message and the
  // old flat ring model use): bw, latency, name.
  double bw = 0, latency = 0;
  const char* name = "";
  GroupLink() = default;
  // A group whose collectives all run on one link (a flat ring), for tests and one-level
  // machines.
  GroupLink(const Link& flat);  // NOLINT: implicit, a Link is a one-level GroupLink
  bool flat = false;
  bool crosses_nodes() const { return !flat && place.nodes > 1; }
  bool crosses_pods() const { return !flat && place.pods > 1; }
};
GroupLink group_link(const GroupPlacement& p, const Cluster& c);

// Seconds of a collective split by the link it occupies: `node` on the intra-node fabric
// (shared with tensor parallelism), `network` on the NICs and beyond.
struct CollectiveTime {
  double node = 0, network = 0;
  double total() const { return node + network; }
  CollectiveTime operator*(double f) const { return {node * f, network * f}; }
  CollectiveTime operator+(const CollectiveTime& o) const {
    return {node + o.node, network + o.network};
  }
};
CollectiveTime reduce_scatter_time(double bytes, int n, const GroupLink& g);
CollectiveTime all_reduce_time(double bytes, int n, const GroupLink& g);
CollectiveTime all_to_all_time(double bytes, int n, const GroupLink& g);

// "8 members: 8 on one node" / "6 members on 2 nodes (2-4 per node)" / "... in 2 pods".
std::string describe(const GroupPlacement& p);

}  // namespace tessera
