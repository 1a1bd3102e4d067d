#include "perf/placement.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace tessera {

GroupPlacement place_group(const std::vector<int>& ranks, const Cluster& c) {
  // The ranks come sorted, so each node's (and pod's) members are one run of them.
  GroupPlacement p;
  p.members = int(ranks.size());
  if (ranks.empty()) return p;
  p.nodes = 0, p.per_node_max = 0, p.per_node_min = p.members;
  p.pods = 0, p.nodes_per_pod_max = 0, p.per_pod_min = p.members;
  int node = -1, pod = -1, in_node = 0, pod_nodes = 0, in_pod = 0;
  auto close_node = [&] {
    if (node < 0) return;
    p.per_node_max = std::max(p.per_node_max, in_node);
    p.per_node_min = std::min(p.per_node_min, in_node);
  };
  auto close_pod = [&] {
    if (pod < 0) return;
    p.nodes_per_pod_max = std::max(p.nodes_per_pod_max, pod_nodes);
    p.per_pod_min = std::min(p.per_pod_min, in_pod);
  };
  for (int r : ranks) {
    const int n = r / c.per_node, q = c.pod_nodes > 0 ? n / c.pod_nodes : 0;
    if (n != node) {
      close_node();
      if (q != pod) close_pod(), pod = q, ++p.pods, pod_nodes = 0, in_pod = 0;
      node = n, ++p.nodes, in_node = 0, ++pod_nodes;
    }
    ++in_node, ++in_pod;
  }
  close_node();
  close_pod();
  return p;
}

GroupLink::GroupLink(const Link& l)
    : node(l), network(l), pod(l), bw(l.bw), latency(l.latency), name(l.name), flat(true) {}

GroupLink group_link(const GroupPlacement& p, const Cluster& c) {
  GroupLink g;
  g.place = p;
  g.node = c.intra, g.network = c.inter, g.pod = c.pod;
  const Link& slowest = p.pods > 1 ? c.pod : p.nodes > 1 ? c.inter : c.intra;
  g.bw = slowest.bw, g.latency = slowest.latency, g.name = slowest.name;
  return g;
}

CollectiveTime reduce_scatter_time(double bytes, int n, const GroupLink& g) {
  CollectiveTime t;
  if (n <= 1 || bytes <= 0) return t;
  auto level = [&](int fan, double share, const Link& link) {
    return fan <= 1
               ? 0.0
               : double(fan - 1) / fan * bytes / share / link.bw + double(fan - 1) * link.latency;
  };
  if (g.flat) {
    t.network = level(n, 1, Link{g.bw, g.latency, g.name});
    return t;
  }
  const GroupPlacement& p = g.place;
  t.node = level(p.per_node_max, 1, g.node);
  t.network =
      level(p.nodes_per_pod_max, p.per_node_min, g.network) + level(p.pods, p.per_pod_min, g.pod);
  return t;
}

CollectiveTime all_reduce_time(double bytes, int n, const GroupLink& g) {
  return reduce_scatter_time(bytes, n, g) * 2.0;
}

CollectiveTime all_to_all_time(double bytes, int n, const GroupLink& g) {
  CollectiveTime t;
  if (n <= 1 || bytes <= 0) return t;
  if (g.flat) {
    t.network = double(n - 1) / n * bytes / g.bw + double(n - 1) * g.latency;
    return t;
  }
  const GroupPlacement& p = g.place;
  const double local = double(p.per_node_max - 1) / n * bytes / g.node.bw +
                       double(p.per_node_max - 1) * g.node.latency;
  const Link& far = p.pods > 1 ? g.pod : g.network;
  const double crossing = p.nodes <= 1 ? 0.0
                                       : double(n - p.per_node_min) / n * bytes / far.bw +
                                             double(p.nodes - 1) * far.latency;
  // The two shares move at once; the slower one sets the time.
  if (crossing >= local)
    t.network = crossing;
  else
    t.node = local;
  return t;
}

std::string describe(const GroupPlacement& p) {
  if (p.members <= 1) return "1 member";
  std::string s = cat(p.members, " members");
  if (p.nodes == 1) return s + cat(": all on one node");
  s += cat(" on ", p.nodes, " nodes (");
  s += p.per_node_min == p.per_node_max ? cat(p.per_node_max)
                                        : cat(p.per_node_min, "-", p.per_node_max);
  s += " per node)";
  if (p.pods > 1)
    s += cat(" in ", p.pods, " pods (at least ", p.per_pod_min, " per pod)");
  else
    s += ", one pod";
  return s;
}

}  // namespace tessera
