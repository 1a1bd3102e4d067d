// The pipeline (parallel.pp > 1): the cut before step 1, and the bubble per rank in the
// summary beside the formula of the run's own schedule (pp::bubble_formula and its text).
#include <algorithm>
#include <iterator>

#include "core/error.hpp"
#include "report/sections.hpp"
#include "report/text.hpp"

namespace tessera {
namespace {

class PipelineReport final : public ReportSection {
 public:
  explicit PipelineReport(const ReportInputs& in)
      : run_(in.run), grid_(in.grid), trainer_(in.trainer), times_(in.times) {}

  // The cut, before any step: blocks per model chunk and which stage runs each.
  std::string start() const override {
    const pp::Executor* pipe = trainer_.pipeline();
    if (!pipe) return {};
    const pp::ScheduleShape& sh = pipe->shape();
    std::string cut;
    int64_t first = 0;
    for (size_t k = 0; k < trainer_.chunk_layers().size(); ++k) {
      const int64_t n = trainer_.chunk_layers()[k];
      cut += cat(k ? ", " : "", "[", first, "-", first + n - 1, "]@", sh.stage_of(int(k)));
      first += n;
    }
    return formatted(
        "pipeline: %s, %d stages x %d chunk(s), %d micro-batches; layers (%s) per model "
        "chunk [first-last]@stage: %s; embedding on stage 0, head on stage %d\n",
        to_string(sh.kind), sh.stages, sh.chunks, sh.micro_batches, run_.parallel.pp_layers.c_str(),
        cut.c_str(), sh.loss_stage());
  }

  void step(const StepResult& r, const double*) override {
    if (const pp::Executor* pipe = trainer_.pipeline(); pipe && !times_.first(r)) {
      wait_steady_ += pipe->last_wait(), compute_steady_ += pipe->last_compute();
      for (int k = 0; k < 2; ++k) messages_steady_[k] += pipe->last_messages(k);
      paired_steady_ += pipe->last_paired();
    }
  }

  // Seconds each rank was blocked in receive waits (idle) and in its forward and backward
  // passes (compute), over the steady steps (all steps when there is only one).
  void gather() override {
    const pp::Executor* pipe = trainer_.pipeline();
    if (!pipe) return;
    bubble_.assign(kPerRank * size_t(grid_.world().size()), 0.0);
    double* mine = bubble_.data() + kPerRank * size_t(grid_.world().rank());
    mine[0] = times_.steady_steps ? wait_steady_ : pipe->total_wait();
    mine[1] = times_.steady_steps ? compute_steady_ : pipe->total_compute();
    mine[2] = pipe->peak_in_flight();
    mine[3] = pipe->peak_slots();
    mine[4] = trainer_.model().weight_grads().sets();
    mine[5] = double(trainer_.model().weight_grads().bytes());
    grid_.world().all_reduce(bubble_.data(), int64_t(bubble_.size()));
    // The messages of every rank, summed: per kind, received, of them complete when needed,
    // receive waits, sent, seconds in flight and exposed.
    for (int k = 0; k < 2; ++k) {
      const pp::MessageTiming& t =
          times_.steady_steps ? messages_steady_[k] : pipe->total_messages(k);
      double* x = messages_ + 6 * k;
      x[0] = double(t.received), x[1] = double(t.received_early), x[2] = t.recv_wait;
      x[3] = double(t.sent), x[4] = t.send_flight, x[5] = t.send_exposed;
    }
    grid_.world().all_reduce(messages_, 12);
    // DualPipe's interleaved pairs, every rank's: pairs run, switches, transfers that travelled
    // while the other pass computed, each kind's in flight, exposed and count, and the pairs'
    // pipeline messages as above.
    std::fill(std::begin(pairs_), std::end(pairs_), 0.0);
    if (const PassPair* pair = trainer_.pass_pair()) {
      pairs_[0] = double(pipe->pairs_run()), pairs_[1] = double(pair->switches());
      pairs_[2] = double(pair->crossed());
      for (int k = 0; k < PassPair::kinds; ++k) {
        const OverlapTiming& t = pair->timing(PassPair::Kind(k));
        pairs_[3 + 3 * k] = t.in_flight, pairs_[4 + 3 * k] = t.exposed;
        pairs_[5 + 3 * k] = double(t.transfers);
      }
      const pp::MessageTiming& m = times_.steady_steps ? paired_steady_ : pipe->total_paired();
      double* x = pairs_ + 3 + 3 * PassPair::kinds;
      x[0] = double(m.received), x[1] = double(m.received_early), x[2] = m.recv_wait;
      x[3] = double(m.sent), x[4] = m.send_flight, x[5] = m.send_exposed;
    }
    grid_.world().all_reduce(pairs_, int64_t(std::size(pairs_)));
  }

