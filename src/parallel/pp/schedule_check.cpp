#include "parallel/pp/schedule_check.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <deque>
#include <map>
#include <tuple>

#include "core/error.hpp"

namespace tessera::pp {

namespace {

constexpr std::size_t kMaxProblems = 20;
constexpr int kKinds = 8;

class Problems {
 public:
  template <class... Parts>
  void add(const Parts&... parts) {
    if (list_.size() < kMaxProblems) list_.push_back(cat(parts...));
    ++count_;
  }
  bool any() const { return count_ > 0; }
  std::vector<std::string> take() {
    if (count_ > list_.size()) list_.push_back(cat("... and ", count_ - list_.size(), " more"));
    return std::move(list_);
  }

 private:
  std::vector<std::string> list_;
  std::size_t count_ = 0;
};

std::string describe(const Op& op) {
  std::string s = cat(to_string(op.kind), "(micro ", op.micro, ", chunk ", op.chunk);
  if (!op.is_compute()) s += cat(", peer ", op.peer);
  return s + ")";
}

std::string where(int stage, std::size_t index, const Op& op) {
  return cat("stage ", stage, " op ", index, " ", describe(op));
}

// Whether stage s's local chunk j runs, sends or receives op kind k at all: a message only
// across a boundary between stages, a fused backward only in a fused kind, B and W only in
// a split one.
bool needed(const ScheduleShape& shape, int stage, int chunk, Op::Kind kind) {
  const int c = shape.model_chunk(stage, chunk), last = shape.model_chunks() - 1;
  switch (kind) {
    case Op::recv_act:
    case Op::send_grad:
      return c > 0 && shape.crosses(c - 1);
    case Op::send_act:
    case Op::recv_grad:
      return c < last && shape.crosses(c);
    case Op::backward:
      return !shape.split_backward();
    case Op::backward_input:
    case Op::backward_weight:
      return shape.split_backward();
    default:
      return true;
  }
}

// Steps 1-3 of check_schedule.
void check_structure(const Schedule& sched, Problems& problems) {
  const ScheduleShape& shape = sched.shape;
  const int p = shape.stages, m = shape.micro_batches, v = shape.chunks;
  if (p < 1 || m < 1 || v < 1) {
    problems.add("shape: stages ", p, ", micro-batches ", m, ", chunks ", v,
                 " must all be at least 1");
    return;
  }
  if (int(sched.stages.size()) != p) {
    problems.add("shape: ", sched.stages.size(), " op lists for ", p, " stages");
    return;
  }
  for (int s = 0; s < p; ++s) {
    const std::vector<Op>& ops = sched.stages[s];
    // count[kind][micro * v + chunk] and the index of the last one seen.
    std::array<std::vector<int>, kKinds> count, pos;
    for (auto& c : count) c.assign(std::size_t(m) * v, 0);
    for (auto& x : pos) x.assign(std::size_t(m) * v, -1);
    for (std::size_t x = 0; x < ops.size(); ++x) {
      const Op& op = ops[x];
      if (op.kind < Op::forward || op.kind >= kKinds || op.micro < 0 || op.micro >= m ||
          op.chunk < 0 || op.chunk >= v) {
        problems.add(where(s, x, op), ": kind, micro-batch or chunk out of range");
        continue;
      }
      if (!needed(shape, s, op.chunk, op.kind)) {
        if (op.is_compute()) {
          problems.add(
              where(s, x, op), ": the ", to_string(shape.kind), " schedule runs ",
              shape.split_backward() ? "backward_input and backward_weight" : "fused backwards",
              ", not ", to_string(op.kind));
        } else {
          problems.add(where(s, x, op), ": model chunk ", shape.model_chunk(s, op.chunk), " of ",
                       shape.model_chunks(), " has no such message");
        }
        continue;
      }
      int peer = -1;
      if (!op.is_compute()) {
        const Message msg = message_of(shape, s, op);
        peer = op.is_send() ? msg.dst : msg.src;
      }
      if (op.peer != peer) problems.add(where(s, x, op), ": the peer should be ", peer);
      const std::size_t slot = std::size_t(op.micro) * v + op.chunk;
      ++count[op.kind][slot];
      pos[op.kind][slot] = int(x);
    }
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < v; ++j) {
        const std::size_t slot = std::size_t(i) * v + j;
        bool complete = true;
        for (int k = 0; k < kKinds; ++k) {
          const auto kind = Op::Kind(k);
          const int want = needed(shape, s, j, kind) ? 1 : 0;
          if (count[k][slot] == want) continue;
          if (want == 1) complete = false;
          problems.add("stage ", s, ": ", to_string(kind), "(micro ", i, ", chunk ", j,
                       ") appears ", count[k][slot], " times, not ", want);
        }
        if (!complete) continue;
        const auto at = [&](Op::Kind k) { return pos[k][slot]; };
        const std::string pass = cat("micro ", i, ", chunk ", j);
        const auto after = [&](Op::Kind later, Op::Kind earlier) {
          if (at(later) > at(earlier)) return;
          problems.add("stage ", s, ": ", to_string(later), "(", pass, ") at op ", at(later),
                       " comes before its ", to_string(earlier), " at op ", at(earlier));
        };
        // The pass that takes the output's gradient and sends the input's.
        const Op::Kind grad = shape.split_backward() ? Op::backward_input : Op::backward;
        after(grad, Op::forward);
        if (shape.split_backward()) after(Op::backward_weight, Op::backward_input);
        const auto adjacent = [&](Op::Kind comm, Op::Kind compute, int offset) {
          if (!needed(shape, s, j, comm) || at(comm) == at(compute) + offset) return;
          problems.add("stage ", s, ": ", to_string(comm), "(", pass, ") at op ", at(comm),
                       " is not immediately ", offset < 0 ? "before" : "after", " its ",
                       to_string(compute), " at op ", at(compute));
        };
        adjacent(Op::recv_act, Op::forward, -1);
        adjacent(Op::send_act, Op::forward, +1);
        adjacent(Op::recv_grad, grad, -1);
        adjacent(Op::send_grad, grad, +1);
      }
    }
  }
}

