// The input-deck schema: one table of every key tessera reads. It drives parsing, defaults,
// range checks, `tessera --help` and the generated doc/input-deck.md; nothing else lists keys.
#pragma once

#include <string>
#include <vector>

namespace tessera {

// The range of real keys held as 32-bit floats, in round numbers inside FLT_MIN..FLT_MAX.
constexpr double kFloatTiny = 1.2e-38, kFloatHuge = 3.4e38;

enum class KeyType { integer, real, boolean, string, choice, path };

struct KeySpec {
  std::string section;
  std::string key;
  KeyType type;
  std::string default_value;  // empty with required == true: the user must give it
  bool required;
  double min, max;                   // integer and real keys
  std::vector<std::string> choices;  // choice keys
  std::string help;
  // A real key held as a 32-bit float whose 0 turns a feature off: any other value must stay
  // nonzero as a float (at least kFloatTiny), so that a tiny request is not silently "off".
  bool zero_is_off = false;

  std::string name() const { return section + "." + key; }
  std::string allowed() const;  // human-readable domain, e.g. "integer in [1, 65536]"
};

const std::vector<KeySpec>& deck_schema();
const KeySpec* find_key(const std::string& full_name);

// The markdown reference of every key (doc/input-deck.md) and the --help text.
std::string deck_reference_markdown();
std::string deck_help_text();

}  // namespace tessera
