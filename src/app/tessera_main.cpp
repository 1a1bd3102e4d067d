// tessera: trains a transformer language model as the input deck describes.
//   mpirun -np N tessera DECK.in [--section.key=value ...]
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "app/errors.hpp"
#include "core/deck.hpp"
#include "core/schema.hpp"
#include "io/run_log.hpp"
#include "train/trainer.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::vector<std::string> args(argv, argv + argc);
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h" || a == "--deck-reference") {
      if (rank == 0)
        std::fputs((a == "--deck-reference" ? tessera::deck_reference_markdown()
                                            : tessera::deck_help_text())
                       .c_str(),
                   stdout);
      MPI_Finalize();
      return 0;
    }
  }
  return tessera::run_reporting_errors("tessera", [&] {
    const tessera::Deck deck = tessera::Deck::from_args(args);
    if (const int64_t threads = deck.integer("hardware.threads"); threads > 0)
      omp_set_num_threads(int(threads));
    tessera::ProcessGrid grid(MPI_COMM_WORLD);
    tessera::Trainer trainer(deck, grid);
    tessera::Checkpointer checkpoints(deck, grid.world());
    const int64_t done = trainer.restore(checkpoints);
    tessera::RunLog log(deck, grid, trainer, done);
    log.start();
    const int64_t exit_after = deck.integer("train.exit_after");
    const int64_t last = exit_after > 0 ? std::min(trainer.steps(), done + exit_after)
                                        : trainer.steps();
    for (int64_t s = done + 1; s <= last; ++s) {
      tessera::StepResult r = trainer.step(s);
      if (trainer.eval_due(s, last)) r.val_loss = trainer.evaluate();
      log.step(r);
      if (checkpoints.due(s, last)) trainer.save(checkpoints, s);
    }
    log.finish();
  });
}
