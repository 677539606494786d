// Lesson 13 — ring attention: a sequence too long for one device, cut across cp ranks.
//
// What you will learn
//   * the online softmax: attention over keys [A | B] from attention over A and over B alone,
//     merged with two numbers per query (the log-sum-exp); why the merge is written with
//     logsigmoid (logits ×1e3 would overflow exp)
//   * ring attention written out on the page (~50 lines): each rank keeps its queries and passes
//     K/V blocks around the ring, attending to each as it passes; checked against the library
//   * the causal mask across ranks: the contiguous split leaves rank 0 idle while rank cp-1 does cp
//     blocks; zigzag (rank i holds chunks i and 2cp-1-i) gives every rank the same work
//   * error and memory against T: f32 ring vs f64 full attention, and the peak bytes per rank of
//     the ring, the all-gather variant and one serial T×T score matrix
//   * ring or Ulysses (section 5, in 13_ulysses_on_the_page.h): DeepSpeed-Ulysses' sequence -> heads
//     all-to-all written out (checked against the library); bytes per rank from the ledger against
//     the formulas (ring ~2·B·T·C whatever cp, Ulysses 4·B·T·C·(cp-1)/cp², so Ulysses moves 2/cp of
//     the ring's), peak memory and time on slow links for ring, Ulysses and the hybrid; why Ulysses
//     stops at cp = n_head and the hybrid does not
//
// Run:    make lesson N=13        Prints: the story below, then "lesson 13: OK".
// Try:    build/lessons/13_ring_attention --cp 8 --T 64 --svg /tmp/svg_13   (the ring steps drawn)
//         build/lessons/13_ring_attention --long-T 1024 --scale 1e4;  --break-zigzag (forget the swap)
//         build/lessons/13_ring_attention --break-ulysses-order   (the all-to-all's rows left in the
//         order they arrived: zigzag's pieces out of sequence order)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "parallel/comm/launch.h"
#include "parallel/context_parallel/context_parallel.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"
#include "13_ulysses_on_the_page.h"  // section 5
#include "lesson_args.h"
#include "lesson_svg.h"

using namespace sl;
using namespace sl::parallel;

static void section(const char* title) { std::printf("\n--- %s\n", title); }

// What a student may change: cp ranks, the sequence T of sections 2-3, the longest T of section 4's
// sweep (it runs T/8, T/2, T), the logit scale of section 1, and the zigzag mistake.
struct Config {
  int cp = 4;
  int64_t T = 32, long_T = 2048;
  double scale = 1e3;
  bool forget_swap = false;  // the page's zigzag gives rank r chunks r and cp+r, not r and 2cp-1-r
  bool forget_order = false;  // section 5's all-to-all leaves the rows in the order they arrived
  std::string svg_dir;
};

// A check that prints its line and remembers a failure.
struct Checker {
  bool ok = true;
  void operator()(bool condition, const std::string& what) {
    std::printf("  check: %s: %s\n", what.c_str(), condition ? "OK" : "FAILED");
    ok = ok && condition;
  }
};
static Tensor random(const Shape& shape, uint64_t seed, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(shape, DType::f32, &g), scale);
}

// ---- 1. the online softmax on paper -----------------------------------------------------------------
// One query, keys split into blocks A and B. For each block alone: lse = log Σ exp(s), out = Σ softmax·v.
// The whole row's lse' = log(e^lse_A + e^lse_B) and out' = (e^lse_A out_A + e^lse_B out_B) / e^lse'.
// Written without ever exponentiating a positive number:
//   lse' = lse_A - logsigmoid(lse_A - lse_B)      out' = out_A - sigmoid(lse_B - lse_A) (out_A - out_B)
static double logsigmoid(double x) { return std::min(x, 0.0) - std::log1p(std::exp(-std::abs(x))); }
static double sigmoid(double x) { return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x)); }

