#include "plan/search.hpp"

#include "parallel/pp/schedule.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>

#include "core/error.hpp"
#include "parallel/pp/schedule.hpp"

namespace tessera {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

namespace {

std::string family_of(const Layout& l) {
  return cat("tp=", l.tp, " pp=", l.pp, " cp=", l.cp, " ep=", l.ep);
}

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  return buf;
}

std::string pct(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", 100 * x);
  return buf;
}

// Rank orders to try: the given ones, or the default and (when a pipeline and data
// parallelism share more than one node) pipeline stages as neighbours with data parallelism
// the slowest axis, across pods.
std::vector<std::string> rank_orders(const SearchSpace& space, const Cluster& c, int accelerators,
                                     int pp, int dp) {
  if (!space.orders.empty()) return space.orders;
  std::vector<std::string> orders{Layout::kDefaultRankOrder};
  if (pp > 1 && dp > 1 && accelerators > c.per_node) orders.push_back("tp-cp-pp-dp-ep");
  return orders;
}

// Recompute policies to try, as (policy, N): full recompute of every layer of a stage
// (N = 0) and of N of them (rc=full:N).
std::vector<std::pair<Recompute, int>> recompute_choices(const SearchSpace& space,
                                                         const ModelConfig& cfg, int pp) {
  std::vector<std::pair<Recompute, int>> rcs;
  for (Recompute rc : space.recompute) {
    if (rc != Recompute::full) {
      rcs.push_back({rc, 0});
      continue;
    }
    if (space.full_all) rcs.push_back({rc, 0});
    const int64_t stage = cfg.layers / pp;
    std::vector<int64_t> ns(space.full_layers.begin(), space.full_layers.end());
    if (ns.empty() && space.partial_recompute && stage >= 4)
      ns = {stage / 4, stage / 2, 3 * stage / 4};
    for (int64_t n : ns)
      if (n > 0 && n < stage && (rcs.empty() || rcs.back().second != int(n)))
        rcs.push_back({rc, int(n)});
  }
  return rcs;
}

bool same_placement(const GroupLinks& a, const GroupLinks& b) {
  auto same = [](const GroupLink& x, const GroupLink& y) { return x.place == y.place; };
  return same(a.tp, b.tp) && same(a.cp, b.cp) && same(a.ep, b.ep) && same(a.dp, b.dp) &&
         same(a.shard, b.shard) && same(a.replica, b.replica) && same(a.pp, b.pp);
}

}  // namespace

std::string FamilyRejection::summary() const {
  std::string s;
  auto add = [&](const std::string& part) { s += (s.empty() ? "" : "; ") + part; };
  if (illegal == layouts) return "illegal: " + illegal_reason;
  if (tp_across_nodes > 0)
    add(cat("TP across nodes in ", tp_across_nodes, " of ", layouts, " layouts",
            fastest_rejected.step_seconds > 0
                ? cat(" (fastest: ", fastest_rejected.step_seconds, " s/step, MFU ",
                      pct(fastest_rejected.mfu), ", TP all-reduces ",
                      pct(fastest_rejected.time.tp_comm / fastest_rejected.step_seconds),
                      " of the step)")
                : std::string()));
  if (out_of_memory > 0)
    add(cat("out of memory in ", out_of_memory, " (closest needs ", gb(closest.memory.total()),
            " of ", gb(closest.capacity), ", ", gb(min_excess), " over, at ",
            to_string(closest.layout), ")"));
  if (implausible > 0)
    add(cat("predicted MFU above the sanity bound in ", implausible, " (highest ", pct(max_mfu),
            ")"));
  if (bubble > 0)
    add(cat("bubble over the limit in ", bubble, " (smallest ", pct(min_bubble), ")"));
  if (illegal > 0) add(cat("illegal in ", illegal, " (", illegal_reason, ")"));
  return s;
}

