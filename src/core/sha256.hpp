// SHA-256 (FIPS 180-4), incremental: identifies files such as a tokenizer's vocabulary.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera {

class Sha256 {
 public:
  Sha256();
  void update(std::string_view bytes);
  std::string hex();  // finishes the hash; lower-case, 64 characters

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t used_ = 0;
  uint64_t total_ = 0;  // bytes
};

std::string sha256_hex(std::string_view bytes);

}  // namespace tessera
