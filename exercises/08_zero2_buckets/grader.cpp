// exercises/08_zero2_buckets/grader.cpp — grades ZeRO-2's bucketed reduce-scatter (student.cpp).
//
// A deep MLP (16 x Linear(6, 6), tanh between: Ψ = 16 · 42 = 672, 32 parameters of 36 or 6 elements)
// on a batch of 12 rows, each of N thread ranks on its 12/N rows. After one backward, each rank's
// gradient shard must equal ITS chunks of an independent serial run's gradient (the mean loss over
// all 12 rows), laid out by the grader's own reading of the layout (reverse order, padded buckets);
// each bucket reduce-scattered from inside backward as soon as it is full, and in bucket order even when
// the gradients arrive against the plan (the layers registered last to first); the bytes (N-1)/N · 4P;
// and the rank's memory ledger (category grads) must never have held more than the shard plus three
// buckets and one parameter's gradient at once, and only the shard after backward. With -DSL_SOLUTION
// the library's ZeroReducer (parallel/zero/zero_reducer.h) over a FlatParams stands in.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "exercises/grader.h"
#include "exercises/grader_ranks.h"
#include "exercises/grader_values.h"
#include "nn/layers.h"
#include "parallel/comm/launch.h"
#include "parallel/zero/zero_adamw.h"
#include "parallel/zero/zero_reducer.h"
#include "tensor/ledger.h"

using namespace sl;
using namespace sl::parallel;
using exercises::all_close;
using exercises::expect;
using exercises::scaled;

namespace exercise08 {
double predicted_reduce_scatter_bytes();
std::function<Tensor()> attach_zero2_hooks(std::vector<Tensor> params, ProcessGroupPtr group, int64_t bucket_bytes);
}

#ifdef SL_SOLUTION
namespace solution {
struct Zero2 {
  std::unique_ptr<FlatParams> flat;
  std::unique_ptr<ZeroReducer> reducer;
};
std::function<Tensor()> attach_zero2_hooks(std::vector<Tensor> params, ProcessGroupPtr group, int64_t bucket_bytes) {
  auto zero2 = std::make_shared<Zero2>();
  const Device device = params[0].device();
  zero2->flat = std::make_unique<FlatParams>(params, group->size(), bucket_bytes);
  zero2->reducer = std::make_unique<ZeroReducer>(*zero2->flat, group, device, ZeroAdamW::kBucketsInFlight);
  ZeroReducer* reducer = zero2->reducer.get();
  for (size_t i = 0; i < params.size(); ++i)
    params[i].register_post_accumulate_grad_hook([reducer, i](Tensor&) { reducer->on_gradient(i); });
  return [zero2] {
    Tensor shard = zero2->reducer->grad_shard().clone();
    zero2->reducer->zero_grad();  // the next backward starts from a zero shard
    return shard;
  };
}
// Padding is per bucket: 36 stays 36, 6 becomes 8, so P = 16·(36 + 8) = 704, not 672; a ring
// reduce-scatter sends (N-1)/N of it: 3/4 · 4 · 704.
double predicted_reduce_scatter_bytes() { return (4.0 - 1) / 4 * 4 * (16 * (36 + 8)); }
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise08;
#endif

constexpr int64_t kBatch = 12, kWidth = 6;
constexpr int kLayers = 16;

// layers_last_first registers l15 .. l0 in that order (the forward still runs l0 first): backward then
// hands out the gradients in the plan's order reversed, the case that shows whether the buckets are
// still reduced in bucket order.
class DeepMlp : public nn::Module {
 public:
  explicit DeepMlp(bool layers_last_first = false) {
    manual_seed(7);
    nn::InitOptions init;
    init.std = 0.6;
    layers.resize(kLayers);
    for (int j = 0; j < kLayers; ++j) {
      const int k = layers_last_first ? kLayers - 1 - j : j;
      layers[k] = register_module("l" + std::to_string(k), std::make_shared<nn::Linear>(kWidth, kWidth, true, init));
    }
  }
  Tensor loss(const Tensor& x, const Tensor& y) {
    Tensor h = x;
    for (int k = 0; k < kLayers; ++k) h = k + 1 < kLayers ? tanh((*layers[k])(h)) : (*layers[k])(h);
    const Tensor d = h - y;
    return mean(d * d);
  }
  std::vector<std::shared_ptr<nn::Linear>> layers;
};

static std::pair<Tensor, Tensor> batch(int step) {
  manual_seed(700 + step);
  Tensor x = randn({kBatch, kWidth});
  return {x, randn({kBatch, kWidth})};
}

// The grader's reading of the layout: reverse-order buckets closing at >= bucket_bytes, padded to N.
struct Layout {
  std::vector<std::vector<int>> buckets;
  std::vector<int64_t> padded;  // per bucket
  int64_t P = 0, S = 0, largest_bucket = 0, largest_param = 0;
};
static Layout layout_of(const std::vector<Tensor>& params, int n, int64_t bucket_bytes) {
  Layout l;
  int64_t held = 0;
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    if (l.buckets.empty() || held >= bucket_bytes) l.buckets.emplace_back(), held = 0;
    l.buckets.back().push_back(i);
    held += params[i].nbytes();
    l.largest_param = std::max(l.largest_param, params[i].numel());
  }
  for (const std::vector<int>& b : l.buckets) {
    int64_t numel = 0;
    for (int i : b) numel += params[i].numel();
    l.padded.push_back((numel + n - 1) / n * n);
    l.P += l.padded.back(), l.S += l.padded.back() / n;
    l.largest_bucket = std::max(l.largest_bucket, l.padded.back());
  }
  return l;
}