SearchResult search(const Workload& w, const Cluster& c, int accelerators, Runtime rt,
                    const SearchSpace& space) {
  TESSERA_REQUIRE(accelerators >= 1, "the number of accelerators must be at least 1");
  const ModelConfig& cfg = w.cfg;
  auto or_all = [](const std::vector<int>& given, std::vector<int> all) {
    return given.empty() ? all : given;
  };
  std::vector<int> tps = space.tp;
  if (tps.empty())
    for (int d : divisors(accelerators))
      if (space.tp_across_nodes || d <= 2 * c.per_node) tps.push_back(d);
  const std::vector<int> zeros = or_all(space.zero, {0, 1, 2, 3});
  const std::vector<int> mbs = or_all(space.micro_batch, {1, 2, 4, 8, 16});
  const bool long_context = cfg.seq_len >= 16384;

  SearchResult r;
  std::map<std::string, FamilyRejection> families;
  std::map<std::string, bool> family_ok;
  for (int tp : tps) {
    if (accelerators % tp) continue;
    const std::vector<int> pps = or_all(space.pp, divisors(accelerators / tp));
    for (int pp : pps) {
      if ((accelerators / tp) % pp) continue;
      const int rest = accelerators / (tp * pp);
      std::vector<int> cps = space.cp;
      if (cps.empty()) {
        cps = {1};
        if (long_context)
          for (int d : divisors(rest))
            if (d > 1 && d <= 16) cps.push_back(d);
      }
      for (int cp : cps) {
        if (rest % cp) continue;
        const int dp = rest / cp;
        std::vector<int> eps = space.ep;
        if (eps.empty()) {
          eps = {1};
          if (w.moe.any())
            for (int d : divisors(dp))
              if (d > 1 && w.moe.experts % d == 0) eps.push_back(d);
        }
        for (int ep : eps) {
          std::vector<int> vpps = space.vpp;
          if (vpps.empty()) {
            vpps = {1};
            if (pp > 1)
              for (int v : {2, 3, 4, 6, 8})
                if (cfg.layers % (int64_t(pp) * v) == 0) vpps.push_back(v);
          }
          Layout base;
          base.tp = tp, base.pp = pp, base.cp = cp, base.dp = dp, base.ep = ep;
          base.schedule = space.schedules.front();
          const std::string fam = family_of(base);
          FamilyRejection& fr = families[fam];
          fr.family = fam;
          family_ok.emplace(fam, false);
          const std::vector<std::string> orders = rank_orders(space, c, accelerators, pp, dp);
          const std::vector<std::pair<Recompute, int>> rcs = recompute_choices(space, cfg, pp);
          // (schedule, v) pairs: one schedule without a pipeline, where none matters.
          std::vector<std::pair<PipeSchedule, int>> shapes;
          for (PipeSchedule sched : space.schedules) {
            if (pp == 1 && sched != space.schedules.front()) continue;
            if (pp > 1 && pp::splits_backward(sched))
              shapes.push_back({sched, pp::placement_of(sched) == pp::Placement::v_shape ? 2 : 1});
            else if (!pp::splits_backward(sched))
              for (int v : vpps) shapes.push_back({sched, v});
          }
          for (const auto& [sched, v] : shapes) {
            std::optional<StageLayers> cut;  // once per pipeline shape, when a layout is legal
            for (int zero : zeros) {
              std::vector<int> groups{0};
              const int node_group = c.per_node / std::min(c.per_node, tp * cp);
              if (space.hsdp && zero > 0 && node_group > 1 && node_group < dp * cp &&
                  (dp * cp) % node_group == 0)
                groups.push_back(node_group);
              for (const std::string& order : orders)
                for (int group : groups) {
                  std::optional<GroupLinks> links;  // once per grid, when a layout is legal
                  // Another order that places every group as the first order does is the
                  // same layout: try it once.
                  if (order != orders.front()) {
                    Layout a = base, b = base;
                    a.zero = b.zero = zero, a.shard_group = b.shard_group = group;
                    a.order = orders.front(), b.order = order;
                    if (same_placement(group_links(a, c), group_links(b, c))) continue;
                  }
                  for (int mb : mbs)
                    for (const auto& [rc, rc_layers] : rcs)
                      for (int spar : space.seq_parallel)
                        for (ComputeType prec : space.precision) {
                          if (spar && tp == 1) continue;
                          Layout l = base;
                          l.schedule = sched;
                          l.vpp = v, l.zero = zero, l.shard_group = group, l.micro_batch = mb;
                          l.recompute = rc, l.seq_parallel = spar != 0, l.precision = prec;
                          l.recompute_layers = rc_layers, l.order = order;
                          ++r.considered;
                          ++fr.layouts;
                          const std::string problem = layout_problem(w, l, c, rt, accelerators);
                          if (!problem.empty()) {
                            if (fr.illegal++ == 0) fr.illegal_reason = problem;
                            continue;
                          }
                          ++r.legal;
                          if (!links) links = group_links(l, c);
                          if (!cut) cut = stage_layer_counts(w, l);
                          Estimate e = estimate(w, l, c, rt, &*links, &*cut);
                          const bool across = tp > 1 && e.links.tp.crosses_nodes();
                          if (across && !space.tp_across_nodes) {
                            ++fr.tp_across_nodes;
                            if (e.fits() && (fr.fastest_rejected.step_seconds == 0 ||
                                             e.step_seconds < fr.fastest_rejected.step_seconds))
                              fr.fastest_rejected = e;
                            continue;
                          }
                          if (space.memory_budget > 0)
                            e.capacity = std::min(e.capacity, space.memory_budget);
                          if (!e.fits()) {
                            const double excess = e.memory.total() - e.capacity;
                            if (fr.out_of_memory++ == 0 || excess < fr.min_excess)
                              fr.min_excess = excess, fr.closest = e;
                            continue;
                          }
                          if (e.bubble_fraction > space.max_bubble) {
                            if (fr.bubble++ == 0 || e.bubble_fraction < fr.min_bubble)
                              fr.min_bubble = e.bubble_fraction;
                            if (fr.fastest_rejected.step_seconds == 0 ||
                                e.step_seconds < fr.fastest_rejected.step_seconds)
                              fr.fastest_rejected = e;
                            continue;
                          }
                          if (e.mfu > space.max_mfu) {  // the model's error, not a promise
                            if (fr.implausible++ == 0 || e.mfu > fr.max_mfu) fr.max_mfu = e.mfu;
                            ++r.implausible;
                            continue;
                          }
                          family_ok[fam] = true;
                          r.accepted.push_back(std::move(e));
                        }
                }
            }
          }
        }
      }
    }
  }
  std::stable_sort(r.accepted.begin(), r.accepted.end(), [](const Estimate& a, const Estimate& b) {
    if (a.tokens_per_second != b.tokens_per_second)
      return a.tokens_per_second > b.tokens_per_second;
    return a.memory.total() < b.memory.total();
  });
  for (auto& [name, fr] : families)
    if (!family_ok[name] && fr.layouts > 0) r.rejected.push_back(fr);
  return r;
}

}  // namespace tessera
