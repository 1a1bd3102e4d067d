#include "mpi_environment.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>

namespace tessera::test {

void require_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    ADD_FAILURE() << "MPI_Init_thread failed";
    std::abort();
  }
}

namespace {

class MpiEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Finalize();
  }
};

// gtest owns the environment once it is added.
[[maybe_unused]] ::testing::Environment* const kMpiEnvironment =
    ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

}  // namespace
}  // namespace tessera::test
