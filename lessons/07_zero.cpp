// Lesson 07 — ZeRO: the 16 bytes per parameter, cut into N pieces.
//
// What you will learn
//   * plain data parallelism (DDP) keeps all of a model's 16 bytes per parameter on every rank:
//     weights 4Ψ, gradients 4Ψ, AdamW's two moments 8Ψ. More ranks, never a bigger model.
//   * ZeRO cuts the flat parameter buffer into N shards and lets rank r own shard r of what it stores:
//       ZeRO-1 the optimizer state   8Ψ + 8Ψ/N      ZeRO-2 the gradients too   4Ψ + 12Ψ/N
//       ZeRO-3 (FSDP) the weights too  16Ψ/N, plus one gathered unit (and its gradient) at the peak
//     measured by the memory ledger of each rank beside the formula at N = 1, 2, 3, 4 (3 pads Ψ),
//     between steps and at the peak during backward (ZeRO-2 never holds the whole gradient; each
//     reduce-scatter lands in place, in the rank's own chunk of the gradients it reduces)
//   * the algorithm on the page: ZeRO-1 and a bucketed ZeRO-2 in about 50 lines each over the
//     ProcessGroup API (HandZero1, HandZero2 below), checked bit for bit against parallel/zero/zero_adamw.h
//   * what moves: reduce-scatter the gradients, update my shard, all-gather the weights — the two
//     halves of DDP's all-reduce, so ZeRO-1 and ZeRO-2 cost 1x DDP's bytes, ZeRO-3 1.5x
//   * offload: the optimizer state, a master copy of the weight shard and the update on the host;
//     per step the gradient shard moves down and the new weight shard up
//   * HSDP: shard inside small groups, replicate across them
//   * and that every one of them trains exactly like the serial model
//
// Run:    make lesson N=07   (about a second: 20 small trainings, one thread per rank)
// Prints: 1 the bucketed flat buffer and who owns which chunk; 2 HandZero1/HandZero2 vs the library;
//         3 memory per rank (ledger vs formula) between steps and at the peak of backward;
//         4 bytes per step per rank vs DDP's; 5 offload; 6 HSDP's groups and traffic;
//         7 one "...: OK" line per layout (== serial, memory, bytes), then "lesson 07: OK".
// Try:    build/lessons/07_zero --hand-world 4 --hand-steps 5 --hand-bucket-bytes 1024 --svg /tmp/svg_07
//         build/lessons/07_zero --break-no-average   (HandZero reduce-scatters the sum, not the average)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "lesson_args.h"
#include "lesson_svg.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/ddp.h"
#include "parallel/zero/fsdp.h"
#include "parallel/zero/zero_adamw.h"
#include "tensor/ledger.h"

using namespace sl;
using namespace sl::parallel;
using i64 = long long;  // printf's %lld without casts

static const nn::GPTConfig kConfig{32, 8, 2, 2, 16, 0.0};  // vocab, block, layers, heads, n_embd
constexpr int64_t kBatch = 12, kBlock = 8;                 // 12 rows split over 1, 2, 3 or 4 ranks
constexpr int kSteps = 3;
constexpr uint64_t kSeed = 5;
constexpr double kMaxNorm = 0.5;
constexpr int64_t kBucketBytes = 4096;  // ZeRO's gradient buckets: this 30 KB model in 8 of them
// lr 1e-3: a gradient that is zero in exact arithmetic is float noise, which AdamW's 1/(sqrt(v)+eps)
// amplifies; tests/parallel/data_parallel/test_data_parallel.cpp explains why 1e-2 would blur the 1e-5 comparison.
static nn::AdamWOptions adamw() { return {.lr = 1e-3}; }

static void section(const char* title) { std::printf("\n--- %s\n", title); }
static bool close(double got, double want) { return std::abs(got - want) <= 1e-5 + 1.3e-6 * std::abs(want); }

using Values = std::map<std::string, std::vector<float>>;  // parameter name -> values
static Values values_of(const nn::StateDict& state) {
  Values out;
  for (const auto& [name, tensor] : state) out[name] = tensor.values<float>();
  return out;
}

// ---- ZeRO-1 and ZeRO-2 on one page ------------------------------------------------------------------
// What parallel/zero/zero_adamw.h does, without its bookkeeping: only ProcessGroup calls and nn::AdamW's update.
// Both keep the weights in one flat buffer [N S] (Ψ padded to N shards of S) and rank r owns
// elements [rS, (r+1)S) of it; copies in and out of the model keep the code short.

// Copies the parameters (or their gradients) into `flat` at `offsets`, or back out of it.
static void pack(const std::vector<Tensor>& ts, const std::vector<int64_t>& offsets, float* flat) {
  for (size_t i = 0; i < ts.size(); ++i) std::copy_n(ts[i].data<float>(), ts[i].numel(), flat + offsets[i]);
}
static void unpack(const float* flat, const std::vector<int64_t>& offsets, const std::vector<Tensor>& ts) {
  for (size_t i = 0; i < ts.size(); ++i) std::copy_n(flat + offsets[i], ts[i].numel(), ts[i].data<float>());
}

// ZeRO-1: every rank computes all gradients; a reduce-scatter gives each only the average of the
// S elements it owns; it updates those with its own m, v [S]; an all-gather returns all weights.
struct HandZero1 {
  std::vector<Tensor> params;
  ProcessGroupPtr group;
  nn::AdamWOptions options;
  ReduceOp reduce = ReduceOp::avg;  // --break-no-average sets sum: every shard's gradient N times too large
  std::vector<int64_t> offsets;  // parameter i starts at offsets[i] in the flat buffer
  int64_t S = 0, t = 0;
  Tensor weights, grads, m, v;  // [N S], [N S], [S], [S]

