#include "io/prep_parts.hpp"

#include <cerrno>
#include <cstring>
#include <memory>

#include "core/error.hpp"

namespace tessera {

std::vector<size_t> split_inputs(const std::vector<InputFile>& files, int ranks) {
  uint64_t total = 0;
  for (const InputFile& f : files) total += f.bytes;
  // File i goes to the share holding its middle byte, counted in half bytes so that a file
  // of one byte has a middle too: rank r holds half-bytes [r 2T / R, (r + 1) 2T / R).
  std::vector<size_t> first(size_t(ranks) + 1, files.size());
  first[0] = 0;
  uint64_t before = 0;
  size_t i = 0;
  for (int r = 1; r <= ranks; ++r) {
    const unsigned __int128 end = (unsigned __int128)(2 * total) * unsigned(r) / unsigned(ranks);
    while (i < files.size() && (unsigned __int128)(2 * before + files[i].bytes) < end)
      before += files[i++].bytes;
    if (r < ranks) first[size_t(r)] = i;
  }
  return first;
}

std::string part_path(const std::string& out, int rank) {
  return out + ".part-" + std::to_string(rank) + ".tmp";
}

PartWriter::PartWriter(std::string path) : path_(std::move(path)), buffer_(size_t(4) << 20) {
  file_ = std::fopen(path_.c_str(), "wb");
  TESSERA_REQUIRE(file_, "cannot create the part file '", path_, "': ", std::strerror(errno),
                  "; tessera-prep on several ranks writes each rank's documents beside --out");
  std::setvbuf(file_, buffer_.data(), _IOFBF, buffer_.size());
}

PartWriter::~PartWriter() {
  if (file_) std::fclose(file_);
  std::remove(path_.c_str());
}

void PartWriter::put(const void* data, size_t bytes) {
  if (bytes > 0 && std::fwrite(data, 1, bytes, file_) != bytes) failed_ = true;
}

void PartWriter::begin_input(size_t input) {
  const uint64_t index = input;
  put("I", 1), put(&index, sizeof index);
}

void PartWriter::add_document(std::span<const uint32_t> ids, int64_t masked) {
  const uint64_t n = ids.size();
  put("D", 1), put(&n, sizeof n), put(&masked, sizeof masked);
  put(ids.data(), ids.size_bytes());
}

void PartWriter::finish() {
  put("E", 1);
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  TESSERA_REQUIRE(closed && !failed_, "writing the part file '", path_,
                  "' failed (is the disk full?); nothing was written to the dataset");
}

void read_part(const std::string& path, size_t inputs, const std::function<void(size_t)>& begin,
               const std::function<void(std::span<const uint32_t>, int64_t)>& document) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"),
                                                        &std::fclose);
  TESSERA_REQUIRE(file, "cannot open the part file '", path, "' that another rank wrote: ",
                  std::strerror(errno),
                  "; the ranks of tessera-prep must share the directory of --out");
  std::vector<char> buffer(size_t(4) << 20);
  std::setvbuf(file.get(), buffer.data(), _IOFBF, buffer.size());
  const auto get = [&](void* data, size_t bytes) {
    TESSERA_REQUIRE(std::fread(data, 1, bytes, file.get()) == bytes, "the part file '", path,
                    "' ends early; it was not written completely");
  };
  std::vector<uint32_t> ids;
  bool began = false;
  for (;;) {
    char kind = 0;
    get(&kind, 1);
    if (kind == 'E') break;
    if (kind == 'I') {
      uint64_t index = 0;
      get(&index, sizeof index);
      TESSERA_REQUIRE(index < inputs, "the part file '", path, "' names input ", index, " of ",
                      inputs);
      begin(size_t(index)), began = true;
    } else {
      TESSERA_REQUIRE(kind == 'D' && began, "the part file '", path, "' is malformed");
      uint64_t n = 0;
      int64_t masked = 0;
      get(&n, sizeof n), get(&masked, sizeof masked);
      TESSERA_REQUIRE(n < (uint64_t(1) << 40) && masked >= 0 && uint64_t(masked) <= n,
                      "the part file '", path, "' is malformed");
      ids.resize(n);
      get(ids.data(), n * sizeof(uint32_t));
      document(ids, masked);
    }
  }
}

}  // namespace tessera
