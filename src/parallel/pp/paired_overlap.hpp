// DualPipe's paired overlap (parallel.pp_schedule = dualpipev, doc/pipeline.md "Paired
// overlap"): where a forward and a backward_input of two micro-batches follow each other
// (op_pairs, pp/schedule.hpp), the stage runs them interleaved on one thread
// (model/pass_pair.hpp), each giving way to the other at its experts' all-to-alls, so that one
// micro-batch's dispatch and combine travel while the other computes. It runs where nothing but
// the passes' own state is touched between two switches; elsewhere the pair's passes run one
// after the other, as before. The rule is here, once: the trainer decides by it whether its
// pairs interleave, and tessera-plan whether to count the B's second scratch space and the
// hidden all-to-alls (perf/tessera_memory.cpp, perf/cost_model.cpp).
#pragma once

#include <string>

#include "config/run_config.hpp"
#include "model/config.hpp"

namespace tessera::pp {

// Why a run's pairs are not interleaved ("" when they are; "not dualpipev" without pairs):
// the deck turned it off, nothing to hide (no expert all-to-alls: no experts or ep 1), or a
// composition not made safe to interleave yet (the two-level dispatch, tp, cp, recompute,
// ZeRO-2/3, a device run). cfg: the model (whole or a rank's: only its experts and recompute
// mode are read).
std::string paired_overlap_off(const ParallelSection& p, const ModelConfig& cfg, DeviceKind device);

}  // namespace tessera::pp
