// The cpu table: the Kokkos kernels in the host space (OpenMP), with oneDNN's GEMM and the
// blockwise attention of cpu/ (doc/kokkos.md: which kernels stay specialised, and why).
#include "kernels/backend.hpp"

namespace tessera::kernels {

const Backend& cpu_backend() {
  static const Backend table = [] {
    Backend b;
    b.name = "cpu";
    const kokkos::Target host = kokkos::Target::host;
    kokkos::register_elementwise(b, host);
    kokkos::register_cast(b, host);
    kokkos::register_norm(b, host);
    kokkos::register_activation(b, host);
    kokkos::register_rope(b, host);
    kokkos::register_embedding(b, host);
    kokkos::register_cross_entropy(b, host);
    kokkos::register_adamw(b, host);
    cpu::register_gemm(b);
    cpu::register_attention(b);
    return b;
  }();
  return table;
}

}  // namespace tessera::kernels
