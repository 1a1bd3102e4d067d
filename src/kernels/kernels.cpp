// The public kernel functions: check the tensors, pick the backend of their space (one table
// lookup), call its entry with raw pointers.
#include "kernels/kernels.hpp"

#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "core/error.hpp"
#include "kernels/backend.hpp"
#include "kernels/checked_call.hpp"

#ifdef TESSERA_CUDA
#include "kernels/cuda/context.hpp"
#endif

namespace tessera::kernels {
using namespace detail;


bool cuda_backend_built() {
#ifdef TESSERA_CUDA
  return true;
#else
  return cuda_emulated() > 0;
#endif
}

bool cpu_native_bf16() { return cpu::gemm_native_bf16(); }
bool cpu_bf16_matmul() { return cpu::gemm_bf16_matmul(); }
bool cpu_matrix_engine() { return cpu::gemm_matrix_engine(); }

int cuda_device_count() {
  if (const int n = cuda_emulated()) return n;
#ifdef TESSERA_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

std::string cuda_device_id(int index) {
  if (cuda_emulated()) {  // TESSERA_EMULATE_CUDA_FIRST: this process's first emulated device
    const char* first = std::getenv("TESSERA_EMULATE_CUDA_FIRST");
    return "emulated " + std::to_string(index + (first ? std::atoi(first) : 0));
  }
#ifdef TESSERA_CUDA
  return cuda::pci_bus_id(index);
#else
  return "";
#endif
}

namespace {
// Indexed by gemm_slot: f32, bf16, f16.
std::atomic<double> g_gemm_flops[3];
int gemm_slot(DType t) { return t == DType::bf16 ? 1 : t == DType::f16 ? 2 : 0; }
void count_gemm(DType operands, int64_t M, int64_t N, int64_t K) {
  g_gemm_flops[gemm_slot(operands)].fetch_add(2.0 * double(M) * double(N) * double(K),
                                              std::memory_order_relaxed);
}
}  // namespace

double gemm_flops(DType operands) { return g_gemm_flops[gemm_slot(operands)].load(); }

void matmul(const Tensor& A, const Tensor& B, const Tensor& C, int64_t M, int64_t N, int64_t K,
            bool trans_a, bool trans_b, float alpha, float beta) {
  // An empty C reads nothing; K = 0 scales C without reading A or B.
  const int64_t na = N > 0 ? M * K : 0, nb = M > 0 ? K * N : 0;
  count_gemm(A.dtype, M, N, K);
  if (A.dtype == DType::bf16 || A.dtype == DType::f16) {
    const DType ab = A.dtype, c = C.dtype == ab ? ab : DType::f32;
    const Backend& b =
        check("matmul", {{"A", A, na, ab}, {"B", B, nb, ab}, {"C", C, M * N, c}});
    return TESSERA_KERNEL(b, matmul_half)(ab, h(A), h(B), C.data, c, M, N, K, trans_a, trans_b,
                                          alpha, beta);
  }
  const Backend& b = check("matmul", {{"A", A, na}, {"B", B, nb}, {"C", C, M * N}});
  TESSERA_KERNEL(b, matmul)(f(A), f(B), f(C), M, N, K, trans_a, trans_b, alpha, beta);
}

bool matmul_packed_b(const Tensor& A, const Tensor& B, const Tensor& C, int64_t M, int64_t N,
                     int64_t K, bool trans_a, bool trans_b, const Tensor& pack_space) {
  if ((A.dtype == DType::bf16 || A.dtype == DType::f16) && pack_space.data && M > 0 && N > 0) {
    const DType ab = A.dtype, c = C.dtype == ab ? ab : DType::f32;
    const Backend& b = check("matmul_packed_b",
                             {{"A", A, M * K, ab},
                              {"B", B, K * N, ab},
                              {"C", C, M * N, c},
                              {"pack_space", pack_space, pack_space.numel(), pack_space.dtype}});
    if (b.matmul_half_packed) {
      count_gemm(ab, M, N, K);
      return b.matmul_half_packed(ab, h(A), h(B), C.data, c, M, N, K, trans_a, trans_b,
                                  pack_space.data,
                                  pack_space.numel() * int64_t(dtype_size(pack_space.dtype)));
    }
  }
  matmul(A, B, C, M, N, K, trans_a, trans_b);
  return false;
}

void fill(const Tensor& x, float value, int64_t n) {
  const Backend& b = check("fill", {{"x", x, n}});
  TESSERA_KERNEL(b, fill)(f(x), value, n);
}

void copy(const Tensor& x, const Tensor& y, int64_t n) {
  const Backend& b = check("copy", {{"x", x, n}, {"y", y, n}});
  TESSERA_KERNEL(b, copy)(f(x), f(y), n);
}

void add_inplace(const Tensor& y, const Tensor& x, int64_t n) {
  const Backend& b = check("add_inplace", {{"y", y, n}, {"x", x, n}});
  TESSERA_KERNEL(b, add_inplace)(f(y), f(x), n);
}

void scale_inplace(const Tensor& x, float alpha, int64_t n) {
  const Backend& b = check("scale_inplace", {{"x", x, n}});
  TESSERA_KERNEL(b, scale_inplace)(f(x), alpha, n);
}

double sum_squares(const Tensor& x, int64_t n) {
  const Backend& b = check("sum_squares", {{"x", x, n}});
  return TESSERA_KERNEL(b, sum_squares)(f(x), n);
}

void sum_squares_accumulate(const Tensor& x, int64_t n, const Tensor& total) {
  const Backend& b =
      check("sum_squares_accumulate", {{"x", x, n}, {"total", total, 1, DType::f64}});
  TESSERA_KERNEL(b, sum_squares_accumulate)(f(x), n, d(total));
}

void bias_backward(const Tensor& dy, const Tensor& db, int64_t N, int64_t C) {
  const Backend& b = check("bias_backward", {{"dy", dy, N * C}, {"db", db, C}});
  TESSERA_KERNEL(b, bias_backward)(f(dy), f(db), N, C);
}

void bias_add(const Tensor& y, const Tensor& bias, int64_t N, int64_t C) {
  const Backend& b = check("bias_add", {{"y", y, N * C}, {"b", bias, C}});
  TESSERA_KERNEL(b, bias_add)(f(y), f(bias), N, C);
}

void copy_rows(const Tensor& x, int64_t ldx, const Tensor& y, int64_t ldy, int64_t rows,
               int64_t cols) {
  TESSERA_REQUIRE_LOCAL(cols <= ldx && cols <= ldy, "kernels::copy_rows: ", cols,
                        " columns do not fit rows of ", ldx, " and ", ldy);
  const int64_t nx = rows > 0 ? (rows - 1) * ldx + cols : 0;
  const int64_t ny = rows > 0 ? (rows - 1) * ldy + cols : 0;
  const Backend& b = check("copy_rows", {{"x", x, nx}, {"y", y, ny}});
  TESSERA_KERNEL(b, copy_rows)(f(x), ldx, f(y), ldy, rows, cols);
}

void cast(const Tensor& x, const Tensor& y, int64_t n) {
  const DType from = x.dtype, to = y.dtype;
  const bool half_to = to == DType::bf16 || to == DType::f16;
  const bool half_from = from == DType::bf16 || from == DType::f16;
  TESSERA_REQUIRE_LOCAL(
      (from == DType::f32 && (half_to || to == DType::f32)) || (half_from && to == DType::f32),
      "kernels::cast: no conversion from ", dtype_name(from), " to ", dtype_name(to),
      " (f32 <-> bf16, f16)");
  const Backend& b = check("cast", {{"x", x, n, from}, {"y", y, n, to}});
  if (from == DType::f32 && to == DType::f32) return TESSERA_KERNEL(b, copy)(f(x), f(y), n);
  if (to == DType::bf16) return TESSERA_KERNEL(b, f32_to_bf16)(f(x), h(y), n);
  if (to == DType::f16) return TESSERA_KERNEL(b, f32_to_f16)(f(x), h(y), n);
  if (from == DType::bf16) return TESSERA_KERNEL(b, bf16_to_f32)(h(x), f(y), n);
  TESSERA_KERNEL(b, f16_to_f32)(h(x), f(y), n);
}

namespace {
// A kernel's optional 16-bit output: none, or bf16 / f16.
uint16_t* half_out(const char* kernel, const char* name, const Tensor& t) {
  if (!t.data) return nullptr;
  TESSERA_REQUIRE_LOCAL(t.dtype == DType::bf16 || t.dtype == DType::f16, "kernels::", kernel, ": ",
                        name, " is ", dtype_name(t.dtype), ", this kernel writes bf16 or f16");
  return static_cast<uint16_t*>(t.data);
}
}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd,
                     int64_t N, int64_t C, float eps) {
  const Backend& b = check("rmsnorm_forward",
                           {{"x", x, N * C}, {"w", w, C}, {"y", y, N * C, y.dtype}, {"rstd", rstd, N}});
  const bool half = y.dtype != DType::f32;
  TESSERA_KERNEL(b, rmsnorm_forward)
  (f(x), f(w), half ? nullptr : f(y), half ? half_out("rmsnorm_forward", "y", y) : nullptr,
   y.dtype == DType::f16, f(rstd), N, C, eps);
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dw, int64_t N, int64_t C) {
  const Backend& b = check("rmsnorm_backward", {{"dy", dy, N * C},
                                                {"x", x, N * C},
                                                {"w", w, C},
                                                {"rstd", rstd, N},
                                                {"dx", dx, N * C},
                                                {"dw", dw, C}});
  TESSERA_KERNEL(b, rmsnorm_backward)(f(dy), f(x), f(w), f(rstd), f(dx), f(dw), N, C);
}

void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd, int64_t N, int64_t C, float eps) {
  const Backend& b = check("layernorm_forward", {{"x", x, N * C},
                                                 {"w", w, C},
                                                 {"b", bias, C},
                                                 {"y", y, N * C, y.dtype},
                                                 {"mean", mean, N},
                                                 {"rstd", rstd, N}});
  const bool half = y.dtype != DType::f32;
  TESSERA_KERNEL(b, layernorm_forward)
  (f(x), f(w), f(bias), half ? nullptr : f(y), half ? half_out("layernorm_forward", "y", y) : nullptr,
   y.dtype == DType::f16, f(mean), f(rstd), N, C, eps);
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db,
                        int64_t N, int64_t C) {
  const Backend& b = check("layernorm_backward", {{"dy", dy, N * C},
                                                  {"x", x, N * C},
                                                  {"w", w, C},
                                                  {"mean", mean, N},
                                                  {"rstd", rstd, N},
                                                  {"dx", dx, N * C},
                                                  {"dw", dw, C},
                                                  {"db", db, C}});
  TESSERA_KERNEL(b, layernorm_backward)
  (f(dy), f(x), f(w), f(mean), f(rstd), f(dx), f(dw), f(db), N, C);
}

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out, int64_t n) {
  const Backend& b = check("swiglu_forward", {{"gate", gate, n}, {"up", up, n}, {"out", out, n}});
  TESSERA_KERNEL(b, swiglu_forward)(f(gate), f(up), f(out), n);
}

