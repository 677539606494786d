// plan_options.h — what build/bin/plan is asked: a model (a preset, or train's model flags over it),
// a batch, a cluster (a JSON file, or nodes, GPUs, memory, FLOP/s and links), and maybe one layout to
// evaluate (train's layout options: the same names, the same checks) instead of a search of them all.
//
// tools/plan_cli.h fills it from the command line; plan_request.h turns it into a workload, a
// cluster and maybe a TrainPlan, and plans. validate() refuses what cannot go together.
#pragma once
#include <cstdint>
#include <set>
#include <string>

#include "parallel/train/train_options.h"

namespace sl::parallel::planner {

struct PlanOptions {
  TrainOptions layout;  // train's layout options (dp, zero, pp, tp, cp, schedule, micro_batches, ...)
  std::string model, cluster_file, links = "intra=300GB/s,1us;inter=25GB/s,5us";
  std::string gpu_memory = "80GB", flops = "312TFLOP/s", grad_reduce_dtype;
  int64_t n_layer = 0, n_head = 0, n_embd = 0, vocab_size = 0, block_size = 0;  // 0: the preset's
  int64_t batch_size = 0, seq_len = 0;  // 0: the world size (one row per GPU), the block size
  int64_t nodes = 0, gpus_per_node = 8, top = 20;  // nodes 0: the layout's world / gpus per node (search: 1)
  bool layout_given = false, json = false;
  std::set<std::string> cluster_flags;  // which cluster flags were given (they clash with --cluster)

  // The cluster comes from --cluster or from its flags, not both (OptionError naming them).
  void validate() const {
    if (!cluster_file.empty() && !cluster_flags.empty())
      throw OptionError("--cluster " + cluster_file + " describes the cluster: drop " + *cluster_flags.begin());
  }
};

}  // namespace sl::parallel::planner
