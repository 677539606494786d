// Resharding, exactly: a Trainer's state saved as pieces of the serial tensors under one
// layout loads under any other, every full tensor (weights, both moments, master weights) byte for
// byte, and training continues as the uninterrupted run does.
//
// The store here is memory (each owner piece's bytes by tensor), so these tests hold the layouts'
// pieces (parallel/train/checkpointing.h) apart from the file format (parallel/checkpoint/): every
// element of every tensor is saved by exactly one rank, and a load fills every element of every
// rank's pieces. Expected values are the saving layout's own bytes, assembled from its pieces.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "parallel/train/checkpointing.h"
#include "tests/support/trainer.h"

namespace sl::parallel {
namespace {

struct SavedPiece {
  Region region;
  std::vector<std::byte> bytes;
};
struct SavedTensor {
  std::vector<int64_t> shape;
  DType dtype = DType::f32;
  std::vector<SavedPiece> pieces;
};
struct Store {
  std::map<std::string, SavedTensor> tensors;
  nlohmann::json run_state;
  std::mutex mutex;
};

void save(Trainer& trainer, const nn::GPTConfig& config, Store& store) {
  const nlohmann::json state = trainer_run_state(trainer);  // collective
  std::lock_guard lock(store.mutex);
  store.run_state = state;
  for (const StatePiece& p : state_pieces(trainer, config)) {
    if (!p.owner) continue;
    SavedTensor& t = store.tensors[p.tensor];
    t.shape = p.global_shape;
    t.dtype = p.data.dtype();
    std::vector<std::byte> bytes(static_cast<size_t>(p.data.nbytes()));
    std::memcpy(bytes.data(), p.data.raw_data(), bytes.size());
    t.pieces.push_back({p.region, std::move(bytes)});
  }
}

// Every piece of this rank filled from the store: its tensor saved, the same shape and dtype, and
// every element found.
void load(Trainer& trainer, const nn::GPTConfig& config, const Store& store) {
  for (StatePiece& p : state_pieces(trainer, config)) {
    auto it = store.tensors.find(p.tensor);
    ASSERT_NE(it, store.tensors.end()) << p.tensor << " was not saved";
    ASSERT_EQ(it->second.shape, p.global_shape) << p.tensor;
    ASSERT_EQ(it->second.dtype, p.data.dtype()) << p.tensor;
    int64_t copied = 0;
    for (const SavedPiece& s : it->second.pieces)
      copied += copy_overlap(p.region, p.data.raw_data(), s.region, s.bytes.data(),
                             static_cast<int64_t>(dtype_size(p.data.dtype())));
    ASSERT_EQ(copied, p.region.numel()) << p.tensor << ": a piece was filled only in part";
  }
  restore_trainer_run_state(trainer, store.run_state);
}

// Every saved tensor whole, checking that the pieces tile it: each element saved exactly once.
std::map<std::string, std::vector<std::byte>> assemble(const Store& store) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& [name, t] : store.tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    const int64_t es = static_cast<int64_t>(dtype_size(t.dtype));
    std::vector<std::byte> whole(static_cast<size_t>(numel * es));
    std::vector<int64_t> covered(static_cast<size_t>(numel), 0);
    Region all{std::vector<int64_t>(t.shape.size(), 0), t.shape, 0, numel};
    for (const SavedPiece& s : t.pieces) {
      copy_overlap(all, whole.data(), s.region, s.bytes.data(), es);
      std::vector<int64_t> ones(static_cast<size_t>(s.region.numel()), 1), counts(static_cast<size_t>(numel), 0);
      copy_overlap(all, counts.data(), s.region, ones.data(), sizeof(int64_t));
      for (int64_t i = 0; i < numel; ++i) covered[i] += counts[i];
    }
    for (int64_t i = 0; i < numel; ++i)
      EXPECT_EQ(covered[i], 1) << name << " element " << i << " saved " << covered[i] << " times";
    out[name] = std::move(whole);
  }
  return out;
}

