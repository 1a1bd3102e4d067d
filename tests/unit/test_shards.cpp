// Sharded datasets (io/shard_index.hpp, io/shard_set.hpp, doc/data.md "Sharded datasets"):
// the index's layout, the global token offsets across shards, the bound on open files, and
// that a sharded dataset reads sample for sample as the one file holding the same documents.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/dataset_writer.hpp"
#include "io/shard_index.hpp"
#include "io/shard_writer.hpp"
#include "io/token_dataset.hpp"
#include "io/tokenizer.hpp"
#include "mpi_environment.hpp"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// Documents of 1 to 12 byte tokens, the same every run.
std::vector<std::vector<uint32_t>> documents(int n) {
  std::vector<std::vector<uint32_t>> docs;
  uint64_t x = 12345;
  for (int d = 0; d < n; ++d) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    std::vector<uint32_t> doc(1 + (x >> 33) % 12);
    for (size_t t = 0; t < doc.size(); ++t) doc[t] = uint32_t((x >> (t + 7)) % 256);
    docs.push_back(doc);
  }
  return docs;
}

// A fresh directory holding one.h5 (every document in one file) and shards/data.h5 with its
// shards of shard_tokens tokens or a little more.
struct Prepared {
  fs::path dir;
  std::string one, index;
  int64_t shards = 0;
  Prepared(const std::string& name, int n_docs, int64_t shard_tokens) {
    dir = fs::temp_directory_path() / ("tessera-shards-" + name + "-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir / "shards");
    one = (dir / "one.h5").string(), index = (dir / "shards" / "data.h5").string();
    const auto tok = make_tokenizer("byte", "");
    DatasetWriter single(one, *tok, false);
    ShardedDatasetWriter sharded(index, *tok, false, shard_tokens);
    for (const auto& d : documents(n_docs)) single.add_document(d), sharded.add_document(d);
    single.finish();
    sharded.finish();
    shards = sharded.shards();
  }
  ~Prepared() { fs::remove_all(dir); }
};

DatasetExpectation expect(int64_t seq_len) {
  return {"byte", 257, seq_len, 1};
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Shards, IndexLaysOutWholeDocumentsAndNamesShards) {
  test::require_mpi();
  EXPECT_EQ(shard_file_name("data/kjv.h5", 12), "data/kjv-00012.h5");
  EXPECT_EQ(shard_file_name("kjv", 0), "kjv-00000.h5");
  const Prepared p("index", 200, 50);
  const ShardLayout L = read_shard_index(p.index, expect(8));
  ASSERT_EQ(int64_t(L.files.size()), p.shards);
  EXPECT_GT(p.shards, 10);
  int64_t tokens = 0, docs = 0;
  for (size_t i = 0; i < L.files.size(); ++i) {
    EXPECT_EQ(L.files[i], shard_file_name(p.index, int64_t(i)));
    // A shard closes after the document that brings it to 50 tokens: at most 50 + 12.
    if (i + 1 < L.files.size()) EXPECT_GE(L.tokens[i], 50);
    EXPECT_LE(L.tokens[i], 50 + 12);
    tokens += L.tokens[i], docs += L.docs[i];
    EXPECT_EQ(L.doc_offsets[size_t(docs)], uint64_t(tokens)) << "shard " << i;
    EXPECT_EQ(L.bytes[i], int64_t(fs::file_size(L.files[i])));
  }
  EXPECT_EQ(docs, 200);
  EXPECT_EQ(uint64_t(tokens), L.doc_offsets.back());
}

// 2000 shards of one document each (2 to 13 tokens), at most 16 open: every window (17
// tokens, so each crosses two or more shards) of both splits reads as from the one file, and so
// does the stream read directly in pieces of 37 tokens; the same through a pattern naming the
// shards.
TEST(Shards, ThousandsOfShardsReadAsOneFileWithinTheOpenBound) {
  test::require_mpi();
  const Prepared p("many", 2000, 1);
  ASSERT_EQ(p.shards, 2000);
  const DatasetExpectation e = expect(16);
  const auto fds = [] {  // file descriptors of this process
    return std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator{});
  };
  const auto fds_before = fds();
  const TokenDataset one(p.one, MPI_COMM_SELF, e, 0.1);
  const TokenDataset index(p.index, MPI_COMM_SELF, e, 0.1, 16);
  const TokenDataset pattern((p.dir / "shards" / "data-*.h5").string(), MPI_COMM_SELF, e, 0.1, 16);
  for (const TokenDataset* d : {&index, &pattern}) {
    ASSERT_EQ(int64_t(d->files().shards()), p.shards);
    for (auto s : {TokenDataset::train, TokenDataset::validation}) {
      EXPECT_EQ(d->samples(s), one.samples(s));
      EXPECT_EQ(d->tokens(s), one.tokens(s));
      EXPECT_EQ(d->documents(s), one.documents(s));
    }
  }
  ASSERT_GT(one.samples(TokenDataset::validation), 10);
  std::vector<int32_t> a(17), b(17), c(17);
  const int64_t n = one.samples(TokenDataset::train);
  for (int64_t g = 0; g < n + 5; ++g) {  // an epoch and the start of the next
    one.train_sample(7, g, a.data());
    index.train_sample(7, g, b.data());
    pattern.train_sample(7, g, c.data());
    ASSERT_EQ(a, b) << "training sample " << g;
    ASSERT_EQ(a, c) << "training sample " << g;
  }
  for (int64_t k = 0; k < one.samples(TokenDataset::validation); ++k) {
    one.validation_sample(k, a.data());
    index.validation_sample(k, b.data());
    ASSERT_EQ(a, b) << "validation sample " << k;
  }
  std::string fault;
  const int64_t total = one.files().tokens();
  ASSERT_EQ(index.files().tokens(), total);
  std::vector<uint32_t> x(37), y(37);
  for (int64_t at = 0; at < total; at += 37) {
    const int64_t len = std::min<int64_t>(37, total - at);
    one.files().read(at, len, x.data(), fault);
    index.files().read(at, len, y.data(), fault);
    ASSERT_EQ(x, y) << "tokens from " << at;
  }
  EXPECT_EQ(fault, "");
  // The files open now: the one file and at most 16 shards of each sharded dataset.
  EXPECT_LE(fds() - fds_before, 1 + 2 * 16);
  for (const TokenDataset* d : {&index, &pattern}) {
    EXPECT_EQ(d->fault(), "");
    EXPECT_LE(d->files().most_open(), 16);
    EXPECT_EQ(d->files().most_open(), 16);  // the bound was reached, and held
    EXPECT_LE(d->files().open_files(), 16);
    EXPECT_GT(d->files().opens(), p.shards);  // files were closed and opened again
  }
}