void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                     const Tensor& dup, int64_t n) {
  const Backend& b = check(
      "swiglu_backward",
      {{"dout", dout, n}, {"gate", gate, n}, {"up", up, n}, {"dgate", dgate, n}, {"dup", dup, n}});
  TESSERA_KERNEL(b, swiglu_backward)(f(dout), f(gate), f(up), f(dgate), f(dup), n);
}

void gelu_forward(const Tensor& x, const Tensor& y, int64_t n) {
  const Backend& b = check("gelu_forward", {{"x", x, n}, {"y", y, n}});
  TESSERA_KERNEL(b, gelu_forward)(f(x), f(y), n);
}

void gelu_backward(const Tensor& dy, const Tensor& x, const Tensor& dx, int64_t n) {
  const Backend& b = check("gelu_backward", {{"dy", dy, n}, {"x", x, n}, {"dx", dx, n}});
  TESSERA_KERNEL(b, gelu_backward)(f(dy), f(x), f(dx), n);
}

void rope(const Tensor& x, int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos0, float theta,
          bool inverse, const Tensor& y) {
  const int64_t n = B * T * H * D;
  const Backend& b =
      check("rope", {{"x", x, n}, {"y", y, y.data ? n : 0, DType::bf16}});
  TESSERA_KERNEL(b, rope)(f(x), y.data ? h(y) : nullptr, B, T, H, D, pos0, theta, inverse);
}

