// tessera-logitsdump: tessera's logits at the weights of a checkpoint, for comparison with
// another implementation: of one batch of the deck's data (tests/interop/hf_forward.py), or
// of one sequence of token ids read from a file (--ids FILE, whitespace-separated; at most
// model.seq_len of them).
//   tessera-logitsdump OUT.h5 [--ids FILE] DECK.in --checkpoint.resume=PATH [--section.key=value ...]
// OUT.h5: tokens [B, T] (int32), logits [B, T, V] (float32, the real vocabulary); with --ids,
// B = 1 and T = the number of ids.
#include <mpi.h>

#include <algorithm>
#include <fstream>
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
                    "usage: tessera-logitsdump OUT.h5 [--ids FILE] DECK.in --checkpoint.resume=PATH [...]");
    const std::string out = args[1];
    args.erase(args.begin() + 1);
    std::vector<int32_t> given;
    if (args.size() >= 3 && args[1] == "--ids") {
      std::ifstream in(args[2]);
      TESSERA_REQUIRE(in.good(), "cannot read '", args[2], "'");
      for (int32_t id; in >> id;) given.push_back(id);
      TESSERA_REQUIRE(!given.empty(), "'", args[2], "' holds no token ids");
      args.erase(args.begin() + 1, args.begin() + 3);
    }
    const RunConfig run = RunConfig::from_deck(Deck::from_args(args));
    ProcessGrid grid(MPI_COMM_WORLD);
    TESSERA_REQUIRE(grid.world().size() == 1, "tessera-logitsdump runs on one rank");
    Trainer trainer(run, grid);
    Checkpointer checkpoints(run, grid.world());
    TESSERA_REQUIRE(!checkpoints.resume_path().empty(), "set --checkpoint.resume=PATH");
    trainer.restore(checkpoints, true);
    const ModelConfig& c = trainer.config();
    const int64_t T = c.seq_len, B = given.empty() ? trainer.batch().micro_batch : 1;
    std::vector<int32_t> tokens(size_t(B * (T + 1))), ids(size_t(B * T));
    for (int64_t b = 0; b < B; ++b) {
      if (given.empty()) trainer.sample(1, b, tokens.data() + b * (T + 1));
      for (int64_t t = 0; t < T; ++t) ids[size_t(b * T + t)] = tokens[size_t(b * (T + 1) + t)];
    }
    // Causal attention: the zeros after the given ids do not change the logits before them.
    TESSERA_REQUIRE(int64_t(given.size()) <= T, "--ids: ", given.size(),
                    " ids, more than model.seq_len = ", T);
    std::copy(given.begin(), given.end(), ids.begin());
    std::vector<float> logits(size_t(B * T * c.vocab));
    StepContext ctx = trainer.context(false);
    ctx.batch = B;
    trainer.model().logits(ctx, view_of(ids.data(), {B, T}), view_of(logits.data(), {B * T, c.vocab}));
    const int64_t n = given.empty() ? T : int64_t(given.size());
    std::vector<int32_t> ids_out;
    std::vector<float> logits_out;
    for (int64_t b = 0; b < B; ++b) {
      ids_out.insert(ids_out.end(), ids.begin() + b * T, ids.begin() + b * T + n);
      logits_out.insert(logits_out.end(), logits.begin() + b * T * c.vocab,
                        logits.begin() + (b * T + n) * c.vocab);
    }
    H5File f = H5File::create(out);
    f.write("/tokens", {B, n}, ids_out.data());
    f.write("/logits", {B, n, c.vocab}, logits_out.data());
  });
}
