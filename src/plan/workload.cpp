#include "plan/workload.hpp"

#include <fstream>
#include <sstream>

#include "core/error.hpp"

namespace tessera {

RunConfig plan_config(const std::string& ini_text, const std::vector<std::string>& overrides,
                      const std::string& origin) {
  // The planner reads no data; a placeholder satisfies the required key (a path the deck or
  // the command line gives wins, being later).
  std::vector<std::string> all{"--data.path=(not read by tessera-plan)"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return RunConfig::from_deck(Deck::from_text(ini_text, all, origin));
}

RunConfig plan_config_file(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  TESSERA_REQUIRE(in.good(), "cannot open input deck '", path, "': no such file or not readable");
  std::stringstream text;
  text << in.rdbuf();
  return plan_config(text.str(), overrides, path);
}

Workload workload_from(const RunConfig& run) {
  Workload w;
  w.cfg = ModelConfig::from(run.model, run.train, run.hardware.device);
  w.global_batch = run.train.global_batch;
  w.zero_inflight = run.parallel.zero_inflight;
  w.pp_layers = run.parallel.pp_layers;
  w.cp_kind = run.parallel.cp_kind;
  w.ep_dispatch = run.parallel.ep_dispatch;
  w.ep_nodes = run.parallel.ep_nodes;
  w.ep_max_nodes = run.parallel.ep_max_nodes;
  w.document_mask = run.data.document_mask;
  w.pp_pair_overlap = run.parallel.pp_pair_overlap;
  w.device = run.hardware.device;
  // A mixture of experts in the deck (model.experts, ...): tessera's runtime model reads all
  // of w.cfg.moe; the Megatron-style runtime its routed experts, top-k and expert width.
  if (w.cfg.moe.enabled()) {
    w.moe.experts = int(w.cfg.moe.experts);
    w.moe.top_k = int(w.cfg.moe.top_k);
    w.moe.expert_ffn = w.cfg.moe.ffn;
  }
  TESSERA_REQUIRE(w.global_batch > 0, "train.global_batch is 0 in '", run.origin(),
                  "'; the planner needs the sequences per optimizer step (set it in the deck "
                  "or pass --train.global_batch=N)");
  return w;
}

}  // namespace tessera
