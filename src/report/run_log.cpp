#include "report/run_log.hpp"

#include <omp.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "comm/agree.hpp"
#include "core/error.hpp"
#include "io/checkpoint_checks.hpp"
#include "kernels/kernels.hpp"
#include "perf/flops.hpp"
#include "perf/memory.hpp"
#include "perf/plan_compare.hpp"

namespace tessera {
namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", b, units[u]);
  return buf;
}

std::string human_duration(double s) {
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, int(s) % 3600 / 60);
  return buf;
}

// A number for JSON: NaN and Inf (a skipped non-finite step) have no JSON form, so null.
std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

// The room output.dir must have before step 1: the small files (run.json, memory.json) with a
// margin and a metrics line (about 400 bytes, rounded up) for each of the first
// kCheckedSteps steps. Not the whole of a long run: a disk that fills later stops the run at
// its next step (require_written).
constexpr double kMetricsLineBytes = 1024;
constexpr int64_t kCheckedSteps = 100000;
int64_t checked_steps(const RunConfig& run, int64_t steps_done) {
  return std::clamp<int64_t>(run.train.steps - steps_done, 0, kCheckedSteps);
}
double output_bytes(const RunConfig& run, int64_t steps_done) {
  return double(checked_steps(run, steps_done)) * kMetricsLineBytes + 1e6;
}

}  // namespace

RunLog::RunLog(const RunConfig& run, ProcessGrid& grid, Trainer& trainer, int64_t steps_done)
    : run_(run),
      grid_(grid),
      trainer_(trainer),
      root_(grid.world().rank() == 0),
      dir_(run.output.dir),
      log_every_(run.output.log_every),
      echo_(run.output.echo_deck),
      steps_done_(steps_done) {
  double peak = run.hardware.peak_flops;
  peak_source_ = "deck (hardware.peak_flops)";
  if (peak == 0) {
    // All ranks at once: what each gets while all run. The GEMM of the precision in use.
    const DType t = trainer.compute_dtype();
    peak = measure_gemm_flops(t);
    peak_source_ = std::string("measured ") + to_string(run.train.precision) + " GEMM rate";
  }
  peak_total_ = peak;
  grid_.world().all_reduce(&peak_total_, 1);
  const ModelConfig& c = trainer.config();
  const double tokens = double(trainer.batch().global_batch) * double(c.seq_len);
  flops_per_step_ = model_flops_per_token(c) * tokens;
  std::vector<int64_t> chunks = trainer.chunk_layers();
  if (chunks.empty()) chunks = {c.layers};  // no pipeline: the model is one chunk
  hardware_flops_per_step_ = flops_per_step_ + recompute_flops_per_token(c, chunks) * tokens;

  for (Group g : kAllGroups) monitored_.push_back(&grid_.group(g));
  for (const Communicator* c : trainer.own_groups()) monitored_.push_back(c);
  for (const Communicator* c : monitored_) comm_seen_.push_back(c->stats().seconds);
  comm_steady_.assign(monitored_.size(), 0.0);

  // Before step 1 (issue 19): output.dir can be created and written, and has room for what
  // the run writes there, so no step is trained for a log that cannot be kept.
  const double need = output_bytes(run, steps_done);
  collectively(grid_.world(), [&] {
    if (!root_) return;
    namespace fs = std::filesystem;
    std::error_code ec;
    const bool not_dir = fs::exists(dir_, ec) && !fs::is_directory(dir_, ec);
    if (!not_dir) fs::create_directories(dir_, ec);
    TESSERA_REQUIRE_LOCAL(!not_dir && !ec, "cannot create the output directory '", printable(dir_),
                          "' (output.dir): ",
                          not_dir ? std::string("it exists and is not a directory") : ec.message(),
                          "; choose another output.dir");
    const fs::space_info space = fs::space(dir_, ec);
    TESSERA_REQUIRE_LOCAL(ec || double(space.available) >= need, "the output directory '",
                          printable(dir_), "' has ", double(space.available) / 1e6,
                          " MB free, but this run writes about ", need / 1e6,
                          " MB there before its step ", steps_done + checked_steps(run, steps_done),
                          " (metrics.jsonl, run.json, memory.json); free space or choose "
                          "another output.dir");
    // Last: a run refused above leaves an existing metrics.jsonl as it was.
    const std::string path = dir_ + "/metrics.jsonl";
    metrics_ = std::fopen(path.c_str(), steps_done > 0 ? "a" : "w");
    TESSERA_REQUIRE_LOCAL(metrics_ != nullptr, "cannot write '", printable(path),
                          "' (output.dir): ", std::strerror(errno ? errno : EIO),
                          "; choose a writable output.dir");
  });
}

RunLog::~RunLog() {
  if (metrics_) std::fclose(metrics_);
}

