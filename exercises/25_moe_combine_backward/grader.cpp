// exercises/25_moe_combine_backward/grader.cpp — grades combine_forward and combine_backward (student.cpp).
//
// The reference is the library's nn::combine (nn/moe_routing.h) and autograd through it, on plans from
// nn::plan_dispatch of nn::route's choices; gradcheck (autograd/gradcheck.h) checks the Function in f64.
// With -DSL_SOLUTION the library's combine stands in.
#include "exercises/grader.h"
#include "exercises/grader_values.h"

#include <cstdint>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "nn/moe_routing.h"
#include "tensor/ops.h"

using namespace sl;
using exercises::expect;

namespace exercise25 {
double predicted_weight_gradient();
Tensor combine(const Tensor& y, const Tensor& weights, const std::vector<int64_t>& token, const std::vector<int64_t>& choice);
}  // namespace exercise25

static std::vector<int64_t> ints(const Tensor& t) {
  std::vector<int64_t> out;
  for (double v : t.to_vector()) out.push_back(static_cast<int64_t>(v));
  return out;
}
static nn::DispatchPlan plan_of(const std::vector<int64_t>& token, const std::vector<int64_t>& choice) {
  nn::DispatchPlan plan;
  const auto M = static_cast<int64_t>(token.size());
  plan.token = from_vector(std::vector<double>(token.begin(), token.end()), {M}, DType::i64);
  plan.choice = from_vector(std::vector<double>(choice.begin(), choice.end()), {M}, DType::i64);
  return plan;
}

