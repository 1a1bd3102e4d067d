// GEMM on the CPU through oneDNN (the library PyTorch uses on CPU; its OpenMP runtime is the
// same one tessera's loops use, so there is one threading model per process).
//
// fp32: dnnl_sgemm. bf16 operands: oneDNN's matmul primitive with fp32 accumulation (native on
// AVX512-BF16 / AMX, emulated by oneDNN on other AVX-512 CPUs; oneDNN 2.x has no bf16 matmul at
// all below AVX-512, where the operands are widened to fp32 as fp16's are). A primitive is created once per
// shape (sizes, transposes, output dtype, alpha, beta) and cached: a training step uses a few
// dozen shapes, over and over; the output head's two GEMMs over the vocabulary may pack B first
// (matmul_half_packed). fp16 operands: oneDNN 2.x has no fp16 matmul on CPUs without
// AVX512-FP16, so they are widened to fp32 (exactly) and multiplied by sgemm: the products of
// two fp16 numbers are exact in fp32, so this is what an fp16 GEMM with fp32 accumulation
// computes, up to the order of the sums.
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backend.hpp"

namespace tessera::kernels::cpu {

void matmul(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K,
            bool trans_a, bool trans_b, float alpha, float beta) {
  if (M == 0 || N == 0) return;
  const dnnl_dim_t lda = trans_a ? M : K;
  const dnnl_dim_t ldb = trans_b ? K : N;
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha,
                                      A, lda, B, ldb, beta, C, N);
  if (st != dnnl_success)
    throw std::runtime_error("dnnl_sgemm failed with status " + std::to_string(int(st)));
}

namespace {

using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, int, float, float>;

// The operands as oneDNN sees them: row-major A[M,K] (or stored [K,M]), B[K,N] (or stored
// [N,K]), bf16; C[M,N] bf16 or f32. Transposes are strides.
struct Descs {
  dnnl::memory::desc a, b, c;
};
Descs descs(int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool c_bf16) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  return {dnnl::memory::desc({M, K}, dt::bf16, ta ? dims{1, M} : dims{K, 1}),
          dnnl::memory::desc({K, N}, dt::bf16, tb ? dims{1, K} : dims{N, 1}),
          dnnl::memory::desc({M, N}, c_bf16 ? dt::bf16 : dt::f32, dims{N, 1})};
}

struct Bf16Gemm {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, dnnl::matmul> cache;
  std::mutex mutex;

  dnnl::matmul& primitive(const Key& key) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    const auto [M, N, K, ta, tb, c_bf16, alpha, beta] = key;
    const Descs d = descs(M, N, K, ta, tb, c_bf16);
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(beta);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(d.a, d.b, d.c), attr, engine);
    return cache.emplace(key, dnnl::matmul(pd)).first->second;
  }

  // The product on a packed B: B reordered into the layout the primitive prefers (weights
  // "any"), then the matmul on it. Same sizes and output as primitive(key) with alpha 1, beta 0.
  struct Packed {
    dnnl::memory::desc b_packed;
    dnnl::reorder pack;
    dnnl::matmul mm;
  };
  std::map<Key, Packed> packed_cache;

  // C^T[N, M] = B^T A^T for A [M, K] and B [K, N] stored row-major, written f32 and contiguous:
  // src B^T (strides 1, N), weights A^T (strides 1, K).
  std::map<Key, dnnl::matmul> transposed_cache;
  dnnl::matmul& transposed(const Key& key) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = transposed_cache.find(key);
    if (it != transposed_cache.end()) return it->second;
    const auto [M, N, K, ta, tb, c_bf16, alpha, beta] = key;
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    const dnnl::memory::desc src({N, K}, dt::bf16, dims{1, N}), wei({K, M}, dt::bf16, dims{1, K}),
        dst({N, M}, dt::f32, dims{M, 1});
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei, dst), engine);
    return transposed_cache.emplace(key, dnnl::matmul(pd)).first->second;
  }

  Packed& packed(const Key& key) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = packed_cache.find(key);
    if (it != packed_cache.end()) return it->second;
    const auto [M, N, K, ta, tb, c_bf16, alpha, beta] = key;
    const Descs d = descs(M, N, K, ta, tb, c_bf16);
    const dnnl::memory::desc any({K, N}, dnnl::memory::data_type::bf16,
                                 dnnl::memory::format_tag::any);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(d.a, any, d.c), engine);
    const dnnl::reorder::primitive_desc rd(engine, d.b, engine, pd.weights_desc());
    return packed_cache.emplace(key, Packed{pd.weights_desc(), dnnl::reorder(rd), dnnl::matmul(pd)})
        .first->second;
  }
};

Bf16Gemm& bf16_gemm() {
  static Bf16Gemm gemm;
  return gemm;
}

