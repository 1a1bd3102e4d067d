#include "core/trace.hpp"

#include <chrono>

namespace tessera {

int trace_lane(TraceKind k) {
  switch (k) {
    case TraceKind::step:
    case TraceKind::phase:
      return 0;
    case TraceKind::compute:
    case TraceKind::p2p:
      return 1;
    case TraceKind::collective:
      return 2;
  }
  return 0;
}

const char* trace_lane_name(int lane) {
  static const char* names[kTraceLanes] = {"steps and phases", "pipeline", "collectives"};
  return lane >= 0 && lane < kTraceLanes ? names[lane] : "?";
}

const char* to_string(TraceKind k) {
  switch (k) {
    case TraceKind::step:
      return "step";
    case TraceKind::phase:
      return "phase";
    case TraceKind::compute:
      return "compute";
    case TraceKind::p2p:
      return "p2p";
    case TraceKind::collective:
      return "collective";
  }
  return "?";
}

double Trace::steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Trace::Trace(int64_t steps, int64_t capacity, Clock clock)
    : clock_(clock), steps_(steps), capacity_(capacity) {
  events_.reserve(size_t(capacity));
}

void Trace::begin_step(int64_t step) {
  if (first_ < 0) first_ = step;
  step_ = step;
  recording_ = step < first_ + steps_;
  if (recording_) last_ = step;
}

int16_t Trace::intern(const std::string& name) {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return int16_t(i);
  names_.push_back(name);
  return int16_t(names_.size() - 1);
}

void Trace::add(TraceEvent e) {
  if (int64_t(events_.size()) >= capacity_) {
    ++dropped_;
    return;
  }
  e.step = step_;
  events_.push_back(e);
}

void Trace::add_ending_now(TraceKind kind, const char* name, double seconds, int16_t group,
                           int64_t bytes) {
  if (!recording_) return;
  const double end = now();
  add({name, nullptr, end - seconds, end, -1, bytes, -1, -1, -1, group, kind});
}

}  // namespace tessera