#ifdef SL_SOLUTION
namespace solution {
// dL/dw = y · g = 1·0.5 + 2·0.5 + (-1)·2 = -0.5.
double predicted_weight_gradient() { return -0.5; }
Tensor combine(const Tensor& y, const Tensor& weights, const std::vector<int64_t>& token, const std::vector<int64_t>& choice) {
  return nn::combine(y, weights, plan_of(token, choice));
}
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise25;
#endif

// A case: N tokens routed to k of E experts by nn::route, planned with a capacity; y [M, C] random.
struct Case {
  Tensor y, weights, grad_out;  // f64
  std::vector<int64_t> token, choice;
  nn::DispatchPlan plan;
  std::string name;
};
static Case make_case(int64_t N, int64_t E, int64_t k, double factor, uint64_t seed) {
  const nn::Routing routing = nn::route(exercises::seeded_randn({N, E}, seed).to(DType::f64), k, nn::MoERouter::topk_softmax);
  Case c;
  c.plan = nn::plan_dispatch(routing.experts, E, nn::expert_capacity(factor, N, k, E), Device::cpu());
  c.token = ints(c.plan.token), c.choice = ints(c.plan.choice);
  const auto M = static_cast<int64_t>(c.token.size());
  c.y = exercises::seeded_randn({M, 3}, seed + 1).to(DType::f64).set_requires_grad();
  c.weights = routing.weights.detach().set_requires_grad();
  c.grad_out = exercises::seeded_randn({N, 3}, seed + 2).to(DType::f64);
  c.name = "N " + std::to_string(N) + ", E " + std::to_string(E) + ", k " + std::to_string(k) + ", factor " +
           std::to_string(factor).substr(0, 4) + ", " + std::to_string(c.plan.dropped()) + " dropped";
  return c;
}

// The forward of a token whose kept choices overwrite each other (out[n] = the last one's w·y).
static std::vector<double> overwritten(const Case& c) {
  const int64_t C = c.y.size(1);
  std::vector<double> out(static_cast<size_t>(c.weights.size(0) * C), 0.0);
  const std::vector<double> y = c.y.to_vector(), w = c.weights.to_vector();
  for (size_t m = 0; m < c.token.size(); ++m)
    for (int64_t d = 0; d < C; ++d) out[c.token[m] * C + d] = w[c.choice[m]] * y[m * C + d];
  return out;
}

static void expect_forward(const Case& c) {
  NoGradGuard no_grad;
  const Tensor got = impl::combine(c.y, c.weights, c.token, c.choice), want = nn::combine(c.y, c.weights, c.plan);
  expect(got.defined() && got.shape() == want.shape(), c.name + ": out must be [N, C] = " + want.shape().str());
  if (max_abs_diff(got, want) < 1e-12) return;
  expect(!exercises::all_close(got.to_vector(), overwritten(c), 1e-12, 1e-12),
         c.name + ": a token with two kept choices got only the last one: add every kept choice into out[n] (+=, not =)");
  expect(false, c.name + ": out differs from Σ over the token's kept choices of w · y (by " +
                    std::to_string(max_abs_diff(got, want)) + ")");
}

static void expect_gradients(const Case& c) {
  sum(mul(impl::combine(c.y, c.weights, c.token, c.choice), c.grad_out)).backward();
  const Tensor got_y = c.y.grad(), got_w = c.weights.grad();
  const Tensor y2 = c.y.detach().clone().set_requires_grad(), w2 = c.weights.detach().clone().set_requires_grad();
  sum(mul(nn::combine(y2, w2, c.plan), c.grad_out)).backward();
  expect(got_w.defined() && max_abs_diff(got_w, zeros_like(got_w)) > 0,
         c.name + ": the weights got no gradient: dL/dw[choice[m]] = y[m] · g[token[m]] is the router's only "
                  "gradient from the task loss (did you detach the weights, or return an empty tensor?)");
  expect(got_y.defined() && max_abs_diff(got_y, y2.grad()) < 1e-12,
         c.name + ": dL/dy differs from the library's: dL/dy[m] = w[choice[m]] · g[token[m]]");
  expect(max_abs_diff(got_w, w2.grad()) < 1e-12, c.name + ": dL/dw differs from the library's: dL/dw[choice[m]] = "
                                                          "Σ_c y[m, c] · g[token[m], c], 0 for a dropped choice");
}

static const std::vector<std::vector<double>> kCases = {
    // N, E, k, capacity factor, seed
    {8, 4, 2, 1.0, 10}, {16, 4, 2, 0.5, 20}, {12, 8, 3, 1.25, 30}, {10, 3, 1, 0.0, 40}, {20, 6, 2, 0.0, 50}};
static Case case_at(size_t i) {
  const auto& v = kCases[i];
  return make_case(static_cast<int64_t>(v[0]), static_cast<int64_t>(v[1]), static_cast<int64_t>(v[2]), v[3],
                   static_cast<uint64_t>(v[4]));
}

static double measured_weight_gradient() {
  const Tensor y = from_vector({1, 2, -1}, {1, 3}, DType::f64);
  const Tensor w = from_vector({0.7, 0.3}, {1, 2}, DType::f64).set_requires_grad();  // token 0's choice 1 dropped
  sum(mul(nn::combine(y, w, plan_of({0}, {0})), from_vector({0.5, 0.5, 2}, {1, 3}, DType::f64))).backward();
  return w.grad().to_vector()[0];
}

int main() {
  exercises::Grader grader("25_moe_combine_backward");
  grader.predict("dL/dw of token 0's kept first choice (y = [1, 2, -1], dL/dout[0] = [0.5, 0.5, 2])",
                 impl::predicted_weight_gradient, measured_weight_gradient, 1e-12, "(dL/dw)");
  grader.check("forward == nn::combine on 5 plans (k 1-3, with drops and dropless)", [] {
    for (size_t i = 0; i < kCases.size(); ++i) expect_forward(case_at(i));
  });
  grader.check("backward: dL/dy and dL/dw == autograd through nn::combine (f64)", [] {
    for (size_t i = 0; i < kCases.size(); ++i) expect_gradients(case_at(i));
  });
  grader.check("gradcheck of the Function in f64, with respect to y and the weights", [] {
    for (size_t i : {0, 1, 2}) {
      const Case c = case_at(i);
      const GradcheckResult r = gradcheck(
          [&](const TensorList& in) { return impl::combine(in[0], in[1], c.token, c.choice); }, {c.y, c.weights});
      expect(r.ok, c.name + ": gradcheck failed: " + r.message);
    }
  });
  grader.check("a dropped choice's weight gets gradient 0; a token that lost every choice has output 0", [] {
    const Case c = case_at(1);  // capacity factor 0.5: many drops
    const Tensor out = impl::combine(c.y, c.weights, c.token, c.choice);
    sum(mul(out, c.grad_out)).backward();
    const int64_t N = c.weights.size(0), k = c.weights.size(1);
    std::vector<int> kept(static_cast<size_t>(N * k), 0);
    for (int64_t e : c.choice) kept[e] = 1;
    expect(c.weights.grad().defined(), "the weights got no gradient (did you detach them?)");
    const std::vector<double> gw = c.weights.grad().to_vector(), o = out.to_vector();
    int64_t lost_tokens = 0;
    for (int64_t n = 0; n < N; ++n) {
      bool any = false;
      for (int64_t j = 0; j < k; ++j) {
        any = any || kept[n * k + j];
        if (!kept[n * k + j])
          expect(gw[n * k + j] == 0, "token " + std::to_string(n) + "'s dropped choice " + std::to_string(j) +
                                         " got weight gradient " + std::to_string(gw[n * k + j]) + ", not 0");
      }
      if (any) continue;
      ++lost_tokens;
      for (int64_t d = 0; d < 3; ++d)
        expect(o[n * 3 + d] == 0, "token " + std::to_string(n) + " lost every choice but its output is not 0");
    }
    expect(lost_tokens > 0, "the case should have a token that lost every choice (grader's data)");
  });
  return grader.finish();
}
