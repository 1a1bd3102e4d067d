// The resolved input deck: every schema key with its value (from the deck file, the command
// line, or the default), validated against the schema. Parsing errors are collective
// tessera::Errors: every rank parses the same deck and raises the same error.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessera {

class Deck {
 public:
  // argv: [prog] [DECK] [--section.key=value ...]. Throws Error on any fault.
  static Deck from_args(const std::vector<std::string>& args);
  // Deck text plus overrides, for tests.
  static Deck from_text(const std::string& ini_text, const std::vector<std::string>& overrides,
                        const std::string& origin = "<text>");

  int64_t integer(const std::string& name) const;
  double real(const std::string& name) const;
  bool boolean(const std::string& name) const;
  const std::string& str(const std::string& name) const;

  const std::string& origin() const { return origin_; }
  std::string to_ini() const;   // the resolved deck, defaults included
  std::string to_json() const;  // {"section": {"key": value}}

 private:
  std::string origin_;
  std::map<std::string, std::string> values_;  // full name -> validated value text
};

// Levenshtein distance, for "did you mean" suggestions.
size_t edit_distance(const std::string& a, const std::string& b);
std::string closest_key(const std::string& unknown);

}  // namespace tessera
