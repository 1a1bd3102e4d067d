// Stopping a run early on request of the batch system: Slurm sends SIGUSR1 before the time
// limit (sbatch --signal=USR1@SECONDS) and SIGTERM on scancel, scontrol requeue or preemption.
// A Ctrl-C (SIGINT) reaching the ranks (a run without mpirun; mpirun itself turns it into
// SIGTERM for its ranks) starts the same stop, and a second SIGINT ends the process at once.
// A handler only sets a flag, on a helper thread (the computing threads block both signals);
// after each step the ranks agree whether any of them saw one, and
// if so every rank writes the checkpoint and the run exits with kExitStopped, so a job script
// can tell "stopped, resume me" from success (0) and failure (anything else). A run that has
// done its last step writes OUTPUT_DIR/COMPLETED, so a requeued finished job does nothing.
#pragma once

#include <cstdint>
#include <string>

#include "comm/communicator.hpp"

namespace tessera {

// Exit status of a run stopped by SIGUSR1/SIGTERM after writing its checkpoint (EX_TEMPFAIL:
// "try again later").
constexpr int kExitStopped = 75;

// Installs the SIGUSR1, SIGTERM and SIGINT handlers (process-wide), blocks them in the calling
// thread and starts the helper thread that takes them. Call once, from the main thread,
// before MPI starts and before any OpenMP parallel region (the threads they start inherit
// the block).
void install_stop_handlers();
// The signal this process received (SIGUSR1, SIGTERM or SIGINT), 0 when none.
int stop_signal_received();
// Collective over world: the largest signal number any rank received, 0 when none.
int stop_signal_agreed(Communicator& world);
// Test hook (doc/testing.md): with TESSERA_FAULT_INJECT=sigterm-MOMENT-rank-R, world rank R
// sends itself SIGTERM when it reaches MOMENT (the caller's name for the point: before-step-1,
// checkpoint-write) and returns once the signal is recorded. Does nothing otherwise.
void inject_stop_signal(const char* moment, int world_rank);
// A readable name: "SIGUSR1", "SIGTERM", "SIGINT".
std::string stop_signal_name(int sig);

// OUTPUT_DIR/COMPLETED: one line "step N". Rank 0 alone calls it (a failure is local).
std::string completion_marker_path(const std::string& output_dir);
void write_completion_marker(const std::string& output_dir, int64_t step);

}  // namespace tessera