void RunLog::start() {
  if (!root_) return;
  const ModelConfig& c = trainer_.config();
  const BatchGeometry& g = trainer_.batch();
  if (echo_)
    std::printf("# resolved input deck (%s)\n%s\n", run_.origin().c_str(), run_.to_ini().c_str());
  std::printf("%s\n", grid_.describe().c_str());
  std::printf(
      "model: %s, %lld layers, d_model %lld, heads %lld/%lld, ffn %lld, vocab %lld (padded %lld), "
      "seq %lld, %.3fM parameters\n",
      c.arch_name(), (long long)c.layers, (long long)c.d_model, (long long)c.heads,
      (long long)c.kv_heads, (long long)c.ffn_hidden, (long long)c.vocab, (long long)c.vocab_padded,
      (long long)c.seq_len, double(c.param_count()) / 1e6);
  std::printf(
      "batch: %lld sequences/step = micro-batch %lld x accumulation %lld x dp %lld; "
      "%d thread(s)/rank\n",
      (long long)g.global_batch, (long long)g.micro_batch, (long long)g.accum, (long long)g.dp,
      omp_get_max_threads());
  if (const pp::Executor* pipe = trainer_.pipeline()) {
    // The cut, before any step: blocks per model chunk and which stage runs each.
    const pp::ScheduleShape& sh = pipe->shape();
    std::string cut;
    int64_t first = 0;
    for (size_t k = 0; k < trainer_.chunk_layers().size(); ++k) {
      const int64_t n = trainer_.chunk_layers()[k];
      cut += cat(k ? ", " : "", "[", first, "-", first + n - 1, "]@", sh.stage_of(int(k)));
      first += n;
    }
    std::printf(
        "pipeline: %s, %d stages x %d chunk(s), %d micro-batches; layers (%s) per model "
        "chunk [first-last]@stage: %s; embedding on stage 0, head on stage %d\n",
        to_string(sh.kind), sh.stages, sh.chunks, sh.micro_batches, run_.parallel.pp_layers.c_str(),
        cut.c_str(), sh.stages - 1);
  }
  std::printf("peak for MFU: %.1f GFLOP/s over %d rank(s), %s; model %.3f GFLOP/step\n",
              peak_total_ / 1e9, grid_.world().size(), peak_source_.c_str(), flops_per_step_ / 1e9);
  if (hardware_flops_per_step_ > flops_per_step_)
    std::printf("recompute %s: hardware %.3f GFLOP/step (HFU counts the rerun forward work)\n",
                to_string(c.recompute), hardware_flops_per_step_ / 1e9);
  std::fflush(stdout);

  std::ofstream run(dir_ + "/run.json");
  run << "{\n  \"deck\": " << run_.to_json() << ",\n  \"layout\": " << trainer_.layout_json()
      << ",\n  \"nodes\": " << grid_.nodes()
      << ",\n  \"model\": {\"parameters\": " << c.param_count()
      << ", \"flops_per_token\": " << model_flops_per_token(c) << ", \"hardware_flops_per_token\": "
      << hardware_flops_per_step_ / (double(g.global_batch) * double(c.seq_len))
      << ", \"ffn_hidden\": " << c.ffn_hidden << ", \"vocab_padded\": " << c.vocab_padded
      << "},\n  \"batch\": {\"global\": " << g.global_batch << ", \"micro\": " << g.micro_batch
      << ", \"accumulation\": " << g.accum << "},\n  \"peak_flops\": {\"total\": " << peak_total_
      << ", \"source\": \"" << peak_source_
      << "\"},\n  \"threads_per_rank\": " << omp_get_max_threads()
      << ",\n  \"version\": \"" TESSERA_VERSION "\"\n}\n";
}

