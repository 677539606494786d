// Lesson 06 — data parallelism: DataParallel's five exchanges against DDP's one all-reduce.
//
// What you will learn
//   * data parallelism: every rank holds the whole model and trains on its rows of the batch; the
//     average of the ranks' gradients is the gradient of the whole batch
//   * naive DataParallel: rank 0 scatters the batch, replicates the model, gathers the outputs,
//     computes the loss, scatters its gradient and gathers the gradients: five exchanges every
//     step, all through rank 0, which moves (N-1) x 4Ψ bytes of gradients alone
//   * DistributedDataParallel: one broadcast at the start, then a single exchange per step, the
//     gradient all-reduce, 2(N-1)/N x 4Ψ bytes on every rank alike
//   * buckets: DDP cuts the gradients into buckets, in the order backward produces them, and
//     starts each bucket's all-reduce as soon as it is full, so communication hides behind backward
//     (drawn below from the timestamps DDP records, one timeline per rank)
//   * DDP on one page: DDPByHand below is the algorithm in ~60 lines over the ProcessGroup API
//     (hooks, reverse-order buckets, async all-reduce, wait, divide), checked bitwise against
//     parallel/ddp, then run over a modeled 1 Gbit/s link where the overlap becomes visible
//   * no_sync(): gradient accumulation without communication until the last micro-batch
//   * and that both give the serial run's losses, gradients and weights
//
// Run:    make lesson N=06        Prints: the story below, then "lesson 06: OK".
// Try:    build/lessons/06_data_parallel --world 2 --bucket-kib 256 --gbit 0.5 --svg /tmp/svg_06
//         build/lessons/06_data_parallel --break-no-average   (DDPByHand sums the gradients, never divides by N)
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "autograd/grad_mode.h"
#include "lesson_args.h"
#include "lesson_svg.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/ddp.h"
#include "parallel/comm/launch.h"
#include "parallel/data_parallel/naive_data_parallel.h"
#include "tensor/ledger.h"

using namespace sl;
using namespace sl::parallel;
using Clock = std::chrono::steady_clock;

static void section(const char* title) { std::printf("\n--- %s\n", title); }
static double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
static std::string kib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f KiB", bytes / 1024.0);
  return text;
}

// The small model of the exchanges and the checks, and a bigger one whose backward takes long
// enough to watch buckets overlap it. Batches of 8 rows: 2 or 4 ranks take 4 or 2 rows each.
static const nn::GPTConfig kSmall{64, 32, 2, 4, 64, 0.0};
static const nn::GPTConfig kBig{256, 64, 4, 4, 128, 0.0};
constexpr int64_t kBatch = 8;

static nn::TokenStream make_tokens(int64_t vocab) {
  nn::TokenStream stream;
  stream.vocab_size = vocab;
  uint32_t x = 2024;
  for (int i = 0; i < 20000; ++i) {
    x = x * 1664525u + 1013904223u;  // any fixed stream will do
    stream.tokens.push_back(static_cast<int32_t>((x >> 8) % vocab));
  }
  return stream;
}

static nn::AdamWOptions adamw() {
  nn::AdamWOptions options;
  options.lr = 1e-3;
  // Adam divides by sqrt(v) + eps: a gradient that is 0 in exact arithmetic (the attention key bias's)
  // is float noise of ~1e-9 whose sign depends on the summation order, and with eps 1e-8 that noise
  // becomes steps of size lr. eps 1e-6 keeps serial and parallel within 1e-5 however the sums are ordered.
  options.eps = 1e-6;
  return options;
}

// ---- DDP by hand: the algorithm of parallel/data_parallel/ddp.cpp on one page ------------------------------------
//   1. rank 0's weights are broadcast, so every replica starts equal;
//   2. buckets hold the parameters in reverse order (the order backward produces their gradients);
//      a bucket closes once it holds bucket_bytes;
//   3. a post-accumulate hook per parameter copies its gradient into its bucket; a bucket whose last
//      gradient is in starts its all-reduce (sum) asynchronously, strictly in bucket order, so every
//      rank issues the same collectives in the same order;
//   4. the last hook waits for every bucket, divides by N and gives each .grad the average.
// Left out (parallel/data_parallel/ddp.cpp has them): no_sync, gradients as views into the buckets (no copies),
// unused-parameter errors, a watcher thread that stamps each all-reduce's true end.
//
// link_bytes_per_s > 0 models a slow link. The real all-reduce still moves the bytes (through shared
// memory, in well under a millisecond); then the bucket occupies the link for as long as a ring
// all-reduce's 2(N-1)/N x its bytes take at that speed, after the buckets before it, and only then
// counts as delivered. Only that wait is modeled: the arithmetic and the bits are the real ones.
class DDPByHand {
 public:
  // sum_not_average: the mistake of --break-no-average, the all-reduced sum left undivided (N x the gradient).
  DDPByHand(nn::Module& model, ProcessGroupPtr group, int64_t bucket_bytes, double link_bytes_per_s = 0,
            bool sum_not_average = false)
      : group_(std::move(group)),
        params_(model.parameters()),
        link_bytes_per_s_(link_bytes_per_s),
        sum_not_average_(sum_not_average) {
    NoGradGuard no_grad;
    for (const Tensor& p : params_) group_->broadcast(p, 0);  // 1. every replica starts from rank 0's
    const int n = static_cast<int>(params_.size());
    bucket_of_.resize(n), offset_of_.resize(n);
    int64_t bytes = 0;
    for (int i = n - 1; i >= 0; --i) {  // 2. reverse-order buckets
      if (buckets_.empty() || bytes >= bucket_bytes) buckets_.emplace_back(), bytes = 0;
      bucket_of_[i] = static_cast<int>(buckets_.size()) - 1;
      offset_of_[i] = buckets_.back().numel;
      buckets_.back().numel += params_[i].numel();
      buckets_.back().size++;
      bytes += params_[i].nbytes();
    }
    for (Bucket& b : buckets_) b.buffer = zeros(Shape({b.numel}));
    for (int i = 0; i < n; ++i)  // 3. (the hooks stay on the parameters: this object must outlive backward)
      params_[i].register_post_accumulate_grad_hook([this, i](Tensor&) { on_gradient(i); });
  }
  const BackwardTimeline& timeline() const { return timeline_; }

