#include "io/blended_dataset.hpp"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "core/error.hpp"

namespace tessera {
namespace {

// A weight as the deck gives it: a finite number >= 0, all of the text.
bool parse_weight(const std::string& text, double& w) {
  char* end = nullptr;
  w = std::strtod(text.c_str(), &end);
  return end != text.c_str() && *end == '\0';
}

std::string same_file_key(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p =
      std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
  return ec ? path : p.string();
}

}  // namespace

std::vector<BlendPart> parse_blend(const std::string& spec) {
  std::istringstream in(spec);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  double first = 0;
  // One path (which may hold spaces) unless the text starts with a weight.
  if (words.size() <= 1 || !parse_weight(words[0], first)) return {{spec, 1.0}};
  TESSERA_REQUIRE(words.size() % 2 == 0, "data.path = '", spec,
                  "' is not a blend: a blend is pairs of a weight and a dataset, "
                  "'W1 PATH1 W2 PATH2 ...' (",
                  words.size(), " words)");
  std::vector<BlendPart> parts;
  double sum = 0;
  for (size_t i = 0; i < words.size(); i += 2) {
    double w = 0;
    TESSERA_REQUIRE(parse_weight(words[i], w) && std::isfinite(w) && w >= 0, "data.path: the weight '",
                    words[i], "' of '", words[i + 1],
                    "' is not a finite number >= 0; a blend is 'W1 PATH1 W2 PATH2 ...'");
    for (const BlendPart& p : parts)
      TESSERA_REQUIRE(same_file_key(p.path) != same_file_key(words[i + 1]), "data.path names '",
                      words[i + 1], "' twice in one blend; give each dataset once, with the sum "
                      "of its weights");
    parts.push_back({words[i + 1], w});
    sum += w;
  }
  TESSERA_REQUIRE(sum > 0, "data.path: the weights of the blend '", spec,
                  "' sum to 0; give at least one dataset a positive weight");
  for (BlendPart& p : parts) p.weight /= sum;
  return parts;
}

BlendOrder::BlendOrder(std::vector<double> weights)
    : w_(std::move(weights)), drawn_(w_.size(), 0) {}

// The dataset sample at_ comes from: the largest lag w_i (at_ + 1) - c_i, ties to the lowest i.
static size_t lagging(const std::vector<double>& w, const std::vector<int64_t>& drawn, int64_t at) {
  size_t best = 0;
  double lag = -1e300;
  for (size_t i = 0; i < w.size(); ++i) {
    const double e = w[i] * double(at + 1) - double(drawn[i]);
    if (e > lag) lag = e, best = i;
  }
  return best;
}

void BlendOrder::advance_to(int64_t g) const {
  if (g < at_) at_ = 0, drawn_.assign(w_.size(), 0);
  for (; at_ < g; ++at_) ++drawn_[lagging(w_, drawn_, at_)];
}

BlendOrder::Pick BlendOrder::operator()(int64_t g) const {
  if (w_.size() == 1) return {0, g};
  advance_to(g);
  const size_t i = lagging(w_, drawn_, g);
  return {int(i), drawn_[i]};
}

std::vector<int64_t> BlendOrder::counts(int64_t n) const {
  if (w_.size() == 1) return {n};
  advance_to(n);
  return drawn_;
}

BlendedDataset::BlendedDataset(const std::string& spec, MPI_Comm comm,
                               const DatasetExpectation& expect, double val_fraction)
    : parts_(parse_blend(spec)), order_({}) {
  std::vector<double> weights;
  for (const BlendPart& p : parts_) {
    sets_.push_back(std::make_unique<TokenDataset>(p.path, comm, expect, val_fraction));
    weights.push_back(p.weight);
    // The deck fixes the tokenizer and the vocabulary's size for every part; the vocabulary
    // itself (its hash) must be one too, or a token id would mean two things in one run.
    const std::string& first = sets_.front()->vocab_hash();
    const std::string& mine = sets_.back()->vocab_hash();
    TESSERA_REQUIRE(mine == first, "data file '", p.path,
                    "' of the blend was made with another vocabulary than '", parts_[0].path,
                    "' (vocab_hash ", mine, " against ", first,
                    "); a blend's datasets share one tokenizer and vocabulary");
    TESSERA_REQUIRE(p.weight == 0 || sets_.back()->samples(TokenDataset::train) > 0,
                    "data file '", p.path, "' of the blend has no training sample of ",
                    expect.seq_len + 1, " tokens; give it weight 0 or remove it");
  }
  order_ = BlendOrder(weights);
}

void BlendedDataset::train_sample(uint64_t seed, int64_t g, int32_t* out, uint8_t* mask,
                                  int32_t* doc) const {
  const BlendOrder::Pick p = order_(g);
  // Each dataset its own order: dataset 0 the run's seed (a blend of one is that dataset).
  sets_[size_t(p.dataset)]->train_sample(seed + uint64_t(p.dataset), p.index, out, mask, doc);
}

const std::string& BlendedDataset::fault() const {
  for (const auto& s : sets_)
    if (!s->fault().empty()) return s->fault();
  return sets_.front()->fault();
}

void BlendedDataset::check_unchanged() const {
  for (const auto& s : sets_) s->check_unchanged();
}

}  // namespace tessera
