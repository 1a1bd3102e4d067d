#include "parallel/pp/executor.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace tessera::pp {

Executor::Executor(Communicator& pp, const ScheduleShape& shape, Shape message, Allocator& alloc)
    : pp_(pp), shape_(shape), stage_(pp.rank()), message_(message), alloc_(alloc) {
  TESSERA_REQUIRE(pp.size() == shape.stages, "pipeline executor: the pipeline group has ",
                  pp.size(), " ranks but the schedule ", shape.stages, " stages");
  ops_ = make_schedule(shape).stages[size_t(stage_)];
  require_tags(shape, pp.max_tag());  // tags stay below 2 m (C - 1)
  const size_t n = size_t(shape.micro_batches) * size_t(shape.chunks);
  recv_act_.resize(n), recv_grad_.resize(n), send_act_.resize(n), send_grad_.resize(n);
  pairs_ = op_pairs(shape, ops_);  // dualpipev's; none for another kind
  paired_ops_ = int64_t(pairs_.size());
}

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

MessageTiming& MessageTiming::operator+=(const MessageTiming& o) {
  received += o.received, received_early += o.received_early, recv_wait += o.recv_wait;
  sent += o.sent, send_flight += o.send_flight, send_exposed += o.send_exposed;
  return *this;
}

void Executor::poll() {
  if (!in_step_) return;
  for (std::vector<InFlight>* list : {&receives_, &sends_})
    for (InFlight& m : *list)
      if (m.seen < 0 && m.posted > 0 && m.request.test()) m.seen = now();
}

Tensor StageWork::backward_input(int, int, int, const Tensor&) {
  TESSERA_REQUIRE_LOCAL(false, "pipeline executor: this stage cannot split its backward");
  return {};
}

void StageWork::backward_weight(int, int) {
  TESSERA_REQUIRE_LOCAL(false, "pipeline executor: this stage cannot split its backward");
}

void StageWork::run_pair(const std::function<void()>& forward,
                         const std::function<void()>& backward_input) {
  forward();
  backward_input();
}

Buffer& Executor::buffer(std::vector<Buffer>& pool, int micro, int chunk) {
  Buffer& b = pool[size_t(micro) * size_t(shape_.chunks) + size_t(chunk)];
  if (b.numel() != message_.numel()) b = Buffer(alloc_, message_, DType::f32, Charge::comm);
  return b;
}

