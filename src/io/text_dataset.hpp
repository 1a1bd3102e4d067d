// A text file as byte-level tokens (one token per byte, vocabulary 256), and the sampler
// that turns (seed, step, global sample index) into a window of seq_len + 1 tokens.
// The HDF5 token datasets of tessera-prep replace the file format; the sampling rule stays.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

class TextDataset {
 public:
  // Throws a collective Error when the file is missing or shorter than one sample.
  TextDataset(const std::string& path, int64_t seq_len);

  int64_t tokens() const { return int64_t(bytes_.size()); }
  // Fills out[seq_len + 1] with the sample of global index g (a pure function of seed, g).
  void sample(uint64_t seed, uint64_t g, int32_t* out) const;

 private:
  std::string path_;
  int64_t seq_len_;
  std::vector<uint8_t> bytes_;
};

}  // namespace tessera