static void online_softmax_on_paper(const Config& cfg, Checker& check) {
  section("1. the online softmax: two blocks of keys, merged with their log-sum-exps");
  const std::vector<double> s = {2.0, -1.0, 0.5, 3.0, 1.0, -2.0}, v = {1, 2, 3, 4, 5, 6};  // scores, values (HS 1)
  auto attend = [&](size_t begin, size_t end, double& out, double& lse) {
    double m = -INFINITY, total = 0, weighted = 0;
    for (size_t j = begin; j < end; ++j) m = std::max(m, s[j]);
    for (size_t j = begin; j < end; ++j) total += std::exp(s[j] - m), weighted += std::exp(s[j] - m) * v[j];
    lse = m + std::log(total);
    out = weighted / total;
  };
  double out, lse, out_a, lse_a, out_b, lse_b;
  attend(0, 6, out, lse);
  attend(0, 3, out_a, lse_a);
  attend(3, 6, out_b, lse_b);
  const double merged_lse = lse_a - logsigmoid(lse_a - lse_b);
  const double merged_out = out_a - sigmoid(lse_b - lse_a) * (out_a - out_b);
  std::printf("  all 6 keys:       out %.6f  lse %.6f\n", out, lse);
  std::printf("  keys 0-2 / 3-5:   out %.6f / %.6f  lse %.6f / %.6f\n", out_a, out_b, lse_a, lse_b);
  std::printf("  merged:           out %.6f  lse %.6f\n", merged_out, merged_lse);
  check(std::abs(merged_out - out) < 1e-12 && std::abs(merged_lse - lse) < 1e-12, "merge == attention over both");

  // The library's kernel, logits ×1e3: exp(1e3·s) is inf in f32 and f64; the lse form never is.
  Tensor q = random({1, 1, 4, 8}, 1, cfg.scale), k = random({1, 1, 8, 8}, 2), v8 = random({1, 1, 8, 8}, 3);
  BlockOutput whole = attention_block_forward(q, k, v8, BlockMask::none, 0);
  BlockOutput a = attention_block_forward(q, k.narrow(2, 0, 4), v8.narrow(2, 0, 4), BlockMask::none, 0);
  BlockOutput b = attention_block_forward(q, k.narrow(2, 4, 4), v8.narrow(2, 4, 4), BlockMask::none, 0);
  merge_attention(a.out, a.lse, b.out, b.lse);
  std::printf("  logits x%g: naive exp(max score) = %g; merged lse max %.1f, |out - whole| %.2g\n", cfg.scale,
              std::exp(static_cast<float>(max(whole.lse).item())), max(a.lse).item(),
              max_abs_diff(a.out, whole.out));
  check(max_abs_diff(a.out, whole.out) < 1e-5, "large logits: merged blocks == whole, no overflow");
}

// ---- 2. ring attention on the page --------------------------------------------------------------------
// Which global positions rank r holds, in local order. Contiguous: [r·T/cp, (r+1)·T/cp). Zigzag: T
// cut into 2cp chunks of c = T/(2cp); rank r holds chunk r, then chunk 2cp-1-r: the swap pairs an
// early chunk (little causal work) with a late one (much). Forgetting it (chunk cp+r) pairs early
// with early on rank 0 and late with late on rank cp-1.
static std::vector<double> positions_on_page(int cp, int r, int64_t T, CpBalance balance, bool forget_swap) {
  std::vector<double> out;
  if (balance == CpBalance::none) {
    for (int64_t i = 0; i < T / cp; ++i) out.push_back(static_cast<double>(r * (T / cp) + i));
    return out;
  }
  const int64_t c = T / (2 * cp);
  for (int64_t chunk : {int64_t(r), int64_t(forget_swap ? cp + r : 2 * cp - 1 - r)})
    for (int64_t i = 0; i < c; ++i) out.push_back(static_cast<double>(chunk * c + i));
  return out;
}