using Channel = std::tuple<int, int, bool>;  // src, dst, grad

// Step 4: the k-th send on a channel moves the k-th recv's message.
void check_pairing(const Schedule& sched, Problems& problems) {
  std::map<Channel, std::vector<Message>> sent, received;
  for (int s = 0; s < sched.shape.stages; ++s) {
    for (const Op& op : sched.stages[s]) {
      if (op.is_compute()) continue;
      const Message msg = message_of(sched.shape, s, op);
      (op.is_send() ? sent : received)[{msg.src, msg.dst, msg.grad}].push_back(msg);
    }
  }
  const auto name = [](const Channel& ch) {
    return cat(std::get<2>(ch) ? "gradients" : "activations", " from stage ", std::get<0>(ch),
               " to stage ", std::get<1>(ch));
  };
  for (const auto& [channel, sends] : sent) {
    const std::vector<Message>& recvs = received[channel];
    if (sends.size() != recvs.size()) {
      problems.add(name(channel), ": ", sends.size(), " sends but ", recvs.size(), " recvs");
    }
    for (std::size_t k = 0; k < std::min(sends.size(), recvs.size()); ++k) {
      if (sends[k] == recvs[k]) continue;
      problems.add(name(channel), ": send ", k, " carries micro ", sends[k].micro,
                   " across boundary ", sends[k].boundary, " but recv ", k, " expects micro ",
                   recvs[k].micro, " across boundary ", recvs[k].boundary);
      break;
    }
  }
  for (const auto& [channel, recvs] : received) {
    if (!sent.count(channel)) problems.add(name(channel), ": ", recvs.size(), " recvs, no sends");
  }
}

