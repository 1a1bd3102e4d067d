#include "model/weight_grads.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace tessera {

int WeightGrads::open() {
  auto free = std::find_if(sets_.begin(), sets_.end(), [](const Set& s) { return !s.busy; });
  if (free == sets_.end()) free = sets_.insert(sets_.end(), Set{});
  free->busy = true;
  free->used = free->used_in_regions = free->used_regions = 0;
  open_ = int(free - sets_.begin());
  return open_;
}

void WeightGrads::add(Allocator& alloc, const Tensor& dy, const Tensor& x, const Tensor* grad,
                      int64_t n, int64_t out, int64_t in) {
  Set& s = sets_[size_t(open_)];
  if (into_dy_.data) {  // rows of regions (a routed expert's): no buffers of its own
    if (s.used_in_regions == s.in_regions.size()) s.in_regions.emplace_back();
    Gemm& g = s.in_regions[s.used_in_regions++];
    kernels::transfer(dy, into_dy_, n * out);
    kernels::transfer(x, into_x_, n * in);
    g.part = part_, g.done = false, g.grad = grad, g.n = n, g.out = out, g.in = in;
    g.dy_in = into_dy_, g.x_in = into_x_;
    into_dy_ = into_x_ = Tensor{};
    return;
  }
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

Tensor WeightGrads::region(Allocator& alloc, int64_t numel, DType dtype) {
  Set& s = sets_[size_t(open_)];
  if (s.used_regions == s.regions.size()) s.regions.emplace_back();
  Buffer& b = s.regions[s.used_regions++];
  if (b.numel() < numel || b.view().dtype != dtype) {
    b = Buffer();  // freed first, as a GEMM's copies
    b = Buffer(alloc, Shape{numel}, dtype, Charge::activations);
  }
  return b.view().slice(0, numel);
}

void WeightGrads::run(int set, int part) {
  Set& s = sets_[size_t(set)];
  // Each GEMM adds into a weight of its own, so running the two lists one after the other
  // gives the bits of the fused backward.
  for (auto [list, used] : {std::pair{&s.gemms, s.used}, {&s.in_regions, s.used_in_regions}})
    for (size_t i = 0; i < used; ++i) {
      Gemm& g = (*list)[i];
      if (g.part != part || g.done) continue;
      TESSERA_REQUIRE_LOCAL(g.grad->data != nullptr, "internal: part ", part,
                            "'s gradients are not staged for its weight pass");
      const Tensor dy = g.dy_in.data ? g.dy_in : g.dy.view(), x = g.x_in.data ? g.x_in : g.x.view();
      kernels::matmul(dy.slice(0, g.n * g.out), x.slice(0, g.n * g.in), *g.grad, g.out, g.in, g.n,
                      true, false, 1.0f, 1.0f);
      g.done = true;
    }
}

void WeightGrads::release(int set) {
  Set& s = sets_[size_t(set)];
  for (auto [list, used] : {std::pair{&s.gemms, s.used}, {&s.in_regions, s.used_in_regions}})
    for (size_t i = 0; i < used; ++i)
      TESSERA_REQUIRE_LOCAL((*list)[i].done, "internal: a queued weight-gradient GEMM of part ",
                            (*list)[i].part, " never ran");
  s.busy = false;
  s.used = s.used_in_regions = s.used_regions = 0;
}

int64_t WeightGrads::bytes() const {
  int64_t total = 0;
  for (const Set& s : sets_)
    for (const Gemm& g : s.gemms)
      total += g.dy.numel() * int64_t(dtype_size(g.dy.view().dtype)) +
               g.x.numel() * int64_t(dtype_size(g.x.view().dtype));
  for (const Set& s : sets_)
    for (const Buffer& b : s.regions) total += b.numel() * int64_t(dtype_size(b.view().dtype));
  return total;
}

}  // namespace tessera
