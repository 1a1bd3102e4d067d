// One clock for every rank's trace: each rank's offset to rank 0's clock, measured by
// ping-pong (Cristian's method). Rank 0 sends to rank r at t0 and gets back r's reading c at
// t1 (both on rank 0's clock), so the offset o (c + o = rank 0's time) lies in
// [t0 - c, t1 - c]. The rounds' intervals are intersected; when the intersection holds 0 the
// clocks are taken to be the same one (ranks on one node share the monotonic clock), else
// its midpoint is used: off by at most half the shortest round trip.
#pragma once

#include "comm/communicator.hpp"

namespace tessera {

struct ClockAgreement {
  double offset = 0;  // add to this rank's clock to get rank 0's
  double origin = 0;  // rank 0's clock when the agreement ended, the same on every rank
};

// Collective over comm; clock returns seconds. Setup only: the messages are not counted.
ClockAgreement agree_clock(Communicator& comm, double (*clock)(), int rounds = 10);

}  // namespace tessera
