// ZeRO stages 1-3 over the data-parallel group, and HSDP on top of them.
//
// The flat parameter and gradient buffers are laid out part by part (embedding, blocks,
// head; ParamStore::parts()), each part padded to a multiple of 16*K elements, and every
// part is split evenly over the K ranks of a shard group: rank r owns elements
// [begin + r*n, begin + (r+1)*n) of a part of size K*n. A rank's shard is the concatenation
// of its pieces of all parts ("local" indexing; ShardSegment maps between the two).
//
//   stage 1: full parameters and gradients; during the last micro-batch's backward each
//            part's gradients are reduce-scattered to their owners as soon as they are final
//            (non-blocking, overlapping the rest of backward; parallel.overlap = false waits
//            for the end of backward); AdamW updates the owned pieces (moments 1/K); the
//            updated pieces are all-gathered in place.
//   stage 2: as 1, but no full gradient buffer: a part's gradients are written into a staging
//            buffer during its backward and reduce-scattered (non-blocking, overlapping the
//            next parts' backward) into the gradient shard, every micro-batch; at most
//            parallel.zero_inflight reductions are in flight (the oldest is completed before
//            another starts), so the staging buffers are the same in every run.
//   stage 3: as 2, and parameters too are held as shards only: a part's parameters are
//            all-gathered into a buffer just before its forward and again before its
//            backward, the next part's gather is started (prefetch) while this one computes,
//            and the buffer is released after use.
// HSDP (shard group K < dp): the shard groups are consecutive data-parallel ranks; after the
// last micro-batch, each gradient shard is all-reduced across the groups holding the same
// shard (replica group).
//
// Model-state bytes per rank for fp32 training (Psi parameters, N = K ranks per shard;
// checked by the test zero_memory_formulas):
//   stage 0: params 4Psi + grads 4Psi + Adam 8Psi            = 16Psi
//   stage 1: params 4Psi + grads 4Psi + 4Psi/N + Adam 8Psi/N  = 8Psi + 12Psi/N
//   stage 2: params 4Psi + grads 4Psi/N + Adam 8Psi/N         = 4Psi + 12Psi/N
//   stage 3: params 4Psi/N + grads 4Psi/N + Adam 8Psi/N       = 16Psi/N
// plus the gather and staging buffers of the parts in use, charged to communication buffers.
#pragma once

#include <functional>
#include <vector>

#include "comm/communicator.hpp"
#include "model/param.hpp"
#include "model/step_context.hpp"
#include "model/transformer.hpp"
#include "optim/adamw.hpp"

namespace tessera {

// Buffers handed out and taken back, reused across steps so steady state allocates nothing.
class BufferPool {
 public:
  BufferPool(Allocator& alloc, Charge charge) : alloc_(alloc), charge_(charge) {}
  Buffer take(int64_t n);  // n floats; contents undefined
  void give(Buffer&& b);

 private:
  Allocator& alloc_;
  Charge charge_;
  std::vector<Buffer> free_;
};

class Zero : public PartHooks {
 public:
  // The store layout stage and shard group size k need (call before store.finalize).
  static StoreLayout layout(int stage, const Transformer& model, int64_t k);

  // dp is split into shard groups of shard_group consecutive ranks and replica groups.
  // inflight (stages 2-3): reduce-scatters in flight at most; starting one more first
  // completes the oldest, so which buffers exist does not depend on MPI's progress.
  Zero(int stage, ParamStore& store, const Transformer& model, Communicator& dp,
       int64_t shard_group, bool overlap, int inflight, Allocator& alloc);

  int stage() const { return stage_; }
  Communicator& shard_comm() { return shard_comm_; }
  Communicator& replica_comm() { return replica_comm_; }
  const std::vector<ShardSegment>& segments() const { return segments_; }
  int64_t local_size() const { return local_size_; }
  // Stage 3: the parameter shard (indexed locally); null below stage 3.
  float* value_shard() const { return value_shard_.f32(); }

  // Stage 3: initialises the owned pieces part by part (no full copy is ever made).
  void initialize(uint64_t seed);
  // Before the first micro-batch of a step.
  void begin_step();
  // Before each micro-batch's backward (stage 1 reduces during the last one only).
  void arm(bool last_microbatch) { armed_ = last_microbatch && overlap_; }
  // Keeps a part's gradients whole until reduce_gradients (a pipeline's tied token table: its
  // two copies' gradients are summed over the embedding group before they are sharded).
  void defer(int part) { deferred_[size_t(part)] = true; }
  // After the last micro-batch's backward: this rank's summed gradients, indexed locally.
  // before_deferred runs when every deferred part's gradients are whole and final.
  float* reduce_gradients(const std::function<void()>& before_deferred = {});
  // After the optimizer: stages 1-2 all-gather the updated pieces into the full buffer.
  void gather_values();

  void begin(int part, Pass pass, bool training) override;
  void end(int part, Pass pass, bool training) override;

 private:
  struct PartState {
    Buffer values;  // stage 3: the gathered part while in use
    Request gather;
    enum { absent, gathering, ready } state = absent;
    Buffer grads;  // stages 2-3: staged gradients while the part's backward writes them
  };
  struct Pending {  // a part's gradients being reduce-scattered
    int part = 0;
    Request request;
    Buffer staged, piece;  // stage 1: both empty (full buffer -> gradient shard directly)
  };
  int64_t piece(int part) const { return store_.parts()[size_t(part)].size / k_; }
  int64_t local_of(int part) const { return store_.parts()[size_t(part)].begin / k_; }
  void point_values(int part, float* base);
  void point_grads(int part, float* base);
  void prefetch(int part);
  void need(int part);
  void drop(int part);
  void stage_grads(int part);
  void start_reduce(int part);
  void complete(Pending& p);
  void retire_oldest();
  void poll();

  int stage_;
  ParamStore& store_;
  const Transformer& model_;
  int64_t k_;
  bool overlap_, armed_ = false;
  int inflight_;
  std::vector<bool> reducing_;  // stage 1: the part's reduction has started this step
  std::vector<bool> deferred_;
  Communicator shard_comm_, replica_comm_;
  std::vector<ShardSegment> segments_;
  int64_t local_size_ = 0;
  Buffer value_shard_, grad_shard_;
  BufferPool pool_;
  std::vector<PartState> parts_;
  std::vector<Pending> pending_;
};

}  // namespace tessera
