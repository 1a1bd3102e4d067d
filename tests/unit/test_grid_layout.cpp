// The process grid's rank arithmetic (comm/grid_layout.hpp; doc/architecture.md "Process grid"): coordinates
// in the mixed radix of parallel.order, the groups of each kind, and the errors for bad
// degrees and orders. No MPI: every shape is checked on one process.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "comm/grid_layout.hpp"
#include "core/error.hpp"

namespace tessera {
namespace {

using Ranks = std::vector<int>;

const std::vector<std::string> kOrders = {"tp-cp-ep-dp-pp", "pp-dp-ep-cp-tp", "dp-tp-pp-cp-ep",
                                          "cp-pp-tp-ep-dp", "ep-pp-dp-tp-cp"};

// Every shape with tp, cp, ep, dp, pp in 1..4, ep | dp and world <= 96, in every order.
void for_each_layout(const std::function<void(const GridLayout&)>& check) {
  for (const std::string& order : kOrders)
    for (int tp = 1; tp <= 4; ++tp)
      for (int cp = 1; cp <= 4; ++cp)
        for (int dp = 1; dp <= 4; ++dp)
          for (int ep = 1; ep <= dp; ++ep)
            for (int pp = 1; pp <= 4; ++pp) {
              if (dp % ep != 0 || tp * cp * dp * pp > 96) continue;
              const GridLayout g({tp, cp, ep, dp, pp}, order, tp * cp * dp * pp);
              SCOPED_TRACE(g.describe());
              check(g);
              if (::testing::Test::HasFailure()) return;  // one failing shape is enough
            }
}

// The axes that vary inside a group of kind g, by Axis (tp, cp, ep, edp, pp); an independent
// statement of the table in grid_layout.hpp.
std::set<Axis> varying(Group g) {
  switch (g) {
    case Group::tp:
      return {Axis::tp};
    case Group::cp:
      return {Axis::cp};
    case Group::pp:
      return {Axis::pp};
    case Group::ep:
      return {Axis::ep};
    case Group::edp:
      return {Axis::edp};
    case Group::dp:
      return {Axis::ep, Axis::edp};
    case Group::dp_cp:
      return {Axis::cp, Axis::ep, Axis::edp};
    case Group::model_parallel:
      return {Axis::tp, Axis::pp};
    case Group::embedding:
      return {Axis::pp};  // and only stages 0 and pp-1 together
  }
  return {};
}

int digit(const GridLayout::Coord& c, Axis a) {
  switch (a) {
    case Axis::tp:
      return c.tp;
    case Axis::cp:
      return c.cp;
    case Axis::ep:
      return c.ep;
    case Axis::edp:
      return c.edp;
    case Axis::pp:
      return c.pp;
  }
  return -1;
}

int expected_size(const GridLayout& g, Group k) {
  int n = 1;
  for (Axis a : varying(k)) n *= g.size(a);
  return k == Group::embedding ? std::min(n, 2) : n;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective());
    return e.what();
  }
  ADD_FAILURE() << "no tessera::Error thrown";
  return "";
}

TEST(GridLayout, CoordRankRoundTrip) {
  for_each_layout([](const GridLayout& g) {
    const GridDegrees& d = g.degrees();
    std::set<std::vector<int>> coords;
    for (int r = 0; r < g.world(); ++r) {
      const GridLayout::Coord c = g.coord(r);
      ASSERT_GE(c.tp, 0);
      ASSERT_LT(c.tp, d.tp);
      ASSERT_GE(c.cp, 0);
      ASSERT_LT(c.cp, d.cp);
      ASSERT_GE(c.ep, 0);
      ASSERT_LT(c.ep, d.ep);
      ASSERT_GE(c.edp, 0);
      ASSERT_LT(c.edp, d.dp / d.ep);
      ASSERT_GE(c.pp, 0);
      ASSERT_LT(c.pp, d.pp);
      ASSERT_EQ(c.dp, c.ep + d.ep * c.edp);
      ASSERT_EQ(g.rank(c), r);
      coords.insert({c.tp, c.cp, c.ep, c.edp, c.pp});
    }
    EXPECT_EQ(int(coords.size()), g.world());  // a bijection
  });
}