Tensor Executor::compute(StageWork& work, const Op& op, std::vector<int>& slot_of,
                         std::vector<char>& slot_busy, bool alone) {
  const size_t i = size_t(op.micro) * size_t(shape_.chunks) + size_t(op.chunk);
  const int C = shape_.model_chunks();
  const int model_chunk = shape_.model_chunk(stage_, op.chunk);
  Tensor out;
  TraceSpan span(alone ? trace_ : nullptr, TraceKind::compute,
                 op.kind == Op::forward          ? "forward"
                 : op.kind == Op::backward       ? "backward"
                 : op.kind == Op::backward_input ? "backward-input"
                                                 : "backward-weight");
  span.micro(op.micro, op.chunk);
  const auto t0 = std::chrono::steady_clock::now();
  if (op.kind == Op::forward) {
    auto free = std::find(slot_busy.begin(), slot_busy.end(), 0);
    const int slot = int(free - slot_busy.begin());
    if (free == slot_busy.end()) slot_busy.push_back(1);
    else *free = 1;
    peak_slots_ = std::max(peak_slots_, int(slot_busy.size()));
    peak_in_flight_ = std::max(peak_in_flight_, ++in_flight_);
    slot_of[i] = slot;
    out = work.forward(op.micro, op.chunk, slot,
                       model_chunk == 0 ? Tensor{} : buffer(recv_act_, op.micro, op.chunk).view());
  } else if (op.kind == Op::backward_weight) {
    work.backward_weight(op.micro, op.chunk);
    --in_flight_;
  } else {
    const int slot = slot_of[i];
    TESSERA_REQUIRE_LOCAL(slot >= 0, "pipeline executor: backward before forward of micro-batch ",
                          op.micro, " chunk ", op.chunk);
    const Tensor dy =
        model_chunk == C - 1 ? Tensor{} : buffer(recv_grad_, op.micro, op.chunk).view();
    out = op.kind == Op::backward ? work.backward(op.micro, op.chunk, slot, dy)
                                  : work.backward_input(op.micro, op.chunk, slot, dy);
    slot_busy[size_t(slot)] = 0;
    slot_of[i] = -1;
    in_flight_ -= op.kind == Op::backward;
  }
  if (alone)
    last_compute_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

void Executor::wait_recv(const Op& op, bool paired) {
  const size_t n = size_t(shape_.micro_batches) * size_t(shape_.chunks);
  const size_t i = size_t(op.micro) * size_t(shape_.chunks) + size_t(op.chunk);
  TraceSpan span(trace_, TraceKind::p2p, "recv-wait");
  span.micro(op.micro, op.chunk)
      .message(op.kind == Op::recv_act ? "activation" : "gradient", op.peer,
               message_.numel() * int64_t(sizeof(float)));
  const int kind = op.kind == Op::recv_act ? 0 : 1;
  InFlight& m = receives_[(kind ? n : 0) + i];
  const double t0 = now();
  const bool early = m.seen >= 0 || m.request.test();
  m.request.wait();
  m.seen = m.seen < 0 ? now() : m.seen;
  for (MessageTiming* t : {&last_messages_[kind], paired ? &last_paired_ : nullptr})
    if (t) ++t->received, t->received_early += early, t->recv_wait += now() - t0;
  last_wait_ += now() - t0;
}

Tensor Executor::turn(const Op& op, Tensor out) {
  // The turn of a V: the other chunk on this stage takes the tensor (no message).
  const int C = shape_.model_chunks();
  const int model_chunk = shape_.model_chunk(stage_, op.chunk);
  const int next = op.kind == Op::forward ? model_chunk + 1 : model_chunk - 1;
  if (out.data && next >= 0 && next < C && shape_.stage_of(next) == stage_) {
    const int k = shape_.local_chunk_of(next);
    Buffer& b = buffer(op.kind == Op::forward ? recv_act_ : recv_grad_, op.micro, k);
    kernels::transfer(out, b.view(), b.numel());
    return Tensor{};
  }
  return out;
}

void Executor::send(const Op& op, const Tensor& out, bool paired) {
  TESSERA_REQUIRE_LOCAL(out.data != nullptr, "pipeline executor: nothing to send at ",
                        to_string(op.kind), " of micro-batch ", op.micro);
  TESSERA_REQUIRE_LOCAL(out.dtype == DType::f32 && out.numel() == message_.numel(),
                        "pipeline executor: the output of micro-batch ", op.micro, " is ",
                        dtype_name(out.dtype), " ", out.shape.str(), ", the message f32 ",
                        message_.str());
  TraceSpan span(trace_, TraceKind::p2p, "send");
  span.micro(op.micro, op.chunk)
      .message(op.kind == Op::send_act ? "activation" : "gradient", op.peer,
               message_.numel() * int64_t(sizeof(float)));
  Buffer& b = buffer(op.kind == Op::send_act ? send_act_ : send_grad_, op.micro, op.chunk);
  kernels::transfer(out, b.view(), b.numel());  // in the buffers' space
  InFlight m;
  m.request = pp_.isend(b.view(), op.peer, message_tag(shape_, message_of(shape_, stage_, op)));
  m.kind = op.kind == Op::send_act ? 0 : 1, m.paired = paired, m.posted = now();
  sends_.push_back(std::move(m));
}

// Both passes' messages are waited before the pair and sent after it: each pass's data flows
// one way (F0 and B1 down the stages, F1 and B0 up), so a pair waits only on the previous
// stage's pair (PipelineSchedule.PairedOpsCompleteGrouped simulates every shape).
void Executor::run_pair(StageWork& work, const OpPair& p, std::vector<int>& slot_of,
                        std::vector<char>& slot_busy) {
  for (size_t k = p.begin; k < p.end; ++k)
    if (ops_[k].is_recv()) wait_recv(ops_[k], true);
  const Op& f = ops_[p.forward];
  const Op& b = ops_[p.backward];
  Tensor out_f, out_b;
  {
    TraceSpan span(trace_, TraceKind::compute, "forward+backward-input");
    span.micro(f.micro, f.chunk);
    const auto t0 = std::chrono::steady_clock::now();
    work.run_pair([&] { out_f = compute(work, f, slot_of, slot_busy, false); },
                  [&] { out_b = compute(work, b, slot_of, slot_busy, false); });
    last_compute_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  out_f = turn(f, out_f), out_b = turn(b, out_b);
  for (size_t k = p.begin; k < p.end; ++k)
    if (ops_[k].is_send()) send(ops_[k], ops_[k].kind == Op::send_act ? out_f : out_b, true);
  ++pairs_run_;
}

void Executor::run(StageWork& work) {
  const size_t n = size_t(shape_.micro_batches) * size_t(shape_.chunks);
  auto index = [&](const Op& op) { return size_t(op.micro) * size_t(shape_.chunks) + size_t(op.chunk); };
  // Every message this stage receives in the step, posted now: each has its own tag.
  receives_.assign(2 * n, InFlight{});
  sends_.clear();
  sends_.reserve(ops_.size());
  for (MessageTiming& t : last_messages_) t = MessageTiming{};
  for (const Op& op : ops_) {
    if (!op.is_recv()) continue;
    const int tag = message_tag(shape_, message_of(shape_, stage_, op));
    const bool act = op.kind == Op::recv_act;
    Buffer& b = buffer(act ? recv_act_ : recv_grad_, op.micro, op.chunk);
    InFlight& m = receives_[(act ? 0 : n) + index(op)];
    m.request = pp_.irecv(b.view(), op.peer, tag);
    m.kind = act ? 0 : 1, m.posted = now();
  }
  in_step_ = true;
  std::vector<int> slot_of(n, -1);
  std::vector<char> slot_busy;
  Tensor out;  // output of the last compute, for the send after it
  last_wait_ = 0, last_compute_ = 0, last_paired_ = MessageTiming{};
  const bool paired = work.interleaves() && !pairs_.empty();
  auto pair = pairs_.begin();
  for (size_t k = 0; k < ops_.size(); ++k) {
    if (paired && pair != pairs_.end() && pair->begin == k) {
      run_pair(work, *pair, slot_of, slot_busy);
      k = pair->end - 1;
      ++pair;
      continue;
    }
    const Op& op = ops_[k];
    switch (op.kind) {
      case Op::recv_act:
      case Op::recv_grad:
        wait_recv(op, false);
        break;
      case Op::forward:
      case Op::backward:
      case Op::backward_input:
      case Op::backward_weight:
        out = turn(op, compute(work, op, slot_of, slot_busy));
        break;
      case Op::send_act:
      case Op::send_grad:
        send(op, out, false);
        out = Tensor{};
        break;
    }
  }
  {
    TraceSpan span(trace_, TraceKind::p2p, "send-wait");
    for (InFlight& m : sends_) {
      MessageTiming& t = last_messages_[m.kind];
      const double t0 = now();
      m.request.wait();
      const double exposed = m.seen < 0 ? now() - t0 : 0;
      if (m.seen < 0) m.seen = now();
      for (MessageTiming* x : {&t, m.paired ? &last_paired_ : nullptr})
        if (x) ++x->sent, x->send_flight += m.seen - m.posted, x->send_exposed += exposed;
    }
  }
  in_step_ = false;
  total_paired_ += last_paired_;
  for (int k = 0; k < 2; ++k) total_messages_[k] += last_messages_[k];
  total_wait_ += last_wait_;
  total_compute_ += last_compute_;
}

}  // namespace tessera::pp
