// tessera-plan: predicts memory, step time and MFU of parallel layouts of a training deck on
// a described cluster, and searches for the fastest one that fits.
//   tessera-plan DECK.in --cluster FILE --gpus N [options] [--section.key=value ...]
#include <algorithm>
#include <cerrno>
#include <cmath>
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
    {"--recompute", "LIST",
     "none, selective, full, full:N (N layers of each stage; default the first three, with "
     "full also for N = 1/4, 1/2, 3/4 of a stage)"},
    {"--sp", "LIST", "sequence parallelism off/on: 0, 1 or 0,1 (default)"},
    {"--schedule", "LIST",
     "1f1b (default; interleaved when v > 1), gpipe, and the split-backward zb-h1, zb-v, "
     "dualpipev (doc/pipeline.md)"},
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
      TESSERA_REQUIRE(!opt->value || !value.empty(), "option ", name, " needs a value (",
                      opt->value, "), not an empty string");
      TESSERA_REQUIRE(!a.options.count(name), "option ", name, " is given twice ('",
                      a.options[name], "' and '", value, "'); give it once");
      a.options[name] = value;
      continue;
    }
    TESSERA_REQUIRE(a.deck.empty(), "more than one input deck given: '", a.deck, "' and '", s, "'");
    a.deck = s;
  }
  return a;
}

// No count given on the command line (accelerators, degrees, sizes, experts, layouts to show)
// may exceed this: larger values are typing errors, and would make the search run for hours.
constexpr long long kMaxCount = 1000000;

// Option `name`'s value v as a whole decimal integer in [lo, hi]; `why` says where the bounds
// come from.
int to_int(const std::string& name, const std::string& v, long long lo, long long hi,
           const std::string& why = "") {
  const std::string allowed =
      cat("allowed: integer in [", lo, ", ", hi, "]", why.empty() ? "" : " (" + why + ")");
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  TESSERA_REQUIRE(!v.empty() && *end == '\0' && errno != ERANGE, "option ", name, " = '", v,
                  "' is not an integer; ", allowed);
  TESSERA_REQUIRE(x >= lo && x <= hi, "option ", name, " = ", x, " is out of range; ", allowed);
  return int(x);
}

// Option `name`'s value v as a whole finite number.
double to_number(const std::string& name, const std::string& v, const std::string& allowed) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  TESSERA_REQUIRE(!v.empty() && *end == '\0' && std::isfinite(x), "option ", name, " = '", v,
                  "' is not a finite number; allowed: ", allowed);
  return x;
}

std::vector<std::string> split(const std::string& v) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(v);
  while (std::getline(in, item, ',')) out.push_back(item);
  return out;
}

// A comma-separated list of integers in [lo, hi]; empty when the option is not given.
std::vector<int> int_list(const Args& a, const std::string& name, long long lo, long long hi,
                          const std::string& why = "") {
  std::vector<int> out;
  auto it = a.options.find(name);
  if (it == a.options.end()) return out;
  for (const std::string& s : split(it->second)) out.push_back(to_int(name, s, lo, hi, why));
  TESSERA_REQUIRE(!out.empty(), "option ", name, " = '", it->second, "' lists no value");
  return out;
}

// A list of parallel degrees: each must divide the accelerators (dp x tp x pp x cp = the
// accelerators, and ep divides dp).
std::vector<int> degree_list(const Args& a, const std::string& name, int accelerators) {
  std::vector<int> out = int_list(a, name, 1, accelerators, "at most the accelerators");
  for (int d : out)
    TESSERA_REQUIRE(accelerators % d == 0, "option ", name, " = ", d, " does not divide the ",
                    accelerators, " accelerators; a parallel degree must divide them");
  return out;
}

