// One Communicator per process group. Every collective tessera issues goes through here and
// is counted (calls, bytes, seconds) so the closing summary can show traffic per group.
//
// Counting rules (all operations):
//   calls   += 1 per operation started (a chunked operation is still one call; a
//              non-blocking one is counted when posted, not again at test()/wait()).
//   seconds += time spent inside MPI: posting, plus every Request::test()/wait() of
//              a request this communicator returned.
//   bytes   += payload bytes this rank puts into the operation, per operation:
//     all_reduce(n)              n * sizeof(T)       the buffer reduced
//     broadcast(void*, bytes)    bytes               on every rank, root or not
//     broadcast(float*, n)       n * 4               on every rank, root or not
//     reduce_scatter(in[n*P])    n * P * 4           the whole input
//     all_gather(in[n])          n * 4               this rank's block (not the n*P gathered)
//     all_to_all(in[n*P])        n * P * 4           the whole input, own block included
//     all_to_allv                sum(send_counts)*4  own block included
//     send / isend               n * 4               the message
//     recv / irecv               0                   nothing sent (still one call)
// A size-1 communicator short-circuits the collectives: out = in copied locally, nothing
// counted. Point-to-point calls always go through MPI (a send to self needs a posted recv).
//
// With a Trace attached (set_trace), every collective that is counted, and barrier(), is
// also a span on the trace's collective lane: the operation's name, this group's name and
// the bytes counted; a non-blocking one spans its posting only.
//
// Sizes are elements, not bytes, except broadcast(void*, bytes). Equal-count collectives
// accept any int64_t count when blocking (they run in chunks of at most chunk_limit()
// elements); their non-blocking forms, the v-variants and point-to-point reject counts
// above INT_MAX with std::logic_error, as do bad peers/roots and negative counts.
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/trace.hpp"
#include "tensor/tensor.hpp"

namespace tessera {

// What an operation is, for the bytes per kind (traffic.json): the typed forms count here too.
enum class CommKind { all_reduce, broadcast, reduce_scatter, all_gather, all_to_all, p2p };
constexpr int kCommKinds = 6;
const char* comm_kind_name(CommKind k);  // "all_reduce", ..., "p2p"

struct TrafficStats {
  int64_t calls = 0;
  int64_t bytes = 0;  // payload bytes this rank contributed (see the table above)
  double seconds = 0;
  std::array<int64_t, kCommKinds> kind_bytes{};  // bytes split by CommKind
};

enum class ReduceOp { sum, max, min };

// A non-blocking operation in flight (possibly several MPI requests). MPI progresses it
// only inside MPI calls, so callers poll test() while they compute and wait() when they
// need the result. Buffers must stay alive and untouched until it completes. The Request
// points at its Communicator's stats: do not move or destroy the Communicator meanwhile.
class Request {
 public:
  Request() = default;
  Request(MPI_Request r, TrafficStats* stats) : reqs_{r}, stats_(stats) {}
  Request(std::vector<MPI_Request> rs, TrafficStats* stats, std::vector<int> keep = {})
      : reqs_(std::move(rs)), stats_(stats), keep_(std::move(keep)) {}
  // A device operation queued on a stream (NCCL): device(false) says whether it has finished,
  // device(true) orders what runs next after it (the compute stream waits for it; the host
  // does not block).
  Request(std::function<bool(bool)> device, TrafficStats* stats)
      : stats_(stats), device_(std::move(device)) {}
  bool test();  // true when complete
  void wait();
  bool done() const;

