// tessera-logitsdump: tessera's logits of one batch of the deck's data at the weights of a
// checkpoint, for comparison with another implementation (tests/interop/hf_forward.py).
//   tessera-logitsdump OUT.h5 DECK.in --checkpoint.resume=PATH [--section.key=value ...]
// OUT.h5: tokens [B, T] (int32), logits [B, T, V] (float32, the real vocabulary).
#include <mpi.h>

#include <string>
#include <vector>

#include "app/errors.hpp"
#include "config/run_config.hpp"
#include "io/h5.hpp"
#include "train/trainer.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::vector<std::string> args(argv, argv + argc);
  return tessera::run_reporting_errors("tessera-logitsdump", [&] {
    using namespace tessera;
    TESSERA_REQUIRE(args.size() >= 3,
                    "usage: tessera-logitsdump OUT.h5 DECK.in --checkpoint.resume=PATH [...]");
    const std::string out = args[1];
    args.erase(args.begin() + 1);
    const RunConfig run = RunConfig::from_deck(Deck::from_args(args));
    ProcessGrid grid(MPI_COMM_WORLD);
    TESSERA_REQUIRE(grid.world().size() == 1, "tessera-logitsdump runs on one rank");
    Trainer trainer(run, grid);
    Checkpointer checkpoints(run, grid.world());
    TESSERA_REQUIRE(!checkpoints.resume_path().empty(), "set --checkpoint.resume=PATH");
    trainer.restore(checkpoints, true);
    const ModelConfig& c = trainer.config();
    const int64_t T = c.seq_len, B = trainer.batch().micro_batch;
    std::vector<int32_t> tokens(size_t(B * (T + 1))), ids(size_t(B * T));
    for (int64_t b = 0; b < B; ++b) {
      trainer.sample(1, b, tokens.data() + b * (T + 1));
      for (int64_t t = 0; t < T; ++t) ids[size_t(b * T + t)] = tokens[size_t(b * (T + 1) + t)];
    }
    std::vector<float> logits(size_t(B * T * c.vocab));
    StepContext ctx = trainer.context(false);
    trainer.model().logits(ctx, view_of(ids.data(), {B, T}), view_of(logits.data(), {B * T, c.vocab}));
    H5File f = H5File::create(out);
    f.write("/tokens", {B, T}, ids.data());
    f.write("/logits", {B, T, c.vocab}, logits.data());
  });
}
