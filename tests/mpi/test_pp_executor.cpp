// The pipeline executor runs every schedule the generator allows on the world as a pipeline
// (one stage per rank), with a stand-in for the model whose messages say who sent them: each
// forward checks that its input is the previous model chunk's output of the same
// micro-batch, each backward that its output gradient is the next chunk's input gradient.
// Every shape with p = NP, m <= 8, v <= 3 runs to the end (a deadlock is a ctest timeout),
// every (micro-batch, chunk) runs one forward and one backward (split kinds: one
// backward_input, then one backward_weight), and a stage never holds more activation slots
// than peak_activations_formula. The V kinds' turn (no message) passes the same values.
#include <gtest/gtest.h>
#include <mpi.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "parallel/pp/executor.hpp"

namespace tessera {
namespace {

constexpr int64_t kMessage = 7;

float value(int micro, int model_chunk, int64_t j) { return float(micro * 1000 + model_chunk * 10) + float(j); }

struct Probe : pp::StageWork {
  pp::ScheduleShape shape;
  int stage;
  std::vector<float> out = std::vector<float>(kMessage);
  std::vector<int> forwards, backwards, weights;  // per (micro, chunk)
  int bad = 0;
  Probe(const pp::ScheduleShape& s, int st)
      : shape(s),
        stage(st),
        forwards(size_t(s.micro_batches * s.chunks)),
        backwards(forwards),
        weights(forwards) {}
  // Counts a received message without the message's shape, or an input where none is due.
  bool wrong_input(const Tensor& x, bool expected) const {
    if (!expected) return x.data != nullptr;
    return x.dtype != DType::f32 || !(x.shape == Shape{kMessage});
  }
  Tensor forward(int micro, int chunk, int, const Tensor& x) override {
    const int c = shape.model_chunk(stage, chunk);
    ++forwards[size_t(micro * shape.chunks + chunk)];
    bad += wrong_input(x, c > 0);
    if (c > 0)
      for (int64_t j = 0; j < kMessage; ++j) bad += x.f32()[j] != value(micro, c, j);
    for (int64_t j = 0; j < kMessage; ++j) out[size_t(j)] = value(micro, c + 1, j);
    return c == shape.model_chunks() - 1 ? Tensor{} : view_of(out.data(), {kMessage});
  }
  Tensor backward(int micro, int chunk, int, const Tensor& dy) override {
    const int c = shape.model_chunk(stage, chunk);
    const size_t i = size_t(micro * shape.chunks + chunk);
    bad += forwards[i] != backwards[i] + 1;  // its forward ran before, once
    ++backwards[i];
    bad += wrong_input(dy, c < shape.model_chunks() - 1);
    if (c < shape.model_chunks() - 1)
      for (int64_t j = 0; j < kMessage; ++j) bad += dy.f32()[j] != -value(micro, c + 1, j);
    for (int64_t j = 0; j < kMessage; ++j) out[size_t(j)] = -value(micro, c, j);
    return c == 0 ? Tensor{} : view_of(out.data(), {kMessage});
  }
  Tensor backward_input(int micro, int chunk, int slot, const Tensor& dy) override {
    bad += !shape.split_backward();
    return backward(micro, chunk, slot, dy);
  }
  void backward_weight(int micro, int chunk) override {
    const size_t i = size_t(micro * shape.chunks + chunk);
    bad += !shape.split_backward() || backwards[i] != weights[i] + 1;  // after its B, once
    ++weights[i];
  }
};

// Every shape the generator accepts with p stages, m <= 8 micro-batches, v <= vmax chunks.
std::vector<pp::ScheduleShape> valid_shapes(int p, int vmax) {
  std::vector<pp::ScheduleShape> out;
  for (PipeSchedule kind : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b,
                            PipeSchedule::interleaved, PipeSchedule::zb_h1, PipeSchedule::zb_v,
                            PipeSchedule::dualpipe_v})
    for (int v = 1; v <= vmax; ++v)
      for (int m = 1; m <= 8; ++m) {
        const pp::ScheduleShape shape{p, m, v, kind};
        try {
          pp::require_valid(shape);
        } catch (const Error&) {
          continue;
        }
        out.push_back(shape);
      }
  return out;
}

TEST(PipelineExecutor, EveryScheduleRunsAndMovesTheRightMessages) {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  Communicator pp(dup, "pp");
  Allocator alloc;
  const int p = pp.size();
  const std::vector<pp::ScheduleShape> shapes = valid_shapes(p, 3);
  for (const pp::ScheduleShape& shape : shapes) {
    pp::Executor exec(pp, shape, Shape{kMessage}, alloc);
    Probe probe(shape, pp.rank());
    for (int step = 0; step < 2; ++step) exec.run(probe);  // buffers reused
    SCOPED_TRACE(std::string(to_string(shape.kind)) + " m=" +
                 std::to_string(shape.micro_batches) + " v=" + std::to_string(shape.chunks));
    EXPECT_EQ(probe.bad, 0);
    for (size_t i = 0; i < probe.forwards.size(); ++i) {
      EXPECT_EQ(probe.forwards[i], 2);
      EXPECT_EQ(probe.backwards[i], 2);
      EXPECT_EQ(probe.weights[i], shape.split_backward() ? 2 : 0);
    }
    EXPECT_LE(exec.peak_slots(), pp::peak_activations_formula(shape, pp.rank()));
    EXPECT_EQ(exec.peak_in_flight(), pp::peak_activations_formula(shape, pp.rank()));
    EXPECT_GE(exec.total_wait(), 0.0);
  }
  EXPECT_GT(shapes.size(), 10u);
}

// With tensor parallelism: the world as tp pairs x a pipeline of size/2 stages. Every
// forward and backward runs a blocking all-reduce in its tp pair (as a TP block does) while
// the pipeline's messages are in flight; the two groups must not block each other.
struct TpProbe : Probe {
  Communicator& tp;
  int tp_bad = 0;
  TpProbe(const pp::ScheduleShape& s, int st, Communicator& t) : Probe(s, st), tp(t) {}
  void check_tp(int micro, int chunk) {
    double x[2] = {double(micro * 100 + chunk), 1.0};
    tp.all_reduce(x, 2);
    tp_bad += x[0] != double(tp.size() * (micro * 100 + chunk)) || x[1] != double(tp.size());
  }
  Tensor forward(int micro, int chunk, int slot, const Tensor& x) override {
    check_tp(micro, chunk);
    return Probe::forward(micro, chunk, slot, x);
  }
  Tensor backward(int micro, int chunk, int slot, const Tensor& dy) override {
    check_tp(micro, chunk);
    return Probe::backward(micro, chunk, slot, dy);
  }
};

TEST(PipelineExecutor, EveryScheduleRunsBesideTensorParallelCollectives) {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  Communicator world(dup, "world");
  if (world.size() < 4 || world.size() % 2 != 0) GTEST_SKIP() << "needs an even number >= 4 of ranks";
  Communicator tp = world.split(world.rank() / 2, world.rank() % 2, "tp");
  Communicator pp = world.split(world.rank() % 2, world.rank() / 2, "pp");
  Allocator alloc;
  const std::vector<pp::ScheduleShape> shapes = valid_shapes(pp.size(), 2);
  for (const pp::ScheduleShape& shape : shapes) {
    pp::Executor exec(pp, shape, Shape{kMessage}, alloc);
    TpProbe probe(shape, pp.rank(), tp);
    exec.run(probe);
    SCOPED_TRACE(std::string(to_string(shape.kind)) + " m=" +
                 std::to_string(shape.micro_batches) + " v=" + std::to_string(shape.chunks));
    EXPECT_EQ(probe.bad, 0);
    EXPECT_EQ(probe.tp_bad, 0);
    for (size_t i = 0; i < probe.forwards.size(); ++i) EXPECT_EQ(probe.backwards[i], 1);
  }
  EXPECT_GT(shapes.size(), 5u);
}

// DualPipe's pairs grouped (Executor::run_pair): a stage that interleaves gets each pair's two
// calls after both their messages arrived and sends after both ran; here the stand-in runs
// the backward_input first, which only a grouped executor allows, with an output buffer per
// pass (an interleaving stage's outputs must outlive the other pass). Every dualpipev shape
// with p = NP runs to the end with the right messages, every pair through run_pair.
struct PairProbe : Probe {
  std::vector<float> out_b = std::vector<float>(kMessage);
  int64_t pairs = 0;
  using Probe::Probe;
  bool interleaves() const override { return true; }
  void run_pair(const std::function<void()>& forward,
                const std::function<void()>& backward_input) override {
    ++pairs;
    backward_input();
    std::swap(out, out_b);  // the backward's output stays where it is, now out_b's
    forward();
  }
};

TEST(PipelineExecutor, DualPipeVPairsRunGrouped) {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  Communicator pp(dup, "pp");
  const int p = pp.size();
  if (2 * p > 8) GTEST_SKIP() << "dualpipev needs m >= 2p, and m <= 8 here";
  Allocator alloc;
  int shapes = 0;
  for (int m = 2 * p; m <= 8; ++m) {
    const pp::ScheduleShape shape{p, m, 2, PipeSchedule::dualpipe_v};
    pp::Executor exec(pp, shape, Shape{kMessage}, alloc);
    PairProbe probe(shape, pp.rank());
    for (int step = 0; step < 2; ++step) exec.run(probe);
    SCOPED_TRACE("dualpipev m=" + std::to_string(m));
    EXPECT_EQ(probe.bad, 0);
    for (size_t i = 0; i < probe.forwards.size(); ++i) {
      EXPECT_EQ(probe.forwards[i], 2);
      EXPECT_EQ(probe.weights[i], 2);
    }
    EXPECT_EQ(probe.pairs, 2 * exec.paired_ops());
    EXPECT_EQ(exec.pairs_run(), 2 * exec.paired_ops());
    EXPECT_EQ(exec.paired_ops(), 2 * (m - 2 * p + pp.rank() + 1) + (p - pp.rank() - 1));
    EXPECT_GT(exec.total_paired().received, 0);
    ++shapes;
  }
  EXPECT_GT(shapes, 0);
}

}  // namespace
}  // namespace tessera
