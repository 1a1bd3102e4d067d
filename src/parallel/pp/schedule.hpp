// Pipeline schedules as data (doc/architecture.md, "Invariants"): a pure function turns (stages p,
// micro-batches m, chunks per stage v, kind) into every stage's ordered list of operations.
// Every rank computes the same schedule from the deck, so a bad shape is a collective
// error raised before any work starts. doc/pipeline.md explains the schedules.
//
// Model chunks. The model's layers are cut into C = v * p consecutive model chunks, placed
// by the kind (Placement):
//  * round robin (gpipe, 1f1b, interleaved, zb-h1): model chunk c lives on stage c % p as
//    its local chunk c / p (Megatron-LM's interleaved assignment); with v = 1 chunk c is
//    stage c;
//  * V (zb-v, dualpipev; v = 2): chunk c < p on stage c as local chunk 0, chunk c >= p on
//    stage 2p - 1 - c as local chunk 1. A micro-batch goes down the stages and back up:
//    stage p-1 runs chunks p-1 and p back to back (the boundary between them carries no
//    message), and stage 0 holds the first chunk (the embedding) and the last (the loss).
//
// Operations. Each Op names its micro-batch and the LOCAL chunk it belongs to on the stage
// that runs it: forward/backward run that chunk. A split-backward kind (zb-h1, zb-v,
// dualpipev) runs each backward as two passes: backward_input (B: the gradient of the
// chunk's input, which the previous chunk waits for) and later backward_weight (W: the
// gradients of its weights, which nothing waits for, so a schedule may put it in an idle
// gap). A fused kind uses only backward, a split kind only backward_input and
// backward_weight. send_act follows forward of that chunk and carries its output; recv_act
// precedes forward of that chunk and brings its input; send_grad follows the pass that
// computes the input gradient (backward or backward_input) and carries it; recv_grad
// precedes that pass and brings the gradient of the chunk's output. backward_weight sends
// and receives nothing. peer is the other stage of a send/recv, -1 for compute.
//
// Guarantees of every list make_schedule returns (check_schedule proves them):
//  * each (micro-batch, local chunk) has exactly one forward and one backward, the
//    backward after the forward; split: one forward, one backward_input and one
//    backward_weight, in that order;
//  * a forward of model chunk c > 0 is immediately preceded by its recv_act; a backward
//    (or backward_input) of model chunk c < C-1 by its recv_grad. Model chunk 0's forward
//    reads the data (no recv); model chunk C-1's forward ends in the loss, and its backward
//    starts there (no recv_grad); a boundary that does not cross stages (the turn of a V)
//    has neither message, the stage keeps the tensor;
//  * a forward of model chunk c < C-1 is immediately followed by its send_act; a backward
//    (or backward_input) of model chunk c > 0 by its send_grad (likewise);
//  * for each ordered pair of stages and each direction (act, grad) the k-th send matches
//    the k-th recv (same micro-batch and boundary), so MPI's non-overtaking order makes a
//    mismatch impossible even with one tag per direction;
//  * with sends that never block and recvs that block, every stage runs to the end (no
//    deadlock), and forward/backward of a micro-batch run in model-chunk order.
// An executor may therefore post every irecv early (or as soon as its buffer exists), wait
// on it at the recv op, start an isend at the send op, and wait on sends only at the end of
// the step. message_tag() gives each message of a step a distinct tag.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/choices.hpp"  // PipeSchedule, its parser and spelling

namespace tessera::pp {

struct Op {
  // backward_input and backward_weight come last so that the fused kinds' values stay.
  enum Kind : std::uint8_t {
    forward,
    backward,
    send_act,
    recv_act,
    send_grad,
    recv_grad,
    backward_input,
    backward_weight
  };
  Kind kind;
  int micro;  // micro-batch, 0..m-1
  int chunk;  // local chunk on this stage, 0..v-1
  int peer;   // the other stage of a send/recv; -1 for compute

