// tessera-prep: text and JSONL corpora -> a token dataset (HDF5, format "tessera-dataset"
// version 1, described in io/dataset_writer.hpp), on one rank or on several (mpirun: each rank
// tokenizes a run of the input files; io/prep_parts.hpp), the same bytes either way.
//   tessera-prep --tokenizer byte|gpt2 [--vocab-dir DIR] --out OUT.h5 [--split-lines]
//                [--threads N] [--shard-tokens N] [--loss-mask [--prompt-field NAME]
//                [--response-field NAME]] INPUT...
// With --shard-tokens the dataset is written as shards and an index (io/shard_writer.hpp); with
// --loss-mask the inputs are prompt/response records and the dataset holds a loss mask
// (version 2; doc/data.md, "Loss masks").
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "app/errors.hpp"
#include "comm/agree.hpp"
#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "io/dataset_inputs.hpp"
#include "io/dataset_writer.hpp"
#include "io/prep_parts.hpp"
#include "io/shard_writer.hpp"
#include "io/tokenizer.hpp"
#include "report/prep_progress.hpp"

namespace {

struct Option {
  const char* name;
  const char* value;  // nullptr: a flag
  const char* help;
};

// The one description of the command line: the parser and the help text both read it.
constexpr Option kOptions[] = {
    {"--tokenizer", "KIND", "byte (ids = bytes, EOS 256) or gpt2 (GPT-2 BPE, EOS 50256)"},
    {"--vocab-dir", "DIR", "gpt2: holds encoder.json, vocab.bpe (tools/fetch-gpt2-vocab DIR)"},
    {"--out", "OUT.h5", "the dataset to write (as OUT.h5.tmp, renamed when complete)"},
    {"--split-lines", nullptr,
     "text files: a document per non-blank line (default: per paragraph)"},
    {"--threads", "N",
     "tokenize with N threads (default: 1 for byte, else OMP_NUM_THREADS or every core); "
     "the file is the same bytes for every N"},
    {"--shard-tokens", "N",
     "write shards OUT-00000.h5, OUT-00001.h5, ... of N tokens or a little more (whole "
     "documents) and OUT.h5 as their index; it trains as the one file would"},
    {"--loss-mask", nullptr,
     "fine-tuning data: each .jsonl line is a record with a prompt and a response; a record is "
     "its prompt's tokens, its response's and EOS, and only the response and EOS are targets "
     "of the loss (the file holds a loss mask)"},
    {"--prompt-field", "NAME", "--loss-mask: the prompt's member (default prompt)"},
    {"--response-field", "NAME", "--loss-mask: the response's member (default response)"},
    {"--help", nullptr, "print this help"},
};

std::string help_text() {
  std::string s =
      "usage: tessera-prep --tokenizer byte|gpt2 [--vocab-dir DIR] --out OUT.h5 "
      "[--split-lines] [--threads N] [--shard-tokens N] [--loss-mask [--prompt-field NAME]\n"
      "       [--response-field NAME]] INPUT...\n"
      "INPUT: text files, .jsonl files (one object per line with a \"text\" string) or\n"
      "directories (every regular file inside, recursively, sorted by path). In text files\n"
      "blank lines separate documents. Each document's tokens are followed by EOS. A progress\n"
      "bar is drawn on stderr when it is a terminal.\n";
  for (const Option& o : kOptions) {
    const std::string head = std::string(o.name) + (o.value ? std::string(" ") + o.value : "");
    char line[512];
    std::snprintf(line, sizeof line, "  %-22s %s\n", head.c_str(), o.help);
    s += line;
  }
  return s;
}

struct Args {
  std::map<std::string, std::string> options;  // name -> value ("" for flags)
  std::vector<std::string> inputs;
};

Args parse(const std::vector<std::string>& argv) {
  Args args;
  bool options_done = false;
  for (size_t i = 1; i < argv.size(); ++i) {
    std::string a = argv[i];
    if (options_done || a.size() < 2 || a.compare(0, 2, "--") != 0) {
      args.inputs.push_back(a);
      continue;
    }
    if (a == "--") {
      options_done = true;
      continue;
    }
    std::string value;
    bool inline_value = false;
    if (const size_t eq = a.find('='); eq != std::string::npos) {
      value = a.substr(eq + 1), a = a.substr(0, eq), inline_value = true;
    }
    const Option* opt = nullptr;
    for (const Option& o : kOptions)
      if (a == o.name) opt = &o;
    TESSERA_REQUIRE(opt, "unknown option '", a, "'; see tessera-prep --help");
    if (opt->value && !inline_value) {
      TESSERA_REQUIRE(i + 1 < argv.size(), "option ", a, " needs a value ", opt->value);
      value = argv[++i];
    }
    TESSERA_REQUIRE(opt->value || !inline_value, "option ", a, " takes no value");
    args.options[a] = value;
  }
  return args;
}

// --shard-tokens writes OUT-NNNNN.h5 beside OUT: none of them may be an input (any number
// of digits, the temporary name included, as the shards' count is not known before).
void require_shards_apart(const std::string& out, const std::vector<tessera::InputFile>& files) {
  namespace fs = std::filesystem;
  const std::string first = tessera::shard_file_name(out, 0);
  const std::string first_name = fs::path(first).filename().string();
  const std::string stem = first_name.substr(0, first_name.size() - 9);  // less "-00000.h5"
  for (const tessera::InputFile& f : files) {
    const std::string name = fs::path(f.path).filename().string();
    std::string rest =
        name.substr(0, stem.size() + 1) == stem + "-" ? name.substr(stem.size() + 1) : "";
    if (rest.size() > 4 && rest.compare(rest.size() - 4, 4, ".tmp") == 0)
      rest.resize(rest.size() - 4);
    const size_t digits = rest.find_first_not_of("0123456789");
    const bool shard_name =
        digits >= 5 && digits != std::string::npos && rest.substr(digits) == ".h5";
    std::error_code ec;
    const bool same_dir =
        fs::equivalent(fs::absolute(f.path).parent_path(), fs::absolute(first).parent_path(), ec);
    TESSERA_REQUIRE(!(shard_name && same_dir), "--out '", out,
                    "' with --shard-tokens writes its shards as '", first, "', '",
                    tessera::shard_file_name(out, 1), "', ..., and the input '", f.path,
                    "' is one of those names; writing would destroy it; choose another output "
                    "name");
  }
}

// On several ranks each rank but the first writes a part file beside the output
// (io/prep_parts.hpp), which must not be an input.
void require_part_apart(const std::string& part, const std::vector<tessera::InputFile>& files) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const tessera::InputFile& f : files)
    TESSERA_REQUIRE(!fs::equivalent(f.path, part, ec), "the input '", f.path,
                    "' is the name of a part file tessera-prep writes on several ranks ('", part,
                    "'); writing would destroy it; choose another output name");
}