// Rank r's expected shard: chunk r of every bucket of the serial gradient.
static std::vector<double> expected_shard(int step, int n, int r, int64_t bucket_bytes) {
  DeepMlp model;
  auto [x, y] = batch(step);
  model.loss(x, y).backward();
  const std::vector<Tensor> params = model.parameters();
  const Layout l = layout_of(params, n, bucket_bytes);
  std::vector<double> shard;
  for (size_t b = 0; b < l.buckets.size(); ++b) {
    std::vector<double> buffer;
    for (int i : l.buckets[b]) {
      std::vector<double> g = params[i].grad().to_vector();
      buffer.insert(buffer.end(), g.begin(), g.end());
    }
    buffer.resize(l.padded[b], 0.0);
    const int64_t c = l.padded[b] / n;
    shard.insert(shard.end(), buffer.begin() + r * c, buffer.begin() + (r + 1) * c);
  }
  return shard;
}

struct Arrival {
  int param;
  int64_t calls;  // reduce-scatter calls right after the student's hook for it ran
};
struct RankRun {
  std::vector<std::vector<double>> shards;     // per backward
  std::vector<std::vector<Arrival>> arrivals;  // per backward
  std::vector<int64_t> rs_calls, rs_bytes, other_calls, peak_grads, held_after;  // per backward
};

static std::vector<RankRun> run(int n, int64_t bucket_bytes, bool layers_last_first = false) {
  std::vector<RankRun> runs(n);
  exercises::run_ranks(n, [&](RankContext& ctx) {
    const int r = ctx.rank;
    RankRun& mine = runs[r];
    MemoryLedger& memory = MemoryLedger::instance();
    DeepMlp model(layers_last_first);
    const std::vector<Tensor> params = model.parameters();
    std::function<Tensor()> shard_of = impl::attach_zero2_hooks(params, ctx.world, bucket_bytes);
    for (int i = 0; i < static_cast<int>(params.size()); ++i)
      params[i].register_post_accumulate_grad_hook([&mine, &ctx, i](Tensor&) {
        mine.arrivals.back().push_back({i, ctx.world->ledger()[CommOp::reduce_scatter].calls});
      });
    const int64_t rows = kBatch / n;
    for (int step = 0; step < 2; ++step) {
      auto [x, y] = batch(step);
      model.zero_grad();
      ctx.world->ledger().reset();
      mine.arrivals.emplace_back();
      const int64_t before = memory.current(ctx.device, MemoryCategory::grads);  // the shard
      memory.reset_peak(ctx.device);
      model.loss(x.flat_view(r * rows * kWidth, Shape({rows, kWidth})), y.flat_view(r * rows * kWidth, Shape({rows, kWidth})))
          .backward();
      mine.peak_grads.push_back(memory.peak(ctx.device, MemoryCategory::grads) - before);
      mine.held_after.push_back(memory.current(ctx.device, MemoryCategory::grads) - before);
      const CommLedger& ledger = ctx.world->ledger();
      mine.rs_calls.push_back(ledger[CommOp::reduce_scatter].calls);
      mine.rs_bytes.push_back(ledger[CommOp::reduce_scatter].bytes_sent);
      mine.other_calls.push_back(ledger[CommOp::all_reduce].calls + ledger[CommOp::all_gather].calls);
      mine.shards.push_back(shard_of().to_vector());
    }
  }, "a rank waited 4 s for a collective: do all ranks reduce the same buckets "
      "in the same order, with the same sizes? ");
  return runs;
}

