#include "core/schema.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace tessera {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kMaxInt = 1e15;

KeySpec integer(const char* section, const char* key, const char* dflt, double lo, double hi,
                const char* help) {
  return {section, key, KeyType::integer, dflt, false, lo, hi, {}, help};
}
KeySpec real(const char* section, const char* key, const char* dflt, double lo, double hi,
             const char* help) {
  return {section, key, KeyType::real, dflt, false, lo, hi, {}, help};
}
// A real key the code holds as a float: its range stops at FLT_MAX, so that no value becomes
// infinite when narrowed.
KeySpec real32(const char* section, const char* key, const char* dflt, double lo, double hi,
               const char* help) {
  return real(section, key, dflt, lo, std::min(hi, kFloatHuge), help);
}
// A float coefficient whose 0 turns its feature off: other values must stay nonzero as a float.
KeySpec coefficient(const char* section, const char* key, const char* dflt, const char* help) {
  KeySpec k = real32(section, key, dflt, 0, kInf, help);
  k.zero_is_off = true;
  return k;
}
KeySpec choice(const char* section, const char* key, const char* dflt,
               std::vector<std::string> choices, const char* help) {
  return {section, key, KeyType::choice, dflt, false, 0, 0, std::move(choices), help};
}
KeySpec boolean(const char* section, const char* key, const char* dflt, const char* help) {
  return {section, key, KeyType::boolean, dflt, false, 0, 0, {}, help};
}
KeySpec path(const char* section, const char* key, const char* dflt, bool required,
             const char* help) {
  return {section, key, KeyType::path, dflt, required, 0, 0, {}, help};
}

