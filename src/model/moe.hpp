// A mixture-of-experts sublayer (doc/moe.md): a router scores the routed experts of each token,
// the token goes to its top-k experts (selected by score + a per-expert bias, weighted by the
// score), and the shared experts take every token. y[N,C] += sum_j w_j E_j(x) + S(x).
//
// Experts are the block's MLP (SwiGLU for llama, GELU for gpt2) of width model.expert_ffn;
// the shared experts are one such MLP of width shared x expert_ffn. Tokens are packed expert
// by expert in token order, so each expert runs its three GEMMs on its own rows.
//
// Expert parallelism (parallel.ep > 1, ParallelContext::ep): rank r of the ep group runs the
// routed experts [r E/ep, (r+1) E/ep). Each rank routes its own tokens, exchanges the rows per
// expert with all-to-all(v) after exchanging the counts, runs its experts on the rows it
// received, and sends the outputs back (and the gradients likewise in backward). A rank
// registers only the experts it runs (ModelConfig::experts_held, marked Param::expert), under
// their global names; the data-parallel strategy sums their gradients over edp, the ranks
// holding the same experts (doc/moe.md, "Expert memory").
//
// Tensor parallelism (parallel.tp > 1): the router is replicated and routes every token of the
// micro-batch on every tp rank (the normed input is all-gathered first under sequence
// parallelism), so capacity and the balancing loss see whole sequences; the routed experts are
// whole (no expert tensor parallelism) and each tp rank dispatches only its own rows (its
// sequence shard; all rows without sequence parallelism, where the tp ranks repeat the work);
// the shared experts are split over tp as the dense MLP. Under sequence parallelism the
// router's and the experts' gradients are partial sums over tp (Param::tp_partial_grad).
//
// Context parallelism (parallel.cp > 1, moe_context_parallel.cpp): every cp rank gathers the
// normed input of its micro-batch's sequences over cp and routes the whole sequences, as tp
// ranks do under sequence parallelism; it dispatches, combines and differentiates only its own
// tokens, and cp rank 0 alone counts the step's statistics. The experts' gradients are then
// summed over edp x cp (the data-parallel strategy's expert group).
//
// Balancing: the load-balancing loss (Switch/GShard, per sequence as DeepSeek-V3's
// complementary loss), the router z-loss and the auxiliary-loss-free selection bias, which
// end_step() moves after each step from the step's observed load. With a capacity factor,
// the tokens beyond an expert's capacity in a sequence (token order) are dropped.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "model/linear.hpp"
#include "model/mlp.hpp"

namespace tessera {

class Moe {
 public:
  // What one step observed (summed over micro-batches and data-parallel ranks by end_step).
  struct Stats {
    std::vector<double> load;  // tokens routed to each expert (selection, before capacity)
    double dropped = 0;        // routed token-expert pairs dropped by the capacity
    double aux = 0;            // sum over sequences of the balancing loss (no coefficient)
    double z = 0;              // sum over tokens of logsumexp(router logits)^2
    double sequences = 0, tokens = 0;
    float bias_min = 0, bias_max = 0;  // the selection bias after the step's update
    // Forward dispatch bytes sent to ep ranks on other nodes (hardware.ranks_per_node), by
    // this tp rank: measured (after capacity), and what unrestricted top-k would have sent
    // (before capacity); both 0 when the ep group sits on one node.
    double cross_bytes = 0, cross_bytes_free = 0;
    // What a dispatch sending each token once per destination node sends across nodes (the
    // two-level dispatch's formula, for either dispatch): per token, its kept choices' distinct
    // other nodes x d_model x 4 bytes. With parallel.ep_dispatch = two_level, cross_bytes is
    // measured instead on ep_cross's byte counter (the forward dispatch's rows) and equals it.
    double cross_bytes_nodes = 0;
    double run_cross_bytes = 0, run_cross_bytes_free = 0;  // the same summed over the run
    double run_cross_bytes_nodes = 0;
  };