// Runs parse(text) and names the option when it throws.
template <class Parse>
auto parse_option(const std::string& name, const std::string& text, Parse&& parse) {
  try {
    return parse(text);
  } catch (const Error& e) {
    throw Error(cat("option ", name, " = '", text, "': ", e.what()), e.file(), e.line(), true);
  }
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
  if (has("--experts")) {
    TESSERA_REQUIRE(!w.cfg.moe.enabled(), "option --experts ", opt("--experts", ""),
                    " and the deck's model.experts = ", w.cfg.moe.experts,
                    " both describe the experts; give one of them");
    w.moe.experts = to_int("--experts", opt("--experts", ""), 1, kMaxCount);
    if (has("--top-k"))
      w.moe.top_k = to_int("--top-k", opt("--top-k", ""), 1, w.moe.experts, "at most --experts");
    if (has("--expert-ffn"))
      w.moe.expert_ffn = to_int("--expert-ffn", opt("--expert-ffn", ""), 1, kMaxCount);
  } else {
    for (const char* moe_only : {"--top-k", "--expert-ffn"})
      TESSERA_REQUIRE(!has(moe_only), "option ", moe_only,
                      " describes a mixture-of-experts model; give --experts E too");
  }
  const Runtime rt = parse_option("--runtime", opt("--runtime", "megatron"), parse_runtime);
  TESSERA_REQUIRE(rt != Runtime::tessera || !has("--experts"),
                  "--runtime tessera reads the experts from the deck as tessera does: set "
                  "model.experts (or --model.experts=E, --model.experts_top_k=K) instead of "
                  "--experts");
  TESSERA_REQUIRE(rt != Runtime::megatron || !w.cfg.moe.enabled() ||
                      (w.cfg.moe.shared == 0 && w.cfg.moe_blocks() == w.cfg.layers),
                  "the Megatron-style runtime costs routed experts in every block only; this "
                  "deck has model.shared_experts = ",
                  w.cfg.moe.shared, " and ", w.cfg.moe_blocks(), " MoE blocks of ", w.cfg.layers,
                  " (model.moe_layers): use --runtime tessera");

  // How many accelerators: --gpus N or --nodes N, at most what the cluster has.
  TESSERA_REQUIRE(!(has("--gpus") && has("--nodes")), "options --gpus ", opt("--gpus", ""),
                  " and --nodes ", opt("--nodes", ""), " are both given; give one of them");
  TESSERA_REQUIRE(has("--gpus") || has("--nodes"),
                  "say how many accelerators to plan for: --gpus N or --nodes N");
  const long long cluster_size =
      cluster.nodes > 0 ? std::min(kMaxCount, (long long)cluster.nodes * cluster.per_node)
                        : kMaxCount;
  const std::string size_why = cluster.nodes > 0
                                   ? cat("cluster '", cluster.name, "' has ", cluster.nodes,
                                         " node(s) of ", cluster.per_node, " accelerators")
                                   : std::string("no larger count is plausible");
  const int accelerators =
      has("--gpus")
          ? to_int("--gpus", opt("--gpus", ""), 1, cluster_size, size_why)
          : to_int("--nodes", opt("--nodes", ""), 1, cluster_size / cluster.per_node, size_why) *
                cluster.per_node;

  // Options that shape the search have no effect on one explained layout.
  if (has("--explain"))
    for (const char* search_only :
         {"--tp", "--pp", "--v", "--cp", "--ep", "--zero", "--mb", "--recompute", "--sp", "--top",
          "--no-hsdp", "--memory-budget", "--max-bubble", "--allow-tp-across-nodes"})
      TESSERA_REQUIRE(!has(search_only), "option ", search_only,
                      " restricts the search and has no effect with --explain; put the "
                      "layout's values in --explain (e.g. 'tp=8 pp=4 mb=1') or drop it");

  SearchSpace space;
  space.tp = degree_list(a, "--tp", accelerators);
  space.pp = degree_list(a, "--pp", accelerators);
  space.cp = degree_list(a, "--cp", accelerators);
  space.ep = degree_list(a, "--ep", accelerators);
  space.vpp = int_list(a, "--v", 1, std::min<int64_t>(w.cfg.layers, kMaxCount),
                       "at most the model's layers");
  space.zero = int_list(a, "--zero", 0, 3, "ZeRO stages");
  space.micro_batch = int_list(a, "--mb", 1, std::min<int64_t>(w.global_batch, kMaxCount),
                               "at most train.global_batch");
  if (has("--sp")) space.seq_parallel = int_list(a, "--sp", 0, 1, "off, on");
  // The restricted degrees must leave some layout: tp x pp x cp dividing the accelerators.
  bool some_product_divides = false;
  for (int tp : space.tp.empty() ? std::vector<int>{1} : space.tp)
    for (int pp : space.pp.empty() ? std::vector<int>{1} : space.pp)
      for (int cp : space.cp.empty() ? std::vector<int>{1} : space.cp)
        some_product_divides |= accelerators % (int64_t(tp) * pp * cp) == 0;
  TESSERA_REQUIRE(some_product_divides, "options --tp ", opt("--tp", "(any)"), ", --pp ",
                  opt("--pp", "(any)"), " and --cp ", opt("--cp", "(any)"),
                  ": no tp x pp x cp of them divides the ", accelerators, " accelerators");
  if (has("--recompute")) {  // none, selective, full, full:N (N layers of each stage)
    space.recompute.clear();
    bool full_all = false;
    for (const std::string& s : split(opt("--recompute", ""))) {
      const Layout r = parse_option("--recompute", s,
                                    [](const std::string& v) { return parse_layout("rc=" + v); });
      if (r.recompute_layers > 0)
        space.full_layers.push_back(r.recompute_layers);
      else if (r.recompute == Recompute::full)
        full_all = true;
      if (std::find(space.recompute.begin(), space.recompute.end(), r.recompute) ==
          space.recompute.end())
        space.recompute.push_back(r.recompute);
    }
    space.full_all = full_all || space.full_layers.empty();
  }
  space.precision = {rt == Runtime::tessera ? ComputeType::fp32 : ComputeType::bf16};
  if (has("--precision")) {
    space.precision.clear();
    for (const std::string& s : split(opt("--precision", "")))
      space.precision.push_back(parse_option("--precision", s, parse_compute_type));
  }
  TESSERA_REQUIRE(!space.recompute.empty() && !space.precision.empty(),
                  "options --recompute and --precision need at least one value");
  if (rt == Runtime::tessera) {
    if (!has("--recompute")) space.recompute = {Recompute::none};  // tessera's default
    space.seq_parallel = {0};
    space.orders = {Layout::kDefaultRankOrder};  // what plan_validate_tessera checks
  }
  space.schedules.clear();
  for (const std::string& s : split(opt("--schedule", "1f1b"))) {
    const PipeSchedule k = parse_option("--schedule", s, [](const std::string& v) {
      return parse_layout("sched=" + v).schedule;
    });
    if (std::find(space.schedules.begin(), space.schedules.end(), k) == space.schedules.end())
      space.schedules.push_back(k);
  }
  TESSERA_REQUIRE(!space.schedules.empty(), "option --schedule needs at least one value");
  space.hsdp = !has("--no-hsdp");
  space.tp_across_nodes = has("--allow-tp-across-nodes");
  if (has("--max-bubble")) {
    space.max_bubble = to_number("--max-bubble", opt("--max-bubble", ""), "a number >= 0");
    TESSERA_REQUIRE(space.max_bubble >= 0, "option --max-bubble = ", space.max_bubble,
                    " is out of range; allowed: a number >= 0 (a fraction of the step)");
  }
  if (has("--memory-budget")) {
    const double capacity_gb = cluster.memory / 1e9;
    const std::string allowed = cat("GB in (0, ", capacity_gb, "], the accelerator's memory");
    const double gb = to_number("--memory-budget", opt("--memory-budget", ""), allowed);
    TESSERA_REQUIRE(gb > 0 && gb <= capacity_gb, "option --memory-budget = ", gb,
                    " is out of range; allowed: ", allowed);
    space.memory_budget = gb * 1e9;
  }
  const int top = to_int("--top", opt("--top", "10"), 1, kMaxCount);
  const bool json_stdout = opt("--json", "") == "-";
  if (has("--plot")) {  // before any work: a directory, or a path where one can be made
    const std::string dir = opt("--plot", "");
    std::error_code ec;
    const bool not_dir =
        std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec);
    TESSERA_REQUIRE(!not_dir, "option --plot = '", dir,
                    "' exists and is not a directory; name a directory for the plots");
  }

  std::string json;
  if (has("--explain")) {
    Layout base;
    base.precision = space.precision.front();
    base.schedule = space.schedules.front();
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
    json = search_json(w, cluster, accelerators, r, top);
    if (!json_stdout) {
      std::printf(
          "tessera-plan: %s\n  %s\n  %d accelerators on %s; runtime %s; %d layouts "
          "considered, %d legal, %zu accepted%s\n\n",
          a.deck.c_str(), describe_workload(w).c_str(), accelerators, cluster.summary().c_str(),
          runtime_name(rt), r.considered, r.legal, r.accepted.size(),
          r.implausible > 0 ? cat(" (", r.implausible, " predicted above the ",
                                  100 * kMfuSanityBound, "% MFU sanity bound set aside)")
                                  .c_str()
                            : "");
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
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    TESSERA_REQUIRE(!ec, "option --plot = '", dir, "': cannot create the directory (", ec.message(),
                    "); name a directory for the plots");
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