 private:
  struct Bucket {
    int64_t numel = 0;
    int size = 0, pending = 0;                        // parameters; gradients still to come in this backward
    Tensor buffer;                                    // [numel]: the bucket's gradients end to end
    std::shared_future<Clock::time_point> delivered;  // the all-reduce, then the modeled link: when done
  };

  void on_gradient(int i) {
    NoGradGuard no_grad;
    if (arrived_ == 0) {  // the first gradient of this backward
      timeline_ = BackwardTimeline{};
      timeline_.first_gradient = Clock::now();
      for (Bucket& b : buckets_) b.pending = b.size;
    }
    Bucket& bucket = buckets_[bucket_of_[i]];
    bucket.buffer.flat_view(offset_of_[i], params_[i].shape()).copy_(params_[i].grad());
    --bucket.pending;
    while (launched_ < buckets_.size() && buckets_[launched_].pending == 0) launch(launched_++);
    if (++arrived_ == params_.size()) finish();
  }

  void launch(size_t index) {
    Bucket& b = buckets_[index];
    timeline_.buckets.push_back({static_cast<int>(index), b.buffer.nbytes(), Clock::now(), {}});
    WorkPtr work = group_->all_reduce_async(b.buffer, ReduceOp::sum);  // returns at once
    const int n = group_->size();
    const auto wire = std::chrono::duration<double>(
        link_bytes_per_s_ > 0 ? 2.0 * (n - 1) / n * b.buffer.nbytes() / link_bytes_per_s_ : 0.0);
    std::shared_future<Clock::time_point> before = index > 0 ? buckets_[index - 1].delivered : ready_;
    b.delivered = std::async(std::launch::async, [work, before, wire] {
                    work->wait();   // the real all-reduce (rethrows what it failed with)
                    before.wait();  // the link carries one bucket at a time, in order
                    std::this_thread::sleep_for(wire);
                    return Clock::now();
                  }).share();
  }

  void finish() {  // 4. runs inside backward, in the last parameter's hook
    timeline_.last_gradient = Clock::now();
    const double inverse_n = 1.0 / group_->size();  // avg = sum x (1/N), as the library's ReduceOp::avg
    for (size_t k = 0; k < buckets_.size(); ++k) {
      timeline_.buckets[k].finished = buckets_[k].delivered.get();
      if (!sum_not_average_) buckets_[k].buffer.mul_(inverse_n);
    }
    for (size_t i = 0; i < params_.size(); ++i)
      params_[i].set_grad(buckets_[bucket_of_[i]].buffer.flat_view(offset_of_[i], params_[i].shape()).clone());
    timeline_.synchronized = Clock::now();
    arrived_ = 0, launched_ = 0;
  }

  ProcessGroupPtr group_;
  std::vector<Tensor> params_;
  double link_bytes_per_s_;
  bool sum_not_average_;
  std::vector<int> bucket_of_;
  std::vector<int64_t> offset_of_;
  std::vector<Bucket> buckets_;
  size_t arrived_ = 0, launched_ = 0;
  std::shared_future<Clock::time_point> ready_ = std::async(std::launch::deferred, [] { return Clock::now(); }).share();
  BackwardTimeline timeline_;
};

// One rank's last backward: when it was called, and what DDP recorded.
struct RankTimeline {
  Clock::time_point called;
  BackwardTimeline backward;
};

// Draws every rank on one time scale: '=' backward computing, '.' backward waiting for the last
// all-reduces, '#' a bucket's all-reduce in flight (launched -> finished).
static void draw(const std::vector<RankTimeline>& ranks) {
  Clock::time_point t0 = ranks[0].called, t1 = ranks[0].backward.synchronized;
  for (const RankTimeline& r : ranks) t0 = std::min(t0, r.called), t1 = std::max(t1, r.backward.synchronized);
  const int W = 64;
  const double total = ms_between(t0, t1);
  auto col = [&](Clock::time_point t) { return std::clamp(static_cast<int>(ms_between(t0, t) / total * W), 0, W); };
  std::printf("  %-21s0 ms%*s%6.1f ms\n", "", W - 10, "", total);
  for (size_t r = 0; r < ranks.size(); ++r) {
    const BackwardTimeline& b = ranks[r].backward;
    std::string line(W, ' ');
    for (int x = col(ranks[r].called); x < W; ++x)
      line[x] = x < col(b.last_gradient)                                      ? '='
                : x < std::max(col(b.synchronized), col(b.last_gradient) + 1) ? '.'
                                                                              : ' ';
    std::printf("  rank %zu backward     |%s|\n", r, line.c_str());
    for (const BucketEvent& e : b.buckets) {
      std::string bar(W, ' ');
      for (int x = col(e.launched); x < std::max(col(e.finished), col(e.launched) + 1) && x < W; ++x) bar[x] = '#';
      std::printf("    bucket %d %4lld KiB |%s|\n", e.bucket, static_cast<long long>(e.bytes >> 10), bar.c_str());
    }
  }
}

