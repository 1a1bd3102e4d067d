// tessera-plan: predicts memory, step time and MFU of parallel layouts of a training deck on
// a described cluster, and searches for the fastest one that fits.
//   tessera-plan DECK.in --cluster FILE --gpus N [options] [--section.key=value ...]
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "app/errors.hpp"
#include "comm/mpi_env.hpp"
#include "core/error.hpp"
#include "perf/cluster.hpp"
#include "perf/cost_model.hpp"
#include "plan/measure.hpp"
#include "plan/report.hpp"
#include "plan/search.hpp"
#include "plan/workload.hpp"

namespace {

using namespace tessera;

struct Option {
  const char* name;
  const char* value;  // nullptr: a flag
  const char* help;
};

// The one description of the command line: the parser and the help text both read it.
constexpr Option kOptions[] = {
    {"--cluster", "FILE", "cluster description (inputs/clusters/*.in; doc/cluster-file.md)"},
    {"--gpus", "N", "accelerators to plan for"},
    {"--nodes", "N", "or whole nodes: N x the cluster's accelerators per node"},
    {"--top", "K", "layouts to show (default 10)"},
    {"--explain", "LAYOUT", "full breakdown of one layout, e.g. 'tp=8 pp=4 zero=1 rc=selective'"},
    {"--json", "FILE", "also write the result as JSON ('-': to stdout instead of the tables)"},
    {"--plot", "DIR", "write PNGs of the top layouts' memory and time (tools/plan-plot.py)"},
    {"--runtime", "NAME",
     "megatron (a Megatron-LM-style GPU framework, default) or tessera "
     "(this code as it runs today: fp32, DP and ZeRO)"},
    {"--precision", "LIST", "fp32, bf16, fp16, fp8 (default bf16; fp32 for --runtime tessera)"},
    {"--tp", "LIST",
     "restrict the search, e.g. --tp 4,8 (likewise --pp --v --cp --ep --zero --mb)"},
    {"--pp", "LIST", "pipeline stages to try"},
    {"--v", "LIST", "model chunks per stage (interleaved 1F1B) to try"},
    {"--cp", "LIST", "context-parallel degrees to try (default 1 below 16K tokens)"},
    {"--ep", "LIST", "expert-parallel degrees to try (MoE)"},
    {"--zero", "LIST", "ZeRO stages to try"},
    {"--mb", "LIST", "micro-batch sizes to try (default 1,2,4,8,16)"},
    {"--recompute", "LIST", "none, selective, full (default all three)"},
    {"--sp", "LIST", "sequence parallelism off/on: 0, 1 or 0,1 (default)"},
    {"--schedule", "NAME", "1f1b (default; interleaved when v > 1) or gpipe"},
    {"--no-hsdp", nullptr, "do not try ZeRO shard groups of one node"},
    {"--memory-budget", "GB", "use at most this much memory per accelerator (default: all of it)"},
    {"--max-bubble", "X", "reject layouts whose bubble (p-1)/(v m) exceeds X (default 0.5)"},
    {"--allow-tp-across-nodes", nullptr, "accept TP groups that span nodes"},
    {"--attention", "KIND",
     "flash (default) or materialized (scores stored, as before FlashAttention)"},
    {"--dropout", nullptr, "the model has dropout layers (GPT-3/Megatron style)"},
    {"--experts", "E", "MoE: routed experts per layer"},
    {"--top-k", "K", "MoE: experts per token (default 1)"},
    {"--expert-ffn", "F", "MoE: hidden size of one expert (default model.ffn_hidden)"},
    {"--measure-cluster", nullptr,
     "measure this machine (run under mpiexec -n 2 or more) and "
     "print a cluster file"},
    {"--cluster-reference", nullptr, "print the cluster-file reference (doc/cluster-file.md)"},
    {"--help", nullptr, "print this help"},
};

std::string help_text() {
  std::string s =
      "usage: tessera-plan DECK.in --cluster FILE (--gpus N | --nodes N) [options] "
      "[--section.key=value ...]\n"
      "Reads the [model] and [train] sections of a training deck (train.global_batch sets the\n"
      "sequences per step), enumerates every legal layout (dp, tp, pp, v, cp, ep, ZeRO, HSDP,\n"
      "micro-batch, sequence parallelism, recompute, precision) on the cluster, and prints the\n"
      "fastest that fit with their memory and time breakdowns, and why the other families\n"
      "were rejected. doc/planning.md explains the model.\n";
  for (const Option& o : kOptions) {
    const std::string head = std::string(o.name) + (o.value ? std::string(" ") + o.value : "");
    char line[512];
    std::snprintf(line, sizeof line, "  %-24s %s\n", head.c_str(), o.help);
    s += line;
  }
  return s;
}

struct Args {
  std::map<std::string, std::string> options;
  std::vector<std::string> overrides;
  std::string deck;
};

Args parse_args(const std::vector<std::string>& argv) {
  Args a;
  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& s = argv[i];
    if (s.rfind("--", 0) == 0 && s.find('.') != std::string::npos &&
        s.find('=') != std::string::npos && s.find('.') < s.find('=')) {
      a.overrides.push_back(s);  // --section.key=value
      continue;
    }
    if (s.rfind("--", 0) == 0) {
      std::string name = s, value;
      const size_t eq = s.find('=');
      if (eq != std::string::npos) name = s.substr(0, eq), value = s.substr(eq + 1);
      const Option* opt = nullptr;
      for (const Option& o : kOptions)
        if (name == o.name) opt = &o;
      TESSERA_REQUIRE(opt, "unknown option '", name, "'; `tessera-plan --help` lists them");
      if (opt->value && eq == std::string::npos) {
        TESSERA_REQUIRE(i + 1 < argv.size(), "option ", name, " needs a value (", opt->value, ")");
        value = argv[++i];
      }
      TESSERA_REQUIRE(opt->value || eq == std::string::npos, "option ", name, " takes no value");
      a.options[name] = value;
      continue;
    }
    TESSERA_REQUIRE(a.deck.empty(), "more than one input deck given: '", a.deck, "' and '", s, "'");
    a.deck = s;
  }
  return a;
}

