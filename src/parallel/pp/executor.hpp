// Runs one stage's op list (schedule.hpp) for one training step with non-blocking
// point-to-point messages on the pipeline group: every irecv of the step is posted at its
// start (each message has its own tag, message_tag), a recv op waits for its message just
// before the compute that needs it, a send op copies the chunk's output into a buffer of
// its own and starts an isend, and all sends are waited at the end of the step (1f1b and
// interleaved deadlock with blocking sends, doc/pipeline.md).
//
// With a Trace (set_trace), every pass is a span (forward/backward with its micro-batch and
// local chunk), and so are each send (the copy and the isend), each recv wait and the wait
// on the step's sends at its end, with the message, the peer stage and the bytes.
//
// Activation slots: a forward takes the lowest free slot and its backward (or backward_input)
// frees it. A split backward's backward_weight reads what its backward_input kept for it
// (model/weight_grads.hpp), not the slot, so a stage holds at most peak_activations_formula
// slots of saved state and its copies for W at once.
//
// The turn of a V (zb-v, dualpipev): stage p-1 runs model chunks p-1 and p; the output of the
// first is copied into the second's input buffer, and the input gradient of the second into
// the first's output-gradient buffer (no message).
//
// DualPipe's pairs (dualpipev, op_pairs): with a StageWork that interleaves, the executor waits
// for a pair's messages, hands both passes to StageWork::run_pair and posts both sends after
// it (completes_with_grouped_pairs); the pair is one compute span, and its messages are also
// counted apart (last_paired).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.hpp"
#include "core/trace.hpp"
#include "parallel/pp/schedule.hpp"
#include "tensor/tensor.hpp"

namespace tessera::pp {

// What a stage computes; the executor moves the data between stages.
class StageWork {
 public:
  virtual ~StageWork() = default;
  // Forward of (micro, local chunk) in activation slot `slot`; x is the received input, of
  // the message's shape (empty for model chunk 0, which reads the data). Returns the chunk's
  // output, valid until the next call (empty for the last model chunk, which ends in the loss).
  virtual Tensor forward(int micro, int chunk, int slot, const Tensor& x) = 0;
  // Backward of the same; dy is the received output gradient (empty for the last model
  // chunk). Returns the gradient of the chunk's input, valid until the next call (empty for
  // model chunk 0).
  virtual Tensor backward(int micro, int chunk, int slot, const Tensor& dy) = 0;
  // A split backward (zb-h1, zb-v, dualpipev): backward_input returns what backward does
  // (the input gradient) and queues the weight gradients; backward_weight of the same
  // (micro, chunk), later, computes them. The defaults refuse: a StageWork that does not
  // split cannot run a split schedule.
  virtual Tensor backward_input(int micro, int chunk, int slot, const Tensor& dy);
  virtual void backward_weight(int micro, int chunk);
  // DualPipe's pairing (dualpipev; doc/pipeline.md, "Paired overlap"): a forward followed by
  // a backward_input of another micro-batch on the other chunk. When interleaves() is true the
  // executor waits for both passes' messages first, calls run_pair with the two calls (a
  // forward and a backward_input of this interface), and sends both outputs after it; the
  // stage may interleave the two calls, in either order, and each call's output must then
  // stay valid until both have run. The default runs them one after the other.
  virtual bool interleaves() const { return false; }
  virtual void run_pair(const std::function<void()>& forward,
                        const std::function<void()>& backward_input);
};

// The step's pipeline messages of one kind (activations or gradients) as this stage saw
// them, summed over steps. A receive counts as hidden when it was complete before the op
// that needs it (seen by poll() during compute, or complete at its wait); a send's time in
// flight runs from its isend to when it is first seen complete, and what of that the step's
// final send wait blocked is exposed.
struct MessageTiming {
  int64_t received = 0, received_early = 0;
  double recv_wait = 0;  // seconds blocked in this kind's receive waits
  int64_t sent = 0;
  double send_flight = 0, send_exposed = 0;
  MessageTiming& operator+=(const MessageTiming& o);
};

class Executor {
 public:
  // message: the shape of one activation (= one gradient) message, f32, the same on every
  // stage. The step's message tags must fit the pipeline communicator's MPI_TAG_UB
  // (require_tags).
  Executor(Communicator& pp, const ScheduleShape& shape, Shape message, Allocator& alloc);