std::vector<KeySpec> build_schema() {
  return {
      // [model]
      choice("model", "arch", "llama", {"llama", "gpt2"},
             "Architecture: llama (RMSNorm, RoPE, SwiGLU, GQA) or gpt2 (LayerNorm, learned "
             "positions, GELU, tied embeddings)."),
      integer("model", "layers", "4", 1, 4096, "Number of transformer blocks L."),
      integer("model", "d_model", "128", 1, 1 << 20, "Hidden size C."),
      integer("model", "heads", "4", 1, 4096, "Attention (query) heads; must divide d_model."),
      integer("model", "kv_heads", "0", 0, 4096,
              "Key/value heads for grouped-query attention; 0 means equal to heads. Must "
              "divide heads."),
      integer("model", "ffn_hidden", "0", 0, 1 << 24,
              "MLP hidden size F; 0 picks 4C (gpt2) or 8C/3 rounded up to 64 (llama)."),
      integer("model", "vocab", "257", 2, 1 << 24,
              "Vocabulary size V; must equal the dataset's (257 byte-level, 50257 gpt2)."),
      integer("model", "vocab_multiple", "64", 1, 1 << 16,
              "Embedding rows are padded up to a multiple of this; padding never changes the "
              "loss."),
      integer("model", "seq_len", "128", 1, 1 << 24, "Sequence length T (tokens per sample)."),
      real32("model", "norm_eps", "1e-5", 0, 1, "Epsilon of RMSNorm / LayerNorm."),
      real32("model", "rope_theta", "10000", 1, kInf, "RoPE base (llama)."),
      choice("model", "tie_embeddings", "auto", {"auto", "true", "false"},
             "Share the token embedding with the output head; auto: gpt2 ties, llama does not."),
      real32("model", "init_std", "0.02", 0, 10, "Standard deviation of weight initialisation."),
      integer("model", "experts", "0", 0, 1 << 16,
              "Routed experts of each mixture-of-experts block; 0 means a dense model (doc/moe.md)."),
      integer("model", "experts_top_k", "2", 1, 1 << 16,
              "Routed experts each token goes to (k); at most model.experts."),
      integer("model", "shared_experts", "0", 0, 1 << 10,
              "Shared experts of each mixture-of-experts block, applied to every token (DeepSeek)."),
      integer("model", "expert_ffn", "0", 0, 1 << 24,
              "Hidden size of one expert (routed or shared); 0 means model.ffn_hidden."),
      {"model",
       "moe_layers",
       KeyType::string,
       "all",
       false,
       0,
       0,
       {},
       "Which blocks are mixture-of-experts blocks when model.experts > 0: all, every:K "
       "(blocks K-1, 2K-1, ...: every K-th) or after:K (all but the first K, which stay dense, "
       "as DeepSeek)."},
      choice("model", "router", "softmax", {"softmax", "sigmoid"},
             "Router scores: softmax over the experts (top-k weights are the probabilities), or "
             "sigmoid with the top-k weights normalised to sum to 1 (DeepSeek-V3)."),
      coefficient(
          "model", "aux_loss", "0.01",
          "Coefficient of the load-balancing loss (Switch/GShard form, computed per sequence: "
          "E/(kT) sum_i f_i P_i); 0 disables."),
      coefficient("model", "router_bias_step", "0",
                  "Auxiliary-loss-free balancing (DeepSeek-V3): after each step every expert's "
                  "selection bias moves by this step towards the mean load; 0 disables."),
      coefficient("model", "z_loss", "0",
                  "Coefficient of the router z-loss, the mean over tokens of logsumexp(router "
                  "logits)^2; 0 disables."),
      coefficient(
          "model", "capacity_factor", "0",
          "0: dropless (every routed token is computed). Above 0: each expert takes at most "
          "ceil(factor x T x k / experts) tokens of each sequence, the first in token order; "
          "the others are dropped (their weight is lost) and counted."),
      // [data]
      path("data", "path", "", true,
           "Token dataset (HDF5) made by tessera-prep from text, directories or JSONL; or a "
           "blend of several, 'W1 PATH1 W2 PATH2 ...' (weights >= 0, normalised; doc/data.md, "
           "\"Blends\")."),
      choice("data", "tokenizer", "byte", {"byte", "gpt2"},
             "Tokenizer the dataset must have been made with: byte (vocab 257 with EOS) or gpt2 "
             "(BPE, vocab 50257)."),
      real("data", "val_fraction", "0.01", 0, 0.5,
           "Fraction of documents held out for validation (chosen by a hash of the document "
           "index, the same on every layout)."),
      boolean("data", "document_mask", "false",
              "Mask attention at document boundaries inside a sample: a token sees only earlier "
              "tokens of its own document, positions (RoPE, gpt2's table) restart at each "
              "document, and the target after a document's last token is not predicted "
              "(doc/data.md, \"Document masks\"). The dataset must hold more than one "
              "document."),
      // [train]
      integer("train", "steps", "100", 1, kMaxInt, "Optimizer steps to run."),
      integer("train", "micro_batch", "4", 1, 1 << 20,
              "Sequences per micro-batch on each data-parallel rank."),
      integer("train", "global_batch", "0", 0, kMaxInt,
              "Sequences per optimizer step over all ranks; 0 means micro_batch x dp (no "
              "accumulation). Must be a multiple of micro_batch x dp."),
      integer("train", "eval_every", "0", 0, kMaxInt,
              "Validation loss every N steps (and after the last step); 0 disables."),
      integer("train", "eval_samples", "32", 1, kMaxInt,
              "Validation sequences per evaluation (rounded up to a multiple of micro_batch x "
              "dp)."),
      integer("train", "exit_after", "0", 0, kMaxInt,
              "Stop after this many steps in this invocation (writing a checkpoint), to be "
              "resumed later; 0: run to train.steps."),
      integer("train", "seed", "1234", 0, kMaxInt, "Seed of weight initialisation and data order."),
      choice("train", "precision", "fp32", {"fp32", "bf16", "fp16"},
             "Compute precision: GEMMs take operands in this dtype with fp32 accumulation, from a "
             "compute copy of the parameters refreshed once per step; master weights, Adam "
             "moments, norms, softmax, cross-entropy and the loss stay fp32 (doc/precision.md). "
             "fp16 adds dynamic loss scaling."),
      real("train", "loss_scale", "65536", 1, 16777216,
           "fp16: the first loss scale (a power of two keeps scaling exact)."),
      integer("train", "loss_scale_window", "1000", 1, kMaxInt,
              "fp16: steps without overflow after which the loss scale doubles."),
      real("train", "loss_scale_min", "1", 1e-30, 16777216,
           "fp16: the floor of the loss scale; an overflow at the floor stops the run."),
      choice("train", "recompute", "none", {"none", "selective", "full"},
             "Activation recompute (doc/recompute.md): none keeps every block's activations "
             "for backward; selective rebuilds the attention core (output and log-sum-exp, "
             "from the kept q, k, v) and the MLP activation in backward; full keeps only each "
             "block's input and reruns its whole forward in backward. Losses and gradients are "
             "bit-identical in every mode."),
      integer("train", "recompute_layers", "0", 0, kMaxInt,
              "With train.recompute = full: recompute only the first N blocks of each model "
              "chunk (a pipeline stage holds pp_virtual chunks; without a pipeline the model "
              "is one chunk), keeping the others' activations (Megatron-LM's block method); "
              "0: every block."),
      integer("train", "head_chunk_rows", "0", 0, kMaxInt,
              "Rows of the output head computed at a time (doc/performance.md, \"The fused "
              "output head\"): each chunk's logits are computed, turned into the loss and "
              "their gradient, and consumed by the head's two gradient GEMMs before the next "
              "chunk, so only one chunk's logits are ever held; 0: 512 rows (all of a "
              "micro-batch's when it has fewer). Losses and gradients do not depend on it "
              "beyond the order in which the weight gradient sums the chunks."),
      integer("train", "head_vocab_tile", "0", 0, kMaxInt,
              "Vocabulary columns of the output head computed at a time within a chunk of "
              "rows (doc/performance.md, \"Vocabulary tiles\"): a tile's logits are made, "
              "folded into the rows' running log-sum-exp and dropped, then made again in "
              "backward for the tile's gradient and its two GEMMs, so the logits never leave "
              "the cache, for one more GEMM over the vocabulary. 0: 1024 where the GEMMs are "
              "16-bit on a CPU's matrix engine (AMX), else the whole vocabulary; a value at or "
              "above the rank's vocabulary: the whole vocabulary, no tiles."),
      choice("train", "on_nonfinite", "stop", {"stop", "skip"},
             "A step whose loss or gradient norm is NaN or Inf is never applied; stop: the run "
             "stops with an error; skip: the step is dropped and counted, and the run stops "
             "after train.nonfinite_limit such steps in a row."),
      real("train", "loss_spike", "0", 0, kInf,
           "Loss-spike rule: a step whose loss exceeds this many times the mean loss of the "
           "last train.loss_spike_window applied steps is not applied (skipped and counted like "
           "a non-finite step under train.on_nonfinite = skip; train.nonfinite_limit such steps "
           "in a row stop the run). 0: off. Active once the window is full (after a resume too)."),
      integer("train", "loss_spike_window", "20", 1, kMaxInt,
              "With train.loss_spike: the number of applied steps whose mean loss a step is "
              "compared with."),
      integer("train", "nonfinite_limit", "5", 1, kMaxInt,
              "With train.on_nonfinite = skip: consecutive non-finite steps that stop the run."),
      // [optim]
      real("optim", "lr", "3e-4", 0, 10, "Peak learning rate."),
      real("optim", "min_lr", "3e-5", 0, 10, "Learning rate at the end of the cosine decay."),
      integer("optim", "warmup", "10", 0, kMaxInt, "Linear warmup steps."),
      real32("optim", "beta1", "0.9", 0, 0.999999, "AdamW beta1."),
      real32("optim", "beta2", "0.95", 0, 0.9999999, "AdamW beta2."),
      real32("optim", "eps", "1e-8", 0, 1, "AdamW epsilon."),
      real32("optim", "weight_decay", "0.1", 0, 10, "Decoupled weight decay of linear weights."),
      real("optim", "grad_clip", "1.0", 0, kInf, "Global gradient-norm clip; 0 disables."),
      boolean("optim", "decay_embeddings", "false", "Apply weight decay to embeddings too."),
      // [parallel]
      integer("parallel", "tp", "1", 1, 1 << 20,
              "Tensor-parallel degree (Megatron-LM): attention heads, MLP width and vocabulary "
              "are split over tp ranks; it must divide heads, kv_heads, the MLP width and the "
              "padded vocabulary. Keep it within a node."),
      boolean("parallel", "sequence_parallel", "false",
              "With parallel.tp > 1: also shard the tokens of the norms and residual stream "
              "over the tensor-parallel ranks (all-gather before each column-parallel block, "
              "reduce-scatter after each row-parallel one)."),
      integer("parallel", "cp", "1", 1, 1 << 20,
              "Context-parallel degree: each sequence is split over cp ranks (long context); "
              "parallel.cp_kind says how attention crosses the split. Gradients are reduced "
              "over dp x cp ranks (doc/parallelism.md)."),
      choice("parallel", "cp_kind", "ring", {"ring", "ulysses"},
             "Context parallelism with parallel.cp > 1: ring (each rank holds 2 zigzag chunks "
             "of every sequence, a head and a tail one, so causal work is equal; K/V blocks go "
             "round the cp ring, overlapped with attention; needs model.seq_len divisible by "
             "2 x cp) or ulysses (all-to-all to whole sequences of heads / cp heads and back; "
             "needs seq_len, the heads and the key/value heads per tensor-parallel rank "
             "divisible by cp)."),
      integer("parallel", "pp", "1", 1, 1 << 20,
              "Pipeline-parallel degree (stages). The layers are cut into pp x pp_virtual "
              "model chunks; the micro-batches of a step (train.global_batch / (micro_batch x "
              "dp)) stream through them as parallel.pp_schedule orders (doc/pipeline.md); "
              "composes with data, tensor and sequence parallelism and every ZeRO stage."),
      choice("parallel", "pp_schedule", "1f1b",
             {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev"},
             "Pipeline schedule with parallel.pp > 1: gpipe (all forwards, then all backwards), "
             "1f1b (one forward, one backward; needs micro-batches >= pp), interleaved "
             "(Megatron-LM's virtual pipeline; needs pp_virtual >= 2 and micro-batches a "
             "multiple of pp), or a schedule that splits each backward into its input and "
             "weight gradients (doc/pipeline.md): zb-h1 (zero-bubble H1; 1f1b's memory, about "
             "a third of its bubble; micro-batches >= pp), zb-v (zero-bubble V; pp_virtual = 2 "
             "in a V, the embedding and the head on the first stage) or dualpipev (DeepSeek's "
             "DualPipeV; pp_virtual = 2, micro-batches >= 2 pp)."),
      boolean("parallel", "pp_pair_overlap", "true",
              "With pp_schedule = dualpipev: run each paired forward and backward_input of two "
              "micro-batches interleaved, each micro-batch's expert all-to-alls travelling while "
              "the other computes (doc/pipeline.md, \"Paired overlap\"); false runs the pair's "
              "passes one after the other. The same bits either way; the summary says whether "
              "it ran and, where a composition cannot interleave yet, why not."),
      integer("parallel", "pp_virtual", "1", 1, 1 << 10,
              "Model chunks per pipeline stage (v): 1 for gpipe, 1f1b and zb-h1, >= 2 for the "
              "interleaved schedule, whose bubble is (pp - 1) / (v x micro-batches), 2 for "
              "zb-v and dualpipev."),
      {"parallel",
       "pp_layers",
       KeyType::string,
       "balanced",
       false,
       0,
       0,
       {},
       "How the layers are cut into the pp x pp_virtual model chunks: balanced (by training "
       "FLOPs, the embedding and the head counted: the cut whose most expensive chunk is "
       "cheapest), even (the same number each; model.layers must be a multiple), or a "
       "comma-separated list of layers per model chunk, e.g. 3,3,2 (doc/pipeline.md)."},
      integer("parallel", "dp", "0", 0, 1 << 20,
              "Data-parallel degree; 0 (auto) is ranks / (tp x cp x pp). tp x cp x dp x pp must "
              "equal the number of ranks."),
      integer("parallel", "ep", "1", 1, 1 << 20,
              "Expert-parallel degree, folded inside data parallelism: it must divide dp (dp = "
              "ep x edp), and must divide model.experts: each of the ep ranks runs experts / ep "
              "routed experts, tokens travel to them by all-to-all (doc/moe.md)."),
      integer("parallel", "ep_max_nodes", "0", 0, 1 << 20,
              "Node-limited routing (DeepSeek-V3): each token's routed experts are chosen among "
              "at most this many nodes, the nodes ranked by the sum of their experts' highest "
              "ceil(experts_top_k / ep_max_nodes) selection keys; 0 = unrestricted. Experts sit "
              "on nodes as on the ep ranks that run them (parallel.ep_nodes; doc/moe.md)."),
      integer("parallel", "ep_nodes", "0", 0, 1 << 20,
              "The nodes node-limited routing spreads the experts over, in equal blocks of "
              "consecutive experts; 0 = the nodes the expert-parallel group spans "
              "(hardware.ranks_per_node). Set it on a run whose ep group spans one node (the "
              "serial run, a test) to route as a run spread over that many nodes (doc/moe.md)."),
      choice("parallel", "ep_dispatch", "flat", {"flat", "two_level"},
             "How expert parallelism moves tokens: flat (one all-to-allv over the ep group, a "
             "row per token and chosen expert) or two_level (DeepSeek-V3/DeepEP: a row per token "
             "and destination node across nodes, to the rank with the same local index there, "
             "which fans it out to the node's experts; the combine returns one partial sum per "
             "node). two_level needs an ep group over several nodes (hardware.ranks_per_node or "
             "parallel.ep_nodes) in equal blocks (doc/moe.md)."),
      {"parallel",
       "order",
       KeyType::string,
       "tp-cp-ep-dp-pp",
       false,
       0,
       0,
       {},
       "Rank order of the process grid: tp, cp, ep, dp, pp each once, separated by '-', the "
       "first varying fastest (consecutive ranks differ in it; \"dp\" here is the data-parallel "
       "axis left once ep is folded out). The default keeps a tensor-parallel group on "
       "consecutive ranks, inside one node."},
      integer("parallel", "zero", "0", 0, 3,
              "ZeRO stage over the data-parallel ranks: 0 replicates the model state; 1 shards "
              "the Adam moments (reduce-scatter gradients, update the shard, all-gather "
              "parameters); 2 also keeps only the gradient shard (each part's gradients are "
              "reduce-scattered during backward); 3 also shards the parameters (each part is "
              "all-gathered just before its forward and backward, with the next one "
              "prefetched)."),
      integer("parallel", "zero_inflight", "2", 1, 1 << 10,
              "ZeRO-2/3: gradient reduce-scatters in flight at most per rank (one per part: "
              "embedding, block, head). Starting one more first completes the oldest, so the "
              "staging buffers (one part each) are bounded and the same in every run; more "
              "overlaps more of the communication with backward."),
      integer("parallel", "shard_group", "0", 0, 1 << 20,
              "HSDP with parallel.zero >= 1: shard the model state within groups of this many "
              "consecutive data-parallel ranks and all-reduce the shards across groups; 0 "
              "shards over the whole data-parallel group."),
      real("parallel", "bucket_mb", "25", 1e-6, 1e6,
           "Data parallel: gradients are all-reduced in buckets of about this many MiB."),
      boolean("parallel", "overlap", "true",
              "Data parallel: start each bucket's all-reduce during the last micro-batch's "
              "backward as soon as its gradients are final; false reduces after backward."),
      choice("parallel", "progress", "poll", {"poll", "none"},
             "Data parallel with overlap: how buckets in flight move during backward. poll "
             "tests them with MPI_Test after each layer's backward; none never tests them "
             "before backward ends (to measure whether MPI progresses on its own)."),
      choice("parallel", "grad_reduce_dtype", "fp32", {"fp32", "bf16"},
             "Data parallel (parallel.zero = 0): the dtype gradient buckets travel in. bf16 "
             "halves the all-reduce bytes (seed 002's compression): each bucket is rounded to "
             "bf16, summed pairwise in fp32 with each partial sum rounded to bf16, and widened "
             "back; the result differs from the fp32 sum in the third significant digit."),
      // [hardware]
      choice("hardware", "device", "cpu", {"cpu", "cuda"},
             "Compute device of each rank. cuda keeps the model, optimizer and activations in "
             "GPU memory (one rank per GPU) and needs a build with the CUDA backend "
             "(TESSERA_CUDA=ON) and a GPU visible to every rank; otherwise a cuda run stops "
             "before any work with an error saying which is missing (doc/cuda.md)."),
      integer("hardware", "ranks_per_node", "0", 0, 1 << 20,
              "0 finds the nodes (ranks sharing memory); k > 0 treats every k consecutive ranks "
              "as one node, to see on one machine how a layout maps onto nodes (the layout log, "
              "the tensor-parallel-across-nodes warning)."),
      integer("hardware", "threads", "0", 0, 4096,
              "OpenMP/GEMM threads per rank; 0 keeps OMP_NUM_THREADS or the runtime default."),
      real("hardware", "peak_flops", "0", 0, kInf,
           "Peak FLOP/s per rank for MFU; 0 measures the fp32 GEMM rate at start."),
      // [output]
      path("output", "dir", "run", false,
           "Directory for run.json and metrics.jsonl (created if missing)."),
      integer("output", "log_every", "1", 1, kMaxInt, "Print a progress line every N steps."),
      boolean("output", "echo_deck", "true", "Print the resolved deck at start (rank 0)."),
      boolean("output", "trace", "false",
              "Write each rank's timeline as a Chrome trace (Perfetto, chrome://tracing) to "
              "OUTPUT_DIR/trace/rankN.json for world rank N: steps, phases, pipeline passes and "
              "messages, collectives, on one clock agreed at start. tools/trace-plot.py draws "
              "the pipeline from them."),
      integer("output", "trace_steps", "3", 1, kMaxInt,
              "With output.trace: the number of steps traced, from the first step of the run."),
      real("output", "comm_warn_share", "0.3", 0, 1,
           "Communication monitor: when collectives (every group but world, mean over ranks) "
           "take more than this share of the step time over the steady state (the steps after "
           "a run's first), the progress line and the summary say so and name the group that "
           "dominates; 0 turns the warning off."),
      boolean("output", "compare_plan", "false",
              "End the summary with tessera-plan's predicted step-time split and memory per "
              "category for this run's layout beside the measured ones (doc/planning.md)."),
      // [checkpoint]
      integer("checkpoint", "every", "0", 0, kMaxInt,
              "Write a checkpoint every N steps (and after the last step, see at_end); 0: only at "
              "the end."),
      boolean("checkpoint", "at_end", "true",
              "Write a checkpoint after the last step of each invocation."),
      path("checkpoint", "dir", "", false,
           "Checkpoint directory; empty means OUTPUT_DIR/checkpoints."),
      integer("checkpoint", "keep", "2", 1, 1 << 20, "Most recent checkpoints kept on disk."),
      {"checkpoint",
       "resume",
       KeyType::string,
       "none",
       false,
       0,
       0,
       {},
       "none, latest (the newest checkpoint in checkpoint.dir, or a fresh start when there is "
       "none), or the path of a checkpoint file."},
      boolean("checkpoint", "overwrite", "false",
              "A fresh run (resume = none) into a checkpoint.dir holding checkpoints: false "
              "refuses to start; true replaces them (deleted once this run has written its "
              "first checkpoint)."),
      boolean("checkpoint", "allow_routing_change", "false",
              "Resuming a mixture-of-experts checkpoint with another model.experts_top_k or "
              "model.router: false refuses to start; true continues with a warning naming "
              "what changed."),
      // [sample]
      {"sample",
       "prompt",
       KeyType::string,
       "In the beginning",
       false,
       0,
       0,
       {},
       "tessera-sample: text the generation continues."},
      integer("sample", "length", "200", 1, 1 << 20, "tessera-sample: tokens to generate."),
      real("sample", "temperature", "0.8", 0, 100,
           "tessera-sample: softmax temperature; 0 picks the most likely token."),
      integer("sample", "top_k", "40", 0, 1 << 24,
              "tessera-sample: sample among the k most likely tokens; 0 means all."),
      integer("sample", "seed", "0", 0, kMaxInt, "tessera-sample: seed of the sampling."),
      path("sample", "vocab_dir", "", false,
           "tessera-sample with data.tokenizer = gpt2: directory of encoder.json and vocab.bpe."),
      boolean("sample", "print_ids", "false",
              "tessera-sample: also print the token ids of the prompt and of the continuation."),
  };
}

std::string format_bound(double x) {
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  std::ostringstream os;
  os.precision(15);
  os << x;
  return os.str();
}

}  // namespace