int to_int(const std::string& name, const std::string& v) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  TESSERA_REQUIRE(!v.empty() && *end == '\0' && x >= 0 && x < (1L << 30), "option ", name, " = '",
                  v, "' is not a non-negative integer");
  return int(x);
}

std::vector<std::string> split(const std::string& v) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(v);
  while (std::getline(in, item, ',')) out.push_back(item);
  return out;
}

std::vector<int> int_list(const Args& a, const std::string& name) {
  std::vector<int> out;
  auto it = a.options.find(name);
  if (it == a.options.end()) return out;
  for (const std::string& s : split(it->second)) out.push_back(to_int(name, s));
  return out;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  TESSERA_REQUIRE(out.good(), "cannot write '", path, "'");
  out << text;
}

std::string plot_script() {
  if (const char* s = std::getenv("TESSERA_PLAN_PLOT")) return s;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto beside = exe.parent_path() / "plan-plot.py";
    if (std::filesystem::exists(beside)) return beside.string();
  }
  return TESSERA_SOURCE_DIR "/tools/plan-plot.py";
}

void run(const std::vector<std::string>& argv) {
  const Args a = parse_args(argv);
  auto has = [&](const char* n) { return a.options.count(n) > 0; };
  auto opt = [&](const char* n, const std::string& dflt) {
    auto it = a.options.find(n);
    return it == a.options.end() ? dflt : it->second;
  };
  TESSERA_REQUIRE(!a.deck.empty(),
                  "no input deck given; usage: tessera-plan DECK.in --cluster "
                  "FILE --gpus N (see `tessera-plan --help`)");
  TESSERA_REQUIRE(has("--cluster"), "no cluster given; pass --cluster FILE (inputs/clusters/)");
  const Cluster cluster = Cluster::from_file(opt("--cluster", ""));
  Workload w = workload_from(plan_config_file(a.deck, a.overrides));
  const std::string attention = opt("--attention", "flash");
  TESSERA_REQUIRE(attention == "flash" || attention == "materialized", "--attention = '", attention,
                  "' is not flash or materialized");
  w.flash_attention = attention == "flash";
  w.dropout = has("--dropout");
  w.moe.experts = to_int("--experts", opt("--experts", "0"));
  w.moe.top_k = to_int("--top-k", opt("--top-k", "1"));
  w.moe.expert_ffn = to_int("--expert-ffn", opt("--expert-ffn", "0"));
  TESSERA_REQUIRE(!w.moe.any() || (w.moe.top_k >= 1 && w.moe.top_k <= w.moe.experts),
                  "--top-k = ", w.moe.top_k, " must be between 1 and --experts = ", w.moe.experts);
  const Runtime rt = parse_runtime(opt("--runtime", "megatron"));

  int accelerators = to_int("--gpus", opt("--gpus", "0"));
  if (has("--nodes")) accelerators = to_int("--nodes", opt("--nodes", "0")) * cluster.per_node;
  TESSERA_REQUIRE(accelerators > 0, "say how many accelerators to plan for: --gpus N or --nodes N");

  SearchSpace space;
  space.tp = int_list(a, "--tp");
  space.pp = int_list(a, "--pp");
  space.vpp = int_list(a, "--v");
  space.cp = int_list(a, "--cp");
  space.ep = int_list(a, "--ep");
  space.zero = int_list(a, "--zero");
  space.micro_batch = int_list(a, "--mb");
  if (has("--sp")) space.seq_parallel = int_list(a, "--sp");
  if (has("--recompute")) {
    space.recompute.clear();
    for (const std::string& s : split(opt("--recompute", "")))
      space.recompute.push_back(parse_layout("rc=" + s).recompute);
  }
  space.precision = {rt == Runtime::tessera ? ComputeType::fp32 : ComputeType::bf16};
  if (has("--precision")) {
    space.precision.clear();
    for (const std::string& s : split(opt("--precision", "")))
      space.precision.push_back(parse_compute_type(s));
  }
  if (rt == Runtime::tessera) {
    space.recompute = {Recompute::none};
    space.seq_parallel = {0};
  }
  space.schedule = parse_layout("sched=" + opt("--schedule", "1f1b")).schedule;
  space.hsdp = !has("--no-hsdp");
  space.tp_across_nodes = has("--allow-tp-across-nodes");
  space.max_bubble = std::strtod(opt("--max-bubble", "0.5").c_str(), nullptr);
  space.memory_budget = std::strtod(opt("--memory-budget", "0").c_str(), nullptr) * 1e9;
  const int top = to_int("--top", opt("--top", "10"));
  const bool json_stdout = opt("--json", "") == "-";

  std::string json;
  if (has("--explain")) {
    Layout base;
    base.precision = space.precision.front();
    base.schedule = space.schedule;
    Layout l = parse_layout(opt("--explain", ""), base);
    if (l.dp == 0) {
      const int rest = l.tp * l.pp * l.cp;
      TESSERA_REQUIRE(accelerators % rest == 0, "tp x pp x cp = ", rest, " does not divide the ",
                      accelerators, " accelerators");
      l.dp = accelerators / rest;
    }
    const std::string problem = layout_problem(w, l, cluster, rt, accelerators);
    TESSERA_REQUIRE(problem.empty(), "layout '", to_string(l), "' cannot run: ", problem);
    const Estimate e = estimate(w, l, cluster, rt);
    json = "{\"workload\": " + workload_json(w) + ", \"estimate\": " + estimate_json(e) + "}\n";
    if (!json_stdout) std::fputs(format_explain(w, e, cluster).c_str(), stdout);
  } else {
    const SearchResult r = search(w, cluster, accelerators, rt, space);
    json = search_json(w, cluster, accelerators, r, std::max(top, 1));
    if (!json_stdout) {
      std::printf(
          "tessera-plan: %s\n  %s\n  %d accelerators on %s; runtime %s; %d layouts "
          "considered, %d legal, %zu accepted\n\n",
          a.deck.c_str(), describe_workload(w).c_str(), accelerators, cluster.summary().c_str(),
          runtime_name(rt), r.considered, r.legal, r.accepted.size());
      std::fputs(format_ranking(r, top).c_str(), stdout);
      const std::string rej = format_rejections(r);
      if (!rej.empty()) std::printf("\n%s", rej.c_str());
    }
  }
  if (json_stdout)
    std::fputs(json.c_str(), stdout);
  else if (has("--json"))
    write_file(opt("--json", ""), json);
  if (has("--plot")) {
    const std::string dir = opt("--plot", "");
    std::filesystem::create_directories(dir);
    const std::string path = dir + "/plan.json";
    write_file(path, json);
    const char* py = std::getenv("TESSERA_PYTHON");
    const std::string cmd = std::string(py ? py : "/usr/bin/python3") + " '" + plot_script() +
                            "' '" + path + "' '" + dir + "'";
    std::fflush(stdout);
    TESSERA_REQUIRE(std::system(cmd.c_str()) == 0, "plotting failed: ", cmd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv, argv + argc);
  for (const std::string& s : args) {
    if (s == "--help" || s == "-h") {
      std::fputs(help_text().c_str(), stdout);
      return 0;
    }
    if (s == "--cluster-reference") {
      std::fputs(tessera::cluster_reference_markdown().c_str(), stdout);
      return 0;
    }
  }
  tessera::mpi::init(&argc, &argv);
  for (const std::string& s : args)
    if (s == "--measure-cluster")
      return tessera::run_reporting_errors("tessera-plan", [] { tessera::measure_cluster(); });
  return tessera::run_reporting_errors("tessera-plan", [&] {
    if (tessera::mpi::world_rank() == 0) run(args);
  });
}
