#include "comm/clock_sync.hpp"

#include <mpi.h>

#include <algorithm>
#include <limits>

namespace tessera {

ClockAgreement agree_clock(Communicator& comm, double (*clock)(), int rounds) {
  MPI_Comm c = comm.raw();
  constexpr int kTag = 7301;
  ClockAgreement a;
  if (comm.rank() == 0) {
    for (int r = 1; r < comm.size(); ++r) {
      double lo = -std::numeric_limits<double>::infinity();
      double hi = std::numeric_limits<double>::infinity();
      for (int k = 0; k < rounds; ++k) {
        double reading = 0;
        const double t0 = clock();
        MPI_Send(&t0, 1, MPI_DOUBLE, r, kTag, c);
        MPI_Recv(&reading, 1, MPI_DOUBLE, r, kTag, c, MPI_STATUS_IGNORE);
        const double t1 = clock();
        lo = std::max(lo, t0 - reading);
        hi = std::min(hi, t1 - reading);
      }
      const double offset = lo <= 0 && 0 <= hi ? 0.0 : 0.5 * (lo + hi);
      MPI_Send(&offset, 1, MPI_DOUBLE, r, kTag, c);
    }
  } else {
    for (int k = 0; k < rounds; ++k) {
      double ping = 0;
      MPI_Recv(&ping, 1, MPI_DOUBLE, 0, kTag, c, MPI_STATUS_IGNORE);
      const double reading = clock();
      MPI_Send(&reading, 1, MPI_DOUBLE, 0, kTag, c);
    }
    MPI_Recv(&a.offset, 1, MPI_DOUBLE, 0, kTag, c, MPI_STATUS_IGNORE);
  }
  if (comm.rank() == 0) a.origin = clock();
  MPI_Bcast(&a.origin, 1, MPI_DOUBLE, 0, c);
  return a;
}

}  // namespace tessera
