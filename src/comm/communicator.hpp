// One Communicator per process group. Every collective tessera issues goes through here and
// is counted (calls, bytes, seconds) so the closing summary can show traffic per group.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

namespace tessera {

struct TrafficStats {
  int64_t calls = 0;
  int64_t bytes = 0;  // payload bytes this rank contributed
  double seconds = 0;
};

enum class ReduceOp { sum, max, min };

// A non-blocking operation in flight. MPI progresses it only inside MPI calls, so callers
// poll test() while they compute and wait() when they need the result.
class Request {
 public:
  Request() = default;
  Request(MPI_Request r, TrafficStats* stats) : req_(r), stats_(stats) {}
  bool test();  // true when complete
  void wait();
  bool done() const { return req_ == MPI_REQUEST_NULL; }

 private:
  MPI_Request req_ = MPI_REQUEST_NULL;
  TrafficStats* stats_ = nullptr;
};

class Communicator {
 public:
  Communicator() = default;
  // Takes ownership of comm (freed on destruction) unless it is MPI_COMM_WORLD/SELF.
  Communicator(MPI_Comm comm, std::string name);
  ~Communicator();
  Communicator(Communicator&& o) noexcept;
  Communicator& operator=(Communicator&& o) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  const TrafficStats& stats() const { return stats_; }
  MPI_Comm raw() const { return comm_; }

  void all_reduce(float* buf, int64_t n, ReduceOp op = ReduceOp::sum);
  void all_reduce(double* buf, int64_t n, ReduceOp op = ReduceOp::sum);
  void all_reduce(int64_t* buf, int64_t n, ReduceOp op = ReduceOp::sum);
  // Starts a sum all-reduce in place (n < 2^31 elements).
  Request all_reduce_async(float* buf, int64_t n);
  void broadcast(void* buf, int64_t bytes, int root);
  void barrier();

 private:
  void reduce_impl(void* buf, int64_t n, MPI_Datatype type, int64_t elem_bytes, ReduceOp op);

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  int rank_ = 0, size_ = 1;
  TrafficStats stats_;
};

}  // namespace tessera
