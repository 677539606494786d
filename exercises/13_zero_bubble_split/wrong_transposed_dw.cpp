// exercises/13_zero_bubble_split/wrong_transposed_dw.cpp — a wrong W: dW = xᵀ · dy, the transpose on the wrong side.
//
// A common mistake: writing dW as xᵀ · dy, the way it reads for y = x · W (no transpose). The
// Linear computes y = x · Wᵀ with W [out, in], so dW = dyᵀ · x [out, in]; xᵀ · dy is its transpose
// [in, out]. When in != out the shape gives it away; on a square layer (a transformer's c_proj,
// [C, C]) it has the right shape and silently trains the wrong weights.
// expect: transposes swapped
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
    waiting_[micro] = SavedForW{x, Tensor()};
    return linear(x, weight, bias);
  }

  Tensor backward_b(int micro, const Tensor& dy) override {
    NoGradGuard no_grad;
    auto it = waiting_.find(micro);
    SL_CHECK(it != waiting_.end() && !it->second.dy.defined(), "backward_b: micro-batch ", micro, " has no forward");
    it->second.dy = dy;
    return matmul(dy, weight);
  }

  void backward_w(int micro) override {
    NoGradGuard no_grad;
    auto it = waiting_.find(micro);
    SL_CHECK(it != waiting_.end() && it->second.dy.defined(), "backward_w: micro-batch ", micro, " has no B waiting");
    const Tensor& dy = it->second.dy;
    add_into(weight, matmul(it->second.x, dy, true, false));  // the mistake: xᵀ · dy is [in, out]
    add_into(bias, sum(dy, 0));
    waiting_.erase(it);
  }

  size_t waiting() const override { return waiting_.size(); }

 private:
  static void add_into(const Tensor& param, const Tensor& g) {
    if (param.grad().defined())
      param.grad().add_(g);
    else
      param.set_grad(g);
  }
  struct SavedForW {
    Tensor x, dy;  // dy undefined until B ran
  };
  std::map<int, SavedForW> waiting_;
};

std::unique_ptr<SplitLinear> make_split_linear(Tensor weight, Tensor bias) {
  return std::make_unique<StudentSplitLinear>(std::move(weight), std::move(bias));
}

}  // namespace exercise13
