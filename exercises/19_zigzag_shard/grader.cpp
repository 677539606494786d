// exercises/19_zigzag_shard/grader.cpp — grades the zigzag shard and its causal pair table (student.cpp).
//
// References: the library's SequenceShard (parallel/context_parallel/sequence_shard.h): positions()
// (whose inverse zigzag_owner is), take() along any dim and work(), the per-step blocks ring attention
// computes; the library's ring_attention on thread ranks, whose dQ, dK, dV the student's unshard gathers
// and the serial sl::causal_attention's gradients check; and counts of visible (q, k) token pairs made
// here from positions. With -DSL_SOLUTION the library's SequenceShard stands in.
#include "exercises/grader.h"

#include <array>
#include <tuple>
#include <cstdint>
#include <string>
#include <vector>

#include "exercises/grader_ranks.h"
#include "parallel/comm/launch.h"
#include "parallel/context_parallel/ring_attention.h"
#include "parallel/context_parallel/sequence_shard.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;
using exercises::expect;

namespace exercise19 {
double predicted_rank0_pairs();
enum class PairWork { none, diagonal, all };  // the same as student.cpp's
using PairTable = std::array<std::array<PairWork, 2>, 2>;
struct Owner {  // the same as student.cpp's
  int rank = 0;
  int64_t local = 0;
};
Owner zigzag_owner(int64_t T, int cp, int64_t position);
Tensor shard(const Tensor& x, int dim, int cp, int rank);
Tensor unshard(const std::vector<Tensor>& shards, int dim);
PairTable causal_pairs(int cp, int q_rank, int kv_rank);
}  // namespace exercise19
using exercise19::Owner;
using exercise19::PairTable;
using exercise19::PairWork;

// The library's work of rank q_rank against the K/V of kv_rank, as a table of chunk pairs: a block
// with mask none covers its pairs whole, causal on the diagonal, a pair no block covers is skipped.
static PairTable library_pairs(int cp, int q_rank, int kv_rank) {
  const int64_t chunk = 1, Tl = 2 * chunk;  // local length 2: chunk a is local row a
  PairTable table{{{PairWork::none, PairWork::none}, {PairWork::none, PairWork::none}}};
  for (const StepWork& w : SequenceShard{cp, q_rank, CpBalance::zigzag}.work(kv_rank, Tl))
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 2; ++b)
        if (w.q_begin <= a && a < w.q_begin + w.q_len && w.kv_begin <= b && b < w.kv_begin + w.kv_len)
          table[a][b] = w.mask == BlockMask::causal ? PairWork::diagonal : PairWork::all;
  return table;
}

// The library's positions of rank `rank`, in local order (throws sl::Error unless T % (2·cp) == 0).
static std::vector<int64_t> library_positions(int64_t T, int cp, int rank) {
  std::vector<int64_t> positions;
  for (double p : SequenceShard{cp, rank, CpBalance::zigzag}.positions(T).to_vector()) positions.push_back(int64_t(p));
  return positions;
}

