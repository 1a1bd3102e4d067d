#include "config/run_config.hpp"

#include <set>
#include <stdexcept>

#include "core/error.hpp"
#include "core/schema.hpp"

namespace tessera {
namespace {

// Reads keys of one deck and remembers which, so that from_deck can prove it read every key
// of the schema (a key added there without a field here fails every run at once).
class KeyReader {
 public:
  explicit KeyReader(const Deck& deck) : deck_(deck) {}

  int64_t integer(const std::string& name) { return seen(name).integer(name); }
  int narrow(const std::string& name) { return int(integer(name)); }
  double real(const std::string& name) { return seen(name).real(name); }
  bool boolean(const std::string& name) { return seen(name).boolean(name); }
  const std::string& str(const std::string& name) { return seen(name).str(name); }

  void require_all_read() const {
    for (const KeySpec& k : deck_schema())
      if (!read_.count(k.name()))
        throw std::logic_error("RunConfig::from_deck does not read the schema key " + k.name());
  }

 private:
  const Deck& seen(const std::string& name) {
    read_.insert(name);
    return deck_;
  }
  const Deck& deck_;
  std::set<std::string> read_;
};

}  // namespace

RunConfig RunConfig::from_deck(const Deck& deck) {
  KeyReader r(deck);
  RunConfig c;
  c.deck_ = deck;

  ModelSection& m = c.model;
  m.arch = parse_arch(r.str("model.arch"));
  m.layers = r.integer("model.layers");
  m.d_model = r.integer("model.d_model");
  m.heads = r.integer("model.heads");
  m.kv_heads = r.integer("model.kv_heads");
  m.ffn_hidden = r.integer("model.ffn_hidden");
  m.vocab = r.integer("model.vocab");
  m.vocab_multiple = r.integer("model.vocab_multiple");
  m.seq_len = r.integer("model.seq_len");
  m.norm_eps = r.real("model.norm_eps");
  m.rope_theta = r.real("model.rope_theta");
  m.tie_embeddings = parse_tie_embeddings(r.str("model.tie_embeddings"));
  m.init_std = r.real("model.init_std");
  m.experts = r.integer("model.experts");
  m.experts_top_k = r.integer("model.experts_top_k");
  m.shared_experts = r.integer("model.shared_experts");
  m.expert_ffn = r.integer("model.expert_ffn");
  m.moe_layers = r.str("model.moe_layers");
  m.router = parse_router(r.str("model.router"));
  m.aux_loss = r.real("model.aux_loss");
  m.router_bias_step = r.real("model.router_bias_step");
  m.z_loss = r.real("model.z_loss");
  m.capacity_factor = r.real("model.capacity_factor");

  DataSection& d = c.data;
  d.path = r.str("data.path");
  d.tokenizer = parse_tokenizer_kind(r.str("data.tokenizer"));
  d.val_fraction = r.real("data.val_fraction");
  d.document_mask = r.boolean("data.document_mask");

  TrainSection& t = c.train;
  t.steps = r.integer("train.steps");
  t.micro_batch = r.integer("train.micro_batch");
  t.global_batch = r.integer("train.global_batch");
  t.eval_every = r.integer("train.eval_every");
  t.eval_samples = r.integer("train.eval_samples");
  t.exit_after = r.integer("train.exit_after");
  t.seed = r.integer("train.seed");
  t.precision = parse_precision(r.str("train.precision"));
  t.loss_scale = r.real("train.loss_scale");
  t.loss_scale_window = r.integer("train.loss_scale_window");
  t.loss_scale_min = r.real("train.loss_scale_min");
  TESSERA_REQUIRE(t.loss_scale_min <= t.loss_scale, "train.loss_scale_min = ", t.loss_scale_min,
                  " is above train.loss_scale = ", t.loss_scale,
                  ": the run would start below its own floor; set loss_scale_min <= loss_scale");
  t.recompute = parse_recompute(r.str("train.recompute"));
  t.recompute_layers = r.integer("train.recompute_layers");
  t.head_chunk_rows = r.integer("train.head_chunk_rows");
  t.head_vocab_tile = r.integer("train.head_vocab_tile");
  t.on_nonfinite = parse_on_nonfinite(r.str("train.on_nonfinite"));
  t.nonfinite_limit = r.integer("train.nonfinite_limit");
  t.loss_spike = r.real("train.loss_spike");
  t.loss_spike_window = r.integer("train.loss_spike_window");

  OptimSection& o = c.optim;
  o.lr = r.real("optim.lr");
  o.min_lr = r.real("optim.min_lr");
  TESSERA_REQUIRE(o.min_lr <= o.lr, "optim.min_lr = ", o.min_lr, " is above optim.lr = ", o.lr,
                  ": the cosine decay would raise the learning rate; set optim.min_lr <= ", o.lr,
                  " (its default is 3e-5)");
  o.warmup = r.integer("optim.warmup");
  o.beta1 = r.real("optim.beta1");
  o.beta2 = r.real("optim.beta2");
  o.eps = r.real("optim.eps");
  o.weight_decay = r.real("optim.weight_decay");
  o.grad_clip = r.real("optim.grad_clip");
  o.decay_embeddings = r.boolean("optim.decay_embeddings");

  ParallelSection& p = c.parallel;
  p.tp = r.narrow("parallel.tp");
  p.sequence_parallel = r.boolean("parallel.sequence_parallel");
  p.cp = r.narrow("parallel.cp");
  p.pp = r.narrow("parallel.pp");
  p.pp_schedule = parse_pipe_schedule(r.str("parallel.pp_schedule"));
  p.cp_kind = parse_cp_kind(r.str("parallel.cp_kind"));
  p.pp_virtual = r.narrow("parallel.pp_virtual");
  p.pp_pair_overlap = r.boolean("parallel.pp_pair_overlap");
  p.pp_layers = r.str("parallel.pp_layers");
  p.dp = r.narrow("parallel.dp");
  p.ep = r.narrow("parallel.ep");
  p.ep_max_nodes = r.integer("parallel.ep_max_nodes");
  p.ep_nodes = r.integer("parallel.ep_nodes");
  p.ep_dispatch = parse_ep_dispatch(r.str("parallel.ep_dispatch"));
  p.order = r.str("parallel.order");
  p.zero = r.narrow("parallel.zero");
  p.zero_inflight = r.narrow("parallel.zero_inflight");
  p.shard_group = r.integer("parallel.shard_group");
  p.bucket_mb = r.real("parallel.bucket_mb");
  p.overlap = r.boolean("parallel.overlap");
  p.progress = dp_progress_from(r.str("parallel.progress"));
  p.grad_reduce_dtype = parse_reduce_dtype(r.str("parallel.grad_reduce_dtype"));

  HardwareSection& h = c.hardware;
  h.device = parse_device_kind(r.str("hardware.device"));
  h.ranks_per_node = r.narrow("hardware.ranks_per_node");
  h.threads = r.narrow("hardware.threads");
  h.peak_flops = r.real("hardware.peak_flops");

  OutputSection& out = c.output;
  out.dir = r.str("output.dir");
  out.log_every = r.integer("output.log_every");
  out.echo_deck = r.boolean("output.echo_deck");
  out.trace = r.boolean("output.trace");
  out.trace_steps = r.integer("output.trace_steps");
  out.compare_plan = r.boolean("output.compare_plan");
  out.comm_warn_share = r.real("output.comm_warn_share");

  CheckpointSection& k = c.checkpoint;
  k.every = r.integer("checkpoint.every");
  k.at_end = r.boolean("checkpoint.at_end");
  k.dir = r.str("checkpoint.dir");
  k.keep = r.integer("checkpoint.keep");
  k.resume = r.str("checkpoint.resume");
  k.overwrite = r.boolean("checkpoint.overwrite");
  k.allow_routing_change = r.boolean("checkpoint.allow_routing_change");

  SampleSection& s = c.sample;
  s.prompt = r.str("sample.prompt");
  s.length = r.integer("sample.length");
  s.temperature = r.real("sample.temperature");
  s.top_k = r.integer("sample.top_k");
  s.seed = r.integer("sample.seed");
  s.vocab_dir = r.str("sample.vocab_dir");
  s.print_ids = r.boolean("sample.print_ids");

  r.require_all_read();
  return c;
}

}  // namespace tessera
