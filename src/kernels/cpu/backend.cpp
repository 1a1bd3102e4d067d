// The cpu table: the Kokkos kernels in the host space (OpenMP), with oneDNN's GEMM and the
// blockwise attention of cpu/ (doc/kokkos.md: which kernels stay specialised, and why).
#include "kernels/backend.hpp"

namespace tessera::kernels {

const Backend& cpu_backend() {
  static const Backend table = [] {
    Backend b;
    b.name = "cpu";
    kokkos::register_all(b, kokkos::Target::host);
    cpu::register_gemm(b);
    cpu::register_attention(b);
    return b;
  }();
  return table;
}

}  // namespace tessera::kernels
