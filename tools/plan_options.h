// plan_options.h — the flags of build/bin/plan (tools/plan.cpp), parsed into PlanOptions, or a
// UsageError naming the flag. tools/plan_run.h turns them into a workload, a cluster and maybe one
// layout, and plans.
//
// The model, batch and layout flags are train's (tools/train_options.h: the same names, the same
// checks); the cluster flags are the planner's.
#pragma once
#include <cmath>
#include <optional>
#include <set>
#include <string>

#include "parallel/planner/planner.h"
#include "tools/train_options.h"

namespace sl {

struct PlanOptions {
  Options layout;  // train's layout flags land here (dp, zero, pp, tp, cp, schedule, ...)
  std::string model, cluster_file, links = "intra=300GB/s,1us;inter=25GB/s,5us";
  std::string gpu_memory = "80GB", flops = "312TFLOP/s", grad_reduce_dtype;
  int64_t n_layer = 0, n_head = 0, n_embd = 0, vocab_size = 0, block_size = 0;  // 0: the preset's
  int64_t batch_size = 0, seq_len = 0;  // 0: the world size (one row per GPU), the block size
  int64_t nodes = 0, gpus_per_node = 8, top = 20;  // nodes 0: the layout's world / gpus per node (search: 1)
  bool layout_given = false, json = false, help = false;
  std::set<std::string> cluster_flags;  // which cluster flags were given (they clash with --cluster)
};

inline const char* const kPlanUsage = R"(usage: plan [flags]
  --model PRESET            gpt2, gpt2-medium, gpt2-large, gpt2-xl, zero-7.5b, gpt3-175b, megatron-530b,
                            megatron-1t, llama-8b, llama-70b; or train's model flags:
  --n-layer N --n-embd N --n-head N --vocab-size N --block-size N   (each overrides the preset's)
  --batch-size N            global batch in rows (default: one row per GPU)
  --seq-len N               tokens per row, <= block size (default: the block size)
  --mixed-precision no|bf16|fp16  [--grad-reduce-dtype bf16|f32]   (default no: f32 everywhere)
  --recompute none|selective|full
  --cluster FILE.json       {"nodes", "gpus_per_node", "gpu_memory", "flops", "intra", "inter"}, or:
  --nodes N --gpus-per-node N (8) --gpu-memory 80GB --flops 312TFLOP/s
  --links "intra=300GB/s,1us;inter=25GB/s,5us"
  train's layout flags: --dp --zero --dp-replicate --dp-shard --pp --micro-batches --schedule
  --virtual-stages --tp --sp --cp --cp-balance --cp-variant --offload. Any of them (or --layout)
  evaluates that one layout; without them every layout is searched and ranked.
  --layout                  evaluate the layout the flags give (world = its product)
  --json                    every figure as JSON
  --top N                   layouts to show from a search (default 20; 0: all)
  --help
)";

// Train's layout flags (and --micro-batches): any of them makes the run a single-layout evaluation.
inline void add_plan_flags(FlagTable& flags, PlanOptions& o) {
  using flag::integer, flag::text, flag::choice;
  flags["--micro-batches"] = integer(o.layout.micro_batches, 1, 1 << 20);
  flags["--model"] = text(o.model);
  flags["--n-layer"] = integer(o.n_layer, 1, 1 << 20);
  flags["--n-head"] = integer(o.n_head, 1, 1 << 20);
  flags["--n-embd"] = integer(o.n_embd, 1, 1 << 20);
  flags["--vocab-size"] = integer(o.vocab_size, 1, 1 << 24);
  flags["--block-size"] = integer(o.block_size, 1, 1 << 24);
  flags["--batch-size"] = integer(o.batch_size, 1, int64_t{1} << 30);
  flags["--seq-len"] = integer(o.seq_len, 1, 1 << 24);
  flags["--mixed-precision"] = choice(o.layout.mixed_precision, {"no", "bf16", "fp16"});
  flags["--grad-reduce-dtype"] = choice(o.grad_reduce_dtype, {"bf16", "f32"});
  flags["--recompute"] = choice(o.layout.recompute, {"none", "selective", "full"});
  flags["--cluster"] = text(o.cluster_file);
  flags["--nodes"] = integer(o.nodes, 1, 1 << 20);
  flags["--gpus-per-node"] = integer(o.gpus_per_node, 1, 1 << 16);
  flags["--gpu-memory"] = text(o.gpu_memory);
  flags["--flops"] = text(o.flops);
  flags["--links"] = text(o.links);
  flags["--top"] = integer(o.top, 0);
}

inline PlanOptions parse_plan(int argc, char** argv) {
  PlanOptions o;
  FlagTable flags;
  add_layout_flags(flags, o.layout);
  std::set<std::string> layout_flags{"--micro-batches"};
  for (const auto& [name, parse] : flags) layout_flags.insert(name);
  add_plan_flags(flags, o);
  const std::set<std::string> cluster_flags{"--nodes", "--gpus-per-node", "--gpu-memory", "--flops", "--links"};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h" || flag == "--json" || flag == "--layout" || flag == "--sp" ||
        flag == "--offload") {
      (flag == "--json"      ? o.json
       : flag == "--sp"      ? o.layout.sp
       : flag == "--offload" ? o.layout.offload
       : flag == "--layout"  ? o.layout_given
                             : o.help) = true;
      o.layout_given |= flag == "--sp" || flag == "--offload";
      continue;
    }
    if (flag == "--stage-layers" || flag == "--trace")
      throw UsageError{flag + " is train's: the planner splits layers evenly and runs nothing"};
    auto it = flags.find(flag);
    if (it == flags.end()) throw UsageError{"unknown flag " + flag};
    if (i + 1 >= argc) throw UsageError{flag + " needs a value"};
    try {
      it->second(argv[++i]);
    } catch (const UsageError& e) {
      throw UsageError{flag + ": " + e.message};
    }
    o.layout_given |= layout_flags.count(flag) > 0;
    if (cluster_flags.count(flag)) o.cluster_flags.insert(flag);
  }
  if (o.layout.dp_shard > 0 && o.layout.dp_replicate == 0) o.layout.dp_replicate = 1;  // as train
  if (!o.cluster_file.empty() && !o.cluster_flags.empty())
    throw UsageError{"--cluster " + o.cluster_file + " describes the cluster: drop " + *o.cluster_flags.begin()};
  return o;
}

}  // namespace sl
