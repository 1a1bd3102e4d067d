#include "model/pass_pair.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#include "core/error.hpp"
#include "model/transfers.hpp"

namespace tessera {
namespace {
size_t page_size() {
  return size_t(sysconf(_SC_PAGESIZE));
}
}  // namespace

PassPair::PassPair(size_t stack_bytes) : stack_bytes_(stack_bytes) {}

PassPair::~PassPair() {
  if (stacks_) munmap(stacks_, 2 * (stack_bytes_ + page_size()));
}

// makecontext passes int arguments only: the PassPair's address in two halves and the pass.
void PassPair::entry(unsigned hi, unsigned lo) {
  const uintptr_t p = (uintptr_t(hi) << 32) | uintptr_t(lo);
  PassPair* pair = reinterpret_cast<PassPair*>(p & ~uintptr_t(1));
  pair->body(int(p & 1));
}

void PassPair::body(int i) {
  try {
    (*fn_[i])();
  } catch (...) {
    error_ = std::current_exception();
  }
  done_[i] = true;
  swapcontext(&fiber_[i], &main_);  // never resumed
}

void PassPair::run(const std::function<void()>& first, const std::function<void()>& second) {
  TESSERA_REQUIRE_LOCAL(!running_, "paired passes: a pair started inside a pair");
  const size_t page = page_size();
  if (!stacks_) {
    // Each stack sits above a page that faults on touch, so an overflow stops the run.
    void* m = mmap(nullptr, 2 * (stack_bytes_ + page), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    TESSERA_REQUIRE_LOCAL(m != MAP_FAILED, "paired passes: cannot map two stacks of ", stack_bytes_,
                          " bytes");
    stacks_ = static_cast<char*>(m);
    mprotect(stacks_, page, PROT_NONE);
    mprotect(stacks_ + stack_bytes_ + page, page, PROT_NONE);
  }
  fn_[0] = &first, fn_[1] = &second;
  error_ = nullptr;
  for (int i = 0; i < 2; ++i) {
    done_[i] = false, parked_[i] = nullptr;
    getcontext(&fiber_[i]);
    fiber_[i].uc_stack.ss_sp = stacks_ + size_t(i) * (stack_bytes_ + page) + page;
    fiber_[i].uc_stack.ss_size = stack_bytes_;
    fiber_[i].uc_link = nullptr;
    const uintptr_t p = reinterpret_cast<uintptr_t>(this) | uintptr_t(i);
    makecontext(&fiber_[i], reinterpret_cast<void (*)()>(&PassPair::entry), 2, unsigned(p >> 32),
                unsigned(p & 0xffffffffu));
  }
  running_ = true;
  current_ = 0;
  while (!done_[0] || !done_[1]) {
    if (done_[current_]) current_ = 1 - current_;
    swapcontext(&main_, &fiber_[current_]);
    if (error_) break;
    if (!done_[1 - current_]) current_ = 1 - current_;
  }
  running_ = false;
  fn_[0] = fn_[1] = nullptr;
  parked_[0] = parked_[1] = nullptr;
  ++pairs_;
  if (error_) std::rethrow_exception(error_);
}

void PassPair::await(StepTransfers& t) {
  if (!running_ || t.empty() || done_[1 - current_]) return;
  crossed_ += t.size();
  switch_away(&t);
}

void PassPair::give_way() {
  if (running_ && !done_[1 - current_]) switch_away(nullptr);
}

void PassPair::let_other_finish() {
  while (running_ && !done_[1 - current_]) switch_away(nullptr);
}

// While the other pass has not ended (the callers check): parks `parked` for the other's polls
// and resumes the other pass; returns when run() resumes this one.
void PassPair::switch_away(StepTransfers* parked) {
  const int me = current_;
  parked_[me] = parked;
  ++switches_;
  swapcontext(&fiber_[me], &main_);
  parked_[me] = nullptr;
}

void PassPair::poll_other() {
  if (!running_) return;
  if (StepTransfers* t = parked_[1 - current_]) t->poll();
}

}  // namespace tessera
