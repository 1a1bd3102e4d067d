// ProcessGrid under mpiexec: for every layout in the table that fits the world size, each
// rank's communicators must be the groups GridLayout computes. Every rank all-gathers the
// world ranks of each of its groups through the group's communicator, then all ranks
// exchange those member lists over the world, and every rank checks the whole table:
//   (a) each rank's members (in communicator order) are GridLayout::group() (for dp: ordered
//       by Coord::dp, otherwise by world rank);
//   (b) every member of a group reports the identical list;
//   (c) the groups of one kind partition the world and equal GridLayout::all_groups().
// An all-reduce in each group then sums to the value its members imply. Bad degrees must
// raise the same collective error on every rank, before any communicator is made (no hang).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "comm/process_grid.hpp"
#include "core/error.hpp"

namespace tessera {
namespace {

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

struct Case {
  GridDegrees degrees;  // dp = 0: auto
  const char* order;
};

// {tp, cp, ep, dp, pp}. Cases whose degrees do not fit the world size are skipped, so each of
// NP = 2, 3, 4 runs its own subset (every one runs the all-ones case).
const Case kCases[] = {
    {{1, 1, 1, 0, 1}, "tp-cp-ep-dp-pp"},  // dp = world
    {{2, 1, 1, 0, 1}, "tp-cp-ep-dp-pp"},  // np2: tp2; np4: tp2 dp2
    {{2, 1, 1, 0, 1}, "pp-dp-ep-cp-tp"},  // np4: tp2 dp2, dp fastest
    {{2, 1, 1, 0, 2}, "tp-cp-ep-dp-pp"},  // np4: tp2 pp2
    {{2, 1, 1, 1, 2}, "pp-tp-dp-ep-cp"},  // np4: pp fastest, explicit dp
    {{2, 1, 1, 0, 2}, "dp-pp-cp-ep-tp"},  // np4
    {{1, 2, 2, 0, 1}, "tp-cp-ep-dp-pp"},  // np4: cp2 dp2 with ep2
    {{1, 2, 2, 2, 1}, "ep-pp-dp-tp-cp"},  // np4: cp slowest
    {{1, 1, 2, 0, 1}, "tp-cp-ep-dp-pp"},  // np2: ep2; np4: ep2 x edp2
    {{1, 1, 2, 4, 1}, "dp-ep-tp-cp-pp"},  // np4: edp fastest, so dp rank != order of world rank
    {{1, 1, 1, 0, 4}, "tp-cp-ep-dp-pp"},  // np4: pp4 (middle stages: single-rank embedding)
    {{1, 1, 1, 0, 2}, "pp-tp-cp-ep-dp"},  // np2: pp2; np4: pp2 dp2, pp fastest
    {{1, 1, 1, 0, 3}, "tp-cp-ep-dp-pp"},  // np3: pp3
    {{3, 1, 1, 0, 1}, "tp-cp-ep-dp-pp"},  // np3: tp3
    {{1, 3, 1, 0, 1}, "dp-cp-ep-tp-pp"},  // np3: cp3
    {{1, 1, 3, 0, 1}, "ep-dp-tp-cp-pp"},  // np3: ep3
    {{1, 1, 1, 4, 1}, "tp-cp-ep-dp-pp"},  // np4: dp4 explicit
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "tp " << c.degrees.tp << " cp " << c.degrees.cp << " ep " << c.degrees.ep << " dp "
      << c.degrees.dp << " pp " << c.degrees.pp << " order " << c.order;
}

// Whether c fits a world of n ranks (as GridLayout would accept it).
bool fits(const Case& c, int n) {
  const GridDegrees& d = c.degrees;
  const int model = d.tp * d.cp * d.pp;
  if (n % model != 0) return false;
  const int dp = d.dp == 0 ? n / model : d.dp;
  return model * dp == n && dp % d.ep == 0;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const GridDegrees& d = info.param.degrees;
  std::string s = "tp" + std::to_string(d.tp) + "cp" + std::to_string(d.cp) + "ep" +
                  std::to_string(d.ep) + "dp" + (d.dp ? std::to_string(d.dp) : "auto") + "pp" +
                  std::to_string(d.pp) + "_";
  for (const char* p = info.param.order; *p; ++p)
    if (*p != '-') s += *p;
  return s;
}

class Grid : public ::testing::TestWithParam<Case> {};

TEST_P(Grid, EveryRankAgreesOnEveryGroup) {
  const int n = world_size();
  if (!fits(GetParam(), n)) GTEST_SKIP() << "degrees do not fit " << n << " ranks";
  ProcessGrid grid(MPI_COMM_WORLD, GetParam().degrees, GetParam().order);
  const GridLayout& layout = grid.layout();
  const int me = grid.world().rank();
  SCOPED_TRACE(layout.describe());
  ASSERT_EQ(layout.world(), n);
  ASSERT_EQ(grid.world().size(), n);
  EXPECT_EQ(layout.order_string(), GetParam().order);
  const GridLayout::Coord c = grid.coord();

  for (Group g : kAllGroups) {
    SCOPED_TRACE(std::string("group ") + to_string(g));
    Communicator& comm = grid.group(g);
    EXPECT_EQ(comm.name(), to_string(g));

    // This rank's members, in communicator order, as its communicator says.
    const float mine = float(me);
    std::vector<float> got(size_t(comm.size()), -1.f);
    comm.all_gather(&mine, got.data(), 1);
    std::vector<int> members(got.begin(), got.end());
    EXPECT_EQ(members[size_t(comm.rank())], me);

    // (a) The layout's arithmetic; in the dp group ranks are numbered by Coord::dp.
    std::vector<int> expected = layout.group(me, g);
    if (g == Group::dp)
      std::sort(expected.begin(), expected.end(),
                [&](int a, int b) { return layout.coord(a).dp < layout.coord(b).dp; });
    EXPECT_EQ(members, expected) << "rank " << me;
    if (g == Group::dp) EXPECT_EQ(comm.rank(), c.dp);

    // Every rank's list over the world: row r is rank r's members, padded with -1.
    std::vector<float> row(size_t(n), -1.f), table(size_t(n) * size_t(n), -2.f);
    std::copy(members.begin(), members.end(), row.begin());
    grid.world().all_gather(row.data(), table.data(), n);
    auto list_of = [&](int r) {
      std::vector<int> out;
      for (int j = 0; j < n && table[size_t(r) * n + j] >= 0; ++j)
        out.push_back(int(table[size_t(r) * n + j]));
      return out;
    };

    // (b) Every member of a group reports the same list, which holds it; (c) the distinct
    // lists partition the world into the layout's groups.
    std::set<std::vector<int>> groups;
    std::vector<int> times_placed(size_t(n), 0);
    for (int r = 0; r < n; ++r) {
      const std::vector<int> list = list_of(r);
      EXPECT_NE(std::find(list.begin(), list.end(), r), list.end())
          << "rank " << r << " is not in its own group";
      for (int m : list) {
        ASSERT_GE(m, 0);
        ASSERT_LT(m, n);
        EXPECT_EQ(list_of(m), list) << "ranks " << r << " and " << m << " disagree";
      }
      std::vector<int> sorted = list;
      std::sort(sorted.begin(), sorted.end());
      if (groups.insert(sorted).second)
        for (int m : sorted) ++times_placed[size_t(m)];
    }
    for (int r = 0; r < n; ++r) EXPECT_EQ(times_placed[size_t(r)], 1) << "rank " << r;
    const std::vector<std::vector<int>> all = layout.all_groups(g);
    EXPECT_EQ(std::vector<std::vector<int>>(groups.begin(), groups.end()), all);
    if (g != Group::embedding) {  // embedding: pairs of end stages, middle stages alone
      EXPECT_EQ(int(all.size()) * layout.group_size(g), n);
      EXPECT_EQ(comm.size(), layout.group_size(g));
    }

    // An all-reduce over the group: the sum of (world rank + 1) and the member count.
    int64_t sums[2] = {me + 1, 1};
    comm.all_reduce(sums, 2);
    int64_t want = 0;
    for (int m : expected) want += m + 1;
    EXPECT_EQ(sums[0], want);
    EXPECT_EQ(sums[1], int64_t(expected.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, Grid, ::testing::ValuesIn(kCases), case_name);

// The two-level dispatch's groups (ProcessGrid::split_ep_by_node): with the whole world one ep
// group of 2 blocks (nodes), ep_intra holds this rank's block in ep order and ep_cross the
// ranks with this rank's index in every block, one per block, in block order; both appear in
// the traffic table.
TEST(GridEpNodes, IntraAndCrossGroupsSplitTheEpGroupByNode) {
  const int n = world_size();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even world";
  ProcessGrid grid(MPI_COMM_WORLD, {1, 1, n, n, 1}, "tp-cp-ep-dp-pp");
  EXPECT_EQ(grid.ep_intra(), nullptr);
  grid.split_ep_by_node(2);
  Communicator& ep = grid.group(Group::ep);
  Communicator& intra = *grid.ep_intra();
  Communicator& cross = *grid.ep_cross();
  const int per_node = n / 2;
  EXPECT_EQ(intra.size(), per_node);
  EXPECT_EQ(intra.rank(), ep.rank() % per_node);
  EXPECT_EQ(cross.size(), 2);
  EXPECT_EQ(cross.rank(), ep.rank() / per_node);
  std::vector<float> mine{float(ep.rank())}, cross_all(2);
  std::vector<float> intra_all = std::vector<float>(static_cast<size_t>(per_node));
  intra.all_gather(mine.data(), intra_all.data(), 1);
  cross.all_gather(mine.data(), cross_all.data(), 1);
  for (int i = 0; i < per_node; ++i)
    EXPECT_EQ(intra_all[size_t(i)], float(ep.rank() / per_node * per_node + i));
  for (int g = 0; g < 2; ++g)
    EXPECT_EQ(cross_all[size_t(g)], float(g * per_node + ep.rank() % per_node));
  const std::string table = grid.traffic_table();
  EXPECT_NE(table.find("ep_cross"), std::string::npos);
  if (per_node > 1) EXPECT_NE(table.find("ep_intra"), std::string::npos);
}

// Degrees that cannot fit: the same collective Error on every rank, naming the numbers, and
// the world still works afterwards (nobody is left waiting in a split).
TEST(GridErrors, BadDegreesRaiseTheSameErrorOnEveryRank) {
  const int n = world_size();
  auto message = [](const GridDegrees& d, const char* order) {
    try {
      ProcessGrid grid(MPI_COMM_WORLD, d, order);
    } catch (const Error& e) {
      EXPECT_TRUE(e.collective());
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string model = std::to_string(n + 1);
  EXPECT_NE(message({n + 1, 1, 1, 0, 1}, "tp-cp-ep-dp-pp")
                .find(model + " x 1 x 1 = " + model + " does not divide the " + std::to_string(n) +
                      " ranks"),
            std::string::npos);
  EXPECT_NE(message({1, 1, 1, n + 1, 1}, "tp-cp-ep-dp-pp")
                .find("= 1 x 1 x " + model + " x 1 = " + model + " does not equal the " +
                      std::to_string(n) + " ranks"),
            std::string::npos);
  EXPECT_NE(message({1, 1, n + 1, 0, 1}, "tp-cp-ep-dp-pp")
                .find("parallel.ep = " + model +
                      " does not divide the data-parallel degree dp = " + std::to_string(n)),
            std::string::npos);
  EXPECT_NE(message({1, 1, 1, 0, 1}, "tp-cp-ep-dp").find("axis \"pp\" is missing"),
            std::string::npos);
  int one = 1, sum = 0;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(sum, n);
}

}  // namespace
}  // namespace tessera