  // What backward reads, per micro-batch in flight (per activation slot): the routing, the
  // packed rows, the expert side and the experts' hidden activations. With activation
  // recompute (doc/recompute.md, doc/moe.md "Recompute") full recompute keeps all of it in one
  // set shared by the model's blocks (Block::Rebuilt) and reruns the forward into it, and
  // selective keeps all but the experts' activation output `act`, which lives in the shared set
  // and is recomputed elementwise from the kept gate and up.
  struct Saved {
    Buffer logits, scores;        // [N, E]
    Buffer choice, row;           // i32 [N, K]: expert, packed row (-1: dropped)
    Buffer weight;                // [N, K]
    Buffer f;                     // [B, E]: the balancing loss's load fractions per sequence
    Buffer xin, out;              // packed rows [N*K, C], expert by expert
    std::vector<int64_t> offset;  // [E + 1]: each expert's first packed row
    // The expert side: the rows this rank's experts run, expert by expert, and in each
    // expert by source rank ([ep x N*K] rows at most; with ep = 1, xin and out themselves).
    Buffer xe_own, oe_own, gate, up, act;
    Tensor xe, oe;
    std::vector<float> counts;     // [ep][E/ep]: rows each source sends each local expert
    std::vector<int64_t> eoffset;  // [E/ep + 1]: each local expert's first row
    // The all-to-allv's elements per peer and their offsets: packed side (rows for peer d's
    // experts) and expert side (rows from peer d).
    // (With the two-level dispatch these are over ep_intra, the relay's node-packed rows being
    // the packed side, and counts is [relay l][local expert][source node]: for_each_chunk.)
    std::vector<int64_t> packed_count, packed_displ, side_count, side_displ;
    // The two-level dispatch (moe_two_level.cpp, doc/moe.md "Two-level dispatch"). As a
    // source: table[n - first, g] is token n's row among the rows sent to node g over ep_cross
    // (nodes in order), or -1. As the relay of its node: each received row's choices on this
    // node (rrow: the node-packed row, -1 elsewhere; rweight: the combine weight) and the
    // node's expert outputs in node-packed order ([node expert][received row]).
    Buffer table, rrow, rweight, np_out;
    std::vector<int64_t> send, recv;  // rows sent to / received from each node over ep_cross
    std::vector<int64_t> noff;        // [E/nodes + 1]: each node expert's first node-packed row
    int64_t nodes = 0;                // 0: flat dispatch
    int64_t received = 0;             // rows received as relay
  };

  Moe(ParamStore& store, const std::string& name, const ModelConfig& cfg);

  // Activation recompute: `routed` holds what `mode` rebuilds of the routed experts (see
  // Saved), `shared_experts` the shared experts' (as Mlp::share).
  void share(Saved* routed, Mlp::Saved* shared_experts, Recompute mode);

  // y[rows,C] += moe(x) for x[rows,C] (kept by the caller until backward); rows = N, or this
  // rank's N/tp with sequence parallelism (tp::rows). `rerun`: full recompute's second forward
  // of the same micro-batch (Block::rebuild), which adds nothing to the step's statistics.
  void forward(StepContext& ctx, const Tensor& x, const Tensor& y, bool rerun = false);
  // dx[rows,C] overwritten for dy[rows,C]; parameter gradients accumulated, the router's with
  // the balancing and z-loss terms.
  void backward(StepContext& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx);

  // After the optimizer step: sums the step's statistics over `dp` (the ranks that saw the
  // step's other samples), moves the selection bias (model.router_bias_step) when `applied`
  // (the step's update was applied) and starts the next step's count.
  const Stats& end_step(Communicator& dp, bool applied);
  const Stats& last() const { return last_; }
  // Where the selection bias is not held whole after the step (ZeRO-3 holds it only while its
  // block runs), end_step leaves the step's update here instead of adding it (empty when
  // there is none); the trainer adds it where the bias is held (DataParallel::values()).
  const std::vector<float>& held_bias_update() const { return held_bias_update_; }
  const Param& selection_bias() const { return *bias_; }
  const std::string& name() const { return name_; }
  // Elements of the routed experts' parameters this rank registers: all E experts, or under
  // expert parallelism the E/ep it holds.
  int64_t routed_elements() const { return routed_elements_; }
  // Tokens per expert of the last step: the largest over the mean (1 = balanced).
  double imbalance() const;

