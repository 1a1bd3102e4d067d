#include "parallel/pp/schedule.hpp"

#include <algorithm>
#include <deque>
#include <numeric>
#include <utility>

#include "core/error.hpp"

namespace tessera::pp {

std::string_view to_string(Op::Kind kind) {
  switch (kind) {
    case Op::forward:
      return "forward";
    case Op::backward:
      return "backward";
    case Op::send_act:
      return "send_act";
    case Op::recv_act:
      return "recv_act";
    case Op::send_grad:
      return "send_grad";
    case Op::recv_grad:
      return "recv_grad";
    case Op::backward_input:
      return "backward_input";
    case Op::backward_weight:
      return "backward_weight";
  }
  return "?";
}

Placement placement_of(PipeSchedule kind) {
  return kind == PipeSchedule::zb_v || kind == PipeSchedule::dualpipe_v ? Placement::v_shape
                                                                        : Placement::round_robin;
}

bool splits_backward(PipeSchedule kind) {
  return kind == PipeSchedule::zb_h1 || kind == PipeSchedule::zb_v ||
         kind == PipeSchedule::dualpipe_v;
}

// m comes from the deck as train.global_batch / (train.micro_batch x dp); the messages say
// "micro-batches" and leave the deck keys to the caller's context.
void require_valid(const ScheduleShape& shape) {
  const int p = shape.stages, m = shape.micro_batches, v = shape.chunks;
  const std::string_view kind = to_string(shape.kind);
  TESSERA_REQUIRE(p >= 1, "pipeline: stages (parallel.pp) is ", p, "; it must be at least 1");
  TESSERA_REQUIRE(m >= 1, "pipeline: micro-batches is ", m, "; it must be at least 1");
  TESSERA_REQUIRE(v >= 1, "pipeline: chunks per stage is ", v, "; it must be at least 1");
  switch (shape.kind) {
    case PipeSchedule::gpipe:
    case PipeSchedule::one_f_one_b:
      TESSERA_REQUIRE(v == 1, "pipeline: the ", kind, " schedule runs one model chunk per ",
                      "stage but chunks per stage is ", v, "; use the interleaved schedule ",
                      "for v >= 2, or set chunks to 1");
      TESSERA_REQUIRE(shape.kind != PipeSchedule::one_f_one_b || m >= p,
                      "pipeline: the 1f1b schedule needs at least as many micro-batches as ",
                      "stages, but micro-batches is ", m, " and stages is ", p,
                      "; raise micro-batches to ", p, " or more (the bubble is (p-1)/m), ",
                      "or use the gpipe schedule");
      break;
    case PipeSchedule::interleaved:
      TESSERA_REQUIRE(p >= 2, "pipeline: the interleaved schedule needs at least 2 stages, ",
                      "but stages is ", p, "; use 1f1b with one stage");
      TESSERA_REQUIRE(v >= 2, "pipeline: the interleaved schedule needs at least 2 chunks ",
                      "per stage, but chunks per stage is ", v, "; use 1f1b for one chunk");
      TESSERA_REQUIRE(m % p == 0, "pipeline: the interleaved schedule needs micro-batches ",
                      "to be a multiple of stages (Megatron-LM's rule), but micro-batches is ", m,
                      " and stages is ", p, "; use ",
                      m < p ? cat(p) : cat(m / p * p, " or ", (m / p + 1) * p), " micro-batches");
      break;
    case PipeSchedule::zb_h1:
      TESSERA_REQUIRE(v == 1, "pipeline: the zb-h1 schedule runs one model chunk per stage, but ",
                      "parallel.pp_virtual is ", v, "; set parallel.pp_virtual = 1");
      TESSERA_REQUIRE(m >= p, "pipeline: the zb-h1 schedule needs at least as many ",
                      "micro-batches as stages (parallel.pp = ", p, "), but micro-batches is ", m,
                      "; raise micro-batches to ", p, " or more");
      break;
    case PipeSchedule::zb_v:
    case PipeSchedule::dualpipe_v:
      TESSERA_REQUIRE(v == 2, "pipeline: the ", kind, " schedule runs exactly 2 model chunks ",
                      "per stage, placed in a V, but parallel.pp_virtual is ", v,
                      "; set parallel.pp_virtual = 2");
      TESSERA_REQUIRE(shape.kind != PipeSchedule::dualpipe_v || m >= 2 * p,
                      "pipeline: the dualpipev schedule needs at least twice as many ",
                      "micro-batches as stages (parallel.pp = ", p, "), but micro-batches is ", m,
                      "; raise micro-batches to ", 2 * p, " or more");
      break;
  }
}

int warmup_forwards(const ScheduleShape& shape, int stage) {
  const int p = shape.stages, m = shape.micro_batches, v = shape.chunks;
  switch (shape.kind) {
    case PipeSchedule::gpipe:
      return m;
    case PipeSchedule::one_f_one_b:
    case PipeSchedule::zb_h1:
      return std::min(p - stage - 1, m);
    case PipeSchedule::interleaved:
      return std::min(2 * (p - stage - 1) + (v - 1) * p, v * m);
    case PipeSchedule::zb_v:  // with fewer than 2p - 1 micro-batches the padding is dropped
      return std::min({2 * p, 2 * m, m + stage + 1}) - 1;
    case PipeSchedule::dualpipe_v:  // the last stage's first main-part F0 comes before its B1
      return stage == p - 1 ? 2 * p : 2 * p - 1;
  }
  return m;
}

int peak_activations_formula(const ScheduleShape& shape, int stage) {
  switch (shape.kind) {
    case PipeSchedule::zb_h1:  // s W's held back on stage s add to 1f1b's p - s
      return shape.stages;
    case PipeSchedule::dualpipe_v:  // the main part's F0 comes before the B1 W1 it pairs with
      return 2 * shape.stages + 1;
    default:
      break;
  }
  const int total = shape.micro_batches * shape.chunks;
  return std::min(warmup_forwards(shape, stage) + 1, total);
}

int peak_pending_weights_formula(const ScheduleShape& shape, int stage) {
  switch (shape.kind) {
    case PipeSchedule::zb_h1:       // the W of the k-th B after the (k + s)-th B
    case PipeSchedule::dualpipe_v:  // the cool-down's last pairs hold s + 1 W's back
      return stage + 1;
    case PipeSchedule::zb_v:  // the cool-down's s pairs B0 B1 hold their W's, then a B0
      return 2 * stage + 1;
    default:
      return 0;
  }
}

Ratio make_ratio(std::int64_t num, std::int64_t den) {
  TESSERA_REQUIRE(den != 0, "pipeline: a ratio with denominator 0");
  if (den < 0) num = -num, den = -den;
  const std::int64_t g = std::gcd(num, den);
  return g == 0 ? Ratio{0, 1} : Ratio{num / g, den / g};
}

Ratio bubble_formula(const ScheduleShape& shape, const OpCosts& c) {
  const std::int64_t p = shape.stages, m = shape.micro_batches;
  const std::int64_t F = c.forward, B = c.input, W = c.weight;
  switch (shape.kind) {
    case PipeSchedule::gpipe:
    case PipeSchedule::one_f_one_b:
      return make_ratio(p - 1, m);
    case PipeSchedule::interleaved:
      return make_ratio(p - 1, shape.chunks * m);
    case PipeSchedule::zb_h1:
      return make_ratio((p - 1) * std::max({F, B, F + B - W}), m * (F + B + W));
    case PipeSchedule::zb_v:
      return make_ratio(std::max(p - 1, 4 * p - 2 - 2 * m) * F, 2 * m * (F + B + W));
    case PipeSchedule::dualpipe_v:
      return make_ratio((p - 1) * F, 2 * m * (F + B + W));
  }
  return make_ratio(p - 1, m);
}

const char* bubble_formula_text(PipeSchedule kind) {
  switch (kind) {
    case PipeSchedule::gpipe:
    case PipeSchedule::one_f_one_b:
      return "(p-1)/m";
    case PipeSchedule::interleaved:
      return "(p-1)/(v m)";
    case PipeSchedule::zb_h1:
      return "(p-1) max(F, B, F+B-W)/(m (F+B+W))";
    case PipeSchedule::zb_v:
      return "max(p-1, 4p-2-2m) F/(2m (F+B+W))";
    case PipeSchedule::dualpipe_v:
      return "(p-1) F/(2m (F+B+W))";
  }
  return "?";
}

Message message_of(const ScheduleShape& shape, int stage, const Op& op) {
  const int c = shape.model_chunk(stage, op.chunk);
  switch (op.kind) {
    case Op::send_act:
      return {stage, shape.stage_of(c + 1), op.micro, c, false};
    case Op::recv_act:
      return {shape.stage_of(c - 1), stage, op.micro, c - 1, false};
    case Op::send_grad:
      return {stage, shape.stage_of(c - 1), op.micro, c - 1, true};
    case Op::recv_grad:
      return {shape.stage_of(c + 1), stage, op.micro, c, true};
    default:
      TESSERA_REQUIRE(false, "pipeline: message_of() called on a ", to_string(op.kind), " op");
  }
  return {};
}

int message_tag(const ScheduleShape& shape, const Message& msg) {
  return (msg.micro * (shape.model_chunks() - 1) + msg.boundary) * 2 + (msg.grad ? 1 : 0);
}

void require_tags(const ScheduleShape& shape, int64_t max_tag) {
  const int64_t m = shape.micro_batches, C = shape.model_chunks();
  const int64_t largest = 2 * m * (C - 1) - 1;
  TESSERA_REQUIRE(largest <= max_tag, "pipeline: ", m, " micro-batches x ", C,
                  " model chunks use message tags up to 2 m (C - 1) - 1 = ", largest,
                  ", above the largest tag the pipeline communicator accepts (MPI_TAG_UB = ",
                  max_tag, "); use at most ", (max_tag + 1) / (2 * std::max<int64_t>(1, C - 1)),
                  " micro-batches (train.global_batch / (train.micro_batch x dp)) or fewer "
                  "chunks");
}

namespace {

struct Pass {
  int micro, chunk;  // local chunk
};

// The k-th forward and k-th backward pass of a stage. Megatron-LM's interleaved order: the
// passes go in groups of p micro-batches through the chunks, forwards through chunks
// 0..v-1, backwards through chunks v-1..0. With v = 1 this is micro-batch k.
Pass forward_pass(const ScheduleShape& shape, int k) {
  const int p = shape.stages, v = shape.chunks;
  return {k / (p * v) * p + k % p, k % (p * v) / p};
}
Pass backward_pass(const ScheduleShape& shape, int k) {
  const Pass f = forward_pass(shape, k);
  return {f.micro, shape.chunks - 1 - f.chunk};
}

// Appends a compute op with its recv before and its send after (see the header).
void emit(const ScheduleShape& shape, int stage, Op::Kind kind, Pass pass, std::vector<Op>& ops) {
  const int c = shape.model_chunk(stage, pass.chunk), last = shape.model_chunks() - 1;
  const bool from_before = c > 0 && shape.crosses(c - 1);  // chunk c-1 on another stage
  const bool from_after = c < last && shape.crosses(c);    // chunk c+1 on another stage
  if (kind == Op::forward) {
    if (from_before) ops.push_back({Op::recv_act, pass.micro, pass.chunk, shape.stage_of(c - 1)});
    ops.push_back({Op::forward, pass.micro, pass.chunk, -1});
    if (from_after) ops.push_back({Op::send_act, pass.micro, pass.chunk, shape.stage_of(c + 1)});
  } else if (kind == Op::backward_weight) {
    ops.push_back({kind, pass.micro, pass.chunk, -1});
  } else {
    if (from_after) ops.push_back({Op::recv_grad, pass.micro, pass.chunk, shape.stage_of(c + 1)});
    ops.push_back({kind, pass.micro, pass.chunk, -1});
    if (from_before) ops.push_back({Op::send_grad, pass.micro, pass.chunk, shape.stage_of(c - 1)});
  }
}

// Every fused kind is warm-up forwards, then one forward and one backward in turn, then the
// remaining backwards (the cool-down); gpipe is all warm-up.
void fused(const ScheduleShape& shape, int s, std::vector<Op>& ops) {
  const int passes = shape.micro_batches * shape.chunks;
  const int warmup = warmup_forwards(shape, s);
  for (int k = 0; k < warmup; ++k) emit(shape, s, Op::forward, forward_pass(shape, k), ops);
  for (int k = 0; k < passes - warmup; ++k) {
    emit(shape, s, Op::forward, forward_pass(shape, warmup + k), ops);
    emit(shape, s, Op::backward, backward_pass(shape, k), ops);
  }
  for (int k = passes - warmup; k < passes; ++k) {
    emit(shape, s, Op::backward, backward_pass(shape, k), ops);
  }
}

// The compute passes of one stage of a split kind, in order. Each local chunk runs its
// forwards and its backward_inputs in micro-batch order; a backward_weight is either run
// right after its backward_input (BW) or queued and run later (B, then W).
class SplitPasses {
 public:
  explicit SplitPasses(int chunks) : forwards_(chunks, 0), inputs_(chunks, 0) {}
  int forwards(int chunk) const { return forwards_[chunk]; }
  void F(int chunk) { ops_.push_back({Op::forward, forwards_[chunk]++, chunk, -1}); }
  // backward_input, its backward_weight queued.
  void B(int chunk) {
    const int micro = inputs_[chunk]++;
    ops_.push_back({Op::backward_input, micro, chunk, -1});
    queued_.push_back({micro, chunk});
  }
  // backward_input and at once its backward_weight (a fused backward in two passes).
  void BW(int chunk) {
    const int micro = inputs_[chunk]++;
    ops_.push_back({Op::backward_input, micro, chunk, -1});
    ops_.push_back({Op::backward_weight, micro, chunk, -1});
  }
  // The oldest queued backward_weight (of `chunk`, or of any chunk).
  void W(int chunk = -1) {
    const auto it = std::find_if(queued_.begin(), queued_.end(),
                                 [&](const Pass& q) { return chunk < 0 || q.chunk == chunk; });
    TESSERA_REQUIRE(it != queued_.end(), "pipeline: a schedule generator runs a backward_weight ",
                    "that no backward_input has queued");
    ops_.push_back({Op::backward_weight, it->micro, it->chunk, -1});
    queued_.erase(it);
  }
  bool queued(int chunk = -1) const {
    return std::any_of(queued_.begin(), queued_.end(),
                       [&](const Pass& q) { return chunk < 0 || q.chunk == chunk; });
  }
  const std::vector<Op>& ops() const { return ops_; }

