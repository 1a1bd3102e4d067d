#include "perf/memory.hpp"

namespace tessera {

ModelStateBytes zero_model_state(int stage, double psi, double n, Precision precision) {
  ModelStateBytes b;
  if (precision == Precision::fp32) {
    b.params = stage >= 3 ? 4 * psi / n : 4 * psi;
    b.grads = stage == 0 ? 4 * psi : stage == 1 ? 4 * psi + 4 * psi / n : 4 * psi / n;
    b.optimizer = stage >= 1 ? 8 * psi / n : 8 * psi;
  } else {  // bf16/fp16 parameters and gradients, fp32 master weights and moments (12 bytes)
    b.params = stage >= 3 ? 2 * psi / n : 2 * psi;
    b.grads = stage >= 2 ? 2 * psi / n : 2 * psi;
    b.optimizer = stage >= 1 ? 12 * psi / n : 12 * psi;
  }
  return b;
}

const char* zero_formula(int stage, Precision precision) {
  static const char* fp32[] = {"16Psi", "8Psi + 12Psi/N", "4Psi + 12Psi/N", "16Psi/N"};
  static const char* mixed[] = {"16Psi", "4Psi + 12Psi/N", "2Psi + 14Psi/N", "16Psi/N"};
  return (precision == Precision::fp32 ? fp32 : mixed)[stage];
}

}  // namespace tessera
