#include "parallel/pp/schedule.hpp"

#include <algorithm>
#include <numeric>

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
  }
  return "?";
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
  }
}

int warmup_forwards(const ScheduleShape& shape, int stage) {
  const int p = shape.stages, m = shape.micro_batches, v = shape.chunks;
  switch (shape.kind) {
    case PipeSchedule::gpipe:
      return m;
    case PipeSchedule::one_f_one_b:
      return std::min(p - stage - 1, m);
    case PipeSchedule::interleaved:
      return std::min(2 * (p - stage - 1) + (v - 1) * p, v * m);
  }
  return m;
}

int peak_activations_formula(const ScheduleShape& shape, int stage) {
  const int total = shape.micro_batches * shape.chunks;
  return std::min(warmup_forwards(shape, stage) + 1, total);
}

Ratio make_ratio(std::int64_t num, std::int64_t den) {
  TESSERA_REQUIRE(den != 0, "pipeline: a ratio with denominator 0");
  if (den < 0) num = -num, den = -den;
  const std::int64_t g = std::gcd(num, den);
  return g == 0 ? Ratio{0, 1} : Ratio{num / g, den / g};
}

// Only interleaving divides the bubble by the chunks per stage: the formula's value and its
// text both ask this.
namespace {
bool bubble_over_chunks(PipeSchedule kind) { return kind == PipeSchedule::interleaved; }
}  // namespace

Ratio bubble_formula(const ScheduleShape& shape) {
  const int v = bubble_over_chunks(shape.kind) ? shape.chunks : 1;
  return make_ratio(shape.stages - 1, std::int64_t(v) * shape.micro_batches);
}

const char* bubble_formula_text(PipeSchedule kind) {
  return bubble_over_chunks(kind) ? "(p-1)/(v m)" : "(p-1)/m";
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
  if (kind == Op::forward) {
    if (c > 0) ops.push_back({Op::recv_act, pass.micro, pass.chunk, shape.stage_of(c - 1)});
    ops.push_back({Op::forward, pass.micro, pass.chunk, -1});
    if (c < last) ops.push_back({Op::send_act, pass.micro, pass.chunk, shape.stage_of(c + 1)});
  } else {
    if (c < last) ops.push_back({Op::recv_grad, pass.micro, pass.chunk, shape.stage_of(c + 1)});
    ops.push_back({Op::backward, pass.micro, pass.chunk, -1});
    if (c > 0) ops.push_back({Op::send_grad, pass.micro, pass.chunk, shape.stage_of(c - 1)});
  }
}

}  // namespace

// Every kind is warm-up forwards, then one forward and one backward in turn, then the
// remaining backwards (the cool-down); gpipe is all warm-up.
Schedule make_schedule(const ScheduleShape& shape) {
  require_valid(shape);
  Schedule sched{shape, std::vector<std::vector<Op>>(shape.stages)};
  const int passes = shape.micro_batches * shape.chunks;
  for (int s = 0; s < shape.stages; ++s) {
    std::vector<Op>& ops = sched.stages[s];
    ops.reserve(std::size_t(passes) * 6);
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
  return sched;
}

}  // namespace tessera::pp