  std::string summary(SummaryPart part) const override {
    const pp::Executor* pipe = trainer_.pipeline();
    if (part != SummaryPart::communication || !pipe) return {};
    const pp::ScheduleShape& sh = pipe->shape();
    const pp::Ratio f = pp::bubble_formula(sh);
    std::string out = formatted(
        "pipeline: %s, %d stages x %d chunks, %d micro-batches; bubble = idle / compute "
        "(idle: blocked in receive waits, %s), formula %s = %lld/%lld = %.3f\n",
        to_string(sh.kind), sh.stages, sh.chunks, sh.micro_batches,
        times_.steady_steps ? "steady steps" : "all steps", pp::bubble_formula_text(sh.kind),
        (long long)f.num, (long long)f.den, double(f.num) / double(f.den));
    // Held at once: (micro-batch, chunk) passes begun and not finished, beside
    // peak_activations_formula; a split backward frees the saved activations at B and keeps
    // copies of the weight GEMMs' operands until W (model/weight_grads.hpp).
    for (int r = 0; r < grid_.world().size(); ++r) {
      const double* x = bubble_.data() + kPerRank * size_t(r);
      const int stage = grid_.layout().coord(r).pp;
      out += formatted(
          "  rank %d (stage %d): idle %.3f s, compute %.3f s, bubble %.3f; held at once %d "
          "(formula %d)",
          r, stage, x[0], x[1], x[0] / std::max(1e-12, x[1]), int(x[2]),
          pp::peak_activations_formula(sh, stage));
      if (sh.split_backward())
        out += formatted(", with saved activations %d, W's operand copies %s in %d sets",
                         int(x[3]), human_bytes(x[5]).c_str(), int(x[4]));
      out += "\n";
    }
    // Whether the messages moved behind compute (polled between parts, Executor::poll).
    for (int k = 0; k < 2; ++k) {
      const double* x = messages_ + 6 * k;
      out += formatted(
          "  %s messages (all ranks): %.0f received, %.0f (%.0f%%) complete when needed, "
          "receive waits %.3f s; %.0f sent, in flight %.3f s, exposed %.3f s (hidden %.0f%%)\n",
          k == 0 ? "activation" : "gradient", x[0], x[1], 100 * x[1] / std::max(1.0, x[0]), x[2],
          x[3], x[4], x[5], x[4] > 0 ? 100 * (1 - x[5] / x[4]) : 100.0);
    }
    if (sh.kind == PipeSchedule::dualpipe_v) out += paired();
    return out;
  }

  // DualPipe's pairs (doc/pipeline.md, "Paired overlap"): whether they ran interleaved, and
  // then how much of each kind of their traffic was hidden. The counts are printed only from
  // the interleaved pairs' own counters (zero when no pair ran interleaved).
  std::string paired() const {
    const std::string& off = trainer_.paired_overlap_off();
    if (!off.empty()) return formatted("  paired overlap: off (%s)\n", off.c_str());
    auto hidden = [](double flight, double exposed) {
      return flight > 0 ? 100 * std::max(0.0, 1 - exposed / flight) : 0.0;
    };
    static const char* const names[PassPair::kinds] = {"forward dispatch", "forward combine",
                                                       "backward dispatch", "backward return"};
    std::string kinds;
    for (int k = 0; k < PassPair::kinds; ++k) {
      const double* t = pairs_ + 3 + 3 * k;
      kinds += formatted("%s%s %.0f, in flight %.1f ms, exposed %.1f ms (hidden %.0f%%)",
                         k ? "; " : "", names[k], t[2], 1e3 * t[0], 1e3 * t[1], hidden(t[0], t[1]));
    }
    const double* x = pairs_ + 3 + 3 * PassPair::kinds;
    return formatted(
        "  paired overlap: on; %.0f pairs interleaved, %.0f switches, %.0f expert transfers "
        "travelled while the other micro-batch computed (all ranks, all steps)\n"
        "    expert all-to-alls of the pairs: %s\n"
        "    pipeline messages of the pairs (%s): %.0f received, %.0f complete when needed, "
        "receive waits %.3f s; %.0f sent, in flight %.3f s, exposed %.3f s (hidden %.0f%%)\n",
        pairs_[0], pairs_[1], pairs_[2], kinds.c_str(),
        times_.steady_steps ? "all ranks, steady steps" : "all ranks, all steps", x[0], x[1],
        x[2], x[3], x[4], x[5], x[4] > 0 ? hidden(x[4], x[5]) : 100.0);
  }

 private:
  const RunConfig& run_;
  ProcessGrid& grid_;
  const Trainer& trainer_;
  const RunTimes& times_;
  double wait_steady_ = 0, compute_steady_ = 0;  // this rank's, over the steady steps
  // Per rank, after gather: idle, compute, passes held at once, activation slots, W sets and
  // their bytes.
  static constexpr size_t kPerRank = 6;
  std::vector<double> bubble_;
  pp::MessageTiming messages_steady_[2];  // this rank's, over the steady steps
  double messages_[12] = {};              // every rank's, after gather
  pp::MessageTiming paired_steady_;       // this rank's pairs' messages, over the steady steps
  double pairs_[3 + 3 * PassPair::kinds + 6] = {};  // every rank's, after gather (see gather)
};

}  // namespace

std::unique_ptr<ReportSection> pipeline_section(const ReportInputs& in) {
  return std::make_unique<PipelineReport>(in);
}

}  // namespace tessera