// A shard missing, or of another size than its index recorded: refused at start, naming it.
TEST(Shards, MissingOrResizedShardIsRefusedAtStart) {
  test::require_mpi();
  const Prepared p("missing", 300, 100);
  const std::string third = shard_file_name(p.index, 2);
  fs::rename(third, third + ".away");
  EXPECT_NE(error_of([&] { TokenDataset(p.index, MPI_COMM_SELF, expect(8), 0); })
                .find("data shard '" + third + "' (shard 3 of " + std::to_string(p.shards) +
                      " of '" + p.index + "') is missing"),
            std::string::npos);
  fs::rename(third + ".away", third);
  fs::resize_file(third, fs::file_size(third) + 100);
  EXPECT_NE(error_of([&] {
              TokenDataset(p.index, MPI_COMM_SELF, expect(8), 0);
            }).find("but its index recorded"),
            std::string::npos);
}

// A shard damaged in place (its vocabulary attribute, the same size): the first read of it
// records one fault naming it, its tokens read as 0, and the other shards read on.
TEST(Shards, DamagedShardIsAFaultNamingItAtFirstRead) {
  test::require_mpi();
  const Prepared p("damaged", 300, 100);
  const std::string second = shard_file_name(p.index, 1);
  {
    const hid_t f = H5Fopen(second.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t a = H5Aopen(f, "vocab_size", H5P_DEFAULT);
    const int64_t v = 300;
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Fclose(f);
  }
  const TokenDataset d(p.index, MPI_COMM_SELF, expect(8), 0);
  std::string fault;
  std::vector<uint32_t> x(10);
  d.files().read(0, 10, x.data(), fault);
  EXPECT_EQ(fault, "");
  const int64_t second_begin = read_shard_index(p.index, expect(8)).tokens[0];
  d.files().read(second_begin, 10, x.data(), fault);
  EXPECT_NE(fault.find("data file '" + second + "' (shard 2 of"), std::string::npos) << fault;
  EXPECT_NE(fault.find("a vocabulary of 300"), std::string::npos) << fault;
  EXPECT_EQ(x, std::vector<uint32_t>(10, 0));
}

// The files of a list must share a tokenizer and vocabulary: one error naming the file.
TEST(Shards, ListOfFilesWithAnotherVocabularyIsRefused) {
  test::require_mpi();
  const Prepared p("vocab", 100, 100);
  const std::string other = (p.dir / "other.h5").string();
  fs::copy_file(p.one, other);
  {
    const hid_t f = H5Fopen(other.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t a = H5Aopen(f, "vocab_size", H5P_DEFAULT);
    const int64_t v = 300;
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Fclose(f);
  }
  const std::string list = p.one + ", " + other;
  const std::string e = error_of([&] { TokenDataset(list, MPI_COMM_SELF, expect(8), 0); });
  EXPECT_NE(e.find("data file '" + other + "' (file 2 of 2 of data.path"), std::string::npos) << e;
  EXPECT_NE(e.find("must share one tokenizer and vocabulary"), std::string::npos) << e;
  EXPECT_NE(error_of([&] {
              TokenDataset(p.one + "," + p.one, MPI_COMM_SELF, expect(8), 0);
            }).find("twice"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              TokenDataset((p.dir / "nothing-*.h5").string(), MPI_COMM_SELF, expect(8), 0);
            }).find("matches no file"),
            std::string::npos);
}

// A dataset with a loss mask is scanned at start: the first training sample whose targets are
// all masked is one error, found exactly (a prompt as long as a sample is refused only when it
// covers a sample's targets), for one file and for shards alike.
TEST(Shards, SampleWithoutTargetIsRefusedAtStartExactly) {
  test::require_mpi();
  constexpr int64_t S = 8;  // model.seq_len
  const fs::path dir =
      fs::temp_directory_path() / ("tessera-shards-targets-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto tok = make_tokenizer("byte", "");
  // Documents of (masked prompt, response) lengths; the stream is their tokens and EOS each.
  // Returns the error of opening it as one file and as shards ("" when accepted), after
  // checking that both say the same, and the first sample without a target by brute force.
  const auto open = [&](const std::vector<std::pair<int64_t, int64_t>>& docs, int64_t* want) {
    const std::string one = (dir / "one.h5").string(), index = (dir / "index.h5").string();
    {
      DatasetWriter single(one, *tok, false, DatasetWriter::kChunkTokens, true);
      ShardedDatasetWriter sharded(index, *tok, false, 20, true);
      std::vector<uint8_t> mask;
      for (const auto& [prompt, response] : docs) {
        const std::vector<uint32_t> ids(size_t(prompt + response), 65);
        single.add_document(ids, prompt), sharded.add_document(ids, prompt);
        mask.insert(mask.end(), size_t(prompt), 0);
        mask.insert(mask.end(), size_t(response) + 1, 1);
      }
      single.finish(), sharded.finish();
      *want = -1;
      for (int64_t k = 0; *want < 0 && (k + 1) * S < int64_t(mask.size()); ++k)
        if (std::none_of(mask.begin() + k * S + 1, mask.begin() + k * S + S + 1,
                         [](uint8_t m) { return m != 0; }))
          *want = k;
    }
    const std::string e1 = error_of([&] { TokenDataset(one, MPI_COMM_SELF, expect(S), 0); });
    const std::string e2 = error_of([&] { TokenDataset(index, MPI_COMM_SELF, expect(S), 0); });
    EXPECT_EQ(e1.substr(e1.find(':') + 1), e2.substr(e2.find(':') + 1));
    fs::remove_all(dir), fs::create_directories(dir);
    return e1;
  };
  int64_t want = 0;
  // Short prompts: accepted.
  EXPECT_EQ(open({{2, 3}, {7, 1}, {0, 4}, {5, 9}, {3, 3}, {6, 6}}, &want), "");
  EXPECT_EQ(want, -1);
  // A prompt of 9 >= S tokens at stream tokens 3 .. 11: sample 1's targets (9 .. 16) include
  // unmasked tokens 12 .., sample 0's (1 .. 8) the first document's: accepted.
  EXPECT_EQ(open({{0, 2}, {9, 20}, {1, 30}}, &want), "");
  EXPECT_EQ(want, -1);
  // Sample k's targets are stream tokens k S + 1 .. k S + S, not k S .. k S + S - 1: a prompt
  // at 16 .. 23 leaves sample 2 its target 24; one at 17 .. 24 leaves it none.
  EXPECT_EQ(open({{0, 15}, {8, 5}}, &want), "");
  EXPECT_EQ(want, -1);
  EXPECT_NE(open({{0, 16}, {8, 5}}, &want).find("training sample 2 "), std::string::npos);
  EXPECT_EQ(want, 2);
  // A prompt of 20 at stream tokens 30 .. 49 covers sample 4's targets (33 .. 40).
  std::string e = open({{0, 29}, {20, 30}, {1, 30}}, &want);
  EXPECT_EQ(want, 4);
  EXPECT_NE(e.find("training sample 4 (tokens 32 to 40 of the training split) has no unmasked "
                   "target"),
            std::string::npos)
      << e;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
