// exercises/18_online_softmax_merge/grader.cpp — grades attend_block and merge_blocks (student.cpp).
//
// The reference is a serial softmax attention (serial_attention.h: f64 loops, max trick) over ALL the keys;
// the student's blocks are random splits of those keys. With -DSL_SOLUTION the library's
// attention_block_forward (parallel/context_parallel/attention_block.h) and merge_attention (tensor/attention.h) stand in.
#include "exercises/grader.h"
#include "exercises/grader_values.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "exercises/18_online_softmax_merge/serial_attention.h"
#include "parallel/context_parallel/attention_block.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;
using exercises::all_close;
using exercises::expect;
using namespace exercise18::serial;

namespace exercise18 {
double predicted_weight_of_a();
BlockOutput attend_block(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<int64_t>& pos_q,
                         const std::vector<int64_t>& pos_k, bool causal);
BlockOutput merge_blocks(const BlockOutput& a, const BlockOutput& b);
}  // namespace exercise18

#ifdef SL_SOLUTION
namespace solution {
// Equal scores: softmax weights 1/(visible keys). Keys 0-5 are visible, 4 of them in A: w = 4/6.
double predicted_weight_of_a() { return 4.0 / 6; }
// The library's blocks know three masks (none, causal on a square diagonal, skip). For a causal mask
// by positions with pos_k ascending, query row i sees a prefix of the keys: one library block per row.
BlockOutput attend_block(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<int64_t>& pos_q,
                         const std::vector<int64_t>& pos_k, bool causal) {
  if (!causal) return attention_block_forward(q, k, v, BlockMask::none, 0);
  for (size_t j = 1; j < pos_k.size(); ++j) SL_CHECK(pos_k[j - 1] < pos_k[j], "solution: pos_k must ascend");
  std::vector<Tensor> outs, lses;
  for (int64_t i = 0; i < q.size(2); ++i) {
    int64_t visible = 0;
    while (visible < k.size(2) && pos_k[visible] <= pos_q[i]) ++visible;
    const Tensor qi = q.narrow(2, i, 1);
    BlockOutput row = visible == 0 ? attention_block_forward(qi, k, v, BlockMask::skip, 0)
                                   : attention_block_forward(qi, k.narrow(2, 0, visible), v.narrow(2, 0, visible),
                                                             BlockMask::none, 0);
    outs.push_back(row.out);
    lses.push_back(row.lse);
  }
  return {cat(outs, 2), cat(lses, 2)};
}
// merge_attention merges in place: into a copy of a (a and b are left alone).
BlockOutput merge_blocks(const BlockOutput& a, const BlockOutput& b) {
  BlockOutput merged{a.out.clone(), a.lse.clone()};
  merge_attention(merged.out, merged.lse, b.out, b.lse);
  return merged;
}
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise18;
#endif

// A block with NaN anywhere; a block with inf (only +inf: positive_only).
static bool any_nan(const std::vector<double>& a) {
  for (double x : a)
    if (std::isnan(x)) return true;
  return false;
}
static bool any_inf(const std::vector<double>& a, bool positive_only) {
  for (double x : a)
    if (std::isinf(x) && (!positive_only || x > 0)) return true;
  return false;
}

// ---- inputs: B 2, NH 2, HS 4; self-attention positions 0..T-1 ---------------------------------------
struct Problem {
  Tensor q, k, v;
  std::vector<int64_t> pos;  // 0..T-1, for queries and keys alike
};
static Problem problem(int64_t T, uint64_t seed, double logit_scale = 1) {
  Generator g(seed);
  Problem p{mul(randn({2, 2, T, 4}, DType::f64, &g), logit_scale),
            randn({2, 2, T, 4}, DType::f64, &g),
            randn({2, 2, T, 4}, DType::f64, &g),
            {}};
  for (int64_t t = 0; t < T; ++t) p.pos.push_back(t);
  return p;
}

// A random split of the keys into two non-empty ascending sets: (k, v, positions) of each side.
struct KeyBlock {
  Tensor k, v;
  std::vector<int64_t> pos;
};
static std::pair<KeyBlock, KeyBlock> random_split(const Problem& p, uint64_t seed) {
  const int64_t T = p.k.size(2);
  Generator g(seed);
  std::vector<double> coins = rand({T}, DType::f64, &g).to_vector();
  coins[0] = 0, coins[T - 1] = 1;  // both sides non-empty
  std::vector<Tensor> parts[2][2];
  KeyBlock side[2];
  for (int64_t j = 0; j < T; ++j) {
    const int s = coins[j] < 0.5 ? 0 : 1;
    parts[s][0].push_back(p.k.narrow(2, j, 1));
    parts[s][1].push_back(p.v.narrow(2, j, 1));
    side[s].pos.push_back(p.pos[j]);
  }
  for (int s = 0; s < 2; ++s) side[s].k = cat(parts[s][0], 2), side[s].v = cat(parts[s][1], 2);
  return {side[0], side[1]};
}

// ---- diagnostics: what a wrong block or merge looks like ----------------------------------------------
static std::string diagnose_block(const BlockOutput& got, const Problem& p, const std::vector<int64_t>& pos_q,
                                  const std::vector<int64_t>& pos_k, const Tensor& q, bool causal) {
  const std::vector<double> out = got.out.to_vector(), lse = got.lse.to_vector();
  const Reference want = reference(q, p.k, p.v, pos_q, pos_k, causal);
  if (any_nan(out) || any_nan(lse))
    return "nan in out or lse: a row with no visible key must give out 0 and lse -inf (its sum is empty: "
           "do not divide by it, and do not compute -inf - -inf)";
  if (!all_close(lse, want.lse, 1e-9, 1e-9)) {
    if (all_close(lse, reference(q, p.k, p.v, pos_q, pos_k, causal, false, 1.0).lse, 1e-9, 1e-9))
      return "lse is the one of unscaled scores: multiply q·k by scale = 1/sqrt(HS)";
    if (causal && all_close(lse, reference(q, p.k, p.v, pos_q, pos_k, false).lse, 1e-9, 1e-9))
      return "lse ignores the mask: leave out key j when pos_k[j] > pos_q[i]";
    if (causal && all_close(lse, reference(q, p.k, p.v, pos_q, pos_k, true, true).lse, 1e-9, 1e-9))
      return "the mask leaves out the query's own position: a key is visible when pos_k <= pos_q (not <)";
    std::vector<double> without_max(lse.size());
    for (size_t r = 0; r < lse.size(); ++r) without_max[r] = want.lse[r] - want.max[r];
    if (all_close(lse, without_max, 1e-9, 1e-9))
      return "lse is log Σ exp(s - m) without the max: add it back, lse = m + log Σ exp(s - m)";
    return "lse differs from log Σ_j exp(scale · q_i·k_j) over the visible keys (first value " +
           std::to_string(lse[0]) + ", expected " + std::to_string(want.lse[0]) + ")";
  }
  return "lse is right but out differs from Σ_j softmax_j · v_j (first value " + std::to_string(out[0]) +
         ", expected " + std::to_string(want.out[0]) + "): divide by the row's sum, weight v_j by exp(s - lse)";
}

// Checks a merged result against attention over all keys; the message names the likely mistake.
static void expect_merged(const BlockOutput& merged, const BlockOutput& a, const BlockOutput& b, const Reference& want,
                          const std::string& what) {
  const std::vector<double> out = merged.out.to_vector(), lse = merged.lse.to_vector();
  const std::vector<double> la = a.lse.to_vector(), lb = b.lse.to_vector();
  expect(!any_nan(out) && !any_nan(lse),
         what +
             ": nan in the merge. If a block has lse = -inf in some row (it saw no key), lse_a - max is "
             "-inf - -inf = nan: when one side is -inf, the merge is the other side");
  expect(!any_inf(lse, true) && !any_inf(out, false),
         what +
             ": inf in the merge: log(exp(lse_a) + exp(lse_b)) overflows once lse > 709. Subtract the max: "
             "m + log(exp(lse_a - m) + exp(lse_b - m))");
  if (!all_close(lse, want.lse, 1e-9, 1e-9)) {
    std::vector<double> summed(la.size()), maxed(la.size());
    for (size_t r = 0; r < la.size(); ++r) summed[r] = la[r] + lb[r], maxed[r] = std::max(la[r], lb[r]);
    if (all_close(lse, summed, 1e-9, 1e-9))
      expect(false, what + ": lse = lse_a + lse_b: log-sum-exps add as log(e^lse_a + e^lse_b)");
    if (all_close(lse, maxed, 1e-9, 1e-9))
      expect(false, what + ": lse = max(lse_a, lse_b): add log(e^(lse_a-m) + e^(lse_b-m)) to the max");
    expect(false, what + ": the merged lse is not the lse over all keys (first value " + std::to_string(lse[0]) +
                      ", expected " + std::to_string(want.lse[0]) + ")");
  }
  if (!all_close(out, want.out, 1e-9, 1e-9)) {
    const std::vector<double> oa = a.out.to_vector(), ob = b.out.to_vector();
    std::vector<double> half(oa.size());
    for (size_t i = 0; i < oa.size(); ++i) half[i] = 0.5 * (oa[i] + ob[i]);
    if (all_close(out, half, 1e-9, 1e-9))
      expect(false, what + ": out is the plain average of the blocks: weight each by e^(lse_block - lse)");
    expect(false, what +
                      ": lse is right but out is not the attention over all keys: out = e^(lse_a - lse)·out_a + "
                      "e^(lse_b - lse)·out_b (did you swap the weights, or use the old lse?)");
  }
}

// A block's (out, lse) from the reference, so the merge checks do not depend on attend_block.
static BlockOutput block_of(const Tensor& q, const KeyBlock& keys, const std::vector<int64_t>& pos_q, bool causal) {
  const Reference r = reference(q, keys.k, keys.v, pos_q, keys.pos, causal);
  return {from_vector(r.out, q.shape(), DType::f64),
          from_vector(r.lse, Shape({q.size(0), q.size(1), q.size(2)}), DType::f64)};
}

// Splits the keys at random, computes each block and merges them (a then b, or b then a).
static void merge_random_split(uint64_t seed, bool causal, double logit_scale, bool b_first, const std::string& what) {
  const Problem p = problem(9, seed, logit_scale);
  const auto [ka, kb] = random_split(p, seed + 1000);
  const BlockOutput a = block_of(p.q, ka, p.pos, causal), b = block_of(p.q, kb, p.pos, causal);
  const Reference want = reference(p.q, p.k, p.v, p.pos, p.pos, causal);
  const BlockOutput merged = b_first ? impl::merge_blocks(b, a) : impl::merge_blocks(a, b);
  expect_merged(merged, a, b, want, what + " (seed " + std::to_string(seed) + ")");
}

static void expect_block(const Problem& p, const Tensor& q, const std::vector<int64_t>& pos_q,
                         const std::vector<int64_t>& pos_k, bool causal) {
  const BlockOutput got = impl::attend_block(q, p.k, p.v, pos_q, pos_k, causal);
  const Reference want = reference(q, p.k, p.v, pos_q, pos_k, causal);
  expect(got.out.defined() && got.lse.defined() && got.lse.numel() == static_cast<int64_t>(want.lse.size()) &&
             got.out.numel() == static_cast<int64_t>(want.out.size()),
         "attend_block must return out [B, NH, Tq, HS] and lse [B, NH, Tq]");
  if (!all_close(got.out.to_vector(), want.out, 1e-9, 1e-9) || !all_close(got.lse.to_vector(), want.lse, 1e-9, 1e-9))
    expect(false, diagnose_block(got, p, pos_q, pos_k, q, causal));
}

// The prediction's measure: the library's blocks for queries at positions 4-7 (q = 0): A = keys 0-3 unmasked,
// B = keys 4-7 with the diagonal's causal mask; merged; w = e^(lse_A - lse) of the query at position 5.
static double measured_weight_of_a() {
  const Tensor q = zeros({1, 1, 4, 4}), k = exercises::seeded_randn({1, 1, 8, 4}, 5),
               v = exercises::seeded_randn({1, 1, 8, 4}, 6);
  BlockOutput merged = attention_block_forward(q, k.narrow(2, 0, 4), v.narrow(2, 0, 4), BlockMask::none, 0);
  const double lse_a = merged.lse.to_vector()[1];
  const BlockOutput b = attention_block_forward(q, k.narrow(2, 4, 4), v.narrow(2, 4, 4), BlockMask::causal, 0);
  merge_attention(merged.out, merged.lse, b.out, b.lse);
  return std::exp(lse_a - merged.lse.to_vector()[1]);
}

int main() {
  exercises::Grader grader("18_online_softmax_merge");
  grader.predict("the merged weight w = e^(lse_A - lse) of block A (keys 0-3) for the causal query at position 5",
                 impl::predicted_weight_of_a, measured_weight_of_a, 1e-5, "(a fraction)");
  grader.check("attend_block, no mask: out and lse == serial softmax attention (B 2, NH 2, T 9, HS 4)", [] {
    const Problem p = problem(9, 1);
    expect_block(p, p.q, p.pos, p.pos, false);
  });
  grader.check("attend_block, causal by positions: key j visible iff pos_k[j] <= pos_q[i]", [] {
    const Problem p = problem(9, 2);
    std::vector<int64_t> pos_q;  // queries at 0, 2, 4, ...: each sees keys 0..2i, its own position included
    for (int64_t t : p.pos) pos_q.push_back(2 * t);
    expect_block(p, p.q, pos_q, p.pos, true);
  });
  grader.check("attend_block: a query row that sees no key gives out 0 and lse -inf, not nan", [] {
    const Problem p = problem(9, 3);
    std::vector<int64_t> pos_k;  // keys at 4..12: queries 0..3 see none of them
    for (int64_t t : p.pos) pos_k.push_back(t + 4);
    expect_block(p, p.q, p.pos, pos_k, true);
  });
  // The merge checks build their blocks with the grader's reference: they grade merge_blocks alone.
  grader.check("merge_blocks, no mask: 5 random splits of the keys == attention over all keys", [] {
    for (uint64_t seed = 10; seed < 15; ++seed) merge_random_split(seed, false, 1, false, "no mask");
  });
  grader.check("merge_blocks, causal: 5 random splits == causal attention over all keys (rows one side misses)", [] {
    for (uint64_t seed = 20; seed < 25; ++seed) merge_random_split(seed, true, 1, false, "causal");
  });
  grader.check("merge_blocks in either order: merge(b, a) == merge(a, b) == attention over all keys", [] {
    for (uint64_t seed = 30; seed < 33; ++seed) {
      merge_random_split(seed, false, 1, true, "merge(b, a), no mask");
      merge_random_split(seed, true, 1, true, "merge(b, a), causal");
    }
  });
  grader.check("logits x1e3 (lse ~ 1e3, exp overflows): the merge stays finite and exact", [] {
    for (uint64_t seed = 40; seed < 43; ++seed) {
      merge_random_split(seed, false, 1e3, false, "x1e3, no mask");
      merge_random_split(seed, true, 1e3, true, "x1e3, causal, merge(b, a)");
    }
  });
  grader.check("a fully masked block (out 0, lse -inf in every row) merged on either side changes nothing", [] {
    const Problem p = problem(9, 50);
    const BlockOutput real = block_of(p.q, KeyBlock{p.k, p.v, p.pos}, p.pos, true);
    const BlockOutput masked{zeros(p.q.shape(), DType::f64), full({2, 2, 9}, -kInf, DType::f64)};
    const Reference want = reference(p.q, p.k, p.v, p.pos, p.pos, true);
    expect_merged(impl::merge_blocks(real, masked), real, masked, want, "merge(real, masked)");
    expect_merged(impl::merge_blocks(masked, real), masked, real, want, "merge(masked, real)");
    const BlockOutput both = impl::merge_blocks(masked, masked);
    const std::vector<double> lse = both.lse.to_vector(), out = both.out.to_vector();
    expect(!any_nan(lse) && !any_nan(out),
           "merge(masked, masked): nan; two rows that saw no key merge into a row that "
           "saw no key (out 0, lse -inf): -inf - -inf is nan, test for it first");
    for (double l : lse) expect(l == -kInf, "merge(masked, masked): lse should stay -inf, got " + std::to_string(l));
  });
  grader.check("merge_blocks returns new tensors and leaves its inputs alone", [] {
    const Problem p = problem(9, 60);
    const auto [ka, kb] = random_split(p, 61);
    const BlockOutput a = block_of(p.q, ka, p.pos, false), b = block_of(p.q, kb, p.pos, false);
    const std::vector<double> a_out = a.out.to_vector(), a_lse = a.lse.to_vector(), b_out = b.out.to_vector(),
                              b_lse = b.lse.to_vector();
    impl::merge_blocks(a, b);
    expect(a.out.to_vector() == a_out && a.lse.to_vector() == a_lse && b.out.to_vector() == b_out &&
               b.lse.to_vector() == b_lse,
           "merge_blocks changed a or b in place: clone first (a ring keeps the blocks it merges)");
  });
  return grader.finish();
}
