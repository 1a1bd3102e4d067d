#include "comm/nccl_backend.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
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

ncclDataType_t nccl_type(DType t, bool sum) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::f64: return ncclFloat64;
    default: break;
  }
  if (!sum && dtype_size(t) == 4) return ncclFloat32;  // bits moved, no arithmetic
  throw std::logic_error(std::string("NCCL: cannot ") + (sum ? "sum " : "move ") + dtype_name(t));
}

// A CUDA event that lives as long as the completion function holding it.
std::shared_ptr<CUevent_st> make_event() {
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags",
             __FILE__, __LINE__);
  return std::shared_ptr<CUevent_st>(e, [](cudaEvent_t x) { cudaEventDestroy(x); });
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

std::function<bool(bool)> NcclCommunicator::queued(CUstream_st* after,
                                                   const std::function<void()>& op) {
  if (after) {  // the operands were written by work queued on the compute stream
    std::shared_ptr<CUevent_st> ready = make_event();
    CUDA_CHECK(cudaEventRecord(ready.get(), after));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready.get(), 0));
  }
  op();
  std::shared_ptr<CUevent_st> done = make_event();
  CUDA_CHECK(cudaEventRecord(done.get(), stream_));
  return [done, after](bool order) {
    if (!order) {
      const cudaError_t e = cudaEventQuery(done.get());
      if (e == cudaErrorNotReady) return false;
      check_cuda(e, "cudaEventQuery", __FILE__, __LINE__);
      return true;
    }
    if (after) check_cuda(cudaStreamWaitEvent(after, done.get(), 0), "cudaStreamWaitEvent", __FILE__, __LINE__);
    else check_cuda(cudaEventSynchronize(done.get()), "cudaEventSynchronize", __FILE__, __LINE__);
    return true;
  };
}

// A group of one is a copy, which NCCL makes itself; an empty tensor queues nothing.
std::function<bool(bool)> NcclCommunicator::all_reduce(const Tensor& buf, CUstream_st* after,
                                                       ReduceOp op) {
  const ncclDataType_t t = nccl_type(buf.dtype, true);
  const size_t cnt = count_of(buf.numel(), "nccl all_reduce");
  return queued(after, [&] {
    if (cnt > 0) NCCL_CHECK(ncclAllReduce(buf.data, buf.data, cnt, t, nccl_op(op), comm_, stream_));
  });
}

std::function<bool(bool)> NcclCommunicator::reduce_scatter(const Tensor& in, const Tensor& out,
                                                           CUstream_st* after) {
  const ncclDataType_t t = nccl_type(in.dtype, true);
  const size_t cnt = count_of(out.numel(), "nccl reduce_scatter");
  return queued(after, [&] {
    if (cnt > 0) NCCL_CHECK(ncclReduceScatter(in.data, out.data, cnt, t, ncclSum, comm_, stream_));
  });
}

std::function<bool(bool)> NcclCommunicator::all_gather(const Tensor& in, const Tensor& out,
                                                       CUstream_st* after) {
  const ncclDataType_t t = nccl_type(in.dtype, false);
  const size_t cnt = count_of(in.numel(), "nccl all_gather");
  return queued(after, [&] {
    if (cnt > 0) NCCL_CHECK(ncclAllGather(in.data, out.data, cnt, t, comm_, stream_));
  });
}

// ---- Communicator's device collectives (declared in communicator.hpp) ----------------------

std::shared_ptr<NcclCommunicator> Communicator::make_nccl(void* comm_stream) {
  return std::make_shared<NcclCommunicator>(*this, static_cast<CUstream_st*>(comm_stream));
}

Request Communicator::device_collective(DeviceOp op, const Tensor& in, const Tensor& out,
                                        ReduceOp rop) {
  const double t0 = mpi::wtime();
  CUstream_st* after = static_cast<CUstream_st*>(link_->compute_stream);
  std::function<bool(bool)> done =
      op == DeviceOp::all_reduce       ? nccl_->all_reduce(in, after, rop)
      : op == DeviceOp::reduce_scatter ? nccl_->reduce_scatter(in, out, after)
                                       : nccl_->all_gather(in, out, after);
  static const char* names[] = {"all_reduce_async", "reduce_scatter_async", "all_gather_async"};
  // Bytes as the MPI forms count them: the buffer, the whole input, this rank's block.
  count(in.numel() * int64_t(dtype_size(in.dtype)), t0, names[int(op)]);
  return Request(std::move(done), &stats_);
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