TEST(GridLayout, FirstAxisOfTheOrderVariesFastest) {
  for_each_layout([](const GridLayout& g) {
    // Strides follow the order: 1 for the first axis, then the running product of sizes.
    int stride = 1;
    for (Axis a : g.order()) {
      ASSERT_EQ(g.stride(a), stride) << to_string(a);
      for (int i = 0; i < g.size(a); ++i) {
        const GridLayout::Coord c = g.coord(i * stride);
        for (Axis b : g.order()) ASSERT_EQ(digit(c, b), b == a ? i : 0);
      }
      stride *= g.size(a);
    }
    EXPECT_EQ(stride, g.world());
  });
}

TEST(GridLayout, OrderStringRoundTrips) {
  for (const std::string& order : kOrders)
    EXPECT_EQ(GridLayout({2, 1, 1, 2, 2}, order, 8).order_string(), order);
  EXPECT_EQ(GridLayout({}, GridLayout::kDefaultOrder, 1).order_string(), "tp-cp-ep-dp-pp");
}

TEST(GridLayout, GroupsPartitionTheWorld) {
  for_each_layout([](const GridLayout& g) {
    for (Group k : kAllGroups) {
      SCOPED_TRACE(to_string(k));
      const std::vector<Ranks> groups = g.all_groups(k);
      std::vector<int> owner(size_t(g.world()), -1);
      for (size_t i = 0; i < groups.size(); ++i) {
        const Ranks& grp = groups[i];
        ASSERT_FALSE(grp.empty());
        ASSERT_TRUE(std::is_sorted(grp.begin(), grp.end()));
        if (i > 0) ASSERT_LT(groups[i - 1].front(), grp.front());  // sorted by first rank
        for (int m : grp) {
          ASSERT_EQ(owner[size_t(m)], -1) << "rank " << m << " in two groups";
          owner[size_t(m)] = int(i);
          ASSERT_EQ(g.group(m, k), grp) << "member " << m << " sees another group";
          ASSERT_EQ(g.group_index(m, k), int(i)) << "member " << m;
        }
      }
      for (int r = 0; r < g.world(); ++r) ASSERT_GE(owner[size_t(r)], 0) << "rank " << r;
    }
  });
}

TEST(GridLayout, GroupMembersDifferOnlyInTheirAxes) {
  for_each_layout([](const GridLayout& g) {
    const int last = g.degrees().pp - 1;
    for (Group k : kAllGroups) {
      SCOPED_TRACE(to_string(k));
      const std::set<Axis> vary = varying(k);
      for (const Ranks& grp : g.all_groups(k)) {
        const GridLayout::Coord c0 = g.coord(grp.front());
        if (k == Group::embedding && c0.pp != 0) {
          ASSERT_EQ(grp.size(), 1u);  // a middle stage holds no embedding
          ASSERT_LT(c0.pp, last);
          continue;
        }
        ASSERT_EQ(int(grp.size()), expected_size(g, k));
        ASSERT_EQ(int(grp.size()), g.group_size(k));
        for (int m : grp) {
          const GridLayout::Coord c = g.coord(m);
          for (Axis a : {Axis::tp, Axis::cp, Axis::ep, Axis::edp, Axis::pp})
            if (!vary.count(a)) ASSERT_EQ(digit(c, a), digit(c0, a)) << to_string(a);
          if (k == Group::embedding) ASSERT_TRUE(c.pp == 0 || c.pp == last);
        }
      }
    }
  });
}

