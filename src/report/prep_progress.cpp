#include "report/prep_progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

namespace tessera {

PrepProgress::PrepProgress(uint64_t total_bytes)
    : total_(total_bytes), tty_(isatty(STDERR_FILENO) == 1), start_(Clock::now()), last_(start_) {}

double PrepProgress::seconds() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

void PrepProgress::update(uint64_t done) {
  if (!tty_) return;
  const Clock::time_point now = Clock::now();
  if (now - last_ < std::chrono::milliseconds(250)) return;
  last_ = now;
  draw(done);
}

void PrepProgress::draw(uint64_t done) {
  constexpr int kWidth = 30;
  const double frac = total_ ? std::min(1.0, double(done) / double(total_)) : 1.0;
  const int filled = int(frac * kWidth);
  const double mb = 1e-6 * double(done), secs = std::max(seconds(), 1e-9);
  std::fprintf(stderr, "\r[%s%s] %3.0f%%  %.1f / %.1f MB  %.1f MB/s ",
               std::string(size_t(filled), '#').c_str(),
               std::string(size_t(kWidth - filled), '.').c_str(), 100 * frac, mb,
               1e-6 * double(total_), mb / secs);
  std::fflush(stderr);
  drawn_ = true;
}

void PrepProgress::finish() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r%*s\r", 80, "");
  std::fflush(stderr);
}

}  // namespace tessera