// How much of the all-reduce time ran while backward was still computing, and how long backward
// waited after its compute: the communication overlap hid, and the part it could not.
static void overlap_summary(const std::vector<RankTimeline>& ranks) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    const BackwardTimeline& b = ranks[r].backward;
    double busy = 0, hidden = 0;
    for (const BucketEvent& e : b.buckets) {
      busy += ms_between(e.launched, e.finished);
      hidden += std::max(0.0, ms_between(e.launched, std::min(e.finished, b.last_gradient)));
    }
    std::printf(
        "  rank %zu: backward computed %.1f ms; all-reduces in flight %.1f ms, %.1f ms of it during"
        " compute;\n          then backward waited %.1f ms for the rest\n",
        r, ms_between(ranks[r].called, b.last_gradient), busy, hidden, ms_between(b.last_gradient, b.synchronized));
  }
}

// Everything one run saw, flattened over the parameters, step by step.
struct Trace {
  std::vector<double> losses;
  std::vector<std::vector<float>> grads, params;  // gradients before clipping; weights after the step
};
static std::vector<float> flat_values(const std::vector<Tensor>& tensors, bool grads) {
  std::vector<float> out;
  for (const Tensor& t : tensors) {
    std::vector<float> v = (grads ? t.grad() : t).values<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}
// The largest |got - want| and whether every element is within rtol 1.3e-6, atol 1e-5.
static std::pair<double, bool> compare(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  bool within = got.size() == want.size();
  for (size_t i = 0; within && i < got.size(); ++i) {
    double diff = std::abs(static_cast<double>(got[i]) - want[i]);
    worst = std::max(worst, diff);
    within = diff <= 1e-5 + 1.3e-6 * std::abs(want[i]);
  }
  return {worst, within};
}

// The same timeline as draw(), as a picture: per rank a bar of backward (computing, then waiting) and
// one bar per bucket's all-reduce, launched -> delivered.
static std::string timeline_picture(const std::vector<RankTimeline>& ranks, const std::string& title) {
  Clock::time_point t0 = ranks[0].called, t1 = ranks[0].backward.synchronized;
  for (const RankTimeline& r : ranks) t0 = std::min(t0, r.called), t1 = std::max(t1, r.backward.synchronized);
  const double width = 640, left = 130, row = 16, total = std::max(ms_between(t0, t1), 1e-3);
  auto x = [&](Clock::time_point t) { return left + ms_between(t0, t) / total * width; };
  size_t rows = 0;
  for (const RankTimeline& r : ranks) rows += 1 + r.backward.buckets.size();
  lesson::Canvas canvas(left + width + 20, 50 + rows * row);
  canvas.text(10, 18, title + " (" + std::to_string(static_cast<int>(total)) + " ms)", 13);
  double y = 30;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const BackwardTimeline& b = ranks[r].backward;
    canvas.text(10, y + 11, "rank " + std::to_string(r) + " backward", 11);
    canvas.box(x(ranks[r].called), y, std::max(1.0, x(b.last_gradient) - x(ranks[r].called)), row - 3, "#4c78a8");
    canvas.box(x(b.last_gradient), y, std::max(1.0, x(b.synchronized) - x(b.last_gradient)), row - 3, "#dddddd");
    y += row;
    for (const BucketEvent& e : b.buckets) {
      canvas.text(20, y + 11, "bucket " + std::to_string(e.bucket), 11);
      canvas.box(x(e.launched), y, std::max(1.0, x(e.finished) - x(e.launched)), row - 3, "#f58518");
      y += row;
    }
  }
  return canvas.str();
}

