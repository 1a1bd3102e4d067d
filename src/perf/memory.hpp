// Model-state memory per rank under ZeRO: the formulas tessera reports beside what its
// allocator measured, and that the planner uses.
//
// Mixed precision (ZeRO paper, Rajbhandari et al. 2020, with K = 12 bytes of fp32 master
// weights + Adam moments per parameter): stage 0: 16Psi; 1: 4Psi + 12Psi/N;
// 2: 2Psi + 14Psi/N; 3: 16Psi/N.
// fp32 training as tessera runs it today (no separate master copy; the fp32 parameters are
// the master weights): params 4Psi, grads 4Psi, Adam 8Psi, of which
//   stage 0: 4Psi + 4Psi + 8Psi                = 16Psi
//   stage 1: 4Psi + (4Psi + 4Psi/N) + 8Psi/N     = 8Psi + 12Psi/N  (the full gradient buffer
//            plus the reduced shard the optimizer reads)
//   stage 2: 4Psi + 4Psi/N + 8Psi/N              = 4Psi + 12Psi/N
//   stage 3: 4Psi/N + 4Psi/N + 8Psi/N            = 16Psi/N
// Psi counts parameters as laid out (padded to shard evenly); N is the number of ranks one
// copy of the state is sharded over (the HSDP shard group, else the data-parallel degree).
#pragma once

#include <cstdint>
#include <string>

#include "model/config.hpp"
#include "parallel/rank_layout.hpp"  // ModelStateBytes, zero_model_state: the formulas above

namespace tessera {

// Bytes per accelerator by category (the allocator's Charge categories, plus what a cluster
// reserves).
struct MemoryBreakdown {
  double params = 0, grads = 0, optimizer = 0, activations = 0, comm = 0, workspace = 0;
  double reserved = 0;
  double total() const {
    return params + grads + optimizer + activations + comm + workspace + reserved;
  }
};

// "16Psi/N", "8Psi + 12Psi/N", ... for a stage in fp32 or (mixed) the ZeRO paper's formulas.
const char* zero_formula(int stage, bool mixed);
// RankLayout::model_state as text: "4Psi + 12Psi/N", "16Psi + bf16 compute copy 2Psi", ...
std::string model_state_formula(const RankLayout& r);

// Activations tessera keeps per rank for one micro-batch of `batch` sequences in flight, in
// bytes, exactly as its layers allocate them (cfg.tp gives the tensor-parallel split; R = rows
// of the residual stream: B*T, or B*T/t with sequence parallelism). Elements are fp32 except
// those that feed only GEMMs (the norms' outputs and the MLP activation), which are in the
// operand dtype (cfg.operand_bytes(): 2 in a 16-bit run), and q, k, v and the attention
// output, which are bf16 in a bf16 run without context parallelism (attention_io_bytes: the
// attention core reads and writes them so; fp32 in fp16 runs and with context parallelism):
//   per block: norm outputs 2*R*C (operand dtype; a mixture-of-experts block's second in fp32,
//     the router's input), residual copy and block output 2*R*C, norm statistics 2*R
//     (LayerNorm 4*R); q, k, v and the attention output (2*Hq + 2*Hkv)/t * D * B*T
//     (attention_io_bytes), the softmax log-sum-exp B*Hq/t*T (flash-style: no T x T scores,
//     fp32); MLP 2*F/t*B*T (SwiGLU:
//     gate, up) or F/t*B*T (GELU: input) and the activation F/t*B*T (operand dtype)
//   embedding output R*C; head: norm statistics R (LayerNorm 2R) and its input gradient R*C.
// Recompute (cfg.recompute, doc/recompute.md) changes what a block keeps per micro-batch:
//   selective: all but the attention output and its log-sum-exp and the MLP activation's
//     output (Hq/t*D*B*T attention_io_bytes, B*Hq/t*T fp32 and F/t*B*T operand-dtype elements
//     fewer);
//   full: its output R*C only (the next block's kept input; a block's own input is its
//     predecessor's output);
// and adds one shared set for the block being rebuilt: what selective drops, or a whole
// block's activations (activation_bytes_per_block) under full.
// activation_bytes is the whole model as one chunk holding one micro-batch (no pipeline).
double activation_bytes(const ModelConfig& cfg, int64_t batch);
// What a mixture-of-experts block (no recompute) keeps beyond a dense block, in bytes: no
// dense MLP; the shared experts' MLP; the router's logits, scores, choices, packed rows (of
// whole sequences: every context-parallel rank routes them all) and
// load fractions; the expert side's rows (with ep > 1) and the experts' hidden activations,
// all sized for the worst case (every rank's N top_k rows on one rank), as model/moe.cpp
// allocates them, so the bytes do not depend on the routing; with the two-level dispatch
// the relay's tables and node-packed outputs (model/moe_two_level.cpp).
double moe_block_extra_bytes(const ModelConfig& cfg, int64_t batch);
double activation_bytes_per_block(const ModelConfig& cfg, int64_t batch);
// 2 or 4: the bytes of an element of q, k, v and the attention output (above).
double attention_io_bytes(const ModelConfig& cfg);
// What one block (a mixture-of-experts block when `moe`) keeps per micro-batch in flight,
// treated as `mode` says. A mixture-of-experts block under selective recompute drops the
// attention's output and lse and the experts' activation outputs (routed, fp32, and shared);
// under full it keeps its output only, as a dense block.
double block_kept_bytes(const ModelConfig& cfg, int64_t batch, Recompute mode, bool moe = false);
// The shared set rebuilt blocks use, once per rank (0 without recompute): under selective the
// attention's dropped pieces and the dropped MLP activations of each kind of block that
// rebuilds (dense, mixture of experts); under full a whole block's activations of each kind,
// the attention's counted once.
double rebuilt_bytes(const ModelConfig& cfg, int64_t batch);
// Kept bytes per micro-batch of a chunk of `blocks` blocks starting at global block `first`
// (cfg.recompute_layers counts per chunk).
double chunk_kept_bytes(const ModelConfig& cfg, int64_t batch, int64_t blocks, int64_t first);

// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
// Models"), activation bytes per transformer layer for fp16 training with dropout, attention
// scores kept (s = sequence, b = micro-batch, h = hidden, a = heads, t = tensor-parallel):
//   no parallelism     s*b*h*(34 + 5*a*s/h)
//   tensor parallel    s*b*h*(10 + 24/t + 5*a*s/(h*t))
//   + sequence parallel s*b*h/t*(34 + 5*a*s/h)
double korthikanti_layer_bytes(double s, double b, double h, double a, double t,
                               bool sequence_parallel);

}  // namespace tessera
