// The MLP's fused epilogues (doc/kokkos.md, "Fused epilogues"): what runs between the GEMMs of
// an MLP in one pass over its hidden tensors instead of three or four. Forward: the bias
// added to the GEMM's output (kept, as the pre-activation), the activation, and its 16-bit
// copy for the next GEMM. Backward: the activation's gradient, its 16-bit copy for the
// weight- and input-gradient GEMMs, and the bias gradient's column sums.
//
// Each computes what the unfused kernels compute, in the same order: bias_add's float sum,
// activation.hpp's functions, kernels::cast's rounding, and bias_backward's column sums (per
// column, in double, over the rows in row order by one thread, then added to db as a float), so
// an fp32 run gives the same bits, and a 16-bit copy is the cast of the fp32 value.
#include "kernels/kokkos/activation.hpp"

namespace tessera::kernels::kokkos {
namespace {

// fn(store) for the optional outputs: an f32 array or nothing; a bf16 / f16 array or nothing.
template <class Fn>
void with_f32(float* y, const Fn& fn) {
  if (y) return fn(StoreF32{y});
  fn(StoreNone{});
}
template <class Fn>
void with_half(uint16_t* y, bool f16, const Fn& fn) {
  if (!y) return fn(StoreNone{});
  if (f16) return fn(StoreF16{y});
  fn(StoreBf16{y});
}
// A store of the same kind as s, into y (a second output written alike).
inline StoreNone same_store(StoreNone, const void*) { return {}; }
inline StoreF32 same_store(StoreF32, float* y) { return {y}; }
inline StoreBf16 same_store(StoreBf16, uint16_t* y) { return {y}; }
inline StoreF16 same_store(StoreF16, uint16_t* y) { return {y}; }

}  // namespace

// f(i, c) for every element i = r C + c of an [N, C] matrix: on a GPU one element a thread; on
// the host pieces of whole rows (about 4096 elements) from a local copy of f, the inner loop
// over the columns vectorised (as for_each).
template <class F>
struct WithColumn {
  F f;
  int64_t C;
  KOKKOS_INLINE_FUNCTION void operator()(int64_t i) const { f(i, i % C); }
};
template <class Exec, class F>
void for_each_cell(const char* name, int64_t N, int64_t C, const F& f) {
  if constexpr (lanes<Exec> == 1) {
    Kokkos::parallel_for(name, range<Exec>(N * C), WithColumn<F>{f, C});
  } else {
    const int64_t per = C >= 4096 ? 1 : 4096 / C;  // rows of a piece
    Kokkos::parallel_for(name, range<Exec>((N + per - 1) / per), [=](int64_t p) {
      const F g = f;
      const int64_t r1 = N - p * per < per ? N : (p + 1) * per;
      for (int64_t r = p * per; r < r1; ++r) {
        const int64_t i0 = r * C;
#pragma GCC ivdep
        for (int64_t c = 0; c < C; ++c) g(i0 + c, c);
      }
    });
  }
}

// f(i, k) for every element i of the columns [c0, c0 + w) of an [N, C] matrix, k = i's column
// - c0, by one thread per block of column_block columns, row after row: the traversal of
// bias_backward, so sums over k in it are bias_backward's sums. After the rows,
// done(c0, w) (the block's columns).
template <class Exec, class F, class Done>
void for_each_column_block(const char* name, int64_t N, int64_t C, const F& f, const Done& done) {
  Kokkos::parallel_for(
      name, range<Exec>(column_blocks<Exec>(C)), TESSERA_LAMBDA(Exec, (int64_t blk) {
        constexpr int64_t W = column_block<Exec>;
        const int64_t c0 = blk * W, w = C - c0 < W ? C - c0 : W;
        auto acc = f.start();
        for (int64_t r = 0; r < N; ++r) {
          const int64_t i0 = r * C + c0;
          for_lanes<W>(w, [&](int64_t k) { f(acc, i0 + k, k); });
        }
        done(acc, c0, w);
      }));
}

template <class E>
struct Epilogue {
  static constexpr int64_t W = column_block<E>;
  // Per-column double sums of one or two gradients over a column block.
  struct Sums1 {
    double d[W];
  };
  struct Sums2 {
    double a[W], b[W];
  };

  // ---- forward ----------------------------------------------------------------------------

  template <bool Bias, class Full, class Half>
  static void gelu_fwd(float* pre, const float* bias, Full full, Half half, int64_t N,
                       int64_t C) {
    for_each_cell<E>(
        "gelu_bias_forward", N, C, TESSERA_LAMBDA(E, (int64_t i, int64_t c) {
          float v = pre[i];
          if (Bias) {  // a constant: one branch compiled (no if constexpr: nvcc's lambdas)
            v += bias[c];
            pre[i] = v;
          }
          const float y = gelu_value(v);
          full(i, y);
          half(i, y);
        }));
  }

  static void gelu_bias_forward(float* pre, const float* bias, float* act, uint16_t* act16,
                                bool f16, int64_t N, int64_t C) {
    with_f32(act, [&](auto full) {
      with_half(act16, f16, [&](auto half) {
        if (bias) gelu_fwd<true>(pre, bias, full, half, N, C);
        else gelu_fwd<false>(pre, bias, full, half, N, C);
      });
    });
  }

  template <bool Bias, class Full, class Half>
  static void swiglu_fwd(float* gate, float* up, const float* gate_bias, const float* up_bias,
                         Full full, Half half, int64_t N, int64_t C) {
    for_each_cell<E>(
        "swiglu_bias_forward", N, C, TESSERA_LAMBDA(E, (int64_t i, int64_t c) {
          float g = gate[i], u = up[i];
          if (Bias) {  // a constant: one branch compiled (no if constexpr: nvcc's lambdas)
            g += gate_bias[c];
            u += up_bias[c];
            gate[i] = g;
            up[i] = u;
          }
          const float y = swiglu_value(g, u);
          full(i, y);
          half(i, y);
        }));
  }

