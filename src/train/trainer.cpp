#include "train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>

#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "model/tensor_parallel.hpp"
#include "parallel/pp/paired_overlap.hpp"
#include "parallel/pp/stage_layers.hpp"
#include "train/device.hpp"
#include "train/nonfinite.hpp"

namespace tessera {

namespace {

// hardware.device = cuda: this rank's device, the one of its index among the ranks of its
// (physical) node (one rank per GPU, checked by require_device).
std::unique_ptr<kernels::Device> open_device(const RunConfig& run, ProcessGrid& grid) {
  if (run.hardware.device == DeviceKind::cpu) return nullptr;
  const int index = device_index(grid.world());
  // A rank that sees only its own GPU (Slurm's --gpu-bind=per_task:1) takes device 0.
  auto device =
      std::make_unique<kernels::Device>(index % std::max(1, kernels::cuda_device_count()));
  // Every group moves device tensors from now on: collectives through NCCL on a GPU, MPI on
  // an emulated device's host memory; point-to-point and all-to-all through host staging.
  DeviceLink link;
  link.compute_stream = device->compute_stream();
  link.comm_stream = device->comm_stream();
  link.copy = [](const Tensor& src, const Tensor& dst, int64_t n) {
    kernels::transfer(src, dst, n);
  };
  link.nccl = !device->emulated();
  grid.attach_device(link);
  return device;
}

}  // namespace

bool LossScaler::update(double scaled_norm) {
  if (!dynamic) return true;
  if (!std::isfinite(scaled_norm)) {
    TESSERA_REQUIRE(scale / 2 >= floor, "fp16 gradients overflow at the loss scale floor ",
                    "(train.loss_scale_min = ", floor, ") after ", skipped,
                    " skipped steps: training is diverging, not underflowing; lower optim.lr, "
                    "or train in bf16, whose range is that of fp32");
    scale /= 2, good = 0, ++skipped;
    return false;
  }
  if (++good == window) scale *= 2, good = 0;
  return true;
}

Trainer::Trainer(const RunConfig& run, ProcessGrid& grid)
    : Trainer(run, grid,
              RankLayout::make(run, grid.layout(), grid.world().rank(),
                               grid.blocked_nodes(Group::ep))) {}

Trainer::Trainer(const RunConfig& run, ProcessGrid& grid, const RankLayout& layout,
                 const std::function<void()>& before_allocating)
    : run_(run),
      layout_(layout),
      cfg_(layout.model),
      geo_(layout.batch),
      grid_(grid),
      par_{grid.dp(), grid.group(Group::tp), run.parallel.sequence_parallel,
           &grid.group(Group::cp)},
      device_(open_device(run, grid)),
      alloc_(device_ ? Allocator(device_->pool(), host_alloc_) : Allocator()),
      scratch_(alloc_),
      seed_(uint64_t(run.train.seed)),
      steps_(run.train.steps),
      data_(run.data.path, grid.world().raw(),
            {to_string(run.data.tokenizer), cfg_.vocab, cfg_.seq_len, geo_.global_batch,
             run.data.document_mask},
            run.data.val_fraction),
      eval_every_(run.train.eval_every) {
  const int64_t per_round = geo_.micro_batch * geo_.dp;
  eval_samples_ = (run.train.eval_samples + per_round - 1) / per_round * per_round;
  bool validation = false;  // some dataset of the blend has a validation split
  for (size_t d = 0; d < data_.size(); ++d)
    validation |= data_.dataset(d).samples(TokenDataset::validation) > 0;
  TESSERA_REQUIRE(eval_every_ == 0 || validation, "train.eval_every = ", eval_every_,
                  " but the validation split of '", run.data.path,
                  "' is empty; raise data.val_fraction or set "
                  "train.eval_every = 0");
  par_.cp_timing = &cp_timing_;
  par_.ep_timing = &ep_timing_;
  par_.ep = &grid.group(Group::ep);
  if (cfg_.moe.two_level) {  // doc/moe.md, "Two-level dispatch"
    grid.split_ep_by_node(int(cfg_.moe.nodes));
    par_.ep_intra = grid.ep_intra(), par_.ep_cross = grid.ep_cross();
  }
  warn_tp_across_nodes();
  const int stages = layout_.stages();
  if (stages > 1) {
    TESSERA_REQUIRE(grid.group(Group::pp).rank() == grid.coord().pp, "pipeline group rank ",
                    grid.group(Group::pp).rank(), " is not the stage ", grid.coord().pp);
    model_ = std::make_unique<Transformer>(cfg_, store_, layout_.chunks);
    model_->split_backward(layout_.schedule.split_backward());
  } else {
    model_ = std::make_unique<Transformer>(cfg_, store_);
  }
  index_whole_model();
  // Gradients are summed, and ZeRO shards the model state, over the data- and
  // context-parallel ranks together (dp_cp; the dp group when cp = 1).
  Communicator& dp_cp = grid.group(Group::dp_cp);
  if (before_allocating) before_allocating();
  store_.finalize(
      alloc_,
      DataParallel::store_layout(run.parallel, *model_, dp_cp.size(), grid.group(Group::ep).size()),
      cfg_.compute);
  // The layout's arithmetic is the planner's and the memory check's: it must be the store's.
  TESSERA_REQUIRE(double(store_.numel()) == layout_.params, "internal: the parameter buffer holds ",
                  store_.numel(), " elements, RankLayout counted ", layout_.params);
  static_cast<LossScaling&>(scaler_) = layout_.loss_scaling;
  AdamWConfig oc;
  oc.beta1 = float(run.optim.beta1);
  oc.beta2 = float(run.optim.beta2);
  oc.eps = float(run.optim.eps);
  oc.weight_decay = float(run.optim.weight_decay);
  oc.decay_embeddings = run.optim.decay_embeddings;
  dp_ = make_data_parallel(run.parallel, store_, *model_, dp_cp, dp_cp, alloc_,
                           &grid.expert_replicas());
  if (tied_over_pipeline()) dp_->defer(0);  // summed over the embedding group first
  dp_->initialize(seed_);
  dp_->refresh_compute();
  optim_ = std::make_unique<AdamW>(store_, alloc_, oc, dp_->segments());
  schedule_ = {run.optim.lr, run.optim.min_lr, run.optim.warmup, steps_};
  grad_clip_ = run.optim.grad_clip;
  spike_.factor = run.train.loss_spike;
  spike_.window = size_t(run.train.loss_spike_window);
  const int64_t T = cfg_.seq_local(), B = geo_.micro_batch;
  tokens_ = Buffer(alloc_.host(), Shape{B, cfg_.seq_len + 1}, DType::i32, Charge::workspace);
  mask_.assign(size_t(B * (cfg_.seq_len + 1)), 1);
  inputs_ = Buffer(alloc_, Shape{B, T}, DType::i32, Charge::workspace);
  targets_ = Buffer(alloc_, Shape{B, T}, DType::i32, Charge::workspace);
  if (alloc_.space() != Space::host) {  // loaded on the host, then copied to the device
    host_inputs_ = Buffer(alloc_.host(), Shape{B, T}, DType::i32, Charge::workspace);
    host_targets_ = Buffer(alloc_.host(), Shape{B, T}, DType::i32, Charge::workspace);
  }
  if (stages > 1) {
    pp_inputs_ = Buffer(alloc_, Shape{geo_.accum, B, T}, DType::i32, Charge::workspace);
    pp_targets_ = Buffer(alloc_, Shape{geo_.accum, B, T}, DType::i32, Charge::workspace);
  }
  if (run.data.document_mask) docs_ = DocumentBatch(alloc_, cfg_, B, stages > 1 ? geo_.accum : 1);
  // Every step runs through the pipeline executor (RankLayout::schedule).
  StepContext ctx = context(true);
  pipeline_ = std::make_unique<pp::Executor>(grid.group(Group::pp), layout_.schedule,
                                             Shape{tp::rows(ctx, B * T), cfg_.d_model}, alloc_);
  if (stages > 1) pipeline_hooks_.dp = dp_.get(), pipeline_hooks_.pipeline = pipeline_.get();
  pair_off_ = pp::paired_overlap_off(run.parallel, cfg_, run.hardware.device);
  if (pair_off_.empty())
    pair_ = std::make_unique<PassPair>(), pair_scratch_ = std::make_unique<Scratch>(alloc_);
}

void Trainer::index_whole_model() {
  ParamStore whole;
  ModelConfig every = cfg_;
  every.experts_held = {};  // every expert, as checkpoints hold them
  Transformer model(every, whole);
  for (Param* p : whole.params()) whole_model_.push_back({p->name, p->global});
}

void Trainer::warn_tp_across_nodes() {
  Communicator& tp = grid_.group(Group::tp);
  if (tp.size() == 1) return;
  const int64_t tokens = geo_.micro_batch * cfg_.seq_len / grid_.group(Group::cp).size();
  // A tensor-parallel group across nodes puts 4 all-reduces of every layer's activations
  // (2 forward, 2 backward) on the inter-node network (seed 002, case A).
  double nodes[2] = {-double(grid_.node()), double(grid_.node())};  // -min, max
  tp.all_reduce(nodes, 2, ReduceOp::max);
  double spans = -nodes[0] != nodes[1] ? 1.0 : 0.0;
  grid_.world().all_reduce(&spans, 1, ReduceOp::max);
  if (spans > 0 && grid_.world().rank() == 0) {
    const double bytes = 4.0 * double(cfg_.layers) * 2.0 * double(tp.size() - 1) /
                         double(tp.size()) * double(tokens * cfg_.d_model) * 4.0 *
                         double(geo_.accum);
    std::printf(
        "warning: a tensor-parallel group spans nodes: each rank sends about %.3g MB "
        "per step in tensor-parallel all-reduces (4 per layer of %lld x %lld floats) "
        "over the inter-node network, typically several times slower than within a "
        "node; keep parallel.tp within a node (order tp first, tp <= ranks per node)\n",
        bytes / 1e6, (long long)tokens, (long long)cfg_.d_model);
  }
}

StepContext Trainer::context(bool training) {
  StepContext ctx{alloc_, par_, scratch_};
  ctx.hooks = pipeline_hooks_.pipeline ? static_cast<PartHooks*>(&pipeline_hooks_) : dp_.get();
  ctx.batch = geo_.micro_batch;
  ctx.training = training;
  ctx.loss_scale = float(scaler_.scale / double(geo_.global_batch * cfg_.seq_len));
  return ctx;
}

void Trainer::sample(int64_t step, int64_t g, int32_t* out, uint8_t* mask, int32_t* doc) const {
  data_.train_sample(seed_, (step - 1) * geo_.global_batch + g, out, mask, doc);
}

void Trainer::set_trace(Trace* trace) {
  trace_ = trace;
  timer_.set_trace(trace);
  if (pipeline_) pipeline_->set_trace(trace);
  for (Communicator* c : dp_->own_groups()) c->set_trace(trace);
}

std::vector<const Communicator*> Trainer::own_groups() const {
  std::vector<const Communicator*> groups;
  for (Communicator* c : dp_->own_groups()) groups.push_back(c);
  return groups;
}

int64_t Trainer::load_micro_batch(
    const std::function<void(int64_t, int32_t*, uint8_t*, int32_t*)>& sample_row, int slot) {
  const int64_t T = cfg_.seq_len, B = geo_.micro_batch;
  for (int64_t b = 0; b < B; ++b)
    sample_row(b, tokens_.i32() + b * (T + 1), mask_.data() + b * (T + 1), docs_.window(b));
  // This rank's segments of each sequence (all of it without context parallelism), laid out
  // segment by segment: [segment][sequence][token of the segment].
  const bool staged = !host_inputs_.empty();
  int32_t* inputs = (staged ? host_inputs_ : inputs_).i32();
  int32_t* targets = (staged ? host_targets_ : targets_).i32();
  // A masked target is -1, which the cross-entropy ignores (loss and gradient 0); the step's
  // loss is divided by the unmasked targets of the global batch (Trainer::step). Document
  // masking masks the target of each document's last token (its EOS), the next document's
  // first token (doc/data.md, "Document masks").
  int64_t n = 0, unmasked = 0;
  for (const ContextParallel::Segment& g : cfg_.cp.segments(T))
    for (int64_t b = 0; b < B; ++b) {
      const int32_t* row = tokens_.i32() + b * (T + 1) + g.pos0;
      const uint8_t* mask = mask_.data() + b * (T + 1) + g.pos0;
      for (int64_t t = 0; t < g.len; ++t, ++n) {
        const bool keep = mask[t + 1] && !docs_.ends_document(b, g.pos0 + t);
        inputs[n] = row[t];
        targets[n] = keep ? row[t + 1] : -1;
        unmasked += keep ? 1 : 0;
      }
    }
  if (docs_.on()) docs_.store(slot);
  if (staged) {
    kernels::transfer(host_inputs_.view(), inputs_.view(), n);
    kernels::transfer(host_targets_.view(), targets_.view(), n);
  }
  return unmasked;
}

bool Trainer::eval_due(int64_t step, int64_t last_step) const {
  return eval_every_ > 0 && (step % eval_every_ == 0 || step == last_step);
}

double Trainer::pipeline_step(int64_t s, StepContext& ctx, double* targets) {
  const int64_t T = cfg_.seq_local(), B = geo_.micro_batch, n = B * T;
  Communicator& pp = grid_.group(Group::pp);
  const int stage = pp.rank(), last = pipeline_->shape().loss_stage();
  const bool serial = pp.size() == 1;  // one stage: each micro-batch loaded just before it runs
  *targets = 0;
  auto load = [&](int64_t m) {
    timer_.enter(Phase::data);
    // Global sample order within a step: micro-batch m of data-parallel rank r holds samples
    // [(m * dp + r) * B, (m * dp + r + 1) * B).
    const int64_t first = (m * geo_.dp + grid_.dp().rank()) * B;
    const int64_t unmasked =
        load_micro_batch([&](int64_t b, int32_t* row, uint8_t* mask,
                             int32_t* doc) { sample(s, first + b, row, mask, doc); },
                         serial ? 0 : int(m));
    if (stage == last) *targets += double(unmasked);  // summed like the loss
  };
  // Stage 0 reads the inputs, the stage with the loss the targets; with document masking every
  // stage reads its micro-batches' documents (attention and RoPE in every block need them).
  if (!serial && (stage == 0 || stage == last || docs_.on())) {
    for (int64_t m = 0; m < geo_.accum; ++m) {
      load(m);
      kernels::transfer(inputs_.view(), pp_inputs_.view().slice(m * n, n), n);
      kernels::transfer(targets_.view(), pp_targets_.view().slice(m * n, n), n);
    }
  }
  // Gradients are reduced over data-parallel ranks as each part finishes its last
  // micro-batch's backward; every schedule runs a chunk's backwards in micro-batch order, so
  // that is micro-batch m - 1.
  struct Work : pp::StageWork {
    Trainer& t;
    StepContext& ctx;
    bool serial;
    std::function<void(int64_t)> load;
    double loss = 0;
    Work(Trainer& tr, StepContext& c, bool one, std::function<void(int64_t)> l)
        : t(tr), ctx(c), serial(one), load(std::move(l)) {}
    // Micro-batch `micro` of a step's [micro-batches, B, T] tokens, as [B, T].
    Tensor micro_batch(const Buffer& all, int micro) const {
      const Tensor v = all.view();
      return v.rows(micro, 1).reshaped({v.shape[1], v.shape[2]});
    }
    Tensor forward(int micro, int chunk, int slot, const Tensor& x) override {
      if (serial) load(micro);
      t.timer_.enter(Phase::forward);
      ctx.slot = slot;
      ctx.docs = t.docs_.rows(serial ? 0 : micro);
      const Tensor ids = serial ? t.inputs_.view() : micro_batch(t.pp_inputs_, micro);
      const Tensor targets = serial ? t.targets_.view() : micro_batch(t.pp_targets_, micro);
      return t.model_->forward_chunk(ctx, chunk, ids, x, targets, &loss);
    }
    Tensor backward(int micro, int chunk, int slot, const Tensor& dy) override {
      t.timer_.enter(Phase::backward);
      ctx.slot = slot;
      ctx.docs = t.docs_.rows(serial ? 0 : micro);
      // The strategy also says when partial (sequence-parallel) gradients are summed over
      // tensor-parallel ranks: just before their data-parallel reduction.
      t.dp_->before_backward(ctx, micro == t.geo_.accum - 1);
      return t.model_->backward_chunk(ctx, chunk, dy);
    }
    // A split backward: the set of queued weight-gradient GEMMs of each (micro, chunk) from its
    // backward_input to its backward_weight. Both passes say whether the micro-batch is the
    // last: the strategy reduces after the weight pass, whatever ran between the two.
    std::vector<int> set_of;
    Tensor backward_input(int micro, int chunk, int slot, const Tensor& dy) override {
      StepContext& c = paired ? *paired : ctx;
      t.timer_.enter(Phase::backward);
      c.slot = slot;
      c.docs = t.docs_.rows(serial ? 0 : micro);
      t.dp_->before_backward(c, micro == t.geo_.accum - 1);
      set_of.resize(size_t(t.geo_.accum) * t.layout_.chunks.size(), -1);
      const size_t i = size_t(micro) * t.layout_.chunks.size() + size_t(chunk);
      return t.model_->backward_input_chunk(c, chunk, dy, &set_of[i]);
    }
    // DualPipe's pairs (parallel/pp/paired_overlap.hpp): the forward on ctx, the
    // backward_input on a context of its own over the second scratch space, interleaved at the
    // experts' all-to-alls. The phase timer follows the switches only at each pass's start.
    StepContext* paired = nullptr;
    bool interleaves() const override { return t.pair_ != nullptr; }
    void run_pair(const std::function<void()>& forward,
                  const std::function<void()>& backward_input) override {
      StepContext second = ctx.over(*t.pair_scratch_);
      ctx.pair = second.pair = t.pair_.get();
      paired = &second;
      try {
        t.pair_->run(forward, backward_input);
      } catch (...) {
        ctx.pair = nullptr, paired = nullptr;
        throw;
      }
      ctx.pair = nullptr, paired = nullptr;
    }
    void backward_weight(int micro, int chunk) override {
      t.timer_.enter(Phase::backward);
      t.dp_->before_backward(ctx, micro == t.geo_.accum - 1);
      const size_t i = size_t(micro) * t.layout_.chunks.size() + size_t(chunk);
      t.model_->backward_weight_chunk(ctx, chunk, set_of[i]);
      set_of[i] = -1;
    }
  } work(*this, ctx, serial, load);
  pipeline_->run(work);
  ctx.slot = 0;
  return work.loss;
}

// Forward only, one micro-batch at a time through the model chunks in order (each stage
// receives its chunk's input, runs it and sends the output on); the last stage has the loss.
double Trainer::pipeline_evaluate(size_t dataset) {
  const TokenDataset& data = data_.dataset(dataset);
  const int64_t T = cfg_.seq_local(), B = geo_.micro_batch;
  Communicator& pp = grid_.group(Group::pp);
  const pp::ScheduleShape& shape = pipeline_->shape();
  const int stage = pp.rank(), C = shape.model_chunks();
  StepContext ctx = context(false);
  const int64_t R = tp::rows(ctx, B * T), n = R * cfg_.d_model;
  const Tensor x = C > 1 ? ctx.scratch.get(ScratchId::pipeline_input, {R, cfg_.d_model}) : Tensor{};
  double sums[2] = {0, 0};  // the loss, the unmasked targets (last stage)
  double& loss_sum = sums[0];
  for (int64_t first = grid_.dp().rank() * B; first < eval_samples_; first += B * geo_.dp) {
    if (stage == 0 || stage == shape.loss_stage() || docs_.on()) {
      const int64_t unmasked =
          load_micro_batch([&](int64_t b, int32_t* row, uint8_t* mask,
                               int32_t* doc) { data.validation_sample(first + b, row, mask, doc); },
                           0);
      if (stage == shape.loss_stage()) sums[1] += double(unmasked);
      ctx.docs = docs_.rows(0);
    }
    for (int c = 0; c < C; ++c) {
      if (shape.stage_of(c) != stage) continue;
      // At the turn of a V the previous chunk ran here, and its output is already in x.
      if (c > 0 && shape.crosses(c - 1)) pp.irecv(x.slice(0, n), shape.stage_of(c - 1), 0).wait();
      const Tensor out = model_->forward_chunk(ctx, shape.local_chunk_of(c), inputs_.view(),
                                               c > 0 ? x : Tensor{}, targets_.view(), &loss_sum);
      if (c == C - 1) continue;
      if (shape.crosses(c))
        pp.isend(out.slice(0, n), shape.stage_of(c + 1), 0).wait();
      else
        kernels::copy(out, x, n);
    }
  }
  grid_.group(Group::dp_cp).all_reduce(sums, 2);
  pp.all_reduce(sums, 2);
  // The mean over the unmasked targets (every target without a loss mask); NaN when the
  // validation samples hold none.
  return sums[1] > 0 ? loss_sum / sums[1] : std::nan("");
}

void Trainer::evaluate(StepResult& r) {
  TraceSpan span(trace_, TraceKind::phase, "evaluate");
  if (data_.size() == 1) {
    r.val_loss = pipeline_evaluate(0);
    return;
  }
  // Every rank sees the same splits, so every rank skips the same datasets.
  double sum = 0, weight = 0;
  r.val_losses.assign(data_.size(), -1.0);
  for (size_t d = 0; d < data_.size(); ++d) {
    if (data_.dataset(d).samples(TokenDataset::validation) == 0) continue;
    r.val_losses[d] = pipeline_evaluate(d);
    sum += data_.part(d).weight * r.val_losses[d], weight += data_.part(d).weight;
  }
  r.val_loss = weight > 0 ? sum / weight : r.val_losses.front();
}

double SpikeRule::mean() const {
  double sum = 0;
  for (double x : recent) sum += x;
  return recent.empty() ? 0 : sum / double(recent.size());
}

bool SpikeRule::is_spike(double loss) const {
  return factor > 0 && recent.size() == window && loss > factor * mean();
}

void SpikeRule::applied(double loss) {
  if (factor <= 0) return;
  if (recent.size() < window)
    recent.push_back(loss);
  else
    recent[next] = loss;
  next = (next + 1) % window;
}

StepResult Trainer::step(int64_t s) {
  if (trace_) trace_->begin_step(s);
  TraceSpan span(trace_, TraceKind::step, "step");
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t T = cfg_.seq_len;
  StepContext ctx = context(true);
  timer_.enter(Phase::other);
  store_.zero_grads();
  dp_->begin_step();
  data_.check_unchanged();
  // sums: the summed token loss and the unmasked targets loaded, both non-zero on the last
  // stage only, summed over dp x cp (and pp) in one all-reduce below.
  double sums[2] = {0, 0};
  double& loss_sum = sums[0];
  loss_sum = pipeline_step(s, ctx, &sums[1]);
  // A data fault (a token id out of range, the file changed) on any rank makes the loss NaN
  // everywhere, so the update is dropped; the caller reports the fault (TokenDataset::fault).
  if (!data_.fault().empty() || injected_nonfinite(s)) loss_sum = std::nan("");
  if (injected_spike(s)) loss_sum *= 100;
  timer_.enter(Phase::grad_sync);
  // Tied embeddings over a pipeline: the first stage's table and the last stage's copy each
  // hold part of the gradient; both take the sum, so they stay identical (Megatron-LM). With
  // ZeRO the table's part is kept whole until this sum is taken, then sharded.
  auto sum_tied = [&] {
    if (!tied_over_pipeline()) return;
    Param* tied = model_->tied_copy();
    if (!tied) tied = const_cast<Param*>(store_.find("embed.tok.weight"));
    grid_.group(Group::embedding).all_reduce(tied->grad.slice(0, tied->local.numel()));
  };
  const float* grads = dp_->reduce_gradients(sum_tied);  // indexed as the segments say
  // The global norm: tensor-parallel blocks summed over tp, ZeRO pieces over the shard group,
  // pipeline stages over pp (the last stage's copy of a tied table not counted).
  const Param* copy = tied_over_pipeline() ? model_->tied_copy() : nullptr;
  GradSquares sq = grad_squares(store_, optim_->segments(), grads, copy);
  grid_.group(Group::tp).all_reduce(&sq.split, 1);
  if (cfg_.experts_held.size > 1) {  // each ep rank holds its own experts
    dp_->sum_experts_over_shards(&sq.expert, 1);
    grid_.group(Group::ep).all_reduce(&sq.expert, 1);
  }
  double squares = sq.split + sq.replicated;
  dp_->sum_over_shards(&squares, 1);
  squares += sq.expert;
  grid_.group(Group::dp_cp).all_reduce(sums, 2);
  if (pipeline()) {  // the loss is the last stage's; the norm sums every stage's
    double all[3] = {squares, sums[0], sums[1]};
    grid_.group(Group::pp).all_reduce(all, 3);
    squares = all[0], sums[0] = all[1], sums[1] = all[2];
  }
  timer_.enter(Phase::optimizer);
  StepResult r;
  r.step = s;
  // Loss masks (doc/data.md, "Loss masks"): the loss is the mean over the global batch's
  // unmasked targets, U of them. The head scaled every gradient by 1/(G T) (ctx.loss_scale:
  // U is known only once every micro-batch is loaded, after the first backward), so the
  // gradients are the true ones times U / (G T): the norm and the update take them times
  // unmask = G T / U, one scalar each, with no pass over the gradients and no collective of
  // its own (U rides on the loss's all-reduce). Without a mask U = G T and unmask is 1 exactly.
  r.targets = int64_t(sums[1]);
  const double unmask = double(geo_.global_batch * T) / sums[1];
  r.loss = loss_sum / sums[1];
  r.loss_scale = scaler_.scale;
  r.grad_norm = std::sqrt(squares) / scaler_.scale * unmask;
  r.lr = schedule_.at(s);
  // The loss and the norm are sums over every rank that contributes to them, so every rank
  // sees the same NaN or Inf and drops the same update. Under fp16 a non-finite norm with a
  // finite loss is an overflow of the scaled gradients: the loss scaler's to handle.
  r.finite = std::isfinite(r.loss) && (scaler_.dynamic || std::isfinite(r.grad_norm));
  r.spike = r.finite && spike_.is_spike(r.loss);
  r.spike_mean = spike_.mean();
  r.skipped = r.finite && !r.spike && !scaler_.update(std::sqrt(squares));
  if (r.finite && !r.spike && !r.skipped) {
    spike_.applied(r.loss);
    // The gradients carry the loss scale; the update takes them unscaled (fused with clipping),
    // and writes the 16-bit compute copy in the same pass where the strategy allows.
    const Tensor compute = dp_->optimizer_compute();
    optim_->step(r.lr, s, dp_->optimizer_values(), dp_->optimizer_index(), grads,
                 float(clip_factor(r.grad_norm, grad_clip_) / r.loss_scale * unmask), compute);
    if (dp_->gathers_after_optimizer()) {  // every rank needs the updated parameters
      timer_.enter(Phase::grad_sync);
      dp_->after_optimizer();
    }
    if (!compute.data) dp_->refresh_compute();
  }
  // Mixture of experts: the step's routing statistics, and the selection bias's update when
  // the step was applied.
  bool moved = false;  // a selection bias updated in a ZeRO-3 shard
  for (Moe* m : model_->moe_layers()) {
    m->end_step(grid_.group(Group::dp_cp), r.finite && !r.spike && !r.skipped);
    if (m->held_bias_update().empty()) continue;
    // The shard's elements of the bias: the segments that overlap its flat range.
    const Param& p = m->selection_bias();
    const Holding h = dp_->values();
    for (const ShardSegment& g : *h.segments) {
      const int64_t first = std::max(g.global, p.offset);
      const int64_t last = std::min(g.global + g.n, p.offset + p.local.numel());
      for (int64_t i = first; i < last; ++i)
        h.data[g.local + (i - g.global)] += m->held_bias_update()[size_t(i - p.offset)];
    }
    moved = true;
  }
  if (moved) dp_->refresh_compute();  // a 16-bit gather reads the compute shard
  timer_.stop();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::vector<CheckpointTensor> Trainer::checkpoint_tensors() {
  // This rank's piece of p in an array laid out like the flat buffers (the whole buffer,
  // or a ZeRO shard): each part holds whole parameters, and a rank holds one segment per
  // part, so a piece is one element range of p's block. Ranks holding identical data split
  // its writing: the strategy's replicas of the array, times the tensor-parallel ranks when
  // p is replicated over them.
  auto piece = [&](const std::string& path, const Param& p, const Holding& h) {
    CheckpointTensor ct;
    ct.path = path, ct.global = p.global, ct.data = h.data;
    if (p.tp.split()) {
      ct.block = p.local;
      for (int d = 0; d < p.global.ndim; ++d) ct.start[size_t(d)] = p.block_start(d);
    }
    std::vector<const Communicator*> groups{p.expert ? h.expert_replicas : h.replicas};
    if (!p.tp.split()) groups.push_back(&grid_.group(Group::tp));
    // The last pipeline stage's copy of a tied table is read back but not written: the
    // first stage's table is the tensor (its ZeRO pieces need not line up with the copy's).
    ct.writes = &p != model_->tied_copy();
    for (const Communicator* g : groups)
      ct.holder += ct.holders * g->rank(), ct.holders *= g->size();
    ct.n = 0;
    for (const ShardSegment& s : *h.segments) {
      const int64_t a = std::max(s.global, p.offset);
      const int64_t b = std::min(s.global + s.n, p.offset + p.local.numel());
      if (a < b) ct.data = h.data + s.local + (a - s.global), ct.begin = a - p.offset, ct.n = b - a;
    }
    return ct;
  };
  const Holding values = host_copy(dp_->values(), 0), m = host_copy(dp_->state(optim_->m()), 1),
                v = host_copy(dp_->state(optim_->v()), 2);
  std::vector<CheckpointTensor> t;
  // Every rank passes every tensor of the whole model in one order; a pipeline stage passes
  // those of other stages with nothing held (n = 0).
  static float nothing = 0;
  for (const WholeParam& w : whole_model_) {
    Param* p = const_cast<Param*>(store_.find(w.name));
    const std::string& n = w.name;
    if (!p) {
      for (const char* prefix : {"params/", "optim/adam_m/", "optim/adam_v/"}) {
        CheckpointTensor ct;
        ct.path = prefix + n, ct.global = w.global, ct.data = &nothing, ct.n = 0;
        t.push_back(ct);
      }
      continue;
    }
    t.push_back(piece("params/" + n, *p, values));
    t.push_back(piece("optim/adam_m/" + n, *p, m));
    t.push_back(piece("optim/adam_v/" + n, *p, v));
  }
  return t;
}

Holding Trainer::host_copy(const Holding& h, size_t i) {
  if (alloc_.space() == Space::host) return h;
  int64_t n = 0;
  for (const ShardSegment& s : *h.segments) n = std::max(n, s.local + s.n);
  if (staging_.size() <= i) staging_.resize(i + 1);
  Staged& st = staging_[i];
  if (st.host.numel() < n) st.host = Buffer(alloc_.host(), Shape{n}, DType::f32, Charge::workspace);
  st.device = h.data, st.n = n;
  kernels::transfer(view_of(h.data, {n}, alloc_.space()), st.host.view(), n);
  Holding c = h;
  c.data = st.host.f32();
  return c;
}

void Trainer::unstage() {
  for (const Staged& st : staging_)
    kernels::transfer(st.host.view(), view_of(st.device, {st.n}, alloc_.space()), st.n);
}

std::string Trainer::layout_json() const {
  const GridDegrees& d = grid_.layout().degrees();
  return cat("{\"world\": ", grid_.world().size(), ", \"tp\": ", d.tp, ", \"cp\": ", d.cp,
             ", \"ep\": ", d.ep, ", \"dp\": ", d.dp, ", \"pp\": ", d.pp, ", \"order\": \"",
             grid_.layout().order_string(), "\", \"zero\": ", zero_stage(),
             ", \"shard_group\": ", shard_ranks(), ", \"micro_batch\": ", geo_.micro_batch,
             ", \"accumulation\": ", geo_.accum,
             ", \"sequence_parallel\": ", par_.sequence_parallel ? "true" : "false",
             ", \"cp_kind\": \"", to_string(cfg_.cp.kind), "\", \"pp_schedule\": \"",
             to_string(pipeline_->shape().kind), "\", \"pp_virtual\": ", pipeline_->shape().chunks,
             ", \"compute_dtype\": \"", dtype_name(compute_dtype()), "\"}");
}

void Trainer::save(Checkpointer& ckpt, int64_t step) {
  TraceSpan span(trace_, TraceKind::phase, "checkpoint");
  timer_.enter(Phase::other);
  CheckpointMeta meta;
  meta.step = step;
  meta.samples = step * geo_.global_batch;
  meta.seed = int64_t(seed_);
  meta.deck_json = run_.to_json();
  meta.layout_json = layout_json();
  meta.loss_scale = scaler_.dynamic ? scaler_.scale : 0;
  meta.loss_scale_good = scaler_.good;
  ckpt.save(meta, checkpoint_tensors());  // ZeRO: each rank writes its own pieces
  timer_.stop();
}

int64_t Trainer::restore(Checkpointer& ckpt, bool for_sampling) {
  const std::string path = ckpt.resume_path();
  if (path.empty()) return 0;
  CheckpointMeta meta;
  meta = ckpt.load(path, checkpoint_tensors());
  unstage();
  dp_->refresh_compute();
  if (scaler_.dynamic && meta.loss_scale > 0)  // resuming fp16 from fp16: the scaler goes on
    scaler_.scale = meta.loss_scale, scaler_.good = meta.loss_scale_good;
  TESSERA_REQUIRE(for_sampling || meta.samples == meta.step * geo_.global_batch, "checkpoint '",
                  path, "' was written with ", meta.samples / std::max<int64_t>(1, meta.step),
                  " sequences per step but train.global_batch is ", geo_.global_batch,
                  "; the data position would not line up");
  if (grid_.world().rank() == 0) {
    std::printf("resumed from %s: %lld steps done, layout then %s\n", path.c_str(),
                (long long)meta.step, meta.layout_json.c_str());
    if (meta.seed != int64_t(seed_))
      std::printf(
          "note: checkpoint seed %lld differs from train.seed %lld; the data order "
          "follows train.seed from here\n",
          (long long)meta.seed, (long long)seed_);
  }
  return meta.step;
}

}  // namespace tessera
