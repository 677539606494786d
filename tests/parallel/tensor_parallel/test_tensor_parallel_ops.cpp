// test_tensor_parallel_ops.cpp — the pieces of parallel/tensor_parallel, each against its serial
// meaning: f/g and the sequence-parallel pairs, the column- and row-parallel Linears (the same
// make_column_parallel / make_row_parallel that cut the GPT, on slices of a serial nn::Linear), the
// vocab-parallel embedding and cross-entropy (gradchecks, values, edge cases).
//
// How a distributed op is gradchecked: every rank runs gradcheck on the same replicated input x
// (f64), in lockstep, so every perturbation is a perturbation of the one logical x. The function
// fans x out through f (or scatter) to rank-specific branches and brings them back through g (or a
// gather) to one replicated output, so each rank's sum(w·out) is the one global objective: a
// backward that forgets an all-reduce (or adds one) gives rank r its own branch's gradient (or t
// times the right one) and fails.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/grad_mode.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh_dim.h"
#include "parallel/tensor_parallel/linear.h"
#include "parallel/tensor_parallel/mappings.h"
#include "parallel/tensor_parallel/vocab.h"
#include "tests/support/parallel.h"
#include "tests/support/test_util.h"
#include "tests/support/vocab.h"

namespace sl::parallel {
namespace {

Tensor random64(const Shape& shape, uint64_t seed) {
  Generator g(seed);
  return randn(shape, TensorOptions(DType::f64), &g).set_requires_grad();
}

class TPOps : public testing::TestWithParam<int> {};

// f then g: out = Σ_r (r+1)·x. f's backward must all-reduce, g's must not.
TEST_P(TPOps, CopyAndReduceGradcheck) {
  const int world = GetParam();
  SL_SKIP_UNLESS_WORLD(world);
  launch(
      world,
      [&](RankContext& ctx) {
        const double c = ctx.rank + 1;
        auto fn = [&](const TensorList& in) { return reduce_from_tp(mul(copy_to_tp(in[0], ctx.world), c), ctx.world); };
        expect_gradcheck(fn, {random64({2, 3}, 1)}, 6);
        Tensor y = fn({random64({2, 3}, 1)});
        EXPECT_LT(max_abs_diff(y, mul(random64({2, 3}, 1), world * (world + 1) / 2.0)), 1e-12);
      },
      quick());
}

// scatter -> (r+1)· -> gather -> (r+2)· -> reduce-scatter -> (r+3)· -> gather -> (r+4)· -> g:
// every sequence op, forward and backward, on a batch-first [B, T, C] with B > 1.
TEST_P(TPOps, SequenceParallelPairsGradcheck) {
  const int world = GetParam();
  SL_SKIP_UNLESS_WORLD(world);
  launch(
      world,
      [&](RankContext& ctx) {
        const double r = ctx.rank;
        auto fn = [&](const TensorList& in) {
          Tensor s = mul(scatter_sequence(in[0], ctx.world), r + 1);           // [B, T/t, C]
          Tensor full = mul(gather_sequence(s, ctx.world), r + 2);             // [B, T, C], a column branch
          Tensor mine = mul(reduce_scatter_sequence(full, ctx.world), r + 3);  // [B, T/t, C]
          return reduce_from_tp(mul(gather_sequence(mine, ctx.world), r + 4), ctx.world);
        };
        expect_gradcheck(fn, {random64({2, 2 * world, 3}, 2)}, 2 * 2 * world * 3);
      },
      quick());
}

// gather_last_dim: the column-parallel output gathered; the backward keeps my slice.
TEST_P(TPOps, GatherLastDimGradcheck) {
  const int world = GetParam();
  SL_SKIP_UNLESS_WORLD(world);
  launch(
      world,
      [&](RankContext& ctx) {
        auto fn = [&](const TensorList& in) {
          return gather_last_dim(mul(copy_to_tp(in[0], ctx.world), ctx.rank + 1.0), ctx.world);
        };
        expect_gradcheck(fn, {random64({2, 3, 2}, 3)}, 12);
      },
      quick());
}

// This rank's rows [B, T/t, C] of x [B, T, C] (what it holds under SP).
Tensor my_rows(const Tensor& x, int rank, int world) {
  const int64_t rows = x.size(1) / world;
  return x.narrow(1, rank * rows, rows).clone();
}

// Σ over the tp ranks of a partial gradient (a copy: the parameter's own .grad is left as it is).
Tensor summed(const Tensor& grad, const ProcessGroupPtr& group) {
  Tensor sum = grad.clone();
  group->all_reduce(sum);
  return sum;
}

// A GPT block's MLP half, LayerNorm -> column -> GeLU -> row, against the serial modules, values and
// every gradient, with and without SP. The shards are slices of the serial Linears, made parallel by
// the functions that cut the GPT (f on the LayerNorm's output, g then the bias once on the row layer).
TEST_P(TPOps, ColumnThenRowEqualsSerialMLP) {
  const int world = GetParam();
  SL_SKIP_UNLESS_WORLD(world);
  for (bool sp : {false, true}) {
    launch(
        world,
        [&](RankContext& ctx) {
          const int64_t B = 2, T = 2 * world, C = 4, H = 4 * world;
          Generator gs(7), gb(8), gx(9), gd(10);
          nn::LayerNorm ln(C), pln(C);
          nn::Linear fc(C, H, true, {0.5, &gs}), proj(H, C, true, {0.5, &gs});
          {
            NoGradGuard no_grad;  // nonzero biases, the same on every rank
            fc.bias.copy_(randn({H}, {}, &gb));
            proj.bias.copy_(randn({C}, {}, &gb));
          }
          const TPGroup tp{ctx.world, sp};
          std::shared_ptr<nn::Linear> cfc = column_shard(fc, tp), rproj = row_shard(proj, tp);
          const Tensor row_bias = rproj->bias;  // make_row_parallel empties the handle; the parameter stays
          make_column_parallel(*cfc, pln, tp);
          make_row_parallel(*rproj, tp);

          const Tensor x = randn({B, T, C}, {}, &gx), dy = randn({B, T, C}, {}, &gd);
          Tensor xs = x.clone().set_requires_grad();
          Tensor xp = (sp ? my_rows(x, ctx.rank, world) : x.clone()).set_requires_grad();
          Tensor serial = proj(gelu(fc(ln(xs))));
          Tensor parallel = (*rproj)(gelu((*cfc)(pln(xp))));
          auto mine = [&](const Tensor& t) { return sp ? my_rows(t, ctx.rank, world) : t; };
          EXPECT_LT(max_abs_diff(parallel, mine(serial)), 1e-6) << "sp " << sp;
          serial.backward(dy);
          parallel.backward(mine(dy));

          // the sharded weights: my rows (column) and my columns (row) of the serial gradients
          EXPECT_LT(max_abs_diff(cfc->weight.grad(), fc.weight.grad().narrow(0, ctx.rank * (H / world), H / world)),
                    1e-5);
          EXPECT_LT(max_abs_diff(cfc->bias.grad(), fc.bias.grad().narrow(0, ctx.rank * (H / world), H / world)), 1e-5);
          EXPECT_LT(max_abs_diff(rproj->weight.grad(), proj.weight.grad().narrow(1, ctx.rank * (H / world), H / world)),
                    1e-5);
          // the input: f's backward sums every rank's part (SP: the all-gather's reduce-scatter, my rows)
          EXPECT_LT(max_abs_diff(xp.grad(), mine(xs.grad())), 1e-5) << "sp " << sp;
          // replicated parameters: whole gradients, or under SP partial sums over T/t rows
          auto whole = [&](const Tensor& grad) { return sp ? summed(grad, ctx.world) : grad; };
          EXPECT_LT(max_abs_diff(whole(row_bias.grad()), proj.bias.grad()), 1e-5) << "sp " << sp;
          EXPECT_LT(max_abs_diff(whole(pln.weight.grad()), ln.weight.grad()), 1e-5) << "sp " << sp;
          EXPECT_LT(max_abs_diff(whole(pln.bias.grad()), ln.bias.grad()), 1e-5) << "sp " << sp;
          EXPECT_EQ(rproj->named_placements()[1].second.partial_over, sp ? name(MeshDim::tp) : "") << "sp " << sp;
        },
        quick());
  }
}

// gather_output: the column layer's split output all-gathered back to the serial Linear's.
TEST_P(TPOps, ColumnGatherOutputEqualsSerial) {
  const int world = GetParam();
  SL_SKIP_UNLESS_WORLD(world);
  launch(
      world,
      [&](RankContext& ctx) {
        Generator gs(3), gx(4);
        nn::LayerNorm ln(5);
        nn::Linear serial(5, 2 * world, true, {0.5, &gs});
        std::shared_ptr<nn::Linear> column = column_shard(serial, {ctx.world, false});
        make_column_parallel(*column, ln, {ctx.world, false}, /*gather_output=*/true);
        Tensor x = randn({1, 3, 5}, {}, &gx);
        EXPECT_LT(max_abs_diff((*column)(ln(x)), serial(ln(x))), 1e-6);
      },
      quick());
}

// The shard builders refuse a width the group does not divide, naming both.
TEST(TPOpsErrors, ShardOfAnIndivisibleLinear) {
  SL_SKIP_UNLESS_WORLD(3);
  launch(
      3,
      [&](RankContext& ctx) {
        nn::Linear serial(4, 1000);
        expect_error(
            [&] {
              column_shard(serial, {ctx.world, false});
            },
            "column_shard: out_features (1000) is not divisible by tp (3)");
        expect_error(
            [&] {
              row_shard(serial, {ctx.world, false});
            },
            "row_shard: in_features (4) is not divisible by tp (3)");
      },
      quick());
}

// The embedding of a replicated (padded) weight through f, cut by rows: equals embedding(weight, ids)
// and its gradient is the serial one: a foreign id must add nothing to row 0.
TEST_P(TPOps, VocabParallelEmbeddingGradcheck) {
  const int world = GetParam();
  SL_SKIP_UNLESS_WORLD(world);
  launch(
      world,
      [&](RankContext& ctx) {
        const int64_t V = 2 * world + 1, C = 3;  // not divisible: padded
        const VocabRange range = VocabRange::of(V, ctx.rank, world);
        Tensor ids = from_vector({0, 1, double(V - 1), 2, 0, double(V - 2)}, {2, 3}, TensorOptions(DType::i64));
        auto fn = [&](const TensorList& in) {
          Tensor padded =
              cat({copy_to_tp(in[0], ctx.world), zeros({range.rows * world - V, C}, TensorOptions(DType::f64))}, 0);
          return vocab_parallel_embedding(padded.narrow(0, range.start, range.rows), ids, range, ctx.world);
        };
        Tensor weight = random64({V, C}, 5);
        EXPECT_LT(max_abs_diff(fn({weight}), embedding(weight, ids)), 1e-12);
        expect_gradcheck(fn, {weight}, V * C);
      },
      quick());
}

// Vocab-parallel cross-entropy of logits cut by columns == cross_entropy of the whole logits.
Tensor parallel_ce(const Tensor& logits, const Tensor& targets, const RankContext& ctx, int world) {
  const int64_t V = logits.size(-1);
  const VocabRange range = VocabRange::of(V, ctx.rank, world);
  Tensor x = copy_to_tp(logits, ctx.world);
  const int64_t pad = range.rows * world - V;
  if (pad > 0) x = cat({x, zeros({x.size(0), pad}, TensorOptions(x.dtype()))}, 1);  // padding: never counted
  return vocab_parallel_cross_entropy(x.narrow(1, range.start, range.rows), targets, range, ctx.world);
}

TEST_P(TPOps, VocabParallelCrossEntropyGradcheck) {
  const int world = GetParam();
  SL_SKIP_UNLESS_WORLD(world);
  launch(
      world,
      [&](RankContext& ctx) {
        const int64_t V = 3 * world + 1, N = 5;
        Tensor targets = from_vector({0, double(V - 1), -100, 2, double(V / 2)}, {N}, TensorOptions(DType::i64));
        auto fn = [&](const TensorList& in) { return parallel_ce(in[0], targets, ctx, world); };
        Tensor logits = random64({N, V}, 6);
        EXPECT_NEAR(fn({logits}).item(), cross_entropy(logits, targets).item(), 1e-12);
        expect_gradcheck(fn, {logits}, N * V);
      },
      quick());
}

// Edge cases: logits ×1e3 (a naive exp overflows), ignored targets, a target in every shard, all
// targets ignored (0 and no gradient, as cross_entropy).
TEST_P(TPOps, VocabParallelCrossEntropyEdgeCases) {
  const int world = GetParam();
  SL_SKIP_UNLESS_WORLD(world);
  launch(
      world,
      [&](RankContext& ctx) {
        const int64_t V = 4 * world + 3;
        const std::vector<double> t = one_target_per_shard(V, world, {-100, double(V - 1)});
        const int64_t N = static_cast<int64_t>(t.size());
        Tensor targets = from_vector(t, {N}, TensorOptions(DType::i64));
        Generator g(8);
        for (double scale : {1.0, 1e3}) {
          Tensor logits = mul(randn({N, V}, {}, &g), scale).set_requires_grad();
          Tensor serial_logits = logits.detach().clone().set_requires_grad();
          Tensor loss = parallel_ce(logits, targets, ctx, world);
          Tensor serial = cross_entropy(serial_logits, targets);
          ASSERT_TRUE(std::isfinite(loss.item())) << "scale " << scale;
          EXPECT_NEAR(loss.item(), serial.item(), 1e-5 * std::abs(serial.item()) + 1e-5) << "scale " << scale;
          loss.backward();
          serial.backward();
          EXPECT_LT(max_abs_diff(logits.grad(), serial_logits.grad()), 1e-6) << "scale " << scale;
        }
        Tensor none = full({2}, -100, TensorOptions(DType::i64));
        Tensor logits = randn({2, V}, {}, &g).set_requires_grad();
        Tensor loss = parallel_ce(logits, none, ctx, world);
        EXPECT_EQ(loss.item(), 0.0);
        loss.backward();
        EXPECT_EQ(max_abs_diff(logits.grad(), zeros({2, V})), 0.0);
      },
      quick());
}

// An id or target outside the vocabulary is refused before the first all-reduce (no rank left waiting).
TEST(TPOpsErrors, IdsAndTargetsOutOfRangeBeforeCommunication) {
  SL_SKIP_UNLESS_WORLD(2);
  launch(
      2,
      [&](RankContext& ctx) {
        const VocabRange range = VocabRange::of(8, ctx.rank, 2);
        Tensor logits = zeros({2, range.rows});
        const uint64_t before = ctx.world->collectives_issued();
        expect_error(
            [&] {
              vocab_parallel_cross_entropy(logits, from_vector({1, 9}, {2}, TensorOptions(DType::i64)), range,
                                           ctx.world);
            },
            "target 9 is out of range for a vocabulary of 8");
        expect_error(
            [&] {
              vocab_parallel_embedding(zeros({range.rows, 3}), from_vector({0, 8}, {1, 2}, TensorOptions(DType::i64)),
                                       range, ctx.world);
            },
            "id 8 is out of range for a vocabulary of 8");
        EXPECT_EQ(ctx.world->collectives_issued(), before);
      },
      quick());
}

INSTANTIATE_TEST_SUITE_P(Worlds, TPOps, testing::Values(2, 3, 4), world_name);

}  // namespace
}  // namespace sl::parallel
