// exercises/13_zero_bubble_split/wrong_one_input_slot.cpp — a wrong split: x kept in one slot, as a plain layer does.
//
// A common mistake: saving the forward's input in a single member, as a Linear that runs forward
// then backward would. Between B and W several micro-batches wait (ZB-H1's rank r keeps r of them),
// and each later forward overwrites the slot: W of micro-batch 0 then pairs its own dy with the
// last micro-batch's x. With one micro-batch at a time it looks right.
// expect: the stored input was overwritten by a later forward
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
    x_ = x;  // the mistake: one slot for every micro-batch's input
    waiting_[micro] = Tensor();
    return linear(x, weight, bias);
  }

  Tensor backward_b(int micro, const Tensor& dy) override {
    NoGradGuard no_grad;
    auto it = waiting_.find(micro);
    SL_CHECK(it != waiting_.end() && !it->second.defined(), "backward_b: micro-batch ", micro, " has no forward");
    it->second = dy;
    return matmul(dy, weight);
  }

  void backward_w(int micro) override {
    NoGradGuard no_grad;
    auto it = waiting_.find(micro);
    SL_CHECK(it != waiting_.end() && it->second.defined(), "backward_w: micro-batch ", micro, " has no B waiting");
    const Tensor& dy = it->second;
    add_into(weight, matmul(dy, x_, true, false));  // dyᵀ [out, N] · x [N, in], but whose x?
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
  Tensor x_;
  std::map<int, Tensor> waiting_;  // micro-batch -> dy (undefined until its B ran)
};

std::unique_ptr<SplitLinear> make_split_linear(Tensor weight, Tensor bias) {
  return std::make_unique<StudentSplitLinear>(std::move(weight), std::move(bias));
}

}  // namespace exercise13
