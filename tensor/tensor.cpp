// tensor.cpp — the handle's own methods; the math lives in tensor/ops/.
#include "tensor/tensor.h"

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"

namespace sl {

Tensor Tensor::empty(const Shape& shape, const TensorOptions& options) {
  for (int64_t size : shape) SL_CHECK(size >= 0, "empty: negative size in shape ", shape);
  // Shape::numel() multiplies the sizes unchecked ([2^32, 2^32] would wrap to 0 elements): check
  // that product, as numel() forms it, and the byte count, before anything uses either.
  int64_t numel = 1, bytes = 0;
  for (int64_t size : shape)
    SL_CHECK(!__builtin_mul_overflow(numel, size, &numel), "empty: the sizes of shape ", shape,
             " multiply past int64 (too many elements)");
  const auto element_size = static_cast<int64_t>(dtype_size(options.dtype));
  SL_CHECK(!__builtin_mul_overflow(numel, element_size, &bytes), "empty: shape ", shape, " is too large: ", numel,
           " elements x ", element_size, " bytes (", dtype_name(options.dtype), ") overflows int64");
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = options.dtype;
  impl->storage = std::make_shared<Storage>(bytes, options.resolved_device());
  Tensor t(std::move(impl));
  if (options.requires_grad) t.set_requires_grad(true);
  return t;
}

TensorImpl& Tensor::checked() const {
  SL_CHECK(impl_ != nullptr,
           "Tensor: this tensor is undefined (default-constructed, or a gradient that was never computed)");
  return *impl_;
}

int64_t Tensor::size(int dim) const { return shape()[normalize_dim(dim, shape(), "size")]; }

void* Tensor::data_ptr() const {
  TensorImpl& impl = checked();
  return static_cast<char*>(impl.storage->data()) + impl.storage_offset * static_cast<int64_t>(dtype_size(impl.dtype));
}

void* Tensor::raw_data() const {
  SL_CHECK(device().is_cpu(), "Tensor: a tensor of shape ", shape(), " on ", device(),
           " is in GPU memory, which host code cannot read; this op has no CUDA path for it, or call "
           ".to(Device::cpu()) first");
  return data_ptr();
}

double Tensor::item() const {
  SL_CHECK(numel() == 1, "item: expected a tensor with one element but got shape ", shape());
  return to_vector()[0];
}

std::vector<double> Tensor::to_vector() const {
  if (device().is_cuda()) return detach().to(Device::cpu()).to_vector();  // waits for the GPU
  std::vector<double> out(numel());
  dispatch_all(dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(raw_data());
    for (int64_t i = 0; i < numel(); ++i) out[i] = static_cast<double>(static_cast<compute_t<T>>(p[i]));
  });
  return out;
}

Tensor Tensor::to(Device target) const { return target == device() ? *this : to_device(*this, target); }
Tensor Tensor::to(DType target) const { return target == dtype() ? *this : cast(*this, target); }

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape();
  impl->dtype = dtype();
  impl->storage = checked().storage;
  impl->storage_offset = checked().storage_offset;
  return Tensor(std::move(impl));
}

Tensor Tensor::flat_view(int64_t offset, const Shape& view_shape) const {
  SL_CHECK(offset >= 0 && offset + view_shape.numel() <= numel(), "flat_view: a view of shape ", view_shape,
           " at offset ", offset, " does not fit in a tensor of ", numel(), " elements (shape ", shape(), ")");
  Tensor view = detach();
  view.impl()->shape = view_shape;
  view.impl()->storage_offset += offset;
  return view;
}

Tensor Tensor::reshape(const Shape& s) const { return sl::reshape(*this, s); }
Tensor Tensor::transpose(int d0, int d1) const { return sl::transpose(*this, d0, d1); }
Tensor Tensor::permute(const std::vector<int>& dims) const { return sl::permute(*this, dims); }
Tensor Tensor::narrow(int dim, int64_t start, int64_t length) const { return sl::narrow(*this, dim, start, length); }
Tensor Tensor::sum() const { return sl::sum(*this); }
Tensor Tensor::mean() const { return sl::mean(*this); }
Tensor Tensor::sum(int dim, bool keepdim) const { return sl::sum(*this, dim, keepdim); }
Tensor Tensor::mean(int dim, bool keepdim) const { return sl::mean(*this, dim, keepdim); }