 private:
  struct Expert {
    Linear gate, up, down;  // gate unused for gpt2
  };

  // Context parallelism (moe_context_parallel.cpp, doc/moe.md "Context parallelism"): a rank's
  // rows are pieces of its micro-batch's sequences, and the routing runs on the whole sequences
  // ([B, seq_len], token n). Local rows [l, l + count) hold tokens [n, n + count).
  struct Run {
    int64_t n, l, count;
  };
  int cp_size(const StepContext& ctx) const;
  // Rank r's segments of a sequence (ContextParallel::segments), for every r of the cp group.
  const std::vector<ContextParallel::Segment>& segments_of(int64_t rank);
  // The runs of local rows [first, first + count) (one run, n = l, without cp).
  const std::vector<Run>& runs(const StepContext& ctx, int64_t first, int64_t count);
  // x[rows, C] of every cp rank, in the sequences' order [B seq_len, C] (scratch).
  Tensor gather_sequences(StepContext& ctx, const Tensor& x);
  // After routing the whole sequences: the packed rows of the tokens of local rows [first,
  // first + count) only (expert by expert, tokens in order; every other choice -1), and offset.
  void own_rows(const StepContext& ctx, Saved& s, int64_t first, int64_t count);

  Saved& kept(const StepContext& ctx);
  // The experts' activation output [ep N K, F]: s's, or the shared set's under selective
  // recompute.
  Tensor activation(const StepContext& ctx, Saved& s);
  // Routes all N = B T tokens; packs those of rows [r0, r0 + R) (this tp rank's).
  void route(StepContext& ctx, Saved& s, int64_t B, int64_t T, int64_t r0, int64_t R);
  void run_experts(StepContext& ctx, Saved& s);
  int ep_size(const StepContext& ctx) const;
  std::pair<int64_t, int64_t> routed_rows(const StepContext& ctx, int64_t N) const;
  // Rows between the packed (source) side [N*K, C] and the expert side [rows, C]: an
  // all-to-all(v) over ep and a reordering from [source][expert] to [expert][source] (and
  // back); nothing to move with ep = 1, where the two sides are the same buffers.
  void exchange_counts(StepContext& ctx, Saved& s);
  void to_experts(StepContext& ctx, const Saved& s, const Tensor& packed, const Tensor& side);
  void from_experts(StepContext& ctx, const Saved& s, const Tensor& side, const Tensor& packed);
  // The same all-to-alls split around compute (doc/moe-overlap.md): post_*
  // starts one into `transfers` (nothing with ep 1), finish_* waits and, for the dispatch,
  // places the rows on the expert side.
  void post_to_experts(StepContext& ctx, const Saved& s, const Tensor& packed,
                       StepTransfers& transfers);
  void finish_to_experts(StepContext& ctx, const Saved& s, const Tensor& side,
                         StepTransfers& transfers);
  void post_from_experts(StepContext& ctx, const Saved& s, const Tensor& side,
                         const Tensor& packed, StepTransfers& transfers);
  // The (source, local expert) chunks: their offsets on the packed and expert sides.
  template <class Fn>
  void for_each_chunk(const Saved& s, Fn&& fn) const;
  Communicator& expert_group(const StepContext& ctx, const Saved& s) const;

