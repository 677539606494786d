// test_fsdp.cpp — ZeRO-3 / FSDP and HSDP (parallel/zero/fsdp.h) against the serial GPT + nn::AdamW +
// nn::clip_grad_norm run: losses, norms, gradients and parameters after every step at worlds 1-4 and
// at dp_replicate x dp_shard 2x1, 1x2, 2x2; the ledger's memory held between steps and at the peak,
// and the bytes each step moves, against formulas worked out here from the model's shapes; the
// in-place release of a Storage that FSDP's freeing rests on.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "autograd/grad_mode.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "parallel/zero/fsdp.h"
#include "tests/support/compare.h"
#include "tests/support/serial_run.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer.h"

namespace sl::parallel {
namespace {

constexpr int kSteps = 5;
constexpr int64_t kBatch = 12, kBlock = 8;
constexpr double kMaxNorm = 0.5;
constexpr uint64_t kSeed = 11;
constexpr test_support::Tolerance kTol{.atol = 1e-5, .rtol = 1.3e-6};

nn::GPTConfig small_config() { return parity_config(); }
nn::AdamWOptions adamw_options() { return parity_adamw(); }  // lr 1e-2, wd 0.1, eps 1e-6: tests/support/parallel.h says why

const nn::TokenStream& stream() {
  static const nn::TokenStream tokens = [] {
    nn::TokenStream s;
    s.vocab_size = 32;
    uint64_t x = 2024;
    for (int i = 0; i < 700; ++i) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;  // Knuth's LCG: a fixed pseudo-random text
      s.tokens.push_back(static_cast<int32_t>((x >> 33) % 32));
    }
    return s;
  }();
  return tokens;
}

using Values = std::map<std::string, std::vector<float>>;  // parameter name -> flat values

Values values_of(const nn::StateDict& state) {
  Values out;
  for (const auto& [name, tensor] : state)  // a GPU's tensors (SL_TEST_DEVICE=cuda) come down first
    out[name] = (tensor.device().is_cuda() ? tensor.to(Device::cpu()) : tensor).values<float>();
  return out;
}

struct Trace {
  Values initial;
  std::vector<double> losses, norms;
  std::vector<Values> grads, params;  // grads before clipping; params after the step
  Values optimizer_state;             // after the last step: "<name>.exp_avg", "<name>.exp_avg_sq"
  int64_t steps = 0;                  // nn::AdamW's step count of every parameter
};

// The serial run (tests/support/serial_run.h), clipped at kMaxNorm, as name -> values.
const Trace& serial() {
  static const Trace trace = [] {
    // SL_TEST_DEVICE=cuda: on cuda:0, as the ranks; else away from the ranks' cpu:0..3.
    DeviceGuard device(test_on_cuda() ? Device::cuda(0) : Device::cpu(80));
    const test_support::SerialRun run = test_support::serial_run(
        {.config = small_config(), .seed = kSeed, .adamw = adamw_options(), .steps = kSteps, .clip = kMaxNorm},
        [](int step) { return stream().get_batch(step, kBatch, kBlock); });
    Trace t;
    t.initial = values_of(test_support::state_of(run.initial));
    for (const test_support::SerialStep& step : run.steps) {
      t.losses.push_back(step.loss);
      t.norms.push_back(step.norm);
      t.grads.push_back(values_of(test_support::state_of(step.grads)));
      t.params.push_back(values_of(test_support::state_of(step.params)));
    }
    const nn::StateDict& state = run.optimizer_state;  // "state.{i}.exp_avg" in parameter order
    size_t i = 0;
    for (const auto& [name, p] : run.initial) {
      const std::string key = "state." + std::to_string(i++) + ".";
      t.optimizer_state[name + ".exp_avg"] = values_of({{"m", state.at(key + "exp_avg")}}).at("m");
      t.optimizer_state[name + ".exp_avg_sq"] = values_of({{"v", state.at(key + "exp_avg_sq")}}).at("v");
      t.steps = static_cast<int64_t>(state.at(key + "step").item());
    }
    return t;
  }();
  return trace;
}

using test_support::at;
using test_support::expect_close;  // every value of every parameter within kTol

TEST(FsdpSerial, ReferenceClips) {
  int clipped = 0;
  for (double norm : serial().norms) clipped += norm > kMaxNorm;
  EXPECT_GT(clipped, 0) << "max_norm " << kMaxNorm << " never clips: the test would not test clipping";
}

// ---- layouts: dp_replicate x dp_shard (replicate 1 = plain FSDP over the world) ------------------------

struct Layout {
  int replicate = 1, shard = 1;
  bool hsdp = false;     // built from a DeviceMesh (HSDP), else FullyShardedGPT(model, world)
  bool offload = false;  // FsdpOptions::offload
  int world() const { return replicate * shard; }
};

void PrintTo(const Layout& l, std::ostream* out) {
  *out << "dp_replicate " << l.replicate << " x dp_shard " << l.shard << (l.hsdp ? " (mesh)" : "")
       << (l.offload ? " offload" : "");
}

std::string layout_name(const testing::TestParamInfo<Layout>& info) {
  const Layout& l = info.param;
  const std::string offload = l.offload ? "_offload" : "";
  if (!l.hsdp) return "world" + std::to_string(l.world()) + offload;
  return "replicate" + std::to_string(l.replicate) + "_shard" + std::to_string(l.shard) + offload;
}

// Runs fn(ctx, fsdp, model) on every rank of the layout, comparing every collective's fingerprint
// across ranks (debug mode): the gathers and reduce-scatters fired from inside backward must line up.
// on_device: on SL_TEST_DEVICE (the parity suite); the ledger's suites stay on the CPU.
template <typename Fn>
void run_layout(const Layout& layout, Fn&& fn, bool on_device = false) {
  launch(
      layout.world(),
      [&](RankContext& ctx) {
        nn::GPT model(small_config(), kSeed);
        if (layout.hsdp) {
          DeviceMesh mesh(ctx.world, {.dp_replicate = layout.replicate, .dp_shard = layout.shard});
          FullyShardedGPT fsdp(model, mesh, adamw_options(), {.offload = layout.offload});
          fn(ctx, fsdp, model);
        } else {
          FullyShardedGPT fsdp(model, ctx.world, nullptr, adamw_options(), {.offload = layout.offload});
          fn(ctx, fsdp, model);
        }
      },
      on_device ? on_test_device(quick(20000, /*debug=*/true), layout.world()) : quick(5000, /*debug=*/true));
}

nn::Batch rank_batch(int step, const RankContext& ctx) {
  // Rows [r B/N, (r+1) B/N) of the global batch; the dp rank is the world rank (B = 12 splits over 1-4).
  const int64_t begin = ctx.rank * kBatch / ctx.world_size, end = (ctx.rank + 1) * kBatch / ctx.world_size;
  return stream().get_batch(step, kBatch, kBlock, begin, end);
}

class Fsdp : public testing::TestWithParam<Layout> {};
class Hsdp : public testing::TestWithParam<Layout> {};

// SL_TEST_DEVICE=cuda (tests/support/parallel.h): the serial run on cuda:0, the ranks on the GPU(s);
// offload keeps the shards and the update on each rank's host.
void matches_serial(const Layout& layout) {
  SL_SKIP_UNLESS_WORLD(layout.world());
  SL_SKIP_UNLESS_TEST_DEVICE_RUNS(layout.world());
  const Trace& want = serial();
  run_layout(layout, [&](RankContext& ctx, FullyShardedGPT& fsdp, nn::GPT&) {
    expect_close(values_of(fsdp.full_state_dict()), want.initial, kTol, "initial parameters");
    for (int step = 0; step < kSteps; ++step) {
      nn::Batch batch = rank_batch(step, ctx);
      Tensor loss = fsdp.loss(batch.inputs, batch.targets);
      loss.backward();
      Tensor global_loss = full({1}, loss.item());
      ctx.world->all_reduce(global_loss, ReduceOp::avg);  // mean of equal-sized rows' means
      EXPECT_TRUE(kTol.admits(global_loss.item(), want.losses[step]))
          << "step " << step << " loss " << global_loss.item() << ", serial " << want.losses[step];
      expect_close(values_of(fsdp.full_grads()), want.grads[step], kTol, at("gradients", ctx.rank, step));
      double norm = fsdp.clip_grad_norm(kMaxNorm);
      EXPECT_TRUE(kTol.admits(norm, want.norms[step]))
          << "step " << step << " norm " << norm << ", serial " << want.norms[step];
      fsdp.step();
      fsdp.zero_grad();
      expect_close(values_of(fsdp.full_state_dict()), want.params[step], kTol, at("parameters", ctx.rank, step));
    }
    // AdamW's moments, gathered from the shards, against the serial optimizer's.
    nn::StateDict state = fsdp.full_optimizer_state();
    Values moments;
    for (const auto& [key, tensor] : state) {
      if (key.size() > 5 && key.substr(key.size() - 5) == ".step")
        EXPECT_EQ(static_cast<int64_t>(tensor.item()), want.steps) << key;
      else
        moments[key] = values_of({{key, tensor}}).at(key);
    }
    expect_close(moments, want.optimizer_state, kTol, at("optimizer state after the last step", ctx.rank));
  }, /*on_device=*/true);
}

TEST_P(Fsdp, MatchesSerial) { matches_serial(GetParam()); }
TEST_P(Hsdp, MatchesSerial) { matches_serial(GetParam()); }

// ---- memory from the ledger, against sizes worked out from the model's shapes ---------------------------

struct Expected {
  int64_t shard = 0;             // sum of P_u / N: elements of each of weights, grads, exp_avg, exp_avg_sq
  int64_t padded = 0;            // sum of P_u
  int64_t largest_gathered = 0;  // P_root + the largest P_block
  std::vector<int64_t> unit_shards;
};

Expected expected_sizes(const nn::GPT& model, int n) {
  std::map<std::string, int64_t> unit_numel;  // "root", "h.0", ...
  for (const auto& [name, p] : model.named_parameters()) {
    std::string unit = name.rfind("h.", 0) == 0 ? name.substr(0, name.find('.', 2)) : "root";
    unit_numel[unit] += p.numel();
  }
  Expected e;
  int64_t largest_block = 0;
  for (const auto& [unit, numel] : unit_numel) {
    int64_t padded = (numel + n - 1) / n * n;
    e.padded += padded;
    e.shard += padded / n;
    e.unit_shards.push_back(padded / n);
    if (unit != "root") largest_block = std::max(largest_block, padded);
  }
  e.largest_gathered = (unit_numel["root"] + n - 1) / n * n + largest_block;
  return e;
}

class FsdpMemory : public testing::TestWithParam<Layout> {};
class HsdpMemory : public testing::TestWithParam<Layout> {};

void memory_matches_formulas(const Layout& layout) {
  SL_SKIP_UNLESS_WORLD(layout.world());
  launch(
      layout.world(),
      [&](RankContext& ctx) {
        MemoryLedger& ledger = MemoryLedger::instance();
        const Device dev = ctx.device;
        auto now = [&](MemoryCategory c) { return ledger.current(dev, c); };
        const int64_t weights0 = now(MemoryCategory::weights), grads0 = now(MemoryCategory::grads),
                      optimizer0 = now(MemoryCategory::optimizer);
        {
          nn::GPT model(small_config(), kSeed);
          const int64_t psi = model.num_parameters();
          Expected e = expected_sizes(model, layout.shard);
          DeviceMesh mesh(ctx.world, {.dp_replicate = layout.replicate, .dp_shard = layout.shard});
          FullyShardedGPT fsdp(model, mesh, adamw_options());
          ASSERT_EQ(fsdp.shard_numel(), e.shard);
          ASSERT_EQ(fsdp.padded_numel(), e.padded);
          ASSERT_EQ(fsdp.largest_gathered_numel(), e.largest_gathered);
          auto expect_held = [&](const std::string& when) {
            EXPECT_EQ(now(MemoryCategory::weights) - weights0, 4 * e.shard) << when;
            EXPECT_EQ(now(MemoryCategory::grads) - grads0, 4 * e.shard) << when;
            EXPECT_EQ(now(MemoryCategory::optimizer) - optimizer0, 8 * e.shard) << when;
          };
          expect_held("after wrapping");
          int64_t peak_weights = 0, peak_grads = 0;
          for (int step = 0; step < 2; ++step) {
            ledger.reset_peak(dev);
            nn::Batch batch = rank_batch(step, ctx);
            Tensor loss = fsdp.loss(batch.inputs, batch.targets);
            // The graph holds every unit's saved weights, yet their bytes are released: only shards remain.
            EXPECT_EQ(now(MemoryCategory::weights) - weights0, 4 * e.shard) << "between forward and backward";
            EXPECT_EQ(ledger.peak(dev, MemoryCategory::weights) - weights0, 4 * (e.shard + e.largest_gathered))
                << "forward: the shards + the gathered root + the largest block";
            EXPECT_EQ(ledger.peak(dev, MemoryCategory::grads) - grads0, 4 * e.shard) << "forward makes no gradients";
            loss.backward();
            peak_weights = ledger.peak(dev, MemoryCategory::weights) - weights0;
            peak_grads = ledger.peak(dev, MemoryCategory::grads) - grads0;
            EXPECT_EQ(peak_weights, 4 * (e.shard + e.largest_gathered)) << "backward gathers the same set";
            EXPECT_EQ(peak_grads, 4 * (e.shard + e.largest_gathered)) << "their full gradients beside them";
            fsdp.clip_grad_norm(kMaxNorm);
            fsdp.step();
            fsdp.zero_grad();
            expect_held("between steps " + std::to_string(step));
            EXPECT_EQ(ledger.peak(dev, MemoryCategory::optimizer) - optimizer0, 8 * e.shard);
          }
          if (ctx.rank == 0)
            std::printf(
                "[ FSDP     ] %s  Ψ %lld  padded %lld  held/rank: weights %lld  grads %lld  optimizer %lld"
                " = 16Ψ/N %.0f (+padding)  peak: weights %lld  grads %lld  (largest gathered %lld)\n",
                layout.hsdp ? ("dp_replicate " + std::to_string(layout.replicate) + " x dp_shard " +
                               std::to_string(layout.shard))
                                  .c_str()
                            : ("world " + std::to_string(layout.world())).c_str(),
                static_cast<long long>(psi), static_cast<long long>(e.padded), static_cast<long long>(4 * e.shard),
                static_cast<long long>(4 * e.shard), static_cast<long long>(8 * e.shard),
                16.0 * static_cast<double>(psi) / layout.shard, static_cast<long long>(peak_weights),
                static_cast<long long>(peak_grads), static_cast<long long>(4 * e.largest_gathered));
        }
        EXPECT_EQ(now(MemoryCategory::weights), weights0) << "nothing outlives the model and its wrapper";
        EXPECT_EQ(now(MemoryCategory::grads), grads0);
        EXPECT_EQ(now(MemoryCategory::optimizer), optimizer0);
      },
      quick());
}

TEST_P(FsdpMemory, HeldBetweenStepsAndPeak) { memory_matches_formulas(GetParam()); }
TEST_P(HsdpMemory, HeldBetweenStepsAndPeak) { memory_matches_formulas(GetParam()); }

// ---- communication per step from the groups' ledgers -------------------------------------------------------

class FsdpComm : public testing::TestWithParam<Layout> {};
class HsdpComm : public testing::TestWithParam<Layout> {};

void comm_matches_formulas(const Layout& layout) {
  SL_SKIP_UNLESS_WORLD(layout.world());
  run_layout(layout, [&](RankContext& ctx, FullyShardedGPT& fsdp, nn::GPT& model) {
    const int n = layout.shard, r = layout.replicate;
    Expected e = expected_sizes(model, n);
    const int64_t psi = model.num_parameters();
    ProcessGroupPtr shard = fsdp.shard_group();
    ProcessGroupPtr replicas = fsdp.replicate_group();
    ASSERT_EQ(shard->size(), n);
    for (int step = 0; step < 2; ++step) {
      shard->ledger().reset();
      if (replicas) replicas->ledger().reset();
      nn::Batch batch = rank_batch(step, ctx);
      fsdp.loss(batch.inputs, batch.targets).backward();
      fsdp.clip_grad_norm(kMaxNorm);
      fsdp.step();
      fsdp.zero_grad();
      const int units = static_cast<int>(e.unit_shards.size());
      CommStats gather = shard->ledger()[CommOp::all_gather];
      CommStats scatter = shard->ledger()[CommOp::reduce_scatter];
      // (n-1)/n x 4P per all-gather of the model, once in forward and once in backward; then the
      // clipping norm's partial sums, one f64 per rank, gathered and added in rank order.
      EXPECT_EQ(gather.calls, 2 * units + 1);
      EXPECT_EQ(gather.bytes_sent, 2 * (n - 1) * 4 * e.shard + (n - 1) * 8);
      EXPECT_EQ(gather.bytes_received, 2 * (n - 1) * 4 * e.shard + (n - 1) * 8);
      EXPECT_EQ(scatter.calls, units);
      EXPECT_EQ(scatter.bytes_sent, (n - 1) * 4 * e.shard);
      EXPECT_EQ(scatter.bytes_received, (n - 1) * 4 * e.shard);
      EXPECT_EQ(shard->ledger()[CommOp::all_reduce].calls, 0) << "the norm is gathered, not all-reduced";
      if (replicas && r > 1) {
        CommStats averaged = replicas->ledger()[CommOp::all_reduce];
        int64_t expected = 0;
        for (int64_t s : e.unit_shards) {
          ASSERT_EQ(s % r, 0) << "the test's shards split evenly over the replicas";
          expected += 2 * (r - 1) * 4 * s / r;  // ring all-reduce of each gradient shard
        }
        EXPECT_EQ(averaged.calls, units);
        EXPECT_EQ(averaged.bytes_sent, expected);
      }
      if (ctx.rank == 0 && step == 1 && n > 1) {
        const double ddp = 2.0 * (n - 1) / n * 4 * static_cast<double>(psi);
        const double norm_bytes = (n - 1) * 8.0;  // the clipping norm's partial sums, not the model's
        const double sent = static_cast<double>(gather.bytes_sent + scatter.bytes_sent) - norm_bytes;
        std::printf(
            "[ FSDP     ] shard %d: all-gather %lld + reduce-scatter %lld bytes/step/rank = %.3fx DDP's "
            "2(n-1)/n 4Ψ (%.0f)\n",
            n, static_cast<long long>(gather.bytes_sent), static_cast<long long>(scatter.bytes_sent), sent / ddp, ddp);
        EXPECT_NEAR(sent / ddp, 1.5, 1.5 * (static_cast<double>(e.padded) / static_cast<double>(psi) - 1) + 1e-12);
      }
    }
  });
}

TEST_P(FsdpComm, PerStepBytes) { comm_matches_formulas(GetParam()); }
TEST_P(HsdpComm, PerStepBytes) { comm_matches_formulas(GetParam()); }

// ---- the pieces: in-place release, padding, misuse -------------------------------------------------------

TEST(FsdpStorage, ReleaseAndReallocateInPlaceKeepTheLedgerExact) {
  const Device dev = Device::cpu(81);
  DeviceGuard device(dev);
  MemoryLedger& ledger = MemoryLedger::instance();
  const int64_t before = ledger.current(dev, MemoryCategory::weights);
  Tensor weight;
  {
    MemoryScope scope(MemoryCategory::weights);
    weight = full({10}, 3.0);
  }
  Tensor saved = weight.detach();  // what autograd keeps: another handle on the same Storage
  Storage& storage = *weight.impl()->storage;
  EXPECT_EQ(ledger.current(dev, MemoryCategory::weights) - before, 40);
  storage.release();
  EXPECT_FALSE(storage.is_allocated());
  EXPECT_EQ(storage.bytes(), 40);
  EXPECT_EQ(ledger.current(dev, MemoryCategory::weights), before) << "released while two tensors still name it";
  expect_error([&] { (void)saved.values<float>(); }, "the 40 bytes on cpu:81 were released");
  storage.release();  // twice is harmless
  {
    MemoryScope scope(MemoryCategory::activations);  // the storage keeps its own category
    storage.reallocate();
  }
  EXPECT_EQ(ledger.current(dev, MemoryCategory::weights) - before, 40);
  weight.fill_(7.0);
  EXPECT_EQ(saved.values<float>(), std::vector<float>(10, 7.0f)) << "every handle sees the new bytes";
  weight = Tensor();
  saved = Tensor();
  EXPECT_EQ(ledger.current(dev, MemoryCategory::weights), before);
}

TEST(FsdpPadding, World3PadsEachUnitAndUnpadsOnGather) {
  SL_SKIP_UNLESS_WORLD(3);
  launch(
      3,
      [&](RankContext& ctx) {
        nn::GPT model(small_config(), kSeed);
        const Values initial = values_of(model.state_dict());
        FullyShardedGPT fsdp(model, ctx.world, nullptr, adamw_options());
        ASSERT_EQ(fsdp.units().size(), 3u);
        // A block: 2 LayerNorms (2 x 32) + c_attn 816 + c_proj 272 + c_fc 1088 + c_proj 1040 = 3280 -> 3282.
        const FsdpUnit& block = *fsdp.units()[1];
        EXPECT_EQ(block.name(), "h.0");
        EXPECT_EQ(block.layout().numel, 3280);
        EXPECT_EQ(block.layout().padded_numel, 3282);
        EXPECT_EQ(block.layout().shard_numel, 1094);
        EXPECT_EQ(fsdp.units()[0]->layout().numel, 32 * 16 + 8 * 16 + 2 * 16);  // root: wte, wpe, ln_f
        for (int step = 0; step < 2; ++step) {
          nn::Batch batch = rank_batch(step, ctx);
          fsdp.loss(batch.inputs, batch.targets).backward();
          fsdp.clip_grad_norm(kMaxNorm);
          fsdp.step();
          if (ctx.rank == 2) {  // the last shard ends in the two padding elements: never written
            std::vector<float> w = block.weight_shard().values<float>(), g = block.grad_shard().values<float>();
            EXPECT_EQ(w[1092], 0.0f);
            EXPECT_EQ(w[1093], 0.0f);
            EXPECT_EQ(g[1093], 0.0f);
            EXPECT_NE(w[1091], 0.0f);
          }
          fsdp.zero_grad();
        }
        Values gathered = values_of(fsdp.full_state_dict());
        EXPECT_EQ(gathered.size(), initial.size());
        for (const auto& [name, values] : initial) EXPECT_EQ(gathered[name].size(), values.size()) << name;
      },
      quick());
}

TEST(FsdpErrors, MisuseRaisesClearErrors) {
  SL_SKIP_UNLESS_WORLD(2);
  launch(
      2,
      [&](RankContext& ctx) {
        nn::GPT model(small_config(), kSeed);
        FullyShardedGPT fsdp(model, ctx.world, nullptr, adamw_options());
        expect_error([&] { fsdp.forward(zeros({8}, DType::i64)); }, "idx must be [B, T] token ids, got shape [8]");
        expect_error([&] { fsdp.forward(zeros({1, 9}, DType::i64)); }, "sequence length 9 is longer than block_size 8");
        expect_error([&] { fsdp.clip_grad_norm(0); }, "max_norm must be positive (got 0)");
        // FSDP is forward hooks on the model: the model's own forward gathers and frees as fsdp.forward does.
        Tensor ids = zeros({1, 4}, DType::i64);
        EXPECT_EQ(model.loss(ids, ids).item(), fsdp.loss(ids, ids).item());
        {  // Once the wrapper is gone, so are its hooks: the weights stay in released shards, and reading them says so.
          nn::GPT wrapped_once(small_config(), kSeed);
          { FullyShardedGPT gone(wrapped_once, ctx.world, nullptr, adamw_options()); }
          expect_error([&] { wrapped_once.loss(ids, ids); }, "were released");
        }
        expect_error([&] { FullyShardedGPT(model, nullptr); }, "the shard group is null");
        DeviceMesh tp_mesh(ctx.world, {.tp = 2});
        nn::GPT other(small_config(), kSeed);
        expect_error([&] { FullyShardedGPT(other, tp_mesh); }, "pp, cp and tp must be 1");
      },
      quick());
}

TEST(FsdpForward, NoGradForwardMatchesSerialLogitsAndFreesEveryUnit) {
  SL_SKIP_UNLESS_WORLD(3);
  std::vector<float> serial_logits;  // [12, 8, 32] of step 0's batch
  {
    DeviceGuard device(Device::cpu(80));
    nn::GPT model(small_config(), kSeed);
    nn::Batch batch = stream().get_batch(0, kBatch, kBlock);
    NoGradGuard no_grad;
    serial_logits = model.forward(batch.inputs).values<float>();
  }
  launch(
      3,
      [&](RankContext& ctx) {
        nn::GPT model(small_config(), kSeed);
        FullyShardedGPT fsdp(model, ctx.world, nullptr, adamw_options());
        const int64_t held = MemoryLedger::instance().current(ctx.device, MemoryCategory::weights);
        NoGradGuard no_grad;  // no graph: nothing is gathered again, nothing waits for a backward
        std::vector<float> mine = fsdp.forward(rank_batch(0, ctx).inputs).values<float>();
        const size_t row = static_cast<size_t>(kBlock * small_config().vocab_size);
        ASSERT_EQ(mine.size(), 4 * row);
        const auto first = serial_logits.begin() + static_cast<std::ptrdiff_t>(ctx.rank * 4 * row);
        expect_close(mine, std::vector<float>(first, first + static_cast<std::ptrdiff_t>(4 * row)), kTol,
                     at("logits", ctx.rank));
        EXPECT_EQ(MemoryLedger::instance().current(ctx.device, MemoryCategory::weights), held);
        for (const auto& unit : fsdp.units()) EXPECT_EQ(unit->state(), FsdpUnit::State::sharded) << unit->name();
      },
      quick());
}

TEST(FsdpBackward, GradientsAccumulateOverMicroBatches) {
  SL_SKIP_UNLESS_WORLD(2);
  const Trace& want = serial();
  launch(
      2,
      [&](RankContext& ctx) {
        nn::GPT model(small_config(), kSeed);
        FullyShardedGPT fsdp(model, ctx.world, nullptr, adamw_options());
        // Rank r's 6 rows as two micro-batches of 3, each loss halved: the same mean gradient.
        for (int half = 0; half < 2; ++half) {
          int64_t begin = ctx.rank * 6 + half * 3;
          nn::Batch batch = stream().get_batch(0, kBatch, kBlock, begin, begin + 3);
          mul(fsdp.loss(batch.inputs, batch.targets), 0.5).backward();
        }
        expect_close(values_of(fsdp.full_grads()), want.grads[0], kTol, at("accumulated gradients", ctx.rank));
      },
      quick());
}

// Offload: every shard (weights, gradients, AdamW's m and v: 16 S) lives on the host; the device holds
// only what is gathered. Per step the weight shards move up twice (forward and backward gathers) and
// the reduced gradient shards down once: 3 x 4S. (cpu:r -> cpu:r on a CPU-only build.)
TEST(FsdpOffload, ShardsAndTheUpdateLiveOnTheHost) {
  for (int n : {2, 3}) {
    SL_SKIP_UNLESS_WORLD(n);
    launch(
        n,
        [&](RankContext& ctx) {
          MemoryLedger& ledger = MemoryLedger::instance();
          const Device dev = ctx.device;
          auto now = [&](MemoryCategory c) { return ledger.current(dev, c); };
          const int64_t weights0 = now(MemoryCategory::weights), grads0 = now(MemoryCategory::grads),
                        optimizer0 = now(MemoryCategory::optimizer), offload0 = now(MemoryCategory::offload);
          nn::GPT model(small_config(), kSeed);
          const Expected e = expected_sizes(model, n);
          FullyShardedGPT fsdp(model, ctx.world, nullptr, adamw_options(), {.offload = true});
          for (int step = 0; step < 2; ++step) {
            const std::string when = "world " + std::to_string(n) + " step " + std::to_string(step);
            ledger.reset_peak(dev);
            const int64_t moved0 = ledger.transferred(dev, dev);
            nn::Batch batch = rank_batch(step, ctx);
            fsdp.loss(batch.inputs, batch.targets).backward();
            fsdp.clip_grad_norm(kMaxNorm);
            fsdp.step();
            fsdp.zero_grad();
            EXPECT_EQ(now(MemoryCategory::offload) - offload0, 16 * e.shard) << when;
            EXPECT_EQ(now(MemoryCategory::weights) - weights0, 0) << when;
            EXPECT_EQ(now(MemoryCategory::grads) - grads0, 0) << when;
            EXPECT_EQ(now(MemoryCategory::optimizer) - optimizer0, 0) << when;
            EXPECT_EQ(ledger.peak(dev, MemoryCategory::weights) - weights0, 4 * e.largest_gathered) << when;
            EXPECT_EQ(ledger.transferred(dev, dev) - moved0, 3 * 4 * e.shard) << when;
          }
        },
        quick());
  }
}

// The peak of every category over two steps after wrapping, against the paper (f32; S = Σ P_u/N, the
// units padded to a multiple of N; G = P_root + the largest P_block, what is gathered at once):
//   weights and grads  4S + 4G (offload: 4G, the shards are on the host)   optimizer 8S (offload: 0)
//   offload 16S (m, v, the weight and gradient shards) or 0
//   comm  one reduce-scatter's ring scratch (two chunks of the largest unit): it lands in place in the
//         unit's full gradients, with no [S] buffer of its own; offload's weight shard on its way up is
//         smaller than that.
// Mixed precision (a bf16 model, bf16 gradients, AdamW's f32 master): the same with e = 2 bytes per
// weight and gradient element, and 12S of optimizer state (master + moments); offload's host holds
// 2S + 2S + 12S = 16S again.
TEST(FsdpPeak, EveryCategoryAsThePaper) {
  for (int n : {2, 3, 4})
    for (bool offload : {false, true})
      for (bool bf16 : {false, true}) {
        SL_SKIP_UNLESS_WORLD(n);
        launch(
            n,
            [&](RankContext& ctx) {
              MemoryLedger& ledger = MemoryLedger::instance();
              const Device dev = ctx.device;
              std::array<int64_t, kNumMemoryCategories> start{};
              for (int k = 0; k < kNumMemoryCategories; ++k) start[k] = ledger.current(dev, MemoryCategory(k));
              nn::GPTConfig config = small_config();
              nn::AdamWOptions adamw = adamw_options();
              if (bf16) {
                config.param_dtype = DType::bf16;
                adamw.master_weights = true;
              }
              nn::GPT model(config, kSeed);
              const Expected e = expected_sizes(model, n);
              const int64_t largest_chunk = *std::max_element(e.unit_shards.begin(), e.unit_shards.end());
              FullyShardedGPT fsdp(model, ctx.world, nullptr, adamw, {.offload = offload});
              ledger.reset_peak(dev);
              for (int step = 0; step < 2; ++step) {
                nn::Batch batch = rank_batch(step, ctx);
                fsdp.loss(batch.inputs, batch.targets).backward();
                fsdp.clip_grad_norm(kMaxNorm);
                fsdp.step();
                fsdp.zero_grad();
              }
              auto peak = [&](MemoryCategory k) { return ledger.peak(dev, k) - start[static_cast<int>(k)]; };
              const std::string when =
                  "world " + std::to_string(n) + (offload ? " offload" : "") + (bf16 ? " bf16" : "");
              const int64_t on_device = offload ? 0 : e.shard;
              const int64_t b = bf16 ? 2 : 4, K = bf16 ? 12 : 8;  // bytes per weight/gradient; optimizer bytes
              EXPECT_EQ(peak(MemoryCategory::weights), b * (on_device + e.largest_gathered)) << when;
              EXPECT_EQ(peak(MemoryCategory::grads), b * (on_device + e.largest_gathered)) << when;
              EXPECT_EQ(peak(MemoryCategory::optimizer), K * on_device) << when;
              EXPECT_EQ(peak(MemoryCategory::offload), offload ? 16 * e.shard : 0) << when;
              EXPECT_LE(peak(MemoryCategory::comm), 2 * b * largest_chunk) << when;
              if (ctx.rank == 0)
                std::printf("[   info   ] %s: peak comm %lld, two chunks of the largest unit %lld\n", when.c_str(),
                            (long long)peak(MemoryCategory::comm), (long long)(2 * b * largest_chunk));
            },
            quick());
      }
}

std::vector<Layout> fsdp_layouts() { return {{1, 1}, {1, 2}, {1, 3}, {1, 4}}; }
// 2x3: a shard group of 3 pads every unit (Ψ_u not divisible by 3).
std::vector<Layout> hsdp_layouts() { return {{2, 1, true}, {1, 2, true}, {2, 2, true}, {2, 3, true}}; }
std::vector<Layout> parity_layouts() {
  std::vector<Layout> layouts = fsdp_layouts();
  layouts.push_back({1, 2, false, true});  // offload: shards and the update on the host
  layouts.push_back({1, 3, false, true});
  return layouts;
}

INSTANTIATE_TEST_SUITE_P(Layouts, Fsdp, testing::ValuesIn(parity_layouts()), layout_name);
INSTANTIATE_TEST_SUITE_P(Layouts, Hsdp, testing::ValuesIn(hsdp_layouts()), layout_name);
INSTANTIATE_TEST_SUITE_P(Layouts, FsdpMemory, testing::ValuesIn(fsdp_layouts()), layout_name);
INSTANTIATE_TEST_SUITE_P(Layouts, HsdpMemory, testing::ValuesIn(hsdp_layouts()), layout_name);
INSTANTIATE_TEST_SUITE_P(Layouts, FsdpComm, testing::ValuesIn(fsdp_layouts()), layout_name);
INSTANTIATE_TEST_SUITE_P(Layouts, HsdpComm, testing::ValuesIn(hsdp_layouts()), layout_name);

}  // namespace
}  // namespace sl::parallel
