// How much of the data-parallel / ZeRO traffic hides behind compute, layer by layer.
//
// A stage runs its L_s layers one after the other; the traffic of one layer can hide only
// behind the compute of its neighbour (prefetch one layer ahead, reduce one layer behind), so
// per layer and pass, with c the layer's collective (c_node on the intra-node fabric,
// c_net on the network, perf/placement.hpp), W the neighbour layer's compute and T its
// tensor-parallel collectives:
//   exposed(c) = max(0,  c_node - W,  c_node + c_net - W - T)
// The node's links carry TP's all-reduces while T runs, so only the network share can use
// that time; compute W hides either. What cannot overlap at all: the first gather of a pass
// (nothing runs before it) and the last reduction (nothing runs after it).
//
// Per step, P_l = Psi_r / L_s parameters per layer, m micro-batches, G an all-gather of w P_l
// over the shard group, R a reduce-scatter of g P_l, A an all-reduce of g P_l over dp x cp:
//   ZeRO-0   last micro-batch's backward:  A + (L_s - 1) exposed(A | W_b)
//   ZeRO-1   the same with R, + the all-gather of w Psi_r after the optimizer (exposed)
//   ZeRO-2   every backward: m (R + (L_s - 1) exposed(R | W_b)), + the all-gather after the
//            optimizer
//   ZeRO-3   every forward: m (G + (L_s - 1) exposed(G | W_f)); every backward (one gather
//            per layer, two under full recompute, and the reduction):
//            m (G_b + R + (L_s - 1) exposed(G_b + R | W_b))
//   HSDP     the all-reduce of g Psi_r / N across replicas after the last backward (exposed)
// W_f, W_b: a layer's forward and backward (backward including its recompute) compute per
// micro-batch; T_f, T_b its TP collectives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "perf/comm_model.hpp"
#include "perf/layout.hpp"

namespace tessera {

// One layer's compute and TP communication per micro-batch on one rank.
struct LayerWindow {
  double fwd = 0, bwd = 0;        // compute (bwd includes the layer's recompute)
  double tp_fwd = 0, tp_bwd = 0;  // tensor-parallel collectives
};

// One named piece of the DP/ZeRO traffic and how much of it is exposed.
struct OverlapTerm {
  std::string what;  // "first gather of each forward", ...
  double total = 0, exposed = 0;
};

struct DpOverlap {
  std::vector<OverlapTerm> terms;
  double total() const;
  double exposed() const;
  double hidden() const { return total() - exposed(); }
};

// exposed(c) above.
double exposed_behind(const CollectiveTime& c, double compute, double tp);

// The stage holds `layers` layers and Psi_r = params_per_rank parameters.
DpOverlap dp_overlap(const Layout& l, const GroupLinks& links, double params_per_rank,
                     double layers, int64_t m, const LayerWindow& win);

}  // namespace tessera