void rope_at(const Tensor& x, const Tensor& pos, int64_t N, int64_t H, int64_t D, float theta,
             bool inverse, const Tensor& y) {
  const int64_t n = N * H * D;
  const Backend& b = check("rope_at", {{"x", x, n},
                                       {"pos", pos, N, DType::i32},
                                       {"y", y, y.data ? n : 0, DType::bf16}});
  TESSERA_KERNEL(b, rope_at)(f(x), y.data ? h(y) : nullptr, i(pos), N, H, D, theta, inverse);
}

namespace {
void check_attention_compute(const char* kernel, const AttnShape& s) {
  TESSERA_REQUIRE_LOCAL(s.compute == DType::f32 || s.compute == DType::bf16, "kernels::", kernel,
                        ": compute dtype ", dtype_name(s.compute),
                        " is not supported (f32 or bf16)");
}

// q, k, v in bf16 need the bf16 compute; the output may then be f32 or bf16.
void check_attention_dtypes(const char* kernel, const AttnShape& s, const Tensor& q,
                            const Tensor& out) {
  const bool q_ok =
      q.dtype == DType::f32 || (q.dtype == DType::bf16 && s.compute == DType::bf16);
  const bool out_ok =
      out.dtype == DType::f32 || (out.dtype == DType::bf16 && q.dtype == DType::bf16);
  TESSERA_REQUIRE_LOCAL(q_ok, "kernels::", kernel, ": q, k, v are ", dtype_name(q.dtype),
                        " with compute ", dtype_name(s.compute),
                        " (f32, or bf16 with the bf16 compute)");
  TESSERA_REQUIRE_LOCAL(out_ok, "kernels::", kernel, ": out is ", dtype_name(out.dtype), " with q ",
                        dtype_name(q.dtype), " (f32, or bf16 with bf16 q, k, v)");
}
}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                       const Tensor& lse, const AttnShape& s, const Tensor& doc_start) {
  check_attention_compute("attention_forward", s);
  check_attention_dtypes("attention_forward", s, q, out);
  const int64_t nq = s.B * s.T * s.Hq * s.D, nkv = s.B * s.keys() * s.Hkv * s.D;
  const int64_t nd = doc_start.data ? s.B * s.T : 0;
  const int32_t* docs = nd > 0 ? i(doc_start) : nullptr;
  if (q.dtype == DType::bf16) {
    const DType o = out.dtype;
    const Backend& b = check("attention_forward", {{"q", q, nq, DType::bf16},
                                                   {"k", k, nkv, DType::bf16},
                                                   {"v", v, nkv, DType::bf16},
                                                   {"out", out, nq, o},
                                                   {"lse", lse, s.B * s.Hq * s.T},
                                                   {"doc_start", doc_start, nd, DType::i32}});
    return TESSERA_KERNEL(b, attention_forward_bf16)(
        h(q), h(k), h(v), o == DType::f32 ? f(out) : nullptr, o == DType::bf16 ? h(out) : nullptr,
        f(lse), s, docs);
  }
  const Backend& b = check("attention_forward", {{"q", q, nq},
                                                 {"k", k, nkv},
                                                 {"v", v, nkv},
                                                 {"out", out, nq},
                                                 {"lse", lse, s.B * s.Hq * s.T},
                                                 {"doc_start", doc_start, nd, DType::i32}});
  TESSERA_KERNEL(b, attention_forward)(f(q), f(k), f(v), f(out), f(lse), s, docs);
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv, const AttnShape& s, const Tensor& doc_start) {
  check_attention_compute("attention_backward", s);
  check_attention_dtypes("attention_backward", s, q, out);
  const int64_t nq = s.B * s.T * s.Hq * s.D, nkv = s.B * s.keys() * s.Hkv * s.D;
  const int64_t nd = doc_start.data ? s.B * s.T : 0;
  const int32_t* docs = nd > 0 ? i(doc_start) : nullptr;
  if (q.dtype == DType::bf16) {
    const DType o = out.dtype;
    const Backend& b = check("attention_backward", {{"dout", dout, nq},
                                                    {"q", q, nq, DType::bf16},
                                                    {"k", k, nkv, DType::bf16},
                                                    {"v", v, nkv, DType::bf16},
                                                    {"out", out, nq, o},
                                                    {"lse", lse, s.B * s.Hq * s.T},
                                                    {"dq", dq, nq},
                                                    {"dk", dk, nkv},
                                                    {"dv", dv, nkv},
                                                    {"doc_start", doc_start, nd, DType::i32}});
    return TESSERA_KERNEL(b, attention_backward_bf16)(
        f(dout), h(q), h(k), h(v), o == DType::f32 ? f(out) : nullptr,
        o == DType::bf16 ? h(out) : nullptr, f(lse), f(dq), f(dk), f(dv), s, docs);
  }
  const Backend& b = check("attention_backward", {{"dout", dout, nq},
                                                  {"q", q, nq},
                                                  {"k", k, nkv},
                                                  {"v", v, nkv},
                                                  {"out", out, nq},
                                                  {"lse", lse, s.B * s.Hq * s.T},
                                                  {"dq", dq, nq},
                                                  {"dk", dk, nkv},
                                                  {"dv", dv, nkv},
                                                  {"doc_start", doc_start, nd, DType::i32}});
  TESSERA_KERNEL(b, attention_backward)
  (f(dout), f(q), f(k), f(v), f(out), f(lse), f(dq), f(dk), f(dv), s, docs);
}

