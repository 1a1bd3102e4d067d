// Communicator: results against hand-computed values for rank-dependent inputs, and the
// traffic counters after each call, on a duplicate of MPI_COMM_WORLD and on a split
// sub-communicator (ranks by parity, reversed order; size 1 at NP=2 and for one half at NP=3,
// which exercises the local short-circuit), blocking and non-blocking, with the default chunk
// limit and with a 3-element limit that forces the chunked blocking paths.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "comm/clock_sync.hpp"
#include "comm/communicator.hpp"
#include "core/trace.hpp"
#include "tensor/half.hpp"

namespace tessera {
namespace {

constexpr int64_t kDefaultChunk = int64_t(1) << 30;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// A fresh communicator (zeroed stats): the whole world, or world split by parity.
Communicator make_comm(bool split) {
  MPI_Comm c;
  if (split) {
    const int wr = world_rank();
    MPI_Comm_split(MPI_COMM_WORLD, wr % 2, -wr, &c);
    return Communicator(c, "split");
  }
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  return Communicator(c, "world");
}

// Expected counters: a size-1 communicator counts nothing for collectives.
void expect_stats(const Communicator& c, int64_t calls, int64_t bytes) {
  const bool local = c.size() == 1;
  EXPECT_EQ(c.stats().calls, local ? 0 : calls) << c.name() << " size " << c.size();
  EXPECT_EQ(c.stats().bytes, local ? 0 : bytes) << c.name() << " size " << c.size();
  EXPECT_GE(c.stats().seconds, 0.0);
}

// (split, async, chunk limit)
class Collective : public ::testing::TestWithParam<std::tuple<bool, bool, int64_t>> {
 protected:
  void SetUp() override {
    split_ = std::get<0>(GetParam());
    async_ = std::get<1>(GetParam());
    Communicator::set_chunk_limit(std::get<2>(GetParam()));
  }
  void TearDown() override { Communicator::set_chunk_limit(kDefaultChunk); }
  bool split_ = false, async_ = false;
};

TEST_P(Collective, ReduceScatter) {
  Communicator c = make_comm(split_);
  const int P = c.size(), r = c.rank();
  const int64_t n = 7;
  std::vector<float> in(n * P), out(n, -1.f);
  for (int64_t j = 0; j < n * P; ++j) in[j] = float(1000 * r + j);
  if (async_) {
    Request q = c.reduce_scatter_async(in.data(), out.data(), n);
    q.wait();
    EXPECT_TRUE(q.done());
  } else {
    c.reduce_scatter(in.data(), out.data(), n);
  }
  for (int64_t i = 0; i < n; ++i)
    EXPECT_EQ(out[i], float(1000 * P * (P - 1) / 2 + P * (r * n + i))) << "i=" << i;
  expect_stats(c, 1, n * P * 4);
}

TEST_P(Collective, AllGather) {
  Communicator c = make_comm(split_);
  const int P = c.size(), r = c.rank();
  const int64_t n = 5;
  std::vector<float> in(n), out(n * P, -1.f);
  for (int64_t i = 0; i < n; ++i) in[i] = float(1000 * r + i);
  if (async_)
    c.all_gather_async(in.data(), out.data(), n).wait();
  else
    c.all_gather(in.data(), out.data(), n);
  for (int s = 0; s < P; ++s)
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out[s * n + i], float(1000 * s + i));
  expect_stats(c, 1, n * 4);
}

TEST_P(Collective, AllToAll) {
  Communicator c = make_comm(split_);
  const int P = c.size(), r = c.rank();
  const int64_t n = 4;
  std::vector<float> in(n * P), out(n * P, -1.f);
  for (int d = 0; d < P; ++d)
    for (int64_t i = 0; i < n; ++i) in[d * n + i] = float(1000 * r + 100 * d + i);
  if (async_)
    c.all_to_all_async(in.data(), out.data(), n).wait();
  else
    c.all_to_all(in.data(), out.data(), n);
  for (int s = 0; s < P; ++s)
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out[s * n + i], float(1000 * s + 100 * r + i));
  expect_stats(c, 1, n * P * 4);
}

