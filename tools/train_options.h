// train_options.h — the flags of build/bin/train (tools/train.cpp): parsed into Options, or a
// UsageError naming the flag.
#pragma once
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "nn/mixed_precision.h"
#include "parallel/comm/topology.h"

namespace sl {

struct Options {
  std::string task = "addition", data, device = "cpu", init_from, save, log_jsonl, report_json;
  // Distributed checkpoints (parallel/checkpoint): ROOT/step-N every --save-every steps and at the end.
  std::string checkpoint_dir, resume;
  int64_t save_every = 0, keep_last = 0;
  double dropout = 0.0;
  std::string recompute = "none";  // activation recomputation (nn::Recompute)
  // Mixed precision (nn/mixed_precision.h); empty: the mode's defaults.
  std::string mixed_precision = "no", grad_reduce_dtype, loss_scale;
  int64_t vocab_size = 0;  // 0: from the data (256 for addition and text)
  int64_t n_layer = 2, n_head = 4, n_embd = 128, block_size = 0 /* auto */, batch_size = 128, steps = 1500;
  int64_t warmup_steps = 100, eval_every = 500, digits = 2, threads = 2, micro_batches = 1;
  double lr = 3e-3, min_lr = 3e-4, weight_decay = 0.1, grad_clip = 1.0, adam_eps = 1e-8;
  double min_accuracy = 0;  // percent: the run fails below it (addition's held-out accuracy)
  uint64_t seed = 1337;
  bool profile = false, help = false;
  // Data parallelism (parallel/train/trainer.h): ranks are threads, or processes under mpirun.
  int64_t dp = 1, zero = 0, dp_replicate = 0, dp_shard = 0;
  bool offload = false, naive_dp = false, compare_serial = false;
  // The chapters that cut the model (alone or together, with data parallelism over --dp ranks).
  int64_t pp = 1, virtual_stages = 1, tp = 1, cp = 1, ulysses_degree = 0;
  std::string schedule = "1f1b", stage_layers, cp_balance = "zigzag", cp_variant = "ring", trace;
  // Simulated links on the threads backend (parallel/comm/topology.h): --links SPEC or --topology FILE.
  parallel::Topology topology;
  bool sp = false;
  int64_t data_parallel() const { return dp_replicate > 0 ? dp_replicate * dp_shard : dp; }
  int64_t world() const { return data_parallel() * pp * tp * cp; }
  bool cuts_model() const { return pp > 1 || tp > 1 || cp > 1; }
  bool parallel() const { return world() > 1 || zero > 0 || naive_dp || dp_replicate > 0; }
};

inline const char* const kUsage = R"(usage: train [flags]
  --task addition|text|bin  what to learn (default addition: "a+b=c" lines, held-out accuracy)
  --data PATH               the text file (text) or uint16 token file (bin)
  --vocab-size N            vocabulary, 1..65536 (bin only; addition and text use bytes: 256)
  --digits N                operand digits for addition, 1..4 (default 2)
  --n-layer N --n-head N --n-embd N                      the model (default 2, 4, 128)
  --recompute none|selective|full   activation recomputation: rerun each block's attention core
                            (selective) or whole forward (full) during backward instead of keeping
                            its activations; the same gradients, bitwise (default none)
  --mixed-precision no|bf16|fp16   16-bit weights and activations, f32 master weights and moments
                            in the optimizer; matmuls accumulate, softmax, LayerNorm and the loss
                            compute in f32 (default no)
  --grad-reduce-dtype bf16|f32   how gradients accumulate over micro-batches and are reduced
                            (bf16: 2 + 2 + 12 bytes per parameter; f32: Megatron's main_grad,
                            2 + 4 + 12; default bf16 for bf16, f32 for fp16)
  --loss-scale dynamic|N    fp16 loss scaling (GradScaler: 2^16, x2 per 2000 clean steps, x0.5
                            and the step skipped on inf/NaN; default dynamic for fp16, off for bf16)
  --block-size N            context length (default: one line for addition, 64 otherwise)
  --batch-size N --steps N  default 128, 1500 (the global batch: rows over every rank and micro-batch)
  --micro-batches M         gradient accumulation: each rank's rows in M backward passes, one
                            optimizer step (default 1); the same loss and update as M = 1
  --lr X --min-lr X --warmup-steps N                     warm-up then cosine decay (3e-3 -> 3e-4, 100)
  --weight-decay X          AdamW decay on matrices (default 0.1)
  --adam-eps X              AdamW's epsilon, > 0 (default 1e-8)
  --grad-clip X             clip the global gradient norm (default 1.0; 0 turns it off)
  --seed N                  model init and data order (default 1337)
  --init-from PATH          load weights (safetensors, strict by name) before training; any layout
  --save PATH               save weights (safetensors, the serial model's names) at the end, from any
                            layout; --steps 0 saves the initial weights. Checked writable before step 0
  --log-jsonl PATH          one JSON object per optimizer step
  --eval-every N            held-out accuracy every N steps (addition; default 500; 0: only at the end)
  --device cpu|cuda         default cpu. With ranks, cuda runs rank r on GPU cuda:r over NCCL (one
                            rank per GPU: world <= GPUs visible): DDP, --pp, --tp, --cp; ZeRO, FSDP,
                            HSDP, --naive-dp and --links run on CPU ranks only
  --threads N               GEMM threads (default 2)
  --profile                 print time per op kind: forward, backward, optimizer (serial runs only)
  --dp N                    data-parallel ranks (threads; under mpirun: the processes), default 1
  --zero 0|1|2|3            0: DDP (default), 1/2: ZeRO optimizer (and gradient) sharding, 3: FSDP
  --dp-replicate R --dp-shard S   HSDP: FSDP within S ranks, replicated R times (world R x S);
                            --dp-shard S alone: FSDP over S (as --dp S --zero 3). Over a pp, tp or
                            cp cut FSDP shards each rank's part over dp_shard x cp
  --offload                 ZeRO-1/2/3: optimizer state and update on the host
  --naive-dp                the classic DataParallel (rank 0 scatters, gathers and steps)
  --pp N                    pipeline stages (world = dp x pp x tp x cp; pp, tp and cp combine)
  --schedule naive|gpipe|1f1b|interleaved|zero-bubble   the pipeline schedule (default 1f1b)
  --virtual-stages V        interleaved: model chunks per stage (default 1)
  --stage-layers a,b,...    layers per stage (default: balanced by count)
  --trace FILE.svg|FILE.json   the pipeline's timeline: an SVG picture or a Chrome trace (Perfetto)
  --tp N [--sp]             Megatron tensor parallelism over N ranks; --sp adds sequence parallelism
  --cp N                    context parallelism: the sequence over N ranks (ring attention)
  --cp-balance zigzag|none  the causal load balance (default zigzag)
  --cp-variant ring|allgather|ulysses|hybrid   pass K/V around a ring, gather them all, all-to-all
                            to a head cut (Ulysses: n_head % (cp x tp) == 0), or Ulysses inside and
                            the ring across (default ring)
  --ulysses-degree U        hybrid: U Ulysses ranks per ring position, cp = U x R
  --compare-serial          also train the serial model and report the largest difference
  --min-accuracy P          addition: exit 1 when the final held-out accuracy is below P percent
  --checkpoint-dir DIR      save a distributed checkpoint DIR/step-N (every rank its own shards, then
                            metadata.json) at the end of the run, and every --save-every N steps;
                            --keep-last K keeps only the newest K (build/bin/checkpoint reads them).
                            Created and checked writable before step 0
  --resume DIR              continue from the newest complete checkpoint in DIR (or DIR itself), under
                            any layout: weights, AdamW's state, the step, the data's position, the loss
                            scale and (same world size) the ranks' random generators
  --dropout P               dropout probability in attention and the MLP (default 0)
  --report-json PATH        per rank: mesh coordinates, memory by category, bytes and calls per group
                            and op, compute/communication/idle time (README: "The run report")
  --links SPEC              simulate a cluster's links on the thread ranks: every message waits
                            latency + bytes/bandwidth of its link, e.g.
                            'intra=300GB/s,1us;inter=25GB/s,5us;gpus-per-node=4' (ranks fill nodes in order)
  --topology FILE.json      the same from a file: {"gpus_per_node": 4, "intra": {"bandwidth": "300GB/s",
                            "latency": "1us"}, "inter": {...}}
  --help
)";

struct UsageError {
  std::string message;
};

// The parsers a flag is made of: each checks its value and names what it expected.
namespace flag {
inline std::function<void(const std::string&)> integer(int64_t& slot, int64_t minimum,
                                                       int64_t maximum = std::numeric_limits<int64_t>::max()) {
  return [&slot, minimum, maximum](const std::string& v) {
    size_t used = 0;
    long long parsed = 0;
    try {
      parsed = std::stoll(v, &used);
    } catch (...) {
      used = 0;
    }
    if (used != v.size() || v.empty() || parsed < minimum || parsed > maximum)
      throw UsageError{"expected an integer " +
                       (maximum == std::numeric_limits<int64_t>::max()
                            ? ">= " + std::to_string(minimum)
                            : "in " + std::to_string(minimum) + ".." + std::to_string(maximum)) +
                       ", got '" + v + "'"};
    slot = parsed;
  };
}
inline std::function<void(const std::string&)> real(double& slot, double minimum) {
  return [&slot, minimum](const std::string& v) {
    size_t used = 0;
    double parsed = 0;
    try {
      parsed = std::stod(v, &used);
    } catch (...) {
      used = 0;
    }
    if (used != v.size() || v.empty() || !std::isfinite(parsed) || parsed < minimum)
      throw UsageError{"expected a number >= " + std::to_string(minimum) + ", got '" + v + "'"};
    slot = parsed;
  };
}
inline std::function<void(const std::string&)> text(std::string& slot) {
  return [&slot](const std::string& v) { slot = v; };
}
inline std::function<void(const std::string&)> choice(std::string& slot, std::vector<std::string> allowed) {
  return [&slot, allowed](const std::string& v) {
    std::string names;
    for (const std::string& a : allowed) {
      if (v == a) {
        slot = v;
        return;
      }
      names += (names.empty() ? "" : ", ") + a;
    }
    throw UsageError{"expected one of " + names + ", got '" + v + "'"};
  };
}
}  // namespace flag

using FlagTable = std::map<std::string, std::function<void(const std::string&)>>;

// The task, model, optimizer and file flags.
inline void add_run_flags(FlagTable& flags, Options& o, int64_t& seed) {
  using flag::integer, flag::real, flag::text, flag::choice;
  flags["--task"] = [&](const std::string& v) {
    if (v != "addition" && v != "text" && v != "bin")
      throw UsageError{"expected addition, text or bin, got '" + v + "'"};
    o.task = v;
  };
  flags["--device"] = [&](const std::string& v) {
    if (v != "cpu" && v != "cuda") throw UsageError{"expected cpu or cuda, got '" + v + "'"};
    o.device = v;
  };
  flags["--data"] = text(o.data);
  flags["--init-from"] = text(o.init_from);
  flags["--recompute"] = choice(o.recompute, {"none", "selective", "full"});
  flags["--mixed-precision"] = choice(o.mixed_precision, {"no", "bf16", "fp16"});
  flags["--grad-reduce-dtype"] = choice(o.grad_reduce_dtype, {"bf16", "f32"});
  flags["--loss-scale"] = text(o.loss_scale);
  flags["--save"] = text(o.save);
  flags["--log-jsonl"] = text(o.log_jsonl);
  flags["--checkpoint-dir"] = text(o.checkpoint_dir);
  flags["--resume"] = text(o.resume);
  flags["--save-every"] = integer(o.save_every, 1);
  flags["--keep-last"] = integer(o.keep_last, 1, 1 << 20);
  flags["--dropout"] = [&](const std::string& v) {
    real(o.dropout, 0)(v);
    if (o.dropout >= 1) throw UsageError{"expected a probability in [0, 1), got '" + v + "'"};
  };
  flags["--report-json"] = text(o.report_json);
  flags["--micro-batches"] = integer(o.micro_batches, 1, 1 << 20);
  flags["--vocab-size"] = integer(o.vocab_size, 1, 65536);  // bin tokens are uint16
  flags["--digits"] = integer(o.digits, 1, 4);              // AdditionTask's operands fit 4 digits
  flags["--n-layer"] = integer(o.n_layer, 1);
  flags["--n-head"] = integer(o.n_head, 1);
  flags["--n-embd"] = integer(o.n_embd, 1);
  flags["--block-size"] = integer(o.block_size, 1);  // 0 (the default) is resolved in train()
  flags["--batch-size"] = integer(o.batch_size, 1);
  flags["--steps"] = integer(o.steps, 0);
  flags["--warmup-steps"] = integer(o.warmup_steps, 0);
  flags["--eval-every"] = integer(o.eval_every, 0);
  flags["--threads"] = integer(o.threads, 1, 1024);
  flags["--seed"] = integer(seed, 0);
  flags["--lr"] = real(o.lr, 0);
  flags["--min-lr"] = real(o.min_lr, 0);
  flags["--weight-decay"] = real(o.weight_decay, 0);
  flags["--grad-clip"] = real(o.grad_clip, 0);
  flags["--min-accuracy"] = [&](const std::string& v) {
    real(o.min_accuracy, 0)(v);
    if (o.min_accuracy > 100) throw UsageError{"expected a percentage in 0..100, got '" + v + "'"};
  };
  flags["--adam-eps"] = [&](const std::string& v) {
    // Adam divides by sqrt(v) + eps: 0 would turn a parameter with no gradient into 0/0.
    const UsageError positive{"expected a number > 0, got '" + v + "'"};
    try {
      real(o.adam_eps, 0)(v);
    } catch (const UsageError&) {
      throw positive;
    }
    if (o.adam_eps <= 0) throw positive;
  };
  // Simulated links are the run's, not the layout's (the planner reads train's layout flags).
  flags["--links"] = [&](const std::string& v) {
    try {
      o.topology = parallel::Topology::parse_links(v);
    } catch (const Error& e) {
      throw UsageError{e.what()};
    }
  };
  flags["--topology"] = [&](const std::string& v) {
    try {
      o.topology = parallel::Topology::load(v);
    } catch (const Error& e) {
      throw UsageError{e.what()};
    }
  };
}

// The layout flags: data parallelism, ZeRO, the cuts and their chapters' options.
inline void add_layout_flags(FlagTable& flags, Options& o) {
  using flag::integer, flag::real, flag::text, flag::choice;
  flags["--dp"] = integer(o.dp, 1, 1024);
  flags["--zero"] = [&](const std::string& v) {
    if (v != "0" && v != "1" && v != "2" && v != "3") throw UsageError{"expected 0, 1, 2 or 3, got '" + v + "'"};
    o.zero = std::stoll(v);
  };
  flags["--dp-replicate"] = integer(o.dp_replicate, 1, 1024);
  flags["--pp"] = integer(o.pp, 1, 1024);
  flags["--tp"] = integer(o.tp, 1, 1024);
  flags["--cp"] = integer(o.cp, 1, 1024);
  flags["--virtual-stages"] = integer(o.virtual_stages, 1, 1024);
  flags["--schedule"] = choice(o.schedule, {"naive", "gpipe", "1f1b", "interleaved", "zero-bubble"});
  flags["--cp-balance"] = choice(o.cp_balance, {"zigzag", "none"});
  flags["--cp-variant"] = choice(o.cp_variant, {"ring", "allgather", "ulysses", "hybrid"});
  flags["--ulysses-degree"] = integer(o.ulysses_degree, 1, 1024);
  flags["--stage-layers"] = [&](const std::string& v) {
    for (char ch : v)
      if (!(std::isdigit(static_cast<unsigned char>(ch)) || ch == ','))
        throw UsageError{"expected layer counts like 2,1,1, got '" + v + "'"};
    if (v.empty() || v.front() == ',' || v.back() == ',' || v.find(",,") != std::string::npos)
      throw UsageError{"expected layer counts like 2,1,1, got '" + v + "'"};
    size_t begin = 0;  // each count in 1..1048576, so it converts without overflow
    while (begin < v.size()) {
      const size_t end = std::min(v.find(',', begin), v.size());
      const std::string count = v.substr(begin, end - begin);
      if (count.size() > 7 || std::stoll(count) < 1 || std::stoll(count) > (1 << 20))
        throw UsageError{"expected layer counts in 1..1048576 like 2,1,1, got '" + v + "'"};
      begin = end + 1;
    }
    o.stage_layers = v;
  };
  flags["--trace"] = [&](const std::string& v) {
    auto ends = [&](const std::string& suffix) {
      return v.size() > suffix.size() && v.compare(v.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (!ends(".svg") && !ends(".json")) throw UsageError{"expected a FILE.svg or FILE.json, got '" + v + "'"};
    o.trace = v;
  };
  flags["--dp-shard"] = integer(o.dp_shard, 1, 1024);
}

// What the task and the model need of each other.
inline void check_run_flags(const Options& o) {
  if ((o.task == "text" || o.task == "bin") && o.data.empty())
    throw UsageError{"--task " + o.task + " needs --data PATH"};
  if (o.task == "bin" && o.vocab_size == 0) throw UsageError{"--task bin needs --vocab-size N"};
  if (o.min_accuracy > 0 && o.task != "addition")
    throw UsageError{"--min-accuracy checks the addition task's held-out accuracy; --task is " + o.task};
  if (o.task != "bin" && o.vocab_size != 0)
    throw UsageError{"--vocab-size is for --task bin only (" + o.task + " uses bytes: 256)"};
  if (o.n_embd % o.n_head != 0)
    throw UsageError{"--n-embd (" + std::to_string(o.n_embd) + ") must be divisible by --n-head (" +
                     std::to_string(o.n_head) + ")"};
  try {
    nn::MixedPrecision::parse(o.mixed_precision, o.grad_reduce_dtype, o.loss_scale);
  } catch (const Error& e) {
    throw UsageError{e.what()};
  }
  if ((o.save_every > 0 || o.keep_last > 0) && o.checkpoint_dir.empty())
    throw UsageError{"--save-every and --keep-last write checkpoints: add --checkpoint-dir DIR"};
  if (!o.resume.empty() && o.compare_serial)
    throw UsageError{"--resume continues a run from its checkpoint; --compare-serial would start the serial one "
                     "from the seed: compare the logs of two runs instead"};
}

// --device cuda with ranks: rank r runs on GPU cuda:r over NCCL, one rank per GPU (NCCL cannot put
// two ranks of one communicator on one GPU). What runs there is what uses only the engine's ops,
// collectives and send/recv on the rank's GPU: DDP (--zero 0), the pipeline, and the cuts of --tp
// and --cp (their vocabulary-parallel loss and attention block need CUDA paths of their own). The
// rest keeps host code on its path and is refused here, naming why; the GPU count and NCCL itself
// are checked by cuda_ranks_refusal() before any rank starts.
inline void check_cuda_layout(const Options& o) {
  if (o.device != "cuda" || !o.parallel()) return;
  if (o.zero == 1 || o.zero == 2)
    throw UsageError{"--device cuda: --zero " + std::to_string(o.zero) +
                     " (ZeRO) builds its flat buffers and steps its sharded AdamW in host code (parallel/zero), "
                     "which reads CPU memory only; use --zero 0 (DDP) on the GPU, or --device cpu"};
  if (o.zero == 3 || o.dp_replicate > 0)
    throw UsageError{"--device cuda: FSDP and HSDP (--zero 3, --dp-replicate/--dp-shard) build their flat units and "
                     "step their sharded AdamW in host code (parallel/zero), which reads CPU memory only; use --zero 0 "
                     "(DDP) on the GPU, or --device cpu"};
  if (o.naive_dp)
    throw UsageError{"--device cuda: --naive-dp packs the scattered batches and gathered logits through host "
                     "buffers on rank 0 (parallel/data_parallel/naive_data_parallel.cpp); use --device cpu"};
  if (o.topology.enabled())
    throw UsageError{"--device cuda: --links and --topology simulate links between thread ranks (the threads "
                     "backend); NCCL's links are real: drop them, or use --device cpu"};
}

// --device cuda with ranks, at run time (tools/train.cpp, before any rank starts). Every rank with a
// GPU of its own and NCCL built: rank r on cuda:r over NCCL. Otherwise thread ranks on cuda:(r mod
// GPUs), sharing them, their collectives staged through host memory (parallel/comm/backends/
// host_staging.h): the same result, slower. Under mpirun (one process per GPU) NCCL is the only way.
// `nccl_built`: this build has the NCCL backend; `gpus`: the GPUs this process sees (cuda_info()), or
// the world under mpirun; `why_none` what CUDA said when it found none.
inline bool cuda_ranks_over_nccl(const Options& o, bool nccl_built, int gpus) {
  return nccl_built && gpus >= o.world();
}

// Why --device cuda's ranks cannot run ("" when they can).
inline std::string cuda_ranks_refusal(const Options& o, bool nccl_built, int gpus, const std::string& why_none = "",
                                      bool under_mpirun = false) {
  if (o.device != "cuda" || !o.parallel()) return "";
  const std::string world = std::to_string(o.world());
  if (under_mpirun && !nccl_built)
    return "--device cuda under mpirun runs one process per GPU over NCCL, but this build has no NCCL backend (the "
           "Makefile builds it with CUDA when nccl.h is found); use --device cpu";
  if (gpus > 0) return "";
  return "--device cuda: world " + world + " needs a GPU, and none is visible (no CUDA device" +
         (why_none.empty() ? "" : ": " + why_none) + "); use --device cpu for thread ranks";
}

// Layout flags that cannot go together, refused before any data is read.
inline void check_layout_flags(const Options& o) {
  if (o.dp_replicate > 0 && o.dp_shard == 0)
    throw UsageError{"--dp-replicate " + std::to_string(o.dp_replicate) +
                     " replicates FSDP's shards (HSDP): add --dp-shard S (plain replicas: --dp N)"};
  if (o.dp_replicate > 0 && o.dp > 1 && o.dp != o.data_parallel())
    throw UsageError{"--dp " + std::to_string(o.dp) + " != --dp-replicate " + std::to_string(o.dp_replicate) +
                     " x --dp-shard " + std::to_string(o.dp_shard)};
  if (o.pp == 1 && (o.schedule != "1f1b" || o.virtual_stages > 1 || !o.stage_layers.empty() || !o.trace.empty()))
    throw UsageError{"--schedule, --virtual-stages, --stage-layers and --trace are pipeline flags: add --pp N"};
  if (o.virtual_stages > 1 && o.schedule != "interleaved")
    throw UsageError{"--virtual-stages " + std::to_string(o.virtual_stages) + " needs --schedule interleaved"};
  if (o.sp && o.tp == 1) throw UsageError{"--sp shards the sequence over the tensor-parallel ranks: add --tp N"};
  if (o.cp == 1 && (o.cp_balance != "zigzag" || o.cp_variant != "ring"))
    throw UsageError{"--cp-balance and --cp-variant are context-parallel flags: add --cp N"};
  if (o.cp_variant == "hybrid" && o.ulysses_degree == 0)
    throw UsageError{"--cp-variant hybrid runs Ulysses inside groups of U ranks and the ring across: add "
                     "--ulysses-degree U (U divides --cp)"};
  if (o.ulysses_degree > 0 && o.cp_variant != "hybrid")
    throw UsageError{"--ulysses-degree is the hybrid's: add --cp-variant hybrid (plain Ulysses is --cp-variant "
                     "ulysses, with U = cp)"};
  // Which strategies run over which cuts (ZeRO-2 and pp, FSDP's schedules, offload over a cut) is
  // the TrainPlan's rule (parallel/train/train_plan.cpp), checked before the ranks start.
  if (o.cuts_model() && o.naive_dp)
    throw UsageError{"--naive-dp scatters whole-model batches from rank 0: it cannot be combined with --pp, --tp or --cp"};
  if (o.pp > 1 && o.virtual_stages > 1 && o.zero == 0 && o.data_parallel() > 1)
    throw UsageError{
        "--virtual-stages " + std::to_string(o.virtual_stages) + " with --dp " + std::to_string(o.data_parallel()) +
        ": DDP cannot all-reduce from an interleaved stage's last backward (it covers one chunk); add --zero 1"};
  // Global batch = micro-batch rows x micro-batches x dp_replicate x dp_shard (the pp, tp and cp
  // ranks of one replica share its rows).
  const int64_t ranks = o.parallel() ? o.data_parallel() : 1;
  const int64_t replicate = o.dp_replicate > 0 ? o.dp_replicate : o.zero == 0 ? ranks : 1;
  const int64_t shard = ranks / replicate;
  if (o.batch_size % (ranks * o.micro_batches) != 0)
    throw UsageError{"--batch-size " + std::to_string(o.batch_size) + " must be micro-batch rows x " +
                     std::to_string(o.micro_batches) + " micro-batches x dp_replicate " + std::to_string(replicate) +
                     " x dp_shard " + std::to_string(shard) + ", but " + std::to_string(o.batch_size) + " % " +
                     std::to_string(ranks * o.micro_batches) + " = " +
                     std::to_string(o.batch_size % (ranks * o.micro_batches))};
  if (o.naive_dp && o.micro_batches > 1)
    throw UsageError{"--naive-dp scatters one batch per step: it cannot be combined with --micro-batches"};
  // The profiler counts per thread, and the ranks are threads: rank 0's table would miss the rest.
  if (o.parallel() && o.profile)
    throw UsageError{
        "--profile times the serial run's ops; drop --dp, --zero, --dp-replicate/--dp-shard, --naive-dp, --pp, --tp "
        "and --cp"};
  // Combinations that would otherwise be ignored silently or refused only after the data is read.
  if (o.offload && o.zero == 0) throw UsageError{"--offload moves ZeRO's optimizer to the host: add --zero 1, 2 or 3"};
  if (o.naive_dp && (o.zero > 0 || o.dp_replicate > 0))
    throw UsageError{"--naive-dp is the classic DataParallel; it cannot be combined with --zero or HSDP"};
  if (o.dp_replicate > 0 && (o.zero == 1 || o.zero == 2))
    throw UsageError{"--dp-replicate/--dp-shard shard like ZeRO-3 (FSDP, HSDP); --zero " + std::to_string(o.zero) +
                     " cannot be combined with it"};
  if (o.compare_serial && !o.parallel())
    throw UsageError{"--compare-serial compares a data-parallel run with the serial one: add --dp N, --zero or HSDP"};
  check_cuda_layout(o);
}

inline Options parse(int argc, char** argv) {
  Options o;
  int64_t seed = static_cast<int64_t>(o.seed);
  FlagTable flags;
  add_run_flags(flags, o, seed);
  add_layout_flags(flags, o);
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      o.help = true;
      continue;
    }
    if (flag == "--profile" || flag == "--offload" || flag == "--naive-dp" || flag == "--compare-serial" ||
        flag == "--sp") {
      (flag == "--profile"    ? o.profile
       : flag == "--offload"  ? o.offload
       : flag == "--naive-dp" ? o.naive_dp
       : flag == "--sp"       ? o.sp
                              : o.compare_serial) = true;
      continue;
    }
    auto it = flags.find(flag);
    if (it == flags.end()) throw UsageError{"unknown flag " + flag};
    if (i + 1 >= argc) throw UsageError{flag + " needs a value"};
    try {
      it->second(argv[++i]);
    } catch (const UsageError& e) {
      throw UsageError{flag + ": " + e.message};
    }
  }
  o.seed = static_cast<uint64_t>(seed);
  if (o.dp_shard > 0 && o.dp_replicate == 0) o.dp_replicate = 1;  // --dp-shard S alone: FSDP over S (HSDP with R 1)
  check_run_flags(o);
  check_layout_flags(o);
  return o;
}

}  // namespace sl