void RunLog::step(const StepResult& r) {
  // Every rank measures its own step; the slowest decides the step time. Data-parallel
  // all-reduce: the last rank to end backward waits in finish() only for what overlap did
  // not hide, the others also for that rank, so exposed and in flight are minima over ranks
  // and the longest wait (skew included) is reported apart; posting and polling are maxima.
  // Phase seconds since the previous record follow (max over ranks).
  const DpSyncTiming& dp = trainer_.data_parallel().last_sync();
  double m[8 + kPhaseCount] = {r.seconds,
                               -dp.in_flight,
                               -dp.exposed,
                               dp.exposed,
                               dp.posting,
                               dp.polling,
                               double(trainer_.allocator().peak_total())};
  for (int p = 0; p < kPhaseCount; ++p) {
    const double now = trainer_.timer().seconds(Phase(p));
    m[7 + p] = now - phase_seen_[p], phase_seen_[p] = now;
  }
  m[7 + kPhaseCount] = double(write_errno_);  // the previous step's metrics write
  grid_.world().all_reduce(m, 8 + kPhaseCount, ReduceOp::max);
  require_written(m[7 + kPhaseCount]);
  const double seconds = m[0];
  DpSyncTiming dp_step = dp;
  dp_step.in_flight = -m[1], dp_step.exposed = -m[2], dp_step.posting = m[4];
  dp_step.polling = m[5];
  const double waited = m[3], mem_peak = m[6];
  elapsed_ += seconds;
  // The first step of a run allocates and warms up; it is left out of the steady state.
  const bool first = r.step == steps_done_ + 1;
  if (!first) steady_elapsed_ += seconds, ++steady_steps_;
  if (!first) dp_steady_ += dp_step, dp_waited_steady_ += waited;
  if (const pp::Executor* pipe = trainer_.pipeline(); pipe && !first)
    pp_wait_steady_ += pipe->last_wait(), pp_compute_steady_ += pipe->last_compute();
  dp_all_ += dp_step, dp_waited_all_ += waited;
  // Communication monitor: this step's seconds in each group's collectives, mean over ranks.
  std::vector<double> comm(monitored_.size());
  for (size_t i = 0; i < comm.size(); ++i) {
    const double now = monitored_[i]->stats().seconds;
    comm[i] = now - comm_seen_[i], comm_seen_[i] = now;
  }
  if (!comm.empty()) grid_.world().all_reduce(comm.data(), int64_t(comm.size()));
  if (!first)
    for (size_t i = 0; i < comm.size(); ++i)
      comm_steady_[i] += comm[i] / double(grid_.world().size());
  if (first) first_loss_ = r.loss;
  last_loss_ = r.loss, last_step_ = r.step;
  gather_moe();
  if (!root_) return;
  const double tokens = double(trainer_.batch().global_batch * trainer_.config().seq_len);
  const double mfu = flops_per_step_ / (seconds * peak_total_);
  const double mean = steady_steps_ ? steady_elapsed_ / double(steady_steps_) : seconds;
  const double eta = mean * double(trainer_.steps() - r.step);
  if (r.step % log_every_ == 0 || r.step == trainer_.steps() || first || r.val_loss >= 0) {
    char val[32] = "";
    if (r.val_loss >= 0) std::snprintf(val, sizeof val, " | val %.4f", r.val_loss);
    char scale[64] = "";
    if (trainer_.loss_scaler().dynamic)
      std::snprintf(scale, sizeof scale, " | scale %g%s", r.loss_scale,
                    r.skipped ? " (overflow: skipped)" : "");
    char comm_note[96] = "";
    const double warn = run_.output.comm_warn_share;
    if (const auto [share, g] = comm_share(); warn > 0 && steady_steps_ > 0 && share > warn)
      std::snprintf(comm_note, sizeof comm_note, " | comm %.0f%% > %.0f%% (%s)", 100 * share,
                    100 * warn, monitored_name(g).c_str());
    std::printf(
        "step %6lld/%lld | loss %.4f%s | lr %.3e | grad-norm %.3f | %9.0f tok/s | "
        "MFU %5.1f%% | %6.0f ms | ETA %s%s%s\n",
        (long long)r.step, (long long)trainer_.steps(), r.loss, val, r.lr, r.grad_norm,
        tokens / seconds, 100 * mfu, 1e3 * seconds, human_duration(eta).c_str(), scale, comm_note);
    std::fflush(stdout);
  }
  char val[48] = "";
  if (r.val_loss >= 0) std::snprintf(val, sizeof val, ", \"val_loss\": %.9g", r.val_loss);
  char dpt[224] = "";
  if (dp_step.buckets > 0)
    std::snprintf(dpt, sizeof dpt,
                  ", \"dp_in_flight\": %.6g, \"dp_exposed\": %.6g, \"dp_waited\": %.6g, "
                  "\"dp_posting\": %.6g, \"dp_polling\": %.6g, \"dp_bytes\": %lld",
                  dp_step.in_flight, dp_step.exposed, waited, dp_step.posting, dp_step.polling,
                  (long long)dp_step.bytes);
  std::string phases;
  for (int p = 0; p < kPhaseCount; ++p) {
    std::string name = phase_name(Phase(p));
    std::replace(name.begin(), name.end(), ' ', '_');
    char one[64];
    std::snprintf(one, sizeof one, "%s\"%s\": %.6g", p ? ", " : "", name.c_str(), m[7 + p]);
    phases += one;
  }
  char scale[96] = "";
  if (trainer_.loss_scaler().dynamic)
    std::snprintf(scale, sizeof scale, ", \"loss_scale\": %.9g, \"skipped\": %s", r.loss_scale,
                  r.skipped ? "true" : "false");
  const std::string moe = moe_json();
  std::fprintf(metrics_,
               "{\"step\": %lld, \"loss\": %s, \"lr\": %.9g, \"grad_norm\": %s, "
               "\"step_time\": %.6g, \"tokens_per_s\": %.6g, \"mfu\": %.6g, \"hfu\": %.6g, "
               "\"mem_peak_bytes\": %.0f%s%s%s%s, \"phase_max_s\": {%s}}\n",
               (long long)r.step, json_number(r.loss).c_str(), r.lr,
               json_number(r.grad_norm).c_str(), seconds, tokens / seconds, mfu,
               hardware_flops_per_step_ / (seconds * peak_total_), mem_peak, val, dpt, scale,
               moe.c_str(), phases.c_str());
  if ((std::fflush(metrics_) != 0 || std::ferror(metrics_)) && !write_errno_)
    write_errno_ = errno ? errno : EIO;
}