void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& out_part,
                     const Tensor& lse_part, int64_t B, int64_t T, int64_t H, int64_t D) {
  const int64_t n = B * T * H * D, rows = B * H * T;
  const Backend& b = check("attention_merge", {{"out", out, n},
                                               {"lse", lse, rows},
                                               {"out_part", out_part, n},
                                               {"lse_part", lse_part, rows}});
  TESSERA_KERNEL(b, attention_merge)(f(out), f(lse), f(out_part), f(lse_part), B, T, H, D);
}

// The table's rows are not checked against the ids (the kernels do not range-check them either);
// at least one row is needed when there are tokens.
void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, int64_t N,
                       int64_t C) {
  const Backend& b =
      check("embedding_forward",
            {{"ids", ids, N, DType::i32}, {"table", table, N > 0 ? C : 0}, {"out", out, N * C}});
  TESSERA_KERNEL(b, embedding_forward)(i(ids), f(table), f(out), N, C);
}

void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable, int64_t N,
                        int64_t C) {
  const Backend& b = check(
      "embedding_backward",
      {{"ids", ids, N, DType::i32}, {"dout", dout, N * C}, {"dtable", dtable, N > 0 ? C : 0}});
  TESSERA_KERNEL(b, embedding_backward)(i(ids), f(dout), f(dtable), N, C);
}

