// tessera-refdump: writes what the PyTorch reference needs to check tessera's serial model:
// the initial weights, logits/loss/gradients on one batch, and train.steps AdamW steps with
// their batches, losses, learning rates and gradient norms. Format: check_reference.py. With a
// loss mask (doc/data.md, "Loss masks") the batches' masks too (/check/mask, /train/mask), and
// with data.document_mask their windows' document starts (/check/docs, /train/docs).
//   tessera-refdump OUT.h5 DECK.in [--section.key=value ...]
#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

#include "app/errors.hpp"
#include "config/run_config.hpp"
#include "io/h5.hpp"
#include "train/document_batch.hpp"
#include "train/trainer.hpp"

namespace tessera {
namespace {

void write_config(H5File& f, const RunConfig& run, const ModelConfig& c, int64_t steps) {
  f.attr("arch", std::string(c.arch_name()));
  f.attr("layers", c.layers);
  f.attr("d_model", c.d_model);
  f.attr("heads", c.heads);
  f.attr("kv_heads", c.kv_heads);
  f.attr("ffn_hidden", c.ffn_hidden);
  f.attr("vocab", c.vocab);
  f.attr("vocab_padded", c.vocab_padded);
  f.attr("seq_len", c.seq_len);
  f.attr("norm_eps", double(c.norm_eps));
  f.attr("rope_theta", double(c.rope_theta));
  f.attr("tie_embeddings", int64_t(c.tie_embeddings));
  f.attr("init_std", double(c.init_std));
  if (c.moe.enabled()) {
    const MoeConfig& m = c.moe;
    f.attr("experts", m.experts);
    f.attr("experts_top_k", m.top_k);
    f.attr("shared_experts", m.shared);
    f.attr("expert_ffn", m.ffn);
    f.attr("moe_every", m.every);
    f.attr("moe_after", m.after);
    f.attr("router", std::string(to_string(m.router)));
    f.attr("aux_loss", double(m.aux_loss));
    f.attr("router_bias_step", double(m.bias_step));
    f.attr("z_loss", double(m.z_loss));
    f.attr("capacity_factor", double(m.capacity_factor));
    f.attr("moe_nodes", m.nodes);
    f.attr("moe_max_nodes", m.node_limited() ? m.max_nodes : int64_t(0));
  }
  const OptimSection& o = run.optim;
  f.attr("lr", o.lr);
  f.attr("min_lr", o.min_lr);
  f.attr("beta1", o.beta1);
  f.attr("beta2", o.beta2);
  f.attr("eps", o.eps);
  f.attr("weight_decay", o.weight_decay);
  f.attr("grad_clip", o.grad_clip);
  f.attr("warmup", o.warmup);
  f.attr("total_steps", steps);
  f.attr("decay_embeddings", int64_t(o.decay_embeddings));
}

void write_params(H5File& f, ParamStore& store, const std::string& group, bool grads) {
  for (Param* p : store.params()) {
    std::vector<int64_t> shape(p->global.dims.begin(), p->global.dims.begin() + p->global.ndim);
    f.write(group + "/" + p->name, shape, grads ? p->grad.f32() : p->value.f32());
  }
}

void dump(const std::string& out, const std::vector<std::string>& deck_args) {
  const RunConfig run = RunConfig::from_deck(Deck::from_args(deck_args));
  ProcessGrid grid(MPI_COMM_WORLD);
  TESSERA_REQUIRE(grid.world().size() == 1, "tessera-refdump runs on one rank");
  Trainer trainer(run, grid);
  const ModelConfig& c = trainer.config();
  const int64_t T = c.seq_len, B = trainer.batch().micro_batch, G = trainer.batch().global_batch;
  const int64_t S = trainer.steps();

  H5File f = H5File::create(out);
  write_config(f, run, c, S);
  write_params(f, trainer.params(), "/init", false);

  // One batch at the initial weights: logits, mean loss, gradients.
  std::vector<int32_t> tokens(size_t(B * (T + 1))), ids(size_t(B * T)), targets(size_t(B * T));
  std::vector<uint8_t> mask(tokens.size());
  StepContext ctx = trainer.context(true);
  const bool documents = run.data.document_mask;
  DocumentBatch docs = documents ? DocumentBatch(ctx.alloc, c, B, 1) : DocumentBatch();
  std::vector<int32_t> check_docs(documents ? tokens.size() : 0);
  int64_t unmasked = 0;
  for (int64_t b = 0; b < B; ++b) {
    trainer.sample(1, b, tokens.data() + b * (T + 1), mask.data() + b * (T + 1), docs.window(b));
    for (int64_t t = 0; t < T; ++t) {
      const size_t at = size_t(b * (T + 1) + t + 1);
      // -1: masked, or (document masking) the next token starts another document
      const bool keep = mask[at] && !docs.ends_document(b, t);
      ids[size_t(b * T + t)] = tokens[size_t(b * (T + 1) + t)];
      targets[size_t(b * T + t)] = keep ? tokens[at] : -1;
      unmasked += keep ? 1 : 0;
    }
    if (documents) std::copy_n(docs.window(b), T + 1, check_docs.data() + b * (T + 1));
  }
  const bool masked = std::find(mask.begin(), mask.end(), 0) != mask.end();
  if (documents) docs.store(0);
  ctx.docs = docs.rows(0);
  ctx.loss_scale = float(1.0 / double(unmasked));
  std::vector<float> logits(size_t(B * T * c.vocab));
  const Tensor tids = view_of(ids.data(), {B, T}), ttargets = view_of(targets.data(), {B, T});
  trainer.model().logits(ctx, tids, view_of(logits.data(), {B * T, c.vocab}));
  trainer.params().zero_grads();
  const double loss = trainer.model().forward(ctx, tids, ttargets) / double(unmasked);
  trainer.model().backward(ctx);
  for (Moe* m : trainer.model().moe_layers()) m->end_step(grid.world(), false);  // not a step
  f.write("/check/tokens", {B, T + 1}, tokens.data());
  if (masked)
    f.write("/check/mask", {B, T + 1}, std::vector<int32_t>(mask.begin(), mask.end()).data());
  if (documents) f.write("/check/docs", {B, T + 1}, check_docs.data());
  f.write("/check/logits", {B, T, c.vocab}, logits.data());
  f.write("/check/loss", {}, &loss);
  write_params(f, trainer.params(), "/check/grad", true);

  // S optimizer steps: the batches they saw and what they measured.
  std::vector<int32_t> step_tokens(size_t(S * G * (T + 1)));
  std::vector<uint8_t> step_mask(step_tokens.size());
  std::vector<int32_t> step_docs(documents ? step_tokens.size() : 0);
  std::vector<double> losses, lrs, norms;
  for (int64_t s = 1; s <= S; ++s) {
    for (int64_t g = 0; g < G; ++g) {
      const int64_t at = ((s - 1) * G + g) * (T + 1);
      trainer.sample(s, g, step_tokens.data() + at, step_mask.data() + at,
                     documents ? step_docs.data() + at : nullptr);
    }
    const StepResult r = trainer.step(s);
    losses.push_back(r.loss);
    lrs.push_back(r.lr);
    norms.push_back(r.grad_norm);
  }
  f.write("/train/tokens", {S, G, T + 1}, step_tokens.data());
  if (masked)
    f.write("/train/mask", {S, G, T + 1},
            std::vector<int32_t>(step_mask.begin(), step_mask.end()).data());
  if (documents) f.write("/train/docs", {S, G, T + 1}, step_docs.data());
  f.write("/train/loss", {S}, losses.data());
  f.write("/train/lr", {S}, lrs.data());
  f.write("/train/grad_norm", {S}, norms.data());
  write_params(f, trainer.params(), "/train/final", false);
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::vector<std::string> args(argv, argv + argc);
  return tessera::run_reporting_errors("tessera-refdump", [&] {
    TESSERA_REQUIRE(args.size() >= 3, "usage: tessera-refdump OUT.h5 DECK.in [--section.key=value ...]");
    const std::string out = args[1];
    args.erase(args.begin() + 1);
    tessera::dump(out, args);
  });
}