// Says in words what is wrong with rank r's shard after backward `step`.
static std::string diagnose_shard(int n, int r, int step, int64_t bucket_bytes, const std::vector<double>& got) {
  const std::string who = "world " + std::to_string(n) + ", rank " + std::to_string(r) + ", backward " +
                          std::to_string(step + 1) + ": ";
  const std::vector<double> want = expected_shard(step, n, r, bucket_bytes);
  if (got.size() != want.size())
    return who + "the shard has " + std::to_string(got.size()) + " elements, expected S = Σ padded_b / N = " +
           std::to_string(want.size());
  if (all_close(got, scaled(want, n), 1e-6, 1e-4)) return who + "the shard is N x the mean gradient's: reduce with ReduceOp::avg (or divide by N)";
  for (int k = 0; k < n; ++k)
    if (k != r && all_close(got, expected_shard(step, n, k, bucket_bytes), 1e-6, 1e-4))
      return who + "the shard holds rank " + std::to_string(k) + "'s chunks: rank r keeps chunk r of every bucket";
  if (step == 1) {
    std::vector<double> both = expected_shard(0, n, r, bucket_bytes), second = want;
    for (size_t i = 0; i < both.size(); ++i) both[i] += second[i];
    if (all_close(got, both, 1e-6, 1e-4)) return who + "the shard holds both backwards' sum: zero it when a backward's first gradient arrives";
  }
  int64_t wrong = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= 1e-6 + 1e-4 * std::abs(want[i]))) ++wrong, first = first < 0 ? i : first;
  return who + std::to_string(wrong) + " of " + std::to_string(want.size()) + " shard elements are wrong, the first at " +
         std::to_string(first) + " (" + std::to_string(got[first]) + " instead of " + std::to_string(want[first]) +
         "): is each bucket's chunk added at its shard_offset, and each gradient copied at its offset in the bucket?";
}

static void expect_shards(int n, int64_t bucket_bytes, const std::vector<RankRun>& runs) {
  for (int step = 0; step < 2; ++step)
    for (int r = 0; r < n; ++r)
      if (!all_close(runs[r].shards[step], expected_shard(step, n, r, bucket_bytes), 1e-6, 1e-4))
        expect(false, diagnose_shard(n, r, step, bucket_bytes, runs[r].shards[step]));
}

// After each gradient, every complete bucket (in bucket order) has been reduce-scattered, and no other.
static void expect_in_backward(int n, int64_t bucket_bytes, const std::vector<RankRun>& runs,
                               bool layers_last_first = false) {
  const Layout l = layout_of(DeepMlp(layers_last_first).parameters(), n, bucket_bytes);
  std::vector<int> bucket_of(2 * kLayers);
  for (size_t b = 0; b < l.buckets.size(); ++b)
    for (int i : l.buckets[b]) bucket_of[i] = static_cast<int>(b);
  for (int r = 0; r < n; ++r)
    for (int step = 0; step < 2; ++step) {
      std::vector<int> pending;
      for (const std::vector<int>& b : l.buckets) pending.push_back(static_cast<int>(b.size()));
      int64_t ready = 0;
      for (const Arrival& a : runs[r].arrivals[step]) {
        --pending[bucket_of[a.param]];
        while (ready < static_cast<int64_t>(l.buckets.size()) && pending[ready] == 0) ++ready;
        const int64_t complete = std::count(pending.begin(), pending.end(), 0);  // in any order
        const std::string at = "world " + std::to_string(n) + ", rank " + std::to_string(r) +
                               ", after the gradient of parameter " + std::to_string(a.param) + ": ";
        expect(a.calls <= ready || a.calls > complete,
               at + "a later bucket was reduce-scattered before bucket " + std::to_string(ready) + ", which still "
                    "waits for gradients: reduce strictly in bucket order (from the next unreduced bucket, while it "
                    "is full), so that every rank issues the same reduce-scatters in the same order");
        expect(a.calls <= ready, at + std::to_string(a.calls) + " reduce-scatters but only " + std::to_string(ready) +
                                     " complete bucket(s): one reduce-scatter per bucket, once its last gradient is in");
        expect(a.calls >= ready, at + "only " + std::to_string(a.calls) + " reduce-scatter(s) for " +
                                     std::to_string(ready) + " complete bucket(s): reduce each bucket as soon as it is "
                                     "full, during backward, or every bucket's gradients pile up");
      }
    }
}

// Bytes (N-1)/N · 4P in one reduce-scatter per bucket, nothing else.
static void expect_bytes(int n, int64_t bucket_bytes, const std::vector<RankRun>& runs) {
  const Layout l = layout_of(DeepMlp().parameters(), n, bucket_bytes);
  const int64_t formula = (n - 1) * 4 * l.P / n;
  for (int r = 0; r < n; ++r)
    for (int step = 0; step < 2; ++step) {
      const std::string who = "world " + std::to_string(n) + ", rank " + std::to_string(r) + ": ";
      expect(runs[r].other_calls[step] == 0, who + "an all-reduce or all-gather in backward: ZeRO-2 only reduce-scatters");
      expect(runs[r].rs_calls[step] == static_cast<int64_t>(l.buckets.size()),
             who + std::to_string(runs[r].rs_calls[step]) + " reduce-scatters, expected one per bucket: " +
                 std::to_string(l.buckets.size()));
      expect(runs[r].rs_bytes[step] == formula,
             who + "sent " + std::to_string(runs[r].rs_bytes[step]) + " bytes, expected (N-1)/N · 4P = " +
                 std::to_string(formula) + " (P = " + std::to_string(l.P) + ", every bucket padded to a multiple of N)");
    }
}

