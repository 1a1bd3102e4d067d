#include "config/choices.hpp"

#include <initializer_list>
#include <stdexcept>

#include "core/error.hpp"

namespace tessera {
namespace {

// The value of `all` spelt `name`; a collective error listing the spellings otherwise.
template <class E>
E parse_choice(const char* what, std::string_view name, std::initializer_list<E> all) {
  for (E e : all)
    if (name == to_string(e)) return e;
  std::string valid;
  size_t i = 0;
  for (E e : all) {
    valid += i == 0 ? "" : i + 1 == all.size() ? " or " : ", ";
    valid += to_string(e);
    ++i;
  }
  TESSERA_REQUIRE(false, what, " '", name, "' is not known; choose ", valid);
  return *all.begin();
}

}  // namespace

const char* to_string(Arch a) {
  return a == Arch::gpt2 ? "gpt2" : "llama";
}

const char* to_string(TieEmbeddings t) {
  switch (t) {
    case TieEmbeddings::automatic:
      return "auto";
    case TieEmbeddings::yes:
      return "true";
    case TieEmbeddings::no:
      return "false";
  }
  return "?";
}

const char* to_string(Router r) {
  return r == Router::sigmoid ? "sigmoid" : "softmax";
}

const char* to_string(TokenizerKind t) {
  return t == TokenizerKind::gpt2 ? "gpt2" : "byte";
}

const char* to_string(PipeSchedule s) {
  switch (s) {
    case PipeSchedule::gpipe:
      return "gpipe";
    case PipeSchedule::one_f_one_b:
      return "1f1b";
    case PipeSchedule::interleaved:
      return "interleaved";
    case PipeSchedule::zb_h1:
      return "zb-h1";
    case PipeSchedule::zb_v:
      return "zb-v";
    case PipeSchedule::dualpipe_v:
      return "dualpipev";
  }
  return "?";
}

const char* to_string(CpKind k) {
  return k == CpKind::ulysses ? "ulysses" : "ring";
}

const char* to_string(EpDispatch d) {
  return d == EpDispatch::two_level ? "two_level" : "flat";
}

const char* to_string(DpProgress p) {
  return p == DpProgress::poll ? "poll" : "none";
}

const char* to_string(DeviceKind d) {
  return d == DeviceKind::cuda ? "cuda" : "cpu";
}

const char* to_string(TrainPrecision p) {
  switch (p) {
    case TrainPrecision::fp32:
      return "fp32";
    case TrainPrecision::bf16:
      return "bf16";
    case TrainPrecision::fp16:
      return "fp16";
  }
  return "?";
}

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::none:
      return "none";
    case Recompute::selective:
      return "selective";
    case Recompute::full:
      return "full";
  }
  return "?";
}

const char* to_string(ReduceDtype d) {
  return d == ReduceDtype::bf16 ? "bf16" : "fp32";
}

Arch parse_arch(std::string_view name) {
  return parse_choice("model.arch", name, {Arch::llama, Arch::gpt2});
}

TieEmbeddings parse_tie_embeddings(std::string_view name) {
  return parse_choice("model.tie_embeddings", name,
                      {TieEmbeddings::automatic, TieEmbeddings::yes, TieEmbeddings::no});
}

TokenizerKind parse_tokenizer_kind(std::string_view name) {
  return parse_choice("tokenizer", name, {TokenizerKind::byte, TokenizerKind::gpt2});
}

PipeSchedule parse_pipe_schedule(std::string_view name) {
  return parse_choice("pipeline schedule", name,
                      {PipeSchedule::gpipe, PipeSchedule::one_f_one_b, PipeSchedule::interleaved,
                       PipeSchedule::zb_h1, PipeSchedule::zb_v, PipeSchedule::dualpipe_v});
}

CpKind parse_cp_kind(std::string_view name) {
  return parse_choice("parallel.cp_kind", name, {CpKind::ring, CpKind::ulysses});
}

EpDispatch parse_ep_dispatch(std::string_view name) {
  return parse_choice("parallel.ep_dispatch", name, {EpDispatch::flat, EpDispatch::two_level});
}

DpProgress dp_progress_from(const std::string& name) {
  if (name == to_string(DpProgress::poll)) return DpProgress::poll;
  if (name == to_string(DpProgress::none)) return DpProgress::none;
  throw std::logic_error("parallel.progress: unknown mode '" + name + "'");
}

DeviceKind parse_device_kind(std::string_view name) {
  return parse_choice("hardware.device", name, {DeviceKind::cpu, DeviceKind::cuda});
}

TrainPrecision parse_precision(std::string_view name) {
  return parse_choice("train.precision", name,
                      {TrainPrecision::fp32, TrainPrecision::bf16, TrainPrecision::fp16});
}

Router parse_router(std::string_view name) {
  return parse_choice("model.router", name, {Router::softmax, Router::sigmoid});
}

Recompute parse_recompute(std::string_view name) {
  return parse_choice("train.recompute", name,
                      {Recompute::none, Recompute::selective, Recompute::full});
}

ReduceDtype parse_reduce_dtype(std::string_view name) {
  return parse_choice("parallel.grad_reduce_dtype", name, {ReduceDtype::fp32, ReduceDtype::bf16});
}

const char* to_string(OnNonfinite o) {
  return o == OnNonfinite::skip ? "skip" : "stop";
}

OnNonfinite parse_on_nonfinite(std::string_view name) {
  return parse_choice("train.on_nonfinite", name, {OnNonfinite::stop, OnNonfinite::skip});
}

}  // namespace tessera