void embedding_forward_range(const Tensor& ids, const Tensor& table, const Tensor& out, int64_t N,
                             int64_t C, int64_t v0, int64_t rows) {
  const Backend& b =
      check("embedding_forward_range",
            {{"ids", ids, N, DType::i32}, {"table", table, rows * C}, {"out", out, N * C}});
  TESSERA_KERNEL(b, embedding_forward_range)(i(ids), f(table), f(out), N, C, v0, rows);
}

void embedding_backward_range(const Tensor& ids, const Tensor& dout, const Tensor& dtable,
                              int64_t N, int64_t C, int64_t v0, int64_t rows) {
  const Backend& b =
      check("embedding_backward_range",
            {{"ids", ids, N, DType::i32}, {"dout", dout, N * C}, {"dtable", dtable, rows * C}});
  TESSERA_KERNEL(b, embedding_backward_range)(i(ids), f(dout), f(dtable), N, C, v0, rows);
}


void cross_entropy_fused(const Tensor& logits, const Tensor& targets, const Tensor& losses,
                         int64_t N, int64_t V, int64_t V_valid, float grad_scale,
                         const Tensor& dlogits) {
  const Backend& b = check("cross_entropy_fused",
                           {{"logits", logits, N * V},
                            {"targets", targets, N, DType::i32},
                            {"losses", losses, N},
                            {"dlogits", dlogits, dlogits.data ? N * V : 0, dlogits.dtype}});
  TESSERA_KERNEL(b, cross_entropy_fused)
  (f(logits), i(targets), f(losses), N, V, V_valid, grad_scale,
   half_out("cross_entropy_fused", "dlogits", dlogits), dlogits.dtype == DType::f16);
}

