// tensor.h — the Tensor handle.
//
// A Tensor is a cheap handle (a shared_ptr) to a TensorImpl: shape, dtype, device, a Storage, and
// the autograd fields (requires_grad, grad, grad_fn). Copying a Tensor copies the handle, not the
// data, as in PyTorch. Tensors are contiguous and row-major; ops that change the layout
// (transpose, permute, narrow, cat) copy and say so. reshape and flat_view share the storage.
//
// The ops themselves are free functions in tensor/ops.h (sl::matmul, sl::softmax, ...); the methods
// here are the handle's own business plus a few spellings PyTorch users expect (t.sum(), a + b).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/shape.h"
#include "tensor/storage.h"

namespace sl {

class Node;
class Tensor;
using PostAccumulateGradHook = std::function<void(Tensor& param)>;

struct TensorOptions {
  DType dtype = DType::f32;
  std::optional<Device> device;  // unset: the thread's current device
  bool requires_grad = false;

  TensorOptions() = default;
  TensorOptions(DType dtype, std::optional<Device> device = std::nullopt, bool requires_grad = false)  // NOLINT
      : dtype(dtype), device(device), requires_grad(requires_grad) {}

  TensorOptions with_dtype(DType d) const {
    auto o = *this;
    o.dtype = d;
    return o;
  }
  TensorOptions with_device(Device d) const {
    auto o = *this;
    o.device = d;
    return o;
  }
  TensorOptions with_requires_grad(bool r = true) const {
    auto o = *this;
    o.requires_grad = r;
    return o;
  }
  Device resolved_device() const { return device ? *device : current_device(); }
};

struct TensorImpl {
  Shape shape;
  DType dtype = DType::f32;
  std::shared_ptr<Storage> storage;
  int64_t storage_offset = 0;  // in elements (non-zero only for flat views)

  // Autograd. A leaf has no grad_fn; a tensor made by an op on tensors that need grad has one.
  bool requires_grad = false;            // set on leaves by the user
  std::shared_ptr<TensorImpl> grad;      // accumulated by backward (leaves only)
  std::shared_ptr<Node> grad_fn;         // the node that made this tensor
  int output_nr = 0;                     // which output of grad_fn this is
  std::weak_ptr<Node> grad_accumulator;  // a leaf's AccumulateGrad node, made on first use
  std::vector<PostAccumulateGradHook> post_accumulate_grad_hooks;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // An uninitialised tensor (the storage is allocated, the bytes are whatever was there).
  static Tensor empty(const Shape& shape, const TensorOptions& options = {});

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // ---- metadata --------------------------------------------------------------------------------
  const Shape& shape() const { return checked().shape; }
  int dim() const { return shape().dim(); }
  int64_t size(int dim) const;  // negative dims count from the end
  int64_t numel() const { return shape().numel(); }
  DType dtype() const { return checked().dtype; }
  Device device() const { return checked().storage->device(); }
  TensorOptions options() const { return TensorOptions{dtype(), device(), false}; }
  int64_t nbytes() const { return numel() * static_cast<int64_t>(dtype_size(dtype())); }

  // ---- data ------------------------------------------------------------------------------------
  // data<T>() and raw_data() point into host memory: CPU code reads and writes through them, so
  // they throw for a tensor on a GPU (move it with .to(Device::cpu()) first). data<T>() also checks
  // that T matches the dtype: t.data<float>() on an f64 tensor throws.
  template <typename T>
  T* data() const {
    SL_CHECK(dtype_of<T>::value == dtype(), "Tensor::data: asked for ", dtype_name(dtype_of<T>::value),
             " but the tensor is ", dtype_name(dtype()));
    return static_cast<T*>(raw_data());
  }
  void* raw_data() const;
  // The address of the first element on whatever device the tensor lives (a GPU pointer for cuda:i):
  // what CUDA kernels, cuBLAS and NCCL are handed.
  void* data_ptr() const;
  double item() const;                    // the value of a one-element tensor
  std::vector<double> to_vector() const;  // all values, converted to double (for tests, printing)
  template <typename T>
  std::vector<T> values() const {
    const T* p = data<T>();
    return {p, p + numel()};
  }

  // ---- copies and views ------------------------------------------------------------------------
  Tensor to(Device device) const;            // copies (counted by the ledger as a transfer); same device: self
  Tensor to(DType dtype) const;              // cast (differentiable); same dtype: self
  Tensor clone() const;                      // a copy with its own storage (differentiable)
  Tensor detach() const;                     // same storage, cut from the graph
  Tensor reshape(const Shape& shape) const;  // same storage; one size may be -1
  // A non-differentiable view of `shape` starting `offset` elements into this tensor's data (same
  // storage): how flat parameter and gradient buffers hand out per-parameter views.
  Tensor flat_view(int64_t offset, const Shape& shape) const;
  Tensor transpose(int dim0, int dim1) const;                   // copies
  Tensor permute(const std::vector<int>& dims) const;           // copies
  Tensor narrow(int dim, int64_t start, int64_t length) const;  // copies

  // ---- in-place (no autograd; for optimizers and communication buffers) -------------------------
  const Tensor& add_(const Tensor& other, double alpha = 1.0) const;  // this += alpha * other (same shape)
  const Tensor& mul_(double scale) const;                             // this *= scale
  const Tensor& copy_(const Tensor& source) const;                    // same shape; converts dtype
  const Tensor& fill_(double value) const;
  const Tensor& zero_() const { return fill_(0.0); }

  // ---- autograd --------------------------------------------------------------------------------
  bool requires_grad() const { return checked().requires_grad || checked().grad_fn != nullptr; }
  const Tensor& set_requires_grad(bool requires_grad = true) const;  // leaves only
  bool is_leaf() const { return checked().grad_fn == nullptr; }
  Tensor grad() const { return Tensor(checked().grad); }  // undefined until a backward reaches it
  void set_grad(const Tensor& grad) const;                // undefined Tensor clears it
  const std::shared_ptr<Node>& grad_fn() const { return checked().grad_fn; }
  // Backpropagates from this tensor. Without a gradient the tensor must hold one element.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  // Called after backward has accumulated this leaf's gradient for the pass (DDP and ZeRO use it).
  void register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const;

  // ---- conveniences --------------------------------------------------------------------------------
  Tensor sum() const;
  Tensor mean() const;
  Tensor sum(int dim, bool keepdim = false) const;
  Tensor mean(int dim, bool keepdim = false) const;
  std::string str() const;  // PyTorch-style repr: tensor([[1.0000, 2.0000]], requires_grad=True)

 private:
  TensorImpl& checked() const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

using TensorList = std::vector<Tensor>;

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
Tensor operator-(const Tensor& a);

}  // namespace sl
