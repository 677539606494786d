// test_attention_merge.cpp — merge_attention where a row has seen no key on one side or both.
//
// A row that saw no key of a block has out 0 and lse -inf (a skip block, or a row the block's mask
// hides everything from). Merging such a row must give the other side exactly, and a row that saw
// no key on either side stays out 0, lse -inf: the merge formulas alone give -inf - -inf = nan
// there. Each case is checked against attention over the union of the keys, computed here in f64
// loops, independently of the library:
//   * a running (out, lse) that saw no key in any row merged with a real block, in both orders;
//   * rows of four kinds side by side (first side only, second only, both, neither), in both
//     orders, into all the rows or into rows [2, 6) of 7, logits ×1 and ×1e3;
//   * both sides empty in every row;
//   * an empty running row whose out is nan: nothing of it is read.
// On three paths: the CPU row loop (merge_attention on CPU tensors), its composition of engine ops
// (composed::merge_attention, run here on CPU tensors) and merge_attention on CUDA tensors (the
// composition on a GPU; skipped without one), in f32 and f64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "tensor/attention_composed.h"
#include "tensor/cuda_info.h"
#include "tensor/ops.h"
#include "tests/support/compare.h"
#include "tests/support/parallel.h"

namespace sl::parallel {
namespace {

using test_support::nan_max_into;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t B = 2, NH = 2, T = 7, HS = 4, Tk = 10, kSplit = 4;  // keys [0, 4) are side a, [4, 10) side b

enum class Path { loop, composed_cpu, cuda };

struct MergeCase {
  Path path;
  DType dtype;
};

const char* path_name(Path path) {
  switch (path) {
    case Path::loop:
      return "loop";
    case Path::composed_cpu:
      return "composed_cpu";
    case Path::cuda:
      return "cuda";
  }
  return "?";
}

void PrintTo(const MergeCase& c, std::ostream* os) { *os << path_name(c.path) << " " << dtype_name(c.dtype); }

std::string case_name(const testing::TestParamInfo<MergeCase>& info) {
  return std::string(path_name(info.param.path)) + "_" + dtype_name(info.param.dtype);
}

// q [B, NH, T, HS] (×logit_scale), k and v [B, NH, Tk, HS], as f64 values.
struct Problem {
  std::vector<double> q, k, v;
};

Problem problem(uint64_t seed, double logit_scale) {
  Generator g(seed);
  return {mul(randn({B, NH, T, HS}, DType::f64, &g), logit_scale).to_vector(),
          randn({B, NH, Tk, HS}, DType::f64, &g).to_vector(), randn({B, NH, Tk, HS}, DType::f64, &g).to_vector()};
}

// Which keys query row i sees: visible(i, j) for key j of [0, Tk).
using Visible = std::function<bool(int64_t i, int64_t j)>;

// Softmax attention of query rows [row0, row0 + rows) over the keys they see, in f64 loops with the
// max trick: out [B, NH, rows, HS], lse [B, NH, rows]; a row that sees no key has out 0, lse -inf.
struct Attention {
  std::vector<double> out, lse;
};

Attention attend(const Problem& p, int64_t row0, int64_t rows, const Visible& visible) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  Attention a{std::vector<double>(B * NH * rows * HS, 0.0), std::vector<double>(B * NH * rows, -kInf)};
  for (int64_t bh = 0; bh < B * NH; ++bh)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = row0 + r;
      std::vector<double> s(Tk, -kInf);
      double m = -kInf;
      for (int64_t j = 0; j < Tk; ++j) {
        if (!visible(i, j)) continue;
        s[j] = 0;
        for (int64_t d = 0; d < HS; ++d) s[j] += p.q[(bh * T + i) * HS + d] * p.k[(bh * Tk + j) * HS + d];
        s[j] *= scale;
        m = std::max(m, s[j]);
      }
      if (m == -kInf) continue;  // no key: the empty sum
      double l = 0;
      for (int64_t j = 0; j < Tk; ++j)
        if (s[j] > -kInf) l += std::exp(s[j] - m);
      double* o = &a.out[(bh * rows + r) * HS];
      for (int64_t j = 0; j < Tk; ++j)
        if (s[j] > -kInf)
          for (int64_t d = 0; d < HS; ++d) o[d] += std::exp(s[j] - m) / l * p.v[(bh * Tk + j) * HS + d];
      a.lse[bh * rows + r] = m + std::log(l);
    }
  return a;
}

// The four kinds of rows, by which side's keys a row sees (row i is of kind i % 4).
enum class Sees { a_only, b_only, both, neither };
Sees cycling(int64_t i) { return static_cast<Sees>(i % 4); }

bool sees_a(Sees s) { return s == Sees::a_only || s == Sees::both; }
bool sees_b(Sees s) { return s == Sees::b_only || s == Sees::both; }

struct Sides {
  Visible a, b, both;  // the keys of side a, of side b, of both, that row i sees
};

