// The cuda table: the Kokkos kernels in the CUDA space, with cuBLAS's GEMMs and the tiled
// attention of cuda/.
#include "kernels/backend.hpp"

namespace tessera::kernels {

const Backend& cuda_backend() {
  static const Backend table = [] {
    Backend b;
    b.name = "cuda";
    kokkos::register_all(b, kokkos::Target::cuda);
    cuda::register_gemm(b);
    cuda::register_attention(b);
    return b;
  }();
  return table;
}

}  // namespace tessera::kernels
