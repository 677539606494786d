// exercises/19_zigzag_shard/grader.cpp — grades the zigzag shard and its causal pair table (student.cpp).
//
// References: the library's SequenceShard (parallel/context_parallel/sequence_shard.h): positions(),
// take() and work(), the per-step blocks ring attention computes; and counts of visible (q, k) token
// pairs made here from positions. With -DSL_SOLUTION the library's SequenceShard stands in.
#include "exercises/grader.h"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/context_parallel/sequence_shard.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;
using exercises::expect;

namespace exercise19 {
double predicted_rank0_pairs();
enum class PairWork { none, diagonal, all };  // the same as student.cpp's
using PairTable = std::array<std::array<PairWork, 2>, 2>;
std::vector<int64_t> zigzag_positions(int64_t T, int cp, int rank);
Tensor shard(const Tensor& x, int cp, int rank);
Tensor unshard(const std::vector<Tensor>& shards);
PairTable causal_pairs(int cp, int q_rank, int kv_rank);
}  // namespace exercise19
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

#ifdef SL_SOLUTION
namespace solution {
// Zigzag gives every rank the same share of the T(T+1)/2 visible pairs: 64·65/2 / 4 (contiguous: 136).
double predicted_rank0_pairs() { return 64.0 * 65 / 2 / 4; }
std::vector<int64_t> zigzag_positions(int64_t T, int cp, int rank) {
  std::vector<int64_t> positions;
  for (double p : SequenceShard{cp, rank, CpBalance::zigzag}.positions(T).to_vector()) positions.push_back(int64_t(p));
  return positions;
}
Tensor shard(const Tensor& x, int cp, int rank) { return SequenceShard{cp, rank, CpBalance::zigzag}.take(x, 1); }
// The library has no unshard (every rank keeps its own tokens): the inverse of its positions, token by token.
Tensor unshard(const std::vector<Tensor>& shards) {
  const int cp = static_cast<int>(shards.size());
  const int64_t T = shards[0].size(1) * cp;
  std::vector<Tensor> tokens(T);
  for (int r = 0; r < cp; ++r) {
    const std::vector<int64_t> positions = zigzag_positions(T, cp, r);
    for (size_t i = 0; i < positions.size(); ++i) tokens[positions[i]] = shards[r].narrow(1, int64_t(i), 1);
  }
  return cat(tokens, 1);
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

// x [2, T, 3] with x[b, t, c] = 1000·b + 10·t + c: every value says where it came from.
static Tensor labelled(int64_t T) {
  std::vector<double> values;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < 3; ++c) values.push_back(double(1000 * b + 10 * t + c));
  return from_vector(values, Shape({2, T, 3}));
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
static void check_positions() {
  for (auto [T, cp] : lengths())
    for (int r = 0; r < cp; ++r) {
      const std::vector<int64_t> got = impl::zigzag_positions(T, cp, r);
      const std::vector<double> want = SequenceShard{cp, r, CpBalance::zigzag}.positions(T).to_vector();
      if (got != std::vector<int64_t>(want.begin(), want.end())) expect(false, diagnose_positions(T, cp, r, got));
    }
}

static void check_rejects_lengths() {
  for (auto [T, cp] : std::vector<std::pair<int64_t, int>>{{10, 3}, {6, 2}, {5, 1}, {12, 4}}) {
    bool threw = false;
    try {
      impl::zigzag_positions(T, cp, 0);
    } catch (const Error&) {
      threw = true;
    }
    expect(threw, "T " + std::to_string(T) + ", cp " + std::to_string(cp) + " returned positions: T % (2·cp) = " +
                      std::to_string(T % (2 * cp)) + ", so the chunks are not whole: throw sl::Error (SL_CHECK)");
  }
}

static void check_shard() {
  for (auto [T, cp] : lengths()) {
    const Tensor x = labelled(T);
    for (int r = 0; r < cp; ++r) {
      const Tensor got = impl::shard(x, cp, r), want = SequenceShard{cp, r, CpBalance::zigzag}.take(x, 1);
      expect(got.shape() == want.shape(), where(T, cp, r) + ": shard's shape differs from [B, T / cp, C]");
      if (max_abs_diff(got, want) == 0) continue;
      std::vector<int64_t> tokens;  // which positions the student took, from the labels of batch 0, channel 0
      const std::vector<double> v = got.to_vector();
      for (int64_t i = 0; i < T / cp; ++i) tokens.push_back(int64_t(v[i * 3]) / 10);
      expect(false, "shard: " + diagnose_positions(T, cp, r, tokens) + " (the tokens in your shard)");
    }
  }
}

static void check_unshard() {
  for (auto [T, cp] : lengths()) {
    const Tensor x = labelled(T);
    std::vector<Tensor> shards;
    for (int r = 0; r < cp; ++r) shards.push_back(SequenceShard{cp, r, CpBalance::zigzag}.take(x, 1));
    const Tensor got = impl::unshard(shards);
    expect(got.shape() == x.shape(),
           "T " + std::to_string(T) + ", cp " + std::to_string(cp) + ": unshard's shape differs from [B, T, C]");
    if (max_abs_diff(got, x) == 0) continue;
    if (cp > 1 && max_abs_diff(got, cat(shards, 1)) == 0)
      expect(false, "T " + std::to_string(T) + ", cp " + std::to_string(cp) +
                        ": unshard joined the shards in rank "
                        "order: rank r's second chunk belongs at chunk 2·cp-1-r, near the end");
    const std::vector<double> v = got.to_vector();
    for (int64_t t = 0; t < T; ++t)
      expect(int64_t(v[t * 3]) / 10 == t, "T " + std::to_string(T) + ", cp " + std::to_string(cp) + ": position " +
                                              std::to_string(t) + " holds token " +
                                              std::to_string(int64_t(v[t * 3]) / 10));
  }
}

static void check_roundtrip() {
  for (auto [T, cp] : lengths()) {
    const Tensor x = labelled(T);
    std::vector<Tensor> shards;
    for (int r = 0; r < cp; ++r) shards.push_back(impl::shard(x, cp, r));
    expect(max_abs_diff(impl::unshard(shards), x) == 0,
           "T " + std::to_string(T) + ", cp " + std::to_string(cp) + ": unshard(shard(x)) != x");
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
    for (int r = 0; r < cp; ++r) {
      const int64_t by_positions = causal_token_pairs(impl::zigzag_positions(T, cp, r));
      expect(by_positions == fair, where(T, cp, r) + ": its queries see " + std::to_string(by_positions) +
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
  grader.check("zigzag_positions == the library's SequenceShard positions (cp 1..6, 4 lengths each, every rank)",
               check_positions);
  grader.check("zigzag_positions throws sl::Error when T is not divisible by 2·cp", check_rejects_lengths);
  grader.check("shard(x [2, T, 3]) == the library's SequenceShard::take, every (T, cp, rank)", check_shard);
  grader.check("unshard(the library's shards) == x: every token back in place, every (T, cp)", check_unshard);
  grader.check("shard then unshard is the identity (your own pair of functions)", check_roundtrip);
  grader.check("causal_pairs == the library's per-step work (all, diagonal, none), cp 1..6, every rank pair",
               check_pairs);
  grader.check("load balance: every rank sees T(T+1)/(2·cp) causal (q, k) pairs, by positions and by pair table",
               check_balance);
  return grader.finish();
}
