// tools/train_cli.h and parallel/train/train_options.h: the train program's flags, parsed in-process (tests/tools/test_train_cli.cpp runs
// the binary). Combinations that would be ignored, or refused only after the data is read, are usage
// errors (exit code 2) with the exact message asserted here.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "tools/train_cli.h"

namespace sl {
namespace {

// parse() of a command line split at spaces; the UsageError's message, or "" when it parsed.
std::string usage_error(const std::string& command_line, Options* parsed = nullptr) {
  std::vector<std::string> words{"train"};
  std::istringstream in(command_line);
  for (std::string word; in >> word;) words.push_back(word);
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  try {
    Options o = parse_train(static_cast<int>(argv.size()), argv.data());
    if (parsed) *parsed = o;
  } catch (const UsageError& e) {
    return e.message;
  }
  return "";
}

TEST(TrainOptions, BadCombinationsAreUsageErrors) {
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--offload", "--offload moves ZeRO's optimizer to the host: add --zero 1, 2 or 3"},
           {"--dp 2 --offload", "--offload moves ZeRO's optimizer to the host: add --zero 1, 2 or 3"},
           {"--dp-replicate 2 --dp-shard 2 --offload",
            "--offload moves ZeRO's optimizer to the host: add --zero 1, 2 or 3"},
           {"--dp 2 --naive-dp --zero 1",
            "--naive-dp is the classic DataParallel; it cannot be combined with --zero or HSDP"},
           {"--dp-replicate 2 --dp-shard 2 --naive-dp",
            "--naive-dp is the classic DataParallel; it cannot be combined with --zero or HSDP"},
           {"--dp-replicate 2 --dp-shard 2 --zero 2",
            "--dp-replicate/--dp-shard shard like ZeRO-3 (FSDP, HSDP); --zero 2 cannot be combined with it"},
           {"--compare-serial",
            "--compare-serial compares a data-parallel run with the serial one: add --dp N, --zero or HSDP"},
           {"--dp-replicate 2", "--dp-replicate 2 replicates FSDP's shards (HSDP): add --dp-shard S (plain replicas: --dp N)"},
           {"--dp 3 --dp-replicate 2 --dp-shard 2", "--dp 3 != --dp-replicate 2 x --dp-shard 2"},
           {"--dp 3 --batch-size 10", "--batch-size 10 must be micro-batch rows x 1 micro-batches x dp_replicate 3 x dp_shard 1, but 10 % 3 = 1"},
           {"--dp 2 --micro-batches 4 --batch-size 12", "--batch-size 12 must be micro-batch rows x 4 micro-batches x dp_replicate 2 x dp_shard 1, but 12 % 8 = 4"},
           {"--micro-batches 5 --batch-size 12", "--batch-size 12 must be micro-batch rows x 5 micro-batches x dp_replicate 1 x dp_shard 1, but 12 % 5 = 2"},
           {"--naive-dp --dp 2 --micro-batches 2", "--naive-dp scatters one batch per step: it cannot be combined with --micro-batches"},
           {"--micro-batches 0", "--micro-batches: expected an integer in 1..1048576, got '0'"},
           // Decimal only (C's base 0 would read 010 as 8), and no silent overflow.
           {"--steps 010", "--steps: expected an integer >= 0, got '010'"},
           {"--tp 0x2", "--tp: expected an integer in 1..1024, got '0x2'"},
           {"--steps 99999999999999999999", "--steps: expected an integer >= 0, got '99999999999999999999'"},
           {"--adam-eps 0", "--adam-eps: expected a number > 0, got '0'"},
           {"--adam-eps -1e-8", "--adam-eps: expected a number > 0, got '-1e-8'"},
           {"--adam-eps tiny", "--adam-eps: expected a number > 0, got 'tiny'"},
           // The chapters that cut the model (they combine): their flags only with their degree.
           {"--schedule gpipe", "--schedule, --virtual-stages, --stage-layers and --trace are pipeline flags: add --pp N"},
           {"--trace t.svg", "--schedule, --virtual-stages, --stage-layers and --trace are pipeline flags: add --pp N"},
           {"--pp 2 --trace t.png", "--trace: expected a FILE.svg or FILE.json, got 't.png'"},
           {"--pp 2 --schedule zb", "--schedule: expected one of naive, gpipe, 1f1b, interleaved, zero-bubble, got 'zb'"},
           {"--pp 2 --virtual-stages 2", "--virtual-stages 2 needs --schedule interleaved"},
           {"--pp 2 --stage-layers 1,,1", "--stage-layers: expected layer counts like 2,1,1, got '1,,1'"},
           {"--pp 2 --stage-layers 1,99999999999", "--stage-layers: expected layer counts in 1..1048576 like 2,1,1, got '1,99999999999'"},
           {"--sp", "--sp shards the sequence over the tensor-parallel ranks: add --tp N"},
           {"--cp-variant allgather", "--cp-balance and --cp-variant are context-parallel flags: add --cp N"},
           {"--cp 2 --cp-balance half", "--cp-balance: expected one of zigzag, none, got 'half'"},
           {"--cp 2 --cp-variant hybrid", "--cp-variant hybrid runs Ulysses inside groups of U ranks and the ring "
                                          "across: add --ulysses-degree U (U divides --cp)"},
           {"--cp 2 --ulysses-degree 2", "--ulysses-degree is the hybrid's: add --cp-variant hybrid (plain Ulysses is "
                                         "--cp-variant ulysses, with U = cp)"},
           {"--cp 2 --cp-variant star", "--cp-variant: expected one of ring, allgather, ulysses, hybrid, got 'star'"},
           {"--pp 2 --schedule interleaved --virtual-stages 2 --dp 2",
            "--virtual-stages 2 with --dp 2: DDP cannot all-reduce from an interleaved stage's last backward (it covers one chunk); add --zero 1"},
           {"--min-accuracy 101", "--min-accuracy: expected a percentage in 0..100, got '101'"},
           {"--task text --data x --min-accuracy 50", "--min-accuracy checks the addition task's held-out accuracy; --task is text"},
           {"--tp 2 --naive-dp --dp 2",
            "--naive-dp scatters whole-model batches from rank 0: it cannot be combined with --pp, --tp or --cp"},
           {"--pp 2 --dp 3 --batch-size 8",
            "--batch-size 8 must be micro-batch rows x 1 micro-batches x dp_replicate 3 x dp_shard 1, but 8 % 3 = 2"},
           {"--dp-replicate 2 --dp-shard 3 --tp 2 --batch-size 8",
            "--batch-size 8 must be micro-batch rows x 1 micro-batches x dp_replicate 2 x dp_shard 3, but 8 % 6 = 2"}})
    EXPECT_EQ(usage_error(args), message) << args;
}