  HandZero1(std::vector<Tensor> ps, ProcessGroupPtr g, nn::AdamWOptions o) : params(ps), group(g), options(o) {
    int64_t psi = 0;
    for (const Tensor& p : params) offsets.push_back(psi), psi += p.numel();
    const int64_t n = group->size();
    S = (psi + n - 1) / n;  // ⌈Ψ/N⌉: the padding is at the end and belongs to nobody
    weights = zeros({n * S}), grads = zeros({n * S});
    m = zeros({S}), v = zeros({S});
  }
  void step(double lr) {
    NoGradGuard no_grad;
    std::vector<Tensor> gs;
    for (const Tensor& p : params) gs.push_back(p.grad());
    pack(gs, offsets, grads.data<float>());
    pack(params, offsets, weights.data<float>());
    const int64_t begin = group->rank() * S, end = begin + S;
    // (N-1)/N 4Ψ: half an all-reduce. In place: my S elements of grads receive their average.
    group->reduce_scatter(grads.flat_view(begin, {S}), grads, reduce);
    ++t;
    for (size_t i = 0; i < params.size(); ++i) {  // the part of each parameter inside [begin, end)
      const int64_t lo = std::max(begin, offsets[i]), hi = std::min(end, offsets[i] + params[i].numel());
      if (lo >= hi) continue;
      const nn::AdamWStep s = nn::AdamWStep::make(options, lr, t, params[i].dim() >= 2);  // no decay on biases
      nn::adamw_update(weights.data<float>() + lo, grads.data<float>() + lo, m.data<float>() + (lo - begin),
                       v.data<float>() + (lo - begin), hi - lo, s);
    }
    group->all_gather(weights, weights.flat_view(begin, {S}));  // the other half: everyone's new shard
    unpack(weights.data<float>(), offsets, params);
  }
};

// ZeRO-2: the same update, but the gradients never all exist at once. The parameters are grouped in
// reverse order (the order backward produces gradients) into buckets, each padded to a multiple of N;
// rank r owns chunk r of every bucket. When a bucket's last gradient arrives its reduce-scatter starts
// at once (async), and the bucket's full gradients are dropped: only my chunks stay.
struct HandZero2 {
  struct Bucket {
    std::vector<int> params;
    int64_t offset = 0, chunk = 0, shard_offset = 0;  // in the flat buffer; N chunks; my chunk in my shard
    int pending = 0;
  };
  std::vector<Tensor> params;
  ProcessGroupPtr group;
  nn::AdamWOptions options;
  ReduceOp reduce = ReduceOp::avg;  // --break-no-average sets sum
  std::vector<Bucket> buckets;
  std::vector<int> bucket_of;
  std::vector<int64_t> offsets;
  int64_t S = 0, t = 0;
  Tensor weights, grad_shard, m, v;
  std::vector<std::pair<WorkPtr, std::pair<Tensor, int64_t>>> in_flight;  // (work, (output, where))

  HandZero2(std::vector<Tensor> ps, ProcessGroupPtr g, nn::AdamWOptions o, int64_t bucket_bytes)
      : params(ps), group(g), options(o), bucket_of(ps.size()), offsets(ps.size()) {
    const int64_t n = group->size();
    int64_t at = 0, bytes = bucket_bytes;
    for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
      if (bytes >= bucket_bytes) buckets.emplace_back(), buckets.back().offset = at, bytes = 0;
      buckets.back().params.push_back(i), bucket_of[i] = static_cast<int>(buckets.size()) - 1;
      offsets[i] = at, at += params[i].numel(), bytes += params[i].nbytes();
      Bucket& b = buckets.back();
      b.chunk = (at - b.offset + n - 1) / n;
      if (i == 0 || bytes >= bucket_bytes) at = b.offset + n * b.chunk, b.shard_offset = S, S += b.chunk;  // pad
    }
    weights = zeros({at}), grad_shard = zeros({S}), m = zeros({S}), v = zeros({S});
    for (size_t i = 0; i < params.size(); ++i)
      params[i].register_post_accumulate_grad_hook([this, i](Tensor&) { on_gradient(static_cast<int>(i)); });
  }
  void on_gradient(int i) {
    NoGradGuard no_grad;
    Bucket& b = buckets[bucket_of[i]];
    if (--b.pending > 0) return;
    Tensor full = zeros({group->size() * b.chunk});  // this bucket's gradients, padded
    for (int p : b.params) {
      std::copy_n(params[p].grad().data<float>(), params[p].numel(), full.data<float>() + offsets[p] - b.offset);
      params[p].set_grad(Tensor());  // freed: the reduce-scatter's job holds `full` until it is done
    }
    Tensor mine = full.flat_view(group->rank() * b.chunk, {b.chunk});  // in place: my chunk of the bucket
    in_flight.push_back({group->reduce_scatter_async(mine, full, reduce), {mine, b.shard_offset}});
  }
  void zero_grad() {
    // Every rank's backward fires the hooks in the same order, so the reduce-scatters match up.
    for (Bucket& b : buckets) b.pending = static_cast<int>(b.params.size());
    grad_shard.zero_();
  }
  void step(double lr) {
    NoGradGuard no_grad;
    for (auto& [work, out] : in_flight) {  // the last buckets may still be in flight
      work->wait();
      grad_shard.flat_view(out.second, {out.first.numel()}).add_(out.first);
    }
    in_flight.clear();
    pack(params, offsets, weights.data<float>());
    ++t;
    const int r = group->rank();
    for (const Bucket& b : buckets) {
      const int64_t begin = b.offset + r * b.chunk, end = begin + b.chunk;
      for (int i : b.params) {
        const int64_t lo = std::max(begin, offsets[i]), hi = std::min(end, offsets[i] + params[i].numel());
        if (lo >= hi) continue;
        const int64_t at = b.shard_offset + (lo - begin);
        nn::adamw_update(weights.data<float>() + lo, grad_shard.data<float>() + at, m.data<float>() + at,
                         v.data<float>() + at, hi - lo, nn::AdamWStep::make(options, lr, t, params[i].dim() >= 2));
      }
      group->all_gather(weights.flat_view(b.offset, {group->size() * b.chunk}), weights.flat_view(begin, {b.chunk}));
    }
    unpack(weights.data<float>(), offsets, params);
  }
};

