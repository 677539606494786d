// train_options.cpp — the checks of TrainOptions: what cannot go together, refused before any
// data is read or any rank starts, each message naming the flags and values.
#include "parallel/train/train_options.h"

#include "nn/mixed_precision.h"

namespace sl::parallel {

void TrainOptions::resolve() {
  if (dp_shard > 0 && dp_replicate == 0) dp_replicate = 1;  // FSDP over S: HSDP with R 1
}

void TrainOptions::validate() const {
  check_run_options(*this);
  check_layout_options(*this);
}

// What the task and the model need of each other.
void check_run_options(const TrainOptions& o) {
  if ((o.task == "text" || o.task == "bin") && o.data.empty())
    throw OptionError("--task " + o.task + " needs --data PATH");
  if (o.task == "bin" && o.vocab_size == 0) throw OptionError("--task bin needs --vocab-size N");
  if (o.min_accuracy > 0 && o.task != "addition")
    throw OptionError("--min-accuracy checks the addition task's held-out accuracy; --task is " + o.task);
  if (o.task != "bin" && o.vocab_size != 0)
    throw OptionError("--vocab-size is for --task bin only (" + o.task + " uses bytes: 256)");
  if (o.n_embd % o.n_head != 0)
    throw OptionError("--n-embd (" + std::to_string(o.n_embd) + ") must be divisible by --n-head (" +
                     std::to_string(o.n_head) + ")");
  try {
    nn::MixedPrecision::parse(o.mixed_precision, o.grad_reduce_dtype, o.loss_scale);
  } catch (const Error& e) {
    throw OptionError(e.what());
  }
  if (o.moe_experts > 0 && o.moe_top_k > o.moe_experts)
    throw OptionError("--moe-top-k (" + std::to_string(o.moe_top_k) + ") picks more experts than --moe-experts (" +
                     std::to_string(o.moe_experts) + ")");
  if (o.moe_experts > 0 && o.mixed_precision != "no")
    throw OptionError("--moe-experts with --mixed-precision " + o.mixed_precision + ": a mixture of experts trains in f32 "
                     "only (16-bit DDP's gradient buffers need a gradient from every expert, and one that no token "
                     "reached has none); drop --mixed-precision");
  if (o.moe_experts > 0 && o.recompute == "full")
    throw OptionError("--moe-experts with --recompute full: the experts' auxiliary losses are recorded in forward, "
                     "which full recomputation reruns; use --recompute none or selective");
  if (o.moe_experts > 0 && o.parallel() && o.ep == 1)
    throw OptionError("--moe-experts over a layout routes one MoE batch over every rank that splits the batch only "
                     "with --ep N (expert parallelism); without it each rank would route, cap and balance its own "
                     "rows: a different model. Add --ep, or drop the layout flags");
  if (o.ep > 1 && o.moe_experts == 0)
    throw OptionError("--ep " + std::to_string(o.ep) + " shards a mixture of experts: add --moe-experts E (E % ep == 0)");
  if (o.ep > 1 && o.moe_experts % o.ep != 0)
    throw OptionError("--ep " + std::to_string(o.ep) + ": --moe-experts " + std::to_string(o.moe_experts) +
                     " does not split over it (E % ep = " + std::to_string(o.moe_experts % o.ep) + ")");
  if (o.ep > 1 && (o.naive_dp || o.offload))
    throw OptionError("--ep runs with --dp (DDP or --zero 1, 2, 3), HSDP, --tp, --pp and --cp: --offload and --naive-dp "
                     "are not offered with it");
  if (o.ep > 1 && o.sp)
    throw OptionError("--ep with --sp: each tp rank would route its T/tp tokens, which makes tp split "
                     "the MoE batch; under --ep the tp ranks route the same tokens, the experts replicated over tp");
  if (o.ep > 1 && (o.pp > 1 || o.cp > 1) && o.zero > 0)
    throw OptionError("--ep with --pp or --cp runs under DDP (--zero 0): ZeRO and FSDP keep the experts apart only on "
                     "a cut with no gradient sum of its own, and the pipeline's tied wte and cp's tokens have one");
  if (o.moe_experts > 0 && (!o.checkpoint_dir.empty() || !o.resume.empty()))
    throw OptionError("--moe-experts with --checkpoint-dir or --resume: a checkpoint keeps one AdamW step count, and an "
                     "expert that no token reached in some step lags the others' (AdamW skipped it); --save writes the "
                     "whole model");
  if ((o.save_every > 0 || o.keep_last > 0) && o.checkpoint_dir.empty())
    throw OptionError("--save-every and --keep-last write checkpoints: add --checkpoint-dir DIR");
  if (!o.resume.empty() && o.compare_serial)
    throw OptionError("--resume continues a run from its checkpoint; --compare-serial would start the serial one "
                     "from the seed: compare the logs of two runs instead");
}

// --device cuda with ranks: rank r runs on GPU cuda:r over NCCL, one rank per GPU (NCCL cannot put
// two ranks of one communicator on one GPU). What runs there is what uses only the engine's ops,
// collectives and send/recv on the rank's GPU: DDP, ZeRO-1/2/3, FSDP and HSDP (their flat buffers and
// sharded AdamW are tensor ops; --offload keeps the optimizer on each rank's host, parallel/zero/zero.h),
// the pipeline, and the cuts of --tp and --cp. What keeps host code on its path is refused here,
// naming why; the GPU count and NCCL itself are checked by cuda_ranks_refusal() before any rank starts.
void check_cuda_layout(const TrainOptions& o) {
  if (o.device != "cuda" || !o.parallel()) return;
  if (o.naive_dp)
    throw OptionError("--device cuda: --naive-dp packs the scattered batches and gathered logits through host "
                     "buffers on rank 0 (parallel/data_parallel/naive_data_parallel.cpp); use --device cpu");
  if (o.topology.enabled())
    throw OptionError("--device cuda: --links and --topology simulate links between thread ranks (the threads "
                     "backend); NCCL's links are real: drop them, or use --device cpu");
}

// --device cuda with ranks, at run time (tools/train.cpp, before any rank starts). Every rank with a
// GPU of its own and NCCL built: rank r on cuda:r over NCCL. Otherwise thread ranks on cuda:(r mod
// GPUs), sharing them, their collectives staged through host memory (parallel/comm/backends/
// host_staging.h): the same result, slower. Under mpirun (one process per GPU) NCCL is the only way.
// `nccl_built`: this build has the NCCL backend; `gpus`: the GPUs this process sees (cuda_info()), or
// the world under mpirun; `why_none` what CUDA said when it found none.
bool cuda_ranks_over_nccl(const TrainOptions& o, bool nccl_built, int gpus) {
  return nccl_built && gpus >= o.world();
}

// Why --device cuda's ranks cannot run ("" when they can).
std::string cuda_ranks_refusal(const TrainOptions& o, bool nccl_built, int gpus, const std::string& why_none,
                               bool under_mpirun) {
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
void check_layout_options(const TrainOptions& o) {
  if (o.dp_replicate > 0 && o.dp_shard == 0)
    throw OptionError("--dp-replicate " + std::to_string(o.dp_replicate) +
                     " replicates FSDP's shards (HSDP): add --dp-shard S (plain replicas: --dp N)");
  if (o.dp_replicate > 0 && o.dp > 1 && o.dp != o.data_parallel())
    throw OptionError("--dp " + std::to_string(o.dp) + " != --dp-replicate " + std::to_string(o.dp_replicate) +
                     " x --dp-shard " + std::to_string(o.dp_shard));
  if (o.pp == 1 && (o.schedule != "1f1b" || o.virtual_stages > 1 || !o.stage_layers.empty() || !o.trace.empty()))
    throw OptionError("--schedule, --virtual-stages, --stage-layers and --trace are pipeline flags: add --pp N");
  if (o.virtual_stages > 1 && o.schedule != "interleaved")
    throw OptionError("--virtual-stages " + std::to_string(o.virtual_stages) + " needs --schedule interleaved");
  if (o.sp && o.tp == 1) throw OptionError("--sp shards the sequence over the tensor-parallel ranks: add --tp N");
  if (o.cp == 1 && (o.cp_balance != "zigzag" || o.cp_variant != "ring"))
    throw OptionError("--cp-balance and --cp-variant are context-parallel flags: add --cp N");
  if (o.cp_variant == "hybrid" && o.ulysses_degree == 0)
    throw OptionError("--cp-variant hybrid runs Ulysses inside groups of U ranks and the ring across: add "
                     "--ulysses-degree U (U divides --cp)");
  if (o.ulysses_degree > 0 && o.cp_variant != "hybrid")
    throw OptionError("--ulysses-degree is the hybrid's: add --cp-variant hybrid (plain Ulysses is --cp-variant "
                     "ulysses, with U = cp)");
  // Which strategies run over which cuts (ZeRO-2 and pp, FSDP's schedules, offload over a cut) is
  // the TrainPlan's rule (parallel/train/train_plan.cpp), checked before the ranks start.
  if (o.cuts_model() && o.naive_dp)
    throw OptionError("--naive-dp scatters whole-model batches from rank 0: it cannot be combined with --pp, --tp or --cp");
  if (o.pp > 1 && o.virtual_stages > 1 && o.zero == 0 && o.data_parallel() > 1)
    throw OptionError(
        "--virtual-stages " + std::to_string(o.virtual_stages) + " with --dp " + std::to_string(o.data_parallel()) +
        ": DDP cannot all-reduce from an interleaved stage's last backward (it covers one chunk); add --zero 1");
  // Global batch = micro-batch rows x micro-batches x dp_replicate x dp_shard (the pp, tp and cp
  // ranks of one replica share its rows).
  const int64_t ranks = o.parallel() ? o.data_parallel() * o.ep : 1;  // ep ranks read other rows too
  const int64_t replicate = o.dp_replicate > 0 ? o.dp_replicate : o.zero == 0 ? ranks / o.ep : 1;
  const int64_t shard = ranks / replicate / o.ep;
  if (o.batch_size % (ranks * o.micro_batches) != 0)
    throw OptionError("--batch-size " + std::to_string(o.batch_size) + " must be micro-batch rows x " +
                     std::to_string(o.micro_batches) + " micro-batches x dp_replicate " + std::to_string(replicate) +
                     " x dp_shard " + std::to_string(shard) + (o.ep > 1 ? " x ep " + std::to_string(o.ep) : "") + ", but " + std::to_string(o.batch_size) + " % " +
                     std::to_string(ranks * o.micro_batches) + " = " +
                     std::to_string(o.batch_size % (ranks * o.micro_batches)));
  if (o.naive_dp && o.micro_batches > 1)
    throw OptionError("--naive-dp scatters one batch per step: it cannot be combined with --micro-batches");
  // The profiler counts per thread, and the ranks are threads: rank 0's table would miss the rest.
  if (o.parallel() && o.profile)
    throw OptionError(
        "--profile times the serial run's ops; drop --dp, --zero, --dp-replicate/--dp-shard, --naive-dp, --pp, --tp "
        "and --cp");
  // Combinations that would otherwise be ignored silently or refused only after the data is read.
  if (o.offload && o.zero == 0) throw OptionError("--offload moves ZeRO's optimizer to the host: add --zero 1, 2 or 3");
  if (o.naive_dp && (o.zero > 0 || o.dp_replicate > 0))
    throw OptionError("--naive-dp is the classic DataParallel; it cannot be combined with --zero or HSDP");
  if (o.dp_replicate > 0 && (o.zero == 1 || o.zero == 2))
    throw OptionError("--dp-replicate/--dp-shard shard like ZeRO-3 (FSDP, HSDP); --zero " + std::to_string(o.zero) +
                     " cannot be combined with it");
  if (o.compare_serial && !o.parallel())
    throw OptionError("--compare-serial compares a data-parallel run with the serial one: add --dp N, --zero or HSDP");
  check_cuda_layout(o);
}

}  // namespace sl::parallel
