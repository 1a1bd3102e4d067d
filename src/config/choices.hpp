// The deck's choice keys as enums, each with the one parser and the one spelling
// (to_string) of its values. Kept apart from RunConfig so that the layers that consume a
// choice (model/, parallel/, perf/) name it without seeing the deck.
#pragma once

#include <string>
#include <string_view>

namespace tessera {

// model.arch
enum class Arch { llama, gpt2 };
// model.tie_embeddings: automatic lets the architecture decide (gpt2 ties, llama does not).
enum class TieEmbeddings { automatic, yes, no };
// model.router: how a mixture-of-experts block scores its experts (doc/moe.md).
enum class Router { softmax, sigmoid };
// data.tokenizer
enum class TokenizerKind { byte, gpt2 };
// parallel.pp_schedule. interleaved is Megatron-LM's virtual pipeline (1F1B over
// parallel.pp_virtual >= 2 chunks per stage). zb_h1, zb_v and dualpipe_v split each backward
// into its input and weight halves (doc/pipeline.md); tessera generates and checks them but
// cannot run them yet, so the deck does not offer them and parse_pipe_schedule does not
// know them.
enum class PipeSchedule { gpipe, one_f_one_b, interleaved, zb_h1, zb_v, dualpipe_v };
// parallel.cp_kind: how context parallelism splits attention (doc/parallelism.md): ring
// (zigzag sequence chunks, K/V blocks passed around the cp ring) or ulysses (all-to-all from
// sequence-sharded to head-sharded and back).
enum class CpKind { ring, ulysses };
// parallel.ep_dispatch: how expert parallelism moves tokens (doc/moe.md, "Two-level dispatch"):
// flat (one all-to-allv over ep, a row per token and expert) or two_level (a row per token and
// destination node across nodes, fanned out to the node's experts inside it).
enum class EpDispatch { flat, two_level };
// parallel.progress: how data-parallel buckets in flight are driven during backward.
enum class DpProgress { poll, none };
// hardware.device
enum class DeviceKind { cpu, cuda };
// Compute precision of training (train.precision): GEMM operands and the compute copy of the
// parameters; master weights, optimizer, norms and the loss stay fp32.
enum class TrainPrecision { fp32, bf16, fp16 };
// The number formats an accelerator multiplies in, as the planner names a layout's precision
// (prec=, cluster peaks); fp8 means fp8 GEMMs with bf16 elsewhere, which tessera does not
// train in. model/config.hpp's precision_names maps one vocabulary to the others.
enum class ComputeType { fp32, bf16, fp16, fp8 };
// The dtype gradients travel in when data-parallel ranks reduce them.
enum class ReduceDtype { fp32, bf16 };
// train.recompute: which activations a block rebuilds in backward instead of keeping
// (doc/recompute.md).
enum class Recompute { none, selective, full };
// train.on_nonfinite: what follows a step with a NaN/Inf loss or gradient norm.
enum class OnNonfinite { stop, skip };

// The deck's spelling of each value.
const char* to_string(Arch a);
const char* to_string(TieEmbeddings t);
const char* to_string(Router r);  // "softmax", "sigmoid"
const char* to_string(TokenizerKind t);
const char* to_string(PipeSchedule s);  // "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v",
                                        // "dualpipev"
const char* to_string(CpKind k);        // "ring", "ulysses"
const char* to_string(EpDispatch d);    // "flat", "two_level"
const char* to_string(DpProgress p);
const char* to_string(DeviceKind d);
const char* to_string(TrainPrecision p);  // "fp32", "bf16", "fp16"
const char* to_string(ReduceDtype d);
const char* to_string(Recompute r);  // "none", "selective", "full"
const char* to_string(OnNonfinite o);

// Parsers of the deck's spelling. The deck has already checked its choice keys against the
// schema, so an unknown name here comes from code or a test: a collective tessera::Error
// naming the valid choices (std::logic_error for parallel.progress, its historical contract).
Arch parse_arch(std::string_view name);
TieEmbeddings parse_tie_embeddings(std::string_view name);
Router parse_router(std::string_view name);
TokenizerKind parse_tokenizer_kind(std::string_view name);
PipeSchedule parse_pipe_schedule(std::string_view name);
CpKind parse_cp_kind(std::string_view name);
EpDispatch parse_ep_dispatch(std::string_view name);
DpProgress dp_progress_from(const std::string& name);
DeviceKind parse_device_kind(std::string_view name);
TrainPrecision parse_precision(std::string_view name);
ReduceDtype parse_reduce_dtype(std::string_view name);
Recompute parse_recompute(std::string_view name);
OnNonfinite parse_on_nonfinite(std::string_view name);

}  // namespace tessera
