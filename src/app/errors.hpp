// How an error reaches the user: once, from rank 0, with a non-zero exit and no hang.
#pragma once

#include <cstdio>
#include <exception>

#include "comm/mpi_env.hpp"
#include "core/error.hpp"

namespace tessera {

// Runs body on every rank; returns the process exit status. Finalizes MPI.
// A collective Error (every rank raised it) is printed by rank 0 and every rank exits 1.
// Anything else happened on some ranks only: the raising rank prints it and aborts the job,
// which stops the others instead of leaving them waiting in a collective.
template <class Body>
int run_reporting_errors(const char* program, Body&& body) {
  const int rank = mpi::world_rank();
  try {
    body();
  } catch (const Error& e) {
    if (e.collective()) {
      if (rank == 0) std::fprintf(stderr, "%s: error: %s\n", program, e.what());
      std::fflush(stderr);
      mpi::finalize();
      return 1;
    }
    std::fprintf(stderr, "%s: error on rank %d: %s\n", program, rank, e.what());
    std::fflush(stderr);
    mpi::abort(1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error on rank %d: %s\n", program, rank, e.what());
    std::fflush(stderr);
    mpi::abort(2);
  }
  mpi::finalize();
  return 0;
}

}  // namespace tessera