TEST(GridLayout, GroupSizesAreTheDegreeProducts) {
  const GridLayout g({2, 3, 2, 4, 2}, GridLayout::kDefaultOrder, 48);
  EXPECT_EQ(g.group_size(Group::tp), 2);
  EXPECT_EQ(g.group_size(Group::cp), 3);
  EXPECT_EQ(g.group_size(Group::ep), 2);
  EXPECT_EQ(g.group_size(Group::edp), 2);
  EXPECT_EQ(g.group_size(Group::dp), 4);
  EXPECT_EQ(g.group_size(Group::dp_cp), 12);          // cp x dp
  EXPECT_EQ(g.group_size(Group::model_parallel), 4);  // tp x pp
  EXPECT_EQ(g.group_size(Group::pp), 2);
  EXPECT_EQ(g.group_size(Group::embedding), 2);
  EXPECT_EQ(g.all_groups(Group::dp_cp).size(), 4u);            // tp x pp of them
  EXPECT_EQ(g.all_groups(Group::model_parallel).size(), 12u);  // cp x dp replicas
  EXPECT_EQ(g.all_groups(Group::embedding).size(), 24u);       // pp = 2: none in the middle
  for (int r = 0; r < 48; ++r) {
    EXPECT_EQ(g.group(r, Group::dp_cp).size(), 12u);
    EXPECT_EQ(g.group(r, Group::model_parallel).size(), 4u);
  }
}

TEST(GridLayout, DefaultOrderPutsTpGroupsOnConsecutiveRanks) {
  for_each_layout([](const GridLayout& g) {
    if (g.order_string() != GridLayout::kDefaultOrder) return;
    const int tp = g.degrees().tp;
    for (int r = 0; r < g.world(); ++r) {
      Ranks want(static_cast<size_t>(tp));
      for (int i = 0; i < tp; ++i) want[size_t(i)] = r / tp * tp + i;
      ASSERT_EQ(g.group(r, Group::tp), want) << "rank " << r;
    }
  });
}

TEST(GridLayout, DpCoordIsTheIndexInTheDpGroupWhenEpPrecedesDp) {
  for_each_layout([](const GridLayout& g) {
    if (g.stride(Axis::ep) > g.stride(Axis::edp) && g.degrees().ep > 1 && g.edp() > 1) return;
    for (int r = 0; r < g.world(); ++r) {
      const Ranks grp = g.group(r, Group::dp);
      const auto pos = std::find(grp.begin(), grp.end(), r) - grp.begin();
      ASSERT_EQ(g.coord(r).dp, int(pos)) << "rank " << r;
    }
  });
}

