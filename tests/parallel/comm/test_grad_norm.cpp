// test_grad_norm.cpp — one clip_grad_norm for every layout (parallel/comm/grad_norm.h): on a mesh,
// each rank holds its pieces of a small "model" (a tp-sharded weight per stage, a LayerNorm
// replicated over tp, a wte tied between the first and last stage, optionally ZeRO-split over
// dp_shard), and the norm and the clipped pieces must equal the serial ones, computed here in
// double from the logical tensors: within 1e-6 relative, the same bits on every rank. ZeRO's sharded
// clip over the same model: tests/parallel/zero/test_zero_grad_norm.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "parallel/comm/grad_norm.h"
#include "parallel/comm/launch.h"
#include "tensor/ops.h"
#include "tests/support/grad_norm_model.h"
#include "tests/support/test_util.h"

namespace sl::parallel {
namespace {

using namespace grad_norm_model;

struct Layout {
  std::string label;
  ParallelismConfig config;
  bool zero_split = false;  // the pieces are further split over dp_shard, flat and padded, as ZeRO does
};

void PrintTo(const Layout& layout, std::ostream* out) { *out << layout.label; }

class GradNorm : public ::testing::TestWithParam<Layout> {};

TEST_P(GradNorm, CountsEveryLogicalElementOnceAndClipsLikeSerial) {
  const Layout layout = GetParam();
  const ParallelismConfig c = layout.config;
  const std::vector<Logical> model = logical_model(c.pp);
  // The serial reference, in double over the logical tensors.
  double sum = 0;
  for (size_t i = 0; i < model.size(); ++i)
    for (double g : logical_grad(i, model[i])) sum += g * g;
  const double serial_norm = std::sqrt(sum), max_norm = serial_norm / 3;
  const double scale = max_norm / (serial_norm + 1e-6);

  const int world = c.world_size();
  std::vector<double> norms(world);
  std::vector<int64_t> calls(world);
  launch(world, [&](RankContext& ctx) {
    DeviceMesh mesh(ctx.world, c);
    const int stage = mesh.pp_rank(), t = mesh.tp_rank();
    std::vector<MeshGrad> pieces;
    std::vector<std::vector<double>> expected;
    for (size_t i = 0; i < model.size(); ++i) {
      const Logical& p = model[i];
      const bool held = p.stage == stage || (p.stage < 0 && (stage == 0 || stage == c.pp - 1));
      if (!held) continue;
      std::vector<double> values = tp_slice(logical_grad(i, p), p, c.tp, t);
      nn::Placement placement = p.tp_dim >= 0  ? nn::Placement::sharded(p.tp_dim, name(MeshDim::tp))
                                : p.stage < 0 ? nn::Placement::tied("wte")
                                              : nn::Placement::replicated();
      MeshDims split;
      if (layout.zero_split) {  // ZeRO: flat, padded to a multiple of dp_shard, chunk dp_shard_rank
        const int n = c.dp_shard, chunk = static_cast<int>((values.size() + n - 1) / n);
        values.resize(static_cast<size_t>(chunk) * n, 0.0);
        values = std::vector<double>(values.begin() + chunk * mesh.dp_shard_rank(),
                                     values.begin() + chunk * (mesh.dp_shard_rank() + 1));
        split = {MeshDim::dp_shard};
      }
      expected.push_back(values);
      for (double& v : expected.back()) v *= scale;
      pieces.push_back({from_vector(values, {static_cast<int64_t>(values.size())}), placement, split});
    }
    // The dims that cut this model, by the test's own reckoning: the partial sums travel there only.
    MeshDims cut;
    if (c.pp > 1) cut.push_back(MeshDim::pp);
    if (c.tp > 1) cut.push_back(MeshDim::tp);
    if (layout.zero_split && c.dp_shard > 1) cut.push_back(MeshDim::dp_shard);
    ProcessGroupPtr group = cut.empty() ? ctx.world : mesh.group(cut);
    const int64_t before = group->ledger().total().calls;
    norms[ctx.rank] = clip_grad_norm(pieces, max_norm, mesh);
    calls[ctx.rank] = group->ledger().total().calls - before;
    EXPECT_NEAR(norms[ctx.rank], serial_norm, 1e-6 * serial_norm) << "rank " << ctx.rank;
    for (size_t k = 0; k < pieces.size(); ++k) {
      std::vector<double> got = pieces[k].grad.to_vector();
      for (size_t e = 0; e < got.size(); ++e)
        ASSERT_NEAR(got[e], expected[k][e], 1e-6 * std::abs(expected[k][e]) + 1e-12)
            << "rank " << ctx.rank << " piece " << k << " element " << e;
    }
  });
  for (int r = 1; r < world; ++r) EXPECT_EQ(norms[r], norms[0]) << "rank " << r << " got other bits than rank 0";
  // One all_gather over the cutting dims; over the data dims nothing moves, so a mesh that cuts
  // nothing (DDP) clips without communicating.
  const bool cuts = c.pp > 1 || c.tp > 1 || (layout.zero_split && c.dp_shard > 1);
  for (int r = 0; r < world; ++r) EXPECT_EQ(calls[r], cuts ? 1 : 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, GradNorm,
    ::testing::Values(Layout{"serial", {}}, Layout{"ddp4", {.dp_replicate = 4}},
                      Layout{"tp2", {.tp = 2}}, Layout{"pp4", {.pp = 4}},
                      Layout{"pp2_dp2_tp2", {.dp_replicate = 2, .pp = 2, .tp = 2}},
                      Layout{"cp2_tp2", {.cp = 2, .tp = 2}},
                      Layout{"zero3_tp2", {.dp_shard = 3, .tp = 2}, true},
                      Layout{"hsdp_pp2", {.dp_replicate = 2, .dp_shard = 2, .pp = 2}, true}),
    [](const auto& info) { return info.param.label; });

TEST(GradNorm, TheSerialRuleIsPyTorchs) {
  // nn::clip_grad_norm over pieces: uncounted pieces are scaled but not summed; undefined skipped.
  Tensor a = from_vector({3, 4}, {2}), b = from_vector({12}, {1}), none;
  double norm = nn::clip_grad_norm({{a, true}, {b, false}, {none, true}}, 1.0);
  EXPECT_DOUBLE_EQ(norm, 5.0);
  EXPECT_NEAR(a.to_vector()[1], 4 * 1.0 / (5.0 + 1e-6), 1e-7);
  EXPECT_NEAR(b.to_vector()[0], 12 * 1.0 / (5.0 + 1e-6), 1e-6);
  expect_error([&] { nn::clip_grad_norm({{a, true}}, -1.0); }, "max_norm must be positive (got -1)");
}

}  // namespace
}  // namespace sl::parallel