// oneDNN 2.x implements bf16 primitives only from AVX-512 on (the ISA it uses: the CPU's, capped
// by ONEDNN_MAX_CPU_ISA); below it (AVX2 CPUs) not even its reference code accepts bf16.
bool dnnl_has_bf16() {
  static const bool has = [] {
    const unsigned avx512 = unsigned(dnnl::cpu_isa::avx512_core);
    return (unsigned(dnnl::get_effective_cpu_isa()) & avx512) == avx512;
  }();
  return has;
}

// 16-bit operands widened to fp32 (exactly: the products of two 16-bit numbers are exact in
// fp32) and multiplied by sgemm; a 16-bit C is read and rounded back as kernels::cast rounds.
// This is what a 16-bit GEMM with fp32 accumulation computes, up to the order of the sums.
void matmul_widened(DType ab, const uint16_t* A, const uint16_t* B, void* C, DType c_dtype,
                    int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, float alpha,
                    float beta) {
  const Backend& cpu = cpu_backend();  // the casts of the table (kernels/kokkos)
  auto widen = ab == DType::bf16 ? cpu.bf16_to_f32 : cpu.f16_to_f32;
  std::vector<float> a(size_t(M * K)), b(size_t(K * N));
  widen(A, a.data(), M * K);
  widen(B, b.data(), K * N);
  if (c_dtype == DType::f32)
    return matmul(a.data(), b.data(), static_cast<float*>(C), M, N, K, trans_a, trans_b, alpha,
                  beta);
  if (c_dtype != DType::bf16) throw std::runtime_error("matmul: a 16-bit C is bf16");
  uint16_t* c16 = static_cast<uint16_t*>(C);
  std::vector<float> c(size_t(M * N));
  if (beta != 0.0f) cpu.bf16_to_f32(c16, c.data(), M * N);
  matmul(a.data(), b.data(), c.data(), M, N, K, trans_a, trans_b, alpha, beta);
  cpu.f32_to_bf16(c.data(), c16, M * N);
}

