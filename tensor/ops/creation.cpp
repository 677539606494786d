// creation.cpp — tensors from nothing: constants, ranges, values, and Philox random draws.
#include <cmath>

#include "autograd/grad_mode.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"

namespace sl {

Tensor full(const Shape& shape, double value, const TensorOptions& options) {
  bool requires_grad = options.requires_grad;
  Tensor t = Tensor::empty(shape, options.with_requires_grad(false));
  t.fill_(value);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}
Tensor zeros(const Shape& shape, const TensorOptions& options) { return full(shape, 0.0, options); }
Tensor ones(const Shape& shape, const TensorOptions& options) { return full(shape, 1.0, options); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.options()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.options()); }
Tensor scalar_tensor(double value, const TensorOptions& options) { return full(Shape{}, value, options); }

Tensor arange(int64_t end, const TensorOptions& options) { return arange(0.0, static_cast<double>(end), 1.0, options); }

Tensor arange(double start, double end, double step, const TensorOptions& options) {
  SL_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step), "arange: start ", start, ", end ", end,
           " and step ", step, " must be finite");
  SL_CHECK(step != 0, "arange: step must not be zero");
  SL_CHECK((end - start) / step >= 0, "arange: start ", start, ", end ", end, " and step ", step, " give no values");
  // Checked as a double, before the cast to an integer (which is undefined past int64's range).
  constexpr double kMaxCount = 1099511627776.0;  // 2^40 elements
  double steps = std::ceil((end - start) / step);
  SL_CHECK(steps < kMaxCount, "arange: start ", start, ", end ", end, " and step ", step, " give ", steps,
           " values (at most 2^40)");
  auto count = static_cast<int64_t>(steps);
  std::vector<double> values(count);
  for (int64_t i = 0; i < count; ++i) values[i] = start + static_cast<double>(i) * step;
  return from_vector(values, Shape{count}, options);
}

namespace {

// A tensor of `shape` whose values `write(host tensor)` sets on the host. For a GPU tensor they are
// written to a host buffer first and copied over once (values, ranges and random draws are made
// on the CPU: the same numbers on every device). Not recorded as a transfer; the host buffer is
// charged to cpu:0 while it lives.
template <typename Write>
Tensor made_on_host(const Shape& shape, const TensorOptions& options, Write&& write) {
  Tensor t = Tensor::empty(shape, options.with_requires_grad(false));
  if (t.device().is_cuda()) {
    Tensor host = Tensor::empty(shape, options.with_requires_grad(false).with_device(Device::cpu()));
    write(host);
    cuda::copy(t.data_ptr(), t.device(), host.data_ptr(), Device::cpu(), static_cast<size_t>(t.nbytes()));
  } else {
    write(t);
  }
  if (options.requires_grad) t.set_requires_grad(true);
  return t;
}

}  // namespace

Tensor from_vector(const std::vector<double>& values, const Shape& shape, const TensorOptions& options) {
  SL_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "from_vector: ", values.size(),
           " values cannot fill shape ", shape, " (", shape.numel(), " elements)");
  return made_on_host(shape, options, [&](const Tensor& t) {
    dispatch_all(t.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T* p = t.data<T>();
      for (size_t i = 0; i < values.size(); ++i) p[i] = static_cast<T>(static_cast<compute_t<T>>(values[i]));
    });
  });
}

// ---- random ----------------------------------------------------------------------------------------
//
// Element with flat index i of the full tensor uses Philox counter (first + i), where first is the
// generator's offset before the draw. A region walks its own elements, computes each one's flat
// index in the full tensor, and so reproduces exactly those values.

namespace {

enum class Distribution { uniform, normal };

Tensor draw_region(const Shape& full_shape, const Shape& starts, const Shape& sizes, const TensorOptions& options,
                   Generator* generator, Distribution distribution, const char* op) {
  SL_CHECK(starts.size() == full_shape.size() && sizes.size() == full_shape.size(), op, ": starts ", starts,
           " and sizes ", sizes, " must have one entry per dim of ", full_shape);
  for (int d = 0; d < full_shape.dim(); ++d)
    SL_CHECK(starts[d] >= 0 && sizes[d] >= 0 && starts[d] + sizes[d] <= full_shape[d], op, ": region starts ", starts,
             " sizes ", sizes, " does not fit in shape ", full_shape, " (dim ", d, ")");
  Generator& gen = generator ? *generator : default_generator();
  uint64_t first = gen.advance(static_cast<uint64_t>(full_shape.numel()));
  uint64_t key = gen.seed();
  std::vector<int64_t> full_strides = contiguous_strides(full_shape);
  require_floating(options.dtype, op);
  return made_on_host(sizes, options, [&](const Tensor& t) {
    dispatch_floating(t.dtype(), op, [&](auto tag) {
      using T = decltype(tag);
      T* out = t.data<T>();
      std::vector<int64_t> index(sizes.size(), 0);  // position inside the region
      for (int64_t i = 0, n = sizes.numel(); i < n; ++i) {
        int64_t flat = 0;
        for (int d = 0; d < sizes.dim(); ++d) flat += (starts[d] + index[d]) * full_strides[d];
        uint64_t counter = first + static_cast<uint64_t>(flat);
        double value = distribution == Distribution::normal ? philox_normal(counter, key)
                                                            : static_cast<double>(philox_uniform(counter, key));
        out[i] = static_cast<T>(static_cast<compute_t<T>>(value));
        for (int d = sizes.dim() - 1; d >= 0; --d) {  // odometer increment of the region index
          if (++index[d] < sizes[d]) break;
          index[d] = 0;
        }
      }
    });
  });
}

}  // namespace

Tensor rand(const Shape& shape, const TensorOptions& options, Generator* generator) {
  return draw_region(shape, Shape(shape.size(), 0), shape, options, generator, Distribution::uniform, "rand");
}
Tensor randn(const Shape& shape, const TensorOptions& options, Generator* generator) {
  return draw_region(shape, Shape(shape.size(), 0), shape, options, generator, Distribution::normal, "randn");
}
Tensor rand_region(const Shape& full_shape, const Shape& starts, const Shape& sizes, const TensorOptions& options,
                   Generator* generator) {
  return draw_region(full_shape, starts, sizes, options, generator, Distribution::uniform, "rand_region");
}
Tensor randn_region(const Shape& full_shape, const Shape& starts, const Shape& sizes, const TensorOptions& options,
                    Generator* generator) {
  return draw_region(full_shape, starts, sizes, options, generator, Distribution::normal, "randn_region");
}

}  // namespace sl
