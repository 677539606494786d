// cluster.h — the machine a plan is for: nodes of GPUs, each with its memory and FLOP/s, and the
// links between them (comm/topology.h: intra-node and inter-node, latency + bytes / bandwidth).
//
//   {"nodes": 128, "gpus_per_node": 8, "gpu_memory": "80GB", "flops": "312TFLOP/s",
//    "intra": {"bandwidth": "300GB/s", "latency": "1us"},
//    "inter": {"bandwidth": "25GB/s", "latency": "5us"}}
//
//   flops is what one GPU achieves on the model's matmuls, not its datasheet peak: the planner's step
//   time is FLOPs / flops, so a peak gives the best case (Narayanan et al. reach 44-52% of A100 peak).
#pragma once
#include <string>

#include "parallel/comm/topology.h"

namespace sl::parallel::planner {

struct Cluster {
  int nodes = 1;
  Topology topology;            // gpus_per_node and the two links
  double gpu_memory_bytes = 0;  // per GPU
  double flops = 0;             // FLOP/s one GPU achieves

  int gpus_per_node() const { return topology.gpus_per_node; }
  int world() const { return nodes * topology.gpus_per_node; }
  // Throws sl::Error naming the value unless nodes, GPUs per node, memory and FLOP/s are > 0.
  void validate() const;
  std::string str() const;  // "128 nodes x 8 GPUs, 80 GB, 312 TFLOP/s; intra 300 GB/s, 1 us; inter 25 GB/s, 5 us"

  // The JSON above (Topology's keys plus nodes, gpu_memory, flops); `where` names the source in errors.
  static Cluster from_json_text(const std::string& text, const std::string& where = "cluster");
  static Cluster load(const std::string& path);
};

}  // namespace sl::parallel::planner
