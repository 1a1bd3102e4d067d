// WeightGrads: the weight-gradient GEMMs a split backward's B queues and its W runs
// (model/weight_grads.hpp). Each queued GEMM gives the bits the GEMM gives when run at once,
// runs once, part by part; a set is reused without allocating; a set released with a GEMM
// not run is an error.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "model/weight_grads.hpp"

namespace tessera {
namespace {

Buffer filled(Allocator& alloc, int64_t n, float seed) {
  Buffer b(alloc, Shape{n}, DType::f32, Charge::workspace);
  for (int64_t i = 0; i < n; ++i) b.f32()[i] = seed + 0.01f * float((i * 7) % 13) - 0.05f;
  return b;
}

TEST(WeightGrads, QueuedGemmsAreTheGemmsRunAtOnce) {
  Allocator alloc;
  const int64_t n = 5, out = 3, in = 4;
  Buffer dy = filled(alloc, n * out, 0.3f), x = filled(alloc, n * in, -0.2f);
  Buffer direct = filled(alloc, out * in, 0.1f), queued = filled(alloc, out * in, 0.1f);
  Buffer other = filled(alloc, out * in, 0.0f);
  kernels::matmul(dy.view(), x.view(), direct.view(), out, in, n, true, false, 1.0f, 1.0f);
  const Tensor queued_grad = queued.view(), other_grad = other.view();
  WeightGrads w;
  for (int round = 0; round < 2; ++round) {
    const int set = w.open();
    EXPECT_EQ(set, 0);
    w.set_part(2);
    w.add(alloc, dy.view(), x.view(), &queued_grad, n, out, in);
    w.set_part(1);
    w.add(alloc, dy.view(), x.view(), &other_grad, n, out, in);
    w.close();
    // The operands may change before W: the set holds copies.
    for (int64_t i = 0; i < n * out; ++i) dy.f32()[i] += 1.0f;
    const int64_t bytes = w.bytes();
    // The copies are charged to activations; the second round reuses the first's.
    EXPECT_EQ(int64_t(alloc.live(Charge::activations)), bytes);
    w.run(set, 2);
    if (round == 0) {
      for (int64_t i = 0; i < out * in; ++i) EXPECT_EQ(queued.f32()[i], direct.f32()[i]) << i;
      EXPECT_THROW(w.release(set), Error);  // part 1's GEMM has not run
    }
    w.run(set, 1);
    w.release(set);
    EXPECT_EQ(w.bytes(), bytes);
    for (int64_t i = 0; i < n * out; ++i) dy.f32()[i] -= 1.0f;
    if (round == 0)
      kernels::matmul(dy.view(), x.view(), direct.view(), out, in, n, true, false, 1.0f, 1.0f);
  }
  EXPECT_EQ(w.sets(), 1);
  EXPECT_EQ(w.bytes(), int64_t(2 * (n * out + n * in) * sizeof(float)));
  // The second round added its GEMM once more, as the direct one did.
  for (int64_t i = 0; i < out * in; ++i) EXPECT_EQ(queued.f32()[i], direct.f32()[i]) << i;
}

// A mixture of experts' operands go into regions of the set (model/moe.cpp): each GEMM queued
// on rows of them gives the bits of the direct GEMM, and what the set holds is the regions'
// size, whatever rows the experts took.
TEST(WeightGrads, RegionsHoldTheRowsOfEveryExpert) {
  Allocator alloc;
  const int64_t rows = 8, out = 3, in = 4;
  Buffer dy = filled(alloc, rows * out, 0.3f), x = filled(alloc, rows * in, -0.2f);
  for (int64_t i = 0; i < rows * out; ++i) dy.f32()[i] += 0.01f * float(i);
  Buffer direct = filled(alloc, 2 * out * in, 0.1f), queued = filled(alloc, 2 * out * in, 0.1f);
  const Tensor grad[2] = {queued.view().slice(0, out * in),
                          queued.view().slice(out * in, out * in)};
  WeightGrads w;
  for (const int64_t first_rows : {int64_t(5), int64_t(2)}) {  // two routings of the 8 rows
    const int64_t counts[2] = {first_rows, rows - first_rows};
    const int set = w.open();
    w.set_part(1);
    const Tensor rdy = w.region(alloc, rows * out, DType::f32);
    const Tensor rx = w.region(alloc, rows * in, DType::f32);
    for (int e = 0, first = 0; e < 2; first += int(counts[e]), ++e) {
      const int64_t n = counts[e];
      w.into(rdy.slice(first * out, n * out), rx.slice(first * in, n * in));
      w.add(alloc, dy.view().slice(first * out, n * out), x.view().slice(first * in, n * in),
            &grad[e], n, out, in);
      kernels::matmul(dy.view().slice(first * out, n * out), x.view().slice(first * in, n * in),
                      direct.view().slice(e * out * in, out * in), out, in, n, true, false, 1.0f,
                      1.0f);
    }
    w.close();
    for (int64_t i = 0; i < rows * out; ++i) dy.f32()[i] += 1.0f;  // W reads the regions
    w.run(set, 1);
    w.release(set);
    for (int64_t i = 0; i < rows * out; ++i) dy.f32()[i] -= 1.0f;
    for (int64_t i = 0; i < 2 * out * in; ++i) EXPECT_EQ(queued.f32()[i], direct.f32()[i]) << i;
    EXPECT_EQ(w.bytes(), int64_t((rows * out + rows * in) * sizeof(float)));
  }
}

// Two B's before their W's take two sets; the first freed is the next taken.
TEST(WeightGrads, ABTakesTheLowestFreeSet) {
  WeightGrads w;
  EXPECT_EQ(w.open(), 0);
  w.close();
  EXPECT_EQ(w.open(), 1);
  w.close();
  w.release(0);
  EXPECT_EQ(w.open(), 0);
  w.close();
  EXPECT_EQ(w.sets(), 2);
}

}  // namespace
}  // namespace tessera
