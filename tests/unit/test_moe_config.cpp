// The mixture-of-experts keys of [model] (doc/moe.md): which blocks are MoE, parameter counts,
// and the errors raised before any work.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/run_config.hpp"
#include "core/error.hpp"
#include "model/config.hpp"

namespace tessera {
namespace {

ModelConfig model(std::vector<std::string> overrides) {
  const Deck deck = Deck::from_text("[data]\npath = corpus.txt\n", overrides, "test");
  const RunConfig run = RunConfig::from_deck(deck);
  return ModelConfig::from(run.model, run.train);
}

// The message of the error `fn` raises (empty when none).
template <class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<int64_t> moe_blocks(const ModelConfig& c) {
  std::vector<int64_t> out;
  for (int64_t l = 0; l < c.layers; ++l)
    if (c.moe.is_moe(l)) out.push_back(l);
  return out;
}

TEST(MoeConfig, WhichBlocksAreMixturesOfExperts) {
  const std::vector<std::string> base = {"--model.layers=6", "--model.experts=4"};
  auto with = [&](const std::string& layers) {
    std::vector<std::string> o = base;
    o.push_back("--model.moe_layers=" + layers);
    return moe_blocks(model(o));
  };
  EXPECT_EQ(with("all"), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(with("every:2"), (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(with("after:1"), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_TRUE(moe_blocks(model({"--model.layers=6"})).empty());  // experts = 0: dense
}

TEST(MoeConfig, CountsTotalAndActiveParameters) {
  // llama, C = 64, 2 layers of which the second is MoE: 8 experts of width 32, top 2, one
  // shared expert. An expert holds 3 C F; the MoE block trades its MLP (3 C ffn_hidden) for
  // the router (E C + E bias) and 9 experts.
  const ModelConfig dense = model({"--model.layers=2", "--model.d_model=64"});
  const ModelConfig c =
      model({"--model.layers=2", "--model.d_model=64", "--model.experts=8", "--model.expert_ffn=32",
             "--model.shared_experts=1", "--model.moe_layers=after:1"});
  const int64_t expert = 3 * 64 * 32, mlp = 3 * 64 * dense.ffn_hidden;
  EXPECT_EQ(c.expert_param_count(), expert);
  EXPECT_EQ(c.param_count(), dense.param_count() - mlp + 9 * expert + 8 * 64 + 8);
  EXPECT_EQ(c.active_param_count(), c.param_count() - 6 * expert);
  EXPECT_EQ(dense.active_param_count(), dense.param_count());
}

TEST(MoeConfig, ErrorsNameTheFault) {
  EXPECT_NE(error_of([] {
              model({"--model.experts=4", "--model.experts_top_k=5"});
            }).find("model.experts_top_k = 5 is larger than model.experts = 4"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              model({"--model.experts=4", "--model.moe_layers=every:0"});
            }).find("model.moe_layers = 'every:0'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              model({"--model.experts=4", "--model.moe_layers=odd"});
            }).find("is not all, every:K"),
            std::string::npos);
  EXPECT_NE(error_of([] { model({"--model.shared_experts=1"}); }).find("needs routed experts"),
            std::string::npos);
  EXPECT_EQ(error_of([] { model({"--model.experts=4", "--train.recompute=full"}); }), "");
  const ModelConfig c = model({"--model.experts=6"});
  EXPECT_EQ(error_of([&] { c.check_experts(2, 1); }), "");
  EXPECT_NE(error_of([&] {
              c.check_experts(4, 1);
            }).find("model.experts = 6 is not divisible by parallel.ep = 4"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { c.check_experts(1, 2); }), "");
  EXPECT_NE(error_of([] {
              model({"--model.experts=4", "--model.shared_experts=1", "--model.expert_ffn=6"})
                  .check_experts(1, 4);
            }).find("parallel.tp = 4 does not divide the shared experts' width"),
            std::string::npos);
  // Node-limited routing: 6 experts on 3 nodes of 2, top 2 by default.
  ModelConfig n = model({"--model.experts=6"});
  EXPECT_EQ(error_of([&] { n.limit_nodes(0, 3, 1); }), "");
  EXPECT_TRUE(n.moe.node_limited());
  EXPECT_EQ(n.moe.nodes, 3);
  EXPECT_EQ(error_of([&] { n.limit_nodes(3, 1, 2); }), "");  // emulated on one node
  EXPECT_EQ(n.moe.placed_nodes, 1);
  EXPECT_NE(error_of([&] {
              n.limit_nodes(0, 3, 4);
            }).find("parallel.ep_max_nodes = 4 is larger than the 3 nodes"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              model({"--model.experts=6", "--model.experts_top_k=3"}).limit_nodes(0, 3, 1);
            }).find("1 x 2 = 2 experts, fewer than model.experts_top_k = 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { n.limit_nodes(2, 3, 1); }).find("parallel.ep_nodes = 2 but"),
            std::string::npos);
  EXPECT_NE(error_of([&] { n.limit_nodes(0, 0, 1); }).find("equal blocks"), std::string::npos);
  EXPECT_NE(error_of([&] { n.limit_nodes(4, 1, 1); }).find("does not divide over the 4 nodes"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              model({}).check_experts(2, 1);
            }).find("parallel.ep = 2 but the model has no experts"),
            std::string::npos);
  // The two-level dispatch (parallel.ep_dispatch = two_level): 8 experts, ep 4.
  ModelConfig t = model({"--model.experts=8"});
  t.limit_nodes(0, 2, 0);  // the ep group spans 2 nodes
  EXPECT_EQ(error_of([&] { t.dispatch_two_level(4, 2); }), "");
  EXPECT_TRUE(t.moe.two_level);
  EXPECT_NE(error_of([&] { t.dispatch_two_level(1, 2); }).find("needs expert parallelism"),
            std::string::npos);
  EXPECT_NE(error_of([&] { t.dispatch_two_level(4, 0); }).find("equal blocks"), std::string::npos);
  t.limit_nodes(0, 1, 0);  // one node
  EXPECT_NE(error_of([&] { t.dispatch_two_level(4, 1); }).find("spans one node"),
            std::string::npos);
  t.limit_nodes(2, 1, 0);  // two nodes emulated by parallel.ep_nodes
  EXPECT_EQ(error_of([&] { t.dispatch_two_level(4, 1); }), "");
  EXPECT_EQ(t.moe.nodes, 2);
  ModelConfig u = model({"--model.experts=12"});
  u.limit_nodes(4, 1, 0);
  EXPECT_NE(error_of([&] { u.dispatch_two_level(6, 1); }).find("parallel.ep = 6 does not divide"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera
