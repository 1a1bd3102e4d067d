#include "comm/nccl_backend.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <stdexcept>

#include "comm/mpi_env.hpp"
#include "core/error.hpp"

namespace tessera {
namespace {

void check_nccl(ncclResult_t r, ncclComm_t comm, const char* what, const char* file, int line) {
  if (r == ncclSuccess) return;
  const char* detail = comm ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  throw Error(cat("NCCL error in ", what, ": ", ncclGetErrorString(r),
                  detail && *detail ? cat(" (", detail, ")") : std::string()),
              file, line, false);
}

void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  throw Error(cat("CUDA error in ", what, ": ", cudaGetErrorString(e)), file, line, false);
}

#define NCCL_CHECK(expr) check_nccl((expr), comm_, #expr, __FILE__, __LINE__)
#define CUDA_CHECK(expr) check_cuda((expr), #expr, __FILE__, __LINE__)

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

size_t count_of(int64_t n, const char* what) {
  if (n < 0) throw std::logic_error(std::string(what) + ": negative count " + std::to_string(n));
  return size_t(n);
}

}  // namespace

NcclCommunicator::NcclCommunicator(Communicator& mpi, CUstream_st* stream)
    : stream_(stream), name_(mpi.name() + "/nccl"), rank_(mpi.rank()), size_(mpi.size()) {
  ncclUniqueId id{};
  if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  mpi.broadcast(&id, int64_t(sizeof id), 0);
  ncclComm_t comm = nullptr;
  NCCL_CHECK(ncclCommInitRank(&comm, size_, id, rank_));
  comm_ = comm;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_) {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
  }
}

void NcclCommunicator::count(int64_t bytes, double t0) {
  stats_.calls += 1;
  stats_.bytes += bytes;
  stats_.seconds += mpi::wtime() - t0;
}

void NcclCommunicator::check_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= size_)
    throw std::logic_error(std::string(what) + ": rank " + std::to_string(peer) +
                           " outside a group of " + std::to_string(size_));
}

void NcclCommunicator::all_reduce(float* buf, int64_t n, ReduceOp op) {
  const size_t cnt = count_of(n, "nccl all_reduce");
  if (size_ == 1 || cnt == 0) return;
  const double t0 = mpi::wtime();
  NCCL_CHECK(ncclAllReduce(buf, buf, cnt, ncclFloat32, nccl_op(op), comm_, stream_));
  count(n * 4, t0);
}

void NcclCommunicator::reduce_scatter(const float* in, float* out, int64_t n) {
  const size_t cnt = count_of(n, "nccl reduce_scatter");
  if (cnt == 0) return;
  if (size_ == 1) {
    if (in != out) CUDA_CHECK(cudaMemcpyAsync(out, in, cnt * 4, cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  const double t0 = mpi::wtime();
  NCCL_CHECK(ncclReduceScatter(in, out, cnt, ncclFloat32, ncclSum, comm_, stream_));
  count(n * size_ * 4, t0);
}

void NcclCommunicator::all_gather(const float* in, float* out, int64_t n) {
  const size_t cnt = count_of(n, "nccl all_gather");
  if (cnt == 0) return;
  if (size_ == 1) {
    if (in != out) CUDA_CHECK(cudaMemcpyAsync(out, in, cnt * 4, cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  const double t0 = mpi::wtime();
  NCCL_CHECK(ncclAllGather(in, out, cnt, ncclFloat32, comm_, stream_));
  count(n * 4, t0);
}

void NcclCommunicator::broadcast(float* buf, int64_t n, int root) {
  const size_t cnt = count_of(n, "nccl broadcast");
  check_peer(root, "nccl broadcast root");
  if (size_ == 1 || cnt == 0) return;
  const double t0 = mpi::wtime();
  NCCL_CHECK(ncclBroadcast(buf, buf, cnt, ncclFloat32, root, comm_, stream_));
  count(n * 4, t0);
}

void NcclCommunicator::send(const float* buf, int64_t n, int peer) {
  const size_t cnt = count_of(n, "nccl send");
  check_peer(peer, "nccl send");
  const double t0 = mpi::wtime();
  NCCL_CHECK(ncclSend(buf, cnt, ncclFloat32, peer, comm_, stream_));
  count(n * 4, t0);
}

void NcclCommunicator::recv(float* buf, int64_t n, int peer) {
  const size_t cnt = count_of(n, "nccl recv");
  check_peer(peer, "nccl recv");
  const double t0 = mpi::wtime();
  NCCL_CHECK(ncclRecv(buf, cnt, ncclFloat32, peer, comm_, stream_));
  count(0, t0);
}

void NcclCommunicator::group_start() {
  NCCL_CHECK(ncclGroupStart());
}

void NcclCommunicator::group_end() {
  NCCL_CHECK(ncclGroupEnd());
}

void NcclCommunicator::synchronize() {
  const double t0 = mpi::wtime();
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  stats_.seconds += mpi::wtime() - t0;
}

}  // namespace tessera
