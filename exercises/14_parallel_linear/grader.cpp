// exercises/14_parallel_linear/grader.cpp — grades the column- and row-parallel Linears (student.cpp).
//
// A serial nn::Linear(12, 12) with a nonzero bias, x [2, 3, 12] and loss = Σ w·y. At tp 2, 3, 4 the shards
// are held to the serial weight's rows / columns; at tp 2 and 3 (thread ranks, parallel/comm/launch.h) the
// outputs to the serial output (column: the rank's slice; row: whole) and the gradients of the shards and
// of x to the serial gradients' slices, all from an independent serial Linear run by the library's autograd.
// With -DSL_SOLUTION the library's column_shard / row_shard (parallel/tensor_parallel/linear.h) and its
// f and g (mappings.h) stand in, through a small adapter.
#include "exercises/grader.h"
#include "exercises/grader_ranks.h"
#include "exercises/grader_values.h"

#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "parallel/comm/launch.h"
#include "parallel/tensor_parallel/linear.h"
#include "parallel/tensor_parallel/mappings.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;
using exercises::all_close;
using exercises::expect;
using exercises::seeded_randn;

namespace exercise14 {
double predicted_row_shard_numbers();
struct Shard {
  sl::Tensor weight, bias;
};
Shard column_shard(const nn::Linear& serial, const ProcessGroupPtr& group);
Shard row_shard(const nn::Linear& serial, const ProcessGroupPtr& group);
Tensor column_parallel_forward(const Tensor& x, const Shard& shard, const ProcessGroupPtr& group);
Tensor row_parallel_forward(const Tensor& x_part, const Shard& shard, const ProcessGroupPtr& group);
}  // namespace exercise14

