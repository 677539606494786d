// train_options.h — what a training run is asked to do: the task, the model, the optimizer, the
// layout (data parallelism, ZeRO/FSDP, the pipeline, tensor and context parallelism), mixed
// precision, checkpoints and outputs, as plain values with the checks that need more than one of them.
//
// build/bin/train fills a TrainOptions from its flags or a TOML file (tools/train_cli.h binds each
// flag to a field and checks each value's range); build/bin/plan fills the layout fields from the
// same flags. validate() then refuses what cannot go together, naming the flags:
//
//   TrainOptions o;
//   o.sp = true;
//   o.validate();   // OptionError: "--sp shards the sequence over the tensor-parallel ranks: add --tp N"
//
// The rules that need the model's shapes (heads over tp, tokens over cp) or which strategy runs over
// which cut are the TrainPlan's (train_plan.h) and the factory's, checked before the ranks start.
#pragma once
#include <cstdint>
#include <string>

#include "parallel/comm/topology.h"
#include "parallel/data_parallel/comm_hook.h"
#include "tensor/error.h"

namespace sl::parallel {

// A combination of options that cannot run (a usage error: the program exits 2, not 1).
class OptionError : public Error {
 public:
  using Error::Error;
};

struct TrainOptions {
  // The task and its data.
  std::string task = "addition";  // addition | text | bin
  std::string data;
  int64_t vocab_size = 0;  // 0: from the data (256 for addition and text)
  int64_t digits = 2;
  // The model.
  int64_t n_layer = 2, n_head = 4, n_embd = 128, block_size = 0;  // block 0: one line (addition), 64 otherwise
  double dropout = 0.0;
  std::string recompute = "none";  // activation recomputation (nn::Recompute)
  // A mixture of experts in place of the MLP (nn/moe.h; nn::GPTConfig's moe_ fields): serial, or
  // with --ep (over DDP, ZeRO or FSDP, with --tp, --pp and --cp).
  int64_t moe_experts = 0, moe_top_k = 2, moe_every = 1;
  double moe_capacity_factor = 0, moe_aux_weight = 0.01, moe_z_weight = 0.001;
  std::string moe_router = "topk-softmax";
  std::string init_from;
  // The optimizer and the schedule.
  int64_t batch_size = 128, steps = 1500, micro_batches = 1, warmup_steps = 100, eval_every = 500;
  double lr = 3e-3, min_lr = 3e-4, weight_decay = 0.1, grad_clip = 1.0, adam_eps = 1e-8;
  double min_accuracy = 0;  // percent: the run fails below it (addition's held-out accuracy)
  uint64_t seed = 1337;
  std::string device = "cpu";
  int64_t threads = 2;
  // Mixed precision (nn/mixed_precision.h); empty: the mode's defaults.
  std::string mixed_precision = "no", grad_reduce_dtype, loss_scale;
  // Data parallelism: ranks are threads, or processes under mpirun.
  int64_t dp = 1, zero = 0, dp_replicate = 0, dp_shard = 0;
  bool offload = false, naive_dp = false, compare_serial = false;
  // The chapters that cut the model (alone or together, with data parallelism over the dp ranks).
  int64_t pp = 1, virtual_stages = 1, tp = 1, cp = 1, ulysses_degree = 0;
  // Expert parallelism (parallel/expert_parallel): a mixture of experts' experts over ep ranks, which
  // read other rows as data-parallel ranks do (world = dp x ep x ...).
  int64_t ep = 1;
  std::string schedule = "1f1b", stage_layers, cp_balance = "zigzag", cp_variant = "ring", trace;
  bool sp = false;
  // Simulated links on the threads backend (parallel/comm/topology.h).
  Topology topology;
  // Distributed checkpoints (parallel/checkpoint): ROOT/step-N every save_every steps and at the end.
  std::string checkpoint_dir, resume, save;
  int64_t save_every = 0, keep_last = 0;
  // Outputs.
  std::string log_jsonl, report_json;
  bool profile = false;
  // Set by a program, no flag: DDP's buckets reduced by this hook instead of the built-in all-reduce
  // (parallel/data_parallel/comm_hook.h), in every layout that runs DDP (find_divergence's too).
  CommHookFactory ddp_comm_hook = {};

  int64_t data_parallel() const { return dp_replicate > 0 ? dp_replicate * dp_shard : dp; }
  int64_t world() const { return data_parallel() * ep * pp * tp * cp; }
  bool cuts_model() const { return pp > 1 || tp > 1 || cp > 1; }
  bool parallel() const { return world() > 1 || zero > 0 || naive_dp || dp_replicate > 0; }

  // dp_shard S alone is FSDP over S: HSDP with one replica. Called once the values are read.
  void resolve();
  // OptionError naming the flags when the options cannot go together (resolve() first).
  void validate() const;
};

// The task, model, precision and checkpoint options against each other.
void check_run_options(const TrainOptions& o);
// The layout: data parallelism, ZeRO, the cuts and their chapters' options, the batch over the ranks.
void check_layout_options(const TrainOptions& o);
// --device cuda with ranks: the layouts with host code on their path are refused, naming why.
void check_cuda_layout(const TrainOptions& o);

// --device cuda with ranks, at run time (before any rank starts): rank r on cuda:r over NCCL when
// every rank has a GPU of its own and NCCL is built; otherwise thread ranks share the GPUs.
// `gpus`: the GPUs this process sees, or the world under mpirun.
bool cuda_ranks_over_nccl(const TrainOptions& o, bool nccl_built, int gpus);
// Why --device cuda's ranks cannot run ("" when they can); `why_none`: what CUDA said when it found none.
std::string cuda_ranks_refusal(const TrainOptions& o, bool nccl_built, int gpus, const std::string& why_none = "",
                               bool under_mpirun = false);

}  // namespace sl::parallel