// Full gradients held at once: at most three buckets and one fresh parameter gradient; none after backward.
static void expect_memory(int n, int64_t bucket_bytes, const std::vector<RankRun>& runs) {
  const Layout l = layout_of(DeepMlp().parameters(), n, bucket_bytes);
  const int64_t bound = 4 * (3 * l.largest_bucket + l.largest_param), whole = 4 * DeepMlp().num_parameters();
  for (int r = 0; r < n; ++r)
    for (int step = 0; step < 2; ++step) {
      const std::string who = "world " + std::to_string(n) + ", rank " + std::to_string(r) + ", backward " +
                              std::to_string(step + 1) + ": ";
      expect(runs[r].peak_grads[step] <= bound,
             who + "at its peak held " + std::to_string(runs[r].peak_grads[step]) + " bytes of gradients beside the "
             "shard (the whole gradient is " + std::to_string(whole) + "), at most " + std::to_string(bound) +
             " allowed (3 buckets + one parameter): drop each full gradient once copied (set_grad(Tensor())) and "
             "free each bucket once reduced");
      expect(runs[r].held_after[step] == 0,
             who + std::to_string(runs[r].held_after[step]) + " bytes of gradients beside the shard are still held "
             "after backward: only the shard [S] may survive it");
    }
}

// The prediction's measured value: the library's ZeroAdamW at stage 2, a bucket per parameter, world 4:
// rank 0's reduce-scatter bytes over one backward.
static double measured_reduce_scatter_bytes() {
  int64_t bytes = 0;
  exercises::run_ranks(4, [&](RankContext& ctx) {
    DeepMlp model;
    ZeroOptions zero;
    zero.stage = 2;
    zero.bucket_bytes = 1;
    ZeroAdamW optimizer(model.parameters(), ctx.world, zero);
    optimizer.zero_grad();
    auto [x, y] = batch(0);
    ctx.world->ledger().reset();
    model.loss(x.flat_view(ctx.rank * 3 * kWidth, Shape({3, kWidth})), y.flat_view(ctx.rank * 3 * kWidth, Shape({3, kWidth})))
        .backward();
    optimizer.reduce_gradients();
    if (ctx.rank == 0) bytes = ctx.world->ledger()[CommOp::reduce_scatter].bytes_sent;
  }, "the library's ZeroAdamW did not finish: ");
  return static_cast<double>(bytes);
}

int main() {
  exercises::Grader grader("08_zero2_buckets");
  grader.predict("bytes each rank sends in reduce-scatters per backward at N = 4, a bucket per parameter",
                 impl::predicted_reduce_scatter_bytes, measured_reduce_scatter_bytes, 0, "bytes");
  const int64_t layer_buckets = 168;  // {l_k.bias 24 B, l_k.weight 144 B}: 16 buckets of 42 elements
  grader.check("world 2, a bucket per layer: shards equal the serial gradient's chunks (2 backwards)", [=] {
    expect_shards(2, layer_buckets, run(2, layer_buckets));
  });
  grader.check("world 3, a bucket per layer: shards", [=] { expect_shards(3, layer_buckets, run(3, layer_buckets)); });
  grader.check("world 4, a bucket per parameter (6 -> 8 and 36 -> 36: padding): shards", [] {
    expect_shards(4, 1, run(4, 1));
  });
  grader.check("world 2: each bucket reduce-scattered inside backward, as soon as it is full", [=] {
    expect_in_backward(2, layer_buckets, run(2, layer_buckets));
  });
  grader.check("world 2, layers registered last to first (gradients arrive against the plan): reduced in bucket order", [=] {
    expect_in_backward(2, layer_buckets, run(2, layer_buckets, /*layers_last_first=*/true), /*layers_last_first=*/true);
  });
  grader.check("worlds 2 and 4: one reduce-scatter per bucket, (N-1)/N · 4P bytes", [=] {
    expect_bytes(2, layer_buckets, run(2, layer_buckets));
    expect_bytes(4, 1, run(4, 1));
  });
  grader.check("worlds 2 and 3: never more than 3 buckets + 1 gradient held, only the shard after backward", [=] {
    expect_memory(2, layer_buckets, run(2, layer_buckets));
    expect_memory(3, layer_buckets, run(3, layer_buckets));
  });
  return grader.finish();
}