// Section 2's knobs: how long and with which buckets the hand-written ZeRO trains beside the library's.
struct HandConfig {
  int steps = kSteps;
  int64_t bucket_bytes = kBucketBytes;
  ReduceOp reduce = ReduceOp::avg;  // sum: the mistake of --break-no-average
};

// Trains a hand-written ZeRO and the library's side by side (two models from one seed) for
// config.steps steps on this rank's rows; returns the largest |hand - library| weight (0: bit for bit).
static double hand_against_library(RankContext& ctx, int stage, const nn::TokenStream& data, const HandConfig& config) {
  nn::GPT hand_model(kConfig, kSeed), library_model(kConfig, kSeed);
  std::unique_ptr<HandZero1> zero1;
  std::unique_ptr<HandZero2> zero2;  // (its hooks capture it: it must not move)
  if (stage == 1) zero1 = std::make_unique<HandZero1>(hand_model.parameters(), ctx.world, adamw());
  if (stage == 2)
    zero2 = std::make_unique<HandZero2>(hand_model.parameters(), ctx.world, adamw(), config.bucket_bytes);
  if (zero1) zero1->reduce = config.reduce;
  if (zero2) zero2->reduce = config.reduce;
  ZeroAdamW library(library_model.parameters(), ctx.world,
                    {.stage = stage,
                     .adamw = adamw(),
                     .bucket_bytes = stage == 1 ? FlatLayout::kOneBucket : config.bucket_bytes});  // same layouts
  const RowRange rows = data_parallel_rows(kBatch, ctx.rank, ctx.world_size);
  for (int step = 0; step < config.steps; ++step) {
    nn::Batch batch = data.get_batch(step, kBatch, kBlock, rows.begin, rows.end);
    if (zero2) zero2->zero_grad();
    for (const Tensor& p : hand_model.parameters()) p.set_grad(Tensor());
    hand_model.loss(batch.inputs, batch.targets).backward();
    if (zero1) zero1->step(adamw().lr);
    if (zero2) zero2->step(adamw().lr);
    library.zero_grad();
    library_model.loss(batch.inputs, batch.targets).backward();
    library.step();
  }
  double largest = 0;
  for (size_t i = 0; i < hand_model.parameters().size(); ++i) {
    const std::vector<float> hand = hand_model.parameters()[i].values<float>();
    const std::vector<float> library_values = library_model.parameters()[i].values<float>();
    for (size_t j = 0; j < hand.size(); ++j)
      largest = std::max(largest, static_cast<double>(std::abs(hand[j] - library_values[j])));
  }
  return largest;
}

struct Reference {  // the serial run, and the model's facts the story needs
  std::vector<double> losses, norms;
  Values params;  // after the last step
  i64 psi = 0;    // Ψ
  std::vector<std::string> names;
  std::vector<Shape> shapes;
};

static Reference serial_run(const nn::TokenStream& data) {
  DeviceGuard on(Device::cpu(70));  // away from the ranks' cpu:0..3
  Reference ref;
  nn::GPT model(kConfig, kSeed);
  nn::AdamW optimizer(model.parameters(), adamw());
  ref.psi = model.num_parameters();
  for (const auto& [name, param] : model.named_parameters())
    ref.names.push_back(name), ref.shapes.push_back(param.shape());
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    nn::Batch batch = data.get_batch(step, kBatch, kBlock);
    Tensor loss = model.loss(batch.inputs, batch.targets);
    loss.backward();
    ref.losses.push_back(loss.item());
    ref.norms.push_back(nn::clip_grad_norm(model.parameters(), kMaxNorm));
    optimizer.step();
  }
  ref.params = values_of(model.state_dict());
  return ref;
}

// Stage 0 is DDP; ZeRO-k shards the first k of: optimizer state, gradients, weights.
constexpr int kDDP = 0, kZero1 = 1, kZero2 = 2, kZero3 = 3;
static const char* const kStageName[] = {"DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"};
// ZeRO-1 holds the full local gradient sums (4Ψ); its reduce-scatter lands in place, in the rank's own
// chunk of them: 8Ψ + 8Ψ/N in f32, the paper's.
static const char* const kFormula[] = {"16Ψ     ", "8Ψ+8Ψ/N ", "4Ψ+12Ψ/N", "16Ψ/N   "};  // 8 columns each
static double formula_bytes(int stage, double psi, double n) {  // held per rank, before padding
  const double full[] = {16, 8, 4, 0}, sharded[] = {0, 8, 12, 16};
  return full[stage] * psi + sharded[stage] * psi / n;
}
struct Run {
  int stage, world;
  bool offload = false;
  int replicate = 1;  // ZeRO-3 only: > 1 is HSDP, replicate x (world / replicate)
};
static std::string name_of(const Run& run) {
  if (run.replicate > 1)
    return "HSDP " + std::to_string(run.replicate) + "x" + std::to_string(run.world / run.replicate);
  return std::string(kStageName[run.stage]) + (run.offload ? "+offload" : "");
}

