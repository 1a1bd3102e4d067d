#include "train/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/rng.hpp"
#include "kernels/kernels.hpp"

namespace tessera {

std::vector<int32_t> generate(Transformer& model, StepContext ctx, std::vector<int32_t> prompt,
                              const SampleOptions& opt) {
  const ModelConfig& c = model.config();
  const int64_t T = c.seq_len, V = c.vocab;
  ctx.batch = 1;
  ctx.training = false;
  std::vector<int32_t> window(size_t(T), 0), out;
  std::vector<float> logits(size_t(T * V));
  std::vector<int32_t> order(static_cast<size_t>(V));
  const CounterRng rng(opt.seed, "sample");
  // A model in device memory reads the window from, and writes the logits to, device buffers
  // that the host vectors are copied through.
  const bool device = ctx.alloc.space() != Space::host;
  Buffer device_window, device_logits;
  if (device) {
    device_window = Buffer(ctx.alloc, Shape{1, T}, DType::i32, Charge::workspace);
    device_logits = Buffer(ctx.alloc, Shape{T, V}, DType::f32, Charge::activations);
  }
  if (prompt.empty()) prompt.push_back(0);
  for (int64_t n = 0; n < opt.length; ++n) {
    // Causal attention: positions after the last real token do not affect its logits, so the
    // window is the last T tokens, left-aligned, padded with zeros.
    const int64_t len = std::min<int64_t>(T, int64_t(prompt.size()));
    std::copy(prompt.end() - len, prompt.end(), window.begin());
    const Tensor w = view_of(window.data(), {1, T}), l = view_of(logits.data(), {T, V});
    if (device) {
      kernels::transfer(w, device_window.view(), T);
      model.logits(ctx, device_window.view(), device_logits.view());
      kernels::transfer(device_logits.view(), l, T * V);
    } else {
      model.logits(ctx, w, l);
    }
    const float* row = logits.data() + (len - 1) * V;
    int32_t next;
    if (opt.temperature <= 0) {
      next = int32_t(std::max_element(row, row + V) - row);
    } else {
      std::iota(order.begin(), order.end(), 0);
      const int64_t k = opt.top_k > 0 ? std::min(opt.top_k, V) : V;
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t a, int32_t b) { return row[a] > row[b]; });
      std::vector<double> p(static_cast<size_t>(k));
      double sum = 0;
      for (int64_t i = 0; i < k; ++i)
        sum += p[size_t(i)] = std::exp((row[order[size_t(i)]] - row[order[0]]) / opt.temperature);
      double u = rng.uniform(uint64_t(n)) * sum;
      int64_t i = 0;
      while (i + 1 < k && (u -= p[size_t(i)]) > 0) ++i;
      next = order[size_t(i)];
    }
    if (next == opt.stop_id) break;
    out.push_back(next);
    prompt.push_back(next);
  }
  return out;
}

}  // namespace tessera
