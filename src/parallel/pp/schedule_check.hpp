// Proving a pipeline schedule correct before it runs (doc/architecture.md, "Invariants"), and timing it
// with ideal costs. Works on any Schedule, not only make_schedule's: a hand-written or
// future schedule passes the same checks. doc/pipeline.md describes both.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/pp/schedule.hpp"

namespace tessera::pp {

// Every way the schedule breaks the guarantees listed in schedule.hpp (empty when it keeps
// them all; at most 20 problems, each naming the stage and op index):
//  1. shape: one list per stage; micro, chunk in range; peer = the stage the message goes
//     to or comes from (-1 for compute);
//  2. completeness: each (micro, local chunk) has exactly one forward and one backward on
//     every stage (split kinds: one forward, one backward_input, one backward_weight and no
//     backward), each needed send/recv exactly once, and no others (no recv_act into
//     model chunk 0, no send_act out of the last, no grad messages the other way, none
//     across the turn of a V);
//  3. local order: backward after its forward (split: forward, backward_input,
//     backward_weight); each recv immediately before the compute that consumes it, each
//     send immediately after the compute that produces it;
//  4. pairing: for each ordered pair of stages and direction, the k-th send and the k-th
//     recv move the same message (micro-batch, boundary);
//  5. deadlock-freedom and dependency order: all stages step through their lists with sends
//     buffered (never blocking) and recvs blocking until the matching send has run; every
//     stage must reach its end, and whenever a forward of (micro i, model chunk c) runs,
//     forward (i, c-1) has run; a backward (i, c) runs after backward (i, c+1) and after
//     forward (i, c) (split: the same for backward_input, and backward_weight (i, c) after
//     backward_input (i, c)).
// Checks 4 and 5 run only when 1-3 pass.
std::vector<std::string> check_schedule(const Schedule& sched);

// Whether every stage reaches its end when a send blocks until the peer reaches the matching
// recv (rendezvous, as a blocking MPI_Send of a large message or an ungrouped NCCL send).
// True for gpipe; false for 1f1b and interleaved with p >= 2, where neighbours each send
// before they receive: their executor must not block on a send (isend, or group a send
// with the recv that follows it).
bool completes_with_blocking_sends(const Schedule& sched);

// Whether every stage reaches its end (sends buffered, recvs blocking) when each pair of
// op_pairs runs grouped: its recvs first, then its two computes, then its sends, the order in
// which the executor runs an interleaved pair (doc/pipeline.md, "Paired overlap").
bool completes_with_grouped_pairs(const Schedule& sched);

struct Interval {
  std::int64_t begin, end;  // [begin, end)
  Op op;                    // a compute op
};

struct Simulation {
  std::int64_t makespan = 0;  // end of the last compute on any stage (all start at 0)
  std::int64_t compute = 0;   // compute time of one stage: m v (F + B + W)
  // Bubble = idle time / compute time of a stage = (makespan - compute) / compute, the
  // seeds' "idle to busy ratio" (p - 1) / m; exactly (p - 1) / m for gpipe and 1f1b and
  // (p - 1) / (v m) for interleaved, whatever the costs; bubble_formula gives every kind's.
  Ratio bubble;
  std::vector<std::vector<Interval>> timeline;  // per stage, in time order
  std::vector<int> peak_activations;            // per stage, in chunk activations
};

// Runs the schedule as check_schedule's step 5 does, each compute starting as soon as its
// stage reaches it and its recv (if any) has a send. Throws a tessera::Error if the
// schedule fails check_schedule.
Simulation simulate(const Schedule& sched, OpCosts costs = {});

// Peak (micro, local chunk) activations held per stage: forwards run whose backward (split:
// backward_weight, which still reads the saved inputs of the chunk's GEMMs) has not (list
// order alone; no simulation). Received-but-unused inputs are not counted.
std::vector<int> peak_activations(const Schedule& sched);
// Peak chunk passes per stage whose backward_input has run and backward_weight has not.
std::vector<int> peak_pending_weights(const Schedule& sched);

// An ASCII timeline of the simulation, one row per stage, one column per time unit:
// "F3" is micro-batch 3's forward, "B3 b3" its backward over two units (upper case marks the
// first unit), "." idle; split kinds: "B3" its backward_input, "W3" its backward_weight;
// with v >= 2 a letter names the local chunk (F3a: chunk 0, F3b: chunk 1). Micro-batches
// count from 0. Ends with the makespan and bubble.
std::string render_timeline(const Schedule& sched, OpCosts costs = {});

}  // namespace tessera::pp
