#include "comm/communicator.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "tensor/half.hpp"

namespace tessera {
namespace {

void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = half::to_bf16(half::from_bf16(a[i]) + half::from_bf16(b[i]));
}

// The bf16 sum operator, created on first use (MPI is initialised by then) and kept until
// MPI_Finalize frees it.
MPI_Op bf16_sum_op() {
  static MPI_Op op = [] {
    MPI_Op o;
    MPI_Op_create(bf16_sum, /*commute=*/1, &o);
    return o;
  }();
  return op;
}

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

bool owned(MPI_Comm c) {
  return c != MPI_COMM_NULL && c != MPI_COMM_WORLD && c != MPI_COMM_SELF;
}

int64_t g_chunk_limit = int64_t(1) << 30;

// Local copy for the size-1 short-circuit (in may equal out).
void copy_floats(const float* in, float* out, int64_t n) {
  if (n > 0 && in != out) std::memmove(out, in, size_t(n) * sizeof(float));
}

void require_count(int64_t n, const char* what) {
  if (n < 0) throw std::logic_error(std::string(what) + ": negative count " + std::to_string(n));
}

}  // namespace

// Non-blocking, v-variant and point-to-point calls pass counts to MPI as int, unchunked.
int comm_int_count(int64_t n, const char* what) {
  require_count(n, what);
  if (n > INT_MAX)
    throw std::logic_error(std::string(what) + ": count " + std::to_string(n) +
                           " exceeds INT_MAX elements; split the buffer or use the blocking form");
  return int(n);
}

namespace {

// Count and displacement arrays of a v-variant, checked and narrowed to int.
std::vector<int> int_array(std::span<const int64_t> a, int size, const char* what) {
  if (int(a.size()) != size)
    throw std::logic_error(std::string(what) + ": " + std::to_string(a.size()) +
                           " entries for a communicator of size " + std::to_string(size));
  std::vector<int> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = comm_int_count(a[i], what);
  return out;
}

// A datatype of cnt floats whose extent is stride floats: block r of a strided buffer.
MPI_Datatype strided_block(int cnt, int64_t stride) {
  MPI_Datatype c, t;
  MPI_Type_contiguous(cnt, MPI_FLOAT, &c);
  MPI_Type_create_resized(c, 0, MPI_Aint(stride) * MPI_Aint(sizeof(float)), &t);
  MPI_Type_commit(&t);
  MPI_Type_free(&c);
  return t;
}

}  // namespace

int64_t Communicator::chunk_limit() {
  return g_chunk_limit;
}
void Communicator::set_chunk_limit(int64_t elems) {
  if (elems < 1 || elems > INT_MAX)
    throw std::logic_error("Communicator::set_chunk_limit: " + std::to_string(elems) +
                           " is outside [1, INT_MAX]");
  g_chunk_limit = elems;
}