void RunLog::gather_moe() {
  const ModelConfig& c = trainer_.config();
  if (!c.moe.enabled()) return;
  // One row of K numbers per layer: whether this stage holds its MoE block, then its figures.
  // Each block sits on one stage, so the sum over the pp group is that stage's row.
  constexpr int K = 12;
  std::vector<double> rows(size_t(c.layers * K), 0.0);
  for (const Moe* m : trainer_.model().moe_layers()) {
    const Moe::Stats& s = m->last();
    const int64_t layer = std::stoll(m->name().substr(m->name().find('.') + 1));
    double* r = rows.data() + layer * K;
    const double v[K] = {1.0,
                         m->imbalance(),
                         s.dropped,
                         s.tokens * double(c.moe.top_k),
                         s.sequences > 0 ? s.aux / s.sequences : 0.0,
                         s.tokens > 0 ? s.z / s.tokens : 0.0,
                         double(s.bias_min),
                         double(s.bias_max),
                         s.cross_bytes,
                         s.cross_bytes_free,
                         s.run_cross_bytes,
                         s.run_cross_bytes_free};
    std::copy(v, v + K, r);
  }
  grid_.group(Group::pp).all_reduce(rows.data(), int64_t(rows.size()));
  moe_rows_.clear();
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    const double* r = rows.data() + layer * K;
    if (r[0] == 0) continue;
    moe_rows_.push_back({"layers." + std::to_string(layer) + ".moe", r[1], r[2], r[3], r[4], r[5],
                         r[6], r[7], r[8], r[9], r[10], r[11]});
  }
}

// Mixture of experts: total and active parameters, and the last step's routing per block.
void RunLog::print_moe() const {
  const ModelConfig& c = trainer_.config();
  if (!c.moe.enabled()) return;
  std::printf("mixture of experts: %lld parameters, %lld active per token (%lld blocks of %lld "
              "routed experts, top %lld, %lld shared; ep %d)\n",
              (long long)c.param_count(), (long long)c.active_param_count(),
              (long long)c.moe_blocks(), (long long)c.moe.experts, (long long)c.moe.top_k,
              (long long)c.moe.shared, grid_.group(Group::ep).size());
  for (const MoeRow& m : moe_rows_)
    std::printf("  %-16s tokens per expert max/mean %.3f, dropped %.0f of %.0f, balancing loss "
                "%.4g, z %.4g, selection bias [%.4g, %.4g]   (last step)\n",
                m.name.c_str(), m.imbalance, m.dropped, m.routed, m.aux, m.z, m.bias_min,
                m.bias_max);
  if (c.moe.placed_nodes <= 1) return;
  double sent = 0, unrestricted = 0;
  for (const MoeRow& m : moe_rows_) sent += m.run_cross, unrestricted += m.run_cross_free;
  std::printf(
      "  cross-node dispatch %.4g MB, unrestricted routing would send %.4g MB (%.3f of "
      "it; ep_max_nodes %lld of %lld nodes; the whole run, this tp rank's tokens)\n",
      sent / 1e6, unrestricted / 1e6, unrestricted > 0 ? sent / unrestricted : 0.0,
      (long long)c.moe.max_nodes, (long long)c.moe.nodes);
}

// The last step's routing of every mixture-of-experts block (doc/moe.md), as a metrics.jsonl
// field; empty for a dense model.
std::string RunLog::moe_json() const {
  std::string out;
  for (const MoeRow& m : moe_rows_) {
    char one[480];
    std::snprintf(one, sizeof one,
                  "%s{\"layer\": \"%s\", \"max_over_mean\": %.6g, \"dropped\": %.0f, "
                  "\"routed\": %.0f, \"aux\": %.6g, \"z\": %.6g, \"bias_min\": %.6g, "
                  "\"bias_max\": %.6g, \"cross_node_bytes\": %.0f, "
                  "\"cross_node_bytes_unrestricted\": %.0f}",
                  out.empty() ? "" : ", ", m.name.c_str(), m.imbalance, m.dropped, m.routed, m.aux,
                  m.z, m.bias_min, m.bias_max, m.cross, m.cross_free);
    out += one;
  }
  return out.empty() ? out : ", \"moe\": [" + out + "]";
}

