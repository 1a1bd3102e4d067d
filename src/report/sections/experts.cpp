// Experts: the last step's routing of every mixture-of-experts block of the model (doc/moe.md),
// whichever pipeline stage holds it, gathered over the pp group each step: a metrics.jsonl
// field, and with the total and active parameters in the summary.
#include <algorithm>
#include <string>

#include "report/sections.hpp"
#include "report/text.hpp"

namespace tessera {
namespace {

class ExpertsReport final : public ReportSection {
 public:
  explicit ExpertsReport(const ReportInputs& in) : grid_(in.grid), trainer_(in.trainer) {}
  void step(const StepResult&, const double*) override;
  std::string metrics(const StepResult&) const override;
  std::string summary(SummaryPart part) const override;

 private:
  struct Row {
    std::string name;
    double imbalance, dropped, routed, aux, z, bias_min, bias_max, cross, cross_free, run_cross,
        run_cross_free, cross_nodes, run_cross_nodes;
  };
  ProcessGrid& grid_;
  Trainer& trainer_;
  std::vector<Row> rows_;
};

void ExpertsReport::step(const StepResult&, const double*) {
  const ModelConfig& c = trainer_.config();
  if (!c.moe.enabled()) return;
  // One row of K numbers per layer: whether this stage holds its MoE block, then its figures.
  // Each block sits on one stage, so the sum over the pp group is that stage's row.
  constexpr int K = 14;
  std::vector<double> rows(size_t(c.layers * K), 0.0);
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    const Moe* m = trainer_.model().moe_at(layer);
    if (!m) continue;
    const Moe::Stats& s = m->last();
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
                         s.run_cross_bytes_free,
                         s.cross_bytes_nodes,
                         s.run_cross_bytes_nodes};
    std::copy(v, v + K, r);
  }
  grid_.group(Group::pp).all_reduce(rows.data(), int64_t(rows.size()));
  rows_.clear();
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    const double* r = rows.data() + layer * K;
    if (r[0] == 0) continue;
    rows_.push_back({"layers." + std::to_string(layer) + ".moe", r[1], r[2], r[3], r[4], r[5], r[6],
                     r[7], r[8], r[9], r[10], r[11], r[12], r[13]});
  }
}

// The last step's routing of every block; nothing for a dense model.
std::string ExpertsReport::metrics(const StepResult&) const {
  std::string out;
  for (const Row& m : rows_)
    out += formatted(
        "%s{\"layer\": \"%s\", \"max_over_mean\": %.6g, \"dropped\": %.0f, "
        "\"routed\": %.0f, \"aux\": %.6g, \"z\": %.6g, \"bias_min\": %.6g, "
        "\"bias_max\": %.6g, \"cross_node_bytes\": %.0f, "
        "\"cross_node_bytes_unrestricted\": %.0f, \"cross_node_bytes_once_per_node\": %.0f}",
        out.empty() ? "" : ", ", m.name.c_str(), m.imbalance, m.dropped, m.routed, m.aux, m.z,
        m.bias_min, m.bias_max, m.cross, m.cross_free, m.cross_nodes);
  return out.empty() ? out : ", \"moe\": [" + out + "]";
}

// Total and active parameters, and the last step's routing per block.
std::string ExpertsReport::summary(SummaryPart part) const {
  const ModelConfig& c = trainer_.config();
  if (part == SummaryPart::communication && c.moe.enabled() && grid_.group(Group::ep).size() > 1) {
    // doc/moe-overlap.md.
    const OverlapTiming& t = trainer_.ep_timing();
    const char* behind =
        c.moe.two_level
            ? "the cross-node legs: the forward dispatch behind the shared experts' gate and up, "
              "the combine behind their down, the output gradients behind their backward, the "
              "weights' gradients behind the routed experts' backward, the input gradients "
              "behind the router's backward; the intra-node legs are blocking"
            : "each block's dispatch behind the shared experts' gate and up, the combine behind "
              "their down, the output gradients behind their backward, the input gradients "
              "behind the router's backward";
    if (c.moe.shared == 0)  // nothing independent of the experts in forward (doc/moe.md)
      behind = c.moe.two_level ? "the cross-node legs; no shared experts: only the weights' and "
                                 "the input gradients' returns have compute behind them"
                               : "no shared experts: only the input gradients' return has "
                                 "compute behind it, the router's backward";
    return formatted(
        "ep all-to-alls: %lld overlapped (%s), in flight %.1f ms, exposed %.1f ms (hidden "
        "%.0f%%; rank 0, all steps)\n",
        (long long)t.transfers, behind, 1e3 * t.in_flight, 1e3 * t.exposed,
        100 * std::max(0.0, 1 - t.exposed / std::max(t.in_flight, 1e-12)));
  }
  if (part != SummaryPart::state || !c.moe.enabled()) return {};
  std::string out = formatted(
      "mixture of experts: %lld parameters, %lld active per token (%lld blocks of %lld "
      "routed experts, top %lld, %lld shared; ep %d)\n",
      (long long)c.param_count(), (long long)c.active_param_count(), (long long)c.moe_blocks(),
      (long long)c.moe.experts, (long long)c.moe.top_k, (long long)c.moe.shared,
      grid_.group(Group::ep).size());
  for (const Row& m : rows_)
    out += formatted(
        "  %-16s tokens per expert max/mean %.3f, dropped %.0f of %.0f, balancing "
        "loss %.4g, z %.4g, selection bias [%.4g, %.4g]   (last step)\n",
        m.name.c_str(), m.imbalance, m.dropped, m.routed, m.aux, m.z, m.bias_min, m.bias_max);
  if (c.moe.placed_nodes <= 1 && !c.moe.two_level) return out;
  double sent = 0, unrestricted = 0, once = 0;
  for (const Row& m : rows_)
    sent += m.run_cross, unrestricted += m.run_cross_free, once += m.run_cross_nodes;
  return out + formatted(
                   "  cross-node dispatch %.4g MB (%s), unrestricted routing would send %.4g MB "
                   "(%.3f of it), once per node %.4g MB; ep_max_nodes %lld of %lld nodes; the "
                   "whole run, this tp rank's tokens\n",
                   sent / 1e6, c.moe.two_level ? "two_level" : "flat", unrestricted / 1e6,
                   unrestricted > 0 ? sent / unrestricted : 0.0, once / 1e6,
                   (long long)c.moe.max_nodes, (long long)c.moe.nodes);
}

}  // namespace

std::unique_ptr<ReportSection> experts_section(const ReportInputs& in) {
  return std::make_unique<ExpertsReport>(in);
}

}  // namespace tessera
