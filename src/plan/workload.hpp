// The planner's input: the [model] and [train] sections of a training deck (the same file
// tessera trains from; data.path is not needed) and the kernel facts the deck does not hold.
#pragma once

#include <string>
#include <vector>

#include "config/run_config.hpp"
#include "perf/layout.hpp"

namespace tessera {

// Parses deck text with overrides (--section.key=value) as tessera would, except that
// data.path may be absent.
RunConfig plan_config(const std::string& ini_text, const std::vector<std::string>& overrides,
                      const std::string& origin);
RunConfig plan_config_file(const std::string& path, const std::vector<std::string>& overrides);

// model.* -> the model shape; train.global_batch (sequences per step) must be set.
Workload workload_from(const RunConfig& run);

}  // namespace tessera
