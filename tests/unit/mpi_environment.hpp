// MPI for unit tests. The unit executable runs without mpiexec, as a singleton MPI process.
// MPI is initialised on first use, not at start-up: a singleton MPI_Init costs ~0.5-1 s, and
// ctest runs every test case as its own process, so initialising it eagerly would cost that
// for every one of them. A test that needs MPI (a Communicator on MPI_COMM_SELF, say) calls
// require_mpi() first; a gtest global Environment calls MPI_Finalize at the end of the run.
#pragma once

namespace tessera::test {

// Initialises MPI (MPI_THREAD_FUNNELED) unless it already is. Idempotent.
void require_mpi();

}  // namespace tessera::test