struct Bytes {  // model states held by one rank
  i64 weights = 0, grads = 0, optimizer = 0, offload = 0;
  i64 total() const { return weights + grads + optimizer + offload; }
  Bytes operator-(const Bytes& o) const {
    return {weights - o.weights, grads - o.grads, optimizer - o.optimizer, offload - o.offload};
  }
  bool operator==(const Bytes&) const = default;
};
struct Sent {  // bytes one rank sent (replicas: HSDP's all-reduce across replicas)
  i64 all_reduce = 0, all_gather = 0, reduce_scatter = 0, replicas = 0;
  i64 total() const { return all_reduce + all_gather + reduce_scatter + replicas; }
  Sent operator-(const Sent& o) const {
    return {all_reduce - o.all_reduce, all_gather - o.all_gather, reduce_scatter - o.reduce_scatter,
            replicas - o.replicas};
  }
  bool operator==(const Sent&) const = default;
};
// ---- mixed precision: the paper's own accounting ----------------------------------------------------------

// The same strategies on a bf16 model (nn::GPTConfig::param_dtype) with bf16 gradients and AdamW's f32
// master weights: the ZeRO paper's K = 12 (master + two moments, 4 bytes each) beside 2-byte weights
// and gradients. One step on each rank of N = 2; the model states rank 0 holds afterwards.
struct MixedHeld {
  Bytes held;
  i64 padded = 0, shard = 0;  // P and S = P/N of the flat layout (DDP: Ψ, unsharded)
};
static MixedHeld mixed_precision_held(int stage, const nn::TokenStream& data, const LaunchOptions& options) {
  MixedHeld out;
  launch(
      2,
      [&](RankContext& ctx) {
        MemoryLedger& ledger = MemoryLedger::instance();
        auto held_now = [&] {
          return Bytes{ledger.current(ctx.device, MemoryCategory::weights),
                       ledger.current(ctx.device, MemoryCategory::grads),
                       ledger.current(ctx.device, MemoryCategory::optimizer),
                       ledger.current(ctx.device, MemoryCategory::offload)};
        };
        const Bytes start = held_now();
        nn::GPTConfig config = kConfig;
        config.param_dtype = DType::bf16;  // drawn in f32, rounded once
        nn::GPT model(config, kSeed);
        nn::AdamWOptions master = adamw();
        master.master_weights = true;
        std::unique_ptr<DistributedDataParallel> ddp;
        std::unique_ptr<nn::AdamW> plain;
        std::unique_ptr<ZeroAdamW> zero;
        std::unique_ptr<FullyShardedGPT> fsdp;
        i64 padded = model.num_parameters(), shard = padded;
        if (stage == kDDP) {
          ddp = std::make_unique<DistributedDataParallel>(model, ctx.world, DDPOptions{.grad_dtype = DType::bf16});
          plain = std::make_unique<nn::AdamW>(model.parameters(), master);
        } else if (stage == kZero3) {
          fsdp = std::make_unique<FullyShardedGPT>(model, ctx.world, nullptr, master);
          padded = fsdp->padded_numel(), shard = fsdp->shard_numel();
        } else {
          zero =
              std::make_unique<ZeroAdamW>(model.parameters(), ctx.world,
                                          ZeroOptions{.stage = stage, .adamw = master, .bucket_bytes = kBucketBytes});
          padded = zero->flat().layout().padded_numel, shard = zero->flat().layout().shard_numel;
        }
        if (ddp) ddp->zero_grad();
        if (zero) zero->zero_grad();
        const RowRange rows = data_parallel_rows(kBatch, ctx.rank, ctx.world_size);
        nn::Batch batch = data.get_batch(0, kBatch, kBlock, rows.begin, rows.end);
        (fsdp ? fsdp->loss(batch.inputs, batch.targets) : model.loss(batch.inputs, batch.targets)).backward();
        if (ddp) ddp->step(*plain);
        if (zero) zero->step();
        if (fsdp) fsdp->step();
        if (ctx.rank == 0) out = {held_now() - start, padded, shard};
      },
      options);
  return out;
}

// The paper's 2 + 2 + 12 per stage, with this run's padding (P, S): what a rank must hold.
static Bytes mixed_precision_formula(int stage, const MixedHeld& m) {
  const i64 P = m.padded, S = m.shard;
  switch (stage) {
    case kDDP:
      return {2 * P, 2 * P, 12 * P, 0};  // 16Ψ
    case kZero1:
      return {2 * P, 2 * P, 12 * S, 0};  // 4Ψ + 12Ψ/N
    case kZero2:
      return {2 * P, 2 * S, 12 * S, 0};  // 2Ψ + 14Ψ/N
    default:
      return {2 * S, 2 * S, 12 * S, 0};  // 16Ψ/N
  }
}

// What one rank measured; bytes above what its device held before the model was built.
struct RankResult {
  Bytes held;                                            // after the last step
  i64 peak_weights = 0, peak_grads = 0, peak_total = 0;  // over the steps (total: activations too)
  Sent sent;                                             // in the last step
  i64 to_host = 0;                                       // offload's copies in the last step
  i64 padded = 0, shard = 0, gathered = 0;               // P, S = P/N, ZeRO-3's P_root + largest P_block
  bool matches = true;                                   // every loss and the final weights == serial
  std::string mesh;                                      // HSDP: the mesh and its groups (rank 0)
};