constexpr uint64_t kSeed = 21;
nn::GPTConfig config() {  // 4 layers (pp 2 with interleaving), 4 heads (tp 2), T 8 (cp 2 zigzag)
  nn::GPTConfig c = parity_config();
  c.n_layer = 4;
  c.n_head = 4;
  c.vocab_size = 31;  // not a multiple of tp: wte's padding rows are not saved
  return c;
}
const nn::TokenStream& tokens() {
  static const nn::TokenStream s = [] {
    nn::TokenStream t = parity_tokens(900);
    for (int32_t& x : t.tokens) x %= 31;
    t.vocab_size = 31;
    return t;
  }();
  return s;
}
constexpr int64_t kRows = 12;

TrainPlan plan_of(ParallelismConfig par, int zero = 0, int micro = 1) {
  TrainPlan p;
  p.parallelism = par;
  p.dp_strategy = zero_stage_strategy(zero);
  p.micro_batches = micro;
  return p;
}

// The loss scaler after a step (nn::GradScaler): what an fp16 resume must continue.
struct ScalerState {
  double scale = 0;
  int64_t clean_steps = 0, skipped_steps = 0;
  bool operator==(const ScalerState&) const = default;
};
std::ostream& operator<<(std::ostream& out, const ScalerState& s) {
  return out << "scale " << s.scale << ", " << s.clean_steps << " clean steps, " << s.skipped_steps << " skipped";
}

// Trains `steps` steps from `first` under `plan` from `seed`, loading `from` first if given, saving into `into`.
// `weights`: the layout's own gather of its weights (Trainer::full_state_dict), to hold the store's to.
// `scaler`: the loss scaler after each step.
std::vector<double> run(const TrainPlan& plan, uint64_t seed, int64_t first, int64_t steps, const Store* from,
                        Store* into, nn::StateDict* weights = nullptr, std::vector<ScalerState>* scaler = nullptr) {
  nn::GPTConfig model = config();
  model.param_dtype = plan.precision.param_dtype;
  std::vector<double> losses(static_cast<size_t>(steps));
  launch(plan.parallelism.world_size(), [&](RankContext& ctx) {
    std::unique_ptr<Trainer> trainer = make_plan_trainer(ctx, plan, model, seed, parity_adamw());
    if (from) load(*trainer, model, *from);
    for (int64_t s = 0; s < steps; ++s) {
      const double loss = trainer->train_step(tokens(), first + s, kRows, 8, parity_adamw().lr, 1.0);
      if (ctx.rank == 0) losses[static_cast<size_t>(s)] = loss;
      const nn::GradScaler& sc = std::as_const(*trainer).scaler();
      if (ctx.rank == 0 && scaler) scaler->push_back({sc.scale(), sc.clean_steps(), sc.skipped_steps()});
    }
    if (into) save(*trainer, model, *into);
    if (weights) {
      nn::StateDict full = trainer->full_state_dict();  // collective
      if (ctx.rank == 0) *weights = full;
    }
  }, quick(20000));
  return losses;
}

struct Hop {
  std::string name;
  TrainPlan plan;
};
void PrintTo(const Hop& h, std::ostream* out) { *out << h.name; }

TrainPlan with(TrainPlan p, ScheduleKind schedule, int virtual_stages = 1) {
  p.schedule = schedule;
  p.virtual_stages = virtual_stages;
  return p;
}
TrainPlan sp(TrainPlan p) {
  p.sequence_parallel = true;
  return p;
}
TrainPlan offload(TrainPlan p) {
  p.offload = true;
  return p;
}

// A chain of layouts: each hop loads the previous hop's state and saves it again untouched;
// every full tensor must come back byte for byte.
const std::vector<Hop>& chain() {
  static const std::vector<Hop> hops = {
      {"zero3_w4", plan_of({.dp_shard = 4}, 3)},
      {"tp2_pp2", plan_of({.pp = 2, .tp = 2}, 0, 2)},
      {"ddp3", plan_of({.dp_replicate = 3})},
      {"serial", plan_of({})},
      {"zero1_dp2_cp2_tp2_sp", sp(plan_of({.dp_shard = 2, .cp = 2, .tp = 2}, 1))},
      {"hsdp2x2", plan_of({.dp_replicate = 2, .dp_shard = 2}, 3)},
      {"pp2_interleaved_zero1_dp2", with(plan_of({.dp_shard = 2, .pp = 2}, 1, 2), ScheduleKind::interleaved, 2)},
      {"zero2_offload_dp3", offload(plan_of({.dp_shard = 3}, 2))},
      {"fsdp2_tp2", plan_of({.dp_shard = 2, .tp = 2}, 3)},
      {"naive2", [] {
         TrainPlan p = plan_of({.dp_replicate = 2});
         p.dp_strategy = DpStrategy::naive;
         return p;
       }()},
      {"cp2_allgather_pp2", [] {
         TrainPlan p = plan_of({.pp = 2, .cp = 2}, 0, 2);
         p.cp_variant = CpVariant::allgather;
         return p;
       }()},
      {"fsdp2_offload", offload(plan_of({.dp_shard = 2}, 3))},
      {"ddp2_pp2_zero_bubble", with(plan_of({.dp_replicate = 2, .pp = 2}, 0, 2), ScheduleKind::zero_bubble)},
      {"fsdp2_pp2_tp2", plan_of({.dp_shard = 2, .pp = 2, .tp = 2}, 3, 2)},
  };
  return hops;
}

