// The features that report (report/section.hpp), each in its own file of report/sections/.
// report_sections gives them in the order RunLog calls them; that order places each one's
// lines where the summary, the progress line and metrics.jsonl have always had them, and
// runs their collectives in the same order on every rank.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "report/section.hpp"
#include "tensor/tensor.hpp"

namespace tessera {

// Memory (report/sections/memory.cpp): the peak table, the model state against the ZeRO
// formula, activations and the output head; memory.json and gemm.json. Its peaks (max over
// ranks, after gather) are the plan comparison's measured memory.
class MemorySection : public ReportSection {
 public:
  // Peak bytes per category (Charge order), then the total.
  virtual const std::array<double, kChargeCount + 1>& peak() const = 0;
};
std::unique_ptr<MemorySection> memory_section(const ReportInputs& in);

// Data (report/sections/data.cpp): a blend's datasets, their validation losses and draws.
std::unique_ptr<ReportSection> data_section(const ReportInputs& in);
// Data parallelism (report/sections/data_parallel.cpp): the gradient all-reduce's timing per
// step and over the run, and the strategy's own lines (DataParallel::summary).
std::unique_ptr<ReportSection> data_parallel_section(const ReportInputs& in);
// Precision (report/sections/precision.cpp): fp16 loss scaling.
std::unique_ptr<ReportSection> precision_section(const ReportInputs& in);
// Context parallelism (report/sections/context_parallel.cpp): the ring's overlap.
std::unique_ptr<ReportSection> context_parallel_section(const ReportInputs& in);
// The communication monitor (report/sections/comm_monitor.cpp, output.comm_warn_share).
std::unique_ptr<ReportSection> comm_monitor_section(const ReportInputs& in);
// Experts (report/sections/experts.cpp): the last step's routing of every MoE block.
std::unique_ptr<ReportSection> experts_section(const ReportInputs& in);
// The pipeline (report/sections/pipeline.cpp): the cut, and the bubble per rank.
std::unique_ptr<ReportSection> pipeline_section(const ReportInputs& in);

// Every section, in the run log's order; memory is also returned apart.
std::vector<std::unique_ptr<ReportSection>> report_sections(const ReportInputs& in,
                                                            const MemorySection** memory);

}  // namespace tessera
