// Data parallelism: the gradient all-reduce's timing per step (metrics.jsonl) and per step
// over the run (summary), and the strategy's own lines (DataParallel::summary).
#include <algorithm>
#include <cstdio>

#include "report/sections.hpp"
#include "report/text.hpp"

namespace tessera {
namespace {

class DataParallelReport final : public ReportSection {
 public:
  explicit DataParallelReport(const ReportInputs& in) : trainer_(in.trainer), times_(in.times) {}

  // Every rank measures its own all-reduce: the last rank to end backward waits in finish()
  // only for what overlap did not hide, the others also for that rank, so exposed and in
  // flight are minima over ranks (reduced negated) and the longest wait (skew included) is
  // reported apart; posting and polling are maxima.
  void step_max(std::vector<double>& max) override {
    const DpSyncTiming& dp = trainer_.data_parallel().last_sync();
    max.insert(max.end(), {-dp.in_flight, -dp.exposed, dp.exposed, dp.posting, dp.polling});
  }

  void step(const StepResult& r, const double* m) override {
    step_ = trainer_.data_parallel().last_sync();
    step_.in_flight = -m[0], step_.exposed = -m[1], step_.posting = m[3];
    step_.polling = m[4];
    waited_ = m[2];
    if (!times_.first(r)) steady_ += step_, waited_steady_ += waited_;
    all_ += step_, waited_all_ += waited_;
  }

  std::string metrics(const StepResult&) const override {
    if (step_.buckets == 0) return {};
    return formatted(
        ", \"dp_in_flight\": %.6g, \"dp_exposed\": %.6g, \"dp_waited\": %.6g, "
        "\"dp_posting\": %.6g, \"dp_polling\": %.6g, \"dp_bytes\": %lld",
        step_.in_flight, step_.exposed, waited_, step_.posting, step_.polling,
        (long long)step_.bytes);
  }

  std::string summary(SummaryPart part) const override {
    if (part == SummaryPart::communication) return trainer_.data_parallel().summary();
    if (part != SummaryPart::closing) return {};
    const bool steady = steady_.buckets > 0;
    const DpSyncTiming& d = steady ? steady_ : all_;
    if (d.buckets == 0) return {};
    // Per step. With progress = none nothing tests the buckets during backward, so "in
    // flight" is posted-to-seen time, not transfer time: compare exposed with a run with
    // parallel.overlap = false instead (doc/performance.md).
    const double steps = double(steady ? times_.steady_steps : times_.steady_steps + 1);
    const DataParallel& dp = trainer_.data_parallel();
    const double hidden = d.in_flight - d.exposed - d.posting - d.polling;
    char share[32] = "not measured";  // progress = none
    if (dp.sync_hidden_measured())
      std::snprintf(share, sizeof share, "%.0f%%",
                    100 * std::max(0.0, hidden) / std::max(d.in_flight, 1e-12));
    const double waited = steady ? waited_steady_ : waited_all_;
    return formatted(
        "dp gradient all-reduce per step (%s): %.0f buckets, %.1f MB, in flight %.1f ms, "
        "exposed %.1f ms + posting %.1f ms + polling %.1f ms (hidden %s); longest wait "
        "%.1f ms (with skew); %s\n",
        steady ? "steady state" : "all steps", double(d.buckets) / steps,
        double(d.bytes) / steps / 1e6, 1e3 * d.in_flight / steps, 1e3 * d.exposed / steps,
        1e3 * d.posting / steps, 1e3 * d.polling / steps, share, 1e3 * waited / steps,
        dp.sync_settings().c_str());
  }

 private:
  Trainer& trainer_;
  const RunTimes& times_;
  DpSyncTiming step_;          // the last step's, reduced over ranks
  double waited_ = 0;          // its longest exposed time over ranks
  DpSyncTiming all_, steady_;  // summed over all steps and over the steady ones
  double waited_all_ = 0, waited_steady_ = 0;
};

}  // namespace

std::unique_ptr<ReportSection> data_parallel_section(const ReportInputs& in) {
  return std::make_unique<DataParallelReport>(in);
}

}  // namespace tessera
