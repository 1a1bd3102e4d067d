// Context parallelism: how much of the ring's K/V (and dK/dV) traffic attention hid.
#include <algorithm>

#include "report/sections.hpp"
#include "report/text.hpp"

namespace tessera {
namespace {

class ContextParallelReport final : public ReportSection {
 public:
  explicit ContextParallelReport(const ReportInputs& in) : trainer_(in.trainer) {}

  std::string summary(SummaryPart part) const override {
    const ContextParallel& cp = trainer_.config().cp;
    if (part != SummaryPart::communication || cp.size <= 1 || cp.kind != CpKind::ring) return {};
    const OverlapTiming& t = trainer_.cp_timing();
    return formatted(
        "cp ring: %lld K/V and dK/dV transfers, in flight %.1f ms, exposed %.1f ms "
        "(hidden %.0f%% behind attention; rank 0, all steps)\n",
        (long long)t.transfers, 1e3 * t.in_flight, 1e3 * t.exposed,
        100 * std::max(0.0, 1 - t.exposed / std::max(t.in_flight, 1e-12)));
  }

 private:
  const Trainer& trainer_;
};

}  // namespace

std::unique_ptr<ReportSection> context_parallel_section(const ReportInputs& in) {
  return std::make_unique<ContextParallelReport>(in);
}

}  // namespace tessera