// The checked options and inputs of one preparation.
struct Plan {
  std::string out;
  std::vector<tessera::InputFile> files;
  bool split_lines, loss_mask;
  tessera::RecordFields fields;
  int threads;
  int64_t shard_tokens;  // 0: one file
  std::vector<std::unique_ptr<tessera::Tokenizer>> tokenizers;  // one per thread
};

Plan plan_of(const Args& args, int ranks) {
  const auto get = [&](const char* name) {
    const auto it = args.options.find(name);
    return it == args.options.end() ? std::string() : it->second;
  };
  TESSERA_REQUIRE(args.options.count("--tokenizer"),
                  "no tokenizer given; pass --tokenizer byte or --tokenizer gpt2");
  TESSERA_REQUIRE(args.options.count("--out"), "no output given; pass --out OUT.h5");
  const std::string out = get("--out");
  TESSERA_REQUIRE(!args.inputs.empty(),
                  "no inputs given; pass text files, .jsonl files or directories");
  const bool split_lines = args.options.count("--split-lines") > 0;
  // Prompt/response records with a loss mask (doc/data.md, "Loss masks").
  const bool loss_mask = args.options.count("--loss-mask") > 0;
  tessera::RecordFields fields;
  for (const char* o : {"--prompt-field", "--response-field"})
    TESSERA_REQUIRE(loss_mask || !args.options.count(o), o,
                    " names a member of prompt/response records; it needs --loss-mask");
  if (args.options.count("--prompt-field")) fields.prompt = get("--prompt-field");
  if (args.options.count("--response-field")) fields.response = get("--response-field");
  TESSERA_REQUIRE(
      !fields.prompt.empty() && !fields.response.empty() && fields.prompt != fields.response,
      "--prompt-field '", fields.prompt, "' and --response-field '", fields.response,
      "' must be two different, non-empty member names");
  TESSERA_REQUIRE(!(loss_mask && split_lines),
                  "--split-lines is for text files; --loss-mask reads .jsonl records");
  const std::vector<tessera::InputFile> files = tessera::expand_inputs(args.inputs);
  for (const tessera::InputFile& f : files)  // before anything is written
    TESSERA_REQUIRE(!loss_mask || f.jsonl, "input '", f.path,
                    "' is not a .jsonl file; --loss-mask reads prompt/response records from "
                    ".jsonl files only");
  tessera::require_output_apart(out, files);  // before anything is written
  for (int r = 1; r < ranks; ++r) require_part_apart(tessera::part_path(out, r), files);
  // The byte tokenizer is a copy, which threads only slow down (doc/data.md, measured): one
  // thread unless --threads says otherwise; GPT-2's BPE takes every core.
  int threads = get("--tokenizer") == "byte" ? 1 : omp_get_max_threads();
  if (args.options.count("--threads")) {
    const std::string t = get("--threads");
    char* end = nullptr;
    const long n = std::strtol(t.c_str(), &end, 10);
    TESSERA_REQUIRE(!t.empty() && *end == '\0' && n >= 1 && n <= 1024, "--threads '", t,
                    "' is not a number of threads from 1 to 1024");
    threads = int(n);
  }
  int64_t shard_tokens = 0;  // 0: one file
  if (args.options.count("--shard-tokens")) {
    const std::string t = get("--shard-tokens");
    char* end = nullptr;
    const long long n = std::strtoll(t.c_str(), &end, 10);
    TESSERA_REQUIRE(!t.empty() && *end == '\0' && n >= 1 && n <= (1LL << 50), "--shard-tokens '", t,
                    "' is not a number of tokens from 1 to 2^50");
    shard_tokens = n;
    require_shards_apart(out, files);
  }
  // One tokenizer per thread: a tokenizer caches (not thread-safe), and caching changes no id.
  std::vector<std::unique_ptr<tessera::Tokenizer>> tokenizers;
  for (int t = 0; t < threads; ++t)
    tokenizers.push_back(tessera::make_tokenizer(get("--tokenizer"), get("--vocab-dir")));
  return Plan{out, files, split_lines, loss_mask, fields, threads, shard_tokens,
              std::move(tokenizers)};
}

