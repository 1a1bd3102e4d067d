// The cpu backend's table: every entry but the bf16 GEMM (not implemented on the CPU yet).
#include "kernels/backend.hpp"

namespace tessera::kernels {

const Backend& cpu_backend() {
  static const Backend table = [] {
    Backend b;
    b.name = "cpu";
    cpu::register_gemm(b);
    cpu::register_elementwise(b);
    cpu::register_cast(b);
    cpu::register_norm(b);
    cpu::register_activation(b);
    cpu::register_rope(b);
    cpu::register_attention(b);
    cpu::register_embedding(b);
    cpu::register_cross_entropy(b);
    cpu::register_adamw(b);
    return b;
  }();
  return table;
}

}  // namespace tessera::kernels
