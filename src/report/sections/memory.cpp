// Memory: bytes per category (max over ranks), the model state beside the ZeRO formula,
// activations beside perf/memory.hpp's terms, the output head's chunks; memory.json and
// gemm.json.
#include <algorithm>
#include <fstream>
#include <sstream>

#include "kernels/kernels.hpp"
#include "perf/memory.hpp"
#include "report/sections.hpp"
#include "report/text.hpp"

namespace tessera {
namespace {

class Memory final : public MemorySection {
 public:
  explicit Memory(const ReportInputs& in)
      : trainer_(in.trainer),
        grid_(in.grid),
        dir_(in.run.output.dir),
        root_(in.grid.world().rank() == 0) {}

  void gather() override;
  std::string summary(SummaryPart part) const override;
  const std::array<double, kChargeCount + 1>& peak() const override { return mem_; }

 private:
  std::string model_state_line(const double* live) const;
  std::string activations_line(double measured, bool pipeline) const;
  std::string head_line() const;
  // memory.json: bytes per category (max over ranks), live and peak, and the model-state
  // formula (RankLayout::model_state, max over ranks).
  void write_memory_json(const double* peak, const double* live, double state_formula) const;
  int64_t held_expert_elements() const;
  int64_t routed_expert_elements() const;
  std::string per_block_json() const;

