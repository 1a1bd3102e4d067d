// tessera: trains a transformer language model as the input deck describes.
//   mpirun -np N tessera DECK.in [--section.key=value ...]
//   mpirun -np N tessera [DECK.in] --layout-only [--parallel.key=value ...]
#include <mpi.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "app/errors.hpp"
#include "comm/agree.hpp"
#include "config/run_config.hpp"
#include "core/schema.hpp"
#include "io/checkpoint.hpp"
#include "io/run_lock.hpp"
#include "model/config.hpp"
#include "perf/memory.hpp"
#include "report/run_log.hpp"
#include "report/trace_file.hpp"
#include "train/device.hpp"
#include "train/nonfinite.hpp"
#include "train/stop_signal.hpp"
#include "train/trainer.hpp"

namespace {

// The deck for --layout-only: DECK.in when one is given, otherwise the command-line
// overrides alone. data.path is never opened, so a placeholder stands in for it.
tessera::Deck layout_deck(const std::vector<std::string>& args) {
  const bool has_deck = std::any_of(args.begin() + 1, args.end(),
                                    [](const std::string& a) { return a.rfind('-', 0) != 0; });
  if (has_deck) return tessera::Deck::from_args(args);
  return tessera::Deck::from_text("[data]\npath = (not read with --layout-only)\n",
                                  {args.begin() + 1, args.end()}, "--layout-only");
}

// The process grid of the deck's [parallel] keys (parallel.dp = 0: auto). Degrees that do not
// fit the world are a collective error raised before any communicator is made.
tessera::ProcessGrid make_grid(const tessera::RunConfig& run) {
  const tessera::ParallelSection& p = run.parallel;
  tessera::GridDegrees d;
  d.tp = p.tp;
  d.cp = p.cp;
  d.ep = p.ep;
  d.dp = p.dp;
  d.pp = p.pp;
  return tessera::ProcessGrid(MPI_COMM_WORLD, d, p.order, run.hardware.ranks_per_node);
}

// Bytes this machine can still give: MemAvailable (/proc/meminfo), else the free pages.
double available_memory() {
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    long long kb = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    std::fclose(f);
    if (kb >= 0) return double(kb) * 1024.0;
  }
  return double(sysconf(_SC_AVPHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g GiB", bytes / double(1 << 30));
  return buf;
}

// Before anything large is allocated: the model state of this rank (RankLayout::model_state,
// the formula the summary and the planner use) and one micro-batch's activations through its
// stage's blocks, summed over the ranks of each node, must fit in what the node has
// available. A lower bound of what the run allocates, so it never refuses a run that would
// fit; a model far too big is one error line naming the bytes instead of an allocation
// failure.
void require_memory(const tessera::RankLayout& layout, tessera::ProcessGrid& grid) {
  const double state = layout.model_state().total();
  tessera::ModelConfig stage = layout.model;
  int64_t blocks = 0;
  for (const tessera::ChunkLayers& k : layout.chunks) blocks += k.last - k.first;
  stage.layers = std::max<int64_t>(1, blocks);
  const double acts = tessera::activation_bytes(stage, layout.batch.micro_batch);
  const size_t node = size_t(grid.node());
  std::vector<double> per_node(2 * size_t(grid.nodes()), 0.0);  // bytes, then ranks
  per_node[node] = state + acts;
  per_node[size_t(grid.nodes()) + node] = 1;
  grid.world().all_reduce(per_node.data(), int64_t(per_node.size()));
  const double need = per_node[node], have = available_memory();
  tessera::agree_or_throw(
      grid.world(), need <= have,
      tessera::cat("out of memory: this model needs at least ", gib(need), " on node ", node, " (",
                   per_node[size_t(grid.nodes()) + node], " rank(s), each with ", gib(state),
                   " of model state, ", tessera::model_state_formula(layout),
                   " bytes for Psi = ", layout.params, " parameters per rank at ZeRO-",
                   layout.zero, ", and ", gib(acts),
                   " of activations for one micro-batch), but it has ", gib(have),
                   " available (MemAvailable); use a smaller model or "
                   "train.micro_batch, or spread the model over more ranks (parallel.zero, "
                   "tp, pp); tessera-plan --runtime tessera predicts a layout's memory"));
}

}  // namespace

int main(int argc, char** argv) {
  // First of all, so that a stop signal that comes while MPI starts is kept for after step 1
  // instead of ending the process (and so that MPI's own threads block it too).
  tessera::install_stop_handlers();
  tessera::mpi::init(&argc, &argv);
  const int rank = tessera::mpi::world_rank();
  std::vector<std::string> args(argv, argv + argc);
  const auto layout_flag = std::find(args.begin(), args.end(), "--layout-only");
  const bool layout_only = layout_flag != args.end();
  if (layout_only) args.erase(layout_flag);
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h" || a == "--deck-reference") {
      if (rank == 0)
        std::fputs((a == "--deck-reference" ? tessera::deck_reference_markdown()
                                            : tessera::deck_help_text())
                       .c_str(),
                   stdout);
      tessera::mpi::finalize();
      return 0;
    }
  }
  int stopped_by = 0;  // the signal that stopped the run early, 0 when none
  const int status = tessera::run_reporting_errors("tessera", [&] {
    const tessera::RunConfig run = tessera::RunConfig::from_deck(
        layout_only ? layout_deck(args) : tessera::Deck::from_args(args));
    if (run.hardware.threads > 0) omp_set_num_threads(run.hardware.threads);
    tessera::ProcessGrid grid = make_grid(run);
    if (layout_only) {
      if (rank == 0) std::printf("%s\n", grid.describe().c_str());
      std::fflush(stdout);
      return;
    }
    tessera::require_device(run, grid.world());
    tessera::warn_precision_cost(run, grid.world());
    TESSERA_REQUIRE(!run.output.dir.empty(),
                    "output.dir is empty; name the directory for "
                    "this run's metrics, report and checkpoints (say --output.dir=run1)");
    // What the layout means for this rank, every layout check made once (RankLayout).
    const tessera::RankLayout layout = tessera::RankLayout::make(
        run, grid.layout(), rank, grid.blocked_nodes(tessera::Group::ep));
    // output.trace: made first so that it outlives everything that records into it.
    const std::unique_ptr<tessera::TraceFile> trace = tessera::TraceFile::open(run, grid);
    tessera::Trainer trainer(run, grid, layout, [&] { require_memory(layout, grid); });
    if (trace) {
      grid.set_trace(&trace->trace());
      trainer.set_trace(&trace->trace());
      trace->set_layout(trainer.layout_json());
    }
    // One run per directory, held to the end: after the deck, data and model checks, before a
    // checkpoint is chosen or anything is written (doc/checkpoints.md).
    const tessera::RunLock lock(
        {{run.output.dir, "output.dir", "output directory"},
         {tessera::checkpoint_dir(run), tessera::checkpoint_dir_key(run), "checkpoint directory"}},
        grid.world());
    tessera::Checkpointer checkpoints(run, grid.world());
    checkpoints.set_write_hook([rank] { tessera::inject_stop_signal("checkpoint-write", rank); });
    const int64_t done = trainer.restore(checkpoints);
    if (done >= trainer.steps()) {  // nothing left: say so instead of an empty summary
      if (rank == 0) {
        std::printf(
            "the checkpoint is at step %lld and train.steps = %lld: nothing to train "
            "(raise train.steps to continue)\n",
            (long long)done, (long long)trainer.steps());
        tessera::write_completion_marker(run.output.dir, done);
      }
      return;
    }
    checkpoints.require_writable(trainer.checkpoint_tensors());
    tessera::NonfiniteGuard guard(run.train, grid.world());
    int64_t saved = done;  // the newest step with a checkpoint
    tessera::RunLog log(run, grid, trainer, done);
    log.start();
    tessera::inject_stop_signal("before-first-step", rank);
    const int64_t exit_after = run.train.exit_after;
    const int64_t last =
        exit_after > 0 ? std::min(trainer.steps(), done + exit_after) : trainer.steps();
    for (int64_t s = done + 1; s <= last; ++s) {
      tessera::StepResult r = trainer.step(s);
      if (trainer.eval_due(s, last)) trainer.evaluate(r);
      log.step(r);
      guard.after_step(r, trainer, checkpoints, saved);
      // SIGUSR1/SIGTERM on any rank: every rank checkpoints this step and the run stops.
      if (s < last) stopped_by = tessera::stop_signal_agreed(grid.world());
      if (checkpoints.due(s, last) || stopped_by) {
        trainer.save(checkpoints, s);
        saved = s;
      }
      if (stopped_by) {
        if (rank == 0)
          std::printf("stopped by %s after step %lld: checkpoint written, exit status %d\n",
                      tessera::stop_signal_name(stopped_by).c_str(), (long long)s,
                      tessera::kExitStopped);
        break;
      }
    }
    guard.after_run(trainer.data());
    log.finish();
    if (trace) {
      trace->write();
      const tessera::Trace& t = trace->trace();
      if (rank == 0)
        std::printf(
            "trace: %s (and one file per rank), steps %lld-%lld, %zu events on rank 0%s; "
            "open them in ui.perfetto.dev, or draw the pipeline with tools/trace-plot.py\n",
            trace->path().c_str(), (long long)t.first_step(), (long long)t.last_step(),
            t.events().size(),
            t.dropped() ? tessera::cat(", ", t.dropped(), " dropped (full)").c_str() : "");
    }
    if (rank == 0 && !stopped_by && last == trainer.steps())
      tessera::write_completion_marker(run.output.dir, last);
  });
  return status == 0 && stopped_by ? tessera::kExitStopped : status;
}
