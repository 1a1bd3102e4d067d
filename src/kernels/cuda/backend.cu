// The cuda table: the Kokkos kernels in the CUDA space, with cuBLAS's GEMMs and the tiled
// attention of cuda/.
#include "kernels/backend.hpp"

namespace tessera::kernels {

const Backend& cuda_backend() {
  static const Backend table = [] {
    Backend b;
    b.name = "cuda";
    const kokkos::Target gpu = kokkos::Target::cuda;
    kokkos::register_elementwise(b, gpu);
    kokkos::register_cast(b, gpu);
    kokkos::register_norm(b, gpu);
    kokkos::register_activation(b, gpu);
    kokkos::register_rope(b, gpu);
    kokkos::register_embedding(b, gpu);
    kokkos::register_cross_entropy(b, gpu);
    kokkos::register_adamw(b, gpu);
    cuda::register_gemm(b);
    cuda::register_attention(b);
    return b;
  }();
  return table;
}

}  // namespace tessera::kernels
