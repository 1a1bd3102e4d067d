// Data: a blend of several datasets (doc/data.md, "Blends"): each dataset's validation loss in
// metrics.jsonl, and in the summary what the run drew from each (samples, epochs, whether it
// wrapped) with its last validation loss; for a sharded dataset, how often rank 0 opened its
// shards; with a loss mask (doc/data.md, "Loss masks") or document masks ("Document masks"),
// each step's unmasked targets in metrics.jsonl and their share of the tokens in the summary. One
// dataset of one file without a mask reports nothing here.
#include <cmath>

#include "io/dataset_writer.hpp"
#include "report/sections.hpp"
#include "report/text.hpp"

namespace tessera {
namespace {

class DataReport final : public ReportSection {
 public:
  explicit DataReport(const ReportInputs& in)
      : trainer_(in.trainer), documents_(in.run.data.document_mask) {}

  void step(const StepResult& r, const double*) override {
    last_step_ = r.step;
    if (!r.val_losses.empty()) val_ = r.val_losses;
    if (r.finite) {
      tokens_ += tokens_per_step(), targets_ += r.targets;
      masked_ = masked_ || r.targets != tokens_per_step();
    }
  }

  std::string metrics(const StepResult& r) const override {
    // The loss's denominator, when a loss mask makes it other than every token.
    std::string out = r.targets != tokens_per_step() && r.finite
                          ? formatted(", \"loss_targets\": %lld", (long long)r.targets)
                          : std::string();
    if (r.val_losses.empty()) return out;
    out += ", \"val_loss_by_dataset\": {";
    const BlendedDataset& data = trainer_.data();
    for (size_t d = 0; d < data.size(); ++d)
      out += formatted("%s%s: %s", d ? ", " : "", json_quote(data.part(d).path).c_str(),
                       r.val_losses[d] >= 0 ? json_number(r.val_losses[d]).c_str() : "null");
    return out + "}";
  }

  std::string summary(SummaryPart part) const override {
    const BlendedDataset& data = trainer_.data();
    if (part != SummaryPart::state) return {};
    std::string shards;
    if (documents_)
      shards += formatted(
          "\ndata: document masks (doc/data.md, \"Document masks\"): attention stops at each "
          "document's start, positions restart there; the loss is the mean over %lld targets of "
          "the %lld tokens processed (%.1f%%), a document's last token predicting nothing (nor "
          "a masked one); tok/s and MFU count every token processed\n",
          (long long)targets_, (long long)tokens_, 100.0 * double(targets_) / double(tokens_));
    else if (masked_)
      shards += formatted(
          "\ndata: a loss mask (doc/data.md, \"Loss masks\"): the loss is the mean over %lld "
          "unmasked targets of the %lld tokens processed (%.1f%%); tok/s and MFU count every "
          "token processed\n",
          (long long)targets_, (long long)tokens_, 100.0 * double(targets_) / double(tokens_));
    for (size_t d = 0; d < data.size(); ++d) {
      const ShardSet& files = data.dataset(d).files();
      if (files.shards() > 1)
        shards += formatted(
            "\ndata: '%s' is %zu shards (doc/data.md, \"Sharded datasets\"): rank 0 opened "
            "them %lld times, at most %d at once (bound %d)\n",
            data.part(d).path.c_str(), files.shards(), (long long)files.opens(), files.most_open(),
            files.max_open());
    }
    if (data.size() == 1) return shards;
    const int64_t drawn_total = last_step_ * trainer_.batch().global_batch;
    const std::vector<int64_t> drawn = data.drawn(drawn_total);
    std::string out = formatted(
        "\ndata: a blend of %zu datasets, %lld training samples drawn by step %lld "
        "(doc/data.md, \"Blends\")\n",
        data.size(), (long long)drawn_total, (long long)last_step_);
    for (size_t d = 0; d < data.size(); ++d) {
      const int64_t per_epoch = data.dataset(d).samples(TokenDataset::train);
      const double epochs = per_epoch > 0 ? double(drawn[d]) / double(per_epoch) : 0.0;
      out += formatted("  %-32s weight %.4f: %lld samples, %.3f epochs of %lld%s",
                       data.part(d).path.c_str(), data.part(d).weight, (long long)drawn[d],
                       epochs, (long long)per_epoch,
                       drawn[d] > per_epoch ? formatted(" (wrapped into epoch %lld)",
                                                        (long long)((drawn[d] - 1) / per_epoch))
                                                  .c_str()
                                            : "");
      if (d < val_.size() && val_[d] >= 0) out += formatted("; last validation loss %.4f", val_[d]);
      out += "\n";
    }
    return out + shards;
  }

 private:
  int64_t tokens_per_step() const {
    return trainer_.batch().global_batch * trainer_.config().seq_len;
  }
  const Trainer& trainer_;
  bool documents_;  // data.document_mask
  int64_t last_step_ = 0;
  int64_t tokens_ = 0, targets_ = 0;  // over this run's steps with a finite loss
  bool masked_ = false;
  std::vector<double> val_;  // the last evaluation's loss per dataset (-1: no split)
};

}  // namespace

std::unique_ptr<ReportSection> data_section(const ReportInputs& in) {
  return std::make_unique<DataReport>(in);
}

}  // namespace tessera
