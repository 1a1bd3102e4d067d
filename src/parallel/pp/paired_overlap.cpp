#include "parallel/pp/paired_overlap.hpp"

namespace tessera::pp {

// A tied token table needs none: the embedding's backward lets the head's forward end first
// (Transformer::backward_chunk). Each refusal names what the two interleaved passes would
// share:
//  * the two-level dispatch: its relays' staging (Moe::src_rows_) and blocking intra-node legs;
//  * tp: the blocking tp collectives between the switches and the partial gradients' sums;
//  * cp: the ring's transfers in flight and the MoE's per-call row caches (Moe::runs);
//  * recompute: the shared set of rebuilt activations (Block::Rebuilt);
//  * ZeRO-2/3: the gradients staged and the parameters gathered per part, by part hooks that
//    assume one pass at a time;
//  * a device run: the passes' kernels on one stream, not measured here.
std::string paired_overlap_off(const ParallelSection& p, const ModelConfig& cfg,
                               DeviceKind device) {
  if (p.pp_schedule != PipeSchedule::dualpipe_v || p.pp < 2) return "not dualpipev";
  if (!p.pp_pair_overlap) return "parallel.pp_pair_overlap = false";
  if (!cfg.moe.enabled() || p.ep < 2) return "nothing to hide: no expert all-to-alls";
  if (cfg.moe.two_level) return "two_level dispatch";
  if (p.tp > 1) return "tp";
  if (p.cp > 1) return "cp";
  if (cfg.recompute != Recompute::none) return "recompute";
  if (p.zero >= 2) return "ZeRO-2/3";
  if (device != DeviceKind::cpu) return "device run";
  return "";
}

}  // namespace tessera::pp