// The data-parallel gradients are reduced over dp_cp (the data- and context-parallel ranks);
// without context parallelism that group is the dp group, and is called so.
std::string RunLog::monitored_name(size_t i) const {
  const std::string& name = monitored_[i]->name();
  return name == "dp_cp" && grid_.group(Group::cp).size() == 1 ? "dp" : name;
}

std::pair<double, size_t> RunLog::comm_share() const {
  double total = 0;
  size_t top = 0;
  for (size_t i = 0; i < comm_steady_.size(); ++i) {
    total += comm_steady_[i];
    if (comm_steady_[i] > comm_steady_[top]) top = i;
  }
  return {steady_elapsed_ > 0 ? total / steady_elapsed_ : 0.0, top};
}

// The summary's line of the communication monitor: the share, and above the threshold the
// dominant group with what usually lowers its time (seed 002: fix the layout, not the code).
void RunLog::print_comm_monitor() const {
  const double warn = run_.output.comm_warn_share;
  if (steady_steps_ == 0) {
    std::printf("communication: no steady-state step (the first step of a run is warm-up)\n");
    return;
  }
  const auto [share, top] = comm_share();
  const std::string name = comm_steady_.empty() ? "" : monitored_name(top);
  if (warn <= 0 || share <= warn) {
    std::printf(
        "communication: %.1f%% of the steady-state step time in collectives (mean over "
        "ranks, world excluded); the warning is above %.0f%% (output.comm_warn_share)\n",
        100 * share, 100 * warn);
    return;
  }
  std::string advice = "";
  if (name == "tp")
    advice =
        "tensor parallelism reduces every layer's activations: keep parallel.tp within "
        "a node, or lower it";
  else if (name == "pp")
    advice =
        "pipeline messages and the waits of the bubble: more micro-batches per step or "
        "fewer stages";
  else if (name == "dp" || name == "dp_cp" || name == "edp" || name == "embedding")
    advice =
        "the gradient reduction: more micro-batches per step (train.global_batch), fewer "
        "data-parallel ranks, or parallel.grad_reduce_dtype = bf16";
  else
    advice = "see the traffic table above";
  std::printf(
      "communication: WARNING: %.1f%% of the steady-state step time in collectives "
      "(mean over ranks, world excluded), above output.comm_warn_share = %.0f%%; the "
      "%s group dominates (%.3f s of %.3f s over %lld steady steps): %s\n",
      100 * share, 100 * warn, name.c_str(), comm_steady_[top], share * steady_elapsed_,
      (long long)steady_steps_, advice.c_str());
}

void RunLog::require_written(double write_errno) const {
  TESSERA_REQUIRE(write_errno == 0, "cannot write '", dir_,
                  "/metrics.jsonl' (output.dir): ", std::strerror(int(write_errno)),
                  "; the run stops (free space, or choose "
                  "another output.dir)");
}

void RunLog::write_memory_json(const double* peak, const double* live) const {
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
      << ",\n  \"routed_expert_parameters\": " << routed_expert_elements()
      << ",\n  \"held_expert_parameters_padded\": " << held_expert_elements()
      << ",\n  \"activations_formula\": "
      << activation_bytes(trainer_.config(), trainer_.batch().micro_batch)
      << ",\n  \"recompute\": \"" << to_string(trainer_.config().recompute) << "\""
      << ",\n  \"activations_per_block\": " << per_block_json() << ",\n  \"live\": " << table(live)
      << ",\n  \"peak\": " << table(peak) << "\n}\n";
}

// Elements of the expert sections of this rank's store (held experts, padded; 0 without ep).
int64_t RunLog::held_expert_elements() const {
  int64_t n = 0;
  for (const ParamPart& p : trainer_.params().parts()) n += p.experts;
  return n;
}

// Elements of the routed experts' parameters this rank registers (held or, at ep 1, all).
int64_t RunLog::routed_expert_elements() const {
  int64_t n = 0;
  for (Param* p : trainer_.params().params())
    if (p->name.find(".moe.experts.") != std::string::npos) n += p->local.numel();
  return n;
}

// Bytes a first block of a chunk keeps per micro-batch under the run's recompute mode,
// without recompute, and the shared rebuilt set (perf/memory.hpp).
std::string RunLog::per_block_json() const {
  const ModelConfig& c = trainer_.config();
  const int64_t b = trainer_.batch().micro_batch;
  std::ostringstream o;
  o << "{\"kept\": " << block_kept_bytes(c, b, c.block_recompute(0))
    << ", \"none\": " << activation_bytes_per_block(c, b)
    << ", \"rebuilt_set\": " << rebuilt_bytes(c, b) << "}";
  return o.str();
}

