#include "core/deck.hpp"

#include <boost/program_options.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "core/schema.hpp"

namespace po = boost::program_options;

namespace tessera {
namespace {

po::options_description schema_options() {
  po::options_description desc;
  for (const KeySpec& k : deck_schema())
    desc.add_options()(k.name().c_str(), po::value<std::vector<std::string>>());
  return desc;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// Shortest text that reads back as the same double (also valid JSON).
std::string shortest(double x) {
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  return buf;
}

// Checks one value against its key's type and range; returns the canonical text.
std::string validate(const KeySpec& k, const std::string& raw, const std::string& where) {
  const std::string v = trim(raw);
  const std::string seen = k.name() + " = '" + v + "' (" + where + ")";
  switch (k.type) {
    case KeyType::integer: {
      char* end = nullptr;
      errno = 0;
      const long long x = std::strtoll(v.c_str(), &end, 10);
      TESSERA_REQUIRE(!v.empty() && *end == '\0' && errno == 0, seen,
                      " is not an integer; allowed: ", k.allowed());
      TESSERA_REQUIRE(double(x) >= k.min && double(x) <= k.max, seen,
                      " is out of range; allowed: ", k.allowed());
      return std::to_string(x);
    }
    case KeyType::real: {
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      TESSERA_REQUIRE(!v.empty() && *end == '\0' && std::isfinite(x), seen,
                      " is not a finite number; allowed: ", k.allowed());
      const bool narrows = k.zero_is_off && x != 0 && std::fabs(x) < kFloatTiny;  // 0 as a float
      TESSERA_REQUIRE(x >= k.min && x <= k.max && !narrows, seen,
                      " is out of range; allowed: ", k.allowed());
      return shortest(x);
    }
    case KeyType::boolean:
      if (v == "true" || v == "1" || v == "yes" || v == "on") return "true";
      if (v == "false" || v == "0" || v == "no" || v == "off") return "false";
      TESSERA_REQUIRE(false, seen, " is not a boolean; allowed: ", k.allowed());
      return {};
    case KeyType::choice:
      for (const std::string& c : k.choices)
        if (c == v) return v;
      TESSERA_REQUIRE(false, seen, " is not allowed; allowed: ", k.allowed());
      return {};
    case KeyType::string:
    case KeyType::path:
      return v;
  }
  return v;
}

const KeySpec& spec(const std::string& name) {
  const KeySpec* k = find_key(name);
  if (!k) throw std::logic_error("deck key not in schema: " + name);
  return *k;
}

void report_unknown(const std::vector<po::option>& opts, const std::string& where) {
  for (const po::option& o : opts) {
    if (!o.unregistered) continue;
    std::string key = o.string_key;
    if (key.empty() && !o.original_tokens.empty()) key = o.original_tokens.front();
    TESSERA_REQUIRE(false, "unknown deck key '", key, "' (", where, "); did you mean '",
                    closest_key(key), "'? `tessera --help` lists every key");
  }
}

void collect(const po::parsed_options& parsed, const std::string& where,
             std::map<std::string, std::pair<std::string, std::string>>& out) {
  report_unknown(parsed.options, where);
  // A key twice in a deck file is an error; on the command line the last one wins (scripts
  // append overrides to overrides).
  const bool file = where != "command line";
  std::map<std::string, std::string> seen;
  for (const po::option& o : parsed.options)
    for (const std::string& v : o.value) {
      auto [it, first] = seen.emplace(o.string_key, v);
      TESSERA_REQUIRE(first || !file, "input deck '", where, "' sets ", o.string_key,
                      " twice ('", it->second, "' and '", v, "'); keep one");
      out[o.string_key] = {v, where};
    }
}

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string closest_key(const std::string& unknown) {
  // Compare with the full name, and with the bare key when no section was written.
  const bool has_section = unknown.find('.') != std::string::npos;
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const KeySpec& k : deck_schema()) {
    const size_t d = edit_distance(unknown, has_section ? k.name() : k.key);
    if (d < best_d) best_d = d, best = k.name();
  }
  return best;
}

Deck Deck::from_args(const std::vector<std::string>& args) {
  std::vector<std::string> overrides;
  std::string deck_path;
  for (size_t i = 1; i < args.size(); ++i) {
    TESSERA_REQUIRE(args[i].rfind("--", 0) == 0 || args[i].rfind("-", 0) != 0,
                    "command-line argument '", args[i],
                    "' is not understood; overrides are written --section.key=value");
    if (args[i].rfind("--", 0) == 0) {
      overrides.push_back(args[i]);
    } else {
      TESSERA_REQUIRE(deck_path.empty(), "more than one input deck given: '", deck_path,
                      "' and '", args[i], "'; overrides are written --section.key=value");
      deck_path = args[i];
    }
  }
  TESSERA_REQUIRE(!deck_path.empty(),
                  "no input deck given; usage: tessera DECK.in [--section.key=value ...] "
                  "(see `tessera --help`)");
  std::error_code ec;
  TESSERA_REQUIRE(!std::filesystem::is_directory(deck_path, ec), "input deck '", deck_path,
                  "' is a directory; name a deck file (inputs/*.in)");
  std::ifstream in(deck_path);
  TESSERA_REQUIRE(in.good(), "cannot open input deck '", deck_path,
                  "': no such file or not readable");
  std::stringstream text;
  text << in.rdbuf();
  std::string ini = text.str();
  if (ini.rfind("\xEF\xBB\xBF", 0) == 0) ini.erase(0, 3);  // a UTF-8 byte-order mark
  return from_text(ini, overrides, deck_path);
}

Deck Deck::from_text(const std::string& ini_text, const std::vector<std::string>& overrides,
                     const std::string& origin) {
  const po::options_description desc = schema_options();
  std::map<std::string, std::pair<std::string, std::string>> given;  // name -> (value, where)
  try {
    std::istringstream in(ini_text);
    collect(po::parse_config_file(in, desc, /*allow_unregistered=*/true), origin, given);
  } catch (const po::error& e) {
    TESSERA_REQUIRE(false, "cannot parse input deck '", origin, "': ", e.what());
  }
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    TESSERA_REQUIRE(eq != std::string::npos && eq > 2, "command-line override '", o,
                    "' must be written --section.key=value");
  }
  try {
    // "--key=" (an empty value, as a deck may give one) goes to Boost as "--key" "": its
    // "--key=" form is refused with a message about the equal sign.
    std::vector<std::string> args;
    for (const std::string& o : overrides) {
      if (o.back() == '=') args.push_back(o.substr(0, o.size() - 1)), args.push_back("");
      else args.push_back(o);
    }
    // No prefix guessing: --train.step must not silently mean --train.steps.
    const int style = po::command_line_style::default_style &
                      ~po::command_line_style::allow_guessing;
    collect(po::command_line_parser(args).options(desc).style(style).allow_unregistered().run(),
            "command line", given);
  } catch (const po::error& e) {
    TESSERA_REQUIRE(false, "cannot parse command line: ", e.what());
  }
  Deck d;
  d.origin_ = origin;
  for (const KeySpec& k : deck_schema()) {
    auto it = given.find(k.name());
    if (it == given.end()) {
      TESSERA_REQUIRE(!k.required, "required deck key ", k.name(), " is missing from '",
                      origin, "' (", k.help, ")");
      // Defaults go through the same canonicalisation as given values.
      d.values_[k.name()] = k.default_value.empty() ? k.default_value
                                                    : validate(k, k.default_value, "default");
    } else {
      d.values_[k.name()] = validate(k, it->second.first, it->second.second);
    }
  }
  return d;
}

int64_t Deck::integer(const std::string& name) const {
  if (spec(name).type != KeyType::integer) throw std::logic_error(name + " is not an integer");
  return std::stoll(values_.at(name));
}

double Deck::real(const std::string& name) const {
  if (spec(name).type != KeyType::real) throw std::logic_error(name + " is not a real");
  return std::stod(values_.at(name));
}

bool Deck::boolean(const std::string& name) const {
  if (spec(name).type != KeyType::boolean) throw std::logic_error(name + " is not a boolean");
  return values_.at(name) == "true";
}

const std::string& Deck::str(const std::string& name) const {
  spec(name);
  return values_.at(name);
}

std::string Deck::to_ini() const {
  std::ostringstream os;
  std::string section;
  for (const KeySpec& k : deck_schema()) {
    if (k.section != section) {
      section = k.section;
      os << (os.tellp() > 0 ? "\n" : "") << "[" << section << "]\n";
    }
    os << k.key << " = " << values_.at(k.name()) << "\n";
  }
  return os.str();
}

namespace {
std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}
}  // namespace

std::string Deck::to_json() const {
  std::ostringstream os;
  os << "{";
  std::string section;
  for (const KeySpec& k : deck_schema()) {
    if (k.section != section) {
      os << (section.empty() ? "" : "}, ") << "\"" << k.section << "\": {";
      section = k.section;
    } else {
      os << ", ";
    }
    const std::string& v = values_.at(k.name());
    const bool bare = k.type == KeyType::integer || k.type == KeyType::real ||
                      k.type == KeyType::boolean;
    os << "\"" << k.key << "\": " << (bare ? v : "\"" + json_escape(v) + "\"");
  }
  os << "}}";
  return os.str();
}

}  // namespace tessera