static void train_rank(RankContext& ctx, const Run& run, const nn::TokenStream& data, const Reference& want,
                       RankResult& out) {
  MemoryLedger& ledger = MemoryLedger::instance();
  const Device dev = ctx.device;
  auto held_now = [&] {
    return Bytes{ledger.current(dev, MemoryCategory::weights), ledger.current(dev, MemoryCategory::grads),
                 ledger.current(dev, MemoryCategory::optimizer), ledger.current(dev, MemoryCategory::offload)};
  };
  const Bytes start = held_now();
  const i64 start_total = ledger.current(dev);

  nn::GPT model(kConfig, kSeed);  // the same seed on every rank; declared first, so destroyed last
  std::unique_ptr<nn::AdamW> plain;
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<ZeroAdamW> zero;
  std::unique_ptr<DeviceMesh> mesh;
  std::unique_ptr<FullyShardedGPT> fsdp;
  ProcessGroupPtr group = ctx.world, replicas;
  if (run.stage == kDDP) {
    ddp = std::make_unique<DistributedDataParallel>(model, ctx.world);
    plain = std::make_unique<nn::AdamW>(model.parameters(), adamw());
    out.padded = out.shard = model.num_parameters();  // nothing sharded, nothing padded
  } else if (run.stage == kZero3) {
    mesh = std::make_unique<DeviceMesh>(
        ctx.world, ParallelismConfig{.dp_replicate = run.replicate, .dp_shard = run.world / run.replicate});
    fsdp = std::make_unique<FullyShardedGPT>(model, *mesh, adamw());
    group = fsdp->shard_group(), replicas = fsdp->replicate_group();
    out.padded = fsdp->padded_numel(), out.shard = fsdp->shard_numel(), out.gathered = fsdp->largest_gathered_numel();
    if (ctx.rank == 0) out.mesh = mesh->str();
  } else {
    zero = std::make_unique<ZeroAdamW>(
        model.parameters(), ctx.world,
        ZeroOptions{.stage = run.stage, .offload = run.offload, .adamw = adamw(), .bucket_bytes = kBucketBytes});
    out.padded = zero->flat().layout().padded_numel, out.shard = zero->flat().layout().shard_numel;
  }

  auto sent_so_far = [&] {
    auto bytes = [](const ProcessGroupPtr& g, CommOp op) { return g ? g->ledger()[op].bytes_sent : 0; };
    return Sent{bytes(group, CommOp::all_reduce), bytes(group, CommOp::all_gather),
                bytes(group, CommOp::reduce_scatter), bytes(replicas, CommOp::all_reduce)};
  };
  const RowRange rows = data_parallel_rows(kBatch, ctx.rank, ctx.world_size);
  ledger.reset_peak(dev);  // the peaks of training, not of building the model
  for (int step = 0; step < kSteps; ++step) {
    const Sent before = sent_so_far();
    const i64 host_before = ledger.transferred(dev, dev);
    if (ddp) ddp->zero_grad();
    if (zero) zero->zero_grad();  // (FSDP zeroes its gradient shards after its step)
    nn::Batch batch = data.get_batch(step, kBatch, kBlock, rows.begin, rows.end);
    Tensor loss = fsdp ? fsdp->loss(batch.inputs, batch.targets) : model.loss(batch.inputs, batch.targets);
    loss.backward();
    if (ddp) {
      nn::clip_grad_norm(model.parameters(), kMaxNorm);  // the averaged gradients: the same on every rank
      ddp->step(*plain);
    } else if (zero) {
      zero->clip_grad_norm(kMaxNorm);  // reduces the gradients first
      zero->step();                    // my shard, then the all-gather
    } else {
      fsdp->clip_grad_norm(kMaxNorm);
      fsdp->step();
      fsdp->zero_grad();
    }
    out.sent = sent_so_far() - before;
    out.to_host = ledger.transferred(dev, dev) - host_before;
    Tensor global_loss = full({1}, loss.item());  // the global mean loss, outside the step's accounting
    ctx.world->all_reduce(global_loss, ReduceOp::avg);
    out.matches = out.matches && close(global_loss.item(), want.losses[step]);
  }
  out.held = held_now() - start;
  out.peak_weights = ledger.peak(dev, MemoryCategory::weights) - start.weights;
  out.peak_grads = ledger.peak(dev, MemoryCategory::grads) - start.grads;
  out.peak_total = ledger.peak(dev) - start_total;
  const Values got = values_of(fsdp ? fsdp->full_state_dict() : model.state_dict());  // collective for FSDP
  for (const auto& [name, expected] : want.params) {
    auto it = got.find(name);
    bool same = it != got.end() && it->second.size() == expected.size();
    for (size_t i = 0; same && i < expected.size(); ++i) same = close(it->second[i], expected[i]);
    out.matches = out.matches && same;
  }
}

// The formulas in bytes of f32: each state is the full buffer P (Ψ padded per bucket to a multiple
// of N; per unit for ZeRO-3) or one shard S = P/N of it. Offload: m, v, the master weight shard and
// the gradient shard on the host (16 S).
static Bytes held_formula(const Run& run, const RankResult& r) {
  const i64 P = r.padded, S = r.shard;
  Bytes b{4 * (run.stage >= kZero3 ? S : P), 4 * (run.stage >= kZero2 ? S : P), 8 * (run.stage >= kZero1 ? S : P)};
  if (run.offload) b.optimizer = 0, b.offload = 16 * S;
  return b;
}
static bool sent_matches(const Run& run, i64 psi, const RankResult& r) {
  const i64 n = run.world / run.replicate, R = run.replicate, S = r.shard;
  const Sent& s = r.sent;
  switch (run.stage) {
    case kDDP:  // one ring all-reduce; at N = 3 its chunks differ by an element
      return std::abs(s.all_reduce - 2.0 * (n - 1) / n * 4 * psi) <= 8.0 * (n - 1) && s.total() == s.all_reduce;
    case kZero1:
    case kZero2:  // reduce-scatter + all-gather = DDP's all-reduce; + 8 B per peer: the norm
      return s == Sent{0, 4 * (n - 1) * (S + 2), 4 * (n - 1) * S, 0};
    default:  // gathered in forward and in backward, scattered once; + 8 B per peer: the norm
      return s.all_gather == 8 * (n - 1) * S + 8 * (n - 1) && s.reduce_scatter == 4 * (n - 1) * S &&
             s.all_reduce == 0 && s.replicas == 8 * (R - 1) * S / R;
  }
}

