// The mixture-of-experts routing kernels' public functions (kernels.hpp; kokkos/routing.cpp).
#include "kernels/checked_call.hpp"

namespace tessera::kernels {
using namespace detail;

namespace {
constexpr DType kI32 = DType::i32, kF64 = DType::f64;
int64_t opt(const Tensor& t, int64_t n) { return t.data ? n : 0; }  // an optional argument
}  // namespace

void moe_scores(const Tensor& logits, const Tensor& scores, const Tensor& lse, const Tensor& norm,
                int64_t N, int64_t E, bool sigmoid) {
  const Backend& b = check("moe_scores", {{"logits", logits, N * E},
                                          {"scores", scores, N * E},
                                          {"lse", lse, N, kF64},
                                          {"norm", norm, opt(norm, N), kF64}});
  TESSERA_KERNEL(b, moe_scores)(f(logits), f(scores), d(lse), d(norm), N, E, sigmoid);
}

void moe_top_k(const Tensor& scores, const Tensor& bias, const Tensor& choice,
               const Tensor& weight, int64_t N, int64_t E, int64_t K, int64_t nodes,
               int64_t max_nodes, bool normalise) {
  TESSERA_REQUIRE_LOCAL(K >= 1 && K <= E, "kernels::moe_top_k: K = ", K, " is not in [1, E = ",
                        E, "]");
  const bool limited = max_nodes > 0 && max_nodes < nodes;
  TESSERA_REQUIRE_LOCAL(!limited || (E % nodes == 0 && max_nodes * (E / nodes) >= K),
                        "kernels::moe_top_k: ", nodes, " nodes of ", E, " experts, ", max_nodes,
                        " kept, cannot hold ", K, " choices");
  const Backend& b = check("moe_top_k", {{"scores", scores, N * E},
                                         {"bias", bias, E},
                                         {"choice", choice, N * K, kI32},
                                         {"weight", weight, opt(weight, N * K)}});
  TESSERA_KERNEL(b, moe_top_k)(f(scores), f(bias), i(choice), f(weight), N, E, K,
                               limited ? nodes : 1, limited ? max_nodes : 0, normalise);
}

void moe_capacity(const Tensor& choice, const Tensor& load, const Tensor& kept, const Tensor& row,
                  int64_t B, int64_t T, int64_t K, int64_t E, int64_t cap, int64_t first,
                  int64_t count) {
  const int64_t N = B * T;
  const Backend& b = check("moe_capacity", {{"choice", choice, N * K, kI32},
                                            {"load", load, B * E, kI32},
                                            {"kept", kept, B * E, kI32},
                                            {"row", row, N * K, kI32}});
  TESSERA_KERNEL(b, moe_capacity)(i(choice), i(load), i(kept), i(row), B, T, K, E, cap, first,
                                  count);
}

void moe_balance(const Tensor& scores, const Tensor& norm, const Tensor& load, const Tensor& f_,
                 const Tensor& aux, int64_t B, int64_t T, int64_t K, int64_t E) {
  const int64_t N = B * T;
  const Backend& b = check("moe_balance", {{"scores", scores, opt(aux, N * E)},
                                           {"norm", norm, opt(norm, N), kF64},
                                           {"load", load, B * E, kI32},
                                           {"f", f_, B * E},
                                           {"aux", aux, opt(aux, B * E), kF64}});
  TESSERA_KERNEL(b, moe_balance)(f(scores), d(norm), i(load), f(f_), d(aux), B, T, K, E);
}

void moe_pack(const Tensor& choice, const Tensor& kept, const Tensor& offset, const Tensor& row,
              int64_t B, int64_t T, int64_t K, int64_t E) {
  const int64_t N = B * T;
  const Backend& b = check("moe_pack", {{"choice", choice, N * K, kI32},
                                        {"kept", kept, B * E, kI32},
                                        {"offset", offset, E + 1, kI32},
                                        {"row", row, N * K, kI32}});
  TESSERA_KERNEL(b, moe_pack)(i(choice), i(kept), i(offset), i(row), B, T, K, E);
}

void moe_route_stats(const Tensor& lse, const Tensor& load, const Tensor& aux,
                     const Tensor& outside, const Tensor& stats, int64_t B, int64_t T, int64_t K,
                     int64_t E, int64_t cap, double z0, double aux0, int64_t first, int64_t count,
                     int64_t lo, int64_t hi) {
  const int64_t N = B * T;
  const Backend& b = check("moe_route_stats", {{"lse", lse, N, kF64},
                                               {"load", load, B * E, kI32},
                                               {"aux", aux, opt(aux, B * E), kF64},
                                               {"outside", outside, opt(outside, N * K), kI32},
                                               {"stats", stats, E + 4, kF64}});
  TESSERA_KERNEL(b, moe_route_stats)(d(lse), i(load), d(aux), i(outside), d(stats), B, T, K, E,
                                     cap, z0, aux0, first, count, lo, hi);
}

void moe_gather(const Tensor& x, const Tensor& row, const Tensor& packed, int64_t first,
                int64_t count, int64_t K, int64_t C) {
  const int64_t end = first + count;
  const Backend& b = check("moe_gather", {{"x", x, end * C},
                                          {"row", row, end * K, kI32},
                                          {"packed", packed, count * K * C}});
  TESSERA_KERNEL(b, moe_gather)(f(x), i(row), f(packed), first, count, K, C);
}

void moe_combine(const Tensor& packed, const Tensor& row, const Tensor& weight, const Tensor& y,
                 int64_t first, int64_t count, int64_t y_first, int64_t K, int64_t C) {
  const int64_t end = first + count;
  TESSERA_REQUIRE_LOCAL(y_first <= first, "kernels::moe_combine: y starts at token ", y_first,
                        ", after the first token ", first);
  const Backend& b = check("moe_combine", {{"packed", packed, count * K * C},
                                           {"row", row, end * K, kI32},
                                           {"weight", weight, opt(weight, end * K)},
                                           {"y", y, (end - y_first) * C}});
  TESSERA_KERNEL(b, moe_combine)(f(packed), i(row), f(weight), f(y), first, count, y_first, K, C);
}

void moe_combine_backward(const Tensor& dy, const Tensor& packed, const Tensor& row,
                          const Tensor& weight, const Tensor& d_packed, const Tensor& dweight,
                          int64_t first, int64_t count, int64_t dy_first, int64_t K, int64_t C) {
  const int64_t end = first + count;
  TESSERA_REQUIRE_LOCAL(dy_first <= first, "kernels::moe_combine_backward: dy starts at token ",
                        dy_first, ", after the first token ", first);
  const Backend& b = check("moe_combine_backward", {{"dy", dy, (end - dy_first) * C},
                                                    {"packed", packed, count * K * C},
                                                    {"row", row, end * K, kI32},
                                                    {"weight", weight, end * K},
                                                    {"d_packed", d_packed, count * K * C},
                                                    {"dweight", dweight, end * K}});
  TESSERA_KERNEL(b, moe_combine_backward)(f(dy), f(packed), i(row), f(weight), f(d_packed),
                                          f(dweight), first, count, dy_first, K, C);
}

void moe_router_backward(const Tensor& logits, const Tensor& scores, const Tensor& choice,
                         const Tensor& weight, const Tensor& dweight, const Tensor& f_,
                         const Tensor& dlogits, int64_t first, int64_t count, int64_t T, int64_t E,
                         int64_t K, bool sigmoid, double aux, double z) {
  const int64_t end = first + count, sequences = T > 0 ? (end + T - 1) / T : 0;
  const Backend& b = check("moe_router_backward", {{"logits", logits, end * E},
                                                   {"scores", scores, end * E},
                                                   {"choice", choice, end * K, kI32},
                                                   {"weight", weight, end * K},
                                                   {"dweight", dweight, end * K},
                                                   {"f", f_, opt(f_, sequences * E)},
                                                   {"dlogits", dlogits, count * E}});
  TESSERA_KERNEL(b, moe_router_backward)(f(logits), f(scores), i(choice), f(weight), f(dweight),
                                         f(f_), f(dlogits), first, count, T, E, K, sigmoid, aux,
                                         z);
}

}  // namespace tessera::kernels