// B = NH = 1. Each rank holds q, k, v [1, 1, Tl, HS] of its tokens, at global positions `pos`. The
// causal rule across ranks is only: key j is visible to query i iff pos_k[j] <= pos_q[i].
static Tensor ring_forward_on_page(ProcessGroup& group, const SequenceShard& shard, int64_t T, const Tensor& q,
                                   Tensor k, Tensor v, bool forget_swap) {
  const int cp = group.size(), r = group.rank(), next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  const int64_t Tl = q.size(2), HS = q.size(3);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const std::vector<double> pos_q = positions_on_page(cp, r, T, shard.balance, forget_swap);
  std::vector<float> out(Tl * HS, 0.0f), lse(Tl, -INFINITY);
  for (int step = 0; step < cp; ++step) {
    const int src = (r - step + cp) % cp;  // whose K/V we hold now
    Tensor k_next = zeros_like(k), v_next = zeros_like(v);
    std::vector<WorkPtr> works;
    if (step + 1 < cp)  // pass K/V on first, so the transfer runs while we compute
      works = group.batch_isend_irecv({{ProcessGroup::P2POp::Kind::send, k, next}, {ProcessGroup::P2POp::Kind::send, v, next},
                                       {ProcessGroup::P2POp::Kind::recv, k_next, prev}, {ProcessGroup::P2POp::Kind::recv, v_next, prev}});
    const std::vector<double> pos_k = positions_on_page(cp, src, T, shard.balance, forget_swap);
    const float *qp = q.data<float>(), *kp = k.data<float>(), *vp = v.data<float>();
    for (int64_t i = 0; i < Tl; ++i) {
      std::vector<float> s;  // this row's visible scores in the block
      std::vector<int64_t> keys;
      for (int64_t j = 0; j < Tl; ++j) {
        if (pos_k[j] > pos_q[i]) continue;  // the future: masked (a whole skipped block never gets here)
        float dot = 0;
        for (int64_t d = 0; d < HS; ++d) dot += qp[i * HS + d] * kp[j * HS + d];
        s.push_back(scale * dot);
        keys.push_back(j);
      }
      if (keys.empty()) continue;
      const float m = *std::max_element(s.begin(), s.end());
      float total = 0;
      for (float& x : s) total += (x = std::exp(x - m));
      const float block_lse = m + std::log(total);
      std::vector<float> block_out(HS, 0.0f);
      for (size_t n = 0; n < keys.size(); ++n)
        for (int64_t d = 0; d < HS; ++d) block_out[d] += s[n] / total * vp[keys[n] * HS + d];
      if (step == 0) {  // the first block starts the row (every query sees itself at step 0)
        lse[i] = block_lse;
        std::copy(block_out.begin(), block_out.end(), out.begin() + i * HS);
        continue;
      }
      const float w = static_cast<float>(sigmoid(block_lse - lse[i]));  // the merge, as in section 1
      for (int64_t d = 0; d < HS; ++d) out[i * HS + d] -= w * (out[i * HS + d] - block_out[d]);
      lse[i] = static_cast<float>(lse[i] - logsigmoid(lse[i] - block_lse));
    }
    for (auto& w : works) w->wait();
    if (step + 1 < cp) k = k_next, v = v_next;
  }
  std::vector<double> values(out.begin(), out.end());
  return from_vector(values, Shape({1, 1, Tl, HS}));
}

// Full causal attention, serial (the model's own core), on the current device.
static Tensor full_attention(const Tensor& q, const Tensor& k, const Tensor& v) { return causal_attention(q, k, v); }

static void ring_on_the_page(const Config& cfg, Checker& check) {
  section("2. the ring, written out: K/V travel, queries stay");
  const int cp = cfg.cp;
  const int64_t T = cfg.T, HS = 8;
  Tensor q = random({1, 1, T, HS}, 4), k = random({1, 1, T, HS}, 5), v = random({1, 1, T, HS}, 6);
  Tensor full = full_attention(q, k, v);
  for (CpBalance balance : {CpBalance::none, CpBalance::zigzag}) {
    std::vector<double> page_vs_full(cp), page_vs_library(cp);
    bool same_positions = true;
    for (int r = 0; r < cp; ++r)
      same_positions = same_positions && positions_on_page(cp, r, T, balance, cfg.forget_swap) ==
                                             SequenceShard{cp, r, balance}.positions(T).to_vector();
    launch(cp, [&](RankContext& ctx) {
      SequenceShard shard{cp, ctx.rank, balance};
      auto local = [&](const Tensor& t) { return shard.take(t, 2).to(ctx.device); };
      Tensor mine = ring_forward_on_page(*ctx.world, shard, T, local(q), local(k), local(v), cfg.forget_swap);
      page_vs_full[ctx.rank] = max_abs_diff(mine, local(full));
      page_vs_library[ctx.rank] = max_abs_diff(mine, ring_attention(local(q), local(k), local(v), shard, ctx.world));
    });
    const double e_full = *std::max_element(page_vs_full.begin(), page_vs_full.end());
    const double e_lib = *std::max_element(page_vs_library.begin(), page_vs_library.end());
    std::printf("  %-7s cp %d, T %lld: page vs full attention %.2g, page vs library ring_attention %.2g\n",
                cp_balance_name(balance), cp, static_cast<long long>(T), e_full, e_lib);
    if (cfg.forget_swap && balance == CpBalance::zigzag)
      std::printf("  --break-zigzag: the page masks rank %d's keys as if it held chunks %d and %d; the data holds %d and %d\n",
                  0, 0, cp, 0, 2 * cp - 1);
    check(same_positions, std::string("positions by hand == SequenceShard::positions (") + cp_balance_name(balance) + ")");
    check(e_full < 1e-5 && e_lib < 1e-5, "ring on the page == full attention == the library");
  }
}