// Step 5, and the timing of simulate(): every stage steps through its list; sends never
// block, a recv blocks until its send has run. Fills sim when given.
void run(const Schedule& sched, OpCosts costs, Problems& problems, Simulation* sim) {
  const ScheduleShape& shape = sched.shape;
  const int p = shape.stages, m = shape.micro_batches, chunks = shape.model_chunks();
  std::vector<std::size_t> pc(p, 0);
  std::vector<std::int64_t> clock(p, 0);
  // bwd_done: the input gradient's pass (backward or backward_input) has run.
  std::vector<char> fwd_done(std::size_t(m) * chunks, 0), bwd_done(fwd_done);
  std::map<Channel, std::deque<std::pair<Message, std::int64_t>>> in_flight;
  if (sim) sim->timeline.assign(p, {});
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      const std::vector<Op>& ops = sched.stages[s];
      for (; pc[s] < ops.size(); ++pc[s], progress = true) {
        const Op& op = ops[pc[s]];
        if (!op.is_compute()) {
          const Message msg = message_of(shape, s, op);
          auto& queue = in_flight[{msg.src, msg.dst, msg.grad}];
          if (op.is_send()) {
            queue.emplace_back(msg, clock[s]);
            continue;
          }
          if (queue.empty()) break;  // blocked on this recv
          if (!(queue.front().first == msg)) {
            problems.add(where(s, pc[s], op), ": the message waiting is micro ",
                         queue.front().first.micro, " across boundary ",
                         queue.front().first.boundary);
          }
          clock[s] = std::max(clock[s], queue.front().second);
          queue.pop_front();
          continue;
        }
        const int c = shape.model_chunk(s, op.chunk);
        const std::size_t slot = std::size_t(op.micro) * chunks + c;
        std::int64_t cost = costs.forward;
        if (op.kind == Op::forward) {
          if (c > 0 && !fwd_done[slot - 1]) {
            problems.add(where(s, pc[s], op), ": runs before the forward of model chunk ", c - 1);
          }
          fwd_done[slot] = 1;
        } else if (op.kind == Op::backward_weight) {
          if (!bwd_done[slot])
            problems.add(where(s, pc[s], op), ": runs before its backward_input");
          cost = costs.weight;
        } else {
          if (!fwd_done[slot]) problems.add(where(s, pc[s], op), ": runs before its forward");
          if (c < chunks - 1 && !bwd_done[slot + 1]) {
            problems.add(where(s, pc[s], op), ": runs before the backward of model chunk ", c + 1);
          }
          bwd_done[slot] = 1;
          cost = op.kind == Op::backward ? costs.backward() : costs.input;
        }
        if (sim) sim->timeline[s].push_back({clock[s], clock[s] + cost, op});
        clock[s] += cost;
      }
    }
  }
  for (int s = 0; s < p; ++s) {
    if (pc[s] == sched.stages[s].size()) continue;
    const Op& op = sched.stages[s][pc[s]];
    problems.add(where(s, pc[s], op), ": waits for ever (deadlock): stage ", op.peer,
                 " never reaches the matching send");
  }
  if (sim) sim->makespan = *std::max_element(clock.begin(), clock.end());
}

std::string label(const ScheduleShape& shape, const Op& op) {
  const char letter = op.kind == Op::forward ? 'F' : op.kind == Op::backward_weight ? 'W' : 'B';
  std::string s = cat(letter, op.micro);
  if (shape.chunks > 1) s += char('a' + op.chunk);
  return s;
}

}  // namespace

std::vector<std::string> check_schedule(const Schedule& sched) {
  Problems problems;
  check_structure(sched, problems);
  if (problems.any()) return problems.take();
  check_pairing(sched, problems);
  if (problems.any()) return problems.take();
  run(sched, OpCosts{}, problems, nullptr);
  return problems.take();
}

bool completes_with_blocking_sends(const Schedule& sched) {
  TESSERA_REQUIRE(check_schedule(sched).empty(),
                  "pipeline: completes_with_blocking_sends() "
                  "needs a schedule that passes check_schedule");
  const int p = sched.shape.stages;
  std::vector<std::size_t> pc(p, 0);
  const auto at_end = [&](int s) { return pc[s] == sched.stages[s].size(); };
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      for (; !at_end(s); ++pc[s], progress = true) {
        const Op& op = sched.stages[s][pc[s]];
        if (op.is_compute()) continue;
        if (op.is_recv()) break;  // the sender moves both
        const Message msg = message_of(sched.shape, s, op);
        if (at_end(msg.dst)) break;
        const Op& peer_op = sched.stages[msg.dst][pc[msg.dst]];
        if (!peer_op.is_recv() || !(message_of(sched.shape, msg.dst, peer_op) == msg)) break;
        ++pc[msg.dst];
      }
    }
  }
  for (int s = 0; s < p; ++s) {
    if (!at_end(s)) return false;
  }
  return true;
}

bool completes_with_grouped_pairs(const Schedule& sched) {
  TESSERA_REQUIRE(check_schedule(sched).empty(),
                  "pipeline: completes_with_grouped_pairs() "
                  "needs a schedule that passes check_schedule");
  const int p = sched.shape.stages;
  // Each stage's list with its pairs regrouped.
  std::vector<std::vector<Op>> lists(p);
  for (int s = 0; s < p; ++s) {
    const std::vector<Op>& ops = sched.stages[s];
    const std::vector<OpPair> pairs = op_pairs(sched.shape, ops);
    auto pair = pairs.begin();
    for (std::size_t k = 0; k < ops.size(); ++k) {
      if (pair == pairs.end() || pair->begin != k) {
        lists[s].push_back(ops[k]);
        continue;
      }
      for (std::size_t i = pair->begin; i < pair->end; ++i)
        if (ops[i].is_recv()) lists[s].push_back(ops[i]);
      lists[s].push_back(ops[pair->forward]), lists[s].push_back(ops[pair->backward]);
      for (std::size_t i = pair->begin; i < pair->end; ++i)
        if (ops[i].is_send()) lists[s].push_back(ops[i]);
      k = pair->end - 1;
      ++pair;
    }
  }
  std::vector<Message> sent;
  std::vector<std::size_t> pc(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s)
      for (; pc[s] < lists[s].size(); ++pc[s], progress = true) {
        const Op& op = lists[s][pc[s]];
        if (op.is_compute()) continue;
        const Message msg = message_of(sched.shape, s, op);
        if (op.is_send()) {
          sent.push_back(msg);
          continue;
        }
        if (std::find(sent.begin(), sent.end(), msg) == sent.end()) break;
      }
  }
  for (int s = 0; s < p; ++s)
    if (pc[s] != lists[s].size()) return false;
  return true;
}

