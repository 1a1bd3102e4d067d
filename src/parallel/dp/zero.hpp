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
// When each of these happens is decided by ZeroSchedule (zero_schedule.hpp); this class
// carries the decisions out.
// HSDP (shard group K < dp): the shard groups are consecutive data-parallel ranks; after the
// last micro-batch, each gradient shard is all-reduced across the groups holding the same
// shard (replica group).
// Held experts (expert parallelism, Param::expert): a part's expert section (ParamPart) is
// split the same way over the expert-data-parallel group (edp, the ranks holding the same
// experts) instead of dp: expert shard groups of K_e consecutive edp ranks (K_e = K / ep, at
// least 1), their replicas summing the gradient shards. A rank's local layout is its dense
// pieces of every part, then its expert pieces; each collective on a part is one per section.
//
// Model-state bytes per rank for fp32 training (Psi parameters, N = K ranks per shard;
// checked by the test zero_memory_formulas):
//   stage 0: params 4Psi + grads 4Psi + Adam 8Psi            = 16Psi
//   stage 1: params 4Psi + grads 4Psi + 4Psi/N + Adam 8Psi/N  = 8Psi + 12Psi/N
//   stage 2: params 4Psi + grads 4Psi/N + Adam 8Psi/N         = 4Psi + 12Psi/N
//   stage 3: params 4Psi/N + grads 4Psi/N + Adam 8Psi/N       = 16Psi/N
// plus the gather and staging buffers of the parts in use, charged to communication buffers.
#pragma once

#include <deque>
#include <functional>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/dp/data_parallel.hpp"
#include "parallel/dp/zero_schedule.hpp"

namespace tessera {

// Buffers handed out and taken back, reused across steps so steady state allocates nothing.
class BufferPool {
 public:
  BufferPool(Allocator& alloc, Charge charge) : alloc_(alloc), charge_(charge) {}
  Buffer take(int64_t n, DType dtype = DType::f32);  // n elements; contents undefined
  void give(Buffer&& b);

 private:
  Allocator& alloc_;
  Charge charge_;
  std::vector<Buffer> free_;
};

class Zero : public DataParallel {
 public:
  // The store layout stage and shard group size k need (call before store.finalize).
  // expert_k: ranks per expert shard group (K_e).
  static StoreLayout layout(int stage, const Transformer& model, int64_t k, int64_t expert_k = 1);

  // dp is split into shard groups of shard_group consecutive ranks and replica groups.
  // holders: the ranks holding one whole copy of the parameters (stages 1-2).
  // reduce: the dtype gradients travel in (parallel.grad_reduce_dtype): f32, or bf16, rounded
  // into 16-bit staging buffers, summed pairwise in fp32 and rounded again by the collective,
  // and widened into the fp32 gradient shard.
  // expert_dp (edp) is split into expert shard groups of expert_group consecutive ranks.
  Zero(int stage, ParamStore& store, const Transformer& model, Communicator& dp,
       Communicator& holders, int64_t shard_group, bool overlap, int inflight, DType reduce,
       Allocator& alloc, Communicator* expert_dp = nullptr, int64_t expert_group = 1);

  Communicator& shard_comm() { return shard_comm_; }
  Communicator& replica_comm() { return replica_comm_; }

