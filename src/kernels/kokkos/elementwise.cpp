// Elementwise kernels, small reductions and the bias kernels.
#include "kernels/kokkos/kokkos.hpp"

namespace tessera::kernels::kokkos {

template <class E>
struct Elementwise {
  // The reduction body of the sums of squares: block blk of x[0, n).
  struct Squares {
    const float* x;
    int64_t n;
    KOKKOS_INLINE_FUNCTION void operator()(int64_t blk, double& acc) const {
      acc += block_sum<E>(blk, n, [&](int64_t i) { return double(x[i]) * x[i]; });
    }
  };

  static void fill(float* x, float value, int64_t n) {
    for_each<E>("fill", n, TESSERA_LAMBDA(E, (int64_t i) { x[i] = value; }));
  }

  static void copy(const float* x, float* y, int64_t n) {
    for_each<E>("copy", n, TESSERA_LAMBDA(E, (int64_t i) { y[i] = x[i]; }));
  }

  static void add_inplace(float* y, const float* x, int64_t n) {
    for_each<E>("add_inplace", n, TESSERA_LAMBDA(E, (int64_t i) { y[i] += x[i]; }));
  }

  static void scale_inplace(float* x, float alpha, int64_t n) {
    for_each<E>("scale_inplace", n, TESSERA_LAMBDA(E, (int64_t i) { x[i] *= alpha; }));
  }

  static double sum_squares(const float* x, int64_t n) {
    double s = 0;  // a host result: the call waits for the kernel
    Kokkos::parallel_reduce("sum_squares", range<E>(blocks<E>(n)), Squares{x, n}, s);
    return s;
  }

  // total[0] += sum x^2 without waiting: the sum goes to a scalar in the space's memory, then
  // one thread adds it.
  static void sum_squares_accumulate(const float* x, int64_t n, double* total) {
    double* part = scratch_scalar<E>();
    Kokkos::View<double, typename E::memory_space, Kokkos::MemoryUnmanaged> out(part);
    Kokkos::parallel_reduce("sum_squares_accumulate", range<E>(blocks<E>(n)), Squares{x, n}, out);
    Kokkos::parallel_for("sum_squares_accumulate_add", range<E>(1),
                         TESSERA_LAMBDA(E, (int64_t) { *total += *part; }));
  }

  static void bias_add(float* y, const float* b, int64_t N, int64_t C) {
    Kokkos::parallel_for(
        "bias_add", rows<E>(N), TESSERA_LAMBDA(E, (const Team<E>& team) {
          float* row = y + team.league_rank() * C;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](int64_t c) { row[c] += b[c]; });
        }));
  }

  static void copy_rows(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows_,
                        int64_t cols) {
    Kokkos::parallel_for(
        "copy_rows", rows<E>(rows_), TESSERA_LAMBDA(E, (const Team<E>& team) {
          const int64_t r = team.league_rank();
          const float* src = x + r * ldx;
          float* dst = y + r * ldy;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cols),
                               [&](int64_t c) { dst[c] = src[c]; });
        }));
  }

  // db[c] += sum over rows of dy[r, c]: parallel over blocks of columns, rows in order.
  static void bias_backward(const float* dy, float* db, int64_t N, int64_t C) {
    constexpr int64_t W = column_block<E>;
    Kokkos::parallel_for(
        "bias_backward", range<E>(column_blocks<E>(C)), TESSERA_LAMBDA(E, (int64_t blk) {
          const int64_t c0 = blk * W, w = C - c0 < W ? C - c0 : W;
          double acc[W] = {};
          for (int64_t r = 0; r < N; ++r)
            for_lanes<W>(w, [&](int64_t k) { acc[k] += dy[r * C + c0 + k]; });
          for (int64_t k = 0; k < w; ++k) db[c0 + k] += float(acc[k]);
        }));
  }

  static void fill(Backend& b) {
    b.fill = fill;
    b.copy = copy;
    b.add_inplace = add_inplace;
    b.scale_inplace = scale_inplace;
    b.sum_squares = sum_squares;
    b.sum_squares_accumulate = sum_squares_accumulate;
    b.bias_add = bias_add;
    b.copy_rows = copy_rows;
    b.bias_backward = bias_backward;
  }
};

void register_elementwise(Backend& b, Target t) {
  register_for<Elementwise>(b, t);
}

}  // namespace tessera::kernels::kokkos
