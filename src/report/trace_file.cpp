#include "report/trace_file.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "comm/clock_sync.hpp"
#include "core/error.hpp"

namespace tessera {
namespace fs = std::filesystem;

std::unique_ptr<TraceFile> TraceFile::open(const RunConfig& run, ProcessGrid& grid) {
  if (!run.output.trace) return nullptr;
  return std::unique_ptr<TraceFile>(new TraceFile(run, grid));
}

TraceFile::TraceFile(const RunConfig& run, ProcessGrid& grid)
    : trace_(run.output.trace_steps), rank_(grid.world().rank()) {
  const fs::path dir = fs::path(run.output.dir) / "trace";
  path_ = (dir / cat("rank", rank_, ".json")).string();
  if (rank_ == 0) {  // files of an earlier run with more ranks would be read as this run's
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(dir, ec)) {
      const std::string name = f.path().filename().string();
      if (name.rfind("rank", 0) == 0 && f.path().extension() == ".json") fs::remove(f.path(), ec);
    }
  }
  // Rank 0 reaches the agreement after removing them, and the others write only later.
  const ClockAgreement clock = agree_clock(grid.world(), Trace::steady_seconds);
  trace_.set_clock(clock.offset, clock.origin);
  const GridLayout::Coord c = grid.coord();
  process_name_ = cat("rank ", rank_, " (pp ", c.pp, ", dp ", c.dp, ", tp ", c.tp, ")");
  coord_json_ =
      cat("{\"tp\": ", c.tp, ", \"cp\": ", c.cp, ", \"dp\": ", c.dp, ", \"pp\": ", c.pp, "}");
  schedule_json_ = cat("{\"kind\": \"", to_string(run.parallel.pp_schedule),
                       "\", \"chunks\": ", run.parallel.pp_virtual, "}");
}

TraceFile::~TraceFile() {
  try {
    if (trace_.first_step() >= 0) write();  // an exit by error: what was recorded so far
  } catch (...) {
  }
}

void TraceFile::write() {
  if (written_) return;
  written_ = true;
  std::error_code ec;
  fs::create_directories(fs::path(path_).parent_path(), ec);
  const std::string tmp = path_ + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  TESSERA_REQUIRE_LOCAL(f, "cannot write the trace file '", tmp, "' (output.trace)");
  const int pid = rank_;
  std::fprintf(f,
               "{\"displayTimeUnit\": \"ms\",\n\"otherData\": {\"rank\": %d, \"coord\": %s, "
               "\"layout\": %s, \"pp_schedule\": %s, \"steps\": [%lld, %lld], \"events\": %zu, "
               "\"dropped_events\": %lld, \"clock_offset_us\": %.3f},\n\"traceEvents\": [\n",
               pid, coord_json_.c_str(), layout_json_.c_str(), schedule_json_.c_str(),
               (long long)trace_.first_step(), (long long)trace_.last_step(),
               trace_.events().size(), (long long)trace_.dropped(), trace_.offset() * 1e6);
  std::fprintf(f,
               "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
               "\"args\": {\"name\": \"%s\"}},\n"
               "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
               "\"args\": {\"sort_index\": %d}}",
               pid, process_name_.c_str(), pid, pid);
  for (int lane = 0; lane < kTraceLanes; ++lane)
    std::fprintf(f,
                 ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                 "\"args\": {\"name\": \"%s\"}},\n"
                 "{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                 "\"args\": {\"sort_index\": %d}}",
                 pid, lane, trace_lane_name(lane), pid, lane, lane);
  for (const TraceEvent& e : trace_.events()) {
    const double ts = trace_.to_us(e.begin);
    std::fprintf(f,
                 ",\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, "
                 "\"ts\": %.3f, \"dur\": %.3f, \"args\": {\"step\": %lld",
                 e.name, to_string(e.kind), pid, trace_lane(e.kind), ts,
                 std::max(0.0, trace_.to_us(e.end) - ts), (long long)e.step);
    if (e.micro >= 0) std::fprintf(f, ", \"micro\": %d, \"chunk\": %d", e.micro, e.chunk);
    if (e.message) std::fprintf(f, ", \"message\": \"%s\"", e.message);
    if (e.peer >= 0) std::fprintf(f, ", \"peer\": %d", e.peer);
    if (e.group >= 0)
      std::fprintf(f, ", \"group\": \"%s\"", trace_.names()[size_t(e.group)].c_str());
    if (e.bytes >= 0) std::fprintf(f, ", \"bytes\": %lld", (long long)e.bytes);
    std::fputs("}}", f);
  }
  std::fputs("\n]}\n", f);
  const bool ok = std::fclose(f) == 0;
  TESSERA_REQUIRE_LOCAL(ok, "cannot write the trace file '", tmp, "' (output.trace)");
  fs::rename(tmp, path_, ec);
  TESSERA_REQUIRE_LOCAL(!ec, "cannot rename the trace file '", tmp, "' to '", path_,
                        "': ", ec.message());
}

}  // namespace tessera
