#include "report/run_log.hpp"

#include <omp.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "comm/agree.hpp"
#include "core/error.hpp"
#include "io/checkpoint_checks.hpp"
#include "perf/flops.hpp"
#include "report/text.hpp"

namespace tessera {
namespace {

// data.document_mask: the model FLOPs stay the unmasked formula (attention 12 L T H D per
// token over the whole sample, as Megatron-LM counts it); the masked tiles the kernels skip are
// not subtracted, so short documents raise MFU (doc/data.md, "Document masks").
constexpr const char* kDocumentFlops = " (document masks: attention FLOPs counted unmasked)";

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
      times_{steps_done} {
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

  sections_ = report_sections({run_, grid_, trainer_, times_}, &memory_);

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
  for (const auto& s : sections_) std::printf("%s", s->start().c_str());
  std::printf("peak for MFU: %.1f GFLOP/s over %d rank(s), %s; model %.3f GFLOP/step%s\n",
              peak_total_ / 1e9, grid_.world().size(), peak_source_.c_str(), flops_per_step_ / 1e9,
              run_.data.document_mask ? kDocumentFlops : "");
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
      << "\"},\n  \"threads_per_rank\": " << omp_get_max_threads();
  for (const auto& s : sections_) run << s->run_json();
  run << ",\n  \"version\": \"" TESSERA_VERSION "\"\n}\n";
}

void RunLog::step(const StepResult& r) {
  // Every rank measures its own step; the slowest decides the step time. Phase seconds since
  // the previous record follow, then the numbers the sections ask for: max over ranks, in
  // one all-reduce.
  std::vector<double> m = {r.seconds, double(trainer_.allocator().peak_total())};
  for (int p = 0; p < kPhaseCount; ++p) {
    const double now = trainer_.timer().seconds(Phase(p));
    m.push_back(now - phase_seen_[p]), phase_seen_[p] = now;
  }
  m.push_back(double(write_errno_));  // the previous step's metrics write
  const size_t written = m.size() - 1;
  std::vector<size_t> at;  // where each section's numbers start
  for (const auto& s : sections_) at.push_back(m.size()), s->step_max(m);
  grid_.world().all_reduce(m.data(), int64_t(m.size()), ReduceOp::max);
  require_written(m[written]);
  const double seconds = m[0], mem_peak = m[1];
  const double* phase = m.data() + 2;
  elapsed_ += seconds;
  // The first step of a run allocates and warms up; it is left out of the steady state.
  const bool first = times_.first(r);
  if (!first) times_.steady_seconds += seconds, ++times_.steady_steps;
  for (size_t i = 0; i < sections_.size(); ++i) sections_[i]->step(r, m.data() + at[i]);
  if (first) first_loss_ = r.loss;
  last_loss_ = r.loss, last_step_ = r.step;
  if (!root_) return;
  const double tokens = double(trainer_.batch().global_batch * trainer_.config().seq_len);
  const double mfu = flops_per_step_ / (seconds * peak_total_);
  const double mean =
      times_.steady_steps ? times_.steady_seconds / double(times_.steady_steps) : seconds;
  const double eta = mean * double(trainer_.steps() - r.step);
  if (r.step % log_every_ == 0 || r.step == trainer_.steps() || first || r.val_loss >= 0) {
    char val[32] = "";
    if (r.val_loss >= 0) std::snprintf(val, sizeof val, " | val %.4f", r.val_loss);
    std::string notes;
    for (const auto& s : sections_) notes += s->progress(r);
    std::printf(
        "step %6lld/%lld | loss %.4f%s | lr %.3e | grad-norm %.3f | %9.0f tok/s | "
        "MFU %5.1f%% | %6.0f ms | ETA %s%s\n",
        (long long)r.step, (long long)trainer_.steps(), r.loss, val, r.lr, r.grad_norm,
        tokens / seconds, 100 * mfu, 1e3 * seconds, human_duration(eta).c_str(), notes.c_str());
    std::fflush(stdout);
  }
  char val[48] = "";
  if (r.val_loss >= 0) std::snprintf(val, sizeof val, ", \"val_loss\": %.9g", r.val_loss);
  std::string fields;
  for (const auto& s : sections_) fields += s->metrics(r);
  std::string phases;
  for (int p = 0; p < kPhaseCount; ++p) {
    std::string name = phase_name(Phase(p));
    std::replace(name.begin(), name.end(), ' ', '_');
    char one[64];
    std::snprintf(one, sizeof one, "%s\"%s\": %.6g", p ? ", " : "", name.c_str(), phase[p]);
    phases += one;
  }
  std::fprintf(metrics_,
               "{\"step\": %lld, \"loss\": %s, \"lr\": %.9g, \"grad_norm\": %s, "
               "\"step_time\": %.6g, \"tokens_per_s\": %.6g, \"mfu\": %.6g, \"hfu\": %.6g, "
               "\"mem_peak_bytes\": %.0f%s%s, \"phase_max_s\": {%s}}\n",
               (long long)r.step, json_number(r.loss).c_str(), r.lr,
               json_number(r.grad_norm).c_str(), seconds, tokens / seconds, mfu,
               hardware_flops_per_step_ / (seconds * peak_total_), mem_peak, val, fields.c_str(),
               phases.c_str());
  if ((std::fflush(metrics_) != 0 || std::ferror(metrics_)) && !write_errno_)
    write_errno_ = errno ? errno : EIO;
}

void RunLog::require_written(double write_errno) const {
  TESSERA_REQUIRE(write_errno == 0, "cannot write '", dir_,
                  "/metrics.jsonl' (output.dir): ", std::strerror(int(write_errno)),
                  "; the run stops (free space, or choose "
                  "another output.dir)");
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
  for (const auto& s : sections_) s->gather();
  if (!root_) return;
  std::ofstream(dir_ + "/traffic.json") << grid_.traffic_json(trainer_.own_groups());
  auto part = [&](SummaryPart p) {
    for (const auto& s : sections_) std::printf("%s", s->summary(p).c_str());
  };

  const int n = grid_.world().size();
  double total = 0;
  for (int p = 0; p < kPhaseCount; ++p) total += phase_sum[p] / n;
  std::printf("\n== summary ==\n");
  std::printf("loss %.4f -> %.4f over steps %lld..%lld in %s\n", first_loss_, last_loss_,
              (long long)times_.steps_done + 1, (long long)last_step_,
              human_duration(elapsed_).c_str());
  if (times_.steady_steps > 0) {
    const double mean = times_.steady_seconds / double(times_.steady_steps);
    const double tokens = double(trainer_.batch().global_batch * trainer_.config().seq_len);
    std::printf(
        "steady state (steps %lld..%lld): %.1f ms/step, %.0f tokens/s, MFU %.1f%% of %s%s\n",
        (long long)times_.steps_done + 2, (long long)last_step_, 1e3 * mean, tokens / mean,
        100 * flops_per_step_ / (mean * peak_total_), peak_source_.c_str(),
        run_.data.document_mask ? kDocumentFlops : "");
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
  part(SummaryPart::state);
  part(SummaryPart::activations);
  std::printf("\n%s", grid_.traffic_table(trainer_.own_groups()).c_str());
  part(SummaryPart::communication);
  if (run_.output.compare_plan)
    std::printf("%s", plan_comparison(run_facts(phase_sum, memory_->peak().data(), n)).c_str());
  part(SummaryPart::closing);
  std::fflush(stdout);
}

RunFacts RunLog::run_facts(const double* phase_sum, const double* mem, int n) const {
  RunFacts f;
  f.layout = trainer_.layout();
  f.gemm_flops_per_rank = peak_total_ / n;
  f.steps = times_.steady_steps + 1;
  f.zero_inflight = run_.parallel.zero_inflight;
  f.pp_layers = run_.parallel.pp_layers;
  f.grad_reduce = run_.parallel.grad_reduce_dtype;
  f.document_mask = run_.data.document_mask;
  for (size_t p = 0; p < f.phase_seconds.size(); ++p) f.phase_seconds[p] = phase_sum[p] / n;
  for (size_t c = 0; c < f.memory_peak.size(); ++c) f.memory_peak[c] = mem[c];
  return f;
}

}  // namespace tessera
