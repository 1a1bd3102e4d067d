// A timeline recorder for one rank (output.trace): spans of its steps and phases, pipeline
// passes and messages, and collectives, each a Chrome-trace "X" event (io/trace_file.hpp
// writes them). Every rank reads the same kind of clock and adds the offset agreed with
// rank 0 at start (comm/clock_sync.hpp), so the ranks' timelines line up.
//
// Cost. Code that records holds a Trace* that is null when tracing is off: one pointer test
// per span. When on, events go into a vector reserved at construction, so recording never
// allocates; only the first `steps` steps of the run are recorded, and events beyond the
// capacity are counted as dropped. Recording happens on the rank's main thread only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

// What a span is; it decides the timeline lane (Chrome "tid") it is drawn on:
// lane 0: steps and phases (a step span encloses its phases);
// lane 1: pipeline passes (forward, backward) and messages (send, recv-wait, send-wait),
//         one after another, never overlapping;
// lane 2: collectives of every Communicator, with the group name and bytes.
enum class TraceKind : uint8_t { step, phase, compute, p2p, collective };
constexpr int kTraceLanes = 3;
int trace_lane(TraceKind k);
const char* trace_lane_name(int lane);
const char* to_string(TraceKind k);  // the event's category

// One span. Names and `message` point at static strings; group is an index into
// Trace::names(). Fields that do not apply are -1 (or null).
struct TraceEvent {
  const char* name;
  const char* message;  // p2p: "activation" or "gradient"
  double begin, end;    // seconds on this rank's clock (Trace::to_us maps them)
  int64_t step, bytes;
  int32_t micro, chunk, peer;
  int16_t group;
  TraceKind kind;
};
static_assert(sizeof(TraceEvent) <= 64, "a trace event fits in 64 bytes");

class Trace {
 public:
  using Clock = double (*)();      // seconds, monotonic
  static double steady_seconds();  // the default clock (std::chrono::steady_clock)
  static constexpr int64_t kCapacity = int64_t(1) << 17;  // events, 64 bytes each

  // Records the first `steps` steps (begin_step) of the run, at most `capacity` events.
  explicit Trace(int64_t steps, int64_t capacity = kCapacity, Clock clock = steady_seconds);

  double now() const { return clock_(); }
  // local + offset is rank 0's clock; origin is the time (on rank 0's clock) shown as 0.
  void set_clock(double offset, double origin) { offset_ = offset, origin_ = origin; }
  double offset() const { return offset_; }
  double to_us(double local) const { return (local + offset_ - origin_) * 1e6; }

  // Step `step` starts: recording is on while it is one of the first `steps` steps this
  // run started (and stays on until the next step starts).
  void begin_step(int64_t step);
  bool recording() const { return recording_; }
  int64_t first_step() const { return first_; }
  int64_t last_step() const { return last_; }

  // A name events can refer to (a group's); allocates, so call it while setting up.
  int16_t intern(const std::string& name);
  const std::vector<std::string>& names() const { return names_; }

  // Appends e (its step filled in) when there is room, otherwise counts a drop. The caller
  // checked recording() when the span began.
  void add(TraceEvent e);
  // When recording: a span that ends now and lasted `seconds` (timed by the caller).
  void add_ending_now(TraceKind kind, const char* name, double seconds, int16_t group,
                      int64_t bytes);
  const std::vector<TraceEvent>& events() const { return events_; }
  int64_t dropped() const { return dropped_; }

 private:
  Clock clock_;
  int64_t steps_, capacity_;
  double offset_ = 0, origin_ = 0;
  bool recording_ = false;
  int64_t first_ = -1, last_ = -1, step_ = -1;
  int64_t dropped_ = 0;
  std::vector<TraceEvent> events_;
  std::vector<std::string> names_;
};

// RAII: a span from construction to destruction, recorded when trace is non-null and
// recording at construction. Setters are no-ops when not recording.
class TraceSpan {
 public:
  TraceSpan(Trace* trace, TraceKind kind, const char* name)
      : trace_(trace && trace->recording() ? trace : nullptr) {
    if (trace_) e_ = {name, nullptr, trace_->now(), 0, -1, -1, -1, -1, -1, -1, kind};
  }
  ~TraceSpan() {
    if (trace_) {
      e_.end = trace_->now();
      trace_->add(e_);
    }
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

  TraceSpan& micro(int m, int chunk) {
    if (trace_) e_.micro = m, e_.chunk = chunk;
    return *this;
  }
  TraceSpan& message(const char* what, int peer, int64_t bytes) {
    if (trace_) e_.message = what, e_.peer = peer, e_.bytes = bytes;
    return *this;
  }

 private:
  Trace* trace_;
  TraceEvent e_;  // filled only when recording
};

}  // namespace tessera