TEST(GridLayout, HandExampleDefaultOrder) {
  // world 8, tp 2, pp 2, dp 2: rank = tp + 2 dp + 4 pp.
  const GridLayout g({.tp = 2, .dp = 2, .pp = 2}, GridLayout::kDefaultOrder, 8);
  EXPECT_EQ(g.all_groups(Group::tp), (std::vector<Ranks>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.all_groups(Group::dp), (std::vector<Ranks>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.all_groups(Group::edp), g.all_groups(Group::dp));  // ep = 1
  EXPECT_EQ(g.all_groups(Group::pp), (std::vector<Ranks>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.all_groups(Group::model_parallel), (std::vector<Ranks>{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(g.all_groups(Group::dp_cp), g.all_groups(Group::dp));  // cp = 1
  EXPECT_EQ(g.group(1, Group::embedding), (Ranks{1, 5}));
  EXPECT_EQ(g.group(6, Group::embedding), (Ranks{2, 6}));
  EXPECT_EQ(g.group(3, Group::cp), (Ranks{3}));
  EXPECT_EQ(g.group(3, Group::ep), (Ranks{3}));
  EXPECT_EQ(g.group_index(5, Group::dp), 3);
  const GridLayout::Coord c = g.coord(7);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(g.rank({.tp = 0, .edp = 1, .pp = 1}), 6);
}

TEST(GridLayout, HandExampleReversedOrder) {
  // Same shape, order pp-dp-ep-cp-tp: rank = pp + 2 dp + 4 tp.
  const GridLayout g({.tp = 2, .dp = 2, .pp = 2}, "pp-dp-ep-cp-tp", 8);
  EXPECT_EQ(g.all_groups(Group::pp), (std::vector<Ranks>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.all_groups(Group::dp), (std::vector<Ranks>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.all_groups(Group::tp), (std::vector<Ranks>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.group(2, Group::model_parallel), (Ranks{2, 3, 6, 7}));
  EXPECT_EQ(g.group(5, Group::embedding), (Ranks{4, 5}));
}

TEST(GridLayout, HandExampleExpertAndContextParallel) {
  // world 16, cp 2, ep 2, dp 4, default order: rank = cp + 2 ep + 4 edp + 8 pp (pp = 2).
  const GridLayout g({.cp = 2, .ep = 2, .dp = 4, .pp = 2}, GridLayout::kDefaultOrder, 16);
  EXPECT_EQ(g.edp(), 2);
  EXPECT_EQ(g.group(0, Group::ep), (Ranks{0, 2}));
  EXPECT_EQ(g.group(0, Group::edp), (Ranks{0, 4}));
  EXPECT_EQ(g.group(0, Group::dp), (Ranks{0, 2, 4, 6}));
  EXPECT_EQ(g.group(9, Group::dp_cp), (Ranks{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(g.group(9, Group::cp), (Ranks{8, 9}));
  EXPECT_EQ(g.group(9, Group::model_parallel), (Ranks{1, 9}));  // tp = 1: the pp stages
  const GridLayout::Coord c = g.coord(6);                       // ep 1, edp 1
  EXPECT_EQ(c.dp, 3);
}

TEST(GridLayout, EmbeddingGroupsWithMiddleStages) {
  // pp 4, tp 2: stage 0 pairs with stage 3; stages 1 and 2 stand alone.
  const GridLayout g({.tp = 2, .pp = 4}, GridLayout::kDefaultOrder, 8);
  EXPECT_EQ(g.all_groups(Group::embedding),
            (std::vector<Ranks>{{0, 6}, {1, 7}, {2}, {3}, {4}, {5}}));
  EXPECT_EQ(g.group(7, Group::embedding), (Ranks{1, 7}));
  EXPECT_EQ(g.group_index(7, Group::embedding), 1);
  EXPECT_EQ(g.group_index(4, Group::embedding), 4);
  const GridLayout one({.tp = 2}, GridLayout::kDefaultOrder, 2);  // pp 1: alone
  EXPECT_EQ(one.group(1, Group::embedding), (Ranks{1}));
}

TEST(GridLayout, InferDp) {
  EXPECT_EQ(GridLayout::infer_dp(16, 2, 2, 2), 2);
  EXPECT_EQ(GridLayout::infer_dp(12, 1, 1, 1), 12);
  EXPECT_EQ(GridLayout::infer_dp(24, 2, 1, 3), 4);
  const std::string m = message_of([] { GridLayout::infer_dp(8, 2, 1, 3); });
  EXPECT_NE(m.find("parallel.dp = auto"), std::string::npos) << m;
  EXPECT_NE(m.find("2 x 1 x 3 = 6"), std::string::npos) << m;
  EXPECT_NE(m.find("8 ranks"), std::string::npos) << m;
  EXPECT_NE(message_of([] { GridLayout::infer_dp(8, 0, 1, 1); }).find("parallel.tp = 0"),
            std::string::npos);
}

TEST(GridLayout, RejectsDegreesBelowOne) {
  const std::string d = GridLayout::kDefaultOrder;
  EXPECT_THROW(GridLayout({.tp = 0}, d, 1), Error);
  EXPECT_NE(message_of([&] { GridLayout({.tp = 0}, d, 1); }).find("parallel.tp = 0"),
            std::string::npos);
  EXPECT_NE(message_of([&] { GridLayout({.cp = -1}, d, 1); }).find("parallel.cp = -1"),
            std::string::npos);
  EXPECT_NE(message_of([&] { GridLayout({.ep = 0}, d, 1); }).find("parallel.ep = 0"),
            std::string::npos);
  EXPECT_NE(message_of([&] { GridLayout({.dp = 0}, d, 1); }).find("parallel.dp = 0"),
            std::string::npos);
  EXPECT_NE(message_of([&] { GridLayout({.pp = 0}, d, 1); }).find("parallel.pp = 0"),
            std::string::npos);
}

TEST(GridLayout, RejectsAProductOtherThanTheWorld) {
  EXPECT_THROW(GridLayout({.tp = 2, .dp = 3, .pp = 2}, GridLayout::kDefaultOrder, 8), Error);
  const std::string m =
      message_of([] { GridLayout({.tp = 2, .dp = 3, .pp = 2}, GridLayout::kDefaultOrder, 8); });
  EXPECT_NE(m.find("parallel.tp x parallel.cp x parallel.dp x parallel.pp"), std::string::npos)
      << m;
  EXPECT_NE(m.find("2 x 1 x 3 x 2 = 12"), std::string::npos) << m;
  EXPECT_NE(m.find("the 8 ranks"), std::string::npos) << m;
}

TEST(GridLayout, RejectsEpNotDividingDp) {
  EXPECT_THROW(GridLayout({.ep = 3, .dp = 4}, GridLayout::kDefaultOrder, 4), Error);
  const std::string m =
      message_of([] { GridLayout({.ep = 3, .dp = 4}, GridLayout::kDefaultOrder, 4); });
  EXPECT_NE(m.find("parallel.ep = 3"), std::string::npos) << m;
  EXPECT_NE(m.find("dp = 4"), std::string::npos) << m;
  EXPECT_NE(m.find("1, 2, 4"), std::string::npos) << m;  // the choices
}

TEST(GridLayout, RejectsBadOrders) {
  const GridDegrees d{.tp = 2, .dp = 2};
  const auto check = [&](const std::string& order, const std::string& what) {
    SCOPED_TRACE(order);
    EXPECT_THROW(GridLayout(d, order, 4), Error);
    const std::string m = message_of([&] { GridLayout(d, order, 4); });
    EXPECT_NE(m.find("parallel.order = \"" + order + "\""), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
    EXPECT_NE(m.find("tp, cp, ep, dp, pp"), std::string::npos) << m;  // the valid axes
  };
  check("tp-cp-ep-dp-xx", "unknown axis \"xx\"");
  check("tp-cp-ep-edp-pp", "unknown axis \"edp\"");  // the order says dp
  check("TP-cp-ep-dp-pp", "unknown axis \"TP\"");
  check("tp-tp-ep-dp-pp", "\"tp\" appears more than once");
  check("tp-cp-ep-dp-pp-tp", "\"tp\" appears more than once");
  check("tp-cp-ep-dp", "\"pp\" is missing");
  check("tp,cp,ep,dp,pp", "unknown axis \"tp,cp,ep,dp,pp\"");
  check("", "unknown axis \"\"");
  check("tp-cp-ep-dp-pp-", "unknown axis \"\"");
  check("tp--cp-ep-dp-pp", "unknown axis \"\"");
}

TEST(GridLayout, RejectsRanksOutsideTheGrid) {
  const GridLayout g({.tp = 2, .dp = 2}, GridLayout::kDefaultOrder, 4);
  EXPECT_THROW(g.coord(4), Error);
  EXPECT_THROW(g.coord(-1), Error);
  EXPECT_THROW(g.rank({.tp = 2}), Error);
  EXPECT_THROW(g.group(7, Group::tp), Error);
}

TEST(GridLayout, Describe) {
  const GridLayout g({2, 1, 2, 4, 2}, GridLayout::kDefaultOrder, 16);
  EXPECT_EQ(g.describe(),
            "tp 2 x cp 1 x dp 4 (ep 2 x edp 2) x pp 2 = 16 ranks, order tp-cp-ep-dp-pp (fastest "
            "first)");
  EXPECT_STREQ(to_string(Group::model_parallel), "model_parallel");
  EXPECT_STREQ(to_string(Axis::edp), "edp");
}

}  // namespace
}  // namespace tessera
