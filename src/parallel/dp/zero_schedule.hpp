// What ZeRO does with each part over a step, as a pure function of the passes the model runs:
// when a part's parameters are gathered (and the next pass's prefetched), released, when its
// gradients are staged, when its reduce-scatter starts and when a finished one is retired.
// Zero (zero.hpp) executes these actions with buffers and collectives; tessera-plan replays
// the same actions with sizes (perf/tessera_memory.cpp), which is why it predicts ZeRO's
// communication buffers to the byte. Change the decisions here and both follow.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "model/parts.hpp"

namespace tessera {

struct ZeroAction {
  enum Kind {
    build,    // stage 3 initialisation: the whole part is built in a buffer, then shards kept
    fetch,    // start gathering a part's parameters into a buffer (stage 3)
    wait,     // the part's gather must be complete: its pass is about to read it
    release,  // give back a gathered part's buffer
    stage,    // a buffer to collect the part's gradients (stages 2-3)
    reduce,   // start reduce-scattering the part's gradients (stage 2-3: from the staged
              // buffer into a piece buffer; stage 1: from the full gradient buffer)
    retire,   // complete the oldest reduction; give back its staged and piece buffers
  } kind;
  int part = 0;
};

class ZeroSchedule {
 public:
  // size[q]: part q's elements on this rank (0: held by another pipeline stage). inflight
  // (stages 2-3): reductions in flight at most; one more first retires the oldest, so which
  // buffers exist never depends on how fast MPI progresses.
  ZeroSchedule(int stage, PartAccess access, std::vector<int64_t> size, int inflight);

  // Keep a part's gradients whole until finish() (a pipeline's tied token table).
  void defer(int part) { deferred_[std::size_t(part)] = true; }
  // Stage 3: the order in which initialisation builds the parts.
  std::vector<ZeroAction> initialize() const;
  // Start of a step.
  void begin_step();
  // Around a pass over `part`. armed: this is the last micro-batch's backward and overlap is
  // on (stage 1 reduces during it only).
  std::vector<ZeroAction> begin(int part, Pass pass, bool training);
  std::vector<ZeroAction> end(int part, Pass pass, bool training, bool armed);
  // After the step's last backward: start what was not reduced (deferred parts, stage 1
  // without overlap, gradients written without a backward pass here), retire every
  // reduction, release every gathered part.
  std::vector<ZeroAction> finish();

 private:
  void need(int part, std::vector<ZeroAction>& out);
  void prefetch(int part, std::vector<ZeroAction>& out);
  void drop(int part, std::vector<ZeroAction>& out);
  void reduce(int part, std::vector<ZeroAction>& out);

  int stage_;
  PartAccess access_;
  std::vector<int64_t> size_;
  int inflight_;
  std::vector<bool> deferred_, gathered_, staged_, reducing_;
  std::deque<int> pending_;  // parts whose reductions are in flight, oldest first
};

}  // namespace tessera