TEST_P(Collective, AllToAllV) {
  Communicator c = make_comm(split_);
  const int P = c.size(), r = c.rank();
  auto cnt = [](int s, int d) { return int64_t((s + 2 * d) % 3); };  // 0, 1 or 2 elements
  // Send blocks separated by one unused element, receive blocks by two.
  std::vector<int64_t> sc(P), sd(P), rc(P), rd(P);
  int64_t soff = 0, roff = 0, sent = 0;
  for (int p = 0; p < P; ++p) {
    sc[p] = cnt(r, p), sd[p] = soff, soff += sc[p] + 1, sent += sc[p];
    rc[p] = cnt(p, r), rd[p] = roff, roff += rc[p] + 2;
  }
  std::vector<float> in(soff, -7.f), out(roff, -1.f);
  for (int d = 0; d < P; ++d)
    for (int64_t i = 0; i < sc[d]; ++i) in[sd[d] + i] = float(1000 * r + 100 * d + i);
  if (async_)
    c.all_to_allv_async(in.data(), sc, sd, out.data(), rc, rd).wait();
  else
    c.all_to_allv(in.data(), sc, sd, out.data(), rc, rd);
  std::vector<float> want(roff, -1.f);
  for (int s = 0; s < P; ++s)
    for (int64_t i = 0; i < rc[s]; ++i) want[rd[s] + i] = float(1000 * s + 100 * r + i);
  EXPECT_EQ(out, want);
  expect_stats(c, 1, sent * 4);
}

TEST_P(Collective, Broadcast) {
  Communicator c = make_comm(split_);
  const int P = c.size(), r = c.rank(), root = P - 1;
  const int64_t n = 8;
  std::vector<float> buf(n, -1.f);
  if (r == root)
    for (int64_t i = 0; i < n; ++i) buf[i] = float(1000 * root + i);
  if (async_)
    c.broadcast_async(buf.data(), n, root).wait();
  else
    c.broadcast(buf.data(), n, root);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(buf[i], float(1000 * root + i));
  expect_stats(c, 1, n * 4);
}

