#include "io/checkpoint_checks.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "config/run_config.hpp"
#include "core/error.hpp"
#include "core/sha256.hpp"
#include "io/checkpoint.hpp"
#include "io/json_reader.hpp"

namespace fs = std::filesystem;

namespace tessera {
namespace {

bool is_checkpoint_name(const std::string& n) {
  if (n.size() < 9 || n.rfind("ckpt-", 0) != 0 || n.substr(n.size() - 3) != ".h5") return false;
  const std::string digits = n.substr(5, n.size() - 8);
  return !digits.empty() &&
         std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string plural(size_t n, const char* word) {
  return cat(n, " ", word, n == 1 ? "" : "s");
}

// The model section of a checkpoint's deck JSON: integers and strings by key.
struct DeckModel {
  std::map<std::string, int64_t> ints;
  std::map<std::string, std::string> strings;
};

DeckModel parse_model(const std::string& deck_json) {
  DeckModel m;
  JsonReader r(deck_json);
  r.read_object([&](const std::string& section) {
    if (section != "model") return r.skip_value();
    r.read_object([&](const std::string& key) {
      if (key == "arch" || key == "tie_embeddings" || key == "router" || key == "moe_layers")
        m.strings[key] = r.read_string();
      else if (key == "layers" || key == "d_model" || key == "heads" || key == "kv_heads" ||
               key == "vocab" || key == "experts" || key == "experts_top_k" ||
               key == "shared_experts" || key == "expert_ffn")
        m.ints[key] = r.read_integer();
      else
        r.skip_value();
    });
  });
  return m;
}

}  // namespace

std::string printable(std::string_view s, size_t max) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (out.size() >= max) return out + "...";
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out += char(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

std::vector<std::string> checkpoint_files(const std::string& dir) {
  std::vector<std::string> all;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return all;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (is_checkpoint_name(n)) all.push_back(n);
  }
  std::sort(all.begin(), all.end());
  return all;
}

std::string latest_checkpoint(const std::string& dir) {
  const std::string latest = (fs::path(dir) / "latest").string();
  const std::vector<std::string> files = checkpoint_files(dir);
  const std::string newest =
      files.empty() ? cat("there is no checkpoint in '", dir, "'")
                    : cat("the newest here is ", (fs::path(dir) / files.back()).string());
  std::error_code ec;
  if (!fs::exists(latest, ec)) {
    TESSERA_REQUIRE_LOCAL(files.empty(), "checkpoint.resume = latest, but '", dir, "' holds ",
                          plural(files.size(), "checkpoint"),
                          " and no 'latest' file; resume one "
                          "with checkpoint.resume = PATH (",
                          newest,
                          "), or start fresh with "
                          "checkpoint.resume = none and checkpoint.overwrite = true");
    return "";
  }
  TESSERA_REQUIRE_LOCAL(fs::is_regular_file(latest, ec), "'", latest,
                        "' is not a regular file; it should be one line naming the newest "
                        "checkpoint: pass checkpoint.resume = PATH (",
                        newest, ")");
  std::ifstream in(latest, std::ios::binary);
  std::string text(256, '\0');
  in.read(text.data(), std::streamsize(text.size()));
  text.resize(size_t(in.gcount()));
  std::string name = text;
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' '))
    name.pop_back();
  TESSERA_REQUIRE_LOCAL(!name.empty(), "'", latest,
                        "' is empty; it should name the newest "
                        "checkpoint (ckpt-NNNNNNNN.h5): pass checkpoint.resume = PATH (",
                        newest, ")");
  TESSERA_REQUIRE_LOCAL(is_checkpoint_name(name) && size_t(in.gcount()) < 256, "'", latest,
                        "' does not name a checkpoint: it holds \"", printable(text, 60),
                        "\" where one line like ckpt-00000006.h5 belongs; pass "
                        "checkpoint.resume = PATH (",
                        newest, ")");
  const std::string path = (fs::path(dir) / name).string();
  TESSERA_REQUIRE_LOCAL(fs::exists(path, ec), "'", latest, "' names ", name,
                        ", which does not exist; pass checkpoint.resume = PATH (", newest, ")");
  return path;
}