#ifdef SL_SOLUTION
namespace solution {
// W [out, in/tp] = [768, 768], and the whole bias [768]: the bias is added once, after g, on every rank.
double predicted_row_shard_numbers() { return 768.0 * 3072 / 4 + 768; }
using exercise14::Shard;
Shard column_shard(const nn::Linear& serial, const ProcessGroupPtr& group) {
  const auto layer = sl::parallel::column_shard(serial, TPGroup{group});
  return {layer->weight, layer->bias};
}
Shard row_shard(const nn::Linear& serial, const ProcessGroupPtr& group) {
  const auto layer = sl::parallel::row_shard(serial, TPGroup{group});
  return {layer->weight, layer->bias};
}
Tensor column_parallel_forward(const Tensor& x, const Shard& shard, const ProcessGroupPtr& group) {
  return linear(copy_to_tp(x, group), shard.weight, shard.bias);
}
Tensor row_parallel_forward(const Tensor& x_part, const Shard& shard, const ProcessGroupPtr& group) {
  return add(reduce_from_tp(linear(x_part, shard.weight), group), shard.bias);
}
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise14;
#endif

constexpr int64_t kB = 2, kT = 3, kIn = 12, kOut = 12;  // 12: divisible by tp 2, 3 and 4

using Values = std::vector<double>;

// The serial Linear every rank and the reference build alike: W [out, in] random, b [out] random and
// shifted by 1, so a bias counted tp times shows.
static std::shared_ptr<nn::Linear> serial_linear() {
  Generator g(11);
  auto layer = std::make_shared<nn::Linear>(kIn, kOut, true, nn::InitOptions{0.3, &g});
  NoGradGuard no_grad;
  layer->bias.copy_(add(seeded_randn({kOut}, 12), 1.0));
  return layer;
}

static Values slice(const Tensor& t, int dim, int rank, int tp) {
  const int64_t n = t.size(dim) / tp;
  return t.narrow(dim, rank * n, n).to_vector();
}

static std::string at(int tp, int rank) { return "tp " + std::to_string(tp) + ", rank " + std::to_string(rank); }

// exercises::run_ranks (thread ranks, 4 s), with what a deadlock here likely is.
static void run_ranks(int tp, const RankFunction& body) {
  exercises::run_ranks(tp, body, "a rank waited 4 s for the others (a deadlock?): every rank must call "
                                 "f and g in the same order. ");
}

// ---- the shards --------------------------------------------------------------------------------------------

// Which rank's slice of W (along dim) the student's weight is, or -1.
static int whose_slice(const Tensor& W, int dim, int tp, const Values& got) {
  for (int r = 0; r < tp; ++r)
    if (all_close(got, slice(W, dim, r, tp), 0, 0)) return r;
  return -1;
}

static void expect_shards(bool column) {
  const auto serial = serial_linear();
  const int dim = column ? 0 : 1;  // column: rows of W; row: columns of W
  const char* name = column ? "column_shard" : "row_shard";
  for (int tp : {2, 3, 4}) {
    std::vector<exercise14::Shard> shards(tp);
    run_ranks(tp, [&](RankContext& ctx) {
      shards[ctx.rank] =
          column ? impl::column_shard(*serial_linear(), ctx.world) : impl::row_shard(*serial_linear(), ctx.world);
    });
    const Shape weight_shape = column ? Shape({kOut / tp, kIn}) : Shape({kOut, kIn / tp});
    const Shape bias_shape = column ? Shape({kOut / tp}) : Shape({kOut});
    for (int r = 0; r < tp; ++r) {
      const exercise14::Shard& s = shards[r];
      const std::string who = std::string(name) + ", " + at(tp, r) + ": ";
      expect(s.weight.defined() && s.bias.defined(), who + "the weight or the bias is undefined");
      expect(
          s.weight.shape() != Shape({kOut, kIn / tp}) || !column,
          who + "the weight is [out, in/tp]: that is the row-parallel cut; column parallel takes ROWS of W (outputs)");
      expect(
          s.weight.shape() != Shape({kOut / tp, kIn}) || column,
          who +
              "the weight is [out/tp, in]: that is the column-parallel cut; row parallel takes COLUMNS of W (inputs)");
      expect(s.weight.shape() == weight_shape,
             who + "the weight is " + s.weight.shape().str() + ", expected " + weight_shape.str());
      expect(s.bias.shape() == bias_shape, who + "the bias is " + s.bias.shape().str() + ", expected " +
                                               bias_shape.str() +
                                               (column ? ": the bias of out/tp outputs is the same slice as the rows"
                                                       : ": row parallel keeps the whole bias"));
      const int owner = whose_slice(serial->weight, dim, tp, s.weight.to_vector());
      expect(owner == r || owner < 0, who + "the weight holds rank " + std::to_string(owner) +
                                          "'s slice: the offset is rank·size/tp (off by " + std::to_string(owner - r) +
                                          ")");
      expect(owner == r,
             who + "the weight is not slice " + std::to_string(r) + " of W along dim " + std::to_string(dim));
      const Values bias_want = column ? slice(serial->bias, 0, r, tp) : serial->bias.to_vector();
      expect(all_close(s.bias.to_vector(), bias_want, 0, 0),
             who + "the bias holds the wrong values" +
                 (column ? ": take the same rows as the weight" : ": take the whole bias"));
      expect(s.weight.is_leaf() && s.weight.requires_grad() && s.bias.is_leaf() && s.bias.requires_grad(),
             who +
                 "the shard must be new leaves that require grad (detach() the slice, then set_requires_grad()): "
                 "a view in the serial layer's graph would send the rank's gradient to the serial layer");
    }
  }
}

// ---- forward and backward against the serial Linear ---------------------------------------------------------

struct Reference {
  Tensor x = seeded_randn({kB, kT, kIn}, 13), w = seeded_randn({kB, kT, kOut}, 14);
  Tensor y, dx, dW, db, bias;
};

static Reference serial_reference() {
  Reference ref;
  const auto serial = serial_linear();
  Tensor x = ref.x.clone().set_requires_grad();
  Tensor y = (*serial)(x);
  sum(mul(y, ref.w)).backward();
  ref.y = y.detach();
  ref.dx = x.grad();
  ref.dW = serial->weight.grad();
  ref.db = serial->bias.grad();
  ref.bias = serial->bias.detach();
  return ref;
}

struct RankRun {
  Values y, dx, dW, db;
};

// Every rank runs its layer on x (column) or its slice of x (row), then loss = Σ w·y (w sliced like y).
static std::vector<RankRun> run_parallel(const Reference& ref, int tp, bool column) {
  std::vector<RankRun> runs(tp);
  run_ranks(tp, [&](RankContext& ctx) {
    const int r = ctx.rank;
    const auto serial = serial_linear();
    const exercise14::Shard shard =
        column ? impl::column_shard(*serial, ctx.world) : impl::row_shard(*serial, ctx.world);
    // x and w on the rank's device (cpu:rank), where its layer lives
    Tensor x = (column ? ref.x.clone() : ref.x.narrow(2, r * kIn / tp, kIn / tp)).to(ctx.device);
    x.set_requires_grad();
    Tensor y =
        column ? impl::column_parallel_forward(x, shard, ctx.world) : impl::row_parallel_forward(x, shard, ctx.world);
    const Tensor w = (column ? ref.w.narrow(2, r * kOut / tp, kOut / tp) : ref.w).to(ctx.device);
    if (y.shape() != w.shape())
      throw exercises::CheckFailed(at(tp, r) + ": the output is " + y.shape().str() + ", expected " + w.shape().str() +
                                   (column ? " (the rank's out/tp columns)" : " (the whole out)"));
    sum(mul(y, w)).backward();
    auto values = [](const Tensor& t) { return t.defined() ? t.to_vector() : Values(); };
    runs[r] = {y.to_vector(), values(x.grad()), values(shard.weight.grad()), values(shard.bias.grad())};
  });
  return runs;
}

static void expect_column_outputs(int tp) {
  const Reference ref = serial_reference();
  const std::vector<RankRun> runs = run_parallel(ref, tp, true);
  const Tensor no_bias = sub(ref.y, ref.bias);
  for (int r = 0; r < tp; ++r) {
    const std::string who = at(tp, r) + ": the column-parallel output ";
    expect(!all_close(runs[r].y, slice(no_bias, 2, r, tp), 1e-5, 1e-5),
           who + "lacks the bias: add b_r, the rank's slice of b");
    for (int j = 0; j < tp; ++j)
      expect(j == r || !all_close(runs[r].y, slice(ref.y, 2, j, tp), 1e-5, 1e-5),
             who + "is rank " + std::to_string(j) + "'s columns of the serial output: check column_shard's offset");
    expect(all_close(runs[r].y, slice(ref.y, 2, r, tp), 1e-5, 1e-5),
           who + "differs from columns [r·out/tp, (r+1)·out/tp) of the serial output");
  }
}

static void expect_row_outputs(int tp) {
  const Reference ref = serial_reference();
  const std::vector<RankRun> runs = run_parallel(ref, tp, false);
  const Values want = ref.y.to_vector();
  for (int r = 0; r < tp; ++r) {
    const std::string who = at(tp, r) + ": the row-parallel output ";
    expect(!all_close(runs[r].y, add(ref.y, mul(ref.bias, tp - 1.0)).to_vector(), 1e-5, 1e-5),
           who + "has the bias added tp times: add it once, AFTER g (g sums every rank's copy of it)");
    expect(!all_close(runs[r].y, sub(ref.y, ref.bias).to_vector(), 1e-5, 1e-5),
           who + "lacks the bias: add b once, after g");
    expect(all_close(runs[r].y, want, 1e-5, 1e-5),
           who + "differs from the serial output: did g sum the ranks' partial products?");
  }
}

static void expect_column_gradients(int tp) {
  const Reference ref = serial_reference();
  const std::vector<RankRun> runs = run_parallel(ref, tp, true);
  Values summed(ref.dx.numel(), 0.0);
  for (const RankRun& run : runs)
    for (size_t i = 0; i < summed.size() && i < run.dx.size(); ++i) summed[i] += run.dx[i];
  for (int r = 0; r < tp; ++r) {
    const std::string who = at(tp, r) + ": the column-parallel gradient of ";
    expect(all_close(runs[r].dW, slice(ref.dW, 0, r, tp), 1e-5, 1e-5),
           who + "W_r differs from rows r of the serial dW");
    expect(all_close(runs[r].db, slice(ref.db, 0, r, tp), 1e-5, 1e-5),
           who + "b_r differs from the slice of the serial db");
    expect(!runs[r].dx.empty(), who + "x is missing: x must reach the Linear through f, inside the graph");
    expect(all_close(runs[r].dx, ref.dx.to_vector(), 1e-5, 1e-5) || !all_close(summed, ref.dx.to_vector(), 1e-5, 1e-5),
           who +
               "x is only this rank's part (the parts add up to the serial dx): pass x through f (copy_to_tp), "
               "whose backward sums the ranks' parts");
    expect(all_close(runs[r].dx, ref.dx.to_vector(), 1e-5, 1e-5), who + "x differs from the serial dx");
  }
}

static void expect_row_gradients(int tp) {
  const Reference ref = serial_reference();
  const std::vector<RankRun> runs = run_parallel(ref, tp, false);
  for (int r = 0; r < tp; ++r) {
    const std::string who = at(tp, r) + ": the row-parallel gradient of ";
    expect(all_close(runs[r].dW, slice(ref.dW, 1, r, tp), 1e-5, 1e-5),
           who + "W_r differs from columns r of the serial dW");
    expect(all_close(runs[r].db, ref.db.to_vector(), 1e-5, 1e-5),
           who + "b differs from the serial db: the bias is added once, after g");
    expect(all_close(runs[r].dx, slice(ref.dx, 2, r, tp), 1e-5, 1e-5),
           who + "x_r differs from the rank's slice of the serial dx");
  }
}

// The prediction's measured value: the numbers in rank 0's shard from the library's row_shard of a
// Linear 3072 -> 768 with bias at tp 4.
static double measured_row_shard_numbers() {
  std::vector<int64_t> numbers(4);
  exercises::run_ranks(4, [&](RankContext& ctx) {
    const nn::Linear c_proj(3072, 768, true);
    const auto shard = sl::parallel::row_shard(c_proj, TPGroup{ctx.world});
    numbers[static_cast<size_t>(ctx.rank)] = shard->weight.numel() + shard->bias.numel();
  }, "the library's row_shard did not finish. ");
  return static_cast<double>(numbers[0]);
}

int main() {
  exercises::Grader grader("14_parallel_linear");
  grader.predict("numbers each rank holds of a row-parallel Linear 3072 -> 768 with bias at tp 4",
                 impl::predicted_row_shard_numbers, measured_row_shard_numbers, 0, "numbers");
  grader.check("column_shard (tp 2, 3, 4): rows r of W [out/tp, in] and of b, as new leaves",
               [] { expect_shards(true); });
  grader.check("row_shard (tp 2, 3, 4): columns r of W [out, in/tp] and the whole b, as new leaves",
               [] { expect_shards(false); });
  grader.check("column_parallel_forward (tp 2, 3): the rank's columns of the serial output", [] {
    for (int tp : {2, 3}) expect_column_outputs(tp);
  });
  grader.check("row_parallel_forward (tp 2, 3): the whole serial output, the bias added once", [] {
    for (int tp : {2, 3}) expect_row_outputs(tp);
  });
  grader.check("column-parallel backward (tp 2, 3): dW_r, db_r and dx equal the serial gradients' slices", [] {
    for (int tp : {2, 3}) expect_column_gradients(tp);
  });
  grader.check("row-parallel backward (tp 2, 3): dW_r, db and dx_r equal the serial gradients' slices", [] {
    for (int tp : {2, 3}) expect_row_gradients(tp);
  });
  return grader.finish();
}
