// tessera's own memory, replayed: what the CPU runtime allocates per rank for a layout, by
// category, reproduced from the same rules the code follows (ParamStore padding, per-slot
// layer buffers and the one set recompute rebuilds into, the pipeline executor's message
// buffers, ZeRO's buffer pool). The planner
// uses it for `--runtime tessera`; plan_validate_tessera checks it against measured peaks.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config.hpp"
#include "parallel/rank_layout.hpp"
#include "perf/layout.hpp"
#include "perf/memory.hpp"

namespace tessera {

// What a planned layout means for the rank at pipeline stage `stage` (every other coordinate
// 0): RankLayout::make over the layout's keys as a deck would give them (the workload's
// model with the layout's precision and recompute mode), so the planner costs the rank tessera
// would run, and refuses what tessera would refuse, with its error text.
RankLayout tessera_rank_layout(const Workload& w, const Layout& l, int stage);
// Whether tessera runs the layout's dualpipev pairs interleaved (parallel.pp_pair_overlap and a
// composition that interleaves: pp::paired_overlap_off, the trainer's own rule), so that each
// pair's backward_input has a second scratch space and the pair's all-to-alls travel behind
// the other pass's compute.
bool tessera_pairs_interleave(const Workload& w, const Layout& l);
// The other way: a run's layout as the planner spells it (the default rank order; Layout
// spells interleaved 1F1B as one_f_one_b with vpp > 1).
Layout tessera_layout(const RankLayout& r);

// tessera's ZeRO-2/3 communication buffers (gradient staging, reduced pieces, gathered
// parameters) at their peak over one step, in bytes; zero below stage 2. tessera takes and
// returns these buffers at fixed points of every step (parallel.zero_inflight bounds the
// reductions in flight and they are retired in order), and its pool reuses a buffer of the
// same size only, so the peak is what replaying that sequence allocates
// (src/parallel/dp/zero.cpp). With train.precision bf16 / fp16, stage 3 gathers each part's
// 16-bit copy and widens it to fp32; with grad=bf16 (parallel.grad_reduce_dtype) every stage
// reduces through 16-bit staging buffers (stage 1 too, and HSDP's all-reduce of the shard).
double tessera_comm_bytes(const RankLayout& r, const Layout& l, int64_t accum, int inflight);

// The two-level dispatch's relay buffers of one mixture-of-experts block (model/moe_two_level.cpp,
// charged to communication): the rows a source sends (one per token and node), the rows a relay
// receives, their node-packed copies by choice, and the weights' gradients both ways. 0 with
// the flat dispatch.
double moe_two_level_comm_bytes(const ModelConfig& c, int64_t micro_batch);

// Whether the layout trains with a 16-bit compute copy (prec=bf16 or fp16), and that copy's
// bytes for psi parameters: 2 psi held for the run below ZeRO-3, the 16-bit copy of the
// parameter shard (2 psi / N) under ZeRO-3 (charged to params); ZeRO-3 also gathers each
// part's copy (communication buffers).
// (RankLayout::model_state counts the copy.)
bool tessera_half(const Layout& l);
// grad=bf16 (parallel.grad_reduce_dtype) with zero = 0: the bf16 staging copy of the gradients,
// 2 psi of communication buffers when there is more than one data-parallel rank.
double tessera_grad_staging_bytes(const Layout& l, double psi);
// data.document_mask (train/document_batch.hpp): the window of document starts (B x (T + 1))
// and, per held micro-batch (`slots`: the step's micro-batches with a pipeline, else 1), each
// row's start and position (B x T_local each) and the whole sequences' starts (B x T), int32;
// 0 without document masks. A host run's bytes (a device run also keeps host copies).
double tessera_document_bytes(const Workload& w, const ModelConfig& c, int64_t micro_batch,
                              int64_t slots);

// A pipeline layout (l.pp > 1): each category's peak over the stages (what memory.json
// reports: max over ranks), and the parameters of the largest stage.
struct TesseraStageMemory {
  MemoryBreakdown memory;
  double params = 0;
};
TesseraStageMemory tessera_pipeline_memory(const Workload& w, const Layout& l, int64_t m);

}  // namespace tessera
