// Precision: fp16 dynamic loss scaling (train.precision = fp16): the scale and skipped steps
// on the progress line and in metrics.jsonl, and the run's count in the summary.
#include "report/sections.hpp"
#include "report/text.hpp"

namespace tessera {
namespace {

class PrecisionReport final : public ReportSection {
 public:
  explicit PrecisionReport(const ReportInputs& in) : trainer_(in.trainer) {}

  std::string progress(const StepResult& r) const override {
    if (!trainer_.loss_scaler().dynamic) return {};
    return formatted(" | scale %g%s", r.loss_scale, r.skipped ? " (overflow: skipped)" : "");
  }

  std::string metrics(const StepResult& r) const override {
    if (!trainer_.loss_scaler().dynamic) return {};
    return formatted(", \"loss_scale\": %.9g, \"skipped\": %s", r.loss_scale,
                     r.skipped ? "true" : "false");
  }

  std::string summary(SummaryPart part) const override {
    const LossScaler& ls = trainer_.loss_scaler();
    if (part != SummaryPart::state || !ls.dynamic) return {};
    return formatted("fp16 loss scaling: %lld steps skipped on overflow, scale now %g\n",
                     (long long)ls.skipped, ls.scale);
  }

 private:
  const Trainer& trainer_;
};

}  // namespace

std::unique_ptr<ReportSection> precision_section(const ReportInputs& in) {
  return std::make_unique<PrecisionReport>(in);
}

}  // namespace tessera
