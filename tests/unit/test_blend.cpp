// Blends of datasets (io/blended_dataset.hpp): the rule, its proportions at every prefix, and
// the errors of data.path's blend form.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/blended_dataset.hpp"

namespace tessera {
namespace {

std::vector<int> picks(const BlendOrder& order, int64_t n) {
  std::vector<int> out;
  for (int64_t g = 0; g < n; ++g) out.push_back(order(g).dataset);
  return out;
}

// Weights 1/2, 1/4, 1/4: the largest lag w_i (g + 1) - c_i, ties to the lowest index, draws
// 0 1 2 0 repeatedly; each dataset's picks are its next samples in order.
TEST(Blend, TheRuleByHand) {
  const BlendOrder order({0.5, 0.25, 0.25});
  EXPECT_EQ(picks(order, 8), (std::vector<int>{0, 1, 2, 0, 0, 1, 2, 0}));
  EXPECT_EQ(order(4).index, 2);  // the third sample of dataset 0
  EXPECT_EQ(order(6).index, 1);  // the second of dataset 2
  EXPECT_EQ(order.counts(8), (std::vector<int64_t>{4, 2, 2}));
  // A lookup behind the cursor starts again and agrees.
  EXPECT_EQ(order(1).dataset, 1);
  EXPECT_EQ(order(1).index, 0);
}

// Every prefix of n samples holds each dataset's count within one sample of w_i n, and the
// counts at several prefixes are those a direct replay of the rule gives.
TEST(Blend, EveryPrefixIsWithinOneSampleOfTheWeights) {
  const std::vector<double> w = {0.61, 0.3, 0.07, 0.02};
  const BlendOrder order(w);
  std::vector<int64_t> c(w.size(), 0);
  for (int64_t g = 0; g < 20000; ++g) {
    const BlendOrder::Pick p = order(g);
    EXPECT_EQ(p.index, c[size_t(p.dataset)]);
    ++c[size_t(p.dataset)];
    for (size_t i = 0; i < w.size(); ++i)
      ASSERT_LT(std::abs(double(c[i]) - w[i] * double(g + 1)), 1.0) << "prefix " << g + 1;
    if (g + 1 == 1000 || g + 1 == 7777 || g + 1 == 20000) {
      const BlendOrder fresh(w);
      EXPECT_EQ(fresh.counts(g + 1), c);
    }
  }
}

TEST(Blend, OneDatasetIsThatDataset) {
  const BlendOrder order({1.0});
  EXPECT_EQ(order(12345).dataset, 0);
  EXPECT_EQ(order(12345).index, 12345);
  const std::vector<BlendPart> one = parse_blend("data/kjv byte.h5");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].path, "data/kjv byte.h5");
  EXPECT_EQ(one[0].weight, 1.0);
}

TEST(Blend, ParsesWeightsAndRefusesBadOnes) {
  const std::vector<BlendPart> b = parse_blend("3 web.h5 1 code.h5");
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].path, "web.h5");
  EXPECT_DOUBLE_EQ(b[0].weight, 0.75);
  EXPECT_DOUBLE_EQ(b[1].weight, 0.25);
  auto error = [](const std::string& spec) {
    try {
      (void)parse_blend(spec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error("0.5 a.h5 0.5").find("pairs of a weight and a dataset"), std::string::npos);
  EXPECT_NE(error("0.5 a.h5 -1 b.h5").find("'-1' of 'b.h5' is not a finite number >= 0"),
            std::string::npos);
  EXPECT_NE(error("0.5 a.h5 nan b.h5").find("'nan' of 'b.h5' is not a finite"), std::string::npos);
  EXPECT_NE(error("0.5 a.h5 inf b.h5").find("not a finite"), std::string::npos);
  EXPECT_NE(error("0 a.h5 0 b.h5").find("sum to 0"), std::string::npos);
  EXPECT_NE(error("1 a.h5 1 ./a.h5").find("names './a.h5' twice"), std::string::npos);
}

}  // namespace
}  // namespace tessera