TEST(CheckpointResharding, EveryTensorRoundTripsExactlyThroughEveryLayout) {
  Store first;
  run(chain()[0].plan, kSeed, 0, 2, nullptr, &first);  // two steps: the moments are not zero
  const auto expected = assemble(first);
  ASSERT_TRUE(expected.count("exp_avg.h.0.attn.c_attn.weight"));
  ASSERT_TRUE(expected.count("exp_avg_sq.wte.weight"));
  const Store* previous = &first;
  std::vector<std::unique_ptr<Store>> stores;
  for (size_t i = 1; i < chain().size(); ++i) {
    stores.push_back(std::make_unique<Store>());
    nn::StateDict weights;  // another seed: the load is what counts
    run(chain()[i].plan, kSeed + 100 + i, 0, 0, previous, stores.back().get(), &weights);
    const auto got = assemble(*stores.back());
    // The layout's own gather (not the checkpoint's regions) sees the same weights.
    for (const auto& [name, tensor] : weights) {
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_EQ(std::memcmp(got.at(name).data(), tensor.raw_data(), got.at(name).size()), 0)
          << chain()[i].name << ": " << name << " loaded into the wrong places";
    }
    ASSERT_EQ(got.size(), expected.size()) << chain()[i].name;
    for (const auto& [name, bytes] : expected)
      EXPECT_TRUE(got.at(name) == bytes) << chain()[i - 1].name << " -> " << chain()[i].name << ": " << name
                                         << " changed on the way";
    EXPECT_EQ(stores.back()->run_state.at("optimizer_steps"), 2) << chain()[i].name;
    previous = stores.back().get();
  }
}

// Mixed precision: the 16-bit weights, the f32 moments and the f32 master weights, through
// layouts that keep the master in different places (ZeRO's shard, FSDP's units, AdamW's buffers,
// offload's host shard).
TEST(CheckpointResharding, MixedPrecisionStateRoundTripsWithItsMasterWeights) {
  auto bf16 = [](TrainPlan p) {
    p.precision = nn::MixedPrecision::parse("bf16");
    return p;
  };
  const std::vector<Hop> hops = {{"bf16_zero2_dp2", bf16(plan_of({.dp_shard = 2}, 2))},
                                 {"bf16_hsdp2x2", bf16(plan_of({.dp_replicate = 2, .dp_shard = 2}, 3))},
                                 {"bf16_tp2_pp2", bf16(plan_of({.pp = 2, .tp = 2}, 0, 2))},
                                 {"bf16_zero1_offload_dp2", bf16(offload(plan_of({.dp_shard = 2}, 1)))},
                                 {"bf16_ddp2", bf16(plan_of({.dp_replicate = 2}))}};
  Store first;
  run(hops[0].plan, kSeed, 0, 2, nullptr, &first);
  const auto expected = assemble(first);
  ASSERT_TRUE(expected.count("master.h.1.mlp.c_fc.weight"));
  EXPECT_EQ(first.tensors.at("h.1.mlp.c_fc.weight").dtype, DType::bf16);
  EXPECT_EQ(first.tensors.at("master.h.1.mlp.c_fc.weight").dtype, DType::f32);
  const Store* previous = &first;
  std::vector<std::unique_ptr<Store>> stores;
  for (size_t i = 1; i < hops.size(); ++i) {
    stores.push_back(std::make_unique<Store>());
    run(hops[i].plan, kSeed + 50 + i, 0, 0, previous, stores.back().get());
    EXPECT_TRUE(assemble(*stores.back()) == expected) << hops[i - 1].name << " -> " << hops[i].name;
    previous = stores.back().get();
  }
}

