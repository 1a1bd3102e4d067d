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

// How a parameter is split over the tensor-parallel group: this rank holds block `index` of
// `parts` equal blocks along dimension `dim` (dim < 0: the whole tensor, replicated).
struct TpSplit {
  int dim = -1;
  int64_t parts = 1, index = 0;
  bool split() const { return dim >= 0 && parts > 1; }
};

struct Param {
  std::string name;
  Shape global;  // the whole tensor, as checkpoints hold it
  Shape local;   // this rank's block (global unless split)
  TpSplit tp;
  // Its gradient is a partial sum over the tensor-parallel ranks (a norm's weight under
  // sequence parallelism sees only this rank's tokens) and is all-reduced over them.
  bool tp_partial_grad = false;
  // A routed expert this rank holds for its expert-parallel group only (ModelConfig::
  // experts_held): its gradient is summed over the expert-data-parallel ranks (edp), which
  // hold the same experts, not over all data-parallel ranks.
  bool expert = false;
  ParamInit init;
  bool decay = false;
  int64_t offset = 0;  // into the store's flat buffers
  Tensor value, grad;  // shape local; value is the fp32 master copy
  // The value in the store's compute dtype, which the GEMMs read (Linear, the output head): value
  // itself when that is f32, else a view of the compute copy (ParamStore::refresh_compute). An
  // owner that points value elsewhere (ZeRO-3 gathering a part) points compute too.
  Tensor compute;
  // Start of this rank's block in the global tensor, per dimension.
  int64_t block_start(int d) const { return d == tp.dim ? tp.index * local[d] : 0; }
};

// A part: consecutive parameters that are used together (the embedding, one block, the
// head). Each part starts and ends on a multiple of the store's alignment, so it splits
// evenly into ZeRO shards: rank r of K holds elements [begin + r*size/K, begin + (r+1)*size/K).
// Held experts (Param::expert) are the part's last parameters and form its expert section,
// padded apart: [begin + size - experts, begin + size), split over the ranks holding the same
// experts (expert-data-parallel) instead of all data-parallel ranks.
struct ParamPart {
  int first = 0, last = 0;      // registration indices [first, last)
  int64_t begin = 0, size = 0;  // element range in the flat buffers, padded
  int64_t experts = 0;          // elements of the expert section at the part's end (0: none)
};

struct StoreLayout {
  // Registration-index ranges of the parts, in order; empty: one part holding everything.
  std::vector<std::pair<int, int>> parts;
  int64_t align = 16;   // every part's begin and size are multiples of this (elements)
  int64_t expert_align = 16;  // and the size of its expert section, of this
  bool values = true;   // allocate the flat value buffer (ZeRO-3 keeps only shards)
  bool grads = true;    // allocate the flat gradient buffer (ZeRO-2/3 stage per part)
};

class ParamStore {
 public:
  // shape is the global shape; split says which block of it this rank holds.
  Param& add(std::string name, Shape shape, ParamInit init, bool decay, TpSplit split = {});
  // Lays the parameters out part by part, allocates the flat buffers the layout asks for
  // and points every Param at its slice (Params of a buffer not allocated get null views,
  // pointed elsewhere by their owner). Call once, after every layer has registered.
  // compute: the dtype the layers compute with. f32: Param::compute aliases the fp32 values
  // (no memory, nothing to refresh); bf16 or f16: a second flat buffer of that dtype, charged
  // to Charge::params, filled from the values by refresh_compute() (without layout.values the
  // compute views are null, pointed by their owner like the values).
  void finalize(Allocator& alloc, const StoreLayout& layout = {}, DType compute = DType::f32);
  // Initialises every value from (seed, name, global element index): a block of a split
  // parameter holds exactly the values of the same elements of the whole one.
  // In device memory the values are computed in a host staging buffer and copied over.
  void initialize(uint64_t seed);
  void initialize(Param& p, uint64_t seed);
  void zero_grads();
  // compute copy = values, rounded to nearest even; nothing when the compute dtype is f32 or
  // there is no flat value buffer.
  void refresh_compute();
  DType compute_dtype() const { return compute_dtype_; }
  // The flat 16-bit compute copy (indexed as values()); empty in fp32 or without value buffer.
  Tensor compute() const { return compute_.empty() ? Tensor{} : compute_.view(); }

  std::vector<Param*> params();
  Param& param(int index) { return params_[size_t(index)]; }
  const std::vector<ParamPart>& parts() const { return parts_; }
  const Param* find(const std::string& name) const;
  int64_t numel() const { return numel_; }  // padded length of the flat buffers
  int64_t elements() const;                 // parameters proper, without padding
  // The flat buffers' pointers in any space (pointer arithmetic and comm/'s collectives;
  // host code that reads them stages them first).
  float* values() const { return values_.ptr_f32(); }
  float* grads() const { return grads_.ptr_f32(); }
  Space space() const { return space_; }  // where the buffers are (the allocator's space)

 private:
  std::deque<Param> params_;  // deque: pointers stay valid while layers register
  std::vector<ParamPart> parts_;
  int64_t numel_ = 0;
  DType compute_dtype_ = DType::f32;
  Space space_ = Space::host;
  Allocator* alloc_ = nullptr;  // from finalize; its host() holds the initialisation staging
  Buffer values_, grads_, compute_;
};

}  // namespace tessera