Communicator::Communicator(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Communicator::~Communicator() {
  if (owned(comm_)) MPI_Comm_free(&comm_);
}

Communicator::Communicator(Communicator&& o) noexcept {
  *this = std::move(o);
}

Communicator& Communicator::operator=(Communicator&& o) noexcept {
  if (this != &o) {
    if (owned(comm_)) MPI_Comm_free(&comm_);
    comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
    name_ = std::move(o.name_);
    rank_ = o.rank_;
    size_ = o.size_;
    stats_ = o.stats_;
    trace_ = o.trace_;
    trace_group_ = o.trace_group_;
    link_ = std::move(o.link_);
    nccl_ = std::move(o.nccl_);
  }
  return *this;
}

const char* comm_kind_name(CommKind k) {
  static const char* names[kCommKinds] = {"all_reduce", "broadcast", "reduce_scatter",
                                          "all_gather", "all_to_all", "p2p"};
  return names[int(k)];
}

namespace {

// The kind of an operation from its counted name ("all_gather_async" is an all_gather);
// point-to-point calls count without a name.
CommKind kind_of(const char* op) {
  if (!op) return CommKind::p2p;
  for (int k = 0; k < kCommKinds - 1; ++k) {
    const char* name = comm_kind_name(CommKind(k));
    if (std::strncmp(op, name, std::strlen(name)) == 0) return CommKind(k);
  }
  return CommKind::p2p;
}

}  // namespace

void Communicator::count(int64_t bytes, double t0, const char* op) {
  const double seconds = MPI_Wtime() - t0;
  stats_.calls += 1;
  stats_.bytes += bytes;
  stats_.kind_bytes[int(kind_of(op))] += bytes;
  stats_.seconds += seconds;
  if (op && trace_) trace_->add_ending_now(TraceKind::collective, op, seconds, trace_group_, bytes);
}

// MPI caches MPI_TAG_UB on MPI_COMM_WORLD; a communicator split from it need not carry the
// attribute (Open MPI's do not), and the bound is the implementation's, so the world's applies.
int Communicator::max_tag() const {
  for (MPI_Comm c : {comm_, MPI_COMM_WORLD}) {
    if (c == MPI_COMM_NULL) continue;
    void* value = nullptr;
    int found = 0;
    MPI_Comm_get_attr(c, MPI_TAG_UB, &value, &found);
    if (found && value) return *static_cast<int*>(value);
  }
  return 32767;  // the least MPI guarantees
}

void Communicator::set_trace(Trace* trace) {
  trace_ = trace;
  trace_group_ = trace ? trace->intern(name_) : -1;
}

void Communicator::check_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= size_)
    throw std::logic_error(std::string(what) + ": rank " + std::to_string(peer) +
                           " is outside communicator '" + name_ + "' of size " +
                           std::to_string(size_));
}

// ---- all-reduce ---------------------------------------------------------------------------