std::vector<int> peak_activations(const Schedule& sched) {
  std::vector<int> peak;
  for (const std::vector<Op>& ops : sched.stages) {
    int held = 0, most = 0;
    for (const Op& op : ops) {
      if (op.kind == Op::forward) most = std::max(most, ++held);
      if (op.kind == Op::backward || op.kind == Op::backward_weight) --held;
    }
    peak.push_back(most);
  }
  return peak;
}

std::vector<int> peak_pending_weights(const Schedule& sched) {
  std::vector<int> peak;
  for (const std::vector<Op>& ops : sched.stages) {
    int pending = 0, most = 0;
    for (const Op& op : ops) {
      if (op.kind == Op::backward_input) most = std::max(most, ++pending);
      if (op.kind == Op::backward_weight) --pending;
    }
    peak.push_back(most);
  }
  return peak;
}

Simulation simulate(const Schedule& sched, OpCosts costs) {
  TESSERA_REQUIRE(costs.forward >= 1 && costs.input >= 1 && costs.weight >= 0,
                  "pipeline simulation: the forward and backward_input costs must be at least 1 "
                  "and the backward_weight cost at least 0, not ",
                  costs.forward, ", ", costs.input, " and ", costs.weight);
  const std::vector<std::string> problems = check_schedule(sched);
  TESSERA_REQUIRE(problems.empty(), "pipeline schedule (", to_string(sched.shape.kind), ", p ",
                  sched.shape.stages, ", m ", sched.shape.micro_batches, ", v ", sched.shape.chunks,
                  ") is invalid: ", problems.front());
  Simulation sim;
  Problems none;
  run(sched, costs, none, &sim);
  const ScheduleShape& shape = sched.shape;
  sim.compute =
      std::int64_t(shape.micro_batches) * shape.chunks * (costs.forward + costs.backward());
  sim.bubble = make_ratio(sim.makespan - sim.compute, sim.compute);
  sim.peak_activations = peak_activations(sched);
  return sim;
}

std::string render_timeline(const Schedule& sched, OpCosts costs) {
  const Simulation sim = simulate(sched, costs);
  const ScheduleShape& shape = sched.shape;
  std::size_t width = 2;
  for (const auto& row : sim.timeline) {
    for (const Interval& iv : row) width = std::max(width, label(shape, iv.op).size() + 1);
  }
  std::string out;
  for (int s = 0; s < shape.stages; ++s) {
    std::vector<std::string> cells(std::size_t(sim.makespan), ".");
    for (const Interval& iv : sim.timeline[s]) {
      const std::string first = label(shape, iv.op);
      std::string rest = first;
      std::transform(rest.begin(), rest.end(), rest.begin(),
                     [](char ch) { return char(std::tolower(ch)); });
      for (std::int64_t t = iv.begin; t < iv.end; ++t) cells[t] = t == iv.begin ? first : rest;
    }
    std::string line = cat("stage ", s, " |");
    for (const std::string& cell : cells) line += cell + std::string(width - cell.size(), ' ');
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  const Ratio formula = bubble_formula(shape, costs);
  out += cat(to_string(shape.kind), " p=", shape.stages, " m=", shape.micro_batches);
  if (shape.chunks > 1) out += cat(" v=", shape.chunks);
  if (shape.split_backward())
    out += cat(", F ", costs.forward, " B ", costs.input, " W ", costs.weight);
  else
    out += cat(", forward ", costs.forward, " backward ", costs.backward());
  out += cat(": makespan ", sim.makespan, ", compute ", sim.compute, " per stage, bubble ",
             sim.makespan - sim.compute, "/", sim.compute, " = ", sim.bubble.num, "/",
             sim.bubble.den, " (formula ", formula.num, "/", formula.den, ")\n");
  return out;
}

}  // namespace tessera::pp