std::string KeySpec::allowed() const {
  switch (type) {
    case KeyType::integer:
      return "integer in [" + format_bound(min) + ", " + format_bound(max) + "]";
    case KeyType::real:
      if (std::isinf(max)) return "finite number >= " + format_bound(min);
      if (zero_is_off)
        return "0 (off) or a number in [" + format_bound(kFloatTiny) + ", " + format_bound(max) +
               "]";
      return "number in [" + format_bound(min) + ", " + format_bound(max) + "]";
    case KeyType::boolean:
      return "true or false";
    case KeyType::string:
      return "text";
    case KeyType::path:
      return "file path";
    case KeyType::choice: {
      std::string s = "one of";
      for (size_t i = 0; i < choices.size(); ++i) s += (i ? ", " : " ") + choices[i];
      return s;
    }
  }
  return {};
}

const std::vector<KeySpec>& deck_schema() {
  static const std::vector<KeySpec> schema = build_schema();
  return schema;
}

const KeySpec* find_key(const std::string& full_name) {
  for (const KeySpec& k : deck_schema())
    if (k.name() == full_name) return &k;
  return nullptr;
}

std::string deck_reference_markdown() {
  std::ostringstream os;
  os << "# Input deck reference\n\n"
        "<!-- Generated by `tessera --deck-reference`; do not edit. A test fails when this "
        "file is stale: regenerate with `build/tessera --deck-reference > "
        "doc/input-deck.md`. -->\n\n"
        "A deck is an INI file of `[section]` headers and `key = value` lines (`#` starts a "
        "comment). Any key can be overridden on the command line as `--section.key=value`; "
        "the command line wins (of a key given twice there, the last). Unknown keys, a key "
        "given twice in the deck, wrong types and out-of-range values are errors; a UTF-8 "
        "byte-order mark at the start is skipped.\n";
  std::string section;
  for (const KeySpec& k : deck_schema()) {
    if (k.section != section) {
      section = k.section;
      os << "\n## [" << section
         << "]\n\n| key | default | allowed | meaning |\n|---|---|---|---|\n";
    }
    os << "| `" << k.key << "` | " << (k.required ? "**required**" : "`" + k.default_value + "`")
       << " | " << k.allowed() << " | " << k.help << " |\n";
  }
  return os.str();
}

std::string deck_help_text() {
  std::ostringstream os;
  os << "usage: tessera DECK.in [--section.key=value ...]\n"
        "       tessera [DECK.in] --layout-only [--parallel.key=value ...]\n"
        "       tessera --help | --deck-reference\n\n"
        "Trains a transformer language model as the input deck describes.\n"
        "--layout-only builds the process grid from the [parallel] keys on the ranks it is "
        "started with\n(mpirun -np N), prints every group and exits; no dataset is read and "
        "the deck is optional.\n\nKeys:\n";
  std::string section;
  for (const KeySpec& k : deck_schema()) {
    if (k.section != section) {
      section = k.section;
      os << "\n[" << section << "]\n";
    }
    os << "  " << k.key << " = " << (k.required ? "(required)" : k.default_value) << "   ("
       << k.allowed() << ")\n      " << k.help << "\n";
  }
  return os.str();
}

}  // namespace tessera
