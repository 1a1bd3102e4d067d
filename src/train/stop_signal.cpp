#include "train/stop_signal.hpp"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/error.hpp"
#include "core/fault_inject.hpp"

namespace tessera {
namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free flag");

extern "C" void on_stop_signal(int sig) {
  // A second Ctrl-C means "now": SIGINT's default action ends the process at once (a run
  // that hangs, or a user who does not want the checkpoint).
  if (sig == SIGINT && g_signal.load(std::memory_order_relaxed) != 0) {
    signal(SIGINT, SIG_DFL);
    kill(getpid(), SIGINT);
    return;
  }
  g_signal.store(sig, std::memory_order_relaxed);
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a system call the signal lands in carries on
  for (int sig : {SIGUSR1, SIGTERM, SIGINT})
    TESSERA_REQUIRE(sigaction(sig, &sa, nullptr) == 0, "cannot install the handler for ",
                    stop_signal_name(sig));
  // The signals never interrupt the computing threads: this thread blocks them (and the
  // OpenMP threads it starts later inherit that), and a helper thread that only waits takes
  // them instead. oneDNN's jit_avx512_common_gemm_f32 points the stack pointer into the heap
  // while it runs, so a signal delivered to that thread writes its frame into the heap
  // (glibc: "corrupted size vs. prev_size"; uxlfoundation/oneDNN issue 4845).
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGUSR1);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  std::thread([stop] {
    pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
    for (;;) pause();
  }).detach();
  TESSERA_REQUIRE(pthread_sigmask(SIG_BLOCK, &stop, nullptr) == 0,
                  "cannot block SIGUSR1/SIGTERM/SIGINT in the computing threads");
}

void inject_stop_signal(const char* moment, int world_rank) {
  // TESSERA_FAULT_INJECT=sigterm-MOMENT-rank-R: rank R sends itself SIGTERM at MOMENT
  // (before-step-1, checkpoint-write). kill(), not raise(): the signal must go to the
  // process, whose helper thread takes it; this thread blocks it.
  const std::string want =
      std::string("sigterm-") + moment + "-rank-" + std::to_string(world_rank);
  if (!fault_injected(want)) return;
  kill(getpid(), SIGTERM);
  // Wait until the helper thread has recorded it, so the moment is exact.
  while (stop_signal_received() == 0) std::this_thread::yield();
}

int stop_signal_received() {
  return g_signal.load(std::memory_order_relaxed);
}

int stop_signal_agreed(Communicator& world) {
  int64_t sig = stop_signal_received();
  world.all_reduce(&sig, 1, ReduceOp::max);
  return int(sig);
}

std::string stop_signal_name(int sig) {
  if (sig == SIGUSR1) return "SIGUSR1";
  if (sig == SIGTERM) return "SIGTERM";
  if (sig == SIGINT) return "SIGINT";
  return "signal " + std::to_string(sig);
}

std::string completion_marker_path(const std::string& output_dir) {
  return (std::filesystem::path(output_dir) / "COMPLETED").string();
}

void write_completion_marker(const std::string& output_dir, int64_t step) {
  std::error_code ec;
  std::filesystem::create_directories(output_dir, ec);
  const std::string path = completion_marker_path(output_dir);
  std::ofstream out(path);
  out << "step " << step << "\n";
  TESSERA_REQUIRE_LOCAL(bool(out), "cannot write the completion marker '", path, "' (output.dir)");
}

}  // namespace tessera
