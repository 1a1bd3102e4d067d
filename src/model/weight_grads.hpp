// The weight-gradient GEMMs of a split backward (pipeline schedules zb-h1, zb-v, dualpipev;
// doc/pipeline.md, "Split backward"). During a backward_input pass (B) every Linear queues its
// dW += dy^T x here instead of computing it, with copies of its two operands in the compute
// dtype; the backward_weight pass (W) of the same micro-batch and chunk runs them, part by
// part, in the order B queued them. The copies are what W reads: W needs no saved activation
// and no rebuilt one (with recompute, B rebuilds as a fused backward would and W rebuilds
// nothing), and no parameter value (ZeRO-3 gathers nothing for W).
//
// Sets. Each B fills one set, which stays until its W: a B takes the lowest free set, so a
// stage holds at most as many sets as B's waiting for their W. A set's buffers are kept for the
// next B that takes it and only grow (steady-state steps allocate nothing), charged to
// activations.
//
// Regions. A mixture of experts' routed experts take their rows of the expert side, and how
// many each gets depends on the routing. Their operands are copied into regions of the set
// instead (region(), then into() before each expert's GEMM): one per operand and MoE block,
// each sized for the worst routing (every row of the expert side, as model/moe.cpp sizes that
// side), so that what a set holds does not depend on the routing and tessera-plan predicts it
// (perf/tessera_memory.cpp). A set's regions, by position, grow like its copies.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.hpp"

namespace tessera {

class WeightGrads {
 public:
  // Start queuing: takes the lowest free set and returns it (for run and release).
  int open();
  void close() { open_ = -1; }
  bool queuing() const { return open_ >= 0; }
  // The part whose backward is running (Transformer::around).
  void set_part(int part) { part_ = part; }
  // Queue grad[out, in] += dy[n, out]^T x[n, in] (f32 grad; dy and x of one dtype). grad is
  // read when the GEMM runs: ZeRO-2/3 may stage a part's gradients in a new buffer between B
  // and W (Param::grad is pointed there), so it must outlive the set (a Param's member).
  void add(Allocator& alloc, const Tensor& dy, const Tensor& x, const Tensor* grad, int64_t n,
           int64_t out, int64_t in);
  // The open set's next region: `numel` elements of `dtype` (grown to it when smaller).
  Tensor region(Allocator& alloc, int64_t numel, DType dtype);
  // The next add() copies dy and x into these views (rows of regions) and queues its GEMM on
  // them, instead of copies of its own.
  void into(const Tensor& dy, const Tensor& x) { into_dy_ = dy, into_x_ = x; }
  // Runs set `set`'s GEMMs of `part`, in the order they were queued.
  void run(int set, int part);
  // Frees the set; every GEMM queued in it must have run.
  void release(int set);

  int sets() const { return int(sets_.size()); }  // the most a stage held at once
  int64_t bytes() const;                          // of the copies and regions, in every set

 private:
  struct Gemm {
    int part = -1;
    bool done = true;
    const Tensor* grad = nullptr;
    int64_t n = 0, out = 0, in = 0;
    Buffer dy, x;
    Tensor dy_in, x_in;  // views into regions (in_region)
  };
  struct Set {
    std::vector<Gemm> gemms, in_regions;  // the GEMMs on copies of their own; on regions
    std::vector<Buffer> regions;
    size_t used = 0, used_in_regions = 0, used_regions = 0;
    bool busy = false;
  };
  std::vector<Set> sets_;
  int open_ = -1, part_ = -1;
  Tensor into_dy_, into_x_;
};

}  // namespace tessera