int main(int argc, char** argv) try {
  lesson::Args args(argc, argv, "07_zero", "ZeRO: the 16 bytes per parameter, cut into N pieces");
  HandConfig hand;
  const int hand_world = args.integer("hand-world", 3, "section 2 runs HandZero at N = 2..this (12 rows split)", 2, 4);
  hand.steps = args.integer("hand-steps", kSteps, "AdamW steps of section 2's hand-vs-library runs", 1, 10);
  hand.bucket_bytes = args.integer("hand-bucket-bytes", kBucketBytes, "HandZero2's (and the library's) bucket size in section 2", 256, 1 << 20);
  if (args.breaks("no-average", "HandZero1/2 reduce-scatter the gradients' sum, not their average"))
    hand.reduce = ReduceOp::sum;
  const std::string svg_dir = args.svg();
  args.done();
  std::printf("values: hand-world %d, hand-steps %d, hand-bucket-bytes %lld%s\n", hand_world, hand.steps,
              i64(hand.bucket_bytes), hand.reduce == ReduceOp::sum ? ", BROKEN: no-average" : "");
  bool ok = true;
  auto check = [&](bool condition, const std::string& what) {
    std::printf("  %s: %s\n", what.c_str(), condition ? "OK" : "FAILED");
    ok = ok && condition;
  };
  nn::TokenStream data;  // any fixed stream will do (the one of tests/parallel/zero/test_zero.cpp)
  data.vocab_size = kConfig.vocab_size;
  for (int i = 0; i < 600; ++i) data.tokens.push_back((i * 7 + i / 5 + (i * i) % 11) % 32);
  const Reference want = serial_run(data);
  const i64 psi = want.psi;

  // Every layout trains kSteps steps, one thread per rank; the story below reads what they measured.
  std::vector<Run> runs;
  for (int n = 1; n <= 4; ++n)
    for (int stage = kDDP; stage <= kZero3; ++stage) runs.push_back({stage, n});
  runs.push_back({kZero2, 2, /*offload=*/true});
  runs.push_back({kZero3, 4, false, /*replicate=*/2});
  std::map<std::string, std::vector<RankResult>> results;  // "ZeRO-2 N=3" -> per rank
  auto key = [](const Run& run) { return name_of(run) + " N=" + std::to_string(run.world); };
  LaunchOptions options;
  options.timeout = std::chrono::milliseconds(10000);  // a broken run fails in seconds, never hangs
  for (const Run& run : runs) {
    std::vector<RankResult>& ranks = results[key(run)] = std::vector<RankResult>(run.world);
    launch(
        run.world, [&](RankContext& ctx) { train_rank(ctx, run, data, want, ranks[ctx.rank]); }, options);
  }
  auto rank0 = [&](int stage, int n, bool offload = false, int replicate = 1) -> const RankResult& {
    return results.at(key({stage, n, offload, replicate}))[0];
  };

  section("1. Who carries what: the bucketed flat buffer at N = 3");
  const FlatLayout layout(want.shapes, 3, kBucketBytes);
  std::printf(
      "  A GPT of %lld layers, n_embd %lld: Ψ = %lld parameters at 16 bytes each (weight, gradient and\n"
      "  AdamW's two moments in f32, lesson 03): DDP keeps all %lld bytes on every rank. ZeRO (Zero\n"
      "  Redundancy Optimizer) keeps one copy in all. The %zu parameters lie end to end in one flat\n"
      "  buffer, in reverse order (the order backward produces their gradients), grouped into buckets\n"
      "  of >= %lld bytes. Each bucket is padded to a multiple of N and cut into N chunks; rank r owns\n"
      "  chunk r of every bucket, so a bucket's reduce-scatter delivers each chunk to its owner:\n",
      i64(kConfig.n_layer), i64(kConfig.n_embd), psi, 16 * psi, want.names.size(), i64(kBucketBytes));
  for (size_t b = 0; b < layout.buckets.size(); ++b) {
    const FlatBucket& bucket = layout.buckets[b];
    std::printf("    bucket %zu: %-22s ... %-22s %5lld + %lld pad = 3 chunks of %lld\n", b,
                want.names[bucket.segments.front()].c_str(), want.names[bucket.segments.back()].c_str(),
                i64(bucket.numel), i64(bucket.padded_numel - bucket.numel), i64(bucket.chunk_numel));
  }
  std::printf("  A rank's shard is its %zu chunks end to end: S = %lld elements (P = %lld with the padding).\n",
              layout.buckets.size(), i64(layout.shard_numel), i64(layout.padded_numel));
  const Sent& z2 = rank0(kZero2, 3).sent;
  std::printf(
      "  Hikers sharing one set of camping gear each carry a part of it (tent, stove, water filter) and\n"
      "  lend it out at camp every night. Here the gear is the flat buffer, each rank carries its shard,\n"
      "  and the night is the step. One ZeRO-2 step at N = 3 (bytes each rank sent, from the ledger):\n"
      "                  rank 0        rank 1        rank 2\n"
      "  weights         [p0 p1 p2]    [p0 p1 p2]    [p0 p1 p2]    the whole model, 4P on each\n"
      "  backward        [g0 g1 g2]    [g0 g1 g2]    [g0 g1 g2]    bucket by bucket, from its own 4 rows\n"
      "  reduce-scatter  [G0 -- --]    [-- G1 --]    [-- -- G2]    per bucket, during backward: %lld B\n"
      "  clip            |G0|^2        |G1|^2        |G2|^2        all-gathered and summed: %lld B\n"
      "  update          p0 (m0 v0)    p1 (m1 v1)    p2 (m2 v2)    AdamW on my shard only: no bytes\n"
      "  all-gather      [p0 p1 p2]    [p0 p1 p2]    [p0 p1 p2]    new weights everywhere: %lld B\n"
      "  ZeRO-1 does the same after backward and keeps every full gradient; ZeRO-3 also lets go of the\n"
      "  p's it does not own, gathering each block only while it computes.\n",
      z2.reduce_scatter, (z2.all_gather - z2.reduce_scatter), z2.reduce_scatter);

  section("2. The algorithm on one page: HandZero1 and HandZero2 against parallel/zero/zero_adamw.h");
  std::printf(
      "  HandZero1 and HandZero2, at the top of this file, are ZeRO-1 and a bucketed ZeRO-2 in about\n"
      "  50 lines each: ProcessGroup calls and nn::AdamW's update, nothing else. Each trains a model\n"
      "  beside the library's ZeroAdamW (same layout, same rows) for %d steps:\n",
      hand.steps);
  for (int stage : {1, 2})
    for (int n = 2; n <= hand_world; ++n) {
      std::vector<double> gap(n, 0.0);
      launch(
          n, [&](RankContext& ctx) { gap[ctx.rank] = hand_against_library(ctx, stage, data, hand); }, options);
      const double largest = *std::max_element(gap.begin(), gap.end());
      if (largest > 0) std::printf("  HandZero%d at N = %d: a weight is off the library's by %.3g\n", stage, n, largest);
      check(largest == 0,
            "HandZero" + std::to_string(stage) + " at N = " + std::to_string(n) +
                ": weights equal the library's bit for bit");
    }

  section("3. Memory per rank (ledger of rank 0's device), bytes");
  std::printf(
      "  N  stage     weights    grads optimizer |   held = formula      at Ψ  padded | peak weights grads  peak*\n");
  for (int n = 1; n <= 4; ++n)
    for (int stage = kDDP; stage <= kZero3; ++stage) {
      const RankResult& r = rank0(stage, n);
      std::printf("  %d  %-7s %9lld %8lld %9lld | %6lld = %s %8.1f  %6lld | %12lld %5lld %6lld\n", n, kStageName[stage],
                  r.held.weights, r.held.grads, r.held.optimizer, r.held.total(), kFormula[stage],
                  formula_bytes(stage, double(psi), n), held_formula({stage, n}, r).total(), r.peak_weights,
                  r.peak_grads, r.peak_total);
    }
  std::printf(
      "  held: between steps. peak: the most bytes at any moment of the steps. Weights: 4P up to\n"
      "  ZeRO-2 (the all-gather writes each rank's new chunk in place). Grads, during backward: 4P for\n"
      "  DDP and ZeRO-1 (its reduce-scatter lands in the flat buffer, no shard beside it). * peak: all\n"
      "  categories, the forward's activations included.\n"
      "  ZeRO-2 holds its shard and at most %d buckets in flight plus the one being filled, never the\n"
      "  whole 4Ψ: its peak falls with N where ZeRO-1's does not. ZeRO-3 at its peak holds its shards,\n"
      "  one gathered unit (the root, wte wpe ln_f, gathered for the whole pass, plus the largest\n"
      "  block) and that unit's full gradient:\n",
      ZeroAdamW::kBucketsInFlight);
  for (int n = 1; n <= 4; ++n) {
    const RankResult& r = rank0(kZero3, n);
    std::printf("    N=%d  peak weights %6lld = 4S %6lld + 4(P_root + P_block) %6lld;  peak grads %6lld\n", n,
                r.peak_weights, (4 * r.shard), (4 * r.gathered), r.peak_grads);
  }

  for (int n = 2; n <= 4; ++n) {
    lesson::BarChart chart("model states held per rank at N = " + std::to_string(n) + " (mark: the formula in Ψ)", "bytes");
    for (int stage = kDDP; stage <= kZero3; ++stage)
      chart.bar(kStageName[stage], double(rank0(stage, n).held.total()), formula_bytes(stage, double(psi), n));
    lesson::write_picture(svg_dir, "07_memory_n" + std::to_string(n) + ".svg", chart.svg());
  }

  section("4. Communication per step per rank (the groups' ledgers), bytes sent");
  std::printf("  N  DDP formula 2(N-1)/N 4Ψ |    DDP       |  ZeRO-1      |  ZeRO-2      |  ZeRO-3\n");
  for (int n = 2; n <= 4; ++n) {
    const double ddp = 2.0 * (n - 1) / n * 4 * double(psi);
    std::printf("  %d  %23.1f", n, ddp);
    for (int stage = kDDP; stage <= kZero3; ++stage) {
      const i64 bytes = rank0(stage, n).sent.total();
      std::printf(" | %6lld %4.2fx", bytes, double(bytes) / ddp);
    }
    std::printf("\n");
  }
  std::printf(
      "  A ring all-reduce is a reduce-scatter followed by an all-gather. ZeRO-1 and ZeRO-2 run those\n"
      "  two halves with the update in between: 1x DDP's bytes (+ the padding and the norm's 8 bytes\n"
      "  per peer). ZeRO-3 gathers the weights twice (forward and backward) and reduce-scatters once:\n"
      "  1.5x. At N = 1 nothing moves.\n");

  section("5. Offload: ZeRO-2 at N = 2, the optimizer on the host");
  const Bytes &on_device = rank0(kZero2, 2).held, &offloaded = rank0(kZero2, 2, true).held;
  const RankResult& off = rank0(kZero2, 2, true);
  std::printf(
      "                    weights    grads  optimizer  host (offloaded)\n"
      "    ZeRO-2          %7lld  %7lld  %9lld  %9lld\n    ZeRO-2+offload  %7lld  %7lld  %9lld  %9lld\n"
      "  The host keeps AdamW's m and v, the master copy of the rank's weight shard and a gradient\n"
      "  shard (16 S). The update runs there: each step the averaged gradient shard moves down and\n"
      "  the updated weight shard moves up, %lld bytes = 8 S over the host link, for 8 S of device\n"
      "  memory. ZeRO-3 offloads the same way (FsdpOptions{.offload}), keeping its weight shards on\n"
      "  the host too.\n",
      on_device.weights, on_device.grads, on_device.optimizer, on_device.offload, offloaded.weights, offloaded.grads,
      offloaded.optimizer, offloaded.offload, off.to_host);

  section("6. HSDP: dp_replicate 2 x dp_shard 2 over 4 ranks");
  const RankResult& hsdp = rank0(kZero3, 4, false, 2);
  for (size_t begin = 0, end; begin < hsdp.mesh.size(); begin = end + 1) {  // the mesh, indented
    end = std::min(hsdp.mesh.find('\n', begin), hsdp.mesh.size());
    std::printf("  %.*s\n", static_cast<int>(end - begin), hsdp.mesh.c_str() + begin);
  }
  std::printf(
      "  A dp_shard group holds one whole model in 2 shards: %lld bytes per rank (ZeRO-3 at N = 4:\n"
      "  %lld). Per step a rank sends %lld bytes in its dp_shard group (two all-gathers and a\n"
      "  reduce-scatter) and %lld in its dp_replicate group: the all-reduce of its gradient shard,\n"
      "  2(R-1)/R x 4P/2. Keep a shard group inside a node and only that all-reduce crosses nodes.\n",
      hsdp.held.total(), rank0(kZero3, 4).held.total(), (hsdp.sent.total() - hsdp.sent.replicas), hsdp.sent.replicas);

  section("7. Mixed precision: the paper's own table (bf16 weights and gradients, f32 master), N = 2");
  std::printf(
      "  The table above is f32: 4 + 4 + 8 bytes per parameter. The paper counts a mixed-precision run:\n"
      "  2-byte weights and gradients, and K = 12 bytes of optimizer state (the f32 master copy the\n"
      "  update runs on, and the two moments). The total is 16 bytes either way; what moves is where.\n"
      "  stage      weights    grads optimizer   total | paper            = bytes\n");
  static const char* const kMixedFormula[] = {"16Ψ     ", "4Ψ+12Ψ/N", "2Ψ+14Ψ/N", "16Ψ/N   "};
  for (int stage = kDDP; stage <= kZero3; ++stage) {
    const MixedHeld m = mixed_precision_held(stage, data, options);
    const Bytes want_bytes = mixed_precision_formula(stage, m);
    std::printf("  %-7s %10lld %8lld %9lld %7lld | %s = %7lld\n", kStageName[stage], (long long)m.held.weights,
                (long long)m.held.grads, (long long)m.held.optimizer, (long long)m.held.total(), kMixedFormula[stage],
                (long long)want_bytes.total());
    check(m.held == want_bytes,
          std::string(kStageName[stage]) + " in bf16 holds the paper's bytes, category by category");
  }

  section("8. Checks (every rank; serial: the same model, AdamW and clipping on all 12 rows)");
  int clipped = 0;
  for (double norm : want.norms) clipped += norm > kMaxNorm;
  std::printf("  (the serial run clipped %d of its %d steps at max_norm %.1f)\n", clipped, kSteps, kMaxNorm);
  for (const Run& run : runs) {
    bool same = true, memory = true, sent = true;
    for (const RankResult& r : results.at(key(run))) {
      same = same && r.matches;
      memory = memory && r.held == held_formula(run, r);
      if (run.stage == kZero3)  // shards + one gathered unit, for weights and gradients alike
        memory = memory && r.peak_weights == 4 * (r.shard + r.gathered) && r.peak_grads == 4 * (r.shard + r.gathered);
      if (run.stage <= kZero2)  // the whole weights once, in place (DDP: P = Ψ)
        memory = memory && r.peak_weights == 4 * r.padded;
      if (run.stage <= kZero1)  // the whole gradient once: ZeRO-1's shard is a view of it
        memory = memory && r.peak_grads == 4 * r.padded;
      if (run.stage == kZero2 && run.world > 1)  // never the whole gradient: well below ZeRO-1's 4P
        memory = memory && r.peak_grads < 4 * r.padded / 2 + 4 * r.shard;
      sent = sent && sent_matches(run, psi, r) && r.to_host == (run.offload ? 8 * r.shard : 0);
    }
    const std::string failed =
        std::string(same ? "" : " [not serial]") + (memory ? "" : " [memory]") + (sent ? "" : " [bytes]");
    check(failed.empty(), key(run) + ": == serial after " + std::to_string(kSteps) +
                              " steps, held and peak bytes == formula, sent bytes == formula" + failed);
  }
  std::printf("\nlesson 07: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
} catch (const std::exception& error) {
  std::printf("lesson 07: FAILED with %s\n", error.what());
  return 1;
}