// ---- in-place -------------------------------------------------------------------------------------

namespace {
void check_inplace(const Tensor& t, const char* op) {
  SL_CHECK(!(t.is_leaf() && t.requires_grad() && GradMode::is_enabled()), op,
           ": a leaf tensor that requires grad (shape ", t.shape(),
           ") cannot be modified in place while grad mode is on (wrap the update in sl::NoGradGuard)");
}
}  // namespace

const Tensor& Tensor::add_(const Tensor& other, double alpha) const {
  check_inplace(*this, "add_");
  SL_CHECK(other.shape() == shape(), "add_: shapes ", shape(), " and ", other.shape(), " differ");
  SL_CHECK(other.device() == device(), "add_: tensors on ", device(), " and ", other.device());
  Tensor source = other.to(dtype());
  if (device().is_cuda()) {
    require_floating(dtype(), "add_");
    cuda::add_scaled(*this, source, alpha);
    return *this;
  }
  dispatch_floating(dtype(), "add_", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    T* y = data<T>();
    const T* x = source.data<T>();
    C a = static_cast<C>(alpha);
    for (int64_t i = 0, n = numel(); i < n; ++i) y[i] = static_cast<T>(static_cast<C>(y[i]) + a * static_cast<C>(x[i]));
  });
  return *this;
}

const Tensor& Tensor::mul_(double scale) const {
  check_inplace(*this, "mul_");
  if (device().is_cuda()) {
    require_floating(dtype(), "mul_");
    cuda::scale(*this, scale);
    return *this;
  }
  dispatch_floating(dtype(), "mul_", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    T* y = data<T>();
    for (int64_t i = 0, n = numel(); i < n; ++i) y[i] = static_cast<T>(static_cast<C>(y[i]) * static_cast<C>(scale));
  });
  return *this;
}

const Tensor& Tensor::copy_(const Tensor& source) const {
  check_inplace(*this, "copy_");
  SL_CHECK(source.shape() == shape(), "copy_: shapes ", shape(), " and ", source.shape(), " differ");
  Tensor converted = source.detach().to(device()).to(dtype());
  if (device().is_cuda())
    cuda::copy(data_ptr(), device(), converted.data_ptr(), device(), static_cast<size_t>(nbytes()));
  else
    std::memcpy(raw_data(), converted.raw_data(), static_cast<size_t>(nbytes()));
  return *this;
}

const Tensor& Tensor::fill_(double value) const {
  check_inplace(*this, "fill_");
  if (device().is_cuda()) {
    cuda::fill(*this, value);
    return *this;
  }
  dispatch_all(dtype(), [&](auto tag) {
    using T = decltype(tag);
    T v = static_cast<T>(static_cast<compute_t<T>>(value));
    T* p = data<T>();
    for (int64_t i = 0, n = numel(); i < n; ++i) p[i] = v;
  });
  return *this;
}

// ---- autograd -------------------------------------------------------------------------------------

const Tensor& Tensor::set_requires_grad(bool requires_grad) const {
  SL_CHECK(is_leaf(), "set_requires_grad: only leaf tensors can be marked (this one was made by ",
           grad_fn() ? "an op" : "?", "; use detach() first)");
  SL_CHECK(!requires_grad || is_floating(dtype()), "set_requires_grad: only floating tensors can require grad (got ",
           dtype_name(dtype()), ")");
  checked().requires_grad = requires_grad;
  return *this;
}

void Tensor::set_grad(const Tensor& grad) const {
  if (grad.defined())
    SL_CHECK(grad.shape() == shape(), "set_grad: gradient of shape ", grad.shape(), " for a tensor of shape ", shape());
  checked().grad = grad.impl_ptr();
}

void Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const {
  SL_CHECK(is_leaf() && requires_grad(),
           "register_post_accumulate_grad_hook: only leaf tensors that require grad "
           "accumulate gradients (shape ",
           shape(), ")");
  checked().post_accumulate_grad_hooks.push_back(std::move(hook));
}

// ---- operators ------------------------------------------------------------------------------------

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return div(a, b); }
Tensor operator+(double a, const Tensor& b) { return add(a, b); }
Tensor operator-(double a, const Tensor& b) { return sub(a, b); }
Tensor operator*(double a, const Tensor& b) { return mul(a, b); }
Tensor operator/(double a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }

}  // namespace sl