// Tokenizes files[first, last) into sink (a dataset writer or a part file) in order:
// sink.begin_input(i) before each file's documents, sink.add_document(ids, masked) for each.
// Documents are read in order into a batch, tokenized in parallel, and added in order, so what
// the sink receives does not depend on the thread count. With --loss-mask a record's prompt
// and response are tokenized apart (prompts[i] and batch[i]) and its first tokens, the
// prompt's, are masked.
template <class Sink>
void tokenize(Plan& plan, size_t first, size_t last, Sink& sink,
              const std::function<void(uint64_t)>& progressed) {
  constexpr size_t kBatchBytes = size_t(8) << 20;
  std::vector<std::string> batch, prompts;
  size_t batch_bytes = 0;
  auto flush = [&] {
    std::vector<std::vector<uint32_t>> ids(batch.size());
    std::vector<int64_t> masked(batch.size(), 0);
    std::exception_ptr failed;
#pragma omp parallel for schedule(static) num_threads(plan.threads)
    for (size_t i = 0; i < batch.size(); ++i) {
      try {
        tessera::Tokenizer& tok = *plan.tokenizers[size_t(omp_get_thread_num())];
        if (plan.loss_mask) {
          ids[i] = tok.encode(prompts[i]);
          masked[i] = int64_t(ids[i].size());
          const std::vector<uint32_t> response = tok.encode(batch[i]);
          ids[i].insert(ids[i].end(), response.begin(), response.end());
        } else {
          ids[i] = tok.encode(batch[i]);
        }
      } catch (...) {
#pragma omp critical
        if (!failed) failed = std::current_exception();
      }
    }
    if (failed) std::rethrow_exception(failed);
    for (size_t i = 0; i < ids.size(); ++i) sink.add_document(ids[i], masked[i]);
    batch.clear(), prompts.clear(), batch_bytes = 0;
  };
  uint64_t before = 0;
  for (size_t i = first; i < last; ++i) {
    const tessera::InputFile& f = plan.files[i];
    sink.begin_input(i);
    const auto progress = [&](uint64_t done) { progressed(before + done); };
    if (plan.loss_mask)
      tessera::for_each_record(
          f, plan.fields,
          [&](std::string_view prompt, std::string_view response) {
            prompts.emplace_back(prompt), batch.emplace_back(response);
            batch_bytes += prompt.size() + response.size();
            if (batch_bytes >= kBatchBytes) flush();
          },
          progress);
    else
      tessera::for_each_document(
          f, plan.split_lines,
          [&](std::string_view text) {
            batch.emplace_back(text), batch_bytes += text.size();
            if (batch_bytes >= kBatchBytes) flush();
          },
          progress);
    flush();  // a document counts toward its own input in the manifest
    before += f.bytes;
  }
}

