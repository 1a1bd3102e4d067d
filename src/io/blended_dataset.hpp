// Weighted blends of token datasets (doc/data.md, "Blends"). data.path names one dataset, or
// several with weights in Megatron-LM's --data-path form, "W1 PATH1 W2 PATH2 ...". Sample g of
// the blend comes from the dataset whose drawn count lags its weight most (BlendOrder), as its
// next sample in that dataset's own order (TokenDataset::train_sample: a Feistel permutation
// per epoch, wrapping to the next epoch when exhausted). Everything is a pure function of
// (seed, g, weights), so the blend is the same on every layout and resumes exactly; a blend of
// one dataset is that dataset, sample for sample.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/token_dataset.hpp"

namespace tessera {

struct BlendPart {
  std::string path;
  double weight = 1;  // normalised: the weights of a blend sum to 1
};

// data.path as a blend: one path (weight 1), or pairs "WEIGHT PATH" separated by white space.
// A collective tessera::Error, naming data.path, for an odd count, a weight that is not a
// finite number >= 0, weights summing to 0, or the same file twice.
std::vector<BlendPart> parse_blend(const std::string& spec);

// The blend rule: with weights w (summing to 1), sample g (from 0) comes from the dataset i
// maximising w_i (g + 1) - c_i, c_i the samples drawn from i before g (ties: the lowest i).
// Every prefix of n samples then holds within one sample of w_i n from each dataset. Lookups
// at increasing g cost O(datasets) each; a lookup behind the last one starts again from 0.
class BlendOrder {
 public:
  explicit BlendOrder(std::vector<double> weights);
  struct Pick {
    int dataset = 0;
    int64_t index = 0;  // the sample's position in that dataset's own order
  };
  Pick operator()(int64_t g) const;
  // Samples drawn from each dataset among the first n.
  std::vector<int64_t> counts(int64_t n) const;

 private:
  void advance_to(int64_t g) const;
  std::vector<double> w_;
  mutable int64_t at_ = 0;              // the next sample the cursor would draw
  mutable std::vector<int64_t> drawn_;  // samples drawn from each before at_
};

class BlendedDataset {
 public:
  // Opens every dataset of the blend collectively on comm (each checked as TokenDataset
  // checks one: tokenizer, vocabulary, format, length).
  BlendedDataset(const std::string& spec, MPI_Comm comm, const DatasetExpectation& expect,
                 double val_fraction);

  size_t size() const { return parts_.size(); }
  const BlendPart& part(size_t i) const { return parts_[i]; }
  const TokenDataset& dataset(size_t i) const { return *sets_[i]; }
  // Global training sample g of the blend (counting from 0 across epochs): out[seq_len + 1],
  // and its loss mask and document starts when mask and doc are not null
  // (TokenDataset::train_sample).
  void train_sample(uint64_t seed, int64_t g, int32_t* out, uint8_t* mask = nullptr,
                    int32_t* doc = nullptr) const;
  // Which dataset sample g comes from, and where in its order.
  BlendOrder::Pick pick(int64_t g) const { return order_(g); }
  // Training samples drawn from each dataset by the first n samples of the blend.
  std::vector<int64_t> drawn(int64_t n) const { return order_.counts(n); }

  // The first fault any dataset recorded on this rank ("" when none), and the check that no
  // file changed since it was opened (TokenDataset).
  const std::string& fault() const;
  void check_unchanged() const;

 private:
  std::vector<BlendPart> parts_;
  std::vector<std::unique_ptr<TokenDataset>> sets_;
  BlendOrder order_;
};

}  // namespace tessera
