#include "perf/cluster.hpp"

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "core/deck.hpp"
#include "core/error.hpp"

namespace po = boost::program_options;

namespace tessera {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

KeySpec real(const char* section, const char* key, const char* dflt, double lo, double hi,
             const char* help) {
  return {section, key, KeyType::real, dflt, false, lo, hi, {}, help};
}
KeySpec integer(const char* section, const char* key, const char* dflt, double lo, double hi,
                const char* help) {
  return {section, key, KeyType::integer, dflt, false, lo, hi, {}, help};
}
KeySpec text(const char* section, const char* key, const char* dflt, const char* help) {
  return {section, key, KeyType::string, dflt, false, 0, 0, {}, help};
}

std::vector<KeySpec> build() {
  return {
      text("cluster", "name", "unnamed", "Name shown in reports."),
      integer("cluster", "nodes", "0", 0, 1e7,
              "Nodes in the machine; 0: as many as a plan asks for. A plan for more "
              "accelerators than nodes x per-node is refused."),
      text("accelerator", "name", "accelerator", "Accelerator model, for reports."),
      real("accelerator", "peak_fp32_tflops", "0", 0, kInf,
           "Dense fp32 peak, TFLOP/s (the CPU: measured GEMM rate)."),
      real("accelerator", "peak_bf16_tflops", "0", 0, kInf,
           "Dense bf16 tensor-core peak, TFLOP/s; 0: not supported."),
      real("accelerator", "peak_fp16_tflops", "0", 0, kInf,
           "Dense fp16 tensor-core peak, TFLOP/s; 0: not supported."),
      real("accelerator", "peak_fp8_tflops", "0", 0, kInf,
           "Dense fp8 tensor-core peak, TFLOP/s; 0: not supported."),
      real("accelerator", "memory_gb", "80", 1e-6, kInf,
           "Memory per accelerator, GB (1e9 bytes; an 80 GiB part is 85.9)."),
      real("accelerator", "memory_bw_gbs", "2000", 1e-6, kInf,
           "Memory bandwidth per accelerator that streaming kernels reach, GB/s."),
      real("accelerator", "reserved_gb", "0", 0, kInf,
           "Memory per accelerator not available to the model (runtime context, library "
           "workspaces, allocator fragmentation), GB."),
      real("accelerator", "gemm_efficiency", "0.7", 1e-3, 1,
           "Fraction of peak a large GEMM of training shapes reaches (forward, data and "
           "weight gradients together)."),
      real("accelerator", "gemm_half_dim", "128", 0, kInf,
           "GEMM efficiency is gemm_efficiency x d / (d + gemm_half_dim) with d the "
           "smallest GEMM dimension."),
      integer("node", "accelerators", "8", 1, 1 << 20, "Accelerators per node."),
      real("node", "bw_gbs", "200", 1e-6, kInf,
           "Intra-node bandwidth per accelerator, GB/s, one direction, as an all-reduce's "
           "bus bandwidth reaches it (NVLink/NVSwitch; shared memory on a CPU)."),
      real("node", "latency_us", "5", 0, kInf, "Intra-node latency per message hop, us."),
      real("network", "bw_gbs", "25", 1e-6, kInf,
           "Inter-node bandwidth per accelerator, GB/s, one direction (NIC share of one "
           "accelerator as a bus-bandwidth test reaches it)."),
      real("network", "latency_us", "10", 0, kInf, "Inter-node latency per message hop, us."),
      integer("pod", "nodes", "0", 0, 1e7,
              "Nodes per pod (a full-bisection island); 0: no pod level, the network is "
              "non-blocking."),
      real("pod", "oversubscription", "1", 1, kInf,
           "Inter-pod bandwidth is network.bw_gbs divided by this."),
      real("pod", "latency_us", "15", 0, kInf, "Inter-pod latency per message hop, us."),
  };
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

double number(const KeySpec& k, const std::string& raw, const std::string& origin) {
  const std::string v = trim(raw);
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  TESSERA_REQUIRE(!v.empty() && *end == '\0' && std::isfinite(x), k.name(), " = '", v, "' (",
                  origin, ") is not a finite number; allowed: ", k.allowed());
  TESSERA_REQUIRE(x >= k.min && x <= k.max, k.name(), " = '", v, "' (", origin,
                  ") is out of range; allowed: ", k.allowed());
  TESSERA_REQUIRE(k.type != KeyType::integer || x == std::floor(x), k.name(), " = '", v, "' (",
                  origin, ") is not an integer; allowed: ", k.allowed());
  return x;
}

}  // namespace

const char* compute_type_name(ComputeType t) {
  switch (t) {
    case ComputeType::fp32:
      return "fp32";
    case ComputeType::bf16:
      return "bf16";
    case ComputeType::fp16:
      return "fp16";
    case ComputeType::fp8:
      return "fp8";
  }
  return "?";
}

ComputeType parse_compute_type(const std::string& s) {
  for (ComputeType t : {ComputeType::fp32, ComputeType::bf16, ComputeType::fp16, ComputeType::fp8})
    if (s == compute_type_name(t)) return t;
  TESSERA_REQUIRE(false, "precision '", s, "' is not one of fp32, bf16, fp16, fp8");
  return ComputeType::fp32;
}

const std::vector<KeySpec>& cluster_schema() {
  static const std::vector<KeySpec> schema = build();
  return schema;
}

Cluster Cluster::from_file(const std::string& path) {
  std::error_code ec;
  TESSERA_REQUIRE(!std::filesystem::is_directory(path, ec), "cluster file '", path,
                  "' is a directory; name a cluster file (inputs/clusters/*.in)");
  std::ifstream in(path);
  TESSERA_REQUIRE(in.good(), "cannot open cluster file '", path, "': no such file or not readable");
  std::stringstream text;
  text << in.rdbuf();
  return from_text(text.str(), path);
}

Cluster Cluster::from_text(const std::string& ini, const std::string& origin) {
  po::options_description desc;
  for (const KeySpec& k : cluster_schema())
    desc.add_options()(k.name().c_str(), po::value<std::vector<std::string>>());
  std::map<std::string, std::string> given;
  try {
    std::istringstream in(ini);
    const po::parsed_options parsed = po::parse_config_file(in, desc, true);
    for (const po::option& o : parsed.options) {
      if (o.unregistered) {
        std::string best;
        size_t best_d = SIZE_MAX;
        for (const KeySpec& k : cluster_schema())
          if (const size_t d = edit_distance(o.string_key, k.name()); d < best_d)
            best_d = d, best = k.name();
        TESSERA_REQUIRE(false, "unknown cluster key '", o.string_key, "' (", origin,
                        "); did you mean '", best, "'? doc/cluster-file.md lists every key");
      }
      for (const std::string& v : o.value) given[o.string_key] = v;
    }
  } catch (const po::error& e) {
    TESSERA_REQUIRE(false, "cannot parse cluster file '", origin, "': ", e.what());
  }
  auto value = [&](const std::string& name) {
    for (const KeySpec& k : cluster_schema())
      if (k.name() == name) {
        auto it = given.find(name);
        return it == given.end() ? k.default_value : it->second;
      }
    throw std::logic_error("cluster key not in schema: " + name);
  };
  auto num = [&](const std::string& name) {
    for (const KeySpec& k : cluster_schema())
      if (k.name() == name) return number(k, value(name), origin);
    throw std::logic_error("cluster key not in schema: " + name);
  };
  Cluster c;
  c.origin = origin;
  c.name = trim(value("cluster.name"));
  c.accelerator = trim(value("accelerator.name"));
  c.nodes = int(num("cluster.nodes"));
  c.per_node = int(num("node.accelerators"));
  c.peak_fp32 = num("accelerator.peak_fp32_tflops") * 1e12;
  c.peak_bf16 = num("accelerator.peak_bf16_tflops") * 1e12;
  c.peak_fp16 = num("accelerator.peak_fp16_tflops") * 1e12;
  c.peak_fp8 = num("accelerator.peak_fp8_tflops") * 1e12;
  c.memory = num("accelerator.memory_gb") * 1e9;
  c.memory_bw = num("accelerator.memory_bw_gbs") * 1e9;
  c.reserved = num("accelerator.reserved_gb") * 1e9;
  c.gemm_efficiency = num("accelerator.gemm_efficiency");
  c.gemm_half_dim = num("accelerator.gemm_half_dim");
  c.intra = {num("node.bw_gbs") * 1e9, num("node.latency_us") * 1e-6, "intra-node"};
  c.inter = {num("network.bw_gbs") * 1e9, num("network.latency_us") * 1e-6, "inter-node"};
  c.pod_nodes = int(num("pod.nodes"));
  c.pod = {c.inter.bw / num("pod.oversubscription"), num("pod.latency_us") * 1e-6, "inter-pod"};
  TESSERA_REQUIRE(c.peak_fp32 + c.peak_bf16 + c.peak_fp16 + c.peak_fp8 > 0, "cluster file '",
                  origin, "' gives no peak FLOP/s; set accelerator.peak_bf16_tflops or another");
  TESSERA_REQUIRE(c.reserved < c.memory, "accelerator.reserved_gb (", c.reserved / 1e9,
                  ") leaves no memory of accelerator.memory_gb (", c.memory / 1e9, ") in '", origin,
                  "'");
  return c;
}

double Cluster::peak(ComputeType t) const {
  const double p = t == ComputeType::fp32   ? peak_fp32
                   : t == ComputeType::bf16 ? peak_bf16
                   : t == ComputeType::fp16 ? peak_fp16
                                            : peak_fp8;
  TESSERA_REQUIRE(p > 0, "cluster '", name, "' (", origin, ") gives no ", compute_type_name(t),
                  " peak; choose another precision or set accelerator.peak_", compute_type_name(t),
                  "_tflops");
  return p;
}

Link Cluster::link(int size, int stride) const {
  // Members are stride ranks apart, so the group covers size x stride consecutive ranks;
  // groups are aligned to that extent (rank order fills a node first), so a group whose
  // extent fits in a node lies inside one.
  const double extent = double(size) * double(stride);
  if (size <= 1 || extent <= per_node) return intra;
  if (pod_nodes > 0 && extent > double(pod_nodes) * per_node) return pod;
  return inter;
}

std::string Cluster::summary() const {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s: %s x %d per node%s, %.0f GB at %.0f GB/s; node %.0f GB/s, network %.0f "
                "GB/s per accelerator%s",
                name.c_str(), accelerator.c_str(), per_node,
                nodes > 0 ? cat(", ", nodes, " nodes").c_str() : "", memory / 1e9, memory_bw / 1e9,
                intra.bw / 1e9, inter.bw / 1e9,
                pod_nodes > 0
                    ? cat(", pods of ", pod_nodes, " nodes at ", pod.bw / 1e9, " GB/s").c_str()
                    : "");
  return buf;
}

std::string cluster_reference_markdown() {
  std::ostringstream os;
  os << "# Cluster file reference\n\n"
        "<!-- Generated by `tessera-plan --cluster-reference`; do not edit. A test fails when "
        "this file is stale: regenerate with `build/tessera-plan --cluster-reference > "
        "doc/cluster-file.md`. -->\n\n"
        "`tessera-plan --cluster FILE` reads a cluster description: an INI file of "
        "`[section]` headers and `key = value` lines (`#` starts a comment), the same format "
        "as an input deck. Unknown keys and out-of-range values are errors. Examples are in "
        "`inputs/clusters/`; how the planner uses each number is in doc/planning.md.\n";
  std::string section;
  for (const KeySpec& k : cluster_schema()) {
    if (k.section != section) {
      section = k.section;
      os << "\n## [" << section
         << "]\n\n| key | default | allowed | meaning |\n|---|---|---|---|\n";
    }
    os << "| `" << k.key << "` | `" << k.default_value << "` | " << k.allowed() << " | " << k.help
       << " |\n";
  }
  return os.str();
}

}  // namespace tessera
