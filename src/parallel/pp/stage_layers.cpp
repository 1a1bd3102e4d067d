#include "parallel/pp/stage_layers.hpp"

#include <cmath>
#include <limits>
#include <string>

#include "core/error.hpp"

namespace tessera::pp {

ChunkCosts chunk_costs(const ModelConfig& c) {
  const double C = double(c.d_model), F = double(c.ffn_hidden), T = double(c.seq_len);
  const double qd = double(c.heads * c.head_dim), kvd = double(c.kv_heads * c.head_dim);
  ChunkCosts k;
  k.embedding = 0;
  k.block = 6 * (2 * C * qd + 2 * C * kvd + (c.arch == Arch::llama ? 3 : 2) * C * F) + 12 * T * qd;
  k.head = 6 * C * double(c.vocab_padded);
  return k;
}

std::vector<int64_t> balanced_chunk_sizes(int64_t layers, int model_chunks, const ChunkCosts& k) {
  const int C = model_chunks;
  const int64_t L = layers;
  TESSERA_REQUIRE(L >= C, "pipeline: model.layers = ", L, " cannot be cut into ", C,
                  " model chunks (parallel.pp x parallel.pp_virtual): a stage would be left "
                  "without layers; use at least ", C, " layers, or fewer stages or chunks");
  // best[c][i]: the cut of the first i blocks into chunks 0..c, as (most expensive chunk,
  // sum of squared chunk costs), compared in that order; from[c][i] the first block of c.
  struct Score {
    double max = std::numeric_limits<double>::infinity(), squares = 0;
    bool better(const Score& o) const {
      if (std::isinf(o.max)) return !std::isinf(max);
      const double tol = 1e-12 * std::max(std::abs(max), std::abs(o.max));
      if (std::abs(max - o.max) > tol) return max < o.max;
      return squares < o.squares * (1 - 1e-12);
    }
  };
  auto cost = [&](int c, int64_t blocks) {
    return double(blocks) * k.block + (c == 0 ? k.embedding : 0) + (c == C - 1 ? k.head : 0);
  };
  std::vector<std::vector<Score>> best(size_t(C), std::vector<Score>(size_t(L + 1)));
  std::vector<std::vector<int64_t>> from(size_t(C), std::vector<int64_t>(size_t(L + 1), 0));
  for (int64_t i = 1; i <= L; ++i) {
    const double x = cost(0, i);
    best[0][size_t(i)] = {x, x * x};
  }
  for (int c = 1; c < C; ++c)
    for (int64_t i = c + 1; i <= L; ++i)
      for (int64_t j = c; j < i; ++j) {  // chunk c holds blocks [j, i)
        const Score& prev = best[size_t(c - 1)][size_t(j)];
        const double x = cost(c, i - j);
        const Score s{std::max(prev.max, x), prev.squares + x * x};
        if (s.better(best[size_t(c)][size_t(i)])) best[size_t(c)][size_t(i)] = s, from[size_t(c)][size_t(i)] = j;
      }
  std::vector<int64_t> size(static_cast<size_t>(C), 0);
  int64_t end = L;
  for (int c = C - 1; c > 0; --c) {
    const int64_t begin = from[size_t(c)][size_t(end)];
    size[size_t(c)] = end - begin;
    end = begin;
  }
  size[0] = end;
  return size;
}

std::vector<int64_t> split_layers(const ModelConfig& cfg, int model_chunks, std::string_view spec) {
  const int C = model_chunks;
  const int64_t L = cfg.layers;
  if (spec == "balanced") return balanced_chunk_sizes(L, C, chunk_costs(cfg));
  if (spec == "even") {
    TESSERA_REQUIRE(L >= C && L % C == 0, "parallel.pp_layers = even: model.layers = ", L,
                    " is not divisible into pp x pp_virtual = ", C, " model chunks",
                    L < C ? " (a stage would be left without layers)" : "",
                    "; use parallel.pp_layers = balanced, list the layers per chunk, or change "
                    "the number of layers, stages or chunks");
    return std::vector<int64_t>(size_t(C), L / C);
  }
  std::vector<int64_t> size;
  const std::string text(spec);
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    size_t used = 0;
    long long n = -1;
    try {
      n = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TESSERA_REQUIRE(used > 0 && used == item.size(), "parallel.pp_layers = '", text,
                    "': expected balanced, even, or a comma-separated list of layers per model "
                    "chunk; '", item, "' is not a number");
    TESSERA_REQUIRE(n >= 1, "parallel.pp_layers = '", text, "': model chunk ", size.size(),
                    " gets ", n, " layers; a stage would be left without layers");
    size.push_back(n);
    at = comma + 1;
  }
  TESSERA_REQUIRE(int(size.size()) == C, "parallel.pp_layers = '", text, "' lists ", size.size(),
                  " model chunks but parallel.pp x parallel.pp_virtual = ", C);
  int64_t sum = 0;
  for (int64_t n : size) sum += n;
  TESSERA_REQUIRE(sum == L, "parallel.pp_layers = '", text, "' holds ", sum,
                  " layers but model.layers = ", L);
  return size;
}

std::vector<ChunkLayers> stage_layers(const std::vector<int64_t>& size, const ScheduleShape& shape,
                                      int stage) {
  const int C = int(size.size());
  TESSERA_REQUIRE(C == shape.model_chunks(), "pipeline: ", C, " model chunk sizes for ",
                  shape.stages, " stages x ", shape.chunks, " chunks");
  std::vector<ChunkLayers> out;
  for (int j = 0; j < shape.chunks; ++j) {
    const int c = shape.model_chunk(stage, j);
    int64_t first = 0;
    for (int k = 0; k < c; ++k) first += size[size_t(k)];
    out.push_back({first, first + size[size_t(c)], c == 0, c == C - 1});
  }
  return out;
}

}  // namespace tessera::pp