// Resume under another layout: the loss curve continues the uninterrupted serial run's.
class CheckpointResume : public testing::TestWithParam<std::pair<Hop, Hop>> {};

TEST_P(CheckpointResume, AnotherLayoutContinuesTheSerialCurve) {
  const auto& [before, after] = GetParam();
  const std::vector<double> serial = run(plan_of({}), kSeed, 0, 5, nullptr, nullptr);
  Store saved;
  const std::vector<double> head = run(before.plan, kSeed, 0, 3, nullptr, &saved);
  const std::vector<double> tail = run(after.plan, kSeed + 7, 3, 2, &saved, nullptr);
  for (int s = 0; s < 3; ++s) EXPECT_NEAR(head[s], serial[s], 4e-5 + 1e-5 * serial[s]) << before.name << " step " << s;
  for (int s = 0; s < 2; ++s)
    EXPECT_NEAR(tail[s], serial[3 + s], 4e-5 + 1e-5 * serial[3 + s]) << before.name << " -> " << after.name
                                                                      << " step " << 3 + s;
}

INSTANTIATE_TEST_SUITE_P(Pairs, CheckpointResume,
                         testing::Values(std::pair{chain()[0], chain()[1]}, std::pair{chain()[1], chain()[2]},
                                         std::pair{chain()[4], chain()[3]}, std::pair{chain()[5], chain()[8]},
                                         std::pair{chain()[6], chain()[7]}, std::pair{chain()[9], chain()[10]},
                                         std::pair{chain()[11], chain()[12]}, std::pair{chain()[12], chain()[4]},
                                         std::pair{chain()[13], chain()[0]}, std::pair{chain()[3], chain()[13]}),
                         [](const auto& info) { return info.param.first.name + "_to_" + info.param.second.name; });

// Resume under the same layout: the same bytes as never stopping, losses and every tensor.
TEST(CheckpointResume, TheSameLayoutResumesBitwise) {
  for (const Hop& hop : {chain()[1], chain()[5], chain()[6]}) {
    Store straight, stopped, resumed;
    const std::vector<double> all = run(hop.plan, kSeed, 0, 4, nullptr, &straight);
    run(hop.plan, kSeed, 0, 2, nullptr, &stopped);
    const std::vector<double> rest = run(hop.plan, kSeed + 5, 2, 2, &stopped, &resumed);
    EXPECT_EQ(rest[0], all[2]) << hop.name;
    EXPECT_EQ(rest[1], all[3]) << hop.name;
    EXPECT_TRUE(assemble(resumed) == assemble(straight)) << hop.name << ": the resumed run's state differs";
  }
}

// Every tensor of `got` byte for byte as in `want`, naming each one that differs.
void expect_same_state(const Store& got, const Store& want, const std::string& what) {
  const auto a = assemble(got), b = assemble(want);
  for (const auto& [name, bytes] : b) {
    auto it = a.find(name);
    if (it == a.end())
      ADD_FAILURE() << what << ": " << name << " was not saved";
    else
      EXPECT_TRUE(it->second == bytes) << what << ": " << name << " differs from the uninterrupted run's";
  }
  EXPECT_EQ(a.size(), b.size()) << what;
}

