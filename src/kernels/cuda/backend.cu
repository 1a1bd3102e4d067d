// The cuda backend's table: every entry, the bf16 GEMM included.
#include "kernels/backend.hpp"

namespace tessera::kernels {

const Backend& cuda_backend() {
  static const Backend table = [] {
    Backend b;
    b.name = "cuda";
    cuda::register_gemm(b);
    cuda::register_elementwise(b);
    cuda::register_norm(b);
    cuda::register_activation(b);
    cuda::register_rope(b);
    cuda::register_attention(b);
    cuda::register_embedding(b);
    cuda::register_cross_entropy(b);
    cuda::register_adamw(b);
    return b;
  }();
  return table;
}

}  // namespace tessera::kernels
