#include "model/weight_grads.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace tessera {

int WeightGrads::open() {
  auto free = std::find_if(sets_.begin(), sets_.end(), [](const Set& s) { return !s.busy; });
  if (free == sets_.end()) free = sets_.insert(sets_.end(), Set{});
  free->busy = true;
  free->used = 0;
  open_ = int(free - sets_.begin());
  return open_;
}

void WeightGrads::add(Allocator& alloc, const Tensor& dy, const Tensor& x, const Tensor* grad,
                      int64_t n, int64_t out, int64_t in) {
  Set& s = sets_[size_t(open_)];
  if (s.used == s.gemms.size()) s.gemms.emplace_back();
  Gemm& g = s.gemms[s.used++];
  // A buffer only grows: a set is taken by B's of different chunks (and a mixture of experts'
  // GEMMs change their rows every step), and steady-state steps allocate nothing.
  auto keep = [&](Buffer& b, const Tensor& t, int64_t numel) {
    if (b.numel() < numel || b.view().dtype != t.dtype) {
      b = Buffer();  // freed first: what a set holds is its largest GEMMs (tessera-plan)
      b = Buffer(alloc, Shape{numel}, t.dtype, Charge::activations);
    }
    kernels::transfer(t, b.view(), numel);
  };
  keep(g.dy, dy, n * out);
  keep(g.x, x, n * in);
  g.part = part_, g.done = false, g.grad = grad, g.n = n, g.out = out, g.in = in;
}

void WeightGrads::run(int set, int part) {
  Set& s = sets_[size_t(set)];
  for (size_t i = 0; i < s.used; ++i) {
    Gemm& g = s.gemms[i];
    if (g.part != part || g.done) continue;
    TESSERA_REQUIRE_LOCAL(g.grad->data != nullptr, "internal: part ", part,
                          "'s gradients are not staged for its weight pass");
    kernels::matmul(g.dy.view().slice(0, g.n * g.out), g.x.view().slice(0, g.n * g.in), *g.grad,
                    g.out, g.in, g.n, true, false, 1.0f, 1.0f);
    g.done = true;
  }
}

void WeightGrads::release(int set) {
  Set& s = sets_[size_t(set)];
  for (size_t i = 0; i < s.used; ++i)
    TESSERA_REQUIRE_LOCAL(s.gemms[i].done, "internal: a queued weight-gradient GEMM of part ",
                          s.gemms[i].part, " never ran");
  s.busy = false;
  s.used = 0;
}

int64_t WeightGrads::bytes() const {
  int64_t total = 0;
  for (const Set& s : sets_)
    for (const Gemm& g : s.gemms)
      total += g.dy.numel() * int64_t(dtype_size(g.dy.view().dtype)) +
               g.x.numel() * int64_t(dtype_size(g.x.view().dtype));
  return total;
}

}  // namespace tessera
