#include "perf/comm_model.hpp"

#include <algorithm>

#include "perf/compute_model.hpp"

namespace tessera {

double all_reduce_seconds(double bytes, int n, const Link& link) {
  if (n <= 1 || bytes <= 0) return 0;
  return 2.0 * (n - 1) / n * bytes / link.bw + 2.0 * (n - 1) * link.latency;
}

double reduce_scatter_seconds(double bytes, int n, const Link& link) {
  if (n <= 1 || bytes <= 0) return 0;
  return double(n - 1) / n * bytes / link.bw + double(n - 1) * link.latency;
}

double all_gather_seconds(double bytes, int n, const Link& link) {
  return reduce_scatter_seconds(bytes, n, link);
}

double all_to_all_seconds(double bytes, int n, const Link& link) {
  return reduce_scatter_seconds(bytes, n, link);
}

double p2p_seconds(double bytes, const Link& link) {
  return bytes <= 0 ? 0 : bytes / link.bw + link.latency;
}

GroupLinks group_links(const Layout& l, const Cluster& c) {
  GroupLinks g;
  const int K = l.shard_ranks() > 0 ? l.shard_ranks() : 1;
  g.tp = c.link(l.tp, 1);
  g.cp = c.link(l.cp, l.tp);
  g.ep = c.link(l.ep, l.tp * l.cp);
  g.dp = c.link(l.dp * l.cp, l.tp);
  g.shard = c.link(K, l.tp);
  g.replica = c.link(l.dp * l.cp / K, l.tp * K);
  g.pp = c.link(l.pp, l.tp * l.cp * l.dp);
  return g;
}

namespace {
double tokens(const Workload& w, const Layout& l) {
  return double(l.micro_batch) * double(w.cfg.seq_len) / l.cp;
}
}  // namespace

double tp_seconds_per_layer(const Workload& w, const Layout& l, const Link& link) {
  if (l.tp == 1) return 0;
  const double bytes = activation_element_bytes(l) * tokens(w, l) * double(w.cfg.d_model);
  const int collectives = 4 + (l.recompute == Recompute::full ? 2 : 0);
  return collectives * all_reduce_seconds(bytes, l.tp, link);
}

double cp_seconds_per_layer(const Workload& w, const Layout& l, const Link& link) {
  if (l.cp == 1) return 0;
  const ModelConfig& c = w.cfg;
  const double kv = double(std::max<int64_t>(1, c.kv_heads / l.tp) * c.head_dim);
  const double block = 2 * activation_element_bytes(l) * tokens(w, l) * kv;  // K and V
  const double passes = 3 + (l.recompute == Recompute::none ? 0 : 1);
  return passes * (l.cp - 1) * p2p_seconds(block, link);
}

double ep_seconds_per_layer(const Workload& w, const Layout& l, const Link& link) {
  if (!w.moe.any() || l.ep == 1) return 0;
  const double bytes =
      activation_element_bytes(l) * tokens(w, l) * w.moe.top_k * double(w.cfg.d_model);
  const int collectives = 4 + (l.recompute == Recompute::full ? 2 : 0);
  return collectives * all_to_all_seconds(bytes, l.ep, link);
}

double pp_seconds_per_microbatch(const Workload& w, const Layout& l, const Link& link) {
  if (l.pp == 1) return 0;
  const double bytes = activation_element_bytes(l) * tokens(w, l) * double(w.cfg.d_model) / l.tp;
  return 2.0 * l.vpp * p2p_seconds(bytes, link);
}

DpComm dp_comm(const Layout& l, const GroupLinks& g, double psi, int64_t m) {
  DpComm r;
  const double gb = l.mixed() ? 2 : 4, wb = l.mixed() ? 2 : 4;
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