// ---- 3. the ring step by step, with the causal mask --------------------------------------------------
// What rank r computes at a step: the K/V block it holds (from src) and which part of it the mask keeps.
static std::string block_kind(const SequenceShard& shard, int src, int64_t Tl) {
  const std::vector<StepWork> blocks = shard.work(src, Tl);
  if (blocks.empty()) return "skip";
  if (blocks.size() > 1) return "3/4 causal";  // the zigzag diagonal, in quarters
  if (blocks[0].mask == BlockMask::causal) return "causal";
  return blocks[0].q_len < Tl ? "Q-half" : blocks[0].kv_len < Tl ? "KV-half" : "full";
}

// One ring per step: rank r's box says which K/V block it holds, coloured by what the mask keeps.
static void draw_ring_steps(const Config& cfg, CpBalance balance, int64_t Tl) {
  const int cp = cfg.cp;
  const double panel = 250, radius = 80;
  lesson::Canvas canvas(panel * cp + 20, panel + 60);
  canvas.text(10, 18, std::string("ring attention, ") + cp_balance_name(balance) + ", cp " + std::to_string(cp) +
                          ": K/V move to the next rank each step (grey skip, orange causal, blue full, teal half)", 12);
  for (int step = 0; step < cp; ++step) {
    const double cx = 10 + panel * step + panel / 2, cy = 40 + panel / 2;
    canvas.text(cx, 44, "step " + std::to_string(step), 12, "middle");
    auto at = [&](int r, double scale) {
      const double angle = 2 * M_PI * r / cp - M_PI / 2;
      return std::pair{cx + scale * radius * std::cos(angle), cy + scale * radius * std::sin(angle)};
    };
    for (int r = 0; r < cp; ++r) {  // the ring's links, drawn under the boxes
      auto [x1, y1] = at(r, 0.62);
      auto [x2, y2] = at((r + 1) % cp, 0.62);
      canvas.arrow(x1, y1, x2, y2, "#999");
    }
    for (int r = 0; r < cp; ++r) {
      const int src = (r - step + cp) % cp;
      const std::string kind = block_kind(SequenceShard{cp, r, balance}, src, Tl);
      const std::string fill = kind == "skip" ? "#dddddd" : kind == "full" ? "#4c78a8" : kind.find("half") != std::string::npos ? "#72b7b2" : "#f58518";
      auto [x, y] = at(r, 1.0);
      canvas.box(x - 36, y - 14, 72, 28, fill, "r" + std::to_string(r) + ": K" + std::to_string(src));
    }
  }
  lesson::write_picture(cfg.svg_dir, std::string("ring_steps_") + cp_balance_name(balance) + ".svg", canvas.str());
}

// The causal work each rank does, counted from the positions on the page: query i sees pos_q[i] + 1 keys.
static std::vector<int64_t> causal_pairs(const Config& cfg, CpBalance balance) {
  std::vector<int64_t> pairs(cfg.cp, 0);
  for (int r = 0; r < cfg.cp; ++r)
    for (double pos : positions_on_page(cfg.cp, r, cfg.T, balance, cfg.forget_swap)) pairs[r] += static_cast<int64_t>(pos) + 1;
  return pairs;
}