  bool is_compute() const { return !is_send() && !is_recv(); }
  bool is_send() const { return kind == send_act || kind == send_grad; }
  bool is_recv() const { return kind == recv_act || kind == recv_grad; }
  // The pass that takes the output's gradient (recv_grad) and gives the input's (send_grad).
  bool computes_input_grad() const { return kind == backward || kind == backward_input; }
  bool operator==(const Op&) const = default;
};

std::string_view to_string(Op::Kind kind);

// Where the model chunks live (see the top of this file).
enum class Placement { round_robin, v_shape };
Placement placement_of(PipeSchedule kind);
// Whether the kind runs backward_input and backward_weight instead of backward.
bool splits_backward(PipeSchedule kind);

struct ScheduleShape {
  int stages = 1;         // p
  int micro_batches = 1;  // m
  int chunks = 1;         // v, model chunks per stage
  PipeSchedule kind = PipeSchedule::one_f_one_b;

  Placement placement() const { return placement_of(kind); }
  bool split_backward() const { return splits_backward(kind); }
  int model_chunks() const { return stages * chunks; }  // C = v * p
  int model_chunk(int stage, int local_chunk) const {
    if (placement() == Placement::v_shape && local_chunk == 1) return 2 * stages - 1 - stage;
    return local_chunk * stages + stage;
  }
  int stage_of(int model_chunk) const {
    if (placement() == Placement::v_shape && model_chunk >= stages)
      return 2 * stages - 1 - model_chunk;
    return model_chunk % stages;
  }
  int local_chunk_of(int model_chunk) const {
    if (placement() == Placement::v_shape) return model_chunk >= stages ? 1 : 0;
    return model_chunk / stages;
  }
  // Whether boundary b (between model chunks b and b+1) joins two stages; false at the turn
  // of a V, where no message is sent.
  bool crosses(int boundary) const { return stage_of(boundary) != stage_of(boundary + 1); }
  // The stage that runs the embedding (model chunk 0) and the one with the loss (C-1).
  int loss_stage() const { return stage_of(model_chunks() - 1); }
};

struct Schedule {
  ScheduleShape shape;
  std::vector<std::vector<Op>> stages;  // stages[s]: stage s's ordered operations
};

// Throws a collective tessera::Error if the shape is not allowed:
//   p >= 1, m >= 1, v >= 1 always;
//   gpipe: v = 1;
//   1f1b: v = 1 and m >= p (fewer micro-batches cannot fill the pipeline: use gpipe);
//   interleaved: p >= 2, v >= 2 and m a multiple of p (Megatron-LM's requirement; its
//     micro-batches go through the chunks in groups of p);
//   zb-h1: v = 1 and m >= p, as 1f1b;
//   zb-v: v = 2 (any m; see make_schedule);
//   dualpipev: v = 2 and m >= 2p (DeepSeek's requirement: its steady state runs from the
//     first stage's 2p-th forward).
void require_valid(const ScheduleShape& shape);

// The schedule of every stage; calls require_valid first.
Schedule make_schedule(const ScheduleShape& shape);
inline Schedule make_schedule(int stages, int micro_batches, int chunks, PipeSchedule kind) {
  return make_schedule(ScheduleShape{stages, micro_batches, chunks, kind});
}

// Forward passes stage s runs before the forward that comes right before its first backward
// (or backward_input), which starts the steady state (the warm-up; all forwards run before
// the first backward are min(warm-up + 1, v m)):
//   gpipe m; 1f1b and zb-h1 min(p - s - 1, m);
//   interleaved min(2 (p - s - 1) + (v - 1) p, v m)   (Megatron-LM), in chunk passes;
//   zb-v min(2p, 2m, m + s + 1) - 1; dualpipev 2p - 1, and 2p on the last stage.
int warmup_forwards(const ScheduleShape& shape, int stage);

// Largest number of (micro-batch, local chunk) activations stage s holds at once (forwards
// run whose backward, or backward_weight when split, has not): m for gpipe, min(p - s, m)
// for 1f1b, for interleaved and zb-v min(warmup + 1, v m) (zb-v: 2p from m >= 2p - 1); p for
// zb-h1 and 2p + 1 for dualpipev. One unit is one chunk's activations (1/v of a stage's
// layers).
int peak_activations_formula(const ScheduleShape& shape, int stage);

// Largest number of chunk passes stage s holds between their backward_input and their
// backward_weight (a split kind's W still to run, whose output gradients a GPU framework keeps
// for it): s + 1 for zb-h1 (its s held-back W's and the B just run) and for dualpipev (the
// cool-down's held-back W's); 2s + 1 for zb-v from m >= 2p - 1 (its cool-down's s pairs B0 B1
// and a B0), an upper bound below that; 0 for the fused kinds.
int peak_pending_weights_formula(const ScheduleShape& shape, int stage);

// An exact fraction, always reduced, den > 0.
struct Ratio {
  std::int64_t num = 0, den = 1;
  bool operator==(const Ratio&) const = default;
};
Ratio make_ratio(std::int64_t num, std::int64_t den);

// Ideal costs of one chunk pass, in integer time units; communication is free. A fused
// backward costs input + weight. weight may be 0 (a fused backward as cheap as input).
struct OpCosts {
  std::int64_t forward = 1;
  std::int64_t input = 1;   // backward_input (B)
  std::int64_t weight = 1;  // backward_weight (W)
  std::int64_t backward() const { return input + weight; }
};

// The pipeline bubble as idle time over compute time on a stage (see simulate()), with F,
// B, W the costs of forward, backward_input and backward_weight (a fused backward B + W):
//   gpipe, 1f1b  (p-1)/m                             exact for any costs;
//   interleaved  (p-1)/(v m)                         exact for any costs;
//   zb-h1        (p-1) max(F, B, F+B-W)/(m (F+B+W))  exact for any costs (tested F, B <= 4,
//                W <= 4): (p-1)/(3m) at F = B = W, a third of 1f1b's;
//   zb-v         max(p-1, 4p-2-2m) F/(2m (F+B+W))   exact at F = B = W: (p-1)/(6m) from
//                m >= 3p/2, only the first forward's ramp down the stages, which no
//                schedule avoids; an approximation for other costs;
//   dualpipev    (p-1) F/(2m (F+B+W))               likewise, exact at F = B = W (m >= 2p).
// F, B, W are a chunk's: a V kind's chunk is half a stage, so its (p-1)/(6m) is a sixth of
// 1f1b's (p-1)/m on the same model.
Ratio bubble_formula(const ScheduleShape& shape, const OpCosts& costs = {});
// bubble_formula as a report prints it, in p, m, v and F, B, W (the fused kinds' do not
// depend on them): "(p-1)/m", "(p-1)/(v m)", ...
const char* bubble_formula_text(PipeSchedule kind);

// One message of a step: across boundary b (between model chunks b and b+1), activations
// go from stage_of(b) to stage_of(b+1) and gradients back. A boundary that does not cross
// stages has no message.
struct Message {
  int src, dst;  // stages
  int micro;     // micro-batch
  int boundary;  // 0..C-2
  bool grad;     // false: activations (forward), true: gradients (backward)
  bool operator==(const Message&) const = default;
};

// The message a send/recv op of stage `stage` moves (op must be a send or recv).
Message message_of(const ScheduleShape& shape, int stage, const Op& op);

// DualPipe's pairs in one stage's list (dualpipev; none for another kind): a forward whose
// next compute op is a backward_input of the other local chunk (the main part's F0 B1 and
// F1 B0, the cool-down's F1 B0), each a range [begin, end) of ops: the forward's recv_act, the
// forward, its send_act, the backward_input's recv_grad, the backward_input, its send_grad
// (those that exist). An executor may run a pair's computes interleaved, waiting for its
// recvs before and posting its sends after them (completes_with_grouped_pairs proves it safe).
struct OpPair {
  std::size_t begin, end, forward, backward;
};
std::vector<OpPair> op_pairs(const ScheduleShape& shape, const std::vector<Op>& ops);

// A tag unique to each message of a step: (micro * (C - 1) + boundary) * 2 + grad. It is
// below 2 m (C - 1); an executor must check it against MPI_TAG_UB (require_tags), or use
// one tag per direction, which the pairing guarantee above makes safe too.
int message_tag(const ScheduleShape& shape, const Message& msg);

// A collective error when the largest tag of a step, 2 m (C - 1) - 1, is above max_tag (the
// pipeline communicator's MPI_TAG_UB, at least 32767).
void require_tags(const ScheduleShape& shape, int64_t max_tag);

}  // namespace tessera::pp
