#include "perf/layout.hpp"

#include <cstdlib>
#include <sstream>

#include "core/error.hpp"
#include "parallel/pp/schedule.hpp"

namespace tessera {

const char* recompute_name(Recompute r) { return to_string(r); }

std::string to_string(const Layout& l) {
  std::ostringstream os;
  os << "dp=" << l.dp << " tp=" << l.tp << " pp=" << l.pp;
  if (l.vpp > 1) os << " v=" << l.vpp;
  if (l.cp > 1) os << " cp=" << l.cp;
  if (l.ep > 1) os << " ep=" << l.ep;
  os << " zero=" << l.zero;
  if (l.shard_group > 0) os << " hsdp=" << l.shard_group;
  os << " mb=" << l.micro_batch;
  if (l.seq_parallel) os << " sp=1";
  os << " rc=" << recompute_name(l.recompute);
  if (l.recompute == Recompute::full && l.recompute_layers > 0) os << ":" << l.recompute_layers;
  os << " prec=" << compute_type_name(l.precision);
  if (l.pp > 1) os << " sched=" << to_string(l.schedule);
  if (l.order != Layout::kDefaultRankOrder) os << " order=" << l.order;
  if (l.grad_bytes) os << " grad=" << (l.grad_bytes == 2 ? "bf16" : "fp32");
  return os.str();
}

Layout parse_layout(const std::string& text, Layout base) {
  Layout l = base;
  l.dp = 0;
  std::string s = text;
  for (char& c : s)
    if (c == ',' || c == ';') c = ' ';
  std::istringstream in(s);
  std::string item;
  auto integer = [&](const std::string& key, const std::string& v, int lo) {
    char* end = nullptr;
    const long x = std::strtol(v.c_str(), &end, 10);
    TESSERA_REQUIRE(!v.empty() && *end == '\0' && x >= lo && x <= (1 << 24), "layout '", text,
                    "': ", key, " = '", v, "' is not an integer >= ", lo);
    return int(x);
  };
  while (in >> item) {
    const size_t eq = item.find('=');
    TESSERA_REQUIRE(
        eq != std::string::npos, "layout '", text, "': '", item,
        "' is not key=value (keys: dp tp pp v cp ep zero hsdp mb sp rc prec sched order)");
    const std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    if (k == "dp")
      l.dp = integer(k, v, 1);
    else if (k == "tp")
      l.tp = integer(k, v, 1);
    else if (k == "pp")
      l.pp = integer(k, v, 1);
    else if (k == "v" || k == "vpp")
      l.vpp = integer(k, v, 1);
    else if (k == "cp")
      l.cp = integer(k, v, 1);
    else if (k == "ep")
      l.ep = integer(k, v, 1);
    else if (k == "zero")
      l.zero = integer(k, v, 0);
    else if (k == "hsdp" || k == "shard_group")
      l.shard_group = integer(k, v, 0);
    else if (k == "mb" || k == "micro_batch")
      l.micro_batch = integer(k, v, 1);
    else if (k == "sp")
      l.seq_parallel = integer(k, v, 0) != 0;
    else if (k == "order")
      l.order = v;
    else if (k == "rc" || k == "recompute") {
      l.recompute_layers = 0;
      if (v.rfind("full:", 0) == 0) {
        l.recompute = Recompute::full;
        l.recompute_layers = integer(k, v.substr(5), 1);
      } else if (v == "none")
        l.recompute = Recompute::none;
      else if (v == "selective")
        l.recompute = Recompute::selective;
      else if (v == "full")
        l.recompute = Recompute::full;
      else
        TESSERA_REQUIRE(false, "layout '", text, "': rc = '", v,
                        "' is not none, selective, full or full:N (N layers per stage)");
    } else if (k == "prec" || k == "precision") {
      l.precision = parse_compute_type(v);
    } else if (k == "grad") {
      TESSERA_REQUIRE(v == "bf16" || v == "fp32", "layout '", text, "': grad = '", v,
                      "' is not bf16 or fp32 (the dtype of data-parallel gradient reductions)");
      l.grad_bytes = v == "bf16" ? 2 : 4;
    } else if (k == "sched" || k == "schedule") {
      PipeSchedule s = PipeSchedule::one_f_one_b;
      try {
        s = parse_pipe_schedule(v);
      } catch (const Error&) {
        TESSERA_REQUIRE(false, "layout '", text, "': sched = '", v,
                        "' is not gpipe, 1f1b, zb-h1, zb-v or dualpipev");
      }
      // Interleaving is 1f1b with v > 1; the split-backward kinds stay themselves.
      l.schedule = s == PipeSchedule::interleaved ? PipeSchedule::one_f_one_b : s;
    } else {
      TESSERA_REQUIRE(false, "layout '", text, "': unknown key '", k,
                      "' (keys: dp tp pp v cp ep zero hsdp mb sp rc prec sched order grad)");
    }
  }
  TESSERA_REQUIRE(l.zero <= 3, "layout '", text, "': zero = ", l.zero, " is not a ZeRO stage 0-3");
  return l;
}

int64_t microbatches(const Workload& w, const Layout& l) {
  const int64_t per_replica = int64_t(l.dp) * l.micro_batch;
  if (per_replica <= 0 || w.global_batch % per_replica != 0) return 0;
  return w.global_batch / per_replica;
}

}  // namespace tessera
