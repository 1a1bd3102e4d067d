// The Communicator's typed forms (comm/communicator.hpp): collectives and point-to-point on
// Tensors, with device tensors through NCCL (nccl_backend.cpp) or host staging and MPI.
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace tessera {

int comm_int_count(int64_t n, const char* what);  // communicator.cpp

// ---- typed forms ----------------------------------------------------------------------------

namespace {

void same_space(const Tensor& a, const Tensor& b, const char* what) {
  if (a.space != b.space)
    throw std::logic_error(std::string(what) + ": a " + space_name(a.space) + " and a " +
                           space_name(b.space) + " buffer");
}

}  // namespace

#ifndef TESSERA_NCCL
std::shared_ptr<NcclCommunicator> Communicator::make_nccl(void*) {
  throw std::logic_error("device collectives need NCCL: this build has none (TESSERA_NCCL)");
}

Request Communicator::device_collective(DeviceOp, const Tensor&, const Tensor&, ReduceOp) {
  throw std::logic_error("device collectives need NCCL: this build has none (TESSERA_NCCL)");
}
#endif

void Communicator::attach_device(const DeviceLink& link) {
  if (!link.copy) throw std::logic_error("attach_device: the link has no staging copy");
  link_ = std::make_shared<const DeviceLink>(link);
  if (link.nccl && size_ > 1 && !nccl_) nccl_ = make_nccl(link.comm_stream);
}

bool Communicator::on_device(const Tensor& t, const char* what) const {
  if (t.space == Space::host) return false;
  if (!link_)
    throw std::logic_error(std::string(what) + ": a device tensor on group '" + name_ +
                           "', which has no device attached (attach_device)");
  return true;
}

void Communicator::local_copy(const Tensor& in, const Tensor& out) const {
  if (in.data != out.data) link_->copy(in, out, in.numel());
}

Request Communicator::all_reduce_async(const Tensor& buf) {
  if (on_device(buf, "all_reduce_async")) {
    if (size_ == 1) return {};
    if (nccl_) return device_collective(DeviceOp::all_reduce, buf, buf);
  }
  if (buf.dtype == DType::f32) return all_reduce_async(static_cast<float*>(buf.data), buf.numel());
  if (buf.dtype == DType::bf16)
    return all_reduce_async_bf16(static_cast<uint16_t*>(buf.data), buf.numel());
  throw std::logic_error(std::string("all_reduce_async: cannot sum ") + dtype_name(buf.dtype));
}

void Communicator::all_reduce(const Tensor& buf, ReduceOp op) {
  if (on_device(buf, "all_reduce")) {
    if (size_ == 1) return;
    if (nccl_) return device_collective(DeviceOp::all_reduce, buf, buf, op).wait();
  }
  if (buf.dtype == DType::f32) return all_reduce(static_cast<float*>(buf.data), buf.numel(), op);
  if (buf.dtype == DType::f64) return all_reduce(static_cast<double*>(buf.data), buf.numel(), op);
  if (buf.dtype == DType::bf16 && op == ReduceOp::sum) return all_reduce_async(buf).wait();
  throw std::logic_error(std::string("all_reduce: cannot reduce ") + dtype_name(buf.dtype) +
                         (op == ReduceOp::sum ? "" : " except by sum"));
}

namespace {

void check_scatter(const Tensor& in, const Tensor& out, int size, const char* what) {
  same_space(in, out, what);
  if (in.dtype != out.dtype || in.numel() != out.numel() * size)
    throw std::logic_error(std::string(what) + ": " + dtype_name(in.dtype) + " " +
                           in.shape.str() + " into " + dtype_name(out.dtype) + " " +
                           out.shape.str() + " over " + std::to_string(size) + " ranks");
}

void check_gather(const Tensor& in, const Tensor& out, int size, const char* what) {
  same_space(in, out, what);
  const size_t bytes = dtype_size(in.dtype);
  if (in.dtype != out.dtype || out.numel() != in.numel() * size || (bytes != 4 && bytes != 2))
    throw std::logic_error(std::string(what) + ": " + dtype_name(in.dtype) + " " +
                           in.shape.str() + " into " + dtype_name(out.dtype) + " " +
                           out.shape.str() + " over " + std::to_string(size) + " ranks");
}

}  // namespace

Request Communicator::reduce_scatter_async(const Tensor& in, const Tensor& out) {
  check_scatter(in, out, size_, "reduce_scatter_async");
  const int64_t n = out.numel();
  if (on_device(in, "reduce_scatter_async")) {
    if (size_ == 1) return local_copy(in, out), Request{};
    if (nccl_) return device_collective(DeviceOp::reduce_scatter, in, out);
  }
  if (in.dtype == DType::f32)
    return reduce_scatter_async(static_cast<const float*>(in.data), static_cast<float*>(out.data), n);
  if (in.dtype == DType::bf16)
    return reduce_scatter_async_bf16(static_cast<const uint16_t*>(in.data),
                                     static_cast<uint16_t*>(out.data), n);
  throw std::logic_error(std::string("reduce_scatter_async: cannot sum ") + dtype_name(in.dtype));
}

void Communicator::reduce_scatter(const Tensor& in, const Tensor& out) {
  check_scatter(in, out, size_, "reduce_scatter");
  if (in.dtype == DType::f32 && !on_device(in, "reduce_scatter"))
    return reduce_scatter(static_cast<const float*>(in.data), static_cast<float*>(out.data),
                          out.numel());
  reduce_scatter_async(in, out).wait();
}

Request Communicator::all_gather_async(const Tensor& in, const Tensor& out) {
  check_gather(in, out, size_, "all_gather_async");
  const int64_t n = in.numel();
  if (on_device(in, "all_gather_async")) {
    if (size_ == 1) return local_copy(in, out), Request{};
    if (nccl_) return device_collective(DeviceOp::all_gather, in, out);
  }
  if (dtype_size(in.dtype) == 4)
    return all_gather_async(static_cast<const float*>(in.data), static_cast<float*>(out.data), n);
  const int cnt = comm_int_count(n, "all_gather_async");
  const char* src = static_cast<const char*>(in.data);
  char* dst = static_cast<char*>(out.data);
  if (size_ == 1) {
    if (n > 0 && src != dst) std::memmove(dst, src, size_t(n) * 2);
    return {};
  }
  const double t0 = MPI_Wtime();
  MPI_Request r;
  const void* send = src == dst + size_t(rank_) * size_t(n) * 2 ? MPI_IN_PLACE : src;
  MPI_Iallgather(send, cnt, MPI_UINT16_T, dst, cnt, MPI_UINT16_T, comm_, &r);
  count(n * 2, t0, "all_gather_async");
  return Request(r, &stats_);
}

void Communicator::all_gather(const Tensor& in, const Tensor& out) {
  check_gather(in, out, size_, "all_gather");
  if (in.dtype == DType::f32 && !on_device(in, "all_gather"))
    return all_gather(static_cast<const float*>(in.data), static_cast<float*>(out.data),
                      in.numel());
  all_gather_async(in, out).wait();
}

void Communicator::all_to_all(const Tensor& in, const Tensor& out) {
  same_space(in, out, "all_to_all");
  if (in.dtype != DType::f32 || out.dtype != DType::f32 || in.numel() != out.numel() ||
      in.numel() % size_ != 0)
    throw std::logic_error(std::string("all_to_all: ") + dtype_name(in.dtype) + " " +
                           in.shape.str() + " to " + dtype_name(out.dtype) + " " +
                           out.shape.str() + " over " + std::to_string(size_) + " ranks");
  const int64_t n = in.numel() / size_;
  if (!on_device(in, "all_to_all"))
    return all_to_all(static_cast<const float*>(in.data), static_cast<float*>(out.data), n);
  if (size_ == 1) return local_copy(in, out);
  // Through host staging: NCCL has no all-to-all of its own (a grouped send/recv per peer).
  std::vector<float> send(size_t(in.numel())), recv(size_t(out.numel()));
  const Tensor hs = view_of(send.data(), in.shape), hr = view_of(recv.data(), out.shape);
  link_->copy(in, hs, in.numel());
  all_to_all(send.data(), recv.data(), n);
  link_->copy(hr, out, out.numel());
}

// Point-to-point on any dtype. Device tensors are staged through host memory (above).
Request Communicator::p2p(bool send, const Tensor& buf, int peer, int tag) {
  const char* what = send ? "isend" : "irecv";
  const int64_t bytes = buf.numel() * int64_t(dtype_size(buf.dtype));
  const int cnt = comm_int_count(bytes, what);
  check_peer(peer, what);
  const bool device = on_device(buf, what);
  if (!device && buf.dtype == DType::f32)
    return send ? isend(static_cast<const float*>(buf.data), buf.numel(), peer, tag)
                : irecv(static_cast<float*>(buf.data), buf.numel(), peer, tag);
  std::shared_ptr<std::vector<char>> stage;
  void* p = buf.data;
  if (device) {
    stage = std::make_shared<std::vector<char>>(size_t(bytes));
    p = stage->data();
    if (send) link_->copy(buf, view_of(p, buf.dtype, buf.shape), buf.numel());
  }
  const double t0 = MPI_Wtime();
  MPI_Request r;
  if (send) MPI_Isend(p, cnt, MPI_BYTE, peer, tag, comm_, &r);
  else MPI_Irecv(p, cnt, MPI_BYTE, peer, tag, comm_, &r);
  count(send ? bytes : 0, t0);
  if (!device) return Request(r, &stats_);
  // The staging buffer lives until the message has gone (send) or has been copied to the
  // device (receive: the copy is queued, the host buffer free at once).
  std::shared_ptr<const DeviceLink> link = link_;
  Tensor dst = buf;
  return Request(
      [r, stage, link, dst, send](bool block) mutable {
        if (r != MPI_REQUEST_NULL) {
          int flag = 1;
          if (block) MPI_Wait(&r, MPI_STATUS_IGNORE);
          else MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
          if (!flag) return false;
          if (!send) link->copy(view_of(stage->data(), dst.dtype, dst.shape), dst, dst.numel());
        }
        return true;
      },
      &stats_);
}

Request Communicator::isend(const Tensor& buf, int peer, int tag) {
  return p2p(true, buf, peer, tag);
}

Request Communicator::irecv(const Tensor& buf, int peer, int tag) {
  return p2p(false, buf, peer, tag);
}

}  // namespace tessera
