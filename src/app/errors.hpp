// How an error reaches the user: once, from rank 0, with a non-zero exit and no hang.
#pragma once

#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "comm/mpi_env.hpp"
#include "core/error.hpp"

namespace tessera {

// A message as one line a terminal shows as it is: control bytes (a newline too) as \xNN,
// and at most 2000 characters (a 1 MB line from a garbage file is cut, saying how much).
inline std::string one_line(const std::string& what) {
  constexpr size_t kMax = 2000;
  std::string out;
  for (size_t i = 0; i < what.size(); ++i) {
    if (out.size() >= kMax) return out + "... (" + std::to_string(what.size() - i) + " more bytes)";
    const unsigned char c = static_cast<unsigned char>(what[i]);
    if (c < 0x20 || c == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += char(c);
    }
  }
  return out;
}

// Runs body on every rank; returns the process exit status. Finalizes MPI.
// A collective Error (every rank raised it) is printed by rank 0 and every rank exits 1, as is
// any Error of a run on one rank (there is no other rank to stop). Anything else happened on
// some ranks only: the raising rank prints it and aborts the job, which stops the others
// instead of leaving them waiting in a collective.
template <class Body>
int run_reporting_errors(const char* program, Body&& body) {
  const int rank = mpi::world_rank();
  try {
    body();
  } catch (const Error& e) {
    if (e.collective() || mpi::world_size() == 1) {
      if (rank == 0) std::fprintf(stderr, "%s: error: %s\n", program, one_line(e.what()).c_str());
      std::fflush(stderr);
      mpi::finalize();
      return 1;
    }
    std::fprintf(stderr, "%s: error on rank %d: %s\n", program, rank, one_line(e.what()).c_str());
    std::fflush(stderr);
    mpi::abort(1);
  } catch (const std::bad_alloc&) {
    // An allocation outside tessera's Allocator (which names its bytes): still out of memory,
    // not an internal error.
    std::fprintf(stderr,
                 "%s: error on rank %d: out of memory (an allocation failed: "
                 "std::bad_alloc); use a smaller model or train.micro_batch, or spread the "
                 "model over more ranks\n",
                 program, rank);
    std::fflush(stderr);
    mpi::abort(1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error on rank %d: %s\n", program, rank,
                 one_line(e.what()).c_str());
    std::fflush(stderr);
    mpi::abort(2);
  }
  mpi::finalize();
  return 0;
}

}  // namespace tessera
