// exercises/13_zero_bubble_split/grader.cpp — grades the B/W split of a Linear's backward (student.cpp).
//
// Reference: the library's fused backward, linear(x, W, b).backward(dy) through autograd, one call per
// micro-batch (each one accumulating into W.grad and b.grad as a training step does). With -DSL_SOLUTION
// the library's own split stands in: sl::DeferredGrads (autograd/deferred_grad.h), whose guard lets B
// compute only dX and queues the weights' work for W.
#include "exercises/grader.h"
#include "parallel/pipeline/simulate.h"
#include "exercises/grader_values.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/deferred_grad.h"
#include "autograd/grad_mode.h"
#include "exercises/13_zero_bubble_split/fused_reference.h"
#include "exercises/13_zero_bubble_split/split_linear.h"
#include "tensor/error.h"
#include "tensor/ops.h"

using namespace sl;
using exercises::all_close;
using exercises::expect;
using exercise13::SplitLinear;

namespace exercise13 {
double predicted_zb_h1_bubble();
}  // namespace exercise13

#ifdef SL_SOLUTION
// The library's split: F builds the graph, B runs backward under a DeferGradsGuard, W runs the queue.
namespace solution {
// Each rank idles p-1 ticks of one pass (not p-1 of F+B+W as in 1F1B) out of 3m + p-1: (p-1)/(3m+p-1).
double predicted_zb_h1_bubble() { return (4 - 1) / (3.0 * 8 + 4 - 1); }
class LibrarySplitLinear : public SplitLinear {
 public:
  using SplitLinear::SplitLinear;
  Tensor forward(int micro, const Tensor& x) override {
    Pending& p = pending_[micro];
    p.x = x.detach();
    p.x.set_requires_grad(true);
    p.y = linear(p.x, weight, bias);
    return p.y.detach();
  }
  Tensor backward_b(int micro, const Tensor& dy) override {
    auto it = pending_.find(micro);
    SL_CHECK(it != pending_.end() && !it->second.b_ran, "backward_b: micro-batch ", micro, " has no forward waiting");
    {
      DeferGradsGuard defer(it->second.later, {weight, bias});
      it->second.y.backward(dy);
    }
    it->second.b_ran = true;
    return it->second.x.grad();
  }
  void backward_w(int micro) override {
    auto it = pending_.find(micro);
    SL_CHECK(it != pending_.end() && it->second.b_ran, "backward_w: micro-batch ", micro, " has no B waiting");
    it->second.later.run();
    pending_.erase(it);
  }
  size_t waiting() const override { return pending_.size(); }