static void draw_the_ring(const Config& cfg, Checker& check) {
  const int cp = cfg.cp;
  const int64_t Tl = cfg.T / cp;
  std::printf("\n--- 3. who holds what, and what it computes (cp %d; Q_r against the K/V block held)\n", cp);
  for (CpBalance balance : {CpBalance::none, CpBalance::zigzag}) {
    std::printf("  %s:  %s\n", cp_balance_name(balance),
                balance == CpBalance::zigzag ? ("rank i holds chunks i and " + std::to_string(2 * cp - 1) + "-i of " + std::to_string(2 * cp)).c_str()
                                             : ("rank r holds [r·T/" + std::to_string(cp) + ", (r+1)·T/" + std::to_string(cp) + ")").c_str());
    std::printf("       ");
    for (int s = 0; s < cp; ++s) std::printf("  step %-9d", s);
    std::printf("work (score entries)  causal pairs (page)\n");
    const std::vector<int64_t> pairs = causal_pairs(cfg, balance);
    int64_t most = 0, least = INT64_MAX;
    for (int r = 0; r < cp; ++r) {
      SequenceShard shard{cp, r, balance};
      int64_t work = 0;
      std::printf("  rank %d", r);
      for (int s = 0; s < cp; ++s) {
        const int src = (r - s + cp) % cp;
        std::printf("  %-13s", ("K" + std::to_string(src) + " " + block_kind(shard, src, Tl)).c_str());
        for (const StepWork& w : shard.work(src, Tl)) work += w.q_len * w.kv_len;
      }
      std::printf("  %-20lld  %lld\n", static_cast<long long>(work), static_cast<long long>(pairs[r]));
      most = std::max(most, work), least = std::min(least, work);
    }
    std::printf("  max/min work = %.3g\n", static_cast<double>(most) / std::max<int64_t>(least, 1));
    if (balance == CpBalance::zigzag) {
      const bool even = *std::max_element(pairs.begin(), pairs.end()) == *std::min_element(pairs.begin(), pairs.end());
      check(most == least, "zigzag (library): every rank computes the same score entries");
      check(even, "zigzag on the page: every rank sees the same number of causal (query, key) pairs");
    }
    if (!cfg.svg_dir.empty()) draw_ring_steps(cfg, balance, Tl);
  }
  std::printf("  contiguous: rank cp-1 computes cp blocks while rank 0 computes 1, then waits\n");
  std::printf("  zigzag: every rank 3 quarter blocks (its own chunks, causal) + cp-1 half blocks: max/min = 1\n");
}

// ---- 4. error and memory against T -----------------------------------------------------------------
static void error_and_memory(const Config& cfg, Checker& check) {
  std::printf("\n--- 4. error (f32 ring vs f64 full) and peak bytes per rank, cp %d zigzag, B 1, NH 2, HS 16\n", cfg.cp);
  const int cp = cfg.cp;
  lesson::BarChart chart("peak bytes per rank, cp " + std::to_string(cp) + " zigzag (red: one TxT score matrix)", "MiB");
  std::printf("  T      ring out err  ring dQ/dK/dV err  ring peak/rank  all-gather peak/rank  one TxT matrix\n");
  for (int64_t T : {cfg.long_T / 8, cfg.long_T / 2, cfg.long_T}) {
    Tensor q = random({1, 2, T, 16}, 7), k = random({1, 2, T, 16}, 8), v = random({1, 2, T, 16}, 9),
           dout = random({1, 2, T, 16}, 10);
    Tensor q64 = q.to(DType::f64).set_requires_grad(), k64 = k.to(DType::f64).set_requires_grad(),
           v64 = v.to(DType::f64).set_requires_grad();
    Tensor full = full_attention(q64, k64, v64);
    full.backward(dout.to(DType::f64));
    double out_err = 0, grad_err = 0;
    int64_t peaks[2] = {0, 0};
    for (CpVariant variant : {CpVariant::ring, CpVariant::allgather}) {
      std::vector<double> errs(2 * cp);
      std::vector<int64_t> peak(cp);
      launch(cp, [&](RankContext& ctx) {
        SequenceShard shard{cp, ctx.rank, CpBalance::zigzag};
        auto local = [&](const Tensor& t) { return shard.take(t, 2).to(ctx.device); };
        Tensor ql = local(q).set_requires_grad(), kl = local(k).set_requires_grad(), vl = local(v).set_requires_grad();
        Tensor dl = local(dout);
        MemoryLedger& ledger = MemoryLedger::instance();
        ctx.world->barrier();
        ledger.reset_peak(ctx.device);
        const int64_t before = ledger.current(ctx.device);
        Tensor out = context_parallel_core(shard, CpGroups{ctx.world, nullptr, nullptr}, variant)(ql, kl, vl);
        out.backward(dl);
        peak[ctx.rank] = ledger.peak(ctx.device) - before;
        errs[2 * ctx.rank] = max_abs_diff(out, local(full));
        errs[2 * ctx.rank + 1] = std::max({max_abs_diff(ql.grad(), local(q64.grad())),
                                           max_abs_diff(kl.grad(), local(k64.grad())),
                                           max_abs_diff(vl.grad(), local(v64.grad()))});
      });
      peaks[variant == CpVariant::ring ? 0 : 1] = *std::max_element(peak.begin(), peak.end());
      if (variant == CpVariant::ring)
        for (int r = 0; r < cp; ++r) out_err = std::max(out_err, errs[2 * r]), grad_err = std::max(grad_err, errs[2 * r + 1]);
    }
    const double txt = 2.0 * T * T * 4;
    std::printf("  %-5lld  %-12.2g  %-17.2g  %7.2f MiB     %7.2f MiB           %7.2f MiB\n", static_cast<long long>(T),
                out_err, grad_err, peaks[0] / 1048576.0, peaks[1] / 1048576.0, txt / 1048576.0);
    chart.bar("T " + std::to_string(T) + " ring", peaks[0] / 1048576.0, txt / 1048576.0);
    chart.bar("T " + std::to_string(T) + " all-gather", peaks[1] / 1048576.0, txt / 1048576.0, "#f58518");
    check(out_err < 2e-6 && grad_err < 5e-6 && peaks[0] < txt, "ring matches f64 full attention; peak < one TxT");
  }
  lesson::write_picture(cfg.svg_dir, "cp_memory.svg", chart.svg());
  std::printf("  The ring's peak grows as (T/cp)^2: one score block is 1/cp² of the TxT matrix, and a\n"
              "  block's backward holds two (P and dS). The all-gather variant also holds all T keys and values.\n"
              "  Errors are f32 rounding, the size of the serial f32 path's (tests/parallel/context_parallel/test_context_parallel.cpp prints both).\n");
}