 private:
  std::vector<MPI_Request> reqs_;
  TrafficStats* stats_ = nullptr;
  std::vector<int> keep_;  // count/displacement arrays MPI reads until completion
  std::function<bool(bool)> device_;
  bool device_done_ = false;
};

// What a Communicator needs to move device tensors, given by the layer that owns the device
// (train/: kernels::Device): the streams (cudaStream_t; null on an emulated device), the
// staging copy between memory spaces (kernels::transfer: a copy into host memory has finished
// when it returns, one into device memory is queued after the compute stream's work), and
// whether collectives go through NCCL (a GPU) or through MPI on the memory as it is (the
// tests' emulated device, whose memory is host memory).
struct DeviceLink {
  void* compute_stream = nullptr;
  void* comm_stream = nullptr;
  std::function<void(const Tensor& src, const Tensor& dst, int64_t n)> copy;
  bool nccl = true;
};

class NcclCommunicator;  // comm/nccl_backend.hpp

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
  // How many ranks of this communicator share this rank's node (its shared-memory domain).
  int size_on_node() const;
  // The ranks of this communicator on this rank's node (its shared-memory domain), numbered
  // in this communicator's order (collective).
  Communicator node_group() const;
  const std::string& name() const { return name_; }
  const TrafficStats& stats() const { return stats_; }
  MPI_Comm raw() const { return comm_; }
  // The largest message tag this communicator accepts: MPI_TAG_UB (its own attribute, else
  // MPI_COMM_WORLD's, where MPI caches it), at least 32767.
  int max_tag() const;
  // Collectives become spans of trace (null: none); names this group in it.
  void set_trace(Trace* trace);
  // Ranks with the same color form a new group, numbered by key (collective).
  Communicator split(int color, int key, std::string name) const;

  // ---- all-reduce: in place over buf[n] ----
  void all_reduce(float* buf, int64_t n, ReduceOp op = ReduceOp::sum);
  void all_reduce(double* buf, int64_t n, ReduceOp op = ReduceOp::sum);
  void all_reduce(int64_t* buf, int64_t n, ReduceOp op = ReduceOp::sum);
  // Starts a sum all-reduce in place (n <= INT_MAX elements).
  Request all_reduce_async(float* buf, int64_t n);
  // bf16 (bit patterns; parallel.grad_reduce_dtype = bf16): half the bytes of the fp32 forms.
  // Each pairwise sum is taken in fp32 and rounded to bf16 (nearest even) by a user operator,
  // in the order MPI's algorithm chooses for this communicator size.
  Request all_reduce_async_bf16(uint16_t* buf, int64_t n);
  Request reduce_scatter_async_bf16(const uint16_t* in, uint16_t* out, int64_t n);

  // ---- typed forms: the count and element type come from the tensors ----
  // all_reduce(_async): f32, f64 (blocking) or bf16 (the bf16 sum above; sum only), in place.
  // reduce_scatter(_async): in[n*size] -> out[n], f32 or bf16 (sum).
  // all_gather(_async): in[n] -> out[n*size], any 4- or 2-byte dtype (bits moved, no
  //   arithmetic); in place when in is out's block rank().
  // all_to_all: in[n*size] -> out[n*size], f32.
  // isend / irecv: the whole tensor, any dtype.
  // On host tensors these are the raw-pointer forms below (the same MPI calls, counted the
  // same). A dtype a form cannot move, mixed memory spaces, or sizes that do not match, is a
  // logic_error. Device tensors (Space::cuda) need attach_device first:
  //   * collectives go through this group's NCCL communicator: queued on the communication
  //     stream after the compute stream's work so far; wait() makes the compute stream wait
  //     for them (the host does not block), so the blocking forms return with the result
  //     ordered before every later kernel. Under an emulated device (DeviceLink::nccl false)
  //     they are MPI on the memory as it is (host memory).
  //   * point-to-point and all-to-all go through host staging buffers and MPI: a send copies
  //     the tensor to the host (after the compute stream's work) and posts the MPI send; a
  //     receive posts into a host buffer and its test()/wait() copies the message to the
  //     device once it has arrived. MPI matches messages by tag in any order, which a
  //     pipeline's op lists rely on (NCCL's point-to-point matches by order).
  //   * a group of one copies locally (no NCCL communicator exists for it).
  Request all_reduce_async(const Tensor& buf);
  Request reduce_scatter_async(const Tensor& in, const Tensor& out);
  Request all_gather_async(const Tensor& in, const Tensor& out);
  void all_reduce(const Tensor& buf, ReduceOp op = ReduceOp::sum);
  void reduce_scatter(const Tensor& in, const Tensor& out);
  void all_gather(const Tensor& in, const Tensor& out);
  void all_to_all(const Tensor& in, const Tensor& out);
  Request isend(const Tensor& buf, int peer, int tag);
  Request irecv(const Tensor& buf, int peer, int tag);

