// Pipeline schedules as data (doc/architecture.md, "Invariants"): a pure function turns (stages p,
// micro-batches m, chunks per stage v, kind) into every stage's ordered list of operations.
// Every rank computes the same schedule from the deck, so a bad shape is a collective
// error raised before any work starts. doc/pipeline.md explains the schedules.
//
// Model chunks. The model's layers are cut into C = v * p consecutive model chunks; model
// chunk c lives on stage c % p as its local chunk c / p (Megatron-LM's interleaved
// assignment). gpipe and 1f1b have v = 1: chunk c is stage c.
//
// Operations. Each Op names its micro-batch and the LOCAL chunk it belongs to on the stage
// that runs it: forward/backward run that chunk; send_act follows forward of that chunk and
// carries its output; recv_act precedes forward of that chunk and brings its input;
// send_grad follows backward of that chunk and carries the gradient of its input;
// recv_grad precedes backward of that chunk and brings the gradient of its output. peer is
// the other stage of a send/recv, -1 for compute.
//
// Guarantees of every list make_schedule returns (check_schedule proves them):
//  * each (micro-batch, local chunk) has exactly one forward and one backward, the
//    backward after the forward;
//  * a forward of model chunk c > 0 is immediately preceded by its recv_act; a backward of
//    model chunk c < C-1 by its recv_grad. Model chunk 0's forward reads the data (no recv);
//    model chunk C-1's forward ends in the loss, and its backward starts there (no
//    recv_grad);
//  * a forward of model chunk c < C-1 is immediately followed by its send_act; a backward of
//    model chunk c > 0 by its send_grad;
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
  enum Kind : std::uint8_t { forward, backward, send_act, recv_act, send_grad, recv_grad };
  Kind kind;
  int micro;  // micro-batch, 0..m-1
  int chunk;  // local chunk on this stage, 0..v-1
  int peer;   // the other stage of a send/recv; -1 for forward/backward

  bool is_compute() const { return kind == forward || kind == backward; }
  bool is_send() const { return kind == send_act || kind == send_grad; }
  bool is_recv() const { return kind == recv_act || kind == recv_grad; }
  bool operator==(const Op&) const = default;
};

std::string_view to_string(Op::Kind kind);

struct ScheduleShape {
  int stages = 1;         // p
  int micro_batches = 1;  // m
  int chunks = 1;         // v, model chunks per stage
  PipeSchedule kind = PipeSchedule::one_f_one_b;

  int model_chunks() const { return stages * chunks; }  // C = v * p
  int model_chunk(int stage, int local_chunk) const { return local_chunk * stages + stage; }
  int stage_of(int model_chunk) const { return model_chunk % stages; }
  int local_chunk_of(int model_chunk) const { return model_chunk / stages; }
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
//     micro-batches go through the chunks in groups of p).
void require_valid(const ScheduleShape& shape);

// The schedule of every stage; calls require_valid first.
Schedule make_schedule(const ScheduleShape& shape);
inline Schedule make_schedule(int stages, int micro_batches, int chunks, PipeSchedule kind) {
  return make_schedule(ScheduleShape{stages, micro_batches, chunks, kind});
}

// Forward passes stage s runs before its first backward (the warm-up):
//   gpipe m; 1f1b min(p - s - 1, m);
//   interleaved min(2 (p - s - 1) + (v - 1) p, v m)   (Megatron-LM), in chunk passes.
int warmup_forwards(const ScheduleShape& shape, int stage);

// Largest number of (micro-batch, local chunk) activations stage s holds at once (forwards
// run whose backward has not): m for gpipe, min(p - s, m) for 1f1b, and for interleaved
// min(warmup + 1, v m). One unit is one chunk's activations (1/v of a stage's layers).
int peak_activations_formula(const ScheduleShape& shape, int stage);

// An exact fraction, always reduced, den > 0.
struct Ratio {
  std::int64_t num = 0, den = 1;
  bool operator==(const Ratio&) const = default;
};
Ratio make_ratio(std::int64_t num, std::int64_t den);

// The pipeline bubble as idle time over compute time on a stage: (p - 1) / m for gpipe and
// 1f1b, (p - 1) / (v m) for interleaved (see simulate()).
Ratio bubble_formula(const ScheduleShape& shape);
// That formula as a report prints it: "(p-1)/m" or "(p-1)/(v m)".
const char* bubble_formula_text(PipeSchedule kind);

// One message of a step: across boundary b (between model chunks b and b+1), activations
// go from stage_of(b) to stage_of(b+1) and gradients back.
struct Message {
  int src, dst;  // stages
  int micro;     // micro-batch
  int boundary;  // 0..C-2
  bool grad;     // false: activations (forward), true: gradients (backward)
  bool operator==(const Message&) const = default;
};

// The message a send/recv op of stage `stage` moves (op must be a send or recv).
Message message_of(const ScheduleShape& shape, int stage, const Op& op);

// A tag unique to each message of a step: (micro * (C - 1) + boundary) * 2 + grad. It is
// below 2 m (C - 1); an executor must check it against MPI_TAG_UB (require_tags), or use
// one tag per direction, which the pairing guarantee above makes safe too.
int message_tag(const ScheduleShape& shape, const Message& msg);

// A collective error when the largest tag of a step, 2 m (C - 1) - 1, is above max_tag (the
// pipeline communicator's MPI_TAG_UB, at least 32767).
void require_tags(const ScheduleShape& shape, int64_t max_tag);

}  // namespace tessera::pp