 private:
  struct Pending {
    Tensor x, y;
    DeferredGrads later;
    bool b_ran = false;
  };
  std::map<int, Pending> pending_;
};
std::unique_ptr<SplitLinear> make_split_linear(Tensor weight, Tensor bias) {
  return std::make_unique<LibrarySplitLinear>(std::move(weight), std::move(bias));
}
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise13;
#endif

using namespace exercise13;

// A layer on fresh leaves (copies of the problem's weight and bias, no .grad yet).
static std::unique_ptr<SplitLinear> fresh_layer(const Problem& p) {
  Tensor w = p.weight.clone(), b = p.bias.clone();
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  return impl::make_split_linear(w, b);
}

// True when `call` throws sl::Error; a TODO body's NotImplemented goes on up to the grader.
static bool refuses(const std::function<void()>& call) {
  try {
    call();
  } catch (const exercises::NotImplemented&) {
    throw;
  } catch (const Error&) {
    return true;
  } catch (...) {
    return false;
  }
  return false;
}

// After the W's: dW and db against the fused backward's sum, naming the likely slip.
static void expect_weight_grads(const Problem& p, const SplitLinear& layer, const Fused& want, int micros) {
  const Values dw = values(layer.weight.grad()), db = values(layer.bias.grad());
  expect(!dw.empty(), "weight.grad is unset after W: backward_w must set (or add to) weight.grad");
  expect(!db.empty(), "bias.grad is unset after W: db [out] = Σ_N dy belongs to W too");
  expect(layer.weight.grad().shape() == Shape({p.out, p.in}),
         "weight.grad has shape " + layer.weight.grad().shape().str() +
             ", expected [out, in]: dW = dyᵀ [out, N] · x [N, in]; you may have computed xᵀ · dy");
  expect(db.size() == static_cast<size_t>(p.out),
         "bias.grad has " + std::to_string(db.size()) + " values, expected out = " + std::to_string(p.out) +
             ": sum dy over its N rows (dim 0), not over its columns");
  const int last = micros - 1;
  std::vector<std::pair<int, int>> all_last, x_last, dy_last;
  for (int k = 0; k < micros; ++k) {
    all_last.push_back({last, last});
    x_last.push_back({k, last});
    dy_last.push_back({last, k});
  }
  Values twice = want.dw;
  for (double& v : twice) v *= 2;
  expect(!all_close(dw, twice, 1e-5, 1e-5) || all_close(dw, want.dw, 1e-5, 1e-5),
         "weight.grad is 2x the fused one: dW counted twice, once in B and again in W. B computes dX only");
  if (micros > 1 && !all_close(dw, want.dw, 1e-5, 1e-5)) {
    expect(!all_close(dw, weight_grad_of(p, all_last), 1e-5, 1e-5),
           "every W used the LAST micro-batch's x and dy: one slot that each later F and B overwrote. Keep one "
           "entry per micro-batch (waiting_[micro]) until its own W has run");
    expect(!all_close(dw, weight_grad_of(p, x_last), 1e-5, 1e-5),
           "every W used the last micro-batch's x with its own dy: the stored input was overwritten by a later "
           "forward; keep x per micro-batch");
    expect(!all_close(dw, weight_grad_of(p, dy_last), 1e-5, 1e-5),
           "every W used the last micro-batch's dy with its own x: the stored dy was overwritten by a later B");
    expect(!all_close(dw, weight_grad_of(p, {{last, last}}), 1e-5, 1e-5) &&
               !all_close(dw, weight_grad_of(p, {{0, 0}}), 1e-5, 1e-5),
           "weight.grad holds one micro-batch's dW only: W must ADD to .grad (+=), not replace it");
  }
  expect(all_close(dw, want.dw, 1e-5, 1e-5),
         "weight.grad differs from the fused backward's: dW = dyᵀ · x with this micro-batch's "
         "saved x [N, in] and dy [N, out], added into .grad");
  expect(all_close(db, want.db, 1e-5, 1e-5),
         "bias.grad differs from the fused backward's: db = Σ_N dy (sum over rows, dim 0), added");
}

static std::string after(const char* what, int micro) { return std::string(what) + " of micro-batch " + std::to_string(micro); }

// W of one micro-batch; a shape the library refuses there is most likely dW's.
static void run_w(SplitLinear& layer, int micro) {
  try {
    layer.backward_w(micro);
  } catch (const Error& e) {
    throw exercises::CheckFailed(after("W", micro) + " was refused (" + std::string(e.what()) +
                                 "): weight.grad must be [out, in] = dyᵀ [out, N] · x [N, in]; xᵀ · dy is [in, out]");
  }
}

// B's dX against the fused one, while W's gradients must still be unset.
static void expect_b(const Problem& p, SplitLinear& layer, int micro, const Values& want_dx) {
  const Tensor dx = layer.backward_b(micro, p.dys[micro]);
  expect(!layer.weight.grad().defined() && !layer.bias.grad().defined(),
         "weight.grad (or bias.grad) is set right after B of micro-batch " + std::to_string(micro) +
             ": dW was computed in B, no deferral. Keep dy and compute dyᵀ · x and Σ_N dy in backward_w");
  expect(dx.defined() && dx.shape() == Shape({p.N, p.in}),
         after("B", micro) + " must return dX of shape [N, in] = " + Shape({p.N, p.in}).str());
  if (p.in == p.out) {
    NoGradGuard no_grad;
    expect(!all_close(values(dx), values(matmul(p.dys[micro], p.weight, false, true)), 1e-5, 1e-5),
           "dX = dy · Wᵀ: the transpose is on the wrong side. W is [out, in], so dX [N, in] = dy [N, out] · W");
  }
  expect(all_close(values(dx), want_dx, 1e-5, 1e-5),
         after("dX of B", micro) + " differs from the fused backward's dy · W");
}

// One micro-batch: F, B and W each against the fused backward.
static void check_one_micro_batch(exercises::Grader& grader, const Problem& one, const Problem& square) {
  grader.check("F: y = x · Wᵀ + b, and the micro-batch waits for its W", [&] {
    auto layer = fresh_layer(one);
    const Tensor y = layer->forward(0, one.xs[0]);
    NoGradGuard no_grad;
    expect(y.defined() && all_close(values(y), values(linear(one.xs[0], one.weight, one.bias)), 1e-5, 1e-5),
           "forward's y differs from linear(x, W, b) = x · Wᵀ + b");
    expect(layer->waiting() == 1, "waiting() is " + std::to_string(layer->waiting()) +
                                      " after one forward, expected 1: F keeps x for its micro-batch's W");
  });

  grader.check("B: dX equals the fused backward's while weight.grad and bias.grad are still unset", [&] {
    auto layer = fresh_layer(one);
    const Fused want = fused(one, 1);
    layer->forward(0, one.xs[0]);
    expect_b(one, *layer, 0, want.dx[0]);
    expect(layer->waiting() == 1, "after B, waiting() must still be 1: the micro-batch waits for its W");
  });

  grader.check("W: dW and db equal the fused backward's, then the micro-batch is forgotten", [&] {
    auto layer = fresh_layer(one);
    const Fused want = fused(one, 1);
    layer->forward(0, one.xs[0]);
    layer->backward_b(0, one.dys[0]);
    run_w(*layer, 0);
    expect_weight_grads(one, *layer, want, 1);
    expect(layer->waiting() == 0, "waiting() is " + std::to_string(layer->waiting()) +
                                      " after W, expected 0: erase the micro-batch's x and dy once its W ran");
  });

  grader.check("a square Linear (in == out): each transpose in its place", [&] {
    auto layer = fresh_layer(square);
    const Fused want = fused(square, 1);
    layer->forward(0, square.xs[0]);
    expect_b(square, *layer, 0, want.dx[0]);
    run_w(*layer, 0);
    NoGradGuard no_grad;
    expect(
        !all_close(values(layer->weight.grad()), values(matmul(square.xs[0], square.dys[0], true, false)), 1e-5, 1e-5),
        "weight.grad = xᵀ · dy = dWᵀ: transposes swapped. dW [out, in] = dyᵀ [out, N] · x [N, in]");
    expect_weight_grads(square, *layer, want, 1);
  });

}

// Three micro-batches waiting at once, W's in any order, an existing .grad, and misuse.
static void check_many_micro_batches(exercises::Grader& grader, const Problem& one, const Problem& three) {
  grader.check("F0 F1 F2 B0 B1 B2 then W0 W1 W2: three micro-batches waiting, the fused sum", [&] {
    auto layer = fresh_layer(three);
    const Fused want = fused(three, 3);
    for (int k = 0; k < 3; ++k) layer->forward(k, three.xs[k]);
    for (int k = 0; k < 3; ++k) expect_b(three, *layer, k, want.dx[k]);
    expect(layer->waiting() == 3, "waiting() is " + std::to_string(layer->waiting()) + " with three W's to run, expected 3");
    for (int k = 0; k < 3; ++k) run_w(*layer, k);
    expect_weight_grads(three, *layer, want, 3);
  });

  grader.check("W's in any order: W2 W0 W1, and ZB-H1's F0 F1 B0 F2 B1 W0 B2 W1 W2", [&] {
    const Fused want = fused(three, 3);
    auto reversed = fresh_layer(three);
    for (int k = 0; k < 3; ++k) reversed->forward(k, three.xs[k]);
    for (int k = 0; k < 3; ++k) reversed->backward_b(k, three.dys[k]);
    for (int k : {2, 0, 1}) run_w(*reversed, k);
    expect_weight_grads(three, *reversed, want, 3);
    auto zb = fresh_layer(three);
    zb->forward(0, three.xs[0]);
    zb->forward(1, three.xs[1]);
    expect_b(three, *zb, 0, want.dx[0]);
    zb->forward(2, three.xs[2]);
    const Values dx1 = values(zb->backward_b(1, three.dys[1]));
    expect(all_close(dx1, want.dx[1], 1e-5, 1e-5),
           "dX of B1 (after F2) differs from the fused one: B must use its own micro-batch");
    run_w(*zb, 0);
    const Values dx2 = values(zb->backward_b(2, three.dys[2]));
    expect(all_close(dx2, want.dx[2], 1e-5, 1e-5), "dX of B2 (after W0) differs from the fused one");
    run_w(*zb, 1);
    run_w(*zb, 2);
    expect_weight_grads(three, *zb, want, 3);
  });

  grader.check("W adds to a .grad already there (an earlier step's, or another layer's use)", [&] {
    auto layer = fresh_layer(one);
    const Tensor earlier_w = full({one.out, one.in}, 0.5), earlier_b = full({one.out}, -2.0);
    layer->weight.set_grad(earlier_w.clone());
    layer->bias.set_grad(earlier_b.clone());
    layer->forward(0, one.xs[0]);
    layer->backward_b(0, one.dys[0]);
    run_w(*layer, 0);
    Fused want = fused(one, 1);
    for (size_t i = 0; i < want.dw.size(); ++i) want.dw[i] += 0.5;
    for (size_t i = 0; i < want.db.size(); ++i) want.db[i] -= 2.0;
    expect(!all_close(values(layer->weight.grad()), fused(one, 1).dw, 1e-5, 1e-5),
           "weight.grad was replaced by dW: W must add to a .grad already there, as backward does");
    expect_weight_grads(one, *layer, want, 1);
  });

  grader.check("misuse refused with sl::Error: B with no F, W before B, W twice", [&] {
    auto layer = fresh_layer(one);
    expect(refuses([&] { layer->backward_b(7, one.dys[0]); }), "backward_b of micro-batch 7, which never ran F, must throw sl::Error");
    layer->forward(0, one.xs[0]);
    expect(refuses([&] { layer->backward_w(0); }), "backward_w before that micro-batch's B must throw sl::Error (it has no dy)");
    layer->backward_b(0, one.dys[0]);
    run_w(*layer, 0);
    expect(refuses([&] { layer->backward_w(0); }),
           "a second backward_w of micro-batch 0 must throw sl::Error: its x and dy were freed, its dW already added");
  });

}

// The prediction's measured value: the library's ZB-H1 lists at p 4, m 8, timed by the rendezvous
// simulator with F = B = W = 1 (a fused backward of 2).
static double measured_zb_h1_bubble() {
  const sl::parallel::Schedule zb = sl::parallel::make_schedule(sl::parallel::ScheduleKind::zero_bubble, 4, 8);
  return sl::parallel::simulate(zb, sl::parallel::Costs{1, 2, 1}).timeline.bubble();
}

int main() {
  exercises::Grader grader("13_zero_bubble_split");
  grader.predict("ZB-H1's bubble at p 4, m 8 with F = B = W = 1 (1F1B's is 3/11)", impl::predicted_zb_h1_bubble,
                 measured_zb_h1_bubble, 1e-9, "of the step");
  // [N, in, out], micro-batches, seed: in != out (a transpose shows as a shape), in == out (only as values).
  const Problem one(6, 5, 4, 1, 17), square(5, 4, 4, 1, 23), three(4, 5, 3, 3, 31);
  check_one_micro_batch(grader, one, square);
  check_many_micro_batches(grader, one, three);
  return grader.finish();
}
