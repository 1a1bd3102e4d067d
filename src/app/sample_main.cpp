// tessera-sample: loads a checkpoint on one rank and continues a prompt.
//   tessera-sample DECK.in --checkpoint.resume=latest|PATH [--sample.prompt="..."] [...]
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "app/errors.hpp"
#include "config/run_config.hpp"
#include "io/tokenizer.hpp"
#include "train/device.hpp"
#include "train/sampler.hpp"
#include "train/trainer.hpp"

int main(int argc, char** argv) {
  tessera::mpi::init(&argc, &argv);
  const std::vector<std::string> args(argv, argv + argc);
  return tessera::run_reporting_errors("tessera-sample", [&] {
    using namespace tessera;
    const RunConfig run = RunConfig::from_deck(Deck::from_args(args));
    ProcessGrid grid(MPI_COMM_WORLD);
    TESSERA_REQUIRE(grid.world().size() == 1, "tessera-sample runs on one rank");
    require_device(run, grid.world());
    TESSERA_REQUIRE(run.checkpoint.resume != "none",
                    "tessera-sample needs a trained model: set --checkpoint.resume=latest or "
                    "the path of a checkpoint");
    Trainer trainer(run, grid);
    Checkpointer checkpoints(run, grid.world());
    TESSERA_REQUIRE(!checkpoints.resume_path().empty(), "no checkpoint found in '",
                    checkpoints.dir(), "' (checkpoint.resume = latest); train first");
    const int64_t step = trainer.restore(checkpoints, true);  // 0: an imported model

    auto tokenizer = make_tokenizer(to_string(run.data.tokenizer), run.sample.vocab_dir);
    const std::string& prompt = run.sample.prompt;
    std::vector<int32_t> ids;
    for (uint32_t id : tokenizer->encode(prompt)) ids.push_back(int32_t(id));
    SampleOptions opt;
    opt.length = run.sample.length;
    opt.temperature = run.sample.temperature;
    opt.top_k = run.sample.top_k;
    opt.seed = uint64_t(run.sample.seed);
    opt.stop_id = tokenizer->eos_id();
    const std::vector<int32_t> out = generate(trainer.model(), trainer.context(false), ids, opt);
    std::vector<uint32_t> text_ids(out.begin(), out.end());
    std::printf("--- sample (step %lld, temperature %g, top-k %lld) ---\n%s%s\n",
                (long long)step, opt.temperature, (long long)opt.top_k, prompt.c_str(),
                tokenizer->decode(text_ids).c_str());
    if (run.sample.print_ids) {  // for comparisons with other implementations (doc/interop.md)
      std::printf("prompt ids:");
      for (int32_t id : ids) std::printf(" %d", id);
      std::printf("\nsample ids:");
      for (int32_t id : out) std::printf(" %d", id);
      std::printf("\n");
    }
  });
}
