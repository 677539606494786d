// exercises/06_ddp_bucket_hook/grader.cpp — grades DDP's bucket hooks with gradient accumulation (student.cpp).
//
// A small MLP (6 -> 12 -> 12 -> 6, Ψ = 318, every parameter a multiple of 6 elements) on a batch of
// B = 12 rows: each of N thread ranks takes B/N rows, in 2 micro-batches: the first under no_sync (no
// all-reduce may be issued), the second synced, each micro-batch's mean loss scaled by 1/2. Every
// .grad must be a view of its bucket (params of one bucket share its storage, the same storage in
// every step; a .grad dropped by model.zero_grad() before the second step must be adopted). After the
// synced backward, every rank's gradients
// must equal an independent serial run's gradient of the mean loss over all 12 rows; each bucket's
// all-reduce must have been launched from inside backward, right after its last gradient (the grader's
// own hook, registered after the student's, reads the ledger's all-reduce calls at every gradient),
// and in bucket order even when the gradients arrive against the plan (the layers registered last to first);
// and the ledger's all-reduce bytes must be 2(N-1)/N · 4Ψ. With -DSL_SOLUTION the library's
// DistributedDataParallel (parallel/data_parallel/ddp.h, its no_sync and zero_grad) stands in.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "exercises/grader.h"
#include "exercises/grader_ranks.h"
#include "exercises/grader_values.h"
#include "nn/layers.h"
#include "parallel/comm/flatten.h"
#include "parallel/comm/launch.h"
#include "parallel/data_parallel/ddp.h"

using namespace sl;
using namespace sl::parallel;
using exercises::all_close;
using exercises::expect;
using exercises::scaled;

namespace exercise06 {
std::vector<std::vector<int>> plan_buckets(const std::vector<int64_t>& bytes_per_param, int64_t bucket_bytes);
std::shared_ptr<void> attach_ddp_hooks(nn::Module& model, ProcessGroupPtr group, int64_t bucket_bytes);
void set_sync(const std::shared_ptr<void>& state, bool sync);
void zero_grad(const std::shared_ptr<void>& state);
double predicted_all_reduce_bytes();
}  // namespace exercise06

