// exercises/13_zero_bubble_split/student.cpp — split a Linear's backward into B (dX now) and W (dW later).
//
// A layer's backward does two independent jobs. Zero-bubble pipelines (lesson 10, ZB-H1) run them as
// two actions: B hands dX to the previous stage at once, W computes the weight gradients later, in the
// slot where 1F1B's rank would idle. For y [N, out] = x [N, in] · Wᵀ + b (N = B·T rows):
//
//   F:  y  [N, out]  = x [N, in] @ Wᵀ [in, out] + b        keep x [N, in]   (W needs it)
//   B:  dX [N, in]   = dy [N, out] @ W [out, in]           keep dy [N, out] (W needs it)
//   W:  dW [out, in] = dyᵀ [out, N] @ x [N, in]            weight.grad += dW
//       db [out]     = Σ_N dy                              bias.grad   += db
//
// B must not touch weight.grad or bias.grad (that is the point: the dW matmul is half of the backward's
// flops, and B is on the critical path). W of micro-batch k uses micro-batch k's x and dy, whatever ran
// between: ZB-H1's rank r keeps r micro-batches waiting between B and W, so keep them apart (one entry
// per micro-batch in `waiting_`), and forget an entry when its W has run. W's run in any order and
// ACCUMULATE: after W of every micro-batch, .grad holds the sum, as fused backwards one after another
// would leave it (a .grad that was already there is added to, not replaced).
//
// Errors (sl::Error, with SL_CHECK from tensor/error.h): backward_b of a micro-batch whose forward did
// not run (or that already ran B), backward_w of one whose B has not run (or whose W already ran).
//
// Tools (tensor/ops.h): linear(x, w, b); matmul(a, b, transpose_a, transpose_b); sum(t, dim); add;
// Tensor::grad(), set_grad(); NoGradGuard (autograd/grad_mode.h): run everything with grad mode off,
// these are the gradients, not a graph to differentiate again.
//
// Grade it:  make exercise N=13
#include <map>
#include <memory>

#include "autograd/grad_mode.h"
#include "exercises/13_zero_bubble_split/split_linear.h"
#include "exercises/grader.h"
#include "tensor/error.h"
#include "tensor/ops.h"

using namespace sl;

namespace exercise13 {

// PREDICT FIRST, before any code. Why split at all: p = 4 stages, m = 8 micro-batches, F = B = W = 1
// tick (1F1B's fused backward costs B + W = 2). 1F1B's bubble is (p-1)/(m+p-1) = 3/11. What is ZB-H1's,
// which runs the W's where 1F1B idles? Replace the throw; the grader measures it with the simulator.
double predicted_zb_h1_bubble() {
  throw exercises::NotImplemented("predicted_zb_h1_bubble (predict first)");
}

// What one micro-batch's W needs: x from F, dy from B.
struct SavedForW {
  Tensor x;   // [N, in]
  Tensor dy;  // [N, out], undefined until B ran
};

class StudentSplitLinear : public SplitLinear {
 public:
  using SplitLinear::SplitLinear;

  // F: y [N, out] = x · Wᵀ + b; keep x for this micro-batch's W.
  Tensor forward(int micro, const Tensor& x) override {
    NoGradGuard no_grad;
    // TODO: compute y, remember x under `micro`.
    throw exercises::NotImplemented("forward");
  }

  // B: dX [N, in] = dy · W, now; keep dy for W. weight.grad and bias.grad stay as they are.
  Tensor backward_b(int micro, const Tensor& dy) override {
    NoGradGuard no_grad;
    // TODO: refuse a micro-batch with no forward (or a second B); compute dX; remember dy.
    throw exercises::NotImplemented("backward_b");
  }

  // W: weight.grad += dyᵀ · x, bias.grad += Σ_N dy, from this micro-batch's saved x and dy; then forget it.
  void backward_w(int micro) override {
    NoGradGuard no_grad;
    // TODO: refuse a micro-batch whose B has not run; dW and db; accumulate into .grad; erase the entry.
    throw exercises::NotImplemented("backward_w");
  }

  size_t waiting() const override { return waiting_.size(); }

 private:
  std::map<int, SavedForW> waiting_;  // micro-batch -> what its W needs
};

std::unique_ptr<SplitLinear> make_split_linear(Tensor weight, Tensor bias) {
  return std::make_unique<StudentSplitLinear>(std::move(weight), std::move(bias));
}

}  // namespace exercise13