// A mixture of experts: over a layout only with --ep, in f32, without distributed checkpoints; ep
// beside what it is not combined with.
TEST(TrainOptions, MixtureOfExpertsCombinationsAreUsageErrors) {
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--moe-experts 4 --dp 2",
            "--moe-experts over a layout routes one MoE batch over every rank that splits the batch only with --ep N "
            "(expert parallelism); without it each rank would route, cap and balance its own rows: a different model. "
            "Add --ep, or drop the layout flags"},
           {"--moe-experts 4 --tp 2",
            "--moe-experts over a layout routes one MoE batch over every rank that splits the batch only with --ep N "
            "(expert parallelism); without it each rank would route, cap and balance its own rows: a different model. "
            "Add --ep, or drop the layout flags"},
           {"--moe-experts 2 --moe-top-k 3", "--moe-top-k (3) picks more experts than --moe-experts (2)"},
           {"--moe-experts 4 --mixed-precision bf16",
            "--moe-experts with --mixed-precision bf16: a mixture of experts trains in f32 only (16-bit DDP's gradient "
            "buffers need a gradient from every expert, and one that no token reached has none); drop "
            "--mixed-precision"},
           {"--moe-experts 4 --ep 2 --dp 2 --zero 1 --offload",
            "--ep runs with --dp (DDP or --zero 1, 2, 3), HSDP, --tp, --pp and --cp: --offload and --naive-dp are not "
            "offered with it"},
           {"--moe-experts 4 --ep 2 --cp 2 --zero 1",
            "--ep with --pp or --cp runs under DDP (--zero 0): ZeRO and FSDP keep the experts apart only on a cut with "
            "no gradient sum of its own, and the pipeline's tied wte and cp's tokens have one"},
           {"--moe-experts 4 --ep 2 --tp 2 --sp",
            "--ep with --sp: each tp rank would route its T/tp tokens, which makes tp split the MoE "
            "batch; under --ep the tp ranks route the same tokens, the experts replicated over tp"},
           {"--moe-experts 4 --ep 2 --pp 2 --zero 1",
            "--ep with --pp or --cp runs under DDP (--zero 0): ZeRO and FSDP keep the experts apart only on a cut with "
            "no gradient sum of its own, and the pipeline's tied wte and cp's tokens have one"},
           {"--moe-experts 4 --checkpoint-dir ckpt",
            "--moe-experts with --checkpoint-dir or --resume: a checkpoint keeps one AdamW step count, and an expert "
            "that no token reached in some step lags the others' (AdamW skipped it); --save writes the whole model"},
           {"--moe-experts 2 --recompute full",
            "--moe-experts with --recompute full: the experts' auxiliary losses are recorded in forward, which full "
            "recomputation reruns; use --recompute none or selective"}})
    EXPECT_EQ(usage_error(args), message) << args;
}