int main(int argc, char** argv) {
  lesson::Args args(argc, argv, "06_data_parallel", "DataParallel's five exchanges against DDP's one all-reduce");
  const int n = args.integer("world", 4, "data-parallel ranks N of sections 1, 2, 4 and 6 (divides the 8 rows)", 2, 8);
  const int64_t bucket_kib = args.integer("bucket-kib", 512, "DDP bucket size of sections 3 and 4's slow link", 64, 2048);
  const double gbit = args.real("gbit", 1.0, "speed of section 4's modeled link, Gbit/s", 0.5, 2.0);
  const bool sum_not_average = args.breaks("no-average", "DDPByHand all-reduces the sum and never divides by N");
  const std::string svg_dir = args.svg();
  args.done();
  if (kBatch % n != 0) {
    std::fprintf(stderr, "06_data_parallel: --world %d does not divide the batch's %lld rows (use 2, 4 or 8)\n", n,
                 static_cast<long long>(kBatch));
    return 2;
  }
  std::printf("values: world %d, bucket-kib %lld, gbit %g%s\n", n, static_cast<long long>(bucket_kib), gbit,
              sum_not_average ? ", BROKEN: no-average" : "");
  bool ok = true;
  auto check = [&](bool condition, const std::string& what) {
    std::printf("  check: %-72s %s\n", what.c_str(), condition ? "ok" : "FAILED");
    ok = ok && condition;
  };
  const nn::TokenStream small_tokens = make_tokens(kSmall.vocab_size), big_tokens = make_tokens(kBig.vocab_size);
  const int64_t T = kSmall.block_size, V = kSmall.vocab_size;
  const int64_t psi = nn::GPT(kSmall).num_parameters();
  std::printf("The model: GPT with %lld layers, n_embd %lld, vocab %lld: Ψ = %lld parameters (4Ψ = %s).\n",
              static_cast<long long>(kSmall.n_layer), static_cast<long long>(kSmall.n_embd), static_cast<long long>(V),
              static_cast<long long>(psi), kib(4 * psi).c_str());
  std::printf("A step trains on %lld rows of %lld tokens; rank r of N takes rows [r·8/N, (r+1)·8/N).\n",
              static_cast<long long>(kBatch), static_cast<long long>(T));

  // ---------------------------------------------------------------------------------------------
  std::printf("\n--- 1. naive DataParallel, %d ranks: the five exchanges of one step, from the ledgers\n", n);
  std::vector<std::array<CommStats, kNumExchanges>> naive(n);
  launch(n, [&](RankContext& ctx) {
    nn::GPT model(kSmall, /*seed=*/ctx.rank);  // only rank 0's weights matter: they are replicated
    NaiveDataParallel dp(model, ctx.world, kBatch, T);
    dp.forward_backward(ctx.rank == 0 ? small_tokens.get_batch(0, kBatch, T) : nn::Batch{});
    for (int e = 0; e < kNumExchanges; ++e) naive[ctx.rank][e] = dp.ledger(static_cast<Exchange>(e)).total();
  });
  std::printf("  %-20s %-10s %14s %14s %14s %14s\n", "exchange", "op", "rank 0 sent", "rank 0 recv", "rank 1 sent",
              "rank 1 recv");
  const char* ops[kNumExchanges] = {"send/recv", "broadcast", "send/recv", "send/recv", "send/recv"};
  for (int e = 0; e < kNumExchanges; ++e) {
    std::printf("  %d %-18s %-10s %14s %14s %14s %14s\n", e + 1, exchange_name(static_cast<Exchange>(e)), ops[e],
                kib(naive[0][e].bytes_sent).c_str(), kib(naive[0][e].bytes_received).c_str(),
                kib(naive[1][e].bytes_sent).c_str(), kib(naive[1][e].bytes_received).c_str());
  }
  std::printf(
      "  Rank 0 sends each worker its %lld rows (8-byte token ids), broadcasts the weights (a chain: each\n"
      "  rank forwards them to the next), receives %lld x the logits [%lld, %lld, %lld], sends back their\n"
      "  gradient (plus 4 bytes: the loss, so every rank can report it) and receives %lld x 4Ψ of gradients.\n",
      static_cast<long long>(kBatch / n), static_cast<long long>(n - 1), static_cast<long long>(kBatch / n),
      static_cast<long long>(T), static_cast<long long>(V), static_cast<long long>(n - 1));
  check(naive[0][4].bytes_received == (n - 1) * 4 * psi, "rank 0 received (N-1) x 4Ψ bytes of gradients");

  // ---------------------------------------------------------------------------------------------
  std::printf("\n--- 2. DDP, %d ranks: one exchange, the gradient all-reduce\n", n);
  std::vector<CommStats> ddp_stats(n);
  std::vector<std::array<int64_t, 3>> held(n);
  launch(n, [&](RankContext& ctx) {
    MemoryLedger& memory = MemoryLedger::instance();
    std::array<MemoryCategory, 3> kinds{MemoryCategory::weights, MemoryCategory::grads, MemoryCategory::optimizer};
    std::array<int64_t, 3> before{};
    for (int k = 0; k < 3; ++k) before[k] = memory.current(ctx.device, kinds[k]);
    nn::GPT model(kSmall, /*seed=*/ctx.rank);  // made equal by DDP's broadcast at construction
    DistributedDataParallel ddp(model, ctx.world);
    nn::AdamW optimizer(model.parameters(), adamw());
    RowRange rows = data_parallel_rows(kBatch, ctx.rank, ctx.world_size);
    nn::Batch batch = small_tokens.get_batch(0, kBatch, T, rows.begin, rows.end);
    ctx.world->ledger().reset();  // count the step only, not the broadcast
    model.loss(batch.inputs, batch.targets).backward();
    ddp_stats[ctx.rank] = ctx.world->ledger()[CommOp::all_reduce];
    ddp.step(optimizer);
    for (int k = 0; k < 3; ++k) held[ctx.rank][k] = memory.current(ctx.device, kinds[k]) - before[k];
  });
  std::printf("  %-6s %16s %16s %16s %16s\n", "rank", "naive DP sent", "naive DP recv", "DDP sent", "DDP recv");
  for (int r = 0; r < n; ++r) {
    int64_t sent = 0, received = 0;
    for (const CommStats& s : naive[r]) sent += s.bytes_sent, received += s.bytes_received;
    std::printf("  %-6d %16s %16s %16s %16s\n", r, kib(sent).c_str(), kib(received).c_str(),
                kib(ddp_stats[r].bytes_sent).c_str(), kib(ddp_stats[r].bytes_received).c_str());
  }
  std::printf(
      "  DDP: %lld all_reduce call per step (the default 1 MiB bucket holds all 4Ψ = %s); every rank\n"
      "  sends 2(N-1)/N x 4Ψ = %s and receives as much, less than 2 x 4Ψ whatever N is. Naive DP's\n"
      "  rank 0 receives (N-1) x 4Ψ of gradients alone, a load that grows with N; its exchanges are\n"
      "  serial (forward, then the loss on rank 0, then backward, then the gradients: nothing overlaps);\n"
      "  and its logits grow with the vocabulary: GPT-2's 50257 tokens make 196 MiB per row of 1024.\n",
      static_cast<long long>(ddp_stats[0].calls), kib(4 * psi).c_str(), kib(2 * (n - 1) * 4 * psi / n).c_str());
  bool formula = true, memory_ok = true;
  for (int r = 0; r < n; ++r) {
    formula = formula && ddp_stats[r].bytes_sent == 2 * (n - 1) * 4 * psi / n;
    memory_ok = memory_ok && held[r] == std::array<int64_t, 3>{4 * psi, 4 * psi, 8 * psi};
  }
  std::printf("  Memory held per rank (ledger): weights %s + gradients %s + AdamW %s = 16Ψ, on every rank.\n",
              kib(held[0][0]).c_str(), kib(held[0][1]).c_str(), kib(held[0][2]).c_str());
  check(formula, "every DDP rank sent exactly 2(N-1)/N x 4Ψ bytes");
  check(memory_ok, "DDP holds 4Ψ + 4Ψ + 8Ψ = 16Ψ per rank (lesson 07 shards it)");
  // ---------------------------------------------------------------------------------------------
  std::printf("\n--- 3. buckets and overlap: DDP on 2 ranks, a bigger model, %lld KiB buckets\n",
              static_cast<long long>(bucket_kib));
  auto train_big = [&](int64_t bucket_bytes, std::vector<BucketLayout>* layout) {
    std::vector<RankTimeline> timelines(2);
    launch(2, [&](RankContext& ctx) {
      nn::GPT model(kBig, /*seed=*/0);
      DistributedDataParallel ddp(model, ctx.world, DDPOptions{bucket_bytes});
      nn::AdamW optimizer(model.parameters(), adamw());
      RowRange rows = data_parallel_rows(kBatch, ctx.rank, ctx.world_size);
      for (int step = 0; step < 3; ++step) {  // the last step is drawn; the first ones warm up
        ddp.zero_grad();
        nn::Batch batch = big_tokens.get_batch(step, kBatch, kBig.block_size, rows.begin, rows.end);
        Tensor loss = model.loss(batch.inputs, batch.targets);
        ctx.world->barrier();  // line the ranks up, so the picture shows overlap rather than skew
        timelines[ctx.rank].called = Clock::now();
        loss.backward();
        nn::clip_grad_norm(model.parameters(), 1.0);
        ddp.step(optimizer);
      }
      timelines[ctx.rank].backward = ddp.timeline();
      if (layout != nullptr && ctx.rank == 0) *layout = ddp.bucket_layout();
    });
    return timelines;
  };
  const int64_t big_psi = nn::GPT(kBig).num_parameters();
  std::vector<BucketLayout> layout;
  std::vector<RankTimeline> bucketed = train_big(bucket_kib << 10, &layout);
  std::printf("  Ψ = %lld (4Ψ = %s). Buckets fill in reverse parameter order, the order backward makes them:\n",
              static_cast<long long>(big_psi), kib(4 * big_psi).c_str());
  for (size_t b = 0; b < layout.size(); ++b)
    std::printf("    bucket %2zu %10s  %2zu parameters  %s ... %s\n", b, kib(4 * layout[b].numel).c_str(),
                layout[b].names.size(), layout[b].names.front().c_str(), layout[b].names.back().c_str());
  std::printf(
      "  One step's backward on each rank, from the timestamps DDP records (ddp.timeline()); a real\n"
      "  run on a shared 2-core machine, so the scheduler's pauses show up too:\n");
  draw(bucketed);
  overlap_summary(bucketed);
  std::printf(
      "  Each bucket's all-reduce starts when its last gradient is in (and the buckets before it have\n"
      "  started: every rank must issue the same collectives in the same order) and runs on the group's\n"
      "  worker thread while backward computes the next layers. Only the last bucket (wte: the embedding\n"
      "  gradient comes last) cannot overlap anything. With everything in one bucket nothing starts early:\n");
  std::vector<RankTimeline> single = train_big(DDPOptions::kOneBucket, nullptr);
  draw(single);
  overlap_summary(single);
  std::vector<double> lone_ms(2);
  launch(2, [&](RankContext& ctx) {
    Tensor gradients = zeros(Shape({big_psi}));
    std::vector<double> times;
    for (int i = 0; i < 5; ++i) {
      ctx.world->barrier();
      Clock::time_point start = Clock::now();
      ctx.world->all_reduce(gradients, ReduceOp::avg);
      times.push_back(ms_between(start, Clock::now()));
    }
    std::sort(times.begin(), times.end());
    lone_ms[ctx.rank] = times[2];
  });
  const double ring_bytes = 2.0 * (2 - 1) / 2 * 4 * big_psi;
  std::printf(
      "  Here bytes move through shared memory: an all-reduce of all 4Ψ alone takes %.2f ms (median of 5),\n"
      "  against tens of ms of backward. What the bars show in flight is mostly a rank waiting for its peer\n"
      "  to reach the same bucket, or its worker thread waiting for a core (2 ranks share 2 cores). Over a\n"
      "  10 Gbit/s network the same all-reduce sends 2(N-1)/N x 4Ψ = %.1f MB per rank: %.1f ms; with bigger\n"
      "  models or slower links it rivals backward itself, and hiding it behind backward is what lets DDP\n"
      "  scale.\n",
      lone_ms[0], ring_bytes / 1e6, ring_bytes / 1.25e9 * 1e3);
  bool early = true;
  for (const RankTimeline& r : bucketed)
    early = early && r.backward.buckets.size() == layout.size() &&
            r.backward.buckets.front().launched < r.backward.last_gradient;
  check(early, "with buckets, the first all-reduce is launched while backward still computes");

  // ---------------------------------------------------------------------------------------------
  section("4. DDP by hand (DDPByHand, at the top of this file), against parallel/ddp, bit for bit");
  // Each rank trains two replicas side by side from the same weights on the same rows: one wrapped
  // by the library, one by the hand-written class. Same buckets, same ring: the same bits.
  std::vector<char> bitwise(n, 1);
  std::vector<int> hand_buckets(n);
  std::vector<double> gradient_ratio(n, 1.0);  // |hand gradient| / |library gradient|, first step, per rank
  launch(n, [&](RankContext& ctx) {
    nn::GPT library_model(kSmall, /*seed=*/ctx.rank), hand_model(kSmall, /*seed=*/ctx.rank);
    DistributedDataParallel library(library_model, ctx.world, DDPOptions{4096});
    DDPByHand hand(hand_model, ctx.world, 4096, 0, sum_not_average);
    nn::AdamW library_adamw(library_model.parameters(), adamw()), hand_adamw(hand_model.parameters(), adamw());
    RowRange rows = data_parallel_rows(kBatch, ctx.rank, ctx.world_size);
    auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    for (int step = 0; step < 3; ++step) {
      nn::Batch batch = small_tokens.get_batch(step, kBatch, T, rows.begin, rows.end);
      library.zero_grad();
      library_model.loss(batch.inputs, batch.targets).backward();
      hand_adamw.zero_grad();
      hand_model.loss(batch.inputs, batch.targets).backward();
      const std::vector<float> library_grads = flat_values(library_model.parameters(), true);
      const std::vector<float> hand_grads = flat_values(hand_model.parameters(), true);
      bool same = same_bits(library_grads, hand_grads);
      if (step == 0) {
        double hand_norm = 0, library_norm = 0;
        for (size_t i = 0; i < hand_grads.size(); ++i)
          hand_norm += hand_grads[i] * hand_grads[i], library_norm += library_grads[i] * library_grads[i];
        gradient_ratio[ctx.rank] = std::sqrt(hand_norm / library_norm);
      }
      library.step(library_adamw);
      hand_adamw.step();
      same = same &&
             same_bits(flat_values(library_model.parameters(), false), flat_values(hand_model.parameters(), false));
      bitwise[ctx.rank] = bitwise[ctx.rank] && same;
    }
    hand_buckets[ctx.rank] = static_cast<int>(hand.timeline().buckets.size());
  });
  std::printf(
      "  %d ranks, 4 KiB buckets (%d of them), 3 AdamW steps: the averaged gradients and the weights\n"
      "  after each step are %s on every rank.\n",
      n, hand_buckets[0],
      std::all_of(bitwise.begin(), bitwise.end(), [](char b) { return b != 0; })
          ? "the same bits as parallel/ddp's"
          : "NOT the same bits as parallel/ddp's");
  if (std::abs(gradient_ratio[0] - 1.0) > 1e-6)
    std::printf("  rank 0's hand gradient is %.3f x the library's (N = %d: a sum, not an average)\n", gradient_ratio[0], n);
  check(std::all_of(bitwise.begin(), bitwise.end(), [](char b) { return b != 0; }),
        "DDPByHand == parallel/ddp, bitwise (gradients and weights)");

  // With a modeled link each bucket takes as long as 1 Gbit/s would, so the all-reduces are as
  // long as backward itself, and what overlap buys shows up in the bars.
  const double link = gbit * 1.25e8;  // bytes per second: 1 Gbit/s is 1.25e8
  auto train_by_hand = [&](int64_t bucket_bytes) {
    std::vector<RankTimeline> timelines(2);
    launch(2, [&](RankContext& ctx) {
      nn::GPT model(kBig, /*seed=*/0);
      DDPByHand ddp(model, ctx.world, bucket_bytes, link);
      RowRange rows = data_parallel_rows(kBatch, ctx.rank, ctx.world_size);
      for (int step = 0; step < 2; ++step) {  // the last step is drawn
        model.zero_grad();
        nn::Batch batch = big_tokens.get_batch(step, kBatch, kBig.block_size, rows.begin, rows.end);
        Tensor loss = model.loss(batch.inputs, batch.targets);
        ctx.world->barrier();
        timelines[ctx.rank].called = Clock::now();
        loss.backward();
      }
      timelines[ctx.rank].backward = ddp.timeline();
    });
    return timelines;
  };
  std::printf(
      "  Over a modeled %g Gbit/s link (the bytes move through the real all-reduce, DDPByHand holds each\n"
      "  result back until such a link would have delivered it), %lld KiB buckets:\n",
      gbit, static_cast<long long>(bucket_kib));
  std::vector<RankTimeline> slow_bucketed = train_by_hand(bucket_kib << 10);
  draw(slow_bucketed);
  overlap_summary(slow_bucketed);
  std::printf("  and everything in one bucket, which can only start when backward has finished:\n");
  std::vector<RankTimeline> slow_single = train_by_hand(DDPOptions::kOneBucket);
  draw(slow_single);
  overlap_summary(slow_single);
  lesson::write_picture(svg_dir, "06_ddp_buckets_slow_link.svg", timeline_picture(slow_bucketed, "DDPByHand, buckets, slow link"));
  lesson::write_picture(svg_dir, "06_ddp_one_bucket_slow_link.svg", timeline_picture(slow_single, "DDPByHand, one bucket, slow link"));
  // How much of the link's busy time fell inside backward's compute, per rank: bucket k occupies the
  // link for its wire time, ending when it is delivered.
  auto hidden_ms = [&](const RankTimeline& r) {
    double hidden = 0;
    for (const BucketEvent& e : r.backward.buckets) {
      const double end = ms_between(r.called, e.finished), begin = end - 2.0 * (2 - 1) / 2 * e.bytes / link * 1e3;
      hidden += std::max(0.0, std::min(end, ms_between(r.called, r.backward.last_gradient)) - std::max(begin, 0.0));
    }
    return hidden;
  };
  auto least_hidden_ms = [&](const std::vector<RankTimeline>& ranks) {
    double least = 1e9;
    for (const RankTimeline& r : ranks) least = std::min(least, hidden_ms(r));
    return least;
  };
  // The rank whose backward computed last. By then its peer has launched every bucket too, so only
  // the link holds its buckets back. The other rank may have finished early and waited for a peer
  // the scheduler had paused (2 ranks share 2 busy cores): its all-reduces could not start, however
  // early it launched them, and it hid little. Checking that rank, not the least of the two, keeps
  // the check true on a loaded machine.
  auto last_to_compute = [&](const std::vector<RankTimeline>& ranks) -> const RankTimeline& {
    return ranks[0].backward.last_gradient >= ranks[1].backward.last_gradient ? ranks[0] : ranks[1];
  };
  const double wire_ms = 2.0 * (2 - 1) / 2 * 4 * big_psi / link * 1e3;
  std::printf(
      "  The link needs %.1f ms for all 4Ψ. With buckets, %.1f ms (rank 0) and %.1f ms (rank 1) of it ran\n"
      "  during backward's compute; with one bucket %.1f and %.1f ms: it can only start when compute is\n"
      "  over, and backward waits for all of it. (Where a rank's bars start late or stretch, it waited for\n"
      "  its peer: 2 ranks share 2 busy cores, and an all-reduce finishes only when both have reached it.\n"
      "  So the check reads the rank whose backward computed last: its peer had launched every bucket.)\n",
      wire_ms, hidden_ms(slow_bucketed[0]), hidden_ms(slow_bucketed[1]), hidden_ms(slow_single[0]),
      hidden_ms(slow_single[1]));
  // One bucket starts in backward's last hook, so on either rank it hides only what that hook's last
  // few statements take: the least of the two stays near 0 even when the scheduler pauses one rank.
  check(hidden_ms(last_to_compute(slow_bucketed)) > 0.25 * wire_ms && least_hidden_ms(slow_single) < 0.1 * wire_ms,
        "over a slow link, buckets hide link time behind backward; one bucket cannot");

  // ---------------------------------------------------------------------------------------------
  section("5. gradient accumulation: 2 micro-batches under no_sync(), then one synced, 2 ranks");
  std::vector<int64_t> calls_after(3);
  launch(2, [&](RankContext& ctx) {
    nn::GPT model(kSmall, /*seed=*/0);
    DistributedDataParallel ddp(model, ctx.world);
    RowRange rows = data_parallel_rows(kBatch, ctx.rank, ctx.world_size);
    const int64_t start = ctx.world->ledger()[CommOp::all_reduce].calls;
    for (int micro = 0; micro < 3; ++micro) {
      nn::Batch batch = small_tokens.get_batch(micro, kBatch, T, rows.begin, rows.end);
      auto backward = [&] { (model.loss(batch.inputs, batch.targets) * (1.0 / 3)).backward(); };
      if (micro < 2) {
        auto guard = ddp.no_sync();  // accumulate into the buckets, launch nothing
        backward();
      } else {
        backward();
      }
      if (ctx.rank == 0) calls_after[micro] = ctx.world->ledger()[CommOp::all_reduce].calls - start;
    }
  });
  std::printf(
      "  all_reduce calls so far: after micro-batch 1: %lld, after 2: %lld, after 3: %lld.\n"
      "  Each micro-batch's mean loss is scaled by 1/3, so the one all-reduce averages the gradient of\n"
      "  the mean loss over all 3 x 8 rows (tests/parallel/data_parallel/test_data_parallel.cpp checks it against serial).\n",
      static_cast<long long>(calls_after[0]), static_cast<long long>(calls_after[1]),
      static_cast<long long>(calls_after[2]));
  check(calls_after == std::vector<int64_t>{0, 0, 1}, "no_sync: no communication until the synced micro-batch");

  // ---------------------------------------------------------------------------------------------
  section("6. parallel == serial: 5 AdamW steps with clipping, every rank against the serial run");
  const int steps = 5;
  Trace serial;
  {
    nn::GPT model(kSmall, /*seed=*/0);
    nn::AdamW optimizer(model.parameters(), adamw());
    for (int s = 0; s < steps; ++s) {
      optimizer.zero_grad();
      nn::Batch batch = small_tokens.get_batch(s, kBatch, T);
      Tensor loss = model.loss(batch.inputs, batch.targets);
      loss.backward();
      serial.losses.push_back(loss.item());
      serial.grads.push_back(flat_values(model.parameters(), true));
      nn::clip_grad_norm(model.parameters(), 1.0);
      optimizer.step();
      serial.params.push_back(flat_values(model.parameters(), false));
    }
  }
  struct Layout {
    const char* name;
    int world;
    int64_t bucket_bytes;  // 0: naive DP
  };
  for (const Layout& l :
       {Layout{"naive DP, 4 ranks", 4, 0}, Layout{"DDP, 2 ranks, one bucket", 2, DDPOptions{}.bucket_bytes},
        Layout{"DDP, 4 ranks, a bucket per parameter", 4, DDPOptions::kBucketPerParameter}}) {
    std::vector<Trace> traces(l.world);
    launch(l.world, [&](RankContext& ctx) {
      nn::GPT model(kSmall, /*seed=*/ctx.rank == 0 ? 0 : 100 + ctx.rank);  // rank 0's weights win
      std::vector<Tensor> params = model.parameters();
      Trace& trace = traces[ctx.rank];
      RowRange rows = data_parallel_rows(kBatch, ctx.rank, ctx.world_size);
      if (l.bucket_bytes == 0) {
        NaiveDataParallel dp(model, ctx.world, kBatch, T);
        nn::AdamW optimizer(params, adamw());  // used on rank 0 only
        for (int s = 0; s < steps; ++s) {
          optimizer.zero_grad();
          trace.losses.push_back(
              dp.forward_backward(ctx.rank == 0 ? small_tokens.get_batch(s, kBatch, T) : nn::Batch{}));
          if (ctx.rank != 0) continue;
          trace.grads.push_back(flat_values(params, true));
          nn::clip_grad_norm(params, 1.0);
          optimizer.step();
          trace.params.push_back(flat_values(params, false));
        }
        return;
      }
      DistributedDataParallel ddp(model, ctx.world, DDPOptions{l.bucket_bytes});
      nn::AdamW optimizer(params, adamw());
      for (int s = 0; s < steps; ++s) {
        ddp.zero_grad();
        nn::Batch batch = small_tokens.get_batch(s, kBatch, T, rows.begin, rows.end);
        Tensor loss = model.loss(batch.inputs, batch.targets);
        loss.backward();
        Tensor global = loss.detach().clone();
        ctx.world->all_reduce(global, ReduceOp::avg);  // the mean over all rows, for the log
        trace.losses.push_back(global.item());
        trace.grads.push_back(flat_values(params, true));
        nn::clip_grad_norm(params, 1.0);
        ddp.step(optimizer);
        trace.params.push_back(flat_values(params, false));
      }
    });
    double loss_diff = 0, grad_diff = 0, param_diff = 0;
    bool within = true;
    for (const Trace& t : traces) {
      for (int s = 0; s < steps; ++s) {
        loss_diff = std::max(loss_diff, std::abs(t.losses[s] - serial.losses[s]));
        within = within && loss_diff <= 1e-5 + 1.3e-6 * std::abs(serial.losses[s]);
        if (t.grads.empty()) continue;  // naive DP: only rank 0 has gradients and an optimizer
        auto [g, g_ok] = compare(t.grads[s], serial.grads[s]);
        auto [p, p_ok] = compare(t.params[s], serial.params[s]);
        grad_diff = std::max(grad_diff, g), param_diff = std::max(param_diff, p);
        within = within && g_ok && p_ok;
      }
    }
    std::printf("  %-38s max |diff|: loss %.1e  gradients %.1e  weights %.1e\n", l.name, loss_diff, grad_diff,
                param_diff);
    check(within, std::string(l.name) + ": every rank within rtol 1.3e-6, atol 1e-5");
  }
  std::printf("\nparallel == serial: %s\nlesson 06: %s\n", ok ? "OK" : "FAILED", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