int main(int argc, char** argv) {
  lesson::Args args(argc, argv, "13_ring_attention", "ring attention: a sequence cut across cp ranks");
  Config cfg;
  cfg.cp = static_cast<int>(args.integer("cp", 4, "context-parallel ranks", 2, 8));
  cfg.T = args.integer("T", 32, "the sequence of sections 2 and 3 (a multiple of 4·cp: zigzag cuts 2cp chunks, 3 halves them)", 8, 512);
  cfg.long_T = args.integer("long-T", 2048, "the longest T of section 4, which runs T/8, T/2, T (a multiple of 16·cp; from 1024, as"
                            " at small T the K/V and gradients, linear in T, outweigh one T×T matrix)", 1024, 2048);
  cfg.scale = args.real("scale", 1e3, "the logit scale of section 1's overflow test", 1, 1e6);
  cfg.forget_swap = args.breaks("zigzag", "the page's zigzag forgets the swap: rank r takes chunks r and cp+r, not 2cp-1-r");
  cfg.forget_order = args.breaks("ulysses-order", "section 5's sequence -> heads all-to-all stacks the received rows in "
                                 "the order they came (rank by rank), not at their tokens' positions");
  cfg.svg_dir = args.svg();
  args.done();
  if (cfg.T % (4 * cfg.cp) != 0 || cfg.long_T % (16 * cfg.cp) != 0) {
    std::fprintf(stderr, "13_ring_attention: --T must be a multiple of 4·cp = %d and --long-T of 16·cp = %d\n", 4 * cfg.cp,
                 16 * cfg.cp);
    return 2;
  }
  std::printf("Lesson 13: ring attention\n");
  std::printf("with cp = %d, T = %lld, long T = %lld, logits x%g%s%s\n", cfg.cp, (long long)cfg.T, (long long)cfg.long_T,
              cfg.scale, cfg.forget_swap ? ", BROKEN: zigzag without the swap" : "",
              cfg.forget_order ? ", BROKEN: Ulysses' rows out of order" : "");
  Checker check;
  online_softmax_on_paper(cfg, check);
  ring_on_the_page(cfg, check);
  draw_the_ring(cfg, check);
  error_and_memory(cfg, check);
  lesson13_ulysses::ring_or_ulysses(cfg.cp, cfg.T, cfg.forget_order, cfg.svg_dir,
                                    [&](bool ok, const std::string& what) { check(ok, what); });
  std::printf("\nlesson 13: %s\n", check.ok ? "OK" : "FAILED");
  return check.ok ? 0 : 1;
}
