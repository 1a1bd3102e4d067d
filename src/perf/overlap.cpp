#include "perf/overlap.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace tessera {

double DpOverlap::total() const {
  double s = 0;
  for (const OverlapTerm& t : terms) s += t.total;
  return s;
}

double DpOverlap::exposed() const {
  double s = 0;
  for (const OverlapTerm& t : terms) s += t.exposed;
  return s;
}

double exposed_behind(const CollectiveTime& c, double compute, double tp) {
  return std::max({0.0, c.node - compute, c.total() - compute - tp});
}

DpOverlap dp_overlap(const Layout& l, const GroupLinks& g, double psi, double layers, int64_t m,
                     const LayerWindow& w) {
  DpOverlap r;
  const int G = l.dp * l.cp, N = l.shard_ranks();
  if (G == 1 || layers <= 0) return r;
  const double gb = l.grad_elem_bytes(), wb = l.weight_elem_bytes();
  const double M = double(m), Pl = psi / layers, inner = layers - 1;
  auto add = [&](std::string what, double total, double exposed) {
    r.terms.push_back({std::move(what), total, std::min(total, exposed)});
  };
  // One layer's collectives.
  const CollectiveTime A = all_reduce_time(gb * Pl, G, g.dp);
  const CollectiveTime R = reduce_scatter_time(gb * Pl, N, g.shard);
  const CollectiveTime Gw = reduce_scatter_time(wb * Pl, N, g.shard);  // all-gather
  const CollectiveTime after = reduce_scatter_time(wb * psi, N, g.shard);
  switch (l.zero) {
    case 0:
      add("gradient all-reduce (last micro-batch), final layer: nothing left to hide it", A.total(),
          A.total());
      add(cat("gradient all-reduce (last micro-batch), ", layers - 1,
              " layers behind the next's backward"),
          inner * A.total(), inner * exposed_behind(A, w.bwd, w.tp_bwd));
      break;
    case 1:
      add("gradient reduce-scatter (last micro-batch), final layer: nothing left to hide it",
          R.total(), R.total());
      add(cat("gradient reduce-scatter (last micro-batch), ", layers - 1,
              " layers behind the next's backward"),
          inner * R.total(), inner * exposed_behind(R, w.bwd, w.tp_bwd));
      add("parameter all-gather after the optimizer", after.total(), after.total());
      break;
    case 2:
      add("gradient reduce-scatter (every micro-batch), final layer: nothing left to hide it",
          M * R.total(), M * R.total());
      add(cat("gradient reduce-scatter (every micro-batch), ", layers - 1,
              " layers behind the next's backward"),
          M * inner * R.total(), M * inner * exposed_behind(R, w.bwd, w.tp_bwd));
      add("parameter all-gather after the optimizer", after.total(), after.total());
      break;
    default: {
      const double gathers_b = l.recompute == Recompute::full ? 2 : 1;
      const CollectiveTime B = Gw * gathers_b + R;
      add("parameter all-gather (every forward), first layer: nothing before it", M * Gw.total(),
          M * Gw.total());
      add(cat("parameter all-gather (every forward), ", layers - 1,
              " layers behind the previous one's forward"),
          M * inner * Gw.total(), M * inner * exposed_behind(Gw, w.fwd, w.tp_fwd));
      add("backward (every micro-batch): first gather and final reduce-scatter",
          M * (Gw * gathers_b).total() + M * R.total(),
          M * (Gw * gathers_b).total() + M * R.total());
      add(cat("backward gathers + reduce-scatters, ", layers - 1,
              " layers behind the next's backward"),
          M * inner * B.total(), M * inner * exposed_behind(B, w.bwd, w.tp_bwd));
    }
  }
  if (N < G && l.zero > 0) {  // HSDP: the shards are summed across the replicas
    const int reps = G / N;
    const double t = all_reduce_seconds(gb * psi / N, reps, g.replica);
    add("HSDP all-reduce across replicas", t, t);
  }
  return r;
}

}  // namespace tessera
