// What every layer's forward and backward receive: the allocator, the parallel groups, the
// activation slot of the micro-batch in flight, and a shared scratch space for temporaries
// that do not outlive one call.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "comm/process_grid.hpp"
#include "model/parts.hpp"
#include "model/scratch.hpp"
#include "tensor/tensor.hpp"

namespace tessera {

class WeightGrads;
class StepTransfers;
class PassPair;

// Told before and after each part of the model (embedding, block, head; ParamStore::parts())
// runs a forward or backward pass, so data parallelism can reduce a part's gradients as soon
// as they are final, and ZeRO-2/3 gather its parameters and stage its gradients just in
// time. The model says what each pass reads and writes (PartAccess, model/parts.hpp).
class PartHooks {
 public:
  virtual ~PartHooks() = default;
  virtual void begin(int part, Pass pass, bool training) = 0;
  virtual void end(int part, Pass pass, bool training) = 0;
};

// Document masking's per-row inputs of the micro-batch in flight (doc/data.md, "Document
// masks"); all empty without data.document_mask. start: the global position where each row's
// document starts, i32 [rows] in this rank's layout (ContextParallel::segments), what the
// attention kernels take as doc_start; start_seq: the same for whole sequences, [B, seq_len]
// (Ulysses attends over them); position: each row's position in its document (RoPE, gpt2's
// position table), with position_host its host copy (the table's rows are chosen on the host).
struct DocumentRows {
  Tensor start, start_seq, position;
  const int32_t* position_host = nullptr;
  bool on() const { return start.data != nullptr; }
};

struct StepContext {
  Allocator& alloc;
  ParallelContext& par;
  Scratch& scratch;
  int slot = 0;            // activation slot of this micro-batch
  int64_t batch = 0;       // sequences in this micro-batch
  bool training = true;    // false: forward only, nothing saved for backward, no gradients
  float loss_scale = 1.0f; // d(total loss)/d(summed token losses): 1 / tokens per global batch
  PartHooks* hooks = nullptr;  // told around each part's passes (data parallelism)
  // Sum the gradients that are partial over tensor-parallel ranks (sequence-parallel norms)
  // at the end of each part's backward: on the micro-batch whose gradients are reduced next.
  bool reduce_partial_grads = true;
  // Set during a split backward's backward_input pass: Linear queues its weight-gradient GEMMs
  // there instead of running them (model/weight_grads.hpp).
  WeightGrads* weight_grads = nullptr;
  // Transfers in flight behind the compute now running (model/transfers.hpp): every GEMM
  // (Linear) polls them, so that MPI progresses them. Null: none.
  StepTransfers* in_flight = nullptr;
  // Set while this pass runs interleaved with another micro-batch's (DualPipe's pairing,
  // model/pass_pair.hpp): it gives way at its experts' all-to-alls, and polls the other's.
  PassPair* pair = nullptr;
  DocumentRows docs = {};  // data.document_mask: set by the trainer per micro-batch

  // Lets MPI progress the transfers behind the compute now running: this pass's (in_flight)
  // and, in a pair, those the other pass left in flight. Every GEMM calls it.
  void poll_transfers();
  // This context over another scratch space: for a second pass running beside this one (a
  // pair, model/pass_pair.hpp), whose scratch views must survive the other's requests.
  StepContext over(Scratch& other) const;
};

// The rows of t, an activation or gradient that must be [rows, cols]: layers take their sizes
// from their inputs' shapes, so a tensor of another shape raises std::logic_error naming
// `what` instead of being read with the wrong sizes.
int64_t rows_of(const Tensor& t, int64_t cols, const char* what);

// Per-slot saved state of one layer: slot i is created on first use and then reused, so the
// number of slots follows the schedule (1 for the serial path, up to the pipeline depth). A
// slot stays where it is when later ones are created (a deque): a pass of a pair holds its
// slot's state across the other pass's first use of a new slot (model/pass_pair.hpp).
template <class Saved>
class Slots {
 public:
  Saved& at(int slot) {
    if (slot >= int(slots_.size())) slots_.resize(size_t(slot) + 1);
    return slots_[size_t(slot)];
  }

 private:
  std::deque<Saved> slots_;
};

}  // namespace tessera
