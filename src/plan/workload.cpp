#include "plan/workload.hpp"

#include <fstream>
#include <sstream>

#include "core/error.hpp"

namespace tessera {

Deck plan_deck(const std::string& ini_text, const std::vector<std::string>& overrides,
               const std::string& origin) {
  // The planner reads no data; a placeholder satisfies the required key (a path the deck or
  // the command line gives wins, being later).
  std::vector<std::string> all{"--data.path=(not read by tessera-plan)"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return Deck::from_text(ini_text, all, origin);
}

Deck plan_deck_file(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  TESSERA_REQUIRE(in.good(), "cannot open input deck '", path, "': no such file or not readable");
  std::stringstream text;
  text << in.rdbuf();
  return plan_deck(text.str(), overrides, path);
}

Workload workload_from_deck(const Deck& deck) {
  Workload w;
  w.cfg = ModelConfig::from_deck(deck);
  w.global_batch = deck.integer("train.global_batch");
  w.zero_inflight = int(deck.integer("parallel.zero_inflight"));
  w.pp_layers = deck.str("parallel.pp_layers");
  TESSERA_REQUIRE(w.global_batch > 0, "train.global_batch is 0 in '", deck.origin(),
                  "'; the planner needs the sequences per optimizer step (set it in the deck "
                  "or pass --train.global_batch=N)");
  return w;
}

}  // namespace tessera
