#include "comm/communicator.hpp"

#include <algorithm>
#include <utility>

namespace tessera {
namespace {

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

bool owned(MPI_Comm c) { return c != MPI_COMM_NULL && c != MPI_COMM_WORLD && c != MPI_COMM_SELF; }

}  // namespace

Communicator::Communicator(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Communicator::~Communicator() {
  if (owned(comm_)) MPI_Comm_free(&comm_);
}

Communicator::Communicator(Communicator&& o) noexcept { *this = std::move(o); }

Communicator& Communicator::operator=(Communicator&& o) noexcept {
  if (this != &o) {
    if (owned(comm_)) MPI_Comm_free(&comm_);
    comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
    name_ = std::move(o.name_);
    rank_ = o.rank_;
    size_ = o.size_;
    stats_ = o.stats_;
  }
  return *this;
}

void Communicator::reduce_impl(void* buf, int64_t n, MPI_Datatype type, int64_t elem_bytes,
                               ReduceOp op) {
  if (size_ == 1) return;  // nothing to exchange: not a call, not counted
  const double t0 = MPI_Wtime();
  // MPI counts are int: large buffers go in chunks.
  constexpr int64_t kChunk = int64_t(1) << 30;
  char* p = static_cast<char*>(buf);
  for (int64_t off = 0; off < n; off += kChunk) {
    const int count = int(std::min(kChunk, n - off));
    MPI_Allreduce(MPI_IN_PLACE, p + off * elem_bytes, count, type, mpi_op(op), comm_);
  }
  stats_.calls += 1;
  stats_.bytes += n * elem_bytes;
  stats_.seconds += MPI_Wtime() - t0;
}

void Communicator::all_reduce(float* buf, int64_t n, ReduceOp op) {
  reduce_impl(buf, n, MPI_FLOAT, 4, op);
}
void Communicator::all_reduce(double* buf, int64_t n, ReduceOp op) {
  reduce_impl(buf, n, MPI_DOUBLE, 8, op);
}
void Communicator::all_reduce(int64_t* buf, int64_t n, ReduceOp op) {
  reduce_impl(buf, n, MPI_INT64_T, 8, op);
}

Request Communicator::all_reduce_async(float* buf, int64_t n) {
  if (size_ == 1) return {};
  const double t0 = MPI_Wtime();
  MPI_Request r;
  MPI_Iallreduce(MPI_IN_PLACE, buf, int(n), MPI_FLOAT, MPI_SUM, comm_, &r);
  stats_.calls += 1;
  stats_.bytes += n * 4;
  stats_.seconds += MPI_Wtime() - t0;
  return Request(r, &stats_);
}

bool Request::test() {
  if (req_ == MPI_REQUEST_NULL) return true;
  const double t0 = MPI_Wtime();
  int flag = 0;
  MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
  if (stats_) stats_->seconds += MPI_Wtime() - t0;
  return flag != 0;
}

void Request::wait() {
  if (req_ == MPI_REQUEST_NULL) return;
  const double t0 = MPI_Wtime();
  MPI_Wait(&req_, MPI_STATUS_IGNORE);
  if (stats_) stats_->seconds += MPI_Wtime() - t0;
}

void Communicator::broadcast(void* buf, int64_t bytes, int root) {
  if (size_ == 1) return;
  const double t0 = MPI_Wtime();
  MPI_Bcast(buf, int(bytes), MPI_BYTE, root, comm_);
  stats_.calls += 1;
  stats_.bytes += bytes;
  stats_.seconds += MPI_Wtime() - t0;
}

void Communicator::barrier() {
  if (size_ > 1) MPI_Barrier(comm_);
}

}  // namespace tessera
