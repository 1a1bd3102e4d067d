// One error API for tessera. Input and environment faults are reported with
// TESSERA_REQUIRE(cond, parts...), which is always checked (never compiled out) and throws
// tessera::Error carrying file:line. main() decides how the error reaches the user: once,
// from rank 0, when every rank saw it (a collective error), or via MPI_Abort when only one
// rank did (a local error).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tessera {

class Error : public std::runtime_error {
 public:
  // collective: every rank detects this fault identically (deck, shapes), so rank 0 alone
  // reports it and all ranks exit cleanly. Otherwise the raising rank aborts the job.
  Error(const std::string& what, const char* file, int line, bool collective)
      : std::runtime_error(what), file_(file), line_(line), collective_(collective) {}
  const char* file() const { return file_; }
  int line() const { return line_; }
  bool collective() const { return collective_; }

 private:
  const char* file_;
  int line_;
  bool collective_;
};

template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

}  // namespace tessera

// Raised identically on every rank (input deck, model shapes, files every rank reads).
#define TESSERA_REQUIRE(cond, ...)                                                      \
  do {                                                                                 \
    if (!(cond)) throw ::tessera::Error(::tessera::cat(__VA_ARGS__), __FILE__, __LINE__, true); \
  } while (0)

// Raised on one rank only (a file that rank reads, a local allocation); aborts the job.
#define TESSERA_REQUIRE_LOCAL(cond, ...)                                                \
  do {                                                                                 \
    if (!(cond)) throw ::tessera::Error(::tessera::cat(__VA_ARGS__), __FILE__, __LINE__, false); \
  } while (0)