void cross_entropy_local_max(const Tensor& logits, const Tensor& row_max, int64_t N, int64_t V,
                             int64_t V_valid) {
  const Backend& b =
      check("cross_entropy_local_max", {{"logits", logits, N * V}, {"row_max", row_max, N}});
  TESSERA_KERNEL(b, cross_entropy_local_max)(f(logits), f(row_max), N, V, V_valid);
}

void cross_entropy_local_exp(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                             const Tensor& sum_exp, const Tensor& target_logit, int64_t N,
                             int64_t V, int64_t V_valid, int64_t v0) {
  const Backend& b = check("cross_entropy_local_exp", {{"logits", logits, N * V},
                                                       {"targets", targets, N, DType::i32},
                                                       {"row_max", row_max, N},
                                                       {"sum_exp", sum_exp, N, DType::f64},
                                                       {"target_logit", target_logit, N}});
  TESSERA_KERNEL(b, cross_entropy_local_exp)
  (f(logits), i(targets), f(row_max), d(sum_exp), f(target_logit), N, V, V_valid, v0);
}

void cross_entropy_local_finish(const Tensor& logits, const Tensor& targets, const Tensor& sum_exp,
                                const Tensor& target_logit, const Tensor& losses, int64_t N,
                                int64_t V, int64_t V_valid, int64_t v0, float grad_scale,
                                const Tensor& dlogits) {
  const Backend& b =
      check("cross_entropy_local_finish",
            {{"logits", logits, N * V},
             {"targets", targets, N, DType::i32},
             {"sum_exp", sum_exp, N, DType::f64},
             {"target_logit", target_logit, N},
             {"losses", losses, N},
             {"dlogits", dlogits, dlogits.data ? N * V : 0, dlogits.dtype}});
  TESSERA_KERNEL(b, cross_entropy_local_finish)
  (f(logits), i(targets), d(sum_exp), f(target_logit), f(losses), N, V, V_valid, v0, grad_scale,
   half_out("cross_entropy_local_finish", "dlogits", dlogits), dlogits.dtype == DType::f16);
}

void cross_entropy_tile_stats(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                              const Tensor& sum_exp, const Tensor& target_logit, int64_t N,
                              int64_t T, int64_t c0, bool first) {
  const Backend& b = check("cross_entropy_tile_stats", {{"logits", logits, N * T},
                                                        {"targets", targets, N, DType::i32},
                                                        {"row_max", row_max, N},
                                                        {"sum_exp", sum_exp, N, DType::f64},
                                                        {"target_logit", target_logit, N}});
  TESSERA_KERNEL(b, cross_entropy_tile_stats)
  (f(logits), i(targets), f(row_max), d(sum_exp), f(target_logit), N, T, c0, first);
}