// What rank 0 feeds the dataset writer through: input indices become the manifest's paths, and
// the targets of the loss are counted.
template <class Writer>
struct Feed {
  Writer& writer;
  const std::vector<tessera::InputFile>& files;
  int64_t targets = 0;  // tokens with mask 1
  void begin_input(size_t i) { writer.begin_input(files[i].path, files[i].bytes); }
  void add_document(std::span<const uint32_t> ids, int64_t masked) {
    writer.add_document(ids, masked);
    targets += int64_t(ids.size()) - masked + 1;
  }
};

// Every rank tokenizes its run of the files (tessera-prep on several ranks: io/prep_parts.hpp);
// rank 0 writes the dataset, appending the other ranks' parts in rank order. A failure on any
// rank is one error from rank 0 on every rank, and no dataset and no part is left.
template <class Writer>
void write(Plan& plan, tessera::Communicator& world,
           const std::function<void(std::optional<Writer>&)>& open) {
  const int rank = world.rank(), ranks = world.size();
  const std::vector<size_t> first = tessera::split_inputs(plan.files, ranks);
  uint64_t total = 0;
  for (const tessera::InputFile& f : plan.files) total += f.bytes;
  std::optional<Writer> writer;  // rank 0
  std::optional<Feed<Writer>> feed;
  std::optional<tessera::PartWriter> part;  // the other ranks; removed when this returns
  std::optional<tessera::PrepProgress> progress;
  tessera::collectively(world, [&] {
    if (rank == 0) {
      open(writer);
      feed.emplace(Feed<Writer>{*writer, plan.files});
      progress.emplace(total);
      tokenize(plan, first[0], first[1], *feed, [&](uint64_t done) { progress->update(done); });
    } else {
      part.emplace(tessera::part_path(plan.out, rank));
      tokenize(plan, first[size_t(rank)], first[size_t(rank) + 1], *part, [](uint64_t) {});
      part->finish();
    }
  });
  tessera::collectively(world, [&] {
    if (rank != 0) return;
    uint64_t before = 0;
    for (size_t i = first[0]; i < first[1]; ++i) before += plan.files[i].bytes;
    for (int r = 1; r < ranks; ++r)
      tessera::read_part(
          tessera::part_path(plan.out, r), plan.files.size(),
          [&](size_t i) {
            feed->begin_input(i);
            progress->update(before);
            before += plan.files[i].bytes;
          },
          [&](std::span<const uint32_t> ids, int64_t masked) { feed->add_document(ids, masked); });
    progress->finish();
    // Nothing to train on: the writer's destructor removes its temporary file.
    TESSERA_REQUIRE(writer->documents() > 0, "the inputs hold no documents (", plan.files.size(),
                    " file", plan.files.size() == 1 ? "" : "s", ", ", total,
                    " bytes, all empty or blank); nothing was written to '", plan.out, "'");
    writer->finish();
    const double secs = progress->seconds(), mb = 1e-6 * double(total);
    const tessera::Tokenizer& tokenizer = *plan.tokenizers.front();
    std::printf(
        "tessera-prep: wrote %s: %lld documents, %lld tokens (%s, %s) from %zu file%s, %.2f MB "
        "in %.2f s (%.1f MB/s), %d tokenizer thread%s",
        plan.out.c_str(), (long long)writer->documents(), (long long)writer->tokens(),
        tokenizer.kind().c_str(), tokenizer.vocab_size() > 65536 ? "uint32" : "uint16",
        plan.files.size(), plan.files.size() == 1 ? "" : "s", mb, secs,
        mb / std::max(secs, 1e-9), plan.threads, plan.threads == 1 ? "" : "s");
    if (ranks > 1) std::printf(" on each of %d ranks", ranks);
    std::printf("\n");
    if (plan.loss_mask)
      std::printf(
          "tessera-prep: loss mask: %lld of the %lld tokens are targets (responses and EOS), "
          "%.1f%%; prompts from \"%s\", responses from \"%s\"\n",
          (long long)feed->targets, (long long)writer->tokens(),
          100.0 * double(feed->targets) / double(writer->tokens()), plan.fields.prompt.c_str(),
          plan.fields.response.c_str());
    if constexpr (std::is_same_v<Writer, tessera::ShardedDatasetWriter>)
      std::printf(
          "tessera-prep: %s is the index of %lld shard%s of %lld tokens or a little more, "
          "%s to %s\n",
          plan.out.c_str(), (long long)writer->shards(), writer->shards() == 1 ? "" : "s",
          (long long)plan.shard_tokens, tessera::shard_file_name(plan.out, 0).c_str(),
          tessera::shard_file_name(plan.out, writer->shards() - 1).c_str());
  });
}

