// exercises/13_zero_bubble_split/split_linear.h — the interface student.cpp implements and grader.cpp drives.
//
// One Linear y [N, out] = x [N, in] · Wᵀ + b (N = B·T rows) whose backward is split in two, the way a
// zero-bubble pipeline stage runs it:
//
//   F(micro)      forward(micro, x)    y [N, out]; keep x for later
//   B(micro)      backward_b(micro, dy)  dX [N, in] now (the previous stage waits for it); keep dy
//   W(micro)      backward_w(micro)      weight.grad += dW [out, in], bias.grad += db [out]; forget micro
//
// Several micro-batches can wait between B and W at once (ZB-H1's rank r keeps r of them), and their
// W's may run in any order: each micro-batch keeps its own x and dy.
#pragma once
#include <cstddef>
#include <memory>

#include "tensor/tensor.h"

namespace exercise13 {

class SplitLinear {
 public:
  // weight [out, in] and bias [out]: leaves (requires_grad) whose .grad W accumulates into.
  SplitLinear(sl::Tensor weight, sl::Tensor bias) : weight(std::move(weight)), bias(std::move(bias)) {}
  virtual ~SplitLinear() = default;

  virtual sl::Tensor forward(int micro, const sl::Tensor& x) = 0;
  virtual sl::Tensor backward_b(int micro, const sl::Tensor& dy) = 0;
  virtual void backward_w(int micro) = 0;
  // Micro-batches whose forward ran and whose W has not run yet.
  virtual size_t waiting() const = 0;

  sl::Tensor weight, bias;
};

// student.cpp's (or, with SL_SOLUTION, the library's through DeferredGrads).
std::unique_ptr<SplitLinear> make_split_linear(sl::Tensor weight, sl::Tensor bias);

}  // namespace exercise13