// Activations per block and micro-batch under train.recompute (perf/memory.hpp, the
// Korthikanti-style terms of doc/recompute.md) beside the measured peak; without a pipeline
// the whole formula too (with one, `tessera-plan --runtime tessera` predicts each stage).
void RunLog::print_activations(double measured, bool pipeline) const {
  const ModelConfig& c = trainer_.config();
  const int64_t b = trainer_.batch().micro_batch;
  const Recompute mode = c.block_recompute(0);
  std::printf(
      "activations  %14s   recompute %s: a block keeps %s per micro-batch (none: %s), "
      "rebuilt set %s",
      human_bytes(measured).c_str(), to_string(c.recompute),
      human_bytes(block_kept_bytes(c, b, mode)).c_str(),
      human_bytes(activation_bytes_per_block(c, b)).c_str(),
      human_bytes(rebuilt_bytes(c, b)).c_str());
  if (!pipeline) std::printf("; formula %s", human_bytes(activation_bytes(c, b)).c_str());
  std::printf("\n");
}

// The output head's chunks (train.head_chunk_rows): the logits (fp32, and their 16-bit gradient
// in a 16-bit run) of one chunk are what the workspace holds, not a micro-batch's.
void RunLog::print_head() const {
  const ModelConfig& c = trainer_.config();
  const int64_t N = trainer_.batch().micro_batch * c.seq_local(), H = c.head_rows(N);
  const double row =
      double(c.vocab_local()) * (4 + (trainer_.compute_dtype() == DType::f32 ? 0 : 2));
  std::printf("output head: %lld rows per micro-batch in %lld chunks of %lld: logits held %s "
              "(a whole micro-batch's: %s)\n",
              (long long)N, (long long)((N + H - 1) / H), (long long)H,
              human_bytes(row * double(H)).c_str(), human_bytes(row * double(N)).c_str());
}

