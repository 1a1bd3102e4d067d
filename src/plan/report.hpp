// What tessera-plan prints: the ranked table with memory and time breakdowns, the rejected
// families, the full breakdown of one layout (--explain), and the same as JSON.
#pragma once

#include <string>

#include "perf/cost_model.hpp"
#include "plan/search.hpp"

namespace tessera {

std::string describe_workload(const Workload& w);
std::string format_ranking(const SearchResult& r, int top);
std::string format_rejections(const SearchResult& r);
std::string format_explain(const Workload& w, const Estimate& e, const Cluster& c);

std::string estimate_json(const Estimate& e);
std::string workload_json(const Workload& w);
std::string search_json(const Workload& w, const Cluster& c, int accelerators,
                        const SearchResult& r, int top);

}  // namespace tessera
