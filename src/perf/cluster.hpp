// A cluster as the planner sees it: one kind of accelerator (peak FLOP/s per precision,
// memory capacity and bandwidth), nodes of several accelerators joined by a fast intra-node
// fabric (NVLink/NVSwitch, or shared memory on a CPU), nodes joined by a network, and
// optionally pods of nodes joined by a slower (oversubscribed) spine.
//
// Read from an INI file (inputs/clusters/*.in) with the keys of cluster_schema(); the keys,
// their units and meanings are in doc/cluster-file.md, generated from that table
// (`tessera-plan --cluster-reference`).
#pragma once

#include <string>
#include <vector>

#include "config/choices.hpp"
#include "core/schema.hpp"

namespace tessera {

// ComputeType (config/choices.hpp): the number formats the accelerator multiplies in.
const char* compute_type_name(ComputeType t);
ComputeType parse_compute_type(const std::string& s);  // throws Error on anything else

// A link class between two accelerators, as one collective's ring sees it.
struct Link {
  double bw = 0;          // bytes/s per accelerator, one direction, as a bandwidth test achieves
  double latency = 0;     // seconds per hop
  const char* name = "";  // "intra-node", "inter-node", "inter-pod"
};

struct Cluster {
  std::string name, accelerator, origin;
  int nodes = 0;  // nodes in the machine; 0: as many as asked for
  int per_node = 1;
  double peak_fp32 = 0, peak_bf16 = 0, peak_fp16 = 0, peak_fp8 = 0;  // FLOP/s per accelerator
  double memory = 0;                                                 // bytes per accelerator
  double memory_bw = 0;                                              // bytes/s per accelerator
  double reserved = 0;           // bytes per accelerator the runtime keeps (context, fragmentation)
  double gemm_efficiency = 0.7;  // fraction of peak a large GEMM reaches
  double gemm_half_dim = 128;    // GEMM dimension at which half of that is reached
  Link intra, inter, pod;
  int pod_nodes = 0;  // nodes per pod; 0: no pod level

  static Cluster from_file(const std::string& path);
  static Cluster from_text(const std::string& ini, const std::string& origin = "<text>");

  double peak(ComputeType t) const;  // throws Error when the file gives no peak for t
  // The slowest link a group of `size` accelerators whose members are `stride` ranks apart
  // crosses (ranks fill a node, then the next): within one node, within one pod, or across
  // pods.
  Link link(int size, int stride) const;
  std::string summary() const;  // one line for reports
};

// The cluster-file keys (section "cluster", "accelerator", "node", "network", "pod").
const std::vector<KeySpec>& cluster_schema();
std::string cluster_reference_markdown();

}  // namespace tessera
