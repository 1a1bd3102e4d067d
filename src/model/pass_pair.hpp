// Two passes of different micro-batches interleaved on one thread (DualPipe's pairing of a
// forward with a backward_input, doc/pipeline.md "Paired overlap"). Each pass runs on a stack
// of its own (a fiber: ucontext's makecontext/swapcontext, glibc); a pass gives way to the other
// when it is about to wait for transfers it posted (await), so the other micro-batch computes
// while they travel, and every GEMM of the other pass polls them (poll_other, through
// StepContext::poll_transfers) so that MPI moves them.
//
// Stackful rather than C++20 coroutines: the passes suspend deep inside the layers (a MoE block
// under a Block under Transformer::forward_chunk), and a stackless coroutine would make every
// function on the way a coroutine; a fiber suspends the whole call stack unchanged. The order
// of the switches depends on nothing but the code path (a pass gives way at each await while
// the other has not ended), so every rank of a group runs the same sequence of collectives.
//
// The passes share the thread's MPI, OpenMP and device state: no pass suspends inside a
// parallel region or a collective. Whatever the passes share must be safe to interleave at the
// awaits: the caller gives each its own StepContext and Scratch, and runs pairs only in the
// compositions where nothing else is shared (Trainer, paired_overlap_off()).
#pragma once

#include <ucontext.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>

#include "comm/process_grid.hpp"

namespace tessera {

class StepTransfers;

class PassPair {
 public:
  // The traffic of a pair's passes whose hidden fraction is reported apart (doc/moe-overlap.md):
  // the experts' forward dispatch and combine, and backward the output gradients to the
  // experts and the input gradients back.
  enum Kind { forward_dispatch, forward_combine, backward_dispatch, backward_return, kinds };

  explicit PassPair(size_t stack_bytes = size_t(64) << 20);
  ~PassPair();
  PassPair(const PassPair&) = delete;
  PassPair& operator=(const PassPair&) = delete;

  // Runs first() and second() to their ends, first() from its start until its first await,
  // then second() until its first, and so on; once one has ended the other runs on. An
  // exception of either is rethrown here (the other pass's stack is abandoned: a fatal error).
  void run(const std::function<void()>& first, const std::function<void()>& second);
  // Inside run(): called by a pass just before it waits for `t`, transfers it posted. While the
  // other pass has not ended, t is left in flight (polled by the other's GEMMs) and the other
  // pass runs until its own await or its end; then this one resumes and finishes t.
  void await(StepTransfers& t);
  // The same switch with nothing left in flight (tests; a pass with nothing to wait for).
  void give_way();
  // Gives way until the other pass has ended: what follows adds into a sum the other pass
  // adds into too, and must come after it, as when the passes run one after the other.
  void let_other_finish();
  // Polls the transfers the suspended pass left in flight (nothing outside run()).
  void poll_other();
  bool running() const { return running_; }

  // Over all runs: pairs run, switches between the passes, and transfers that travelled while
  // the other pass computed (each await that gave way counts its transfers).
  int64_t pairs() const { return pairs_; }
  int64_t switches() const { return switches_; }
  int64_t crossed() const { return crossed_; }
  // The transfers of the pairs' passes by kind (also counted in the run's ep timing).
  OverlapTiming& timing(Kind k) { return timing_[k]; }
  const OverlapTiming& timing(Kind k) const { return timing_[k]; }

 private:
  static void entry(unsigned hi, unsigned lo);
  void body(int i);
  void switch_away(StepTransfers* parked);

  size_t stack_bytes_;
  char* stacks_ = nullptr;  // two stacks, each below a guard page
  ucontext_t main_{}, fiber_[2]{};
  const std::function<void()>* fn_[2] = {nullptr, nullptr};
  bool done_[2] = {false, false}, running_ = false;
  int current_ = 0;
  StepTransfers* parked_[2] = {nullptr, nullptr};
  std::exception_ptr error_;
  int64_t pairs_ = 0, switches_ = 0, crossed_ = 0;
  OverlapTiming timing_[kinds];
};

}  // namespace tessera