void prep(const Args& args, tessera::Communicator& world) {
  std::optional<Plan> plan;
  // Every rank checks the same arguments and inputs: an error is one line from rank 0.
  tessera::collectively(world, [&] { plan.emplace(plan_of(args, world.size())); });
  const tessera::Tokenizer& tokenizer = *plan->tokenizers.front();
  if (plan->shard_tokens > 0)
    write<tessera::ShardedDatasetWriter>(*plan, world, [&](auto& w) {
      w.emplace(plan->out, tokenizer, plan->split_lines, plan->shard_tokens, plan->loss_mask);
    });
  else
    write<tessera::DatasetWriter>(*plan, world, [&](auto& w) {
      w.emplace(plan->out, tokenizer, plan->split_lines, tessera::DatasetWriter::kChunkTokens,
                plan->loss_mask);
    });
}

}  // namespace

int main(int argc, char** argv) {
  tessera::mpi::init(&argc, &argv);
  const int rank = tessera::mpi::world_rank();
  const std::vector<std::string> argv_strings(argv, argv + argc);
  for (const std::string& a : argv_strings) {
    if (a == "--help" || a == "-h") {
      if (rank == 0) std::fputs(help_text().c_str(), stdout);
      tessera::mpi::finalize();
      return 0;
    }
  }
  return tessera::run_reporting_errors("tessera-prep", [&] {
    tessera::Communicator world(MPI_COMM_WORLD, "world");
    std::optional<Args> args;
    tessera::collectively(world, [&] { args.emplace(parse(argv_strings)); });
    prep(*args, world);
  });
}
