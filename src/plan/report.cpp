#include "plan/report.hpp"

#include <cstdarg>
#include <cstdio>
#include <sstream>

#include "parallel/pp/schedule.hpp"
#include "perf/compute_model.hpp"
#include "perf/memory.hpp"

namespace tessera {
namespace {

std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt("\\u%04x", c);
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string num(double x) {
  return fmt("%.10g", x);
}

}  // namespace

std::string describe_workload(const Workload& w) {
  const ModelConfig& c = w.cfg;
  std::string s =
      fmt("%s, %lld layers, d_model %lld, heads %lld/%lld, ffn %lld, vocab %lld, "
          "seq %lld, %.2fB parameters; global batch %lld sequences (%.2fM tokens)",
          c.arch_name(), (long long)c.layers, (long long)c.d_model, (long long)c.heads,
          (long long)c.kv_heads, (long long)c.ffn_hidden, (long long)c.vocab, (long long)c.seq_len,
          workload_params(w) / 1e9, (long long)w.global_batch,
          double(w.global_batch) * double(c.seq_len) / 1e6);
  if (w.moe.any()) s += fmt("; MoE %d experts, top-%d", w.moe.experts, w.moe.top_k);
  s += w.flash_attention ? "; flash attention" : "; attention scores materialised";
  if (w.dropout) s += "; dropout";
  return s;
}

std::string format_ranking(const SearchResult& r, int top) {
  std::ostringstream os;
  const int n = std::min<int>(top, int(r.accepted.size()));
  if (n == 0) return "no layout is acceptable (see the rejected families below)\n";
  os << fmt("%-4s %-58s %9s %7s %6s %7s %6s %7s\n", "rank", "layout", "tokens/s", "step s", "MFU",
            "TFLOP/s", "bubble", "mem GB");
  for (int i = 0; i < n; ++i) {
    const Estimate& e = r.accepted[size_t(i)];
    os << fmt("%-4d %-58s %9.0f %7.3f %5.1f%% %7.1f %5.1f%% %7.1f\n", i + 1,
              to_string(e.layout).c_str(), e.tokens_per_second, e.step_seconds, 100 * e.mfu,
              e.hardware_tflops, 100 * e.bubble_fraction, e.memory.total() / 1e9);
  }
  os << "\nmemory per accelerator, GB (capacity, or --memory-budget: "
     << fmt("%.1f", r.accepted.front().capacity / 1e9) << ")\n";
  os << fmt("%-4s %8s %8s %8s %8s %8s %8s %8s %8s\n", "rank", "params", "grads", "optim", "activ",
            "comm", "work", "reserved", "total");
  for (int i = 0; i < n; ++i) {
    const MemoryBreakdown& m = r.accepted[size_t(i)].memory;
    os << fmt("%-4d %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", i + 1, m.params / 1e9,
              m.grads / 1e9, m.optimizer / 1e9, m.activations / 1e9, m.comm / 1e9,
              m.workspace / 1e9, m.reserved / 1e9, m.total() / 1e9);
  }
  os << "\nstep time, seconds\n";
  os << fmt("%-4s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n", "rank", "compute", "recomp", "tp",
            "cp", "ep", "p2p", "bubble", "dp", "(hidden)", "optim");
  for (int i = 0; i < n; ++i) {
    const TimeBreakdown& t = r.accepted[size_t(i)].time;
    os << fmt("%-4d %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f\n", i + 1,
              t.compute, t.recompute, t.tp_comm, t.cp_comm, t.ep_comm, t.pp_p2p, t.pp_bubble,
              t.dp_comm, t.dp_hidden, t.optimizer);
  }
  os << "(dp: DP/ZeRO traffic; (hidden): the part of it overlapped with backward; the step is "
        "the sum less the hidden part)\n";
  return os.str();
}

std::string format_rejections(const SearchResult& r) {
  std::ostringstream os;
  if (r.rejected.empty()) return "";
  os << "rejected families (no acceptable layout):\n";
  for (const FamilyRejection& f : r.rejected)
    os << fmt("  %-26s %s\n", f.family.c_str(), f.summary().c_str());
  return os.str();
}

std::string format_explain(const Workload& w, const Estimate& e, const Cluster& c) {
  std::ostringstream os;
  const Layout& l = e.layout;
  const double step = e.step_seconds;
  auto pct = [&](double x) { return 100 * x / step; };
  os << "layout     " << to_string(l) << "  (runtime " << runtime_name(e.runtime) << ")\n";
  os << fmt(
      "           %d accelerators = dp %d x tp %d x pp %d x cp %d; %lld micro-batches of "
      "%d per step; ZeRO shard group %d\n",
      l.accelerators(), l.dp, l.tp, l.pp, l.cp, (long long)e.microbatches, l.micro_batch,
      l.shard_ranks());
  os << "workload   " << describe_workload(w) << "\n";
  os << "cluster    " << c.summary() << "\n";
  os << fmt("links      tp %s, cp %s, ep %s, dp %s, pp %s\n", e.links.tp.name, e.links.cp.name,
            e.links.ep.name, e.links.dp.name, e.links.pp.name);
  os << "placement  rank order " << l.order
     << " (fastest first); per group, its worst-placed instance:\n";
  const std::pair<const char*, const GroupLink*> groups[] = {
      {"tp", &e.links.tp}, {"cp", &e.links.cp},       {"ep", &e.links.ep},
      {"dp", &e.links.dp}, {"shard", &e.links.shard}, {"pp", &e.links.pp}};
  for (const auto& [name, g] : groups) {
    if (g->place.members <= 1) continue;
    if (std::string(name) == "shard" && l.shard_ranks() == l.dp * l.cp) continue;
    os << fmt("  %-6s %-58s %s\n", name, describe(g->place).c_str(), g->name);
  }
  os << fmt("\nmemory per accelerator (%s stage)                GB   formula\n",
            l.pp == 1 ? "the only" : "the fuller");
  const MemoryBreakdown& m = e.memory;
  const char* zf = zero_formula(l.zero, l.mixed());
  os << fmt(
      "  params                                    %9.2f   ZeRO-%d share of %s (Psi_r = %.3gB per "
      "rank)\n",
      m.params / 1e9, l.zero, zf, e.params_per_rank / 1e9);
  os << fmt("  grads                                     %9.2f\n", m.grads / 1e9);
  os << fmt("  optimizer                                 %9.2f   Adam m, v%s\n", m.optimizer / 1e9,
            l.mixed() ? " and fp32 master weights" : "");
  os << fmt("  activations                               %9.2f   %s recompute, %s\n",
            m.activations / 1e9, recompute_name(l.recompute),
            e.runtime == Runtime::tessera ? "tessera's layer buffers"
            : l.pp > 1 && pp::splits_backward(l.schedule)
                ? "Korthikanti et al. per layer x chunks held to W, + W's output gradients"
                : "Korthikanti et al. per layer x layers in flight");
  if (e.runtime == Runtime::tessera && m.comm > 0)
    os << fmt("  comm buffers                              %9.4f   ZeRO-%d staging and gathers\n",
              m.comm / 1e9, l.zero);
  else
    os << fmt("  comm buffers                              %9.2f\n", m.comm / 1e9);
  os << fmt("  workspace                                 %9.2f\n", m.workspace / 1e9);
  os << fmt("  reserved                                  %9.2f   cluster reserved_gb\n",
            m.reserved / 1e9);
  os << fmt("  total                                     %9.2f   of %.2f: %s\n", m.total() / 1e9,
            e.capacity / 1e9,
            e.fits() ? fmt("fits, %.2f GB free", (e.capacity - m.total()) / 1e9).c_str()
                     : fmt("OUT OF MEMORY by %.2f GB", (m.total() - e.capacity) / 1e9).c_str());
  const TimeBreakdown& t = e.time;
  os << "\nstep time                                         s   share\n";
  os << fmt("  compute (forward %.3f + backward %.3f)    %9.3f  %5.1f%%\n", t.forward, t.backward,
            t.compute, pct(t.compute));
  os << fmt("  recompute                                 %9.3f  %5.1f%%\n", t.recompute,
            pct(t.recompute));
  os << fmt("  TP/SP communication                       %9.3f  %5.1f%%\n", t.tp_comm,
            pct(t.tp_comm));
  os << fmt("  CP communication (exposed)                %9.3f  %5.1f%%\n", t.cp_comm,
            pct(t.cp_comm));
  if (t.ep_hidden > 0) {
    os << fmt("  EP all-to-all         %8.3f, hidden %6.3f %9.3f  %5.1f%%\n", t.ep_comm,
              t.ep_hidden, t.ep_comm - t.ep_hidden, pct(t.ep_comm - t.ep_hidden));
    os << fmt(
        "    %.0f dualpipev pairs per step: each pass's all-to-alls behind the other's compute, "
        "min(comm, compute)\n",
        e.ep_pairs);
  } else {
    os << fmt("  EP all-to-all                             %9.3f  %5.1f%%\n", t.ep_comm,
              pct(t.ep_comm));
  }
  if (e.ep_bytes_per_step > 0)
    os << fmt(
        "    all-to-all bytes sent per step: %.4g MB (4 per MoE block and micro-batch, "
        "balanced loads, own rows included)\n",
        e.ep_bytes_per_step / 1e6);
  if (!e.ep_cross_bytes_by_stage.empty())
    os << fmt(
        "    two-level dispatch: %.4g MB inside the node, %.4g MB across nodes (first stage)\n",
        e.ep_intra_bytes_by_stage.front() / 1e6, e.ep_cross_bytes_by_stage.front() / 1e6);
  os << fmt("  PP send/recv                              %9.3f  %5.1f%%\n", t.pp_p2p,
            pct(t.pp_p2p));
  // The split-backward kinds' formulas at F = B = W (pp::bubble_formula, doc/pipeline.md).
  const PipeSchedule sched = e.layout.schedule;
  const char* bubble = sched == PipeSchedule::zb_h1        ? "(p-1)/(3m)"
                       : sched == PipeSchedule::zb_v       ? "max(p-1, 4p-2-2m)/(6m)"
                       : sched == PipeSchedule::dualpipe_v ? "(p-1)/(6m)"
                                                           : "(p-1)/(v m)";
  os << fmt("  PP bubble  %-11s = %5.1f%%           %9.3f  %5.1f%%\n", bubble,
            100 * e.bubble_fraction, t.pp_bubble, pct(t.pp_bubble));
  os << fmt("  DP/ZeRO communication %8.3f, hidden %6.3f %9.3f  %5.1f%%\n", t.dp_comm, t.dp_hidden,
            t.dp_comm - t.dp_hidden, pct(t.dp_comm - t.dp_hidden));
  for (const OverlapTerm& term : e.dp_overlap.terms)
    os << fmt("    %-72s %8.3f, exposed %8.3f\n", term.what.c_str(), term.total, term.exposed);
  os << fmt("  optimizer                                 %9.3f  %5.1f%%\n", t.optimizer,
            pct(t.optimizer));
  os << fmt("  step                                      %9.3f\n", step);
  os << fmt(
      "\nthroughput %.0f tokens/s; %.1f TFLOP/s per accelerator counting recompute "
      "(%.1f model); MFU %.1f%%, HFU %.1f%% of %.0f TFLOP/s %s\n",
      e.tokens_per_second, e.hardware_tflops, e.model_tflops, 100 * e.mfu, 100 * e.hfu,
      c.peak(l.precision) / 1e12, compute_type_name(l.precision));
  os << fmt(
      "(MFU counts attention's T x T in full, as Megatron-LM and tessera's runs do; counting "
      "only the causal half: MFU %.1f%%)\n",
      100 * e.mfu_causal);
  for (const std::string& warn : e.warnings) os << "warning: " << warn << "\n";
  return os.str();
}

std::string estimate_json(const Estimate& e) {
  const Layout& l = e.layout;
  const MemoryBreakdown& m = e.memory;
  const TimeBreakdown& t = e.time;
  std::ostringstream os;
  os << "{\"layout\": {\"text\": " << json_string(to_string(l)) << ", \"dp\": " << l.dp
     << ", \"tp\": " << l.tp << ", \"pp\": " << l.pp << ", \"v\": " << l.vpp << ", \"cp\": " << l.cp
     << ", \"ep\": " << l.ep << ", \"zero\": " << l.zero << ", \"shard_group\": " << l.shard_ranks()
     << ", \"micro_batch\": " << l.micro_batch
     << ", \"sequence_parallel\": " << (l.seq_parallel ? "true" : "false") << ", \"recompute\": \""
     << recompute_name(l.recompute) << "\", \"precision\": \"" << compute_type_name(l.precision)
     << "\", \"recompute_layers\": " << l.recompute_layers << ", \"order\": \"" << l.order
     << "\", \"schedule\": \"" << to_string(l.schedule) << "\"}, \"runtime\": \""
     << runtime_name(e.runtime) << "\", \"microbatches\": " << e.microbatches;
  os << ", \"memory_bytes\": {\"params\": " << num(m.params) << ", \"grads\": " << num(m.grads)
     << ", \"optimizer\": " << num(m.optimizer) << ", \"activations\": " << num(m.activations)
     << ", \"comm\": " << num(m.comm) << ", \"workspace\": " << num(m.workspace)
     << ", \"reserved\": " << num(m.reserved) << ", \"total\": " << num(m.total())
     << ", \"capacity\": " << num(e.capacity) << "}";
  os << ", \"time_seconds\": {\"compute\": " << num(t.compute)
     << ", \"forward\": " << num(t.forward) << ", \"backward\": " << num(t.backward)
     << ", \"recompute\": " << num(t.recompute) << ", \"tp\": " << num(t.tp_comm)
     << ", \"cp\": " << num(t.cp_comm) << ", \"ep\": " << num(t.ep_comm)
     << ", \"ep_hidden\": " << num(t.ep_hidden) << ", \"pp_p2p\": " << num(t.pp_p2p)
     << ", \"pp_bubble\": " << num(t.pp_bubble) << ", \"dp\": " << num(t.dp_comm)
     << ", \"dp_hidden\": " << num(t.dp_hidden) << ", \"optimizer\": " << num(t.optimizer)
     << ", \"step\": " << num(e.step_seconds) << "}";
  os << ", \"tokens_per_second\": " << num(e.tokens_per_second)
     << ", \"model_tflops_per_accelerator\": " << num(e.model_tflops)
     << ", \"hardware_tflops_per_accelerator\": " << num(e.hardware_tflops)
     << ", \"mfu\": " << num(e.mfu) << ", \"mfu_causal\": " << num(e.mfu_causal)
     << ", \"hfu\": " << num(e.hfu) << ", \"bubble_fraction\": " << num(e.bubble_fraction)
     << ", \"ep_bytes_per_step\": " << num(e.ep_bytes_per_step) << ", \"ep_bytes_by_stage\": [";
  for (size_t i = 0; i < e.ep_bytes_by_stage.size(); ++i)
    os << (i ? ", " : "") << num(e.ep_bytes_by_stage[i]);
  os << "], \"ep_intra_bytes_by_stage\": [";
  for (size_t i = 0; i < e.ep_intra_bytes_by_stage.size(); ++i)
    os << (i ? ", " : "") << num(e.ep_intra_bytes_by_stage[i]);
  os << "], \"ep_cross_bytes_by_stage\": [";
  for (size_t i = 0; i < e.ep_cross_bytes_by_stage.size(); ++i)
    os << (i ? ", " : "") << num(e.ep_cross_bytes_by_stage[i]);
  os << "]"
     << ", \"params_per_rank\": " << num(e.params_per_rank)
     << ", \"fits\": " << (e.fits() ? "true" : "false") << ", \"links\": {";
  const std::pair<const char*, const GroupLink*> links[] = {{"tp", &e.links.tp},
                                                            {"cp", &e.links.cp},
                                                            {"ep", &e.links.ep},
                                                            {"dp", &e.links.dp},
                                                            {"pp", &e.links.pp}};
  for (size_t i = 0; i < 5; ++i)
    os << (i ? ", " : "") << "\"" << links[i].first << "\": {\"link\": \"" << links[i].second->name
       << "\", \"members\": " << links[i].second->place.members
       << ", \"nodes\": " << links[i].second->place.nodes
       << ", \"per_node_min\": " << links[i].second->place.per_node_min
       << ", \"per_node_max\": " << links[i].second->place.per_node_max
       << ", \"pods\": " << links[i].second->place.pods << "}";
  os << "}, \"dp_overlap\": [";
  for (size_t i = 0; i < e.dp_overlap.terms.size(); ++i) {
    const OverlapTerm& term = e.dp_overlap.terms[i];
    os << (i ? ", " : "") << "{\"what\": " << json_string(term.what)
       << ", \"seconds\": " << num(term.total) << ", \"exposed\": " << num(term.exposed) << "}";
  }
  os << "], \"warnings\": [";
  for (size_t i = 0; i < e.warnings.size(); ++i)
    os << (i ? ", " : "") << json_string(e.warnings[i]);
  os << "]}";
  return os.str();
}

std::string workload_json(const Workload& w) {
  const ModelConfig& c = w.cfg;
  std::ostringstream os;
  os << "{\"arch\": \"" << c.arch_name() << "\", \"layers\": " << c.layers
     << ", \"d_model\": " << c.d_model << ", \"heads\": " << c.heads
     << ", \"kv_heads\": " << c.kv_heads << ", \"ffn_hidden\": " << c.ffn_hidden
     << ", \"vocab\": " << c.vocab << ", \"seq_len\": " << c.seq_len
     << ", \"parameters\": " << num(workload_params(w)) << ", \"global_batch\": " << w.global_batch
     << ", \"flash_attention\": " << (w.flash_attention ? "true" : "false")
     << ", \"dropout\": " << (w.dropout ? "true" : "false") << ", \"experts\": " << w.moe.experts
     << ", \"top_k\": " << w.moe.top_k
     << ", \"flops_per_token\": " << num(workload_flops_per_token(w)) << "}";
  return os.str();
}

std::string search_json(const Workload& w, const Cluster& c, int accelerators,
                        const SearchResult& r, int top) {
  std::ostringstream os;
  os << "{\n  \"workload\": " << workload_json(w)
     << ",\n  \"cluster\": {\"name\": " << json_string(c.name)
     << ", \"accelerator\": " << json_string(c.accelerator) << ", \"per_node\": " << c.per_node
     << ", \"memory_bytes\": " << num(c.memory) << "},\n  \"accelerators\": " << accelerators
     << ",\n  \"considered\": " << r.considered << ",\n  \"legal\": " << r.legal
     << ",\n  \"accepted_count\": " << r.accepted.size() << ",\n  \"accepted\": [";
  const int n = std::min<int>(top, int(r.accepted.size()));
  for (int i = 0; i < n; ++i)
    os << (i ? ",\n    " : "\n    ") << estimate_json(r.accepted[size_t(i)]);
  os << "\n  ],\n  \"rejected\": [";
  for (size_t i = 0; i < r.rejected.size(); ++i) {
    const FamilyRejection& f = r.rejected[i];
    os << (i ? ",\n    " : "\n    ") << "{\"family\": " << json_string(f.family)
       << ", \"layouts\": " << f.layouts << ", \"illegal\": " << f.illegal
       << ", \"out_of_memory\": " << f.out_of_memory
       << ", \"tp_across_nodes\": " << f.tp_across_nodes << ", \"bubble\": " << f.bubble
       << ", \"min_excess_bytes\": " << num(f.min_excess)
       << ", \"reason\": " << json_string(f.summary()) << "}";
  }
  os << "\n  ]\n}\n";
  return os.str();
}

}  // namespace tessera