#ifdef SL_SOLUTION
namespace solution {
// Zigzag gives every rank the same share of the T(T+1)/2 visible pairs: 64·65/2 / 4 (contiguous: 136).
double predicted_rank0_pairs() { return 64.0 * 65 / 2 / 4; }
// The inverse of the library's positions: the rank whose positions hold `position`, and where.
Owner zigzag_owner(int64_t T, int cp, int64_t position) {
  SL_CHECK(position >= 0 && position < T, "position ", position, " is not in [0, ", T, ")");
  for (int r = 0; r < cp; ++r) {
    const std::vector<int64_t> positions = library_positions(T, cp, r);  // checks T % (2·cp)
    for (size_t i = 0; i < positions.size(); ++i)
      if (positions[i] == position) return {r, static_cast<int64_t>(i)};
  }
  SL_CHECK(false, "no rank holds position ", position);
  return {};
}
Tensor shard(const Tensor& x, int dim, int cp, int rank) { return SequenceShard{cp, rank, CpBalance::zigzag}.take(x, dim); }
// The library has no unshard (every rank keeps its own tokens): the inverse of its positions, token by token.
Tensor unshard(const std::vector<Tensor>& shards, int dim) {
  const int cp = static_cast<int>(shards.size());
  const int64_t T = shards[0].size(dim) * cp;
  std::vector<Tensor> tokens(static_cast<size_t>(T));
  for (int r = 0; r < cp; ++r) {
    const std::vector<int64_t> positions = library_positions(T, cp, r);
    for (size_t i = 0; i < positions.size(); ++i) tokens[static_cast<size_t>(positions[i])] = shards[static_cast<size_t>(r)].narrow(dim, int64_t(i), 1);
  }
  return cat(tokens, dim);
}
PairTable causal_pairs(int cp, int q_rank, int kv_rank) { return library_pairs(cp, q_rank, kv_rank); }
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise19;
#endif

// The (T, cp) the checks walk: cp 1 to 6, T = 2·cp·c for chunks of c = 1, 2, 3, 5 tokens.
static std::vector<std::pair<int64_t, int>> lengths() {
  std::vector<std::pair<int64_t, int>> all;
  for (int cp = 1; cp <= 6; ++cp)
    for (int64_t c : {1, 2, 3, 5}) all.push_back({2 * cp * c, cp});
  return all;
}

static std::string where(int64_t T, int cp, int r) {
  return "T " + std::to_string(T) + ", cp " + std::to_string(cp) + ", rank " + std::to_string(r);
}

// Positions with rank r's two chunks numbered first, second (chunk size c): the shapes of mistakes.
static std::vector<int64_t> chunks(int64_t c, int64_t first, int64_t second) {
  std::vector<int64_t> p;
  for (int64_t chunk : {first, second})
    for (int64_t i = 0; i < c; ++i) p.push_back(chunk * c + i);
  return p;
}

static std::string diagnose_positions(int64_t T, int cp, int r, const std::vector<int64_t>& got) {
  const int64_t c = T / (2 * cp), last = 2 * cp - 1;
  const std::string who = where(T, cp, r);
  if (int64_t(got.size()) != T / cp)
    return who + ": " + std::to_string(got.size()) + " positions, a rank holds T / cp = " + std::to_string(T / cp);
  if (got == chunks(c, 2 * r, 2 * r + 1))
    return who + ": the contiguous split [r·T/cp, (r+1)·T/cp): rank r holds chunks r and 2·cp-1-r, not 2r and 2r+1";
  if (got == chunks(c, last - r, r))
    return who + ": chunk 2·cp-1-r comes first: local order is chunk r, then chunk 2·cp-1-r";
  if (got == chunks(c, r, last - r + 1) || got == chunks(c, r, last - r - 1))
    return who + ": the second chunk is off by one: it is 2·cp-1-r = " + std::to_string(last - r);
  if (got == chunks(c, r, r + cp)) return who + ": the second chunk is r + cp: the swap mirrors it, 2·cp-1-r";
  return who + ": positions differ from chunks " + std::to_string(r) + " and " + std::to_string(last - r) + " of " +
         std::to_string(c) + " tokens";
}

static const char* pair_name(PairWork w) {
  return w == PairWork::all ? "all" : w == PairWork::diagonal ? "diagonal" : "none";
}

// The visible (q, k) token pairs of rank r's queries against every key: #{(i, j): j <= pos_q[i]}.
static int64_t causal_token_pairs(const std::vector<int64_t>& pos_q) {
  int64_t pairs = 0;
  for (int64_t p : pos_q) pairs += p + 1;
  return pairs;
}

// The same count from a pair table: all = c·c pairs, diagonal = c(c+1)/2, none = 0.
static int64_t table_token_pairs(int cp, int r, int64_t c) {
  int64_t pairs = 0;
  for (int src = 0; src < cp; ++src) {
    const PairTable table = impl::causal_pairs(cp, r, src);
    for (const auto& row : table)
      for (PairWork w : row) pairs += w == PairWork::all ? c * c : w == PairWork::diagonal ? c * (c + 1) / 2 : 0;
  }
  return pairs;
}

// ---- the checks, one function each ------------------------------------------------------------------
// The positions a rank holds by the student's owner map: positions[r][local] = p for every p it maps there
// (-1 where nothing maps). Empty when the map leaves [0, cp) x [0, T / cp).
static std::vector<std::vector<int64_t>> positions_by_owner(int64_t T, int cp, std::string& why) {
  std::vector<std::vector<int64_t>> held(static_cast<size_t>(cp), std::vector<int64_t>(static_cast<size_t>(T / cp), -1));
  for (int64_t p = 0; p < T; ++p) {
    const Owner o = impl::zigzag_owner(T, cp, p);
    if (o.rank < 0 || o.rank >= cp || o.local < 0 || o.local >= T / cp) {
      why = "T " + std::to_string(T) + ", cp " + std::to_string(cp) + ": position " + std::to_string(p) + " maps to rank " +
            std::to_string(o.rank) + ", local " + std::to_string(o.local) + ": outside cp ranks of T / cp = " +
            std::to_string(T / cp) + " tokens";
      return {};
    }
    held[static_cast<size_t>(o.rank)][static_cast<size_t>(o.local)] = p;
  }
  return held;
}

static void check_owner() {
  for (auto [T, cp] : lengths()) {
    std::string why;
    const std::vector<std::vector<int64_t>> held = positions_by_owner(T, cp, why);
    expect(why.empty(), why);
    for (int r = 0; r < cp; ++r)
      if (held[static_cast<size_t>(r)] != library_positions(T, cp, r))
        expect(false, diagnose_positions(T, cp, r, held[static_cast<size_t>(r)]) + " (the positions your zigzag_owner sends to rank " +
                          std::to_string(r) + ")");
  }
}

static void check_rejects() {
  for (auto [T, cp, p] : std::vector<std::tuple<int64_t, int, int64_t>>{{10, 3, 0}, {6, 2, 1}, {5, 1, 0}, {12, 4, 3}, {16, 2, 16}, {16, 2, -1}}) {
    bool threw = false;
    try {
      impl::zigzag_owner(T, cp, p);
    } catch (const Error&) {
      threw = true;
    }
    const std::string asked = "zigzag_owner(T " + std::to_string(T) + ", cp " + std::to_string(cp) + ", position " + std::to_string(p) + ")";
    expect(threw, T % (2 * cp) ? asked + " returned an owner: T % (2·cp) = " + std::to_string(T % (2 * cp)) +
                                     ", so the chunks are not whole: throw sl::Error (SL_CHECK)"
                               : asked + " returned an owner: the position is not in [0, T): throw sl::Error (SL_CHECK)");
  }
}

// x [2, T, 3] with x[b, t, c] = 1000·b + 10·t + c, and the same labels as [2, 2, T, 3] with the heads
// apart (q [B, NH, T, HS], the sequence at dim 2): every value says where it came from.
static Tensor labelled(int64_t T, int dim) {
  std::vector<double> values;
  const int64_t heads = dim == 2 ? 2 : 1;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < 3; ++c) values.push_back(double(100000 * b + 10000 * h + 10 * t + c));
  return dim == 2 ? from_vector(values, Shape({2, 2, T, 3})) : from_vector(values, Shape({2, T, 3}));
}

