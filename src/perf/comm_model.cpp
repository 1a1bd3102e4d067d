#include "perf/comm_model.hpp"

#include <algorithm>

#include "comm/grid_layout.hpp"
#include "perf/compute_model.hpp"

namespace tessera {

double all_reduce_seconds(double bytes, int n, const GroupLink& link) {
  return all_reduce_time(bytes, n, link).total();
}

double reduce_scatter_seconds(double bytes, int n, const GroupLink& link) {
  return reduce_scatter_time(bytes, n, link).total();
}

double all_gather_seconds(double bytes, int n, const GroupLink& link) {
  return reduce_scatter_seconds(bytes, n, link);
}

double all_to_all_seconds(double bytes, int n, const GroupLink& link) {
  return all_to_all_time(bytes, n, link).total();
}

double p2p_seconds(double bytes, const GroupLink& link) {
  return bytes <= 0 ? 0 : bytes / link.bw + link.latency;
}

namespace {

// The worst-placed of `groups` (the slowest reduce-scatter of a gigabyte over it).
GroupLink worst(const std::vector<std::vector<int>>& groups, const Cluster& c) {
  GroupLink best;
  double slowest = -1;
  for (const std::vector<int>& members : groups) {
    const GroupLink g = group_link(place_group(members, c), c);
    const double t = reduce_scatter_seconds(1e9, g.place.members, g);
    if (t > slowest) slowest = t, best = g;
  }
  return best;
}

}  // namespace

GroupLinks group_links(const Layout& l, const Cluster& c) {
  GroupLinks g;
  const GridLayout grid({l.tp, l.cp, l.ep, l.dp, l.pp}, l.order, l.accelerators());
  g.tp = worst(grid.all_groups(Group::tp), c);
  g.cp = worst(grid.all_groups(Group::cp), c);
  g.ep = worst(grid.all_groups(Group::ep), c);
  g.pp = worst(grid.all_groups(Group::pp), c);
  const std::vector<std::vector<int>> dp = grid.all_groups(Group::dp_cp);
  g.dp = worst(dp, c);
  // HSDP: K consecutive members of a gradient group share one copy of the sharded state
  // (parallel.shard_group); the replicas of one shard are K apart.
  const int K = l.shard_ranks() > 0 ? l.shard_ranks() : 1;
  std::vector<std::vector<int>> shards, replicas;
  for (const std::vector<int>& members : dp) {
    const int G = int(members.size());
    for (int s = 0; s + K <= G; s += K)
      shards.emplace_back(members.begin() + s, members.begin() + s + K);
    for (int j = 0; j < K && j < G; ++j) {
      std::vector<int> rep;
      for (int i = j; i < G; i += K) rep.push_back(members[size_t(i)]);
      replicas.push_back(std::move(rep));
    }
  }
  g.shard = worst(shards, c);
  g.replica = worst(replicas, c);
  return g;
}

namespace {
double tokens(const Workload& w, const Layout& l) {
  return double(l.micro_batch) * double(w.cfg.seq_len) / l.cp;
}
}  // namespace

double tp_seconds_per_layer(const Workload& w, const Layout& l, const GroupLink& link) {
  if (l.tp == 1) return 0;
  const double bytes = activation_element_bytes(l) * tokens(w, l) * double(w.cfg.d_model);
  const int collectives = 4 + (l.recompute == Recompute::full ? 2 : 0);
  return collectives * all_reduce_seconds(bytes, l.tp, link);
}

double cp_seconds_per_layer(const Workload& w, const Layout& l, const GroupLink& link) {
  if (l.cp == 1) return 0;
  const ModelConfig& c = w.cfg;
  if (w.cp_kind == CpKind::ulysses) {  // tessera's: 4 all-to-alls forward, 8 backward
    const double a = activation_element_bytes(l), T = tokens(w, l);
    const double q = a * T * double(c.heads / l.tp * c.head_dim);
    const double kv = a * T * double(std::max<int64_t>(1, c.kv_heads / l.tp) * c.head_dim);
    const double forward = 2 * all_to_all_seconds(q, l.cp, link) +
                           2 * all_to_all_seconds(kv, l.cp, link);
    return (3 + (l.recompute == Recompute::none ? 0 : 1)) * forward;
  }
  const double kv = double(std::max<int64_t>(1, c.kv_heads / l.tp) * c.head_dim);
  const double block = 2 * activation_element_bytes(l) * tokens(w, l) * kv;  // K and V
  const double passes = 3 + (l.recompute == Recompute::none ? 0 : 1);
  return passes * (l.cp - 1) * p2p_seconds(block, link);
}

double ep_seconds_per_layer(const Workload& w, const Layout& l, const GroupLink& link) {
  if (!w.moe.any() || l.ep == 1) return 0;
  const double bytes =
      activation_element_bytes(l) * tokens(w, l) * w.moe.top_k * double(w.cfg.d_model);
  const int collectives = 4 + (l.recompute == Recompute::full ? 2 : 0);
  return collectives * all_to_all_seconds(bytes, l.ep, link);
}

double pp_seconds_per_microbatch(const Workload& w, const Layout& l, const GroupLink& link) {
  if (l.pp == 1) return 0;
  const double bytes = activation_element_bytes(l) * tokens(w, l) * double(w.cfg.d_model) / l.tp;
  return 2.0 * l.vpp * p2p_seconds(bytes, link);
}

DpComm dp_comm(const Layout& l, const GroupLinks& g, double psi, int64_t m) {
  DpComm r;
  const double gb = l.grad_elem_bytes(), wb = l.weight_elem_bytes();
  const int G = l.dp * l.cp, N = l.shard_ranks();
  const double M = double(m);
  if (G == 1) return r;
  switch (l.zero) {
    case 0:
      r.overlappable = all_reduce_seconds(gb * psi, G, g.dp);
      r.bytes = 2.0 * (G - 1) / G * gb * psi;
      break;
    case 1:
      r.overlappable = reduce_scatter_seconds(gb * psi, N, g.shard);
      r.exposed = all_gather_seconds(wb * psi, N, g.shard);
      r.bytes = double(N - 1) / N * (gb + wb) * psi;
      break;
    case 2:
      r.overlappable = M * reduce_scatter_seconds(gb * psi, N, g.shard);
      r.exposed = all_gather_seconds(wb * psi, N, g.shard);
      r.bytes = double(N - 1) / N * (M * gb + wb) * psi;
      break;
    default: {
      const double gathers = l.recompute == Recompute::full ? 3 : 2;
      r.overlappable = M * (gathers * all_gather_seconds(wb * psi, N, g.shard) +
                            reduce_scatter_seconds(gb * psi, N, g.shard));
      r.bytes = double(N - 1) / N * M * (gathers * wb + gb) * psi;
    }
  }
  if (N < G && l.zero > 0) {  // HSDP: the shards are summed across the replicas
    const int R = G / N;
    r.exposed += all_reduce_seconds(gb * psi / N, R, g.replica);
    r.bytes += 2.0 * (R - 1) / R * gb * psi / N;
  }
  return r;
}

}  // namespace tessera
