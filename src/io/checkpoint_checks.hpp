// What a checkpoint directory and file must satisfy before a run reads or writes them
// (doc/checkpoints.md, "What is checked"): the `latest` pointer, which run owns the
// directory, the model definition a file was written for, the checksum of its root
// attributes. Internal to io/ (used by checkpoint.cpp); every function raises a local
// tessera::Error naming the file, which the caller turns into a collective one.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

struct CheckpointMeta;
struct ModelSection;

// s for a one-line message: control and non-ASCII bytes as \xNN, cut after max characters.
std::string printable(std::string_view s, size_t max = 80);

// The checkpoint files (ckpt-*.h5) in dir, oldest first; none when dir does not exist.
std::vector<std::string> checkpoint_files(const std::string& dir);

// The path `dir/latest` names, or "" when dir holds neither `latest` nor a checkpoint (a
// fresh start). Errors: `latest` empty, not one line naming a ckpt-*.h5 file, naming a file
// that does not exist, or missing beside existing checkpoints.
std::string latest_checkpoint(const std::string& dir);

// A fresh run (checkpoint.resume = none) must not write into a directory that holds another
// run's checkpoints unless overwrite (checkpoint.overwrite) is set: returns the files it
// will replace (empty unless overwrite).
std::vector<std::string> foreign_checkpoints(const std::string& dir, bool overwrite);

// SHA-256 (hex) of the root attributes: the lines "step=N", "samples=N", "seed=N",
// "deck=JSON", "layout=JSON", each ending in '\n'. A flipped bit in any of them is then
// named as damage, not blamed on a deck that disagrees.
std::string meta_checksum(const CheckpointMeta& meta);

// The model definition of the deck a checkpoint was written with (its `deck` attribute)
// against this run's: architecture, layers, heads, key/value heads, vocabulary, tying, and
// for a mixture of experts the experts, shared experts, expert width and moe_layers. Returns
// how the routing changed ("model.experts_top_k 2 -> 1", "model.router ..."), which the
// caller refuses unless checkpoint.allow_routing_change.
std::vector<std::string> require_same_model(const std::string& path, const std::string& deck_json,
                                            const ModelSection& model);

}  // namespace tessera
