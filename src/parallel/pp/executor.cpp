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

Buffer& Executor::buffer(std::vector<Buffer>& pool, int micro, int chunk) {
  Buffer& b = pool[size_t(micro) * size_t(shape_.chunks) + size_t(chunk)];
  if (b.numel() != message_.numel()) b = Buffer(alloc_, message_, DType::f32, Charge::comm);
  return b;
}

Tensor Executor::compute(StageWork& work, const Op& op, std::vector<int>& slot_of,
                         std::vector<char>& slot_busy) {
  const size_t i = size_t(op.micro) * size_t(shape_.chunks) + size_t(op.chunk);
  const int C = shape_.model_chunks();
  const int model_chunk = shape_.model_chunk(stage_, op.chunk);
  Tensor out;
  TraceSpan span(trace_, TraceKind::compute,
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
  last_compute_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
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
  const int64_t bytes = message_.numel() * int64_t(sizeof(float));
  last_wait_ = 0, last_compute_ = 0;
  for (const Op& op : ops_) {
    const size_t i = index(op);
    const int C = shape_.model_chunks();
    const int model_chunk = shape_.model_chunk(stage_, op.chunk);
    switch (op.kind) {
      case Op::recv_act:
      case Op::recv_grad: {
        TraceSpan span(trace_, TraceKind::p2p, "recv-wait");
        span.micro(op.micro, op.chunk)
            .message(op.kind == Op::recv_act ? "activation" : "gradient", op.peer, bytes);
        const int kind = op.kind == Op::recv_act ? 0 : 1;
        InFlight& m = receives_[(kind ? n : 0) + i];
        MessageTiming& t = last_messages_[kind];
        const double t0 = now();
        ++t.received;
        t.received_early += m.seen >= 0 || m.request.test();
        m.request.wait();
        m.seen = m.seen < 0 ? now() : m.seen;
        last_wait_ += now() - t0, t.recv_wait += now() - t0;
        break;
      }
      case Op::forward:
      case Op::backward:
      case Op::backward_input:
      case Op::backward_weight: {
        out = compute(work, op, slot_of, slot_busy);
        // The turn of a V: the other chunk on this stage takes the tensor (no message).
        const int next = op.kind == Op::forward ? model_chunk + 1 : model_chunk - 1;
        if (out.data && next >= 0 && next < C && shape_.stage_of(next) == stage_) {
          const int k = shape_.local_chunk_of(next);
          Buffer& b = buffer(op.kind == Op::forward ? recv_act_ : recv_grad_, op.micro, k);
          kernels::transfer(out, b.view(), b.numel());
          out = Tensor{};
        }
        break;
      }
      case Op::send_act:
      case Op::send_grad: {
        TESSERA_REQUIRE_LOCAL(out.data != nullptr, "pipeline executor: nothing to send at ",
                              to_string(op.kind), " of micro-batch ", op.micro);
        TESSERA_REQUIRE_LOCAL(out.dtype == DType::f32 && out.numel() == message_.numel(),
                              "pipeline executor: the output of micro-batch ", op.micro, " is ",
                              dtype_name(out.dtype), " ", out.shape.str(), ", the message f32 ",
                              message_.str());
        TraceSpan span(trace_, TraceKind::p2p, "send");
        span.micro(op.micro, op.chunk)
            .message(op.kind == Op::send_act ? "activation" : "gradient", op.peer, bytes);
        Buffer& b = buffer(op.kind == Op::send_act ? send_act_ : send_grad_, op.micro, op.chunk);
        kernels::transfer(out, b.view(), b.numel());  // in the buffers' space
        InFlight m;
        m.request = pp_.isend(b.view(), op.peer, message_tag(shape_, message_of(shape_, stage_, op)));
        m.kind = op.kind == Op::send_act ? 0 : 1, m.posted = now();
        sends_.push_back(std::move(m));
        out = Tensor{};
        break;
      }
    }
  }
  {
    TraceSpan span(trace_, TraceKind::p2p, "send-wait");
    for (InFlight& m : sends_) {
      MessageTiming& t = last_messages_[m.kind];
      const double t0 = now();
      m.request.wait();
      if (m.seen < 0) m.seen = now(), t.send_exposed += m.seen - t0;
      ++t.sent;
      t.send_flight += m.seen - m.posted;
    }
  }
  in_step_ = false;
  for (int k = 0; k < 2; ++k) total_messages_[k] += last_messages_[k];
  total_wait_ += last_wait_;
  total_compute_ += last_compute_;
}

}  // namespace tessera::pp