 private:
  std::vector<int> forwards_, inputs_;
  std::deque<Pass> queued_;
  std::vector<Op> ops_;
};

// zb-h1 (Qi et al. 2023, ZB-H1): 1f1b's forwards and backward_inputs; stage s runs the W of
// its k-th backward after its (k + s)-th B, the last s at the end. The later stages, which
// 1f1b leaves idle longest at the start, run their first B's sooner and fill the gaps of the
// cool-down with the W's they held back; every stage then holds p activations (1f1b's
// first stage's), and the bubble is about a third of 1f1b's at F = B = W.
SplitPasses zb_h1(const ScheduleShape& shape, int s) {
  const int p = shape.stages, m = shape.micro_batches;
  SplitPasses x(1);
  const int warmup = std::min(p - s - 1, m);
  for (int k = 0; k < warmup; ++k) x.F(0);
  for (int k = 0; k < m; ++k) {
    if (x.forwards(0) < m) x.F(0);
    x.B(0);
    if (k >= s) x.W();
  }
  while (x.queued()) x.W();
  return x;
}

// zb-v (Qi et al. 2023, ZB-V, as PyTorch's ScheduleZBVZeroBubble orders it), for n >= 2p - 1
// micro-batches; make_schedule pads m up to that and drops the padding. Stage r: 2 (p-r) - 1
// forwards of chunk 0; r pairs F1 F0; p - r times F1 B1 W1; then F0 B0 W0 F1 B1 W1 until
// every forward has run; r pairs B0 B1 with their W's held back; p - r times B0 W0; the
// held-back W's of chunk 1, then of chunk 0.
SplitPasses zb_v(int p, int n, int r) {
  SplitPasses x(2);
  for (int k = 0; k < 2 * (p - r) - 1; ++k) x.F(0);
  for (int k = 0; k < r; ++k) x.F(1), x.F(0);
  for (int k = 0; k < p - r; ++k) x.F(1), x.BW(1);
  while (x.forwards(1) < x.forwards(0) || x.forwards(0) < n) {
    if (x.forwards(0) < n) x.F(0);
    x.BW(0);
    x.F(1), x.BW(1);
  }
  for (int k = 0; k < r; ++k) x.B(0), x.B(1);
  for (int k = 0; k < p - r; ++k) x.B(0), x.W(0);
  while (x.queued(1)) x.W(1);
  while (x.queued(0)) x.W(0);
  return x;
}

// dualpipev (DeepSeek's DualPipeV, the one-copy form of DeepSeek-V3's DualPipe), m >= 2p.
// Stage r: 2 (p-r-1) forwards of chunk 0; r + 1 pairs F0 F1; p-r-1 times B1 W1 F1; the main
// part, m - 2p + r + 1 times F0 B1 F1 B0 (each forward paired with a backward of another
// micro-batch, which DualPipe overlaps to hide each one's communication behind the other's
// compute; here they simply follow each other) with each backward's W at once; p-r-1
// times B1 F1 B0; r + 1 pairs B1 B0, whose W's are held back from the middle pair on; p-r-1
// times a held-back W then B0 (held back); the held-back W's, oldest first.
SplitPasses dualpipe_v(int p, int m, int r) {
  SplitPasses x(2);
  for (int k = 0; k < 2 * (p - r - 1); ++k) x.F(0);
  for (int k = 0; k < r + 1; ++k) x.F(0), x.F(1);
  for (int k = 0; k < p - r - 1; ++k) x.B(1), x.W(), x.F(1);
  for (int k = 0; k < m - 2 * p + r + 1; ++k) x.F(0), x.BW(1), x.F(1), x.BW(0);
  for (int k = 0; k < p - r - 1; ++k) x.BW(1), x.F(1), x.BW(0);
  bool hold = false;
  for (int k = 0; k < r + 1; ++k) {
    // From the middle pair on (for odd r from its B1, for even r from its B0) the W's
    // wait, to fill the cool-down's gaps.
    if (k == (r + 1) / 2 && r % 2 == 1) hold = true;
    hold ? x.B(1) : x.BW(1);
    if (k == (r + 1) / 2 && r % 2 == 0) hold = true;
    hold ? x.B(0) : x.BW(0);
  }
  for (int k = 0; k < p - r - 1; ++k) x.W(), x.B(0);
  while (x.queued()) x.W();
  return x;
}

void split(const ScheduleShape& shape, int s, std::vector<Op>& ops) {
  const int p = shape.stages, m = shape.micro_batches;
  SplitPasses x(shape.chunks);
  switch (shape.kind) {
    case PipeSchedule::zb_h1:
      x = zb_h1(shape, s);
      break;
    case PipeSchedule::zb_v:
      x = zb_v(p, std::max(m, 2 * p - 1), s);
      break;
    case PipeSchedule::dualpipe_v:
      x = dualpipe_v(p, m, s);
      break;
    default:
      break;
  }
  // Dropping every pass of the padding micro-batches (all >= m, on every stage) keeps the
  // lists complete and deadlock-free: the passes left run in the same order.
  for (const Op& op : x.ops()) {
    if (op.micro < m) emit(shape, s, op.kind, {op.micro, op.chunk}, ops);
  }
}

}  // namespace

std::vector<OpPair> op_pairs(const ScheduleShape& shape, const std::vector<Op>& ops) {
  std::vector<OpPair> pairs;
  if (shape.kind != PipeSchedule::dualpipe_v) return pairs;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind != Op::forward) continue;
    std::size_t j = i + 1;
    while (j < ops.size() && !ops[j].is_compute()) ++j;
    if (j == ops.size() || ops[j].kind != Op::backward_input || ops[j].chunk == ops[i].chunk)
      continue;
    OpPair p{i, j + 1, i, j};
    if (p.begin > 0 && ops[p.begin - 1].kind == Op::recv_act) --p.begin;
    if (p.end < ops.size() && ops[p.end].kind == Op::send_grad) ++p.end;
    pairs.push_back(p);
  }
  return pairs;
}

Schedule make_schedule(const ScheduleShape& shape) {
  require_valid(shape);
  Schedule sched{shape, std::vector<std::vector<Op>>(shape.stages)};
  const int passes = shape.micro_batches * shape.chunks;
  for (int s = 0; s < shape.stages; ++s) {
    std::vector<Op>& ops = sched.stages[s];
    ops.reserve(std::size_t(passes) * 7);
    if (shape.split_backward())
      split(shape, s, ops);
    else
      fused(shape, s, ops);
  }
  return sched;
}

}  // namespace tessera::pp
