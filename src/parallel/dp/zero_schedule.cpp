#include "parallel/dp/zero_schedule.hpp"

#include <algorithm>

namespace tessera {

ZeroSchedule::ZeroSchedule(int stage, PartAccess access, std::vector<int64_t> size, int inflight)
    : stage_(stage),
      access_(access),
      size_(std::move(size)),
      inflight_(std::max(1, inflight)),
      deferred_(size_.size(), false),
      gathered_(size_.size(), false),
      staged_(size_.size(), false),
      reducing_(size_.size(), false) {}

std::vector<ZeroAction> ZeroSchedule::initialize() const {
  std::vector<ZeroAction> out;
  if (stage_ == 3)  // one part whole at a time: no full copy of the model is ever made
    for (size_t q = 0; q < size_.size(); ++q)
      if (size_[q] > 0) out.push_back({ZeroAction::build, int(q)});
  return out;
}

void ZeroSchedule::begin_step() { reducing_.assign(reducing_.size(), false); }

void ZeroSchedule::prefetch(int part, std::vector<ZeroAction>& out) {
  if (gathered_[size_t(part)] || size_[size_t(part)] == 0) return;
  gathered_[size_t(part)] = true;
  out.push_back({ZeroAction::fetch, part});
}

void ZeroSchedule::need(int part, std::vector<ZeroAction>& out) {
  prefetch(part, out);
  if (gathered_[size_t(part)]) out.push_back({ZeroAction::wait, part});
}

void ZeroSchedule::drop(int part, std::vector<ZeroAction>& out) {
  if (!gathered_[size_t(part)]) return;
  gathered_[size_t(part)] = false;
  out.push_back({ZeroAction::release, part});
}

void ZeroSchedule::reduce(int part, std::vector<ZeroAction>& out) {
  if (size_[size_t(part)] == 0) return;  // a part another pipeline stage holds
  if (stage_ == 1) {  // straight from the full gradient buffer: nothing staged, no bound
    reducing_[size_t(part)] = true;
    pending_.push_back(part);
    out.push_back({ZeroAction::reduce, part});
    return;
  }
  if (!staged_[size_t(part)]) return;  // nothing was written
  while (int(pending_.size()) >= inflight_) {
    out.push_back({ZeroAction::retire, pending_.front()});
    pending_.pop_front();
  }
  staged_[size_t(part)] = false;
  pending_.push_back(part);
  out.push_back({ZeroAction::reduce, part});
}

std::vector<ZeroAction> ZeroSchedule::begin(int part, Pass pass, bool training) {
  std::vector<ZeroAction> out;
  if (stage_ < 2) return out;
  if (stage_ == 3) {
    for (int q : access_.reads(part, pass)) need(q, out);
    // Start the next pass's gather now so it overlaps this part's compute.
    const int next = pass == Pass::forward ? part + 1 : part - 1;
    if (next >= 0 && next <= access_.head)
      for (int q : access_.reads(next, pass)) prefetch(q, out);
  }
  if (training)
    for (int q : access_.writes_grads(part, pass))
      if (!staged_[size_t(q)] && size_[size_t(q)] > 0) {
        staged_[size_t(q)] = true;
        out.push_back({ZeroAction::stage, q});
      }
  return out;
}

std::vector<ZeroAction> ZeroSchedule::end(int part, Pass pass, bool training, bool armed) {
  std::vector<ZeroAction> out;
  const bool final_grads = training && pass == access_.final_pass() && !deferred_[size_t(part)];
  if (stage_ == 1) {
    if (final_grads && armed) reduce(part, out);
    return out;
  }
  if (stage_ == 3) {
    // Release what this pass read, except the head's parameters, which its backward (next,
    // in training) reads again.
    const bool head_backward_next = training && pass == Pass::forward && part == access_.head;
    const std::vector<int> keep =
        head_backward_next ? access_.reads(part, Pass::backward) : std::vector<int>{};
    for (int q : access_.reads(part, pass))
      if (std::find(keep.begin(), keep.end(), q) == keep.end()) drop(q, out);
  }
  if (final_grads) reduce(part, out);  // its gradients are final for this micro-batch
  return out;
}

std::vector<ZeroAction> ZeroSchedule::finish() {
  std::vector<ZeroAction> out;
  for (size_t q = 0; q < size_.size(); ++q)
    if (stage_ == 1 ? !reducing_[q] : staged_[q]) reduce(int(q), out);
  for (int part : pending_) out.push_back({ZeroAction::retire, part});
  pending_.clear();
  for (size_t q = 0; q < size_.size(); ++q) drop(int(q), out);  // nothing stays gathered
  return out;
}

}  // namespace tessera
