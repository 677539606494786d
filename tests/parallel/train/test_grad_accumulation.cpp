// test_grad_accumulation.cpp — gradient accumulation over several backward passes equals one serial
// step over the concatenated batch, for every data-parallel technique:
//   DDP      the first micro-batches under no_sync() (local sums), the last one all-reduces
//   ZeRO-1   backwards add into the flat gradient buffer; one reduce-scatter per bucket at the step
//   ZeRO-2   every backward reduce-scatters its buckets as it goes and ADDS into the gradient shard
//   ZeRO-3   every backward reduce-scatters each unit and adds into the unit's gradient shard
//   ZeRO-3 + offload   the same, with the shards and the update on the host
// The serial reference is an independent nn::GPT + nn::AdamW on the whole global batch, at lr 1e-2
// and weight decay 0.1 over 5 steps, so a lost micro-batch, a wrong scale or a lost decay shows.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "nn/data.h"
#include "nn/gpt.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/ddp.h"
#include "parallel/zero/fsdp.h"
#include "parallel/zero/zero_adamw.h"
#include "tests/support/compare.h"
#include "tests/support/serial_run.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer.h"

namespace sl::parallel {
namespace {

constexpr int kSteps = 5, kMicroBatches = 3;
constexpr int64_t kBatch = 12, kBlock = 8;  // world 2: 6 rows a rank, 3 micro-batches of 2; world 4: of 1
constexpr uint64_t kSeed = 17;

nn::GPTConfig small_config() { return parity_config(); }
// eps 1e-6: tests/support/parallel.h says why (a gradient that is zero in exact arithmetic stays harmless).
nn::AdamWOptions adamw_options() { return parity_adamw(); }

const nn::TokenStream& stream() {
  static const nn::TokenStream tokens = [] {
    nn::TokenStream s;
    s.vocab_size = 32;
    for (int i = 0; i < 900; ++i) s.tokens.push_back((i * 5 + i / 3 + (i * i) % 13) % 32);
    return s;
  }();
  return tokens;
}

// The serial run (tests/support/serial_run.h): one backward over all kBatch rows per step.
// Parameters after every step, flat in parameter order.
const std::vector<std::vector<float>>& serial() {
  static const std::vector<std::vector<float>> params = [] {
    DeviceGuard device(Device::cpu(90));  // away from the ranks' cpu:0..3
    const test_support::SerialRun run =
        test_support::serial_run({.config = small_config(), .seed = kSeed, .adamw = adamw_options(), .steps = kSteps},
                                 [](int step) { return stream().get_batch(step, kBatch, kBlock); });
    std::vector<std::vector<float>> out;
    for (const test_support::SerialStep& step : run.steps) out.push_back(test_support::flat_values(step.params));
    return out;
  }();
  return params;
}

enum class Technique { ddp, zero1, zero2, zero3, zero3_offload };
struct Case {
  Technique technique;
  int world;
};
const char* technique_name(Technique t) {
  switch (t) {
    case Technique::ddp: return "ddp";
    case Technique::zero1: return "zero1";
    case Technique::zero2: return "zero2";
    case Technique::zero3: return "zero3";
    default: return "zero3_offload";
  }
}
std::string case_name(const testing::TestParamInfo<Case>& info) {
  return std::string(technique_name(info.param.technique)) + "_world" + std::to_string(info.param.world);
}
void PrintTo(const Case& c, std::ostream* out) { *out << technique_name(c.technique) << " world " << c.world; }

// Each rank's rows of the global batch, cut into kMicroBatches equal micro-batches: every row holds
// the same number of counted targets, so the mean of the micro-batches' means (each scaled by
// 1/kMicroBatches) is the mean over the rank's rows, and the average over ranks the global mean.
void train_rank(RankContext& ctx, const Case& c, std::vector<std::vector<float>>& out) {
  nn::GPT model(small_config(), kSeed);
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<nn::AdamW> adamw;
  std::unique_ptr<ZeroAdamW> zero;
  std::unique_ptr<FullyShardedGPT> fsdp;
  switch (c.technique) {
    case Technique::ddp:
      ddp = std::make_unique<DistributedDataParallel>(model, ctx.world, DDPOptions{.bucket_bytes = 4096});
      adamw = std::make_unique<nn::AdamW>(model.parameters(), adamw_options());
      break;
    case Technique::zero1:
    case Technique::zero2:
      zero = std::make_unique<ZeroAdamW>(
          model.parameters(), ctx.world,
          ZeroOptions{.stage = c.technique == Technique::zero1 ? 1 : 2, .adamw = adamw_options(), .bucket_bytes = 4096});
      break;
    default:
      fsdp = std::make_unique<FullyShardedGPT>(model, ctx.world, nullptr, adamw_options(),
                                               FsdpOptions{.offload = c.technique == Technique::zero3_offload});
  }
  const RowRange rows = data_parallel_rows(kBatch, ctx.rank, ctx.world_size);
  const int64_t per_micro = (rows.end - rows.begin) / kMicroBatches;
  for (int step = 0; step < kSteps; ++step) {
    if (ddp) ddp->zero_grad();
    if (zero) zero->zero_grad();
    for (int micro = 0; micro < kMicroBatches; ++micro) {
      const int64_t begin = rows.begin + micro * per_micro;
      nn::Batch batch = stream().get_batch(step, kBatch, kBlock, begin, begin + per_micro);
      auto backward = [&] {
        Tensor loss = fsdp ? fsdp->loss(batch.inputs, batch.targets) : model.loss(batch.inputs, batch.targets);
        (loss * (1.0 / kMicroBatches)).backward();
      };
      if (ddp && micro + 1 < kMicroBatches) {
        auto guard = ddp->no_sync();  // local sums only; the last backward all-reduces everything
        backward();
      } else {
        backward();
      }
    }
    if (ddp) ddp->step(*adamw);
    if (zero) zero->step();
    if (fsdp) {
      fsdp->step();
      fsdp->zero_grad();
    }
    if (fsdp) {
      nn::StateDict state = fsdp->full_state_dict();  // collective
      nn::NamedTensors params;
      for (const auto& [name, p] : model.named_parameters()) params.emplace_back(name, state.at(name));
      out.push_back(test_support::flat_values(params));
    } else {
      out.push_back(test_support::flat_values(model.named_parameters()));
    }
  }
}

class GradAccumulation : public testing::TestWithParam<Case> {};

TEST_P(GradAccumulation, MicroBatchesEqualSerialOverTheWholeBatch) {
  const Case c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world);
  ASSERT_EQ(kBatch % (c.world * kMicroBatches), 0) << "equal micro-batches keep the means exact";
  const auto& want = serial();
  std::vector<std::vector<std::vector<float>>> got(c.world);
  launch(
      c.world, [&](RankContext& ctx) { train_rank(ctx, c, got[ctx.rank]); }, quick());
  for (int r = 0; r < c.world; ++r) {
    if (got[r].empty()) continue;  // under mpirun: another process's rank
    for (int step = 0; step < kSteps; ++step)
      test_support::expect_close(got[r][step], want[step], {.atol = 1e-5, .rtol = 1.3e-6},
                                 test_support::at("parameters", r, step));
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (Technique t : {Technique::ddp, Technique::zero1, Technique::zero2, Technique::zero3, Technique::zero3_offload})
    for (int world : {2, 4}) cases.push_back({t, world});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Techniques, GradAccumulation, testing::ValuesIn(all_cases()), case_name);

}  // namespace
}  // namespace sl::parallel
