// output.trace: this rank's timeline as a Chrome trace (Trace Event Format, JSON object
// form), OUTPUT_DIR/trace/rank<R>.json, which Perfetto (ui.perfetto.dev) and
// chrome://tracing open; load every rank's file together to see them on one clock.
//
//   traceEvents  metadata ("M") naming the process "rank R (pp s, dp d, tp t)" (pid = world
//                rank) and its lanes (tid 0 steps and phases, 1 pipeline, 2 collectives),
//                then one complete ("X") event per span: ts and dur in microseconds from a
//                time origin common to all ranks; args step, and as they apply micro, chunk
//                (local), message, peer (stage), group, bytes
//   otherData    rank, its coordinates, the layout, the pipeline schedule, the steps traced,
//                the events kept and dropped, the clock offset applied
//
// Written by write() at the end of the run, or by the destructor when the run ends by an
// error (what was recorded so far). Writing is local: no rank waits for another.
#pragma once

#include <memory>
#include <string>

#include "comm/process_grid.hpp"
#include "config/run_config.hpp"
#include "core/trace.hpp"

namespace tessera {

class TraceFile {
 public:
  // Null when output.trace is false. Otherwise collective over grid.world(): agrees the
  // clock with rank 0 and (rank 0) removes the rank files of an earlier traced run there.
  static std::unique_ptr<TraceFile> open(const RunConfig& run, ProcessGrid& grid);
  ~TraceFile();

  Trace& trace() { return trace_; }
  const std::string& path() const { return path_; }
  // JSON object of the run's layout, copied into otherData.
  void set_layout(std::string json) { layout_json_ = std::move(json); }
  // Writes the file (once; later calls do nothing). Throws a local Error when it cannot.
  void write();

 private:
  TraceFile(const RunConfig& run, ProcessGrid& grid);

  Trace trace_;
  std::string path_, process_name_, coord_json_, schedule_json_, layout_json_ = "{}";
  int rank_ = 0;
  bool written_ = false;
};

}  // namespace tessera