  // ---- device tensors (hardware.device = cuda) ----
  // Gives this group what it needs to move device tensors (collective over the group: every
  // member calls it, groups in the same order on every rank). With link.nccl, a group of
  // more than one rank makes its NCCL communicator (builds without TESSERA_NCCL: an error
  // naming the missing piece). Groups split from this one later inherit the link.
  void attach_device(const DeviceLink& link);
  bool device_attached() const { return link_ != nullptr; }

  // ---- broadcast from root ----
  void broadcast(void* buf, int64_t bytes, int root);  // counted in BYTES
  void broadcast(float* buf, int64_t n, int root);     // counted in floats
  Request broadcast_async(float* buf, int64_t n, int root);

  // ---- reduce-scatter (sum): in[n*size] -> out[n]; out = sum over ranks of block rank() ----
  void reduce_scatter(const float* in, float* out, int64_t n);
  Request reduce_scatter_async(const float* in, float* out, int64_t n);

  // ---- all-gather: in[n] -> out[n*size]; block r of out is rank r's in. In place when
  // in == out + rank() * n ----
  void all_gather(const float* in, float* out, int64_t n);
  Request all_gather_async(const float* in, float* out, int64_t n);

  // ---- all-to-all, equal counts: in[n*size] -> out[n*size]; block r of in goes to rank r,
  // block r of out came from rank r ----
  void all_to_all(const float* in, float* out, int64_t n);
  Request all_to_all_async(const float* in, float* out, int64_t n);

  // ---- all-to-all, per-peer counts and displacements (elements, size() entries each) ----
  void all_to_allv(const float* in, std::span<const int64_t> send_counts,
                   std::span<const int64_t> send_displs, float* out,
                   std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs);
  Request all_to_allv_async(const float* in, std::span<const int64_t> send_counts,
                            std::span<const int64_t> send_displs, float* out,
                            std::span<const int64_t> recv_counts,
                            std::span<const int64_t> recv_displs);

  // ---- point-to-point (n <= INT_MAX) ----
  void send(const float* buf, int64_t n, int peer, int tag);
  void recv(float* buf, int64_t n, int peer, int tag);
  Request isend(const float* buf, int64_t n, int peer, int tag);
  Request irecv(float* buf, int64_t n, int peer, int tag);

  void barrier();

  // Largest element count per MPI call in the chunked blocking paths (default 2^30).
  // Tests lower it to exercise the chunking with small buffers; process-wide.
  static int64_t chunk_limit();
  static void set_chunk_limit(int64_t elems);

 private:
  void reduce_impl(void* buf, int64_t n, MPI_Datatype type, int64_t elem_bytes, ReduceOp op);
  // The typed forms on device tensors through NCCL (nccl_backend.cpp; absent builds: error).
  enum class DeviceOp { all_reduce, reduce_scatter, all_gather };
  Request device_collective(DeviceOp op, const Tensor& in, const Tensor& out,
                            ReduceOp rop = ReduceOp::sum);
  std::shared_ptr<NcclCommunicator> make_nccl(void* comm_stream);
  // Device tensors: whether t is one (and this group can move it: attach_device was called),
  // a local copy for a group of one, and a host staging buffer of t's dtype and shape.
  bool on_device(const Tensor& t, const char* what) const;
  void local_copy(const Tensor& in, const Tensor& out) const;
  Request p2p(bool send, const Tensor& buf, int peer, int tag);
  void check_peer(int peer, const char* what) const;
  const void* gather_send(const float* in, float* out, int64_t n) const;
  // Counts one operation that began at MPI_Wtime() t0; a collective names itself (op) for
  // the trace.
  void count(int64_t bytes, double t0, const char* op = nullptr);

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  int rank_ = 0, size_ = 1;
  TrafficStats stats_;
  Trace* trace_ = nullptr;
  int16_t trace_group_ = -1;
  std::shared_ptr<const DeviceLink> link_;  // attach_device
  std::shared_ptr<NcclCommunicator> nccl_;   // with link_->nccl, for a group of several ranks
};

}  // namespace tessera
