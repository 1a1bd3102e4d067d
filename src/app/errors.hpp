// How an error reaches the user: once, from rank 0, with a non-zero exit and no hang.
#pragma once

#include <mpi.h>

#include <cstdio>
#include <exception>

#include "core/error.hpp"

namespace tessera {

// Runs body on every rank; returns the process exit status. Finalizes MPI.
// A collective Error (every rank raised it) is printed by rank 0 and every rank exits 1.
// Anything else happened on some ranks only: the raising rank prints it and aborts the job,
// which stops the others instead of leaving them waiting in a collective.
template <class Body>
int run_reporting_errors(const char* program, Body&& body) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  try {
    body();
  } catch (const Error& e) {
    if (e.collective()) {
      if (rank == 0) std::fprintf(stderr, "%s: error: %s\n", program, e.what());
      std::fflush(stderr);
      MPI_Finalize();
      return 1;
    }
    std::fprintf(stderr, "%s: error on rank %d: %s\n", program, rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error on rank %d: %s\n", program, rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return 0;
}

}  // namespace tessera