void cross_entropy_rescale(const Tensor& sum_exp, const Tensor& local_max, const Tensor& row_max,
                           int64_t N) {
  const Backend& b = check("cross_entropy_rescale", {{"sum_exp", sum_exp, N, DType::f64},
                                                     {"local_max", local_max, N},
                                                     {"row_max", row_max, N}});
  TESSERA_KERNEL(b, cross_entropy_rescale)(d(sum_exp), f(local_max), f(row_max), N);
}

void cross_entropy_tile_loss(const Tensor& targets, const Tensor& row_max, const Tensor& sum_exp,
                             const Tensor& target_logit, const Tensor& losses, int64_t N) {
  const Backend& b = check("cross_entropy_tile_loss", {{"targets", targets, N, DType::i32},
                                                       {"row_max", row_max, N},
                                                       {"sum_exp", sum_exp, N, DType::f64},
                                                       {"target_logit", target_logit, N},
                                                       {"losses", losses, N}});
  TESSERA_KERNEL(b, cross_entropy_tile_loss)
  (i(targets), f(row_max), d(sum_exp), f(target_logit), f(losses), N);
}

void cross_entropy_tile_grad(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                             const Tensor& sum_exp, int64_t N, int64_t T, int64_t c0,
                             float grad_scale, const Tensor& dlogits) {
  const Backend& b =
      check("cross_entropy_tile_grad",
            {{"logits", logits, N * T},
             {"targets", targets, N, DType::i32},
             {"row_max", row_max, N},
             {"sum_exp", sum_exp, N, DType::f64},
             {"dlogits", dlogits, dlogits.data ? N * T : 0, dlogits.dtype}});
  TESSERA_KERNEL(b, cross_entropy_tile_grad)
  (f(logits), i(targets), f(row_max), d(sum_exp), N, T, c0, grad_scale,
   half_out("cross_entropy_tile_grad", "dlogits", dlogits), dlogits.dtype == DType::f16);
}

void adamw(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, int64_t n,
           const AdamWArgs& a, const Tensor& compute) {
  const Backend& b = check("adamw", {{"p", p, n},
                                     {"g", g, n},
                                     {"m", m, n},
                                     {"v", v, n},
                                     {"compute", compute, compute.data ? n : 0, compute.dtype}});
  TESSERA_KERNEL(b, adamw)
  (f(p), f(g), f(m), f(v), n, a, half_out("adamw", "compute", compute),
   compute.dtype == DType::f16);
}

namespace {
// An optional argument: n elements when given, else nothing (check skips it).
int64_t given(const Tensor& t, int64_t n) {
  return t.data ? n : 0;
}
// Both of a pair of optional arguments or neither.
void pair(const char* kernel, const char* a, const Tensor& x, const char* b, const Tensor& y) {
  TESSERA_REQUIRE_LOCAL((x.data == nullptr) == (y.data == nullptr), "kernels::", kernel, ": ", a,
                        " and ", b, " are given together or not at all");
}
// Two 16-bit outputs of one call have one dtype.
void same_half(const char* kernel, const Tensor& x, const Tensor& y) {
  TESSERA_REQUIRE_LOCAL(!x.data || !y.data || x.dtype == y.dtype, "kernels::", kernel,
                        ": the 16-bit outputs are ", dtype_name(x.dtype), " and ",
                        dtype_name(y.dtype), "; give them one dtype");
}
}  // namespace

void gelu_bias_forward(const Tensor& pre, const Tensor& bias, const Tensor& act,
                       const Tensor& act16, int64_t N, int64_t C) {
  const int64_t n = N * C;
  TESSERA_REQUIRE_LOCAL(act.data || act16.data,
                        "kernels::gelu_bias_forward: neither act nor act16 is given");
  const Backend& b = check("gelu_bias_forward", {{"pre", pre, n},
                                                 {"bias", bias, given(bias, C)},
                                                 {"act", act, given(act, n)},
                                                 {"act16", act16, given(act16, n), act16.dtype}});
  TESSERA_KERNEL(b, gelu_bias_forward)
  (f(pre), f(bias), f(act), half_out("gelu_bias_forward", "act16", act16),
   act16.dtype == DType::f16, N, C);
}

