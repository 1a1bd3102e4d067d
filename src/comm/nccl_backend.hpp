// Collectives on device buffers through NCCL, for one process group. Built when NCCL is found
// (CMake option TESSERA_NCCL). The NCCL communicator is bootstrapped over the group's MPI
// Communicator: rank 0 creates NCCL's unique id and the MPI group broadcasts it, so the NCCL
// ranks are the MPI ranks. Every operation is queued on the stream given at construction and
// returns without waiting; buffers are device pointers on the calling thread's current device,
// which must be selected (cudaSetDevice) before construction, one device per rank.
//
// Counting follows comm/communicator.hpp's table (calls, payload bytes this rank contributes;
// a size-1 group copies locally and counts nothing). `seconds` is the host time spent queueing
// operations plus the time spent in synchronize(): the device time of a collective shows up
// only when the caller waits for it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "comm/communicator.hpp"

struct CUstream_st;  // cudaStream_t
struct ncclComm;     // ncclComm_t

namespace tessera {

class NcclCommunicator {
 public:
  // Collective over mpi's ranks. Raises tessera::Error (local) on a NCCL or CUDA failure.
  NcclCommunicator(Communicator& mpi, CUstream_st* stream);
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  const TrafficStats& stats() const { return stats_; }
  CUstream_st* stream() const { return stream_; }

  // In place over buf[n].
  void all_reduce(float* buf, int64_t n, ReduceOp op = ReduceOp::sum);
  // in[n * size] -> out[n]: out = sum over ranks of block rank().
  void reduce_scatter(const float* in, float* out, int64_t n);
  // in[n] -> out[n * size]: block r of out is rank r's in (in place when in == out + rank() n).
  void all_gather(const float* in, float* out, int64_t n);
  void broadcast(float* buf, int64_t n, int root);
  // Point-to-point. A rank that both sends to and receives from a peer must bracket the pair
  // with group_start()/group_end(), or the two ranks wait for each other forever.
  void send(const float* buf, int64_t n, int peer);
  void recv(float* buf, int64_t n, int peer);
  void group_start();
  void group_end();

  // Waits for everything queued on the stream.
  void synchronize();

  // The typed, non-blocking forms behind Communicator's device collectives (its counters, not
  // these, count them). after: a cudaStream_t whose queued work the operation waits for (null:
  // none). The result polls (false: finished?) or orders (true: after waits for the
  // operation; the host blocks only when after is null).
  std::function<bool(bool)> all_reduce(const Tensor& buf, CUstream_st* after,
                                       ReduceOp op = ReduceOp::sum);
  std::function<bool(bool)> reduce_scatter(const Tensor& in, const Tensor& out, CUstream_st* after);
  std::function<bool(bool)> all_gather(const Tensor& in, const Tensor& out, CUstream_st* after);

 private:
  void count(int64_t bytes, double t0);
  // Queues op on the stream after `after`'s work so far; the completion function of the header.
  std::function<bool(bool)> queued(CUstream_st* after, const std::function<void()>& op);
  void check_peer(int peer, const char* what) const;

  ncclComm* comm_ = nullptr;
  CUstream_st* stream_ = nullptr;
  std::string name_;
  int rank_ = 0, size_ = 1;
  TrafficStats stats_;
};

}  // namespace tessera