void matmul_half(DType ab, const uint16_t* A, const uint16_t* B, void* C, DType c_dtype, int64_t M,
                 int64_t N, int64_t K, bool trans_a, bool trans_b, float alpha, float beta) {
  if (M == 0 || N == 0) return;
  if (ab == DType::f16) {
    if (c_dtype != DType::f32) throw std::runtime_error("matmul: f16 operands need an f32 C");
    return matmul_widened(ab, A, B, C, c_dtype, M, N, K, trans_a, trans_b, alpha, beta);
  }
  if (K == 0) {  // oneDNN rejects empty reductions; C = beta C
    if (c_dtype != DType::f32) throw std::runtime_error("matmul: K = 0 needs an f32 C");
    float* c = static_cast<float*>(C);
    for (int64_t i = 0; i < M * N; ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    return;
  }
  if (!dnnl_has_bf16())
    return matmul_widened(ab, A, B, C, c_dtype, M, N, K, trans_a, trans_b, alpha, beta);
  Bf16Gemm& gemm = bf16_gemm();
  dnnl::matmul& mm = gemm.primitive(
      Key{M, N, K, trans_a, trans_b, c_dtype == DType::bf16 ? 1 : 0, alpha, beta});
  const Descs d = descs(M, N, K, trans_a, trans_b, c_dtype == DType::bf16);
  dnnl::memory ma(d.a, gemm.engine, const_cast<uint16_t*>(A));
  dnnl::memory mb(d.b, gemm.engine, const_cast<uint16_t*>(B));
  dnnl::memory mc(d.c, gemm.engine, C);
  mm.execute(gemm.stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
  gemm.stream.wait();
}

// Packing B outside the primitive pays from about 512 rows on with AVX512-BF16 (tessera-
// prepack-bench on Zen 5: the output head's GEMMs over the vocabulary gain 7-17% there, lose at
// 256 rows); oneDNN's copy of B inside the call is repeated per block of rows. With AMX the
// micro-kernels are 2x faster and the packing costs the same, so it pays only from 1024 rows (a
// 2-core AMX Xeon: at 512 rows the head's logits GEMM 36.7 ms plain against 46.9 packed, its
// input gradient 52.2 against 58.5; at 1024 rows +3% and +16%; doc/performance.md). The reorder
// and the primitive on the packed B give the same bits as the plain call with AVX512-BF16 (the
// same micro-kernel over the same blocks) and on small shapes; with AMX at the head's shapes
// oneDNN blocks the sum over K otherwise, so the bits differ there by summation order.
bool dnnl_uses_amx() {
  static const bool amx = [] {
    const unsigned isa = unsigned(dnnl::cpu_isa::avx512_core_amx);
    return (unsigned(dnnl::get_effective_cpu_isa()) & isa) == isa;
  }();
  return amx;
}
int64_t pack_min_rows() { return dnnl_uses_amx() ? 1024 : 512; }

// With AMX, oneDNN 2.x multiplies a long reduction with B stored [K, N] (the output head's input
// gradient dx = dL W, K the vocabulary) faster as its transpose C^T = B^T A^T, whose operands it
// reads K-contiguous: on a 2-core AMX Xeon 25.4 ms against 41.3 plain and 58.5 packed for
// 512 x 512 x 50304, 52.3 against 104.1 and 91.7 at 1024 rows (doc/performance.md). Without
// AMX the two forms are level (AVX512-BF16: 135.9 against 140.1 ms), and packing gains there.
// The product goes to `space` as f32 [N, M] and is transposed into C. The same products summed
// over K in another order than the plain call's.
bool long_reduction_transposed(const uint16_t* A, const uint16_t* B, float* C, int64_t M,
                               int64_t N, int64_t K, void* space, int64_t space_bytes) {
  if (!dnnl_uses_amx() || K < 16 * std::max(M, N) || space_bytes < M * N * 4) return false;
  Bf16Gemm& gemm = bf16_gemm();
  dnnl::matmul& mm = gemm.transposed(Key{M, N, K, true, true, 0, 1.0f, 0.0f});
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  float* t = static_cast<float*>(space);
  dnnl::memory src(dnnl::memory::desc({N, K}, dt::bf16, dims{1, N}), gemm.engine,
                   const_cast<uint16_t*>(B));
  dnnl::memory wei(dnnl::memory::desc({K, M}, dt::bf16, dims{1, K}), gemm.engine,
                   const_cast<uint16_t*>(A));
  dnnl::memory dst(dnnl::memory::desc({N, M}, dt::f32, dims{M, 1}), gemm.engine, t);
  mm.execute(gemm.stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
  gemm.stream.wait();
  constexpr int64_t kTile = 32;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t m0 = 0; m0 < M; m0 += kTile)
    for (int64_t n0 = 0; n0 < N; n0 += kTile)
      for (int64_t m = m0; m < std::min(M, m0 + kTile); ++m)
        for (int64_t n = n0; n < std::min(N, n0 + kTile); ++n) C[m * N + n] = t[n * M + m];
  return true;
}

bool matmul_half_packed(DType ab, const uint16_t* A, const uint16_t* B, void* C, DType c_dtype,
                        int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, void* space,
                        int64_t space_bytes) {
  const auto plain = [&] {
    matmul_half(ab, A, B, C, c_dtype, M, N, K, trans_a, trans_b, 1.0f, 0.0f);
    return false;
  };
  if (ab != DType::bf16 || trans_a || K == 0 || N == 0 || !dnnl_has_bf16()) return plain();
  if (!trans_b && c_dtype == DType::f32 &&
      long_reduction_transposed(A, B, static_cast<float*>(C), M, N, K, space, space_bytes))
    return true;
  if (M < pack_min_rows()) return plain();
  Bf16Gemm& gemm = bf16_gemm();
  Bf16Gemm::Packed& p =
      gemm.packed(Key{M, N, K, false, trans_b, c_dtype == DType::bf16 ? 1 : 0, 1.0f, 0.0f});
  if (int64_t(p.b_packed.get_size()) > space_bytes) return plain();
  const Descs d = descs(M, N, K, false, trans_b, c_dtype == DType::bf16);
  dnnl::memory ma(d.a, gemm.engine, const_cast<uint16_t*>(A));
  dnnl::memory mb(d.b, gemm.engine, const_cast<uint16_t*>(B));
  dnnl::memory mp(p.b_packed, gemm.engine, space);
  dnnl::memory mc(d.c, gemm.engine, C);
  p.pack.execute(gemm.stream, mb, mp);
  p.mm.execute(gemm.stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mp}, {DNNL_ARG_DST, mc}});
  gemm.stream.wait();
  return true;
}

}  // namespace

// oneDNN multiplies bf16 natively from AVX512-BF16 on (AMX included): the ISA it uses, i.e.
// the CPU's, capped by ONEDNN_MAX_CPU_ISA when that is set. Below it the bf16 GEMMs are emulated.
bool gemm_native_bf16() {
  const unsigned bf16 = unsigned(dnnl::cpu_isa::avx512_core_bf16);
  return (unsigned(dnnl::get_effective_cpu_isa()) & bf16) == bf16;
}

bool gemm_bf16_matmul() { return dnnl_has_bf16(); }
bool gemm_matrix_engine() { return dnnl_uses_amx(); }

void register_gemm(Backend& b) {
  b.matmul = matmul;
  b.matmul_half = matmul_half;
  b.matmul_half_packed = matmul_half_packed;
}

}  // namespace tessera::kernels::cpu
