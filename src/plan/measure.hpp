// Measures the machine tessera-plan runs on (every rank of MPI_COMM_WORLD at once, as a run
// would load it) and prints a cluster file: fp32 GEMM rate and how it falls with a thin
// dimension, streaming memory bandwidth, all-reduce bus bandwidth and latency across the
// ranks. Run as `mpiexec -n R tessera-plan --measure-cluster > inputs/clusters/NAME.in`.
#pragma once

namespace tessera {

void measure_cluster();

}  // namespace tessera