// --device cuda with ranks: the layouts with host code on their path are usage errors naming it; DDP,
// ZeRO-1/2/3, FSDP, HSDP (and their offload), the pipeline and the tp/cp cuts parse (the GPUs and NCCL
// are checked at run time, below).
TEST(TrainOptions, CudaRefusesTheLayoutsThatRunHostCode) {
  for (const auto& [args, reason] : std::vector<std::pair<std::string, std::string>>{
           {"--dp 2 --naive-dp", "--device cuda: --naive-dp packs the scattered batches and gathered logits through "
                                 "host buffers on rank 0"},
           {"--dp 2 --links intra=300GB/s,1us;inter=25GB/s,5us;gpus-per-node=2",
            "--device cuda: --links and --topology simulate links between thread ranks (the threads backend)"}}) {
    const std::string message = usage_error(args + " --device cuda");
    EXPECT_EQ(message.rfind(reason, 0), 0u) << args << ": " << message;
    EXPECT_EQ(usage_error(args), "") << args << " runs on CPU ranks";
  }
  Options o;
  for (const std::string args :
       {"--dp 2", "--dp 2 --micro-batches 2", "--pp 2", "--dp 2 --pp 2 --micro-batches 2", "--tp 2 --sp", "--cp 2",
        "--dp 2 --tp 2 --cp 2", "--dp 2 --mixed-precision bf16", "--dp 2 --zero 1", "--dp 2 --zero 2",
        "--dp 2 --zero 1 --offload", "--dp 2 --zero 2 --offload", "--dp 2 --zero 3", "--dp 2 --zero 3 --offload",
        "--dp-shard 2", "--dp-replicate 2 --dp-shard 2", "--dp-replicate 2 --dp-shard 2 --tp 2", "--dp 2 --zero 3 --tp 2",
        "--dp 2 --zero 3 --tp 2 --mixed-precision bf16"})
    EXPECT_EQ(usage_error(args + " --device cuda", &o), "") << args;
}

// At run time (tools/train.cpp, before any rank starts): one rank per GPU over NCCL.
TEST(TrainOptions, CudaRanksTakeNcclWhenEveryRankHasAGpuElseShareThem) {
  Options o;
  ASSERT_EQ(usage_error("--dp 4 --device cuda", &o), "");
  EXPECT_TRUE(cuda_ranks_over_nccl(o, true, 4));    // ranks 0..3 on cuda:0..3
  EXPECT_TRUE(cuda_ranks_over_nccl(o, true, 8));
  EXPECT_FALSE(cuda_ranks_over_nccl(o, true, 1));   // 4 thread ranks share cuda:0
  EXPECT_FALSE(cuda_ranks_over_nccl(o, false, 8));  // no NCCL: thread ranks on cuda:0..3
  EXPECT_EQ(cuda_ranks_refusal(o, true, 1), "");
  EXPECT_EQ(cuda_ranks_refusal(o, false, 8), "");
  EXPECT_EQ(cuda_ranks_refusal(o, true, 0, "no CUDA-capable device is detected"),
            "--device cuda: world 4 needs a GPU, and none is visible (no CUDA device: no CUDA-capable device is "
            "detected); use --device cpu for thread ranks");
  EXPECT_NE(cuda_ranks_refusal(o, false, 4, "", /*under_mpirun=*/true).find("this build has no NCCL backend"),
            std::string::npos);
  EXPECT_EQ(cuda_ranks_refusal(o, true, 4, "", true), "");
  ASSERT_EQ(usage_error("--dp 2 --pp 2 --tp 2 --device cuda", &o), "");
  EXPECT_FALSE(cuda_ranks_over_nccl(o, true, 4));  // world 8 on 4 GPUs: shared
  EXPECT_EQ(cuda_ranks_refusal(o, true, 4), "");
  ASSERT_EQ(usage_error("--device cuda", &o), "");  // serial: no ranks, nothing to check here
  EXPECT_EQ(cuda_ranks_refusal(o, false, 0), "");
  ASSERT_EQ(usage_error("--dp 2", &o), "");  // CPU ranks
  EXPECT_EQ(cuda_ranks_refusal(o, false, 0), "");
}