#ifdef SL_SOLUTION
namespace solution {
std::vector<std::vector<int>> plan_buckets(const std::vector<int64_t>& bytes_per_param, int64_t bucket_bytes) {
  std::vector<std::vector<int>> plan;
  for (const std::vector<size_t>& bucket : reverse_order_buckets(bytes_per_param, bucket_bytes))
    plan.emplace_back(bucket.begin(), bucket.end());
  return plan;
}
struct Ddp {
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<DistributedDataParallel::NoSyncGuard> no_sync;  // held while sync is off
};
std::shared_ptr<void> attach_ddp_hooks(nn::Module& model, ProcessGroupPtr group, int64_t bucket_bytes) {
  DDPOptions options;
  options.bucket_bytes = bucket_bytes;
  auto state = std::make_shared<Ddp>();
  state->ddp = std::make_unique<DistributedDataParallel>(model, std::move(group), options);
  return state;
}
void set_sync(const std::shared_ptr<void>& state, bool sync) {
  Ddp& d = *static_cast<Ddp*>(state.get());
  if (sync) d.no_sync.reset();
  else d.no_sync = std::make_unique<DistributedDataParallel::NoSyncGuard>(*d.ddp);
}
void zero_grad(const std::shared_ptr<void>& state) { static_cast<Ddp*>(state.get())->ddp->zero_grad(); }
// no_sync sends nothing; the synced backward all-reduces the accumulated sum once: one ring all-reduce
// of 4Ψ bytes, 2(N-1)/N of it sent per rank, however many micro-batches were accumulated.
double predicted_all_reduce_bytes() { return 2.0 * (3 - 1) / 3 * 4 * 318; }
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise06;
#endif

constexpr int64_t kBatch = 12, kIn = 6, kHidden = 12, kOut = 6;

// y = l3(tanh(l2(tanh(l1(x))))). Parameters: l1.weight [12,6], l1.bias [12], l2.weight [12,12], l2.bias [12],
// l3.weight [6,12], l3.bias [6]: Ψ = 72 + 12 + 144 + 12 + 72 + 6 = 318.
// layers_last_first registers l3, l2, l1 in that order: backward then hands out the gradients in the
// plan's order reversed (l3's, in the last bucket, first), the case that shows whether the buckets
// still go out in bucket order.
class Mlp : public nn::Module {
 public:
  explicit Mlp(uint64_t seed, bool layers_last_first = false) {
    manual_seed(seed);
    nn::InitOptions init;
    init.std = 0.5;  // large enough that every gradient is far from float noise
    auto make = [&](const char* name, int64_t in, int64_t out) {
      return register_module(name, std::make_shared<nn::Linear>(in, out, true, init));
    };
    if (layers_last_first) {
      l3 = make("l3", kHidden, kOut), l2 = make("l2", kHidden, kHidden), l1 = make("l1", kIn, kHidden);
    } else {
      l1 = make("l1", kIn, kHidden), l2 = make("l2", kHidden, kHidden), l3 = make("l3", kHidden, kOut);
    }
  }
  // x [b, 6], y [b, 6] -> the mean squared error over b·6 elements
  Tensor loss(const Tensor& x, const Tensor& y) {
    const Tensor d = (*l3)(tanh((*l2)(tanh((*l1)(x))))) - y;
    return mean(d * d);
  }
  std::shared_ptr<nn::Linear> l1, l2, l3;
};

// Batch `step` (0 or 1): x, y [12, 6], the same on every thread.
static std::pair<Tensor, Tensor> batch(int step) {
  manual_seed(500 + step);
  Tensor x = randn({kBatch, kIn});
  return {x, randn({kBatch, kOut})};
}

static std::vector<double> flat_grads(const std::vector<Tensor>& params) {
  std::vector<double> out;
  for (const Tensor& p : params) {
    expect(p.grad().defined(), "a parameter has no gradient after backward: give every parameter its averaged gradient");
    std::vector<double> v = p.grad().to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// The serial reference: one model (rank 0's seed) on the whole batch.
static std::vector<double> serial_gradient(int step) {
  Mlp model(7);
  auto [x, y] = batch(step);
  model.loss(x, y).backward();
  return flat_grads(model.parameters());
}

// The grader's own bucket rule, to know when each bucket must have been launched.
static std::vector<std::vector<int>> reference_plan(const std::vector<int64_t>& bytes, int64_t bucket_bytes) {
  std::vector<std::vector<int>> plan;
  int64_t held = 0;
  for (int i = static_cast<int>(bytes.size()) - 1; i >= 0; --i) {
    if (plan.empty() || held >= bucket_bytes) plan.emplace_back(), held = 0;
    plan.back().push_back(i);
    held += bytes[i];
  }
  return plan;
}

struct Arrival {
  int param;
  int64_t calls;  // the ledger's all-reduce calls right after the student's hook for it ran
};
struct GradHome {
  const void* storage;  // the .grad's storage after the synced backward
  int64_t offset;       // its element offset in it
};
struct RankRun {
  std::vector<std::vector<double>> grads;     // per step
  std::vector<std::vector<Arrival>> arrivals;  // per step, in the synced backward
  std::vector<std::vector<GradHome>> homes;    // per step, per parameter
  std::vector<int64_t> calls, bytes_sent;      // all-reduce, per step
  std::vector<int64_t> no_sync_calls;          // all-reduce calls after the no_sync micro-batch, per step
};
constexpr int kMicro = 2;  // micro-batches per step: the first under no_sync

// Two steps at world n, each rank on its B/n rows in kMicro micro-batches. Step 1 starts with the
// reducer's zero_grad (the buckets zeroed, .grad their views); step 2 with model.zero_grad(), which
// drops every .grad: backward then creates fresh ones the hooks must adopt.
static std::vector<RankRun> run(int n, int64_t bucket_bytes, bool layers_last_first = false) {
  std::vector<RankRun> runs(n);
  exercises::run_ranks(n, [&](RankContext& ctx) {
    const int r = ctx.rank;
    Mlp model(7 + r, layers_last_first);  // different weights: rank 0's must reach every rank
    std::shared_ptr<void> hooks = impl::attach_ddp_hooks(model, ctx.world, bucket_bytes);
    const std::vector<Tensor> params = model.parameters();
    RankRun& mine = runs[r];
    bool synced = false;
    for (int i = 0; i < static_cast<int>(params.size()); ++i)
      params[i].register_post_accumulate_grad_hook([&mine, &ctx, &synced, i](Tensor&) {
        if (synced) mine.arrivals.back().push_back({i, ctx.world->ledger()[CommOp::all_reduce].calls});
      });
    const int64_t rows = kBatch / n / kMicro;
    for (int step = 0; step < 2; ++step) {
      auto [x, y] = batch(step);
      if (step == 0) impl::zero_grad(hooks);
      else model.zero_grad();
      ctx.world->ledger().reset();
      mine.arrivals.emplace_back();
      for (int micro = 0; micro < kMicro; ++micro) {
        synced = micro == kMicro - 1;
        impl::set_sync(hooks, synced);
        const int64_t first = (r * kMicro + micro) * rows;
        (model.loss(x.flat_view(first * kIn, Shape({rows, kIn})), y.flat_view(first * kOut, Shape({rows, kOut}))) *
         (1.0 / kMicro)).backward();
        if (!synced) mine.no_sync_calls.push_back(ctx.world->ledger()[CommOp::all_reduce].calls);
      }
      mine.grads.push_back(flat_grads(params));
      mine.homes.emplace_back();
      for (const Tensor& p : params)
        mine.homes.back().push_back({p.grad().impl()->storage.get(), p.grad().impl()->storage_offset});
      mine.calls.push_back(ctx.world->ledger()[CommOp::all_reduce].calls);
      mine.bytes_sent.push_back(ctx.world->ledger()[CommOp::all_reduce].bytes_sent);
    }
  }, "a rank waited 4 s for a collective that never came: do all ranks launch "
      "the same buckets in the same order, and wait for each? ");
  return runs;
}

// No all-reduce under no_sync; every .grad a view of its bucket: the parameters of one bucket share a
// storage, and each keeps the same storage and offset from one step to the next.
static void expect_no_sync_and_views(int n, int64_t bucket_bytes, const std::vector<RankRun>& runs) {
  std::vector<int64_t> bytes;
  for (const Tensor& p : Mlp(7).parameters()) bytes.push_back(p.nbytes());
  const std::vector<std::vector<int>> plan = reference_plan(bytes, bucket_bytes);
  for (int r = 0; r < n; ++r) {
    const std::string who = "world " + std::to_string(n) + ", rank " + std::to_string(r) + ": ";
    for (int step = 0; step < 2; ++step)
      expect(runs[r].no_sync_calls[step] == 0,
             who + std::to_string(runs[r].no_sync_calls[step]) + " all-reduce(s) during a no_sync backward: under "
             "no_sync the hooks only accumulate (sync == false: return before counting or launching)");
    for (const std::vector<int>& bucket : plan)
      for (int i : bucket)
        expect(runs[r].homes[0][i].storage == runs[r].homes[0][bucket[0]].storage,
               who + "parameter " + std::to_string(i) + "'s .grad is not a view of its bucket (it has a storage "
               "of its own): point every .grad at its view (set_grad(views[i])) so that backward adds into the "
               "bucket, and hand back no copies");
    for (size_t i = 0; i < runs[r].homes[0].size(); ++i)
      expect(runs[r].homes[1][i].storage == runs[r].homes[0][i].storage &&
                 runs[r].homes[1][i].offset == runs[r].homes[0][i].offset,
             who + "backward 2, after model.zero_grad() dropped every .grad: parameter " + std::to_string(i) +
             "'s .grad is the fresh tensor backward created, not its bucket's view: copy it into its view and "
             "set_grad(view) (adopt it) in the hook");
  }
}

// Says in words what is wrong with rank r's gradient of step `step`.
static std::string diagnose_gradient(int n, int r, int step, const std::vector<double>& got,
                                     const std::vector<double>& want) {
  const std::string who = "world " + std::to_string(n) + ", rank " + std::to_string(r) + ", backward " +
                          std::to_string(step + 1) + ": ";
  if (all_close(got, scaled(want, n), 1e-5, 1e-4))
    return who + "the gradient is N x the serial one: divide the all-reduced sum by N";
  if (all_close(got, scaled(want, 1.0 / n), 1e-5, 1e-4))
    return who + "the gradient is 1/N of the serial one: did you divide twice?";
  if (step == 1 && all_close(got, scaled(want, 2), 1e-5, 1e-4))
    return who + "twice the serial gradient: did the bucket keep the last backward's sum?";
  return who + "the gradient differs from the serial whole-batch one (first element " +
         std::to_string(got.empty() ? 0.0 : got[0]) + ", expected " + std::to_string(want[0]) +
         "): every rank's share must be all-reduced (a bucket never launched or copied in the wrong place?)";
}

static void expect_serial_gradients(int n, const std::vector<RankRun>& runs) {
  for (int step = 0; step < 2; ++step) {
    const std::vector<double> want = serial_gradient(step);
    for (int r = 0; r < n; ++r)
      if (!all_close(runs[r].grads[step], want, 1e-5, 1e-4))
        expect(false, diagnose_gradient(n, r, step, runs[r].grads[step], want));
  }
}

// After each gradient of a synced backward, every bucket whose gradients are all in (in bucket order)
// must have been launched.
static void expect_overlap(int n, int64_t bucket_bytes, const std::vector<RankRun>& runs, bool layers_last_first = false) {
  std::vector<int64_t> bytes;
  for (const Tensor& p : Mlp(7, layers_last_first).parameters()) bytes.push_back(p.nbytes());
  const std::vector<std::vector<int>> plan = reference_plan(bytes, bucket_bytes);
  for (int r = 0; r < n; ++r)
    for (int step = 0; step < 2; ++step) {
      std::vector<int> pending;
      for (const std::vector<int>& b : plan) pending.push_back(static_cast<int>(b.size()));
      std::vector<int> bucket_of(bytes.size());
      for (size_t k = 0; k < plan.size(); ++k)
        for (int i : plan[k]) bucket_of[i] = static_cast<int>(k);
      int64_t ready = 0;
      for (const Arrival& a : runs[r].arrivals[step]) {
        --pending[bucket_of[a.param]];
        while (ready < static_cast<int64_t>(plan.size()) && pending[ready] == 0) ++ready;
        const int64_t complete = std::count(pending.begin(), pending.end(), 0);  // in any order
        const std::string at = "world " + std::to_string(n) + ", rank " + std::to_string(r) + ", after the gradient of "
                               "parameter " + std::to_string(a.param) + ": ";
        expect(a.calls <= ready || a.calls > complete,
               at + "a later bucket was launched before bucket " + std::to_string(ready) + ", which still waits for "
                    "gradients: launch strictly in bucket order (from the next unlaunched bucket, while it is full), "
                    "so that every rank issues the same all-reduces in the same order");
        expect(a.calls <= ready, at + std::to_string(a.calls) + " all-reduces were launched but only " +
                                     std::to_string(ready) + " bucket(s) were complete: launch a bucket when its LAST "
                                     "gradient is in (one all-reduce per bucket, not per parameter)");
        expect(a.calls >= ready, at + "only " + std::to_string(a.calls) + " all-reduce(s) launched, but " +
                                     std::to_string(ready) + " bucket(s) were complete: launch each bucket as soon as it "
                                     "is full, during backward (waiting for the end loses the overlap)");
      }
    }
}

// One all-reduce call per bucket, 2(N-1)/N · 4Ψ bytes sent per rank and step.
static void expect_bytes(int n, int64_t buckets, const std::vector<RankRun>& runs) {
  int64_t psi = 0;
  for (const Tensor& p : Mlp(7).parameters()) psi += p.numel();
  const int64_t formula = 2 * (n - 1) * 4 * psi / n;
  for (int r = 0; r < n; ++r)
    for (int step = 0; step < 2; ++step) {
      const std::string who = "world " + std::to_string(n) + ", rank " + std::to_string(r) + ": ";
      expect(runs[r].calls[step] == buckets, who + std::to_string(runs[r].calls[step]) + " all-reduce calls in one "
                                                 "step, expected one per bucket: " + std::to_string(buckets));
      expect(runs[r].bytes_sent[step] == formula,
             who + "sent " + std::to_string(runs[r].bytes_sent[step]) + " bytes in all-reduces over " +
                 std::to_string(kMicro) + " micro-batches, expected 2(N-1)/N · 4Ψ = " + std::to_string(formula) +
                 " (Ψ = " + std::to_string(psi) + "): every gradient exactly once per step");
    }
}

// The prediction's measured value: the library's DistributedDataParallel at world 3, 3 micro-batches
// (the first 2 under no_sync), rank 0's all-reduce bytes over the step.
static double measured_all_reduce_bytes() {
  int64_t bytes = 0;
  exercises::run_ranks(3, [&](RankContext& ctx) {
    Mlp model(7);
    DistributedDataParallel ddp(model, ctx.world);
    auto [x, y] = batch(0);
    ctx.world->ledger().reset();
    for (int micro = 0; micro < 3; ++micro) {
      const int64_t first = ctx.rank * 4 + micro;
      auto backward = [&] {
        (model.loss(x.flat_view(first * kIn, Shape({1, kIn})), y.flat_view(first * kOut, Shape({1, kOut}))) *
         (1.0 / 3)).backward();
      };
      if (micro < 2) {
        auto guard = ddp.no_sync();
        backward();
      } else {
        backward();
      }
    }
    if (ctx.rank == 0) bytes = ctx.world->ledger()[CommOp::all_reduce].bytes_sent;
  }, "the library's DistributedDataParallel did not finish: ");
  return static_cast<double>(bytes);
}

int main() {
  exercises::Grader grader("06_ddp_bucket_hook");
  grader.predict("bytes each rank sends in all-reduces per step at world 3, Ψ = 318, 3 micro-batches (2 under no_sync)",
                 impl::predicted_all_reduce_bytes, measured_all_reduce_bytes, 0, "bytes");
  grader.check("plan_buckets: reverse order, a bucket closes at bucket_bytes or more", [] {
    const std::vector<std::pair<std::vector<int64_t>, int64_t>> cases = {
        {{4, 4, 8, 8}, 10}, {{4, 4, 8, 8}, 1}, {{4, 4, 8, 8}, 1000}, {{12, 4, 4, 4, 20}, 8}, {{8, 8, 8}, 16}};
    for (const auto& [bytes, bucket_bytes] : cases) {
      const std::vector<std::vector<int>> got = impl::plan_buckets(bytes, bucket_bytes), want = reference_plan(bytes, bucket_bytes);
      if (got == want) continue;
      std::string text = "bytes [";
      for (int64_t b : bytes) text += std::to_string(b) + " ";
      text += "], bucket_bytes " + std::to_string(bucket_bytes) + ": ";
      if (!got.empty() && !got[0].empty() && got[0][0] == 0)
        expect(false, text + "bucket 0 starts with parameter 0: backward produces the LAST parameter's gradient "
                             "first, so plan in reverse order");
      expect(false, text + std::to_string(got.size()) + " bucket(s), expected " + std::to_string(want.size()) +
                        ": close a bucket once it holds bucket_bytes or more (>=, checked before adding the next)");
    }
  });
  const int64_t three_buckets = 300;  // {l3.b, l3.w} 312 B, {l2.b, l2.w} 624 B, {l1.b, l1.w} 336 B
  grader.check("world 2, 3 buckets: nothing sent under no_sync; every .grad a view of its bucket, adopted after "
               "model.zero_grad()", [&] {
    expect_no_sync_and_views(2, three_buckets, run(2, three_buckets));
  });
  grader.check("world 2, 3 buckets: gradients equal the serial whole-batch gradient (2 steps of 2 micro-batches)", [&] {
    expect_serial_gradients(2, run(2, three_buckets));
  });
  grader.check("world 2: each bucket launched inside backward, as soon as it is full", [&] {
    expect_overlap(2, three_buckets, run(2, three_buckets));
  });
  grader.check("world 2: one all-reduce per bucket, 2(N-1)/N · 4Ψ bytes", [&] {
    expect_bytes(2, 3, run(2, three_buckets));
  });
  grader.check("world 3, 3 buckets: serial gradients, overlap and bytes", [&] {
    const std::vector<RankRun> runs = run(3, three_buckets);
    expect_no_sync_and_views(3, three_buckets, runs);
    expect_serial_gradients(3, runs);
    expect_overlap(3, three_buckets, runs);
    expect_bytes(3, 3, runs);
  });
  grader.check("world 3, a bucket per parameter: serial gradients, overlap and bytes", [&] {
    const std::vector<RankRun> runs = run(3, 1);
    expect_no_sync_and_views(3, 1, runs);
    expect_serial_gradients(3, runs);
    expect_overlap(3, 1, runs);
    expect_bytes(3, 6, runs);
  });
  grader.check("world 2, layers registered last to first (gradients arrive against the plan): launched in bucket order", [&] {
    expect_overlap(2, three_buckets, run(2, three_buckets, /*layers_last_first=*/true), /*layers_last_first=*/true);
  });
  grader.check("world 2, one bucket: serial gradients and bytes", [&] {
    const std::vector<RankRun> runs = run(2, DDPOptions::kOneBucket);
    expect_serial_gradients(2, runs);
    expect_overlap(2, DDPOptions::kOneBucket, runs);
    expect_bytes(2, 1, runs);
  });
  return grader.finish();
}