  // The two-level dispatch (moe_two_level.cpp). Forward: nodes_post_dispatch posts each token
  // of rows [q0, q0 + Q) of x once to every node holding one of its kept experts (ep_cross,
  // into `transfers`); nodes_fan_out finishes that and sends the rows on to the experts' ranks
  // (ep_intra) onto the expert side; nodes_post_combine brings the experts' outputs back to the
  // relay (ep_intra), which posts the node's weighted sum per token back over ep_cross into
  // src_rows_ (the source's rows sent, for the combine over `table`). Backward: dy's rows
  // cross the same way (nodes_backward_post, then nodes_backward_fan_out, which posts the
  // combine weights' gradients back into `weights`, and nodes_backward_weights, which finishes
  // them into dw[N, K]); nodes_backward_combine brings the experts' input gradients d_xe back,
  // summed per node, and posts them over ep_cross into src_rows_. Only the ep_cross legs are
  // non-blocking (doc/moe-overlap.md).
  void nodes_post_dispatch(StepContext& ctx, Saved& s, const Tensor& x, int64_t q0, int64_t Q,
                           StepTransfers& transfers);
  void nodes_fan_out(StepContext& ctx, Saved& s, StepTransfers& transfers);
  void nodes_post_combine(StepContext& ctx, Saved& s, StepTransfers& transfers);
  void nodes_backward_post(StepContext& ctx, Saved& s, const Tensor& dy_rows, int64_t Q,
                           StepTransfers& transfers);
  void nodes_backward_fan_out(StepContext& ctx, Saved& s, StepTransfers& transfers,
                              const Tensor& d_oe, StepTransfers& weights);
  void nodes_backward_weights(Saved& s, int64_t q0, int64_t Q, const Tensor& dw,
                              StepTransfers& weights);
  void nodes_backward_combine(StepContext& ctx, Saved& s, const Tensor& d_xe,
                              StepTransfers& transfers);
  // Rows of width W between the sources and the relays over ep_cross (back: relay -> source);
  // the own node's block is copied, not sent; posted into `transfers` when given. Returns the
  // bytes the call counted.
  int64_t cross_rows(StepContext& ctx, const Saved& s, bool back, const float* from, float* to,
                     int64_t W, StepTransfers* transfers = nullptr);
  void kept_nodes(const StepContext& ctx, Saved& s);
  void node_workspace(const StepContext& ctx);

  const ModelConfig& cfg_;
  std::string name_;
  ModelConfig shared_cfg_;  // the shared experts' MLP: width shared x expert_ffn
  bool swiglu_;
  Linear router_;
  Param* bias_ = nullptr;
  std::vector<float> held_bias_update_;
  std::unique_ptr<Mlp> shared_;
  std::vector<Expert> experts_;  // the experts this rank holds: [held_first_, + size)
  int64_t held_first_ = 0;
  int64_t routed_elements_ = 0;
  Slots<Saved> slots_;
  Saved* rebuilt_ = nullptr;  // activation recompute's shared set (share)
  Recompute mode_ = Recompute::none;
  bool tally_ = true;  // this forward adds to the step's statistics (training, not a rerun)
  Stats step_, last_;
  // Host work space, sized once: each expert's packed rows ([E], for the count exchange) and
  // the step's statistics for the sum over dp ([E + 8]).
  std::vector<float> mine_;
  std::vector<double> sums_;
  // The two-level dispatch's work space, shared by the slots (forward or backward only):
  // rows sent by this source and received by this relay, node-packed rows, the routing slots
  // (expert on the node, weight) that travel with the rows, the combine weights' gradients.
  Buffer src_rows_, relay_rows_, np_rows_, relay_dw_, src_dw_;
  std::vector<float> src_meta_, relay_meta_, node_counts_, cross_f_;
  std::vector<int64_t> next_;
  std::vector<int64_t> cross_count_[2], cross_displ_[2];
  std::vector<char> seen_;  // per node: a token's nodes already counted (route)
  // Context parallelism's host work space: the runs, which tokens are this rank's, each
  // expert's next packed row.
  std::vector<Run> runs_;
  std::vector<std::vector<ContextParallel::Segment>> cp_segments_;
  std::vector<char> own_;
  std::vector<int64_t> next_row_;
};

}  // namespace tessera
