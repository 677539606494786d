// ZeroAdamW::clip_grad_norm (parallel/zero/zero_adamw.h) on a cut model: the norm and the clipped
// gradients equal the serial ones of the logical model (tests/support/grad_norm_model.h).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "parallel/comm/launch.h"
#include "parallel/zero/zero_adamw.h"
#include "tensor/ops.h"
#include "tests/support/grad_norm_model.h"

namespace sl::parallel {
namespace {

using namespace grad_norm_model;

// ZeRO-1 over dp_shard when the parameters are a cut of the model (the Trainer's pp/tp + ZeRO-1):
// each rank's flat shard mixes tp-sharded, replicated and tied parameters, and clip_grad_norm with
// their placements must still count every logical element once. Both dp_shard ranks produce the
// same gradients, so ZeRO's average is the logical gradient itself.
TEST(ZeroGradNorm, ClipsACutModelByItsPlacements) {
  const ParallelismConfig c{.dp_shard = 2, .pp = 2, .tp = 2};
  const std::vector<Logical> model = logical_model(c.pp);
  double squares = 0;
  for (size_t i = 0; i < model.size(); ++i)
    for (double g : logical_grad(i, model[i])) squares += g * g;
  const double serial_norm = std::sqrt(squares), max_norm = serial_norm / 3;
  const double scale = max_norm / (serial_norm + 1e-6);
  launch(c.world_size(), [&](RankContext& ctx) {
    DeviceMesh mesh(ctx.world, c);
    const int stage = mesh.pp_rank(), t = mesh.tp_rank();
    std::vector<Tensor> params;
    std::vector<nn::Placement> placements;
    std::vector<std::vector<double>> grads;
    for (size_t i = 0; i < model.size(); ++i) {
      const Logical& p = model[i];
      if (!(p.stage == stage || (p.stage < 0 && (stage == 0 || stage == c.pp - 1)))) continue;
      grads.push_back(tp_slice(logical_grad(i, p), p, c.tp, t));
      params.push_back(zeros({static_cast<int64_t>(grads.back().size())}).set_requires_grad(true));
      placements.push_back(p.tp_dim >= 0  ? nn::Placement::sharded(p.tp_dim, name(MeshDim::tp))
                           : p.stage < 0 ? nn::Placement::tied("wte")
                                         : nn::Placement::replicated());
    }
    ZeroAdamW zero(params, mesh.group(MeshDim::dp_shard), ZeroOptions{.stage = 1});
    zero.zero_grad();
    Tensor loss = zeros({1});
    for (size_t k = 0; k < params.size(); ++k)  // d loss / d param_k = grads[k]
      loss = add(loss, sum(mul(params[k], from_vector(grads[k], {static_cast<int64_t>(grads[k].size())}))));
    loss.backward();
    const double norm = zero.clip_grad_norm(max_norm, placements, mesh);
    EXPECT_NEAR(norm, serial_norm, 1e-6 * serial_norm) << "rank " << ctx.rank;
    std::vector<double> clipped = zero.gather_gradients().to_vector(), expected;
    for (const auto& g : grads)
      for (double v : g) expected.push_back(v * scale);
    ASSERT_EQ(clipped.size(), expected.size());
    for (size_t e = 0; e < expected.size(); ++e)
      ASSERT_NEAR(clipped[e], expected[e], 1e-6 * std::abs(expected[e]) + 1e-12) << "rank " << ctx.rank << " element " << e;
  });
}

}  // namespace
}  // namespace sl::parallel