// The positions along `dim` that a labelled tensor's tokens came from (batch 0, head 0, channel 0).
static std::vector<int64_t> tokens_of(const Tensor& labelled_part, int dim) {
  const Tensor row = dim == 2 ? labelled_part.narrow(0, 0, 1).narrow(1, 0, 1) : labelled_part.narrow(0, 0, 1);
  const std::vector<double> v = row.to_vector();
  std::vector<int64_t> tokens;
  for (size_t i = 0; i < v.size(); i += 3) tokens.push_back(int64_t(v[i]) % 10000 / 10);
  return tokens;
}

static std::string at_dim(int64_t T, int cp, int dim) {
  return std::string(dim == 2 ? "[2, 2, T, 3] along dim 2" : "[2, T, 3] along dim 1") + ", T " + std::to_string(T) + ", cp " +
         std::to_string(cp);
}

static void check_shard() {
  for (int dim : {1, 2})
    for (auto [T, cp] : lengths()) {
      const Tensor x = labelled(T, dim);
      for (int r = 0; r < cp; ++r) {
        const Tensor got = impl::shard(x, dim, cp, r), want = SequenceShard{cp, r, CpBalance::zigzag}.take(x, dim);
        expect(got.shape() == want.shape(), at_dim(T, cp, dim) + ", rank " + std::to_string(r) + ": shard's shape " +
                                                got.shape().str() + ", not " + want.shape().str() + ": T / cp along dim " +
                                                std::to_string(dim) + ", the rest whole");
        if (max_abs_diff(got, want) == 0) continue;
        expect(false, "shard along dim " + std::to_string(dim) + ": " + diagnose_positions(T, cp, r, tokens_of(got, dim)) +
                          " (the tokens in your shard)");
      }
    }
}

