// RunConfig: the deck read once into typed sections.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>

#include "config/run_config.hpp"
#include "core/error.hpp"
#include "core/schema.hpp"

namespace tessera {
namespace {

const char* kMinimal = "[data]\npath = corpus.txt\n";

TEST(RunConfig, DefaultsAndOverridesAreTyped) {
  const RunConfig d = RunConfig::from_deck(Deck::from_text(kMinimal, {}));
  EXPECT_EQ(d.model.arch, Arch::llama);
  EXPECT_EQ(d.model.layers, 4);
  EXPECT_EQ(d.model.tie_embeddings, TieEmbeddings::automatic);
  EXPECT_DOUBLE_EQ(d.model.norm_eps, 1e-5);
  EXPECT_EQ(d.data.path, "corpus.txt");
  EXPECT_EQ(d.data.tokenizer, TokenizerKind::byte);
  EXPECT_EQ(d.parallel.pp_schedule, PipeSchedule::one_f_one_b);
  EXPECT_EQ(d.parallel.progress, DpProgress::poll);
  EXPECT_EQ(d.parallel.order, "tp-cp-ep-dp-pp");
  EXPECT_EQ(d.hardware.device, DeviceKind::cpu);
  EXPECT_TRUE(d.checkpoint.at_end);
  EXPECT_EQ(d.checkpoint.resume, "none");
  EXPECT_EQ(d.sample.prompt, "In the beginning");
  EXPECT_EQ(d.train.recompute, Recompute::none);
  EXPECT_EQ(d.train.recompute_layers, 0);

  const RunConfig o = RunConfig::from_deck(
      Deck::from_text(kMinimal,
                      {"--model.arch=gpt2", "--model.tie_embeddings=true", "--data.tokenizer=gpt2",
                       "--train.global_batch=24", "--optim.lr=0.01", "--parallel.pp_schedule=gpipe",
                       "--parallel.progress=none", "--parallel.shard_group=2",
                       "--hardware.device=cuda", "--output.trace=true", "--checkpoint.dir=ck"},
                      "overrides"));
  EXPECT_EQ(o.model.arch, Arch::gpt2);
  EXPECT_EQ(o.model.tie_embeddings, TieEmbeddings::yes);
  EXPECT_EQ(o.data.tokenizer, TokenizerKind::gpt2);
  EXPECT_EQ(o.train.global_batch, 24);
  EXPECT_DOUBLE_EQ(o.optim.lr, 0.01);
  EXPECT_EQ(o.parallel.pp_schedule, PipeSchedule::gpipe);
  EXPECT_EQ(o.parallel.progress, DpProgress::none);
  EXPECT_EQ(o.parallel.shard_group, 2);
  EXPECT_EQ(o.hardware.device, DeviceKind::cuda);
  EXPECT_TRUE(o.output.trace);
  EXPECT_EQ(o.checkpoint.dir, "ck");
}

// The deck stays inside for what shows it whole (the echo, run.json, checkpoints).
TEST(RunConfig, KeepsTheResolvedDeck) {
  const Deck deck = Deck::from_text(kMinimal, {"--model.layers=2"}, "mine.in");
  const RunConfig c = RunConfig::from_deck(deck);
  EXPECT_EQ(c.origin(), "mine.in");
  EXPECT_EQ(c.to_ini(), deck.to_ini());
  EXPECT_EQ(c.to_json(), deck.to_json());
}

// Every value of every choice key of the schema has its enum, spelt as the deck spells it.
TEST(RunConfig, EveryChoiceOfTheSchemaParses) {
  const std::map<std::string, std::function<std::string(const RunConfig&)>> field = {
      {"model.arch", [](const RunConfig& c) { return to_string(c.model.arch); }},
      {"model.tie_embeddings",
       [](const RunConfig& c) { return to_string(c.model.tie_embeddings); }},
      {"model.router", [](const RunConfig& c) { return to_string(c.model.router); }},
      {"data.tokenizer", [](const RunConfig& c) { return to_string(c.data.tokenizer); }},
      {"parallel.pp_schedule",
       [](const RunConfig& c) { return to_string(c.parallel.pp_schedule); }},
      {"parallel.progress", [](const RunConfig& c) { return to_string(c.parallel.progress); }},
      {"parallel.cp_kind", [](const RunConfig& c) { return to_string(c.parallel.cp_kind); }},
      {"parallel.ep_dispatch",
       [](const RunConfig& c) { return to_string(c.parallel.ep_dispatch); }},
      {"hardware.device", [](const RunConfig& c) { return to_string(c.hardware.device); }},
      {"train.precision", [](const RunConfig& c) { return to_string(c.train.precision); }},
      {"parallel.grad_reduce_dtype",
       [](const RunConfig& c) { return to_string(c.parallel.grad_reduce_dtype); }},
      {"train.recompute", [](const RunConfig& c) { return to_string(c.train.recompute); }},
      {"train.on_nonfinite", [](const RunConfig& c) { return to_string(c.train.on_nonfinite); }},
  };
  for (const KeySpec& k : deck_schema()) {
    if (k.type != KeyType::choice) continue;
    ASSERT_TRUE(field.count(k.name())) << k.name() << " has no enum in RunConfig";
    for (const std::string& v : k.choices) {
      const RunConfig c =
          RunConfig::from_deck(Deck::from_text(kMinimal, {"--" + k.name() + "=" + v}));
      EXPECT_EQ(field.at(k.name())(c), v) << k.name();
    }
  }
}

// The deck offers the split-backward schedules by name (doc/pipeline.md).
TEST(RunConfig, SplitBackwardSchedulesAreOffered) {
  const std::pair<const char*, PipeSchedule> kinds[] = {{"zb-h1", PipeSchedule::zb_h1},
                                                        {"zb-v", PipeSchedule::zb_v},
                                                        {"dualpipev", PipeSchedule::dualpipe_v}};
  for (const auto& [name, kind] : kinds) {
    const RunConfig run = RunConfig::from_deck(
        Deck::from_text(kMinimal, {std::string("--parallel.pp_schedule=") + name}));
    EXPECT_EQ(run.parallel.pp_schedule, kind) << name;
  }
}

TEST(RunConfig, ChoiceParsersNameTheValidChoices) {
  try {
    parse_device_kind("tpu");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective());
    EXPECT_STREQ(e.what(), "hardware.device 'tpu' is not known; choose cpu or cuda");
  }
  EXPECT_THROW(parse_arch("bert"), Error);
  EXPECT_EQ(parse_pipe_schedule("interleaved"), PipeSchedule::interleaved);
}

}  // namespace
}  // namespace tessera