TEST_P(Collective, AllReduce) {
  Communicator c = make_comm(split_);
  const int P = c.size(), r = c.rank();
  const int64_t n = 10;
  std::vector<float> buf(n);
  for (int64_t i = 0; i < n; ++i) buf[i] = float(1000 * r + i);
  if (async_)
    c.all_reduce_async(buf.data(), n).wait();
  else
    c.all_reduce(buf.data(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(buf[i], float(1000 * P * (P - 1) / 2 + P * i));
  expect_stats(c, 1, n * 4);
}

// Neighbours exchange in a ring: to rank+1, from rank-1 (to self on a size-1 communicator,
// non-blocking only). Point-to-point is always counted: send = message bytes, recv = 0.
TEST_P(Collective, SendRecvRing) {
  Communicator c = make_comm(split_);
  const int P = c.size(), r = c.rank();
  const int to = (r + 1) % P, from = (r + P - 1) % P, tag = 7;
  const int64_t n = 6;
  std::vector<float> out(n), in(n, -1.f);
  for (int64_t i = 0; i < n; ++i) out[i] = float(1000 * r + i);
  if (async_) {
    Request rq = c.irecv(in.data(), n, from, tag);
    Request sq = c.isend(out.data(), n, to, tag);
    while (!(rq.test() & sq.test())) {
    }
    EXPECT_TRUE(rq.done() && sq.done());
  } else {
    if (P == 1) GTEST_SKIP() << "blocking send to self";
    if (r % 2 == 0) {
      c.send(out.data(), n, to, tag);
      c.recv(in.data(), n, from, tag);
    } else {
      c.recv(in.data(), n, from, tag);
      c.send(out.data(), n, to, tag);
    }
  }
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(in[i], float(1000 * from + i));
  EXPECT_EQ(c.stats().calls, 2);
  EXPECT_EQ(c.stats().bytes, n * 4);
}

std::string param_name(const ::testing::TestParamInfo<Collective::ParamType>& p) {
  return std::string(std::get<0>(p.param) ? "split" : "world") +
         (std::get<1>(p.param) ? "_async" : "_blocking") +
         (std::get<2>(p.param) == kDefaultChunk ? ""
                                                : "_chunk" + std::to_string(std::get<2>(p.param)));
}

INSTANTIATE_TEST_SUITE_P(Comm, Collective,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(kDefaultChunk, int64_t(3))),
                         param_name);

// Several operations accumulate: calls and bytes add up.
TEST(CommunicatorStats, Accumulate) {
  Communicator c = make_comm(false);
  const int P = c.size();
  std::vector<float> a(6 * P, 1.f), b(6 * P);
  c.all_gather(a.data(), b.data(), 6);
  c.reduce_scatter(b.data(), a.data(), 6);
  c.all_to_all_async(a.data(), b.data(), 6).wait();
  EXPECT_EQ(c.stats().calls, 3);
  EXPECT_EQ(c.stats().bytes, 6 * 4 + 6 * P * 4 + 6 * P * 4);
}

// The typed forms move what the tensors say: bf16 gathers move the bits (2 bytes each), bf16
// reduce-scatters and all-reduces sum in fp32 pairwise and round (exact here: small integers);
// every operation's bytes are also counted by kind.
TEST(CommunicatorTyped, Bf16FormsAndBytesByKind) {
  Communicator c = make_comm(false);
  const int P = c.size(), r = c.rank();
  const int64_t n = 5;
  std::vector<uint16_t> in(n), out(n * P, 0);
  for (int64_t i = 0; i < n; ++i) in[size_t(i)] = half::to_bf16(float(10 * r + i));
  c.all_gather_async(view_of(in.data(), DType::bf16, Shape{n}),
                     view_of(out.data(), DType::bf16, Shape{n * P})).wait();
  for (int s = 0; s < P; ++s)
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(half::from_bf16(out[size_t(s * n + i)]), float(10 * s + i));
  std::vector<uint16_t> piece(n, 0);
  c.reduce_scatter_async(view_of(out.data(), DType::bf16, Shape{n * P}),
                         view_of(piece.data(), DType::bf16, Shape{n})).wait();
  for (int64_t i = 0; i < n; ++i)  // every rank contributed the same gathered vector
    EXPECT_EQ(half::from_bf16(piece[size_t(i)]), float(P * (10 * r + i)));
  c.all_reduce_async(view_of(piece.data(), DType::bf16, Shape{n})).wait();
  float sum_r = 0;
  for (int s = 0; s < P; ++s) sum_r += float(P * (10 * s));
  EXPECT_EQ(half::from_bf16(piece[0]), sum_r);
  const auto& k = c.stats().kind_bytes;
  EXPECT_EQ(k[int(CommKind::all_gather)], n * 2);
  EXPECT_EQ(k[int(CommKind::reduce_scatter)], n * P * 2);
  EXPECT_EQ(k[int(CommKind::all_reduce)], n * 2);
  EXPECT_EQ(c.stats().bytes, n * 2 + n * P * 2 + n * 2);
  std::vector<int32_t> ints(size_t(n * P));
  EXPECT_THROW(c.all_gather_async(view_of(ints.data(), Shape{n}),
                                  view_of(ints.data(), DType::bf16, Shape{n * P})),
               std::logic_error);  // dtypes differ
  EXPECT_THROW(c.reduce_scatter_async(view_of(ints.data(), Shape{n * P}), view_of(ints.data(), Shape{n})),
               std::logic_error);  // no integer sum
}

// Device tensors (Space::cuda; here host memory that says so, as the emulated GPU's does):
// refused without attach_device; with a link whose collectives are MPI (nccl = false),
// point-to-point and all-to-all go through host staging with the link's copy (a receive
// reaches the tensor only at its test()/wait()), collectives run on the memory as it is, a
// group of one copies locally, and a split group inherits the link.
TEST(CommunicatorDevice, StagedPointToPointAllToAllAndLocalCopies) {
  Communicator c = make_comm(false);
  const int P = c.size(), r = c.rank();
  const int64_t n = 6;
  std::vector<float> mine(n), got(n, -1.0f);
  for (int64_t i = 0; i < n; ++i) mine[size_t(i)] = float(100 * r + i);
  const Tensor dmine = view_of(mine.data(), Shape{n}, Space::cuda);
  const Tensor dgot = view_of(got.data(), Shape{n}, Space::cuda);
  EXPECT_THROW(c.isend(dmine, (r + 1) % P, 3), std::logic_error);  // no device attached
  EXPECT_THROW(c.all_reduce(dmine), std::logic_error);
  int to_host = 0, to_device = 0, local = 0;
  DeviceLink link;
  link.copy = [&](const Tensor& src, const Tensor& dst, int64_t k) {
    (src.space == dst.space ? local : dst.space == Space::host ? to_host : to_device) += 1;
    std::memmove(dst.data, src.data, size_t(k) * dtype_size(src.dtype));
  };
  link.nccl = false;
  c.attach_device(link);
  EXPECT_TRUE(c.device_attached());
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  Request in = c.irecv(dgot, prev, 3);
  Request out = c.isend(dmine, next, 3);
  EXPECT_EQ(to_host, 1);  // the send staged its tensor at once
  out.wait();
  c.barrier();            // every message has been sent...
  EXPECT_EQ(got[0], -1.0f);  // ...but reaches the device tensor only at wait()
  in.wait();
  EXPECT_EQ(to_device, 1);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got[size_t(i)], float(100 * prev + i));
  EXPECT_EQ(c.stats().kind_bytes[int(CommKind::p2p)], n * 4);

  std::vector<float> a(size_t(n * P)), b(size_t(n * P));
  for (int64_t j = 0; j < n * P; ++j) a[size_t(j)] = float(1000 * r + j);
  c.all_to_all(view_of(a.data(), Shape{n * P}, Space::cuda), view_of(b.data(), Shape{n * P}, Space::cuda));
  for (int s = 0; s < P; ++s)  // block s came from rank s, its block r
    EXPECT_EQ(b[size_t(s * n)], float(1000 * s + r * n)) << s;
  EXPECT_EQ(to_host, 2);
  EXPECT_EQ(to_device, 2);

  c.all_reduce(dmine, ReduceOp::max);  // MPI on the memory as it is: no staging
  EXPECT_EQ(mine[0], float(100 * (P - 1)));
  EXPECT_EQ(to_host, 2);

  Communicator half = c.split(r % 2, r, "half");  // inherits the link
  EXPECT_TRUE(half.device_attached());
  Communicator self = c.split(r, 0, "self");
  std::vector<float> piece(n, 0.0f);
  self.reduce_scatter(dmine, view_of(piece.data(), Shape{n}, Space::cuda));
  EXPECT_EQ(piece[0], mine[0]);
  EXPECT_EQ(local, 1);  // a group of one copies locally, device to device
  EXPECT_EQ(self.stats().calls, 0);
}

TEST(CommunicatorErrors, RejectsBadArguments) {
  Communicator c = make_comm(false);
  const int64_t big = int64_t(INT_MAX) + 1;  // checked before any buffer is touched
  EXPECT_THROW(c.all_gather_async(nullptr, nullptr, big), std::logic_error);
  EXPECT_THROW(c.reduce_scatter_async(nullptr, nullptr, big), std::logic_error);
  EXPECT_THROW(c.all_to_all_async(nullptr, nullptr, big), std::logic_error);
  EXPECT_THROW(c.isend(nullptr, big, 0, 0), std::logic_error);
  EXPECT_THROW(c.isend(nullptr, 1, c.size(), 0), std::logic_error);
  EXPECT_THROW(c.broadcast(static_cast<float*>(nullptr), 1, -1), std::logic_error);
  EXPECT_THROW(c.all_gather(nullptr, nullptr, -1), std::logic_error);
  std::vector<int64_t> wrong(c.size() + 1, 0), ok(c.size(), 0), huge(c.size(), big);
  EXPECT_THROW(c.all_to_allv(nullptr, wrong, ok, nullptr, ok, ok), std::logic_error);
  EXPECT_THROW(c.all_to_allv_async(nullptr, huge, ok, nullptr, ok, ok), std::logic_error);
  EXPECT_THROW(Communicator::set_chunk_limit(0), std::logic_error);
  EXPECT_EQ(c.stats().calls, 0);
}

// A non-blocking all-reduce posted before a compute loop that polls test() between slices
// of work. How many polls it took shows how much MPI progressed it in the background
// (informative only: Open MPI progresses it inside test(), so the count depends on the
// machine and the oversubscription).
TEST(CommunicatorProgress, AllReduceOverlapsCompute) {
  Communicator c = make_comm(false);
  const int P = c.size();
  const int64_t n = int64_t(1) << 18;
  std::vector<float> buf(n, 1.f);
  std::vector<float> work(1 << 14, 0.5f);
  const auto t0 = std::chrono::steady_clock::now();
  Request q = c.all_reduce_async(buf.data(), n);
  int64_t polls = 0;
  double sink = 0;
  while (!q.test()) {
    ++polls;
    for (float& w : work) w = std::sqrt(w * w + 1e-3f);  // a slice of "compute"
    sink += work[0];
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(q.done());
  EXPECT_EQ(buf[0], float(P));
  EXPECT_EQ(buf[n - 1], float(P));
  if (c.rank() == 0)
    std::printf(
        "[progress] iallreduce of %lld floats on %d ranks: %lld test() polls, %.2f ms (%g)\n",
        (long long)n, P, (long long)polls, ms, sink > 0 ? 1.0 : 0.0);
}

// MPI_TAG_UB, which the pipeline executor checks its tags against: at least 32767 (MPI
// guarantees it), the same on every rank and on a sub-communicator.
TEST(CommunicatorTags, MaxTagIsTheTagUpperBound) {
  Communicator c = make_comm(false);
  Communicator s = make_comm(true);
  const int ub = c.max_tag();
  EXPECT_GE(ub, 32767);
  EXPECT_EQ(s.max_tag(), ub);
  int lo = ub, hi = ub;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi);
  if (c.rank() == 0) std::printf("[tags] MPI_TAG_UB = %d\n", ub);
}