// What stays valid: ZeRO-3 with --offload is left to the trainer (it decides which stages offload),
// --zero without --dp is ZeRO at world 1, and --adam-eps takes any positive number.
TEST(TrainOptions, ValidCombinationsParse) {
  Options o;
  EXPECT_EQ(usage_error("--dp 2 --zero 3 --offload", &o), "");
  EXPECT_TRUE(o.offload);
  EXPECT_EQ(usage_error("--zero 1 --offload", &o), "");
  EXPECT_TRUE(o.parallel());
  EXPECT_EQ(usage_error("--dp 2 --compare-serial --adam-eps 1e-6", &o), "");
  EXPECT_EQ(o.adam_eps, 1e-6);
  EXPECT_EQ(usage_error("", &o), "");
  EXPECT_EQ(o.adam_eps, 1e-8);  // the default, as nn::AdamW's
  EXPECT_EQ(usage_error("--moe-experts 4 --moe-top-k 1 --moe-every 2 --moe-capacity-factor 1.25 "
                        "--moe-router softmax-topk --moe-aux-weight 0.02 --moe-z-weight 0",
                        &o),
            "");
  EXPECT_EQ(o.moe_experts, 4);
  EXPECT_EQ(o.moe_capacity_factor, 1.25);
  EXPECT_EQ(o.moe_router, "softmax-topk");
  // The world is dp x pp x tp x cp; the batch splits over dp only.
  EXPECT_EQ(usage_error("--dp 2 --pp 2 --schedule interleaved --virtual-stages 2 --zero 1 --batch-size 6 --trace t.json", &o), "");
  EXPECT_EQ(o.world(), 4);
  EXPECT_EQ(o.data_parallel(), 2);
  EXPECT_EQ(usage_error("--tp 3 --sp --zero 1 --batch-size 5", &o), "");
  EXPECT_TRUE(o.sp && o.cuts_model() && o.parallel());
  EXPECT_EQ(o.world(), 3);
  EXPECT_EQ(usage_error("--dp 2 --pp 2 --tp 2 --sp --cp 2 --micro-batches 2 --batch-size 8", &o), "");  // N-D
  EXPECT_EQ(o.world(), 16);
  EXPECT_EQ(usage_error("--dp 2 --pp 2 --zero 3 --micro-batches 2 --batch-size 8", &o), "");  // FSDP with pp
  EXPECT_EQ(o.world(), 4);
  // Expert parallelism with dp, tp and pp: the batch splits over dp x ep.
  EXPECT_EQ(usage_error("--moe-experts 4 --ep 2 --dp 2 --tp 2 --pp 2 --batch-size 8", &o), "");
  EXPECT_EQ(o.world(), 16);
  EXPECT_EQ(usage_error("--moe-experts 4 --ep 2 --tp 2 --zero 3", &o), "");
  // The Accelerate guide's layouts parse (the TrainPlan checks which strategy runs over which cut).
  EXPECT_EQ(usage_error("--dp 2 --pp 2 --tp 2 --zero 3", &o), "");
  EXPECT_EQ(usage_error("--dp 2 --zero 3 --tp 2", &o), "");
  EXPECT_EQ(usage_error("--dp-replicate 2 --dp-shard 2 --cp 2 --tp 2", &o), "");
  EXPECT_EQ(o.world(), 16);
  EXPECT_EQ(usage_error("--dp 2 --tp 2 --zero 2", &o), "");
  EXPECT_EQ(usage_error("--dp-shard 4 --tp 2", &o), "");  // --dp-shard alone: FSDP over 4, as HSDP with R 1
  EXPECT_EQ(o.dp_replicate, 1);
  EXPECT_EQ(o.world(), 8);
  EXPECT_EQ(usage_error("--cp 2 --cp-balance none --cp-variant allgather --stage-layers 1 --pp 1", &o),
            "--schedule, --virtual-stages, --stage-layers and --trace are pipeline flags: add --pp N");
}

}  // namespace
}  // namespace sl
