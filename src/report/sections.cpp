#include "report/sections.hpp"

namespace tessera {

// The order places each section's lines where they belong: memory's peak table and model state
// lead the summary's state part, before the loss scale and the experts; data parallelism's
// metrics.jsonl fields come before the loss scale's and the experts' routing; the loss scale's
// note on the progress line before the communication monitor's; and per step the monitor's
// all-reduce runs before the experts' gather over the pp group.
std::vector<std::unique_ptr<ReportSection>> report_sections(const ReportInputs& in,
                                                            const MemorySection** memory) {
  std::vector<std::unique_ptr<ReportSection>> out;
  out.push_back(data_section(in));  // a blend's lines first: no collectives, its own fields
  std::unique_ptr<MemorySection> m = memory_section(in);
  *memory = m.get();
  out.push_back(std::move(m));
  out.push_back(data_parallel_section(in));
  out.push_back(precision_section(in));
  out.push_back(context_parallel_section(in));
  out.push_back(comm_monitor_section(in));
  out.push_back(experts_section(in));
  out.push_back(pipeline_section(in));
  return out;
}

}  // namespace tessera
