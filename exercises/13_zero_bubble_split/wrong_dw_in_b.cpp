// exercises/13_zero_bubble_split/wrong_dw_in_b.cpp — a wrong split: B runs the whole backward, W does nothing.
//
// A common mistake: computing dX, dW and db together in backward_b (as a fused backward does) and
// leaving backward_w to forget the micro-batch. The gradients come out right, but nothing was
// deferred: B, on the pipeline's critical path, still pays the dW matmul (half the backward's
// flops), so the previous stage waits as long as under 1F1B and the zero-bubble schedule gains nothing.
// expect: dW was computed in B, no deferral
#include <map>
#include <memory>

#include "autograd/grad_mode.h"
#include "exercises/13_zero_bubble_split/split_linear.h"
#include "exercises/grader.h"
#include "tensor/error.h"
#include "tensor/ops.h"

using namespace sl;

namespace exercise13 {

double predicted_zb_h1_bubble() { return (4 - 1) / (3.0 * 8 + 4 - 1); }  // p-1 single passes idle of 3m + p-1

class StudentSplitLinear : public SplitLinear {
 public:
  using SplitLinear::SplitLinear;

  Tensor forward(int micro, const Tensor& x) override {
    NoGradGuard no_grad;
    waiting_[micro] = Waiting{x};
    return linear(x, weight, bias);
  }

  Tensor backward_b(int micro, const Tensor& dy) override {
    NoGradGuard no_grad;
    auto it = waiting_.find(micro);
    SL_CHECK(it != waiting_.end() && !it->second.b_ran, "backward_b: micro-batch ", micro, " has no forward");
    it->second.b_ran = true;
    // The mistake: dW and db belong to W; here B computes them on the critical path.
    add_into(weight, matmul(dy, it->second.x, true, false));
    add_into(bias, sum(dy, 0));
    return matmul(dy, weight);
  }

  void backward_w(int micro) override {
    auto it = waiting_.find(micro);
    SL_CHECK(it != waiting_.end() && it->second.b_ran, "backward_w: micro-batch ", micro, " has no B waiting");
    waiting_.erase(it);  // its gradients were already added in B
  }

  size_t waiting() const override { return waiting_.size(); }

 private:
  static void add_into(const Tensor& param, const Tensor& g) {
    if (param.grad().defined())
      param.grad().add_(g);
    else
      param.set_grad(g);
  }
  struct Waiting {
    Tensor x;
    bool b_ran = false;
  };
  std::map<int, Waiting> waiting_;
};

std::unique_ptr<SplitLinear> make_split_linear(Tensor weight, Tensor bias) {
  return std::make_unique<StudentSplitLinear>(std::move(weight), std::move(bias));
}

}  // namespace exercise13
