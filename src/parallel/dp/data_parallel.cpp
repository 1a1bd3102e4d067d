#include "parallel/dp/data_parallel.hpp"

#include <cstdio>

#include "core/error.hpp"
#include "parallel/dp/zero.hpp"
#include "parallel/rank_layout.hpp"

namespace tessera {
namespace {

// Every data-parallel rank holds the whole model state; gradients are summed by all-reduce
// in buckets that start during the last micro-batch's backward (grad_buckets.hpp).
class Replicated : public DataParallel {
 public:
  Replicated(const ParallelSection& o, ParamStore& store, const Transformer& model,
             Communicator& dp, Communicator& holders, Allocator& alloc, Communicator* expert_dp)
      : store_(store),
        parts_(model.parts()),
        final_pass_(model.access().final_pass()),
        dp_(dp),
        holders_(holders),
        expert_dp_(expert_dp),
        bucket_mb_(o.bucket_mb),
        buckets_(store, dp, o.bucket_mb, o.overlap, o.progress, o.grad_reduce_dtype, &alloc,
                 expert_dp),
        whole_{{0, 0, store.numel()}} {}

  void initialize(uint64_t seed) override { store_.initialize(seed); }
  // The token table's gradient is reduced whole like every other; whole_final runs after.
  void defer(int) override {}
  void begin_step() override { buckets_.arm(true); }
  void before_backward(StepContext& ctx, bool last_micro_batch) override {
    last_ = last_micro_batch;
    ctx.reduce_partial_grads = last_micro_batch;
  }
  void begin(int, Pass, bool) override {}
  // A part's gradients are final once its backward of the last micro-batch ends.
  void end(int part, Pass pass, bool training) override {
    if (training && pass == final_pass_ && last_)
      buckets_.ready(parts_[size_t(part)].first, parts_[size_t(part)].second);
  }
  const float* reduce_gradients(const std::function<void()>& whole_final) override {
    buckets_.finish();
    if (whole_final) whole_final();
    return store_.grads();
  }
  const std::vector<ShardSegment>& segments() const override { return whole_; }
  void sum_over_shards(double*, int) override {}
  void sum_experts_over_shards(double*, int) override {}
  float* optimizer_values() override { return store_.values(); }
  AdamW::Index optimizer_index() const override { return AdamW::Index::global; }
  bool gathers_after_optimizer() const override { return false; }
  void after_optimizer() override {}
  void refresh_compute() override { store_.refresh_compute(); }
  Tensor optimizer_compute() override { return store_.compute(); }
  Holding values() override { return {store_.values(), &whole_, &holders_, expert_dp_}; }
  Holding state(float* local) override { return {local, &whole_, &holders_, expert_dp_}; }

  int zero_stage() const override { return 0; }
  int64_t shard_ranks() const override { return 1; }
  std::vector<Communicator*> own_groups() override { return {}; }
  const DpSyncTiming& last_sync() const override { return buckets_.last_step(); }
  std::string summary() const override {
    if (dp_.size() == 1) return "";
    char line[160];
    std::snprintf(line, sizeof line,
                  "gradient buckets: %d of ~%g MiB; %d started during backward (last step)\n",
                  buckets_.buckets(), bucket_mb_, buckets_.started_early());
    return line;
  }
  std::string sync_settings() const override {
    return cat("overlap ", buckets_.overlap() ? "on" : "off", ", progress ",
               to_string(buckets_.progress()));
  }
  bool sync_hidden_measured() const override {
    return !buckets_.overlap() || buckets_.progress() == DpProgress::poll;
  }

 private:
  ParamStore& store_;
  std::vector<std::pair<int, int>> parts_;  // registration-index range of each model part
  Pass final_pass_;  // after which a micro-batch's gradients of a part are complete
  Communicator& dp_;
  const Communicator& holders_;
  const Communicator* expert_dp_;
  double bucket_mb_;
  GradBuckets buckets_;
  std::vector<ShardSegment> whole_;
  bool last_ = false;
};

}  // namespace

StoreLayout DataParallel::store_layout(const ParallelSection& o, const Transformer& model,
                                       int64_t dp, int64_t ep) {
  // RankLayout::make checked the shard groups.
  const int64_t k = shard_ranks_of(o.shard_group, dp);
  if (o.zero >= 1) return Zero::layout(o.zero, model, k, expert_shard_ranks_of(k, ep));
  // Replicated: the model's parts too (a held expert section ends its part; every parameter is
  // 16-aligned already, so the parts add no padding).
  StoreLayout l;
  l.parts = model.parts();
  return l;
}

std::unique_ptr<DataParallel> make_data_parallel(const ParallelSection& o, ParamStore& store,
                                                 const Transformer& model, Communicator& dp,
                                                 Communicator& holders, Allocator& alloc,
                                                 Communicator* expert_dp) {
  if (o.zero == 0)
    return std::make_unique<Replicated>(o, store, model, dp, holders, alloc, expert_dp);
  const DType reduce = o.grad_reduce_dtype == ReduceDtype::bf16 ? DType::bf16 : DType::f32;
  const int64_t ep = expert_dp ? dp.size() / expert_dp->size() : 1;
  const int64_t k = shard_ranks_of(o.shard_group, dp.size());
  return std::make_unique<Zero>(o.zero, store, model, dp, holders, k, o.overlap, o.zero_inflight,
                                reduce, alloc, expert_dp, expert_shard_ranks_of(k, ep));
}

}  // namespace tessera
