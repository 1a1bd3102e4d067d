#include "comm/grid_layout.hpp"

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "core/error.hpp"

namespace tessera {

namespace {

constexpr const char* kValidAxes =
    "the order lists each of tp, cp, ep, dp, pp exactly once, separated by '-', fastest "
    "varying first (default tp-cp-ep-dp-pp; \"dp\" there is the data-parallel axis left once "
    "ep is folded out)";

// The name of an axis in the order string ("dp" for edp).
const char* order_name(Axis a) {
  return a == Axis::edp ? "dp" : to_string(a);
}

int axis_from_order_name(std::string_view s) {
  for (int a = 0; a < kAxes; ++a)
    if (s == order_name(Axis(a))) return a;
  return -1;
}

std::string divisors(int n) {
  std::string out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) {
      if (!out.empty()) out += ", ";
      out += std::to_string(d);
    }
  return out;
}

}  // namespace

const char* to_string(Group g) {
  switch (g) {
    case Group::tp:
      return "tp";
    case Group::cp:
      return "cp";
    case Group::pp:
      return "pp";
    case Group::dp:
      return "dp";
    case Group::dp_cp:
      return "dp_cp";
    case Group::ep:
      return "ep";
    case Group::edp:
      return "edp";
    case Group::model_parallel:
      return "model_parallel";
    case Group::embedding:
      return "embedding";
  }
  return "?";
}

const char* to_string(Axis a) {
  switch (a) {
    case Axis::tp:
      return "tp";
    case Axis::cp:
      return "cp";
    case Axis::ep:
      return "ep";
    case Axis::edp:
      return "edp";
    case Axis::pp:
      return "pp";
  }
  return "?";
}

int GridLayout::infer_dp(int world, int tp, int cp, int pp) {
  TESSERA_REQUIRE(world >= 1, "the world has ", world, " ranks; it needs at least 1");
  TESSERA_REQUIRE(tp >= 1, "parallel.tp = ", tp, " must be at least 1");
  TESSERA_REQUIRE(cp >= 1, "parallel.cp = ", cp, " must be at least 1");
  TESSERA_REQUIRE(pp >= 1, "parallel.pp = ", pp, " must be at least 1");
  const int64_t model = int64_t(tp) * cp * pp;
  TESSERA_REQUIRE(world % model == 0,
                  "parallel.dp = auto: parallel.tp x parallel.cp x parallel.pp = ", tp, " x ", cp,
                  " x ", pp, " = ", model, " does not divide the ", world,
                  " ranks; run on a multiple of ", model,
                  " ranks or choose tp, cp, pp whose product divides ", world);
  return int(world / model);
}

GridLayout::GridLayout(const GridDegrees& d, std::string_view order, int world)
    : degrees_(d), world_(world) {
  TESSERA_REQUIRE(d.tp >= 1, "parallel.tp = ", d.tp, " must be at least 1");
  TESSERA_REQUIRE(d.cp >= 1, "parallel.cp = ", d.cp, " must be at least 1");
  TESSERA_REQUIRE(d.ep >= 1, "parallel.ep = ", d.ep, " must be at least 1");
  TESSERA_REQUIRE(d.dp >= 1, "parallel.dp = ", d.dp, " must be at least 1");
  TESSERA_REQUIRE(d.pp >= 1, "parallel.pp = ", d.pp, " must be at least 1");
  TESSERA_REQUIRE(world >= 1, "the world has ", world, " ranks; it needs at least 1");
  const int64_t product = int64_t(d.tp) * d.cp * d.dp * d.pp;
  TESSERA_REQUIRE(product == world,
                  "parallel.tp x parallel.cp x parallel.dp x parallel.pp = ", d.tp, " x ", d.cp,
                  " x ", d.dp, " x ", d.pp, " = ", product, " does not equal the ", world,
                  " ranks; change the degrees (or set parallel.dp = auto) so that their product "
                  "is the number of ranks");
  TESSERA_REQUIRE(d.dp % d.ep == 0, "parallel.ep = ", d.ep,
                  " does not divide the data-parallel degree dp = ", d.dp,
                  "; expert parallelism is folded inside data parallelism, so ep must be one of ",
                  divisors(d.dp));

  // Parse the order: each axis exactly once.
  const std::string shown = "parallel.order = \"" + std::string(order) + "\": ";
  std::array<bool, kAxes> seen{};
  int n = 0;
  size_t pos = 0;
  while (true) {
    const size_t dash = order.find('-', pos);
    const std::string_view tok =
        order.substr(pos, dash == std::string_view::npos ? std::string_view::npos : dash - pos);
    const int a = axis_from_order_name(tok);
    TESSERA_REQUIRE(a >= 0, shown, "unknown axis \"", tok, "\"; ", kValidAxes);
    TESSERA_REQUIRE(!seen[size_t(a)], shown, "axis \"", tok, "\" appears more than once; ",
                    kValidAxes);
    seen[size_t(a)] = true;
    order_[size_t(n++)] = Axis(a);
    if (dash == std::string_view::npos) break;
    pos = dash + 1;
  }
  for (int a = 0; a < kAxes; ++a)
    TESSERA_REQUIRE(seen[size_t(a)], shown, "axis \"", order_name(Axis(a)), "\" is missing; ",
                    kValidAxes);

  size_ = {d.tp, d.cp, d.ep, d.dp / d.ep, d.pp};
  int stride = 1;
  for (Axis a : order_) {
    stride_[size_t(a)] = stride;
    stride *= size_[size_t(a)];
  }
}

std::string GridLayout::order_string() const {
  std::string out;
  for (Axis a : order_) {
    if (!out.empty()) out += '-';
    out += order_name(a);
  }
  return out;
}