// Where the student's unshard went wrong, for a whole sequence x and the library's shards of it.
static void expect_unshard(const Tensor& got, const Tensor& x, const std::vector<Tensor>& shards, int dim, const std::string& what) {
  expect(got.shape() == x.shape(), what + ": unshard's shape " + got.shape().str() + ", not " + x.shape().str());
  if (max_abs_diff(got, x) == 0) return;
  if (shards.size() > 1 && max_abs_diff(got, cat(shards, dim)) == 0)
    expect(false, what + ": unshard joined the shards in rank order, as an all-gather hands them over: rank r's second "
                         "chunk belongs at chunk 2·cp-1-r, near the end");
}

static void check_unshard() {
  for (int dim : {1, 2})
    for (auto [T, cp] : lengths()) {
      const Tensor x = labelled(T, dim);
      std::vector<Tensor> shards;
      for (int r = 0; r < cp; ++r) shards.push_back(SequenceShard{cp, r, CpBalance::zigzag}.take(x, dim));
      const Tensor got = impl::unshard(shards, dim);
      expect_unshard(got, x, shards, dim, at_dim(T, cp, dim));
      const std::vector<int64_t> tokens = tokens_of(got, dim);
      for (int64_t t = 0; t < T; ++t)
        expect(tokens[static_cast<size_t>(t)] == t, at_dim(T, cp, dim) + ": position " + std::to_string(t) + " holds token " +
                                                        std::to_string(tokens[static_cast<size_t>(t)]));
    }
}

static void check_roundtrip() {
  for (int dim : {1, 2})
    for (auto [T, cp] : lengths()) {
      const Tensor x = labelled(T, dim);
      std::vector<Tensor> shards;
      for (int r = 0; r < cp; ++r) shards.push_back(impl::shard(x, dim, cp, r));
      expect(max_abs_diff(impl::unshard(shards, dim), x) == 0, at_dim(T, cp, dim) + ": unshard(shard(x)) != x");
    }
}

// The library's ring attention on cp thread ranks (f64, q, k, v [1, 2, T/cp, 8] each, the loss
// sum(out · w)): each rank's dQ, dK, dV gathered by the student's unshard must equal the serial
// causal attention's gradients over the whole sequence.
static void check_ring_gradients() {
  const int64_t T = 24;
  Generator g(19);
  const TensorOptions f64(DType::f64);
  const Tensor q = randn({1, 2, T, 8}, f64, &g), k = randn({1, 2, T, 8}, f64, &g), v = randn({1, 2, T, 8}, f64, &g),
               w = randn({1, 2, T, 8}, f64, &g);
  std::vector<Tensor> serial = {q.clone().set_requires_grad(), k.clone().set_requires_grad(), v.clone().set_requires_grad()};
  sum(mul(causal_attention(serial[0], serial[1], serial[2]), w)).backward();
  const char* names[3] = {"dQ", "dK", "dV"};
  for (int cp : {2, 3, 4}) {
    std::vector<std::vector<Tensor>> grads(3, std::vector<Tensor>(static_cast<size_t>(cp)));
    exercises::run_ranks(cp, [&](RankContext& ctx) {
      const SequenceShard mine{cp, ctx.rank, CpBalance::zigzag};
      Tensor lq = mine.take(q, 2).to(ctx.device).set_requires_grad(), lk = mine.take(k, 2).to(ctx.device).set_requires_grad(),
             lv = mine.take(v, 2).to(ctx.device).set_requires_grad();
      sum(mul(ring_attention(lq, lk, lv, mine, ctx.world), mine.take(w, 2).to(ctx.device))).backward();
      const Tensor* local[3] = {&lq, &lk, &lv};
      for (int i = 0; i < 3; ++i) grads[static_cast<size_t>(i)][static_cast<size_t>(ctx.rank)] = local[i]->grad().to(Device::cpu());
    }, "the library's ring attention timed out: ");
    for (int i = 0; i < 3; ++i) {
      const std::string what = "cp " + std::to_string(cp) + ", T " + std::to_string(T) + ", the ring's " + names[i] + " [1, 2, T/cp, 8]";
      const Tensor want = serial[static_cast<size_t>(i)].grad(), got = impl::unshard(grads[static_cast<size_t>(i)], 2);
      if (got.shape() == want.shape() && max_abs_diff(got, want) < 1e-10) continue;
      expect_unshard(got, want, grads[static_cast<size_t>(i)], 2, what);
      expect(false, what + " gathered by your unshard differs from the serial attention's by " +
                        std::to_string(max_abs_diff(got, want)) + ": put each rank's tokens back at their positions");
    }
  }
}