  void run(StageWork& work);
  void set_trace(Trace* trace) { trace_ = trace; }
  // Tests the step's messages in flight: MPI moves a non-blocking message only inside MPI
  // calls, so the model calls this between parts (Trainer: the parts' hooks) while a stage
  // computes, and a message of one micro-batch moves behind another's compute (DualPipe's
  // pairing: doc/pipeline.md). Nothing outside a step.
  void poll();
  // Activations ([0]) and gradients ([1]): the last step's and every step's.
  const MessageTiming& last_messages(int kind) const { return last_messages_[kind]; }
  const MessageTiming& total_messages(int kind) const { return total_messages_[kind]; }
  // The messages (both kinds) received and sent by the pairs run interleaved (run_pair with
  // interleaves()), and how many such pairs ran: the last step's and every step's.
  const MessageTiming& last_paired() const { return last_paired_; }
  const MessageTiming& total_paired() const { return total_paired_; }
  int64_t paired_ops() const { return paired_ops_; }  // pairs in the stage's op list, per step
  int64_t pairs_run() const { return pairs_run_; }

  const ScheduleShape& shape() const { return shape_; }
  // Seconds the last step spent waiting in recv waits, and over all steps.
  double last_wait() const { return last_wait_; }
  double total_wait() const { return total_wait_; }
  // Seconds in the stage's forward and backward calls, in the last step and over all steps.
  double last_compute() const { return last_compute_; }
  double total_compute() const { return total_compute_; }
  int peak_slots() const { return peak_slots_; }
  // The most (micro-batch, chunk) passes begun and not finished at once: forwards whose
  // backward (split: backward_weight) has not run; peak_activations_formula exactly.
  int peak_in_flight() const { return peak_in_flight_; }

 private:
  Buffer& buffer(std::vector<Buffer>& pool, int micro, int chunk);
  // Runs one compute op (forward, backward, backward_input, backward_weight) and returns its
  // output, to send or to keep for the other chunk of a V's turn.
  // Alone: timed and traced on its own (not inside a pair, which is timed as one).
  Tensor compute(StageWork& work, const Op& op, std::vector<int>& slot_of,
                 std::vector<char>& slot_busy, bool alone = true);
  // The op list's pieces: a recv op's wait, the turn of a V after a compute op (returns the
  // output still to send), a send op; `paired`: inside a pair, also counted as paired.
  void wait_recv(const Op& op, bool paired);
  Tensor turn(const Op& op, Tensor out);
  void send(const Op& op, const Tensor& out, bool paired);
  // A pair of ops (op_pairs): its recvs, then both computes through run_pair, then its sends.
  void run_pair(StageWork& work, const OpPair& p, std::vector<int>& slot_of,
                std::vector<char>& slot_busy);

  Communicator& pp_;
  ScheduleShape shape_;
  int stage_;
  std::vector<Op> ops_;
  Shape message_;
  Allocator& alloc_;
  // Per (micro, local chunk): received activations / gradients and outgoing copies.
  std::vector<Buffer> recv_act_, recv_grad_, send_act_, send_grad_;
  // The step's messages in flight (run() owns them; poll() tests them): receives per (kind,
  // micro, local chunk), sends in posting order, and when each was posted and first seen
  // complete (steady-clock seconds; -1 not yet).
  struct InFlight {
    Request request;
    int kind = 0;  // 0 activation, 1 gradient
    bool paired = false;  // a send of a pair's output
    double posted = 0, seen = -1;
  };
  std::vector<OpPair> pairs_;  // the pairs of the op list, in order (dualpipev)
  std::vector<InFlight> receives_, sends_;
  bool in_step_ = false;
  MessageTiming last_messages_[2], total_messages_[2], last_paired_, total_paired_;
  int64_t paired_ops_ = 0, pairs_run_ = 0;
  double last_wait_ = 0, total_wait_ = 0, last_compute_ = 0, total_compute_ = 0;
  int peak_slots_ = 0, in_flight_ = 0, peak_in_flight_ = 0;
  Trace* trace_ = nullptr;
};

}  // namespace tessera::pp