GridLayout::Coord GridLayout::coord(int rank) const {
  TESSERA_REQUIRE(rank >= 0 && rank < world_, "rank ", rank, " is outside the world of ", world_,
                  " ranks");
  std::array<int, kAxes> dig{};
  for (Axis a : order_) {
    dig[size_t(a)] = rank % size(a);
    rank /= size(a);
  }
  Coord c;
  c.tp = dig[size_t(Axis::tp)];
  c.cp = dig[size_t(Axis::cp)];
  c.ep = dig[size_t(Axis::ep)];
  c.edp = dig[size_t(Axis::edp)];
  c.pp = dig[size_t(Axis::pp)];
  c.dp = c.ep + degrees_.ep * c.edp;
  return c;
}

std::array<int, kAxes> GridLayout::digits(const Coord& c) {
  return {c.tp, c.cp, c.ep, c.edp, c.pp};
}

int GridLayout::rank(const Coord& c) const {
  const std::array<int, kAxes> dig = digits(c);
  int r = 0;
  for (int a = 0; a < kAxes; ++a) {
    TESSERA_REQUIRE(dig[size_t(a)] >= 0 && dig[size_t(a)] < size_[size_t(a)], "grid coordinate ",
                    to_string(Axis(a)), " = ", dig[size_t(a)], " is outside 0..",
                    size_[size_t(a)] - 1);
    r += dig[size_t(a)] * stride_[size_t(a)];
  }
  return r;
}

std::array<bool, kAxes> GridLayout::varying(Group g) {
  // Indexed by Axis: tp, cp, ep, edp, pp.
  switch (g) {
    case Group::tp:
      return {true, false, false, false, false};
    case Group::cp:
      return {false, true, false, false, false};
    case Group::ep:
      return {false, false, true, false, false};
    case Group::edp:
      return {false, false, false, true, false};
    case Group::pp:
      return {false, false, false, false, true};
    case Group::dp:
      return {false, false, true, true, false};
    case Group::dp_cp:
      return {false, true, true, true, false};
    case Group::model_parallel:
      return {true, false, false, false, true};
    case Group::embedding:
      return {};
  }
  return {};
}

int GridLayout::group_size(Group g) const {
  if (g == Group::embedding) return degrees_.pp > 1 ? 2 : 1;
  const std::array<bool, kAxes> vary = varying(g);
  int n = 1;
  for (int a = 0; a < kAxes; ++a)
    if (vary[size_t(a)]) n *= size_[size_t(a)];
  return n;
}

std::vector<int> GridLayout::group(int rank, Group g) const {
  const Coord c = coord(rank);
  if (g == Group::embedding) {
    const int last = degrees_.pp - 1;
    if (last == 0 || (c.pp != 0 && c.pp != last)) return {rank};
    const int base = rank - c.pp * stride(Axis::pp);
    return {base, base + last * stride(Axis::pp)};
  }
  // Start from the member with every varying digit 0, then count through the varying digits
  // like an odometer (fastest axis first), so members come out in increasing rank.
  const std::array<bool, kAxes> vary = varying(g);
  std::array<int, kAxes> dig = digits(c);
  int base = rank;
  for (int a = 0; a < kAxes; ++a)
    if (vary[size_t(a)]) {
      base -= dig[size_t(a)] * stride_[size_t(a)];
      dig[size_t(a)] = 0;
    }
  std::vector<int> members;
  members.reserve(size_t(group_size(g)));
  int r = base;
  while (true) {
    members.push_back(r);
    bool carried_out = true;
    for (Axis ax : order_) {
      const size_t a = size_t(ax);
      if (!vary[a]) continue;
      if (++dig[a] < size_[a]) {
        r += stride_[a];
        carried_out = false;
        break;
      }
      r -= (size_[a] - 1) * stride_[a];
      dig[a] = 0;
    }
    if (carried_out) break;
  }
  return members;
}

std::vector<std::vector<int>> GridLayout::all_groups(Group g) const {
  // Scanning ranks upward, the first rank not yet placed opens its group, so the list comes
  // out sorted by first rank.
  std::vector<std::vector<int>> groups;
  std::vector<bool> placed(size_t(world_), false);
  for (int r = 0; r < world_; ++r) {
    if (placed[size_t(r)]) continue;
    groups.push_back(group(r, g));
    for (int m : groups.back()) placed[size_t(m)] = true;
  }
  return groups;
}

int GridLayout::group_index(int rank, Group g) const {
  // Groups sorted by first rank are the fixed digits counted in the mixed radix of the fixed
  // axes (in the grid's order). For embedding every axis is fixed, but stage pp-1 joins stage
  // 0, so the pp digit counts in radix pp-1.
  const Coord c = coord(rank);
  std::array<int, kAxes> dig = digits(c);
  std::array<int, kAxes> radix = size_;
  std::array<bool, kAxes> vary = varying(g);
  if (g == Group::embedding && degrees_.pp > 1) {
    const size_t p = size_t(Axis::pp);
    if (dig[p] == degrees_.pp - 1) dig[p] = 0;
    radix[p] = degrees_.pp - 1;
  }
  int index = 0, weight = 1;
  for (Axis ax : order_) {
    const size_t a = size_t(ax);
    if (vary[a]) continue;
    index += dig[a] * weight;
    weight *= radix[a];
  }
  return index;
}

std::string GridLayout::describe() const {
  std::ostringstream os;
  os << "tp " << degrees_.tp << " x cp " << degrees_.cp << " x dp " << degrees_.dp << " (ep "
     << degrees_.ep << " x edp " << edp() << ") x pp " << degrees_.pp << " = " << world_
     << " ranks, order " << order_string() << " (fastest first)";
  return os.str();
}

}  // namespace tessera
