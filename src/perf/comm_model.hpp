// Communication time: collectives on a ring, and the traffic each parallel dimension
// generates per micro-batch or per step.
//
// A collective over n members on a link of bandwidth bw (bytes/s per member, one direction,
// as an all-reduce's bus bandwidth reaches it) and per-hop latency lat, ring algorithm
// (Patarasuk & Yuan 2009; what NCCL's bus bandwidth measures; seed 000's "each card sends
// about twice the data, independent of N"):
//   all-reduce       2 (n-1)/n x bytes / bw + 2 (n-1) lat
//   reduce-scatter   (n-1)/n x bytes / bw + (n-1) lat      bytes: the whole input
//   all-gather       (n-1)/n x bytes / bw + (n-1) lat      bytes: the whole output
//   all-to-all       (n-1)/n x bytes / bw + (n-1) lat      bytes: what one member sends
//   send/recv        bytes / bw + lat
//
// Per dimension (a = activation bytes per element, T = b s / cp tokens of a micro-batch on
// this rank, C hidden, t TP degree; Megatron-LM, Narayanan et al. 2021, and
// Korthikanti et al. 2022 section 4.2.2):
//   TP: per layer and micro-batch, 2 all-reduces of a T C bytes in forward, 2 in backward,
//       2 more with full recompute (with sequence parallelism each all-reduce becomes a
//       reduce-scatter plus an all-gather: the same time). Not overlapped.
//   CP: ring attention passes K and V blocks around the CP ring: (cp-1) steps of
//       2 a (T) k_rank bytes in forward, twice that in backward (K, V and their gradients);
//       overlapped with the attention core, the excess is exposed. With parallel.cp_kind =
//       ulysses (tessera's): all-to-alls of q, k, v and the output, a T (q + 2k + q) bytes,
//       forward, twice that backward (tessera repeats the forward's), not overlapped.
//   EP: per MoE layer, dispatch and combine all-to-alls of a T top_k C bytes, forward and
//       backward (and again with full recompute).
//   PP: per micro-batch and model chunk, the activation forward and its gradient backward,
//       a T C bytes each (/t: Megatron's scatter-gather over the TP ranks, or SP).
//   DP/ZeRO, per step, over the dp x cp gradient group (Psi_r parameters per rank, N ranks
//       per shard group, m micro-batches; g bytes per gradient, w per weight):
//     zero 0: all-reduce g Psi_r                      (bucketed, overlaps the last backward)
//     zero 1: reduce-scatter g Psi_r (overlaps the last backward) + all-gather w Psi_r
//     zero 2: m reduce-scatters g Psi_r (each overlaps its backward) + all-gather w Psi_r
//     zero 3: m x (2 all-gathers w Psi_r, 3 with full recompute, + reduce-scatter g Psi_r),
//             all overlapping forward and backward (prefetch)
//     HSDP adds an all-reduce of g Psi_r / N over the dp x cp / N replicas.
//   dp_comm gives this traffic per step (bytes, and times as whole-Psi_r collectives); the
//   cost model times it layer by layer and bounds what hides behind compute in
//   perf/overlap.hpp.
//
// Every collective runs on its group's placement (perf/placement.hpp): level by level when the
// group spans nodes or pods, a plain ring on a flat Link.
#pragma once

#include <cstdint>

#include "perf/cluster.hpp"
#include "perf/layout.hpp"
#include "perf/placement.hpp"

namespace tessera {

// On a flat Link: the ring formulas above; on a GroupLink: level by level
// (perf/placement.hpp).
double all_reduce_seconds(double bytes, int n, const GroupLink& link);
double reduce_scatter_seconds(double bytes, int n, const GroupLink& link);
double all_gather_seconds(double bytes, int n, const GroupLink& link);
double all_to_all_seconds(double bytes, int n, const GroupLink& link);
double p2p_seconds(double bytes, const GroupLink& link);

// The links each group of a layout uses, from the members of its worst-placed group under
// the layout's rank order (perf/placement.hpp).
struct GroupLinks {
  GroupLink tp, cp, ep, dp, shard, replica, pp;
};
GroupLinks group_links(const Layout& l, const Cluster& c);

// Per layer and micro-batch (forward + backward + recompute).
double tp_seconds_per_layer(const Workload& w, const Layout& l, const GroupLink& link);
double cp_seconds_per_layer(const Workload& w, const Layout& l, const GroupLink& link);
double ep_seconds_per_layer(const Workload& w, const Layout& l, const GroupLink& link);
// Per micro-batch: the point-to-point messages of one stage (forward and backward, all chunks).
double pp_seconds_per_microbatch(const Workload& w, const Layout& l, const GroupLink& link);

struct DpComm {
  double overlappable = 0;  // may hide behind compute
  double exposed = 0;       // runs after backward or after the optimizer
  double total() const { return overlappable + exposed; }
  double bytes = 0;  // sent per rank per step
};
DpComm dp_comm(const Layout& l, const GroupLinks& links, double params_per_rank, int64_t m);

}  // namespace tessera
