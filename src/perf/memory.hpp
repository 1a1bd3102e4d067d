// Model-state memory per rank under ZeRO: the formulas tessera reports beside what its
// allocator measured, and that the planner uses.
//
// Mixed precision (ZeRO paper, Rajbhandari et al. 2020, with K = 12 bytes of fp32 master
// weights + Adam moments per parameter): stage 0: 16Psi; 1: 4Psi + 12Psi/N;
// 2: 2Psi + 14Psi/N; 3: 16Psi/N.
// fp32 training as tessera runs it today (no separate master copy; the fp32 parameters are
// the master weights): params 4Psi, grads 4Psi, Adam 8Psi, of which
//   stage 0: 4Psi + 4Psi + 8Psi                = 16Psi
//   stage 1: 4Psi + (4Psi + 4Psi/N) + 8Psi/N     = 8Psi + 12Psi/N  (the full gradient buffer
//            plus the reduced shard the optimizer reads)
//   stage 2: 4Psi + 4Psi/N + 8Psi/N              = 4Psi + 12Psi/N
//   stage 3: 4Psi/N + 4Psi/N + 8Psi/N            = 16Psi/N
// Psi counts parameters as laid out (padded to shard evenly); N is the number of ranks one
// copy of the state is sharded over (the HSDP shard group, else the data-parallel degree).
#pragma once

namespace tessera {

enum class Precision { fp32, mixed };

struct ModelStateBytes {
  double params = 0, grads = 0, optimizer = 0;
  double total() const { return params + grads + optimizer; }
};

ModelStateBytes zero_model_state(int stage, double psi, double n, Precision precision);
// "16Psi/N", "8Psi + 12Psi/N", ... for stage and precision.
const char* zero_formula(int stage, Precision precision);

}  // namespace tessera