Sides sides(const std::function<Sees(int64_t)>& kind) {
  return {[kind](int64_t i, int64_t j) { return j < kSplit && sees_a(kind(i)); },
          [kind](int64_t i, int64_t j) { return j >= kSplit && sees_b(kind(i)); },
          [kind](int64_t i, int64_t j) { return j < kSplit ? sees_a(kind(i)) : sees_b(kind(i)); }};
}

Tensor tensor_of(const std::vector<double>& values, int64_t rows, bool with_hs, DType dtype) {
  return from_vector(values, with_hs ? Shape({B, NH, rows, HS}) : Shape({B, NH, rows}), dtype);
}

class AttentionMerge : public testing::TestWithParam<MergeCase> {
 protected:
  void SetUp() override {
    if (GetParam().path == Path::cuda) {
      SL_SKIP_UNDER_MPI("one process, one GPU");
      if (cuda_info().device_count < 1) GTEST_SKIP() << "needs a CUDA device, found none";
    }
  }

  // Merges (out_b, lse_b) into rows [row_begin, row_begin + Tb) of (out, lse), on this case's path;
  // the result comes back as f64 values.
  Attention merge(const Attention& running, const Attention& block, int64_t row_begin) const {
    const auto [path, dtype] = GetParam();
    const int64_t Tb = static_cast<int64_t>(block.lse.size()) / (B * NH);
    Tensor out = tensor_of(running.out, T, true, dtype), lse = tensor_of(running.lse, T, false, dtype);
    Tensor out_b = tensor_of(block.out, Tb, true, dtype), lse_b = tensor_of(block.lse, Tb, false, dtype);
    if (path == Path::composed_cpu) {
      composed::merge_attention(out, lse, out_b, lse_b, row_begin);
      return {out.to_vector(), lse.to_vector()};
    }
    if (path == Path::cuda) {
      const Device gpu = Device::cuda(0);
      out = out.to(gpu), lse = lse.to(gpu), out_b = out_b.to(gpu), lse_b = lse_b.to(gpu);
    }
    merge_attention(out, lse, out_b, lse_b, row_begin);
    return {out.to(Device::cpu()).to_vector(), lse.to(Device::cpu()).to_vector()};
  }

  // The merge of side `first` (running, all T rows) and side `second` (rows [row_begin, row_begin +
  // Tb)) against attention over the union: rows outside the block keep first's values bit for bit; a
  // row that saw no key on one side gets the other side's values bit for bit (in this dtype); a row
  // that saw no key at all stays out 0, lse -inf; the others are within rounding of the union.
  void expect_merged(const Problem& p, const Visible& first, const Visible& second, const Visible& both,
                     int64_t row_begin, int64_t Tb, double logit_scale) const {
    const DType dtype = GetParam().dtype;
    const Attention running = attend(p, 0, T, first), block = attend(p, row_begin, Tb, second);
    const Attention merged = merge(running, block, row_begin);
    const Attention union_rows = attend(p, 0, T, both);
    // The inputs as the merge saw them (rounded to dtype), for the rows that must come through exactly.
    const std::vector<double> out_a = tensor_of(running.out, T, true, dtype).to_vector(),
                              lse_a = tensor_of(running.lse, T, false, dtype).to_vector(),
                              out_b = tensor_of(block.out, Tb, true, dtype).to_vector(),
                              lse_b = tensor_of(block.lse, Tb, false, dtype).to_vector();
    const double tol = dtype == DType::f64 ? 1e-12 : 2e-5;
    double out_err = 0, lse_err = 0;
    int wrong_rows = 0;  // rows that should have come through exactly and did not
    std::string first_wrong;
    auto report = [&](const std::string& what) {
      if (wrong_rows++ == 0) first_wrong = what;
    };
    for (int64_t bh = 0; bh < B * NH; ++bh)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t row = bh * T + i, r = i - row_begin, row_b = bh * Tb + r;
        const bool in_block = r >= 0 && r < Tb;
        const double la = lse_a[row], lb = in_block ? lse_b[row_b] : -kInf;
        const std::string where = "bh " + std::to_string(bh) + " row " + std::to_string(i);
        const double got_lse = merged.lse[row];
        if (!in_block || lb == -kInf || la == -kInf) {
          // Exactly one side's row (the running one when both are empty: out 0, lse -inf).
          const bool take_b = in_block && la == -kInf && lb != -kInf;
          const double want_lse = take_b ? lb : la;
          if (!(got_lse == want_lse))
            report(where + ": lse " + std::to_string(got_lse) + ", expected " + std::to_string(want_lse) +
                   (take_b ? " (the block's)" : " (the running row's)"));
          for (int64_t d = 0; d < HS; ++d) {
            const double got = merged.out[row * HS + d], want = take_b ? out_b[row_b * HS + d] : out_a[row * HS + d];
            if (!(got == want))
              report(where + " d " + std::to_string(d) + ": out " + std::to_string(got) + ", expected " +
                     std::to_string(want));
          }
        }
        if (!in_block) continue;
        // Every row of the block: the union of the keys, whatever the kind of row.
        if (union_rows.lse[row] == -kInf) {
          if (!(got_lse == -kInf)) report(where + ": a row that saw no key has lse " + std::to_string(got_lse));
          continue;
        }
        nan_max_into(lse_err, std::abs(got_lse - union_rows.lse[row]) / std::max(1.0, std::abs(union_rows.lse[row])));
        for (int64_t d = 0; d < HS; ++d)
          nan_max_into(out_err, std::abs(merged.out[row * HS + d] - union_rows.out[row * HS + d]));
      }
    EXPECT_EQ(wrong_rows, 0) << "values that should have come through exactly did not; the first: " << first_wrong;
    EXPECT_LE(lse_err, tol) << "relative lse error against the union of the keys (x" << logit_scale << ")";
    EXPECT_LE(out_err, tol) << "out error against the union of the keys (x" << logit_scale << ")";
  }
};