static void check_pairs() {
  for (int cp = 1; cp <= 6; ++cp)
    for (int q = 0; q < cp; ++q)
      for (int kv = 0; kv < cp; ++kv) {
        const PairTable got = impl::causal_pairs(cp, q, kv), want = library_pairs(cp, q, kv);
        const int q_chunk[2] = {q, 2 * cp - 1 - q}, k_chunk[2] = {kv, 2 * cp - 1 - kv};
        for (int a = 0; a < 2; ++a)
          for (int b = 0; b < 2; ++b)
            expect(got[a][b] == want[a][b],
                   "cp " + std::to_string(cp) + ", query rank " + std::to_string(q) + " against key rank " +
                       std::to_string(kv) + ": query chunk " + std::to_string(q_chunk[a]) + " vs key chunk " +
                       std::to_string(k_chunk[b]) + " is " + pair_name(want[a][b]) + ", you said " +
                       pair_name(got[a][b]) + " (key chunk < query chunk: all; equal: diagonal; later: none)");
      }
}

static void check_balance() {
  for (auto [T, cp] : lengths()) {
    const int64_t fair = T * (T + 1) / (2 * cp), c = T / (2 * cp);
    std::vector<double> contiguous = SequenceShard{cp, cp - 1, CpBalance::none}.positions(T).to_vector();
    const int64_t contiguous_last = causal_token_pairs(std::vector<int64_t>(contiguous.begin(), contiguous.end()));
    std::string why;
    const std::vector<std::vector<int64_t>> held = positions_by_owner(T, cp, why);
    expect(why.empty(), why);
    for (int r = 0; r < cp; ++r) {
      const int64_t by_positions = causal_token_pairs(held[static_cast<size_t>(r)]);
      expect(by_positions == fair, where(T, cp, r) + ": by your zigzag_owner its queries see " + std::to_string(by_positions) +
                                       " (q, k) pairs, a fair share is T(T+1)/(2·cp) = " + std::to_string(fair) +
                                       " (the contiguous split gives rank cp-1 " + std::to_string(contiguous_last) +
                                       "): pair chunk r with chunk 2·cp-1-r");
      const int64_t by_table = table_token_pairs(cp, r, c);
      expect(by_table == fair, where(T, cp, r) + ": your pair table computes " + std::to_string(by_table) +
                                   " (q, k) pairs over all key ranks, the causal rule needs " + std::to_string(fair) +
                                   ": all = c·c pairs, diagonal = c(c+1)/2, none = 0");
    }
  }
}

// The prediction's measure: the visible pairs of the blocks SequenceShard::work gives rank 0 of cp 4 at T 64.
static double measured_rank0_pairs() {
  int64_t pairs = 0;
  for (int src = 0; src < 4; ++src)
    for (const StepWork& w : SequenceShard{4, 0, CpBalance::zigzag}.work(src, 64 / 4))
      pairs += w.mask == BlockMask::causal ? w.q_len * (w.q_len + 1) / 2 : w.mask == BlockMask::none ? w.q_len * w.kv_len : 0;
  return static_cast<double>(pairs);
}

int main() {
  exercises::Grader grader("19_zigzag_shard");
  grader.predict("visible (q, k) pairs rank 0 computes at cp 4, T 64, zigzag", impl::predicted_rank0_pairs,
                 measured_rank0_pairs, 0, "pairs");
  grader.check("zigzag_owner is the inverse of the library's SequenceShard positions (cp 1..6, 4 lengths each, every position)",
               check_owner);
  grader.check("zigzag_owner throws sl::Error when T is not divisible by 2·cp or the position is outside [0, T)", check_rejects);
  grader.check("shard == the library's SequenceShard::take along dim 1 of [2, T, 3] and dim 2 of [2, 2, T, 3]", check_shard);
  grader.check("unshard(the library's shards) == x along dims 1 and 2: every token back in place", check_unshard);
  grader.check("shard then unshard is the identity (your own pair of functions)", check_roundtrip);
  grader.check("the library's ring attention at cp 2, 3, 4: dQ, dK, dV gathered by your unshard == the serial attention's",
               check_ring_gradients);
  grader.check("causal_pairs == the library's per-step work (all, diagonal, none), cp 1..6, every rank pair",
               check_pairs);
  grader.check("load balance: every rank sees T(T+1)/(2·cp) causal (q, k) pairs, by your owner map and by your pair table",
               check_balance);
  return grader.finish();
}