  // Stage 3 initialises the owned pieces part by part (no full copy is ever made).
  void initialize(uint64_t seed) override;
  void defer(int part) override { schedule_.defer(part); }
  void begin_step() override;
  // Stage 1 reduces during the last micro-batch's backward only; stages 2-3 reduce every
  // micro-batch, so gradients partial over tensor-parallel ranks are summed every time.
  void before_backward(StepContext& ctx, bool last_micro_batch) override {
    armed_ = last_micro_batch && overlap_;
    ctx.reduce_partial_grads = last_micro_batch || stage_ >= 2;
  }
  const float* reduce_gradients(const std::function<void()>& whole_final) override;
  const std::vector<ShardSegment>& segments() const override { return segments_; }
  void sum_over_shards(double* x, int n) override { shard_comm_.all_reduce(x, n); }
  void sum_experts_over_shards(double* x, int n) override {
    if (has_experts_) expert_shard_comm_.all_reduce(x, n);
  }
  // Stage 3: the parameter shard (indexed locally); below: the whole flat buffer.
  float* optimizer_values() override {
    return stage_ == 3 ? value_shard_.ptr_f32() : store_.values();
  }
  AdamW::Index optimizer_index() const override {
    return stage_ == 3 ? AdamW::Index::local : AdamW::Index::global;
  }
  // Stages 1-2 all-gather the updated pieces into the full buffer; stage 3's shard is the
  // only copy, gathered by the next forward.
  bool gathers_after_optimizer() const override { return stage_ < 3; }
  void after_optimizer() override;
  // Stage 3 in bf16/fp16 keeps a 16-bit copy of its parameter shard (2Psi/N, params), made
  // here, which the gathers move: half the bytes of gathering fp32. A gathered part's fp32
  // values are widened from it, so every parameter a layer reads is the rounded master (as
  // Megatron-LM's and FSDP's 16-bit parameters); below stage 3, the store's compute copy.
  void refresh_compute() override;
  // Stage 3: the 16-bit shard, written by the optimizer with the fp32 one.
  Tensor optimizer_compute() override {
    return half_gather_ ? compute_shard_.view() : Tensor{};
  }
  Holding values() override;
  Holding state(float* local) override {
    return {local, &segments_, &replica_comm_, &expert_replica_comm_};
  }

  int zero_stage() const override { return stage_; }
  int64_t shard_ranks() const override { return k_; }
  std::vector<Communicator*> own_groups() override {
    if (!has_experts_) return {&shard_comm_, &replica_comm_};
    return {&shard_comm_, &replica_comm_, &expert_shard_comm_, &expert_replica_comm_};
  }
  const DpSyncTiming& last_sync() const override { return no_timing_; }
  std::string summary() const override { return ""; }
  std::string sync_settings() const override;
  bool sync_hidden_measured() const override { return false; }

  void begin(int part, Pass pass, bool training) override;
  void end(int part, Pass pass, bool training) override;

 private:
  struct PartState {
    Buffer values;  // stage 3: the gathered part while in use
    Buffer compute;  // and its compute copy (train.precision bf16 / fp16): what is gathered
    std::vector<Request> gather;  // one per section
    Buffer grads;   // stages 2-3: staged gradients while the part's backward writes them
  };
  struct Pending {  // a part's gradients being reduce-scattered
    int part = 0;
    std::vector<Request> request;  // one per section
    // stage 1 in f32: both empty (full buffer -> gradient shard directly); in bf16 both are.
    Buffer staged, piece;
  };
  // A part's dense section or its expert section: elements [begin, begin + size) of the flat
  // buffers, split over k ranks; this rank's piece sits at `local` in its shard.
  struct Section {
    int64_t begin = 0, size = 0, k = 1, local = 0;
    bool expert = false;
    int64_t piece() const { return size / k; }
  };
  Communicator& shard_of(const Section& s) { return s.expert ? expert_shard_comm_ : shard_comm_; }
  // This rank's pieces of a part, all sections together (the pool's piece buffers).
  int64_t piece(int part) const {
    int64_t n = 0;
    for (const Section& s : sections_[size_t(part)]) n += s.piece();
    return n;
  }
  void point_values(int part, float* base);
  void point_grads(int part, float* base);
  void run(const std::vector<ZeroAction>& actions);
  void build(int part);
  void reduce(int part);
  void retire();
  void poll();

  int stage_;
  ParamStore& store_;
  int64_t k_, expert_k_;
  bool has_experts_ = false;  // some part has an expert section
  bool overlap_, armed_ = false;
  DType reduce_dtype_;
  bool half_gather_;  // stage 3 gathers the 16-bit compute shard
  Communicator shard_comm_, replica_comm_, expert_shard_comm_, expert_replica_comm_;
  const Communicator& holders_;
  const Communicator* expert_dp_;
  std::vector<std::vector<Section>> sections_;  // per part
  int64_t dense_local_ = 0;  // the shard's dense pieces: [0, dense_local_); experts after
  std::vector<ShardSegment> segments_;
  std::vector<ShardSegment> whole_;  // the flat buffers as one segment (stages 1-2 values)
  int64_t local_size_ = 0;
  Buffer value_shard_, grad_shard_, compute_shard_;
  BufferPool pool_;
  ZeroSchedule schedule_;
  uint64_t seed_ = 0;  // for build actions
  std::vector<PartState> parts_;
  std::deque<Pending> pending_;
  DpSyncTiming no_timing_;
};

}  // namespace tessera