  static void swiglu_bias_forward(float* gate, float* up, const float* gate_bias,
                                  const float* up_bias, float* act, uint16_t* act16, bool f16,
                                  int64_t N, int64_t C) {
    with_f32(act, [&](auto full) {
      with_half(act16, f16, [&](auto half) {
        if (gate_bias) swiglu_fwd<true>(gate, up, gate_bias, up_bias, full, half, N, C);
        else swiglu_fwd<false>(gate, up, gate_bias, up_bias, full, half, N, C);
      });
    });
  }

  // ---- backward ---------------------------------------------------------------------------

  template <class Full, class Half>
  struct GeluGrad {
    const float *dact, *pre;
    Full full;
    Half half;
    KOKKOS_INLINE_FUNCTION Sums1 start() const { return Sums1{}; }
    KOKKOS_INLINE_FUNCTION float operator()(int64_t i) const {
      const float d = dact[i] * gelu_slope(pre[i]);
      full(i, d);
      half(i, d);
      return d;
    }
    KOKKOS_INLINE_FUNCTION void operator()(Sums1& s, int64_t i, int64_t k) const {
      s.d[k] += (*this)(i);
    }
  };
  struct AddSums1 {
    float* db;
    KOKKOS_INLINE_FUNCTION void operator()(const Sums1& s, int64_t c0, int64_t w) const {
      for (int64_t k = 0; k < w; ++k) db[c0 + k] += float(s.d[k]);
    }
  };

  template <class Full, class Half>
  static void gelu_bwd(const float* dact, const float* pre, Full full, Half half, float* dbias,
                       int64_t N, int64_t C) {
    const GeluGrad<Full, Half> g{dact, pre, full, half};
    if (dbias)
      return for_each_column_block<E>("gelu_bias_backward", N, C, g, AddSums1{dbias});
    for_each<E>("gelu_bias_backward", N * C, TESSERA_LAMBDA(E, (int64_t i) { g(i); }));
  }

  static void gelu_bias_backward(const float* dact, const float* pre, float* dpre,
                                 uint16_t* dpre16, bool f16, float* dbias, int64_t N, int64_t C) {
    with_f32(dpre, [&](auto full) {
      with_half(dpre16, f16, [&](auto half) { gelu_bwd(dact, pre, full, half, dbias, N, C); });
    });
  }

  template <class Full, class Half>
  struct SwigluGrads {
    const float *dact, *gate, *up;
    Full full_gate, full_up;
    Half half_gate, half_up;
    KOKKOS_INLINE_FUNCTION Sums2 start() const { return Sums2{}; }
    KOKKOS_INLINE_FUNCTION SwigluGrad operator()(int64_t i) const {
      const SwigluGrad g = swiglu_grad(dact[i], gate[i], up[i]);
      full_up(i, g.dup);
      full_gate(i, g.dgate);
      half_up(i, g.dup);
      half_gate(i, g.dgate);
      return g;
    }
    KOKKOS_INLINE_FUNCTION void operator()(Sums2& s, int64_t i, int64_t k) const {
      const SwigluGrad g = (*this)(i);
      s.a[k] += g.dgate;
      s.b[k] += g.dup;
    }
  };
  struct AddSums2 {
    float *dgate_bias, *dup_bias;
    KOKKOS_INLINE_FUNCTION void operator()(const Sums2& s, int64_t c0, int64_t w) const {
      for (int64_t k = 0; k < w; ++k) dgate_bias[c0 + k] += float(s.a[k]);
      for (int64_t k = 0; k < w; ++k) dup_bias[c0 + k] += float(s.b[k]);
    }
  };

  template <class Full, class Half>
  static void swiglu_bwd(const float* dact, const float* gate, const float* up, Full full_gate,
                         Full full_up, Half half_gate, Half half_up, float* dgate_bias,
                         float* dup_bias, int64_t N, int64_t C) {
    const SwigluGrads<Full, Half> g{dact, gate, up, full_gate, full_up, half_gate, half_up};
    if (dgate_bias)
      return for_each_column_block<E>("swiglu_bias_backward", N, C, g,
                                      AddSums2{dgate_bias, dup_bias});
    for_each<E>("swiglu_bias_backward", N * C, TESSERA_LAMBDA(E, (int64_t i) { g(i); }));
  }

  static void swiglu_bias_backward(const float* dact, const float* gate, const float* up,
                                   float* dgate, float* dup, uint16_t* dgate16, uint16_t* dup16,
                                   bool f16, float* dgate_bias, float* dup_bias, int64_t N,
                                   int64_t C) {
    // dgate and dup are both given or both not (kernels.cpp checks), as are the 16-bit pair.
    with_f32(dgate, [&](auto full_gate) {
      const auto full_up = same_store(full_gate, dup);
      with_half(dgate16, f16, [&](auto half_gate) {
        const auto half_up = same_store(half_gate, dup16);
        swiglu_bwd(dact, gate, up, full_gate, full_up, half_gate, half_up, dgate_bias, dup_bias,
                   N, C);
      });
    });
  }

  static void fill(Backend& b) {
    b.gelu_bias_forward = gelu_bias_forward;
    b.swiglu_bias_forward = swiglu_bias_forward;
    b.gelu_bias_backward = gelu_bias_backward;
    b.swiglu_bias_backward = swiglu_bias_backward;
  }
};

void register_epilogue(Backend& b, Target t) {
  register_for<Epilogue>(b, t);
}

}  // namespace tessera::kernels::kokkos