// With a trace attached, each counted collective (and barrier) is one span on the collective
// lane with its name, the group's name and the bytes counted; point-to-point calls are not
// collectives (the pipeline executor records its own), and nothing is recorded outside the
// traced steps or without a trace.
TEST(CommunicatorTrace, CollectivesAreSpans) {
  Communicator c = make_comm(false);
  const int P = c.size();
  Trace trace(1);
  c.set_trace(&trace);
  std::vector<float> a(4 * size_t(P), 1.f), b(4 * size_t(P));
  c.all_reduce(a.data(), 4);  // before the first step: not recorded
  EXPECT_TRUE(trace.events().empty());
  trace.begin_step(1);
  c.all_reduce(a.data(), 4);
  c.all_reduce_async(a.data(), 4).wait();
  c.reduce_scatter(a.data(), b.data(), 4);
  c.all_gather(a.data(), b.data(), 4);
  c.all_to_all(a.data(), b.data(), 1);
  c.broadcast(a.data(), 3, 0);
  c.barrier();
  const int next = (c.rank() + 1) % P, prev = (c.rank() + P - 1) % P;
  Request r = c.irecv(b.data(), 2, prev, 5);
  c.isend(a.data(), 2, next, 5).wait();
  r.wait();
  const std::vector<std::tuple<std::string, int64_t>> want = {
      {"all_reduce", 16}, {"all_reduce_async", 16}, {"reduce_scatter", 16 * P},
      {"all_gather", 16}, {"all_to_all", 4 * P},    {"broadcast", 12},
      {"barrier", 0}};
  ASSERT_EQ(trace.events().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const TraceEvent& e = trace.events()[i];
    EXPECT_EQ(e.name, std::get<0>(want[i]));
    EXPECT_EQ(e.bytes, std::get<1>(want[i])) << e.name;
    EXPECT_EQ(trace.names()[size_t(e.group)], "world");
    EXPECT_EQ(e.kind, TraceKind::collective);
    EXPECT_EQ(e.step, 1);
    EXPECT_LE(e.begin, e.end);
    if (i > 0) EXPECT_LE(trace.events()[i - 1].begin, e.begin);
  }
  trace.begin_step(2);  // past the one traced step
  c.all_reduce(a.data(), 4);
  c.set_trace(nullptr);
  trace.begin_step(1);
  c.all_reduce(a.data(), 4);
  EXPECT_EQ(trace.events().size(), want.size());
}

// The clock agreement recovers a known skew between ranks' clocks: rank r's test clock runs
// r * 1000 s ahead of rank 0's, so its offset is -r * 1000 s, to within a round trip.
double g_skew = 0;
double skewed_clock() {
  return Trace::steady_seconds() + g_skew;
}

TEST(ClockSync, RecoversASkewAndAgreesTheOrigin) {
  Communicator c = make_comm(false);
  g_skew = 1000.0 * c.rank();
  const ClockAgreement a = agree_clock(c, skewed_clock);
  EXPECT_NEAR(a.offset, -g_skew, 0.05);
  double o[2] = {a.origin, -a.origin};
  MPI_Allreduce(MPI_IN_PLACE, o, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(o[0], a.origin);  // the same origin on every rank
  EXPECT_EQ(-o[1], a.origin);
  // Ranks on one node share the monotonic clock: the offset is exactly 0.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  const ClockAgreement same = agree_clock(c, Trace::steady_seconds);
  if (node_size == c.size()) EXPECT_EQ(same.offset, 0.0);
}

}  // namespace
}  // namespace tessera