void RunLog::finish() {
  const PhaseTimer& t = trainer_.timer();
  // Phase times: mean and max over ranks.
  double phase_max[kPhaseCount + 1], phase_sum[kPhaseCount];
  for (int p = 0; p < kPhaseCount; ++p) phase_max[p] = phase_sum[p] = t.seconds(Phase(p));
  phase_max[kPhaseCount] = double(write_errno_);  // the last step's metrics write
  grid_.world().all_reduce(phase_max, kPhaseCount + 1, ReduceOp::max);
  require_written(phase_max[kPhaseCount]);
  grid_.world().all_reduce(phase_sum, kPhaseCount, ReduceOp::sum);
  const Allocator& a = trainer_.allocator();
  // Peak and live bytes per category, then the totals: max over ranks.
  double mem[kChargeCount + 1], live[kChargeCount + 1];
  for (int c = 0; c < kChargeCount; ++c)
    mem[c] = double(a.peak(Charge(c))), live[c] = double(a.live(Charge(c)));
  mem[kChargeCount] = double(a.peak_total());
  live[kChargeCount] = double(a.live_total());
  grid_.world().all_reduce(mem, kChargeCount + 1, ReduceOp::max);
  grid_.world().all_reduce(live, kChargeCount + 1, ReduceOp::max);
  // Pipeline bubble per rank: seconds blocked in receive waits (idle) and in its forward and
  // backward passes (compute), over the steady steps (all steps when there is only one).
  const pp::Executor* pipe = trainer_.pipeline();
  std::vector<double> bubble(pipe ? 2 * size_t(grid_.world().size()) : 0, 0.0);
  if (pipe) {
    const size_t r = size_t(grid_.world().rank());
    bubble[2 * r] = steady_steps_ ? pp_wait_steady_ : pipe->total_wait();
    bubble[2 * r + 1] = steady_steps_ ? pp_compute_steady_ : pipe->total_compute();
    grid_.world().all_reduce(bubble.data(), int64_t(bubble.size()));
  }
  // GEMM FLOPs by operand dtype, summed over ranks (gemm.json).
  double gemm[3] = {kernels::gemm_flops(DType::f32), kernels::gemm_flops(DType::bf16),
                    kernels::gemm_flops(DType::f16)};
  grid_.world().all_reduce(gemm, 3, ReduceOp::sum);
  if (!root_) return;
  write_memory_json(mem, live);
  {
    std::ofstream out(dir_ + "/gemm.json");
    out.precision(17);
    out << "{\"flops\": {\"f32\": " << gemm[0] << ", \"bf16\": " << gemm[1]
        << ", \"f16\": " << gemm[2] << "}}\n";
  }
  std::ofstream(dir_ + "/traffic.json") << grid_.traffic_json(trainer_.own_groups());

  const int n = grid_.world().size();
  double total = 0;
  for (int p = 0; p < kPhaseCount; ++p) total += phase_sum[p] / n;
  std::printf("\n== summary ==\n");
  std::printf("loss %.4f -> %.4f over steps %lld..%lld in %s\n", first_loss_, last_loss_,
              (long long)steps_done_ + 1, (long long)last_step_, human_duration(elapsed_).c_str());
  if (steady_steps_ > 0) {
    const double mean = steady_elapsed_ / double(steady_steps_);
    const double tokens = double(trainer_.batch().global_batch * trainer_.config().seq_len);
    std::printf("steady state (steps %lld..%lld): %.1f ms/step, %.0f tokens/s, MFU %.1f%% of %s\n",
                (long long)steps_done_ + 2, (long long)last_step_, 1e3 * mean, tokens / mean,
                100 * flops_per_step_ / (mean * peak_total_), peak_source_.c_str());
    if (hardware_flops_per_step_ > flops_per_step_)
      std::printf(
          "HFU %.1f%% (recompute %s reruns forward work: %.3f hardware vs %.3f model "
          "GFLOP/step)\n",
          100 * hardware_flops_per_step_ / (mean * peak_total_),
          to_string(trainer_.config().recompute), hardware_flops_per_step_ / 1e9,
          flops_per_step_ / 1e9);
  }
  std::printf("\n%-12s %12s %12s %8s\n", "phase", "mean s", "max s", "share");
  for (int p = 0; p < kPhaseCount; ++p)
    std::printf("%-12s %12.3f %12.3f %7.1f%%\n", phase_name(Phase(p)), phase_sum[p] / n,
                phase_max[p], 100 * phase_sum[p] / n / std::max(total, 1e-12));
  std::printf("\n%-12s %14s   (peak per rank, max over ranks)\n", "memory", "peak");
  for (int c = 0; c < kChargeCount; ++c)
    std::printf("%-12s %14s\n", charge_name(Charge(c)), human_bytes(mem[c]).c_str());
  std::printf("%-12s %14s\n", "total", human_bytes(mem[kChargeCount]).c_str());
  // Model state (what ZeRO shards), held for the whole run: measured beside the formula.
  const int stage = trainer_.zero_stage();
  const double psi = double(trainer_.params().numel());
  // Routed experts held for this rank's expert-parallel group only (E/ep of them) are sharded
  // over N_e = N / ep ranks (at least 1) instead of N.
  const double held = double(held_expert_elements()),
               ep = double(trainer_.config().experts_held.size);
  const double n_e = stage == 0 ? 1 : std::max(1.0, double(trainer_.shard_ranks()) / ep);
  const ModelStateBytes dense =
      zero_model_state(stage, psi - held, double(trainer_.shard_ranks()), Precision::fp32);
  const ModelStateBytes experts = zero_model_state(stage, held, n_e, Precision::fp32);
  const ModelStateBytes f{dense.params + experts.params, dense.grads + experts.grads,
                          dense.optimizer + experts.optimizer};
  const double measured =
      live[int(Charge::params)] + live[int(Charge::grads)] + live[int(Charge::optimizer)];
  // Mixed precision keeps the fp32 state and adds the 16-bit compute copy of the parameters:
  // 2Psi held for the run below ZeRO-3; ZeRO-3 holds the copy of its shard (2Psi/N), which
  // its gathers move, and each gathered part is charged to communication buffers
  // (doc/precision.md).
  const bool copy = trainer_.compute_dtype() != DType::f32;
  const double copy_bytes = !copy ? 0 : stage < 3 ? 2 * psi : 2 * psi / double(trainer_.shard_ranks());
  std::printf(
      "model state  %14s   params + grads + optimizer; ZeRO-%d fp32 formula %s%s = %s "
      "(Psi = %.0f with padding, N = %lld)\n",
      human_bytes(measured).c_str(), stage, zero_formula(stage, Precision::fp32),
      copy ? (std::string(" + ") + dtype_name(trainer_.compute_dtype()) + " compute copy 2Psi" +
              (stage < 3 ? "" : "/N"))
                 .c_str()
           : "",
      human_bytes(f.total() + copy_bytes).c_str(), psi, (long long)trainer_.shard_ranks());
  if (held > 0)
    std::printf(
        "  of which routed experts: Psi_e = %.0f (%lld of %lld per block, ep %.0f), N_e = %.0f: "
        "the formula takes Psi_e/N_e for their Psi/N\n",
        held, (long long)(trainer_.config().moe.experts / trainer_.config().experts_held.size),
        (long long)trainer_.config().moe.experts, ep, n_e);
  if (const LossScaler& ls = trainer_.loss_scaler(); ls.dynamic)
    std::printf("fp16 loss scaling: %lld steps skipped on overflow, scale now %g\n",
                (long long)ls.skipped, ls.scale);
  print_moe();
  print_activations(mem[int(Charge::activations)], pipe != nullptr);
  print_head();
  std::printf("\n%s", grid_.traffic_table(trainer_.own_groups()).c_str());
  std::printf("%s", trainer_.data_parallel().summary().c_str());
  if (const ContextParallel& cp = trainer_.config().cp; cp.size > 1 && cp.kind == CpKind::ring) {
    const OverlapTiming& t = trainer_.cp_timing();
    std::printf("cp ring: %lld K/V and dK/dV transfers, in flight %.1f ms, exposed %.1f ms "
                "(hidden %.0f%% behind attention; rank 0, all steps)\n",
                (long long)t.transfers, 1e3 * t.in_flight, 1e3 * t.exposed,
                100 * std::max(0.0, 1 - t.exposed / std::max(t.in_flight, 1e-12)));
  }
  print_comm_monitor();
  if (pipe) {
    const pp::ScheduleShape& sh = pipe->shape();
    const pp::Ratio f = pp::bubble_formula(sh);
    std::printf(
        "pipeline: %s, %d stages x %d chunks, %d micro-batches; bubble = idle / compute "
        "(idle: blocked in receive waits, %s), formula %s = %lld/%lld = %.3f\n",
        to_string(sh.kind), sh.stages, sh.chunks, sh.micro_batches,
        steady_steps_ ? "steady steps" : "all steps", pp::bubble_formula_text(sh.kind),
        (long long)f.num, (long long)f.den, double(f.num) / double(f.den));
    for (int r = 0; r < n; ++r)
      std::printf("  rank %d (stage %d): idle %.3f s, compute %.3f s, bubble %.3f\n", r,
                  grid_.layout().coord(r).pp, bubble[2 * size_t(r)], bubble[2 * size_t(r) + 1],
                  bubble[2 * size_t(r)] / std::max(1e-12, bubble[2 * size_t(r) + 1]));
  }
  if (run_.output.compare_plan) {
    const BatchGeometry& g = trainer_.batch();
    RunFacts f{
        trainer_.config(),           g.micro_batch,   g.global_batch,   n, trainer_.zero_stage(),
        int(trainer_.shard_ranks()), peak_total_ / n, steady_steps_ + 1};
    f.zero_inflight = run_.parallel.zero_inflight;
    f.pp = run_.parallel.pp, f.pp_virtual = run_.parallel.pp_virtual;
    f.ep = run_.parallel.ep;
    f.schedule = run_.parallel.pp_schedule;
    f.pp_layers = run_.parallel.pp_layers;
    f.precision = run_.train.precision;
    f.grad_reduce = run_.parallel.grad_reduce_dtype;
    for (size_t i = 0; i < 6; ++i) f.phase_seconds[i] = phase_sum[i] / n, f.memory_peak[i] = mem[i];
    std::printf("%s", plan_comparison(f).c_str());
  }
  const bool steady = dp_steady_.buckets > 0;
  const DpSyncTiming& d = steady ? dp_steady_ : dp_all_;
  if (d.buckets > 0) {
    // Per step (see step()). With progress = none nothing tests the buckets during backward,
    // so "in flight" is posted-to-seen time, not transfer time: compare exposed with a run
    // with parallel.overlap = false instead (doc/performance.md).
    const double steps = double(steady ? steady_steps_ : steady_steps_ + 1);
    const DataParallel& dp = trainer_.data_parallel();
    const double hidden = d.in_flight - d.exposed - d.posting - d.polling;
    char share[32] = "not measured";  // progress = none
    if (dp.sync_hidden_measured())
      std::snprintf(share, sizeof share, "%.0f%%",
                    100 * std::max(0.0, hidden) / std::max(d.in_flight, 1e-12));
    const double waited = steady ? dp_waited_steady_ : dp_waited_all_;
    std::printf(
        "dp gradient all-reduce per step (%s): %.0f buckets, %.1f MB, in flight %.1f ms, "
        "exposed %.1f ms + posting %.1f ms + polling %.1f ms (hidden %s); longest wait "
        "%.1f ms (with skew); %s\n",
        steady ? "steady state" : "all steps", double(d.buckets) / steps,
        double(d.bytes) / steps / 1e6, 1e3 * d.in_flight / steps, 1e3 * d.exposed / steps,
        1e3 * d.posting / steps, 1e3 * d.polling / steps, share, 1e3 * waited / steps,
        dp.sync_settings().c_str());
  }
  std::fflush(stdout);
}

}  // namespace tessera