void swiglu_bias_forward(const Tensor& gate, const Tensor& up, const Tensor& gate_bias,
                         const Tensor& up_bias, const Tensor& act, const Tensor& act16, int64_t N,
                         int64_t C) {
  const int64_t n = N * C;
  pair("swiglu_bias_forward", "gate_bias", gate_bias, "up_bias", up_bias);
  TESSERA_REQUIRE_LOCAL(act.data || act16.data,
                        "kernels::swiglu_bias_forward: neither act nor act16 is given");
  const Backend& b =
      check("swiglu_bias_forward", {{"gate", gate, n},
                                    {"up", up, n},
                                    {"gate_bias", gate_bias, given(gate_bias, C)},
                                    {"up_bias", up_bias, given(up_bias, C)},
                                    {"act", act, given(act, n)},
                                    {"act16", act16, given(act16, n), act16.dtype}});
  TESSERA_KERNEL(b, swiglu_bias_forward)
  (f(gate), f(up), f(gate_bias), f(up_bias), f(act),
   half_out("swiglu_bias_forward", "act16", act16), act16.dtype == DType::f16, N, C);
}

void gelu_bias_backward(const Tensor& dact, const Tensor& pre, const Tensor& dpre,
                        const Tensor& dpre16, const Tensor& dbias, int64_t N, int64_t C) {
  const int64_t n = N * C;
  TESSERA_REQUIRE_LOCAL(dpre.data || dpre16.data,
                        "kernels::gelu_bias_backward: neither dpre nor dpre16 is given");
  const Backend& b =
      check("gelu_bias_backward", {{"dact", dact, n},
                                   {"pre", pre, n},
                                   {"dpre", dpre, given(dpre, n)},
                                   {"dpre16", dpre16, given(dpre16, n), dpre16.dtype},
                                   {"dbias", dbias, given(dbias, C)}});
  TESSERA_KERNEL(b, gelu_bias_backward)
  (f(dact), f(pre), f(dpre), half_out("gelu_bias_backward", "dpre16", dpre16),
   dpre16.dtype == DType::f16, f(dbias), N, C);
}

void swiglu_bias_backward(const Tensor& dact, const Tensor& gate, const Tensor& up,
                          const Tensor& dgate, const Tensor& dup, const Tensor& dgate16,
                          const Tensor& dup16, const Tensor& dgate_bias, const Tensor& dup_bias,
                          int64_t N, int64_t C) {
  const char* k = "swiglu_bias_backward";
  const int64_t n = N * C;
  pair(k, "dgate", dgate, "dup", dup);
  pair(k, "dgate16", dgate16, "dup16", dup16);
  pair(k, "dgate_bias", dgate_bias, "dup_bias", dup_bias);
  same_half(k, dgate16, dup16);
  TESSERA_REQUIRE_LOCAL(dgate.data || dgate16.data, "kernels::", k,
                        ": neither the f32 nor the 16-bit gradients are given");
  const Backend& b = check(k, {{"dact", dact, n},
                               {"gate", gate, n},
                               {"up", up, n},
                               {"dgate", dgate, given(dgate, n)},
                               {"dup", dup, given(dup, n)},
                               {"dgate16", dgate16, given(dgate16, n), dgate16.dtype},
                               {"dup16", dup16, given(dup16, n), dup16.dtype},
                               {"dgate_bias", dgate_bias, given(dgate_bias, C)},
                               {"dup_bias", dup_bias, given(dup_bias, C)}});
  TESSERA_KERNEL(b, swiglu_bias_backward)
  (f(dact), f(gate), f(up), f(dgate), f(dup), half_out(k, "dgate16", dgate16),
   half_out(k, "dup16", dup16), dgate16.dtype == DType::f16, f(dgate_bias), f(dup_bias), N, C);
}

}  // namespace tessera::kernels
