// Parameters: a global name, a global shape, how to initialise it, whether weight decay
// applies, and views of its value and gradient. The ParamStore keeps all values in one flat
// buffer and all gradients in another (so data parallelism can reduce them in buckets and
// the optimizer can walk them in one pass).
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "tensor/tensor.hpp"

namespace tessera {

struct ParamInit {
  enum Kind { normal, ones, zeros } kind = normal;
  float std = 0.02f;
  int64_t valid_rows = -1;  // rows at or beyond this are padding and start at zero
};

struct Param {
  std::string name;
  Shape global;
  ParamInit init;
  bool decay = false;
  int64_t offset = 0;  // into the store's flat buffers
  Tensor value, grad;
};

class ParamStore {
 public:
  Param& add(std::string name, Shape shape, ParamInit init, bool decay);
  // Allocates the flat buffers and points every Param at its slice. Call once, after every
  // layer has registered its parameters. The buffers are padded with zeros to a multiple of
  // pad_multiple elements (so they split evenly into ZeRO shards).
  void finalize(Allocator& alloc, int64_t pad_multiple = 1);
  // Initialises every value from (seed, name, global element index).
  void initialize(uint64_t seed);
  void zero_grads();

  std::vector<Param*> params();
  const Param* find(const std::string& name) const;
  int64_t numel() const { return numel_; }
  float* values() const { return values_.f32(); }
  float* grads() const { return grads_.f32(); }

 private:
  std::deque<Param> params_;  // deque: pointers stay valid while layers register
  int64_t numel_ = 0;
  Buffer values_, grads_;
};

}  // namespace tessera
