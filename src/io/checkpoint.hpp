// Global checkpoints (doc/architecture.md, "Invariants"): one HDF5 file per checkpoint holding
// every parameter and optimizer state as its global tensor, written collectively by hyperslab with
// parallel HDF5, so any layout can read any checkpoint (and h5py or PyTorch can too).
//
// Atomicity: the file is written as NAME.tmp, flushed, fsync'ed, renamed to NAME, and only
// then is the `latest` pointer (a one-line text file) replaced, itself via rename. A crash at
// any point leaves the previous checkpoint and `latest` intact.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "io/launcher_watch.hpp"
#include "tensor/tensor.hpp"

namespace tessera {

struct RunConfig;

// One tensor as a rank sees it: its dataset path in the file, its global shape, and what
// this rank holds at `data`: within the block [start, start + count) of the global tensor
// (per dimension; a tensor-parallel shard, or all of it), the elements [begin, begin + n)
// of the block flattened row-major (a ZeRO piece; n = -1: the whole block; n may be 0).
// `holders` ranks hold this same data (replicas) and this rank is number `holder` of them:
// they split the writing and the checksum evenly, so every element is written once, and
// all of them read it. Every rank passes every tensor, in the same order (the HDF5 calls
// are collective).
struct CheckpointTensor {
  std::string path;  // e.g. "params/layers.0.attn.q.weight"
  Shape global;
  float* data = nullptr;
  int holders = 1, holder = 0;
  std::array<int64_t, 4> start{0, 0, 0, 0};
  Shape block;  // empty (ndim 0): the whole tensor
  int64_t begin = 0, n = -1;
  // false: this rank holds a copy of data another rank writes (read back on restore only).
  bool writes = true;
};

struct CheckpointMeta {
  int64_t step = 0;     // optimizer steps completed
  int64_t samples = 0;  // global samples consumed (the data position)
  int64_t seed = 0;     // seed of initialisation and data order (the RNG state: counter-based)
  std::string deck_json, layout_json;
  // fp16 dynamic loss scaling: the scale and the steps since it last changed (0 and 0 for
  // other precisions; a checkpoint without them reads as those).
  double loss_scale = 0;
  int64_t loss_scale_good = 0;
};

// The checkpoint directory: checkpoint.dir, or output.dir/checkpoints when it is empty.
std::string checkpoint_dir(const RunConfig& run);
// The key that names it: "checkpoint.dir", or "output.dir" when checkpoint.dir is empty.
const char* checkpoint_dir_key(const RunConfig& run);

class Checkpointer {
 public:
  Checkpointer(const RunConfig& run, Communicator& world);

  const std::string& dir() const { return dir_; }
  // True when a checkpoint is due after step (every N steps, and after the last unless
  // checkpoint.at_end = false).
  bool due(int64_t step, int64_t last_step) const;
  // The file checkpoint.resume names: "" to start fresh. Collective errors (decided by rank
  // 0): a named file missing or a directory; `latest` empty, garbage or naming a missing
  // file; a fresh start into a directory holding checkpoints without checkpoint.overwrite.
  std::string resume_path();
  // Before step 1: the checkpoint directory can be created and written, and has room for one
  // checkpoint of these tensors (collective error otherwise, so no step is trained in vain).
  void require_writable(const std::vector<CheckpointTensor>& tensors);

  // Refuses (collective error, nothing written) a state holding a non-finite value.
  void save(const CheckpointMeta& meta, const std::vector<CheckpointTensor>& tensors);
  // Reads into the tensors and verifies the root attributes' checksum, the model definition
  // against the deck, each dataset's shape and checksum, and that every value is finite;
  // collective errors name the file and the problem. Nothing on disk is modified.
  CheckpointMeta load(const std::string& path, const std::vector<CheckpointTensor>& tensors);
  // Test seam: called by save halfway through writing the tensors (the signal tests send a
  // stop signal there, src/train/stop_signal.hpp).
  void set_write_hook(std::function<void()> hook) { write_hook_ = std::move(hook); }

 private:
  const RunConfig& run_;
  Communicator& world_;
  std::string dir_;
  int64_t every_, keep_;
  bool at_end_, overwrite_;
  std::string resume_;
  // checkpoint.overwrite: another run's checkpoints, deleted once this run has published one.
  std::vector<std::string> replaced_;
  std::function<void()> write_hook_;
  LauncherWatch launcher_;  // a launcher gone: the run is ending, nothing more is published
};

// Checksum of elements [begin, end) of a tensor: a position-keyed hash summed with
// wraparound, so partial sums over any split of the elements add up to the whole.
uint64_t tensor_checksum(const float* data, int64_t begin, int64_t end);

}  // namespace tessera
