#include "core/fault_inject.hpp"

#include <cstdlib>
#include <string>

namespace tessera {
namespace {

std::string_view hook() {
  const char* h = std::getenv("TESSERA_FAULT_INJECT");
  return h ? std::string_view(h) : std::string_view();
}

// The number after `prefix` + `kind` ("-at-step-"), or -1.
long long step_of(std::string_view h, std::string_view prefix, std::string_view kind) {
  if (h.substr(0, prefix.size()) != prefix) return -1;
  h.remove_prefix(prefix.size());
  if (h.substr(0, kind.size()) != kind) return -1;
  h.remove_prefix(kind.size());
  if (h.empty() || h.find_first_not_of("0123456789") != std::string_view::npos) return -1;
  return std::stoll(std::string(h));
}

}  // namespace

bool fault_injected(std::string_view name) {
  return !name.empty() && hook() == name;
}

bool fault_injected_at_step(std::string_view prefix, int64_t step) {
  const std::string_view h = hook();
  if (const long long n = step_of(h, prefix, "-at-step-"); n >= 0) return step == n;
  if (const long long n = step_of(h, prefix, "-from-step-"); n >= 0) return step >= n;
  return false;
}

}  // namespace tessera