  Trainer& trainer_;
  ProcessGrid& grid_;
  std::string dir_;
  bool root_;
  std::array<double, kChargeCount + 1> mem_{}, live_{};  // peak and live, then the totals
};

void Memory::gather() {
  const Allocator& a = trainer_.allocator();
  // Peak and live bytes per category, then the totals: max over ranks.
  double* mem = mem_.data();
  double* live = live_.data();
  for (int c = 0; c < kChargeCount; ++c)
    mem[c] = double(a.peak(Charge(c))), live[c] = double(a.live(Charge(c)));
  mem[kChargeCount] = double(a.peak_total());
  live[kChargeCount] = double(a.live_total());
  grid_.world().all_reduce(mem, kChargeCount + 1, ReduceOp::max);
  grid_.world().all_reduce(live, kChargeCount + 1, ReduceOp::max);
  // GEMM FLOPs by operand dtype, summed over ranks (gemm.json).
  double gemm[3] = {kernels::gemm_flops(DType::f32), kernels::gemm_flops(DType::bf16),
                    kernels::gemm_flops(DType::f16)};
  grid_.world().all_reduce(gemm, 3, ReduceOp::sum);
  // The model-state formula of the largest rank (pipeline stages differ), for memory.json.
  double state_formula = trainer_.layout().model_state().total();
  grid_.world().all_reduce(&state_formula, 1, ReduceOp::max);
  if (!root_) return;
  write_memory_json(mem, live, state_formula);
  std::ofstream out(dir_ + "/gemm.json");
  out.precision(17);
  out << "{\"flops\": {\"f32\": " << gemm[0] << ", \"bf16\": " << gemm[1]
      << ", \"f16\": " << gemm[2] << "}}\n";
}

std::string Memory::summary(SummaryPart part) const {
  const double* mem = mem_.data();
  if (part == SummaryPart::activations)
    return activations_line(mem[int(Charge::activations)], trainer_.pipeline() != nullptr) +
           head_line();
  if (part != SummaryPart::state) return {};
  std::string out = formatted("\n%-12s %14s   (peak per rank, max over ranks)\n", "memory", "peak");
  for (int c = 0; c < kChargeCount; ++c)
    out += formatted("%-12s %14s\n", charge_name(Charge(c)), human_bytes(mem[c]).c_str());
  out += formatted("%-12s %14s\n", "total", human_bytes(mem[kChargeCount]).c_str());
  return out + model_state_line(live_.data());
}

std::string Memory::model_state_line(const double* live) const {
  // Model state (what ZeRO shards), held for the whole run: measured beside the formula
  // (RankLayout::model_state, which the check before allocation and the planner take too).
  // Routed experts held for this rank's expert-parallel group only (E/ep of them) are sharded
  // over N_e = N / ep ranks (at least 1) instead of N. Mixed precision keeps the fp32 state and
  // adds the 16-bit compute copy of the parameters: 2Psi held for the run below ZeRO-3; ZeRO-3
  // holds the copy of its shard (2Psi/N), which its gathers move, and each gathered part is
  // charged to communication buffers (doc/precision.md).
  const RankLayout& lay = trainer_.layout();
  const double measured =
      live[int(Charge::params)] + live[int(Charge::grads)] + live[int(Charge::optimizer)];
  std::string out = formatted(
      "model state  %14s   params + grads + optimizer; ZeRO-%d fp32 formula %s = %s "
      "(Psi = %.0f with padding, N = %lld)\n",
      human_bytes(measured).c_str(), lay.zero, model_state_formula(lay).c_str(),
      human_bytes(lay.model_state().total()).c_str(), lay.params, (long long)lay.shard_ranks);
  if (lay.expert_params > 0)
    out += formatted(
        "  of which routed experts: Psi_e = %.0f (%lld of %lld per block, ep %lld), N_e = %lld: "
        "the formula takes Psi_e/N_e for their Psi/N\n",
        lay.expert_params, (long long)(lay.model.moe.experts / lay.model.experts_held.size),
        (long long)lay.model.moe.experts, (long long)lay.model.experts_held.size,
        (long long)lay.expert_shard_ranks);
  return out;
}

void Memory::write_memory_json(const double* peak, const double* live,
                               double state_formula) const {
  std::ofstream out(dir_ + "/memory.json");
  out.precision(15);  // whole bytes: the tests compare them with formulas exactly
  auto table = [&](const double* v) {
    std::ostringstream o;
    o.precision(15);
    o << "{";
    for (int c = 0; c < kChargeCount; ++c)
      o << "\"" << charge_name(Charge(c)) << "\": " << v[c] << ", ";
    o << "\"total\": " << v[kChargeCount] << "}";
    return o.str();
  };
  out << "{\n  \"note\": \"bytes per rank, max over ranks; live at the end of the run, peak "
         "over it\",\n  \"zero\": "
      << trainer_.zero_stage() << ",\n  \"shard_ranks\": " << trainer_.shard_ranks()
      << ",\n  \"parameters\": " << trainer_.params().elements()
      << ",\n  \"parameters_padded\": " << trainer_.params().numel()
      << ",\n  \"ep\": " << trainer_.config().experts_held.size
      << ",\n  \"model_state_formula\": " << state_formula
      << ",\n  \"routed_expert_parameters\": " << routed_expert_elements()
      << ",\n  \"held_expert_parameters_padded\": " << held_expert_elements()
      << ",\n  \"activations_formula\": "
      << activation_bytes(trainer_.config(), trainer_.batch().micro_batch)
      << ",\n  \"recompute\": \"" << to_string(trainer_.config().recompute) << "\""
      << ",\n  \"activations_per_block\": " << per_block_json() << ",\n  \"live\": " << table(live)
      << ",\n  \"peak\": " << table(peak) << "\n}\n";
}

// Elements of the expert sections of this rank's store (held experts, padded; 0 without ep).
int64_t Memory::held_expert_elements() const {
  int64_t n = 0;
  for (const ParamPart& p : trainer_.params().parts()) n += p.experts;
  return n;
}

// Elements of the routed experts' parameters this rank registers (held or, at ep 1, all).
int64_t Memory::routed_expert_elements() const {
  int64_t n = 0;
  for (const Moe* m : trainer_.model().moe_layers()) n += m->routed_elements();
  return n;
}

// Bytes a first block of a chunk keeps per micro-batch under the run's recompute mode,
// without recompute, and the shared rebuilt set (perf/memory.hpp).
std::string Memory::per_block_json() const {
  const ModelConfig& c = trainer_.config();
  const int64_t b = trainer_.batch().micro_batch;
  std::ostringstream o;
  o << "{\"kept\": " << block_kept_bytes(c, b, c.block_recompute(0))
    << ", \"none\": " << activation_bytes_per_block(c, b)
    << ", \"rebuilt_set\": " << rebuilt_bytes(c, b);
  // A mixture-of-experts block (the first one of the model), beside the dense one.
  for (int64_t i = 0; i < c.layers; ++i)
    if (c.moe.is_moe(i)) {
      o << ", \"moe_kept\": " << block_kept_bytes(c, b, c.block_recompute(i), true)
        << ", \"moe_none\": " << block_kept_bytes(c, b, Recompute::none, true);
      break;
    }
  o << "}";
  return o.str();
}

// Activations per block and micro-batch under train.recompute (perf/memory.hpp, the
// Korthikanti-style terms of doc/recompute.md) beside the measured peak; without a pipeline
// the whole formula too (with one, `tessera-plan --runtime tessera` predicts each stage).
std::string Memory::activations_line(double measured, bool pipeline) const {
  const ModelConfig& c = trainer_.config();
  const int64_t b = trainer_.batch().micro_batch;
  const Recompute mode = c.block_recompute(0);
  std::string out = formatted(
      "activations  %14s   recompute %s: a block keeps %s per micro-batch (none: %s), "
      "rebuilt set %s",
      human_bytes(measured).c_str(), to_string(c.recompute),
      human_bytes(block_kept_bytes(c, b, mode)).c_str(),
      human_bytes(activation_bytes_per_block(c, b)).c_str(),
      human_bytes(rebuilt_bytes(c, b)).c_str());
  if (!pipeline) out += formatted("; formula %s", human_bytes(activation_bytes(c, b)).c_str());
  return out + "\n";
}

// The output head's chunks (train.head_chunk_rows) and vocabulary tiles (train.head_vocab_tile):
// the logits (fp32, and their 16-bit gradient in a 16-bit run) of one chunk, or of one tile of a
// chunk, are what the workspace holds, not a micro-batch's.
std::string Memory::head_line() const {
  const ModelConfig& c = trainer_.config();
  const int64_t N = trainer_.batch().micro_batch * c.seq_local(), H = c.head_rows(N);
  const int64_t Vl = c.vocab_local(), T = c.head_tile_cols();
  const double bytes = 4 + (trainer_.compute_dtype() == DType::f32 ? 0 : 2);
  const std::string tiles =
      T == 0 ? ""
             : formatted(", its vocabulary in tiles of %lld columns (logits made twice)",
                         (long long)T);
  return formatted(
      "output head: %lld rows per micro-batch in %lld chunks of %lld%s: logits held %s "
      "(a whole micro-batch's: %s)\n",
      (long long)N, (long long)((N + H - 1) / H), (long long)H, tiles.c_str(),
      human_bytes(bytes * double(T ? T : Vl) * double(H)).c_str(),
      human_bytes(bytes * double(Vl) * double(N)).c_str());
}

}  // namespace

std::unique_ptr<MemorySection> memory_section(const ReportInputs& in) {
  return std::make_unique<Memory>(in);
}

}  // namespace tessera
