// A mixture of experts under context parallelism (doc/moe.md, "Context parallelism"). The
// routing is defined on whole sequences (capacity in token order, the balancing loss's loads
// per sequence), so every cp rank gathers the normed input of its micro-batch's sequences over
// cp (as sequence parallelism gathers it over tp), routes all of it, and then dispatches,
// combines and differentiates only the tokens it holds.
#include <algorithm>

#include "kernels/kernels.hpp"
#include "model/context_parallel.hpp"
#include "model/moe.hpp"

namespace tessera {

int Moe::cp_size(const StepContext& ctx) const {
  return int(cp::size(ctx));
}

// Made once (host memory: no allocation in steady state).
const std::vector<ContextParallel::Segment>& Moe::segments_of(int64_t rank) {
  if (cp_segments_.empty()) {
    ContextParallel other = cfg_.cp;
    for (int64_t r = 0; r < cfg_.cp.size; ++r)
      other.rank = r, cp_segments_.push_back(other.segments(cfg_.seq_len));
  }
  return cp_segments_[size_t(rank)];
}

// This rank's rows are laid out [segment][sequence][token of the segment]
// (ContextParallel::segments): row (g B + b) len + t is token b seq_len + pos0_g + t.
const std::vector<Moe::Run>& Moe::runs(const StepContext& ctx, int64_t first, int64_t count) {
  runs_.clear();
  if (cp_size(ctx) == 1) {
    runs_.push_back({first, first, count});
    return runs_;
  }
  const int64_t B = ctx.batch, T = cfg_.seq_len;
  const std::vector<ContextParallel::Segment>& segments = segments_of(cfg_.cp.rank);
  for (size_t g = 0; g < segments.size(); ++g) {
    const int64_t len = segments[g].len;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t l0 = (int64_t(g) * B + b) * len;
      const int64_t lo = std::max(l0, first), hi = std::min(l0 + len, first + count);
      if (lo < hi) runs_.push_back({b * T + segments[g].pos0 + lo - l0, lo, hi - lo});
    }
  }
  return runs_;
}

Tensor Moe::gather_sequences(StepContext& ctx, const Tensor& x) {
  const int64_t P = cp_size(ctx), B = ctx.batch, T = cfg_.seq_len, C = cfg_.d_model;
  const int64_t N = B * cfg_.seq_local();
  const Tensor stage = ctx.scratch.get(ScratchId::moe_cp_stage, {P * N, C});
  const Tensor whole = ctx.scratch.get(ScratchId::moe_cp_rows, {B * T, C});
  ctx.par.cp->all_gather(x.rows(0, N), stage);
  for (int64_t r = 0; r < P; ++r) {
    const std::vector<ContextParallel::Segment>& segments = segments_of(r);
    for (size_t g = 0; g < segments.size(); ++g) {
      const int64_t len = segments[g].len;
      for (int64_t b = 0; b < B; ++b)
        kernels::copy(stage.rows(r * N + (int64_t(g) * B + b) * len, len),
                      whole.rows(b * T + segments[g].pos0, len), len * C);
    }
  }
  return whole;
}

// The whole sequences' packed rows (moe_pack: expert by expert, tokens in order) restricted to
// this rank's tokens, in the same order: the experts see the same rows as the serial run's,
// fewer of them.
void Moe::own_rows(const StepContext& ctx, Saved& s, int64_t first, int64_t count) {
  const int64_t N = ctx.batch * cfg_.seq_len, K = cfg_.moe.top_k, E = cfg_.moe.experts;
  own_.assign(size_t(N), 0);
  for (const Run& u : runs(ctx, first, count))
    std::fill(own_.begin() + u.n, own_.begin() + u.n + u.count, char(1));
  int32_t* row = s.row.view().i32();
  const int32_t* choice = s.choice.view().i32();
  next_row_.assign(size_t(E), 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K; ++j)
      if (own_[size_t(n)] && row[n * K + j] >= 0) ++next_row_[size_t(choice[n * K + j])];
  s.offset[0] = 0;
  for (int64_t e = 0; e < E; ++e) {
    s.offset[size_t(e) + 1] = s.offset[size_t(e)] + next_row_[size_t(e)];
    next_row_[size_t(e)] = s.offset[size_t(e)];
  }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K; ++j)
      if (int32_t& r = row[n * K + j]; r >= 0)
        r = own_[size_t(n)] ? int32_t(next_row_[size_t(choice[n * K + j])]++) : -1;
}

}  // namespace tessera