// fp16 with dynamic loss scaling resumes its scaler: the scale, the clean steps since it last changed
// and the skipped steps. The scaler starts at 2^20, too large for these gradients in fp16, and grows
// every 2 clean steps, so the run skips steps, backs off, grows and overflows again (tp2_pp2: skips
// at steps 0 and 5; hsdp2x2, whose ranks' partial gradients are 4 times the average: at 0, 1, 2 and
// 7). Stopped after step 4 or 5, with skips behind and ahead and the scale away from where it
// started, the resumed run must step, skip and grow as the uninterrupted one: the same scaler after
// every step, the same losses and the same bytes.
TEST(CheckpointResume, Fp16ResumesTheLossScaleAndItsCounters) {
  const double init_scale = std::ldexp(1.0, 20);
  auto fp16 = [&](TrainPlan p) {
    p.precision = nn::MixedPrecision::parse("fp16");
    p.precision.loss_scale.init_scale = init_scale;
    p.precision.loss_scale.growth_interval = 2;
    return p;
  };
  constexpr int64_t kTotal = 8;
  const std::vector<int64_t> stops = {4, 5};
  for (const Hop& hop : {Hop{"fp16_tp2_pp2", fp16(plan_of({.pp = 2, .tp = 2}, 0, 2))},
                         Hop{"fp16_hsdp2x2", fp16(plan_of({.dp_replicate = 2, .dp_shard = 2}, 3))}}) {
    Store straight;
    std::vector<ScalerState> all_scaler;
    const std::vector<double> all = run(hop.plan, kSeed, 0, kTotal, nullptr, &straight, nullptr, &all_scaler);
    // The run this test is about: at the stops a skip behind, one ahead, a count of clean steps and
    // a scale that a fresh scaler would not have.
    bool clean = false, moved = false;
    for (int64_t stop : stops) {
      const ScalerState& at = all_scaler[static_cast<size_t>(stop - 1)];
      ASSERT_GT(at.skipped_steps, 0) << hop.name << " at " << stop << ": " << at;
      ASSERT_GT(all_scaler.back().skipped_steps, at.skipped_steps) << hop.name << " after " << stop;
      clean = clean || at.clean_steps > 0;
      moved = moved || at.scale != init_scale;
    }
    ASSERT_TRUE(clean && moved) << hop.name;
    for (int64_t stop : stops) {
      Store stopped, resumed;
      run(hop.plan, kSeed, 0, stop, nullptr, &stopped);
      std::vector<ScalerState> rest_scaler;
      const std::vector<double> rest =
          run(hop.plan, kSeed + 5, stop, kTotal - stop, &stopped, &resumed, nullptr, &rest_scaler);
      for (int64_t s = stop; s < kTotal; ++s) {
        const size_t i = static_cast<size_t>(s - stop);
        EXPECT_EQ(rest_scaler[i], all_scaler[static_cast<size_t>(s)])
            << hop.name << " stopped after " << stop << ", step " << s;
        EXPECT_EQ(rest[i], all[static_cast<size_t>(s)]) << hop.name << " stopped after " << stop << ", step " << s;
      }
      expect_same_state(resumed, straight, hop.name + " stopped after " + std::to_string(stop));
    }
  }
}

// bf16 resumes its f32 master weights and moments and keeps training from them: after two more
// steps every tensor (16-bit weights, master weights, moments) equals the uninterrupted run's, byte
// for byte. A save/load round trip cannot see an optimizer that rebuilds its master from the 16-bit
// weights, or zeroes its moments, at its first step: only a step after the load can. The layouts
// keep the master in different places (ZeRO's shard, FSDP's units, AdamW's buffers, offload's host).
TEST(CheckpointResume, Bf16MasterWeightsAndMomentsResumeAndKeepTraining) {
  auto bf16 = [](TrainPlan p) {
    p.precision = nn::MixedPrecision::parse("bf16");
    return p;
  };
  for (const Hop& hop : {Hop{"bf16_zero2_dp2", bf16(plan_of({.dp_shard = 2}, 2))},
                         Hop{"bf16_hsdp2x2", bf16(plan_of({.dp_replicate = 2, .dp_shard = 2}, 3))},
                         Hop{"bf16_tp2_pp2", bf16(plan_of({.pp = 2, .tp = 2}, 0, 2))},
                         Hop{"bf16_zero1_offload_dp2", bf16(offload(plan_of({.dp_shard = 2}, 1)))}}) {
    Store straight, stopped, resumed;
    const std::vector<double> all = run(hop.plan, kSeed, 0, 4, nullptr, &straight);
    run(hop.plan, kSeed, 0, 2, nullptr, &stopped);
    ASSERT_TRUE(stopped.tensors.count("master.h.2.mlp.c_proj.weight")) << hop.name;
    ASSERT_EQ(stopped.tensors.at("master.h.2.mlp.c_proj.weight").dtype, DType::f32) << hop.name;
    const std::vector<double> rest = run(hop.plan, kSeed + 5, 2, 2, &stopped, &resumed);
    EXPECT_EQ(rest[0], all[2]) << hop.name;
    EXPECT_EQ(rest[1], all[3]) << hop.name;
    expect_same_state(resumed, straight, hop.name);
  }
}

}  // namespace
}  // namespace sl::parallel