// The running rows saw no key yet (out 0, lse -inf in every row) and the block is real: the merge is
// the block. In the other order the empty block changes nothing.
TEST_P(AttentionMerge, RunningRowsThatSawNoKeyTakeTheBlock) {
  const Problem p = problem(1, 1.0);
  const Sides s = sides([](int64_t) { return Sees::b_only; });
  {
    SCOPED_TRACE("merge(empty a, real b)");
    expect_merged(p, s.a, s.b, s.both, 0, T, 1.0);
  }
  {
    SCOPED_TRACE("merge(real b, empty a)");
    expect_merged(p, s.b, s.a, s.both, 0, T, 1.0);
  }
}

// Rows of all four kinds side by side, both orders, into every row or into rows [2, 6) of 7.
TEST_P(AttentionMerge, SomeRowsOnEitherSideSawNoKey) {
  const Sides s = sides(cycling);
  for (double logit_scale : {1.0, 1e3}) {  // ×1e3: lse ~ 1e3, where exp of it would overflow
    const Problem p = problem(2, logit_scale);
    for (auto [row_begin, Tb] : {std::pair<int64_t, int64_t>{0, T}, {2, 4}}) {
      SCOPED_TRACE(std::string(logit_scale == 1.0 ? "x1" : "x1e3") + ", block rows [" + std::to_string(row_begin) +
                   ", " + std::to_string(row_begin + Tb) + ")");
      {
        SCOPED_TRACE("merge(a, b)");
        expect_merged(p, s.a, s.b, s.both, row_begin, Tb, logit_scale);
      }
      {
        SCOPED_TRACE("merge(b, a)");
        expect_merged(p, s.b, s.a, s.both, row_begin, Tb, logit_scale);
      }
    }
  }
}

// Neither side saw a key in any row: out 0 and lse -inf stay, with no nan.
TEST_P(AttentionMerge, RowsThatSawNoKeyOnEitherSideStayEmpty) {
  const Problem p = problem(3, 1.0);
  const Sides s = sides([](int64_t) { return Sees::neither; });
  expect_merged(p, s.a, s.b, s.both, 0, T, 1.0);
  const Attention empty = attend(p, 0, T, s.a);
  const Attention merged = merge(empty, attend(p, 0, T, s.b), 0);
  for (double l : merged.lse) EXPECT_EQ(l, -kInf);
  for (double x : merged.out) EXPECT_EQ(x, 0.0);
}

// A running row with lse -inf holds no attention, whatever its out says (rows the ring has not
// reached yet are uninitialized): the block's row comes through exactly, nothing of the old out.
TEST_P(AttentionMerge, AnEmptyRunningRowsOutIsNotRead) {
  const Problem p = problem(4, 1.0);
  const Sides s = sides(cycling);
  Attention running = attend(p, 0, T, s.a);
  for (int64_t row = 0; row < B * NH * T; ++row)
    if (running.lse[row] == -kInf)
      for (int64_t d = 0; d < HS; ++d) running.out[row * HS + d] = std::nan("");
  const Attention block = attend(p, 0, T, s.b), merged = merge(running, block, 0);
  const std::vector<double> out_b = tensor_of(block.out, T, true, GetParam().dtype).to_vector();
  int taken = 0;
  for (int64_t row = 0; row < B * NH * T; ++row) {
    if (running.lse[row] != -kInf || block.lse[row] == -kInf) continue;  // (neither side: the row stays)
    ++taken;
    for (int64_t d = 0; d < HS; ++d)
      ASSERT_TRUE(merged.out[row * HS + d] == out_b[row * HS + d])
          << "row " << row << " d " << d << ": out " << merged.out[row * HS + d] << ", expected the block's "
          << out_b[row * HS + d];
  }
  EXPECT_EQ(taken, B * NH * 2);  // rows 1 and 5 of 7 are b-only
}

INSTANTIATE_TEST_SUITE_P(Paths, AttentionMerge,
                         testing::Values(MergeCase{Path::loop, DType::f32}, MergeCase{Path::loop, DType::f64},
                                         MergeCase{Path::composed_cpu, DType::f32},
                                         MergeCase{Path::composed_cpu, DType::f64}, MergeCase{Path::cuda, DType::f32},
                                         MergeCase{Path::cuda, DType::f64}),
                         case_name);

}  // namespace
}  // namespace sl::parallel