std::vector<std::string> foreign_checkpoints(const std::string& dir, bool overwrite) {
  const std::vector<std::string> files = checkpoint_files(dir);
  TESSERA_REQUIRE_LOCAL(files.empty() || overwrite, "checkpoint.dir '", dir, "' already holds ",
                        plural(files.size(), "checkpoint"), " (newest ", files.back(),
                        ") and checkpoint.resume = none: continue that run with "
                        "checkpoint.resume = latest, or replace them with "
                        "checkpoint.overwrite = true");
  return files;
}

std::string meta_checksum(const CheckpointMeta& meta) {
  Sha256 h;
  h.update(cat("step=", meta.step, "\nsamples=", meta.samples, "\nseed=", meta.seed,
               "\ndeck=", meta.deck_json, "\nlayout=", meta.layout_json, "\n"));
  return h.hex();
}

std::vector<std::string> require_same_model(const std::string& path, const std::string& deck_json,
                                            const ModelSection& model) {
  DeckModel then;
  try {
    then = parse_model(deck_json);
  } catch (const JsonError& e) {
    TESSERA_REQUIRE_LOCAL(false, "checkpoint '", path, "': its 'deck' attribute is not JSON (",
                          e.what(), "); is the file damaged?");
  }
  auto in = [&](const char* key) {
    TESSERA_REQUIRE_LOCAL(then.ints.count(key), "checkpoint '", path,
                          "': its 'deck' attribute has no model.", key);
    return then.ints[key];
  };
  const std::string arch = then.strings["arch"];
  TESSERA_REQUIRE_LOCAL(arch == to_string(model.arch), "checkpoint '", path,
                        "' holds a model.arch = ", printable(arch), " model but the deck says ",
                        to_string(model.arch));
  // Each integer as the model uses it: kv_heads = 0 means heads.
  const int64_t heads = in("heads");
  const int64_t kv = in("kv_heads") ? in("kv_heads") : heads;
  const struct {
    const char* key;
    int64_t then, now;
  } ints[] = {{"layers", in("layers"), model.layers},
              {"d_model", in("d_model"), model.d_model},
              {"heads", heads, model.heads},
              {"kv_heads", kv, model.kv_heads ? model.kv_heads : model.heads},
              {"vocab", in("vocab"), model.vocab},
              // mixture of experts (absent from files written before it: a dense model)
              {"experts", then.ints["experts"], model.experts},
              {"shared_experts", then.ints["shared_experts"], model.shared_experts},
              {"expert_ffn", then.ints["expert_ffn"], model.expert_ffn}};
  for (const auto& x : ints)
    TESSERA_REQUIRE_LOCAL(x.then == x.now, "checkpoint '", path, "' holds a model with model.",
                          x.key, " = ", x.then, " but the deck says ", x.now, "; set model.", x.key,
                          " = ", x.then, " to resume it, or start a fresh run");
  // Tying, as the architecture resolves `auto` (gpt2 ties, llama does not).
  auto tied = [](const std::string& tie, const std::string& a) {
    return tie == "true" || (tie == "auto" && a == "gpt2");
  };
  const bool then_tied = tied(then.strings["tie_embeddings"], arch);
  const bool now_tied = tied(to_string(model.tie_embeddings), to_string(model.arch));
  TESSERA_REQUIRE_LOCAL(then_tied == now_tied, "checkpoint '", path, "' holds a model ",
                        then_tied ? "with" : "without", " tied embeddings but the deck's is ",
                        now_tied ? "tied" : "untied",
                        "; set model.tie_embeddings = ", then_tied ? "true" : "false",
                        " to resume it");
  // The routing of a mixture of experts: which blocks are MoE is the model's definition, the
  // top-k and the router kind are how it was trained (checkpoint.allow_routing_change).
  std::vector<std::string> changed;
  if (model.experts == 0) return changed;
  const std::string layers = then.strings.count("moe_layers") ? then.strings["moe_layers"] : "all";
  TESSERA_REQUIRE_LOCAL(layers == model.moe_layers, "checkpoint '", path,
                        "' holds a model with model.moe_layers = ", printable(layers),
                        " but the deck says ", printable(model.moe_layers),
                        "; set model.moe_layers = ", printable(layers), " to resume it");
  if (then.ints["experts_top_k"] != model.experts_top_k)
    changed.push_back(
        cat("model.experts_top_k ", then.ints["experts_top_k"], " -> ", model.experts_top_k));
  const std::string router = then.strings.count("router") ? then.strings["router"] : "softmax";
  if (router != to_string(model.router))
    changed.push_back(cat("model.router ", printable(router), " -> ", to_string(model.router)));
  return changed;
}

}  // namespace tessera