void Communicator::reduce_impl(void* buf, int64_t n, MPI_Datatype type, int64_t elem_bytes,
                               ReduceOp op) {
  require_count(n, "all_reduce");
  if (size_ == 1) return;  // nothing to exchange: not a call, not counted
  const double t0 = MPI_Wtime();
  // MPI counts are int: large buffers go in chunks.
  const int64_t chunk = g_chunk_limit;
  char* p = static_cast<char*>(buf);
  for (int64_t off = 0; off < n; off += chunk) {
    const int cnt = int(std::min(chunk, n - off));
    MPI_Allreduce(MPI_IN_PLACE, p + off * elem_bytes, cnt, type, mpi_op(op), comm_);
  }
  count(n * elem_bytes, t0, "all_reduce");
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

Communicator Communicator::split(int color, int key, std::string name) const {
  MPI_Comm out;
  MPI_Comm_split(comm_, color, key, &out);
  Communicator c(out, std::move(name));
  if (link_) c.attach_device(*link_);  // collective over the new group, as the split is
  return c;
}

Request Communicator::all_reduce_async(float* buf, int64_t n) {
  const int cnt = comm_int_count(n, "all_reduce_async");
  if (size_ == 1) return {};
  const double t0 = MPI_Wtime();
  MPI_Request r;
  MPI_Iallreduce(MPI_IN_PLACE, buf, cnt, MPI_FLOAT, MPI_SUM, comm_, &r);
  count(n * 4, t0, "all_reduce_async");
  return Request(r, &stats_);
}

Request Communicator::all_reduce_async_bf16(uint16_t* buf, int64_t n) {
  const int cnt = comm_int_count(n, "all_reduce_async_bf16");
  if (size_ == 1) return {};
  const double t0 = MPI_Wtime();
  MPI_Request r;
  MPI_Iallreduce(MPI_IN_PLACE, buf, cnt, MPI_UINT16_T, bf16_sum_op(), comm_, &r);
  count(n * 2, t0, "all_reduce_async_bf16");
  return Request(r, &stats_);
}

// ---- broadcast ------------------------------------------------------------------------------

void Communicator::broadcast(void* buf, int64_t bytes, int root) {
  require_count(bytes, "broadcast");
  check_peer(root, "broadcast root");
  if (size_ == 1) return;
  const double t0 = MPI_Wtime();
  char* p = static_cast<char*>(buf);
  for (int64_t off = 0; off < bytes; off += g_chunk_limit)
    MPI_Bcast(p + off, int(std::min(g_chunk_limit, bytes - off)), MPI_BYTE, root, comm_);
  count(bytes, t0, "broadcast");
}

void Communicator::broadcast(float* buf, int64_t n, int root) {
  require_count(n, "broadcast");
  check_peer(root, "broadcast root");
  if (size_ == 1) return;
  const double t0 = MPI_Wtime();
  for (int64_t off = 0; off < n; off += g_chunk_limit)
    MPI_Bcast(buf + off, int(std::min(g_chunk_limit, n - off)), MPI_FLOAT, root, comm_);
  count(n * 4, t0, "broadcast");
}

Request Communicator::broadcast_async(float* buf, int64_t n, int root) {
  const int cnt = comm_int_count(n, "broadcast_async");
  check_peer(root, "broadcast_async root");
  if (size_ == 1) return {};
  const double t0 = MPI_Wtime();
  MPI_Request r;
  MPI_Ibcast(buf, cnt, MPI_FLOAT, root, comm_, &r);
  count(n * 4, t0, "broadcast_async");
  return Request(r, &stats_);
}

// ---- reduce-scatter -------------------------------------------------------------------------

void Communicator::reduce_scatter(const float* in, float* out, int64_t n) {
  require_count(n, "reduce_scatter");
  if (size_ == 1) return copy_floats(in, out, n);
  const double t0 = MPI_Wtime();
  if (n <= g_chunk_limit) {
    MPI_Reduce_scatter_block(in, out, int(n), MPI_FLOAT, MPI_SUM, comm_);
  } else {
    // Chunked: block r reduced onto rank r, one chunk at a time (no staging copy).
    for (int64_t off = 0; off < n; off += g_chunk_limit) {
      const int cnt = int(std::min(g_chunk_limit, n - off));
      for (int r = 0; r < size_; ++r)
        MPI_Reduce(in + int64_t(r) * n + off, r == rank_ ? out + off : nullptr, cnt, MPI_FLOAT,
                   MPI_SUM, r, comm_);
    }
  }
  count(n * size_ * 4, t0, "reduce_scatter");
}

Request Communicator::reduce_scatter_async(const float* in, float* out, int64_t n) {
  const int cnt = comm_int_count(n, "reduce_scatter_async");
  if (size_ == 1) {
    copy_floats(in, out, n);
    return {};
  }
  const double t0 = MPI_Wtime();
  MPI_Request r;
  MPI_Ireduce_scatter_block(in, out, cnt, MPI_FLOAT, MPI_SUM, comm_, &r);
  count(n * size_ * 4, t0, "reduce_scatter_async");
  return Request(r, &stats_);
}

Request Communicator::reduce_scatter_async_bf16(const uint16_t* in, uint16_t* out, int64_t n) {
  const int cnt = comm_int_count(n, "reduce_scatter_async_bf16");
  if (size_ == 1) {
    if (n > 0 && in != out) std::memmove(out, in, size_t(n) * sizeof(uint16_t));
    return {};
  }
  const double t0 = MPI_Wtime();
  MPI_Request r;
  MPI_Ireduce_scatter_block(in, out, cnt, MPI_UINT16_T, bf16_sum_op(), comm_, &r);
  count(n * size_ * 2, t0, "reduce_scatter_async_bf16");
  return Request(r, &stats_);
}

// ---- all-gather -----------------------------------------------------------------------------

// In place when this rank's block already sits at its position in out.
const void* Communicator::gather_send(const float* in, float* out, int64_t n) const {
  return in == out + int64_t(rank_) * n ? MPI_IN_PLACE : static_cast<const void*>(in);
}

void Communicator::all_gather(const float* in, float* out, int64_t n) {
  require_count(n, "all_gather");
  if (size_ == 1) return copy_floats(in, out, n);
  const double t0 = MPI_Wtime();
  if (n <= g_chunk_limit) {
    MPI_Allgather(gather_send(in, out, n), int(n), MPI_FLOAT, out, int(n), MPI_FLOAT, comm_);
  } else {
    for (int64_t off = 0; off < n; off += g_chunk_limit) {
      const int cnt = int(std::min(g_chunk_limit, n - off));
      MPI_Datatype block = strided_block(cnt, n);  // chunk of each rank's block in out
      MPI_Allgather(in == out + int64_t(rank_) * n ? MPI_IN_PLACE : in + off, cnt, MPI_FLOAT,
                    out + off, 1, block, comm_);
      MPI_Type_free(&block);
    }
  }
  count(n * 4, t0, "all_gather");
}

Request Communicator::all_gather_async(const float* in, float* out, int64_t n) {
  const int cnt = comm_int_count(n, "all_gather_async");
  if (size_ == 1) {
    copy_floats(in, out, n);
    return {};
  }
  const double t0 = MPI_Wtime();
  MPI_Request r;
  MPI_Iallgather(gather_send(in, out, n), cnt, MPI_FLOAT, out, cnt, MPI_FLOAT, comm_, &r);
  count(n * 4, t0, "all_gather_async");
  return Request(r, &stats_);
}

// ---- all-to-all -----------------------------------------------------------------------------

void Communicator::all_to_all(const float* in, float* out, int64_t n) {
  require_count(n, "all_to_all");
  if (size_ == 1) return copy_floats(in, out, n);
  const double t0 = MPI_Wtime();
  if (n <= g_chunk_limit) {
    MPI_Alltoall(in, int(n), MPI_FLOAT, out, int(n), MPI_FLOAT, comm_);
  } else {
    for (int64_t off = 0; off < n; off += g_chunk_limit) {
      const int cnt = int(std::min(g_chunk_limit, n - off));
      MPI_Datatype block = strided_block(cnt, n);  // chunk of block r, r = 0..size-1
      MPI_Alltoall(in + off, 1, block, out + off, 1, block, comm_);
      MPI_Type_free(&block);
    }
  }
  count(n * size_ * 4, t0, "all_to_all");
}

Request Communicator::all_to_all_async(const float* in, float* out, int64_t n) {
  const int cnt = comm_int_count(n, "all_to_all_async");
  if (size_ == 1) {
    copy_floats(in, out, n);
    return {};
  }
  const double t0 = MPI_Wtime();
  MPI_Request r;
  MPI_Ialltoall(in, cnt, MPI_FLOAT, out, cnt, MPI_FLOAT, comm_, &r);
  count(n * size_ * 4, t0, "all_to_all_async");
  return Request(r, &stats_);
}

namespace {

struct VArgs {
  std::vector<int> all;  // send counts, send displs, recv counts, recv displs: size each
  int64_t sent = 0;      // elements this rank sends
};

VArgs v_args(std::span<const int64_t> sc, std::span<const int64_t> sd, std::span<const int64_t> rc,
             std::span<const int64_t> rd, int size, const char* what) {
  VArgs v;
  for (auto a : {sc, sd, rc, rd}) {
    std::vector<int> x = int_array(a, size, what);
    v.all.insert(v.all.end(), x.begin(), x.end());
  }
  for (int64_t c : sc) v.sent += c;
  return v;
}

}  // namespace

void Communicator::all_to_allv(const float* in, std::span<const int64_t> send_counts,
                               std::span<const int64_t> send_displs, float* out,
                               std::span<const int64_t> recv_counts,
                               std::span<const int64_t> recv_displs) {
  VArgs v = v_args(send_counts, send_displs, recv_counts, recv_displs, size_, "all_to_allv");
  if (size_ == 1) {
    if (send_counts[0] != recv_counts[0])
      throw std::logic_error("all_to_allv: size-1 send count " + std::to_string(send_counts[0]) +
                             " != recv count " + std::to_string(recv_counts[0]));
    return copy_floats(in + send_displs[0], out + recv_displs[0], send_counts[0]);
  }
  const int* a = v.all.data();
  const double t0 = MPI_Wtime();
  MPI_Alltoallv(in, a, a + size_, MPI_FLOAT, out, a + 2 * size_, a + 3 * size_, MPI_FLOAT, comm_);
  count(v.sent * 4, t0, "all_to_allv");
}

Request Communicator::all_to_allv_async(const float* in, std::span<const int64_t> send_counts,
                                        std::span<const int64_t> send_displs, float* out,
                                        std::span<const int64_t> recv_counts,
                                        std::span<const int64_t> recv_displs) {
  if (size_ == 1) {
    all_to_allv(in, send_counts, send_displs, out, recv_counts, recv_displs);
    return {};
  }
  VArgs v = v_args(send_counts, send_displs, recv_counts, recv_displs, size_, "all_to_allv_async");
  const int* a = v.all.data();  // owned by the Request until completion (vector moves keep it)
  const double t0 = MPI_Wtime();
  MPI_Request r;
  MPI_Ialltoallv(in, a, a + size_, MPI_FLOAT, out, a + 2 * size_, a + 3 * size_, MPI_FLOAT, comm_,
                 &r);
  count(v.sent * 4, t0, "all_to_allv_async");
  return Request({r}, &stats_, std::move(v.all));
}

// ---- point-to-point -------------------------------------------------------------------------

void Communicator::send(const float* buf, int64_t n, int peer, int tag) {
  const int cnt = comm_int_count(n, "send");
  check_peer(peer, "send");
  const double t0 = MPI_Wtime();
  MPI_Send(buf, cnt, MPI_FLOAT, peer, tag, comm_);
  count(n * 4, t0);
}

void Communicator::recv(float* buf, int64_t n, int peer, int tag) {
  const int cnt = comm_int_count(n, "recv");
  check_peer(peer, "recv");
  const double t0 = MPI_Wtime();
  MPI_Recv(buf, cnt, MPI_FLOAT, peer, tag, comm_, MPI_STATUS_IGNORE);
  count(0, t0);
}

Request Communicator::isend(const float* buf, int64_t n, int peer, int tag) {
  const int cnt = comm_int_count(n, "isend");
  check_peer(peer, "isend");
  const double t0 = MPI_Wtime();
  MPI_Request r;
  MPI_Isend(buf, cnt, MPI_FLOAT, peer, tag, comm_, &r);
  count(n * 4, t0);
  return Request(r, &stats_);
}

Request Communicator::irecv(float* buf, int64_t n, int peer, int tag) {
  const int cnt = comm_int_count(n, "irecv");
  check_peer(peer, "irecv");
  const double t0 = MPI_Wtime();
  MPI_Request r;
  MPI_Irecv(buf, cnt, MPI_FLOAT, peer, tag, comm_, &r);
  count(0, t0);
  return Request(r, &stats_);
}

void Communicator::barrier() {
  if (size_ == 1) return;
  if (!trace_) {
    MPI_Barrier(comm_);
    return;
  }
  const double t0 = MPI_Wtime();
  MPI_Barrier(comm_);
  trace_->add_ending_now(TraceKind::collective, "barrier", MPI_Wtime() - t0, trace_group_, 0);
}

// ---- Request --------------------------------------------------------------------------------

bool Request::done() const {
  if (device_) return device_done_;
  return std::all_of(reqs_.begin(), reqs_.end(),
                     [](MPI_Request r) { return r == MPI_REQUEST_NULL; });
}

bool Request::test() {
  if (done()) return true;
  const double t0 = MPI_Wtime();
  if (device_) {
    device_done_ = device_(false);
    if (stats_) stats_->seconds += MPI_Wtime() - t0;
    return device_done_;
  }
  int flag = 0;
  MPI_Testall(int(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE);
  if (stats_) stats_->seconds += MPI_Wtime() - t0;
  if (flag) keep_.clear();
  return flag != 0;
}

void Request::wait() {
  if (done()) return;
  const double t0 = MPI_Wtime();
  if (device_) {
    device_(true);
    device_done_ = true;
    if (stats_) stats_->seconds += MPI_Wtime() - t0;
    return;
  }
  MPI_Waitall(int(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);
  if (stats_) stats_->seconds += MPI_Wtime() - t0;
  keep_.clear();
}

Communicator Communicator::node_group() const {
  MPI_Comm node;
  MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  return Communicator(node, name_ + ".node");
}

int Communicator::size_on_node() const {
  MPI_Comm node;
  MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  int n = 1;
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  return n;
}

}  // namespace tessera
