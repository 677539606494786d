// layout.cpp — ops that move elements without changing them: reshape, transpose, permute, narrow,
// cat, split and chunk.
//
// Tensors are contiguous and row-major, so only reshape can be a view (same storage, new shape);
// the others copy into a new contiguous tensor. None of them looks at values, so the kernels move
// bytes and work for every dtype, integers included (which carry no gradient). Each backward is the
// inverse layout op:
//
//   reshape     <-> reshape back            transpose(d0, d1) <-> transpose(d0, d1)
//   permute(p)  <-> permute(p^-1)           narrow            <-> the gradient written into zeros
//   cat         <-> split                   split / chunk     <-> cat (a missing gradient is zeros)
//
// narrow, cat and split see a tensor as [outer, size(dim), inner] and copy `outer` runs of
// contiguous bytes. permute and transpose copy with tensor/cpu/permute.cpp: a planned loop nest,
// where attention's [B,T,NH,HS] <-> [B,NH,T,HS] is B*NH*T memcpy runs of HS elements and a
// transpose of the last two dims a tiled 2-D transpose.
#include <algorithm>
#include <cstring>

#include "autograd/function.h"
#include "tensor/cpu/permute.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"

namespace sl {

namespace {

std::string dims_str(const std::vector<int>& dims) { return Shape(dims.begin(), dims.end()).str(); }

// Gradients arrive in the output's dtype; the byte copies below rely on it, so convert any that do not.
Tensor in_dtype(const Tensor& grad, DType dtype) { return grad.dtype() == dtype ? grad : grad.to(dtype); }

// ---- [outer, size(dim), inner] slab copies (narrow, cat, split) ---------------------------------------

struct Slabs {
  int64_t outer = 1;        // product of the sizes before dim
  int64_t inner_bytes = 0;  // bytes of one step along dim (product of the sizes after dim)
};

Slabs slabs_around(const Shape& shape, int dim, DType dtype) {
  Slabs s;
  int64_t inner = 1;
  for (int d = 0; d < dim; ++d) s.outer *= shape[d];
  for (int d = dim + 1; d < shape.dim(); ++d) inner *= shape[d];
  s.inner_bytes = inner * static_cast<int64_t>(dtype_size(dtype));
  return s;
}

// Copies dim-range [src_start, src_start + length) of src (src_size long along dim) to
// [dst_start, dst_start + length) of dst (dst_size long); an undefined src writes zeros instead.
// On a GPU the `outer` runs are one strided 2-D copy (cuda::copy_rows).
void copy_slab(const Slabs& s, const Tensor& src, int64_t src_size, int64_t src_start, const Tensor& dst,
               int64_t dst_size, int64_t dst_start, int64_t length) {
  int64_t run = length * s.inner_bytes;
  if (run == 0 || s.outer == 0) return;
  const char* from = src.defined() ? static_cast<const char*>(src.data_ptr()) + src_start * s.inner_bytes : nullptr;
  char* to = static_cast<char*>(dst.data_ptr()) + dst_start * s.inner_bytes;
  if (dst.device().is_cuda()) {
    cuda::copy_rows(to, dst_size * s.inner_bytes, from, src_size * s.inner_bytes, run, s.outer, dst.device().index);
    return;
  }
  for (int64_t o = 0; o < s.outer; ++o) {
    if (from)
      std::memcpy(to + o * dst_size * s.inner_bytes, from + o * src_size * s.inner_bytes, static_cast<size_t>(run));
    else
      std::memset(to + o * dst_size * s.inner_bytes, 0, static_cast<size_t>(run));
  }
}

// x split along dim into pieces of `sizes` (their sum is x.size(dim)); an unwanted piece is left
// undefined (wanted empty: all are wanted).
TensorList split_pieces(const Tensor& x, const std::vector<int64_t>& sizes, int dim, const std::vector<bool>& wanted) {
  Slabs s = slabs_around(x.shape(), dim, x.dtype());
  TensorList pieces(sizes.size());
  int64_t start = 0;
  for (size_t i = 0; i < sizes.size(); start += sizes[i], ++i) {
    if (!wanted.empty() && !wanted[i]) continue;
    Shape shape = x.shape();
    shape[dim] = sizes[i];
    pieces[i] = Tensor::empty(shape, x.options());
    copy_slab(s, x, x.size(dim), start, pieces[i], sizes[i], 0, sizes[i]);
  }
  return pieces;
}

// The pieces joined along dim into a tensor of `shape`; an undefined piece i stands for zeros of
// size sizes[i] (an output of split whose gradient never arrived).
Tensor cat_pieces(const TensorList& pieces, const std::vector<int64_t>& sizes, const Shape& shape, int dim,
                  const TensorOptions& options) {
  Tensor out = Tensor::empty(shape, options);
  Slabs s = slabs_around(shape, dim, options.dtype);
  int64_t start = 0;
  for (size_t i = 0; i < pieces.size(); start += sizes[i], ++i) {
    Tensor piece = pieces[i].defined() ? in_dtype(pieces[i], options.dtype) : Tensor();
    copy_slab(s, piece, sizes[i], 0, out, shape[dim], start, sizes[i]);
  }
  return out;
}

// ---- permute: the copy is tensor/cpu/permute.cpp ---------------------------------------------------------

// x [...] -> out [x.shape permuted by perm] (perm already checked).
Tensor permute_copy(const Tensor& x, const std::vector<int>& perm) {
  Shape shape(perm.size());
  for (size_t k = 0; k < perm.size(); ++k) shape[k] = x.shape()[perm[k]];
  Tensor out = Tensor::empty(shape, x.options());
  if (out.numel() == 0) return out;
  if (x.device().is_cuda())
    cuda::permute(x, perm, out);
  else
    cpu::permute_copy(x.raw_data(), x.shape(), perm, out.raw_data(), dtype_size(x.dtype()));
  return out;
}

// ---- the differentiable ops -----------------------------------------------------------------------------

// A view: same storage, new shape. Backward reshapes the gradient back.
struct ReshapeFn : Function<ReshapeFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const Shape& shape) {
    ctx.set("shape", x.shape());
    Tensor view = x.detach();
    view.impl()->shape = shape;
    return view;
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {reshape(grads[0], ctx.get<Shape>("shape"))};
  }
};

struct PermuteFn : Function<PermuteFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const std::vector<int>& perm) {
    std::vector<int> inverse(perm.size());
    for (size_t k = 0; k < perm.size(); ++k) inverse[perm[k]] = static_cast<int>(k);
    ctx.set("inverse", inverse);
    return permute_copy(x, perm);
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {permute_copy(grads[0], ctx.get<std::vector<int>>("inverse"))};
  }
};

// A swap of two dims is its own inverse.
struct TransposeFn : Function<TransposeFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const std::vector<int>& swap) {
    ctx.set("swap", swap);
    return permute_copy(x, swap);
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {permute_copy(grads[0], ctx.get<std::vector<int>>("swap"))};
  }
};

struct NarrowFn : Function<NarrowFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, int dim, int64_t start, int64_t length) {
    ctx.set("shape", x.shape());
    ctx.set("dim", dim);
    ctx.set("start", start);
    Shape shape = x.shape();
    shape[dim] = length;
    Tensor out = Tensor::empty(shape, x.options());
    copy_slab(slabs_around(x.shape(), dim, x.dtype()), x, x.size(dim), start, out, length, 0, length);
    return out;
  }
  // grad_x is zero outside the slice and grad inside it.
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const Shape& shape = ctx.get<Shape>("shape");
    int dim = ctx.get<int>("dim");
    int64_t start = ctx.get<int64_t>("start"), length = grads[0].size(dim);
    Tensor grad_x = zeros(shape, grads[0].options());
    copy_slab(slabs_around(shape, dim, grad_x.dtype()), grads[0], length, 0, grad_x, shape[dim], start, length);
    return {grad_x};
  }
};

struct CatFn : Function<CatFn> {
  static Tensor forward(FunctionCtx& ctx, const TensorList& tensors, int dim) {
    std::vector<int64_t> sizes;
    for (const Tensor& t : tensors) sizes.push_back(t.size(dim));
    Shape shape = tensors[0].shape();
    shape[dim] = 0;
    for (int64_t size : sizes) shape[dim] += size;
    ctx.set("sizes", sizes);
    ctx.set("dim", dim);
    return cat_pieces(tensors, sizes, shape, dim, tensors[0].options());
  }
  // One gradient per input: the matching slice of grad (cat({x, x}) sends x two, which add up).
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const auto& sizes = ctx.get<std::vector<int64_t>>("sizes");
    std::vector<bool> wanted(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) wanted[i] = ctx.needs_input_grad(i);
    return split_pieces(grads[0], sizes, ctx.get<int>("dim"), wanted);
  }
};

// split and chunk: one node with one output per piece.
struct SplitFn : Function<SplitFn> {
  static TensorList forward(FunctionCtx& ctx, const Tensor& x, const std::vector<int64_t>& sizes, int dim) {
    ctx.set("shape", x.shape());
    ctx.set("sizes", sizes);
    ctx.set("dim", dim);
    ctx.set("dtype", x.dtype());
    return split_pieces(x, sizes, dim, {});
  }
  // Pieces nobody used get no gradient: they count as zeros.
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    TensorOptions options{ctx.get<DType>("dtype"), std::nullopt, false};
    for (const Tensor& g : grads)
      if (g.defined()) options.device = g.device();
    return {cat_pieces(grads, ctx.get<std::vector<int64_t>>("sizes"), ctx.get<Shape>("shape"), ctx.get<int>("dim"),
                       options)};
  }
};

}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  Shape target = shape;
  int inferred = -1;
  int64_t known = 1;
  for (int d = 0; d < target.dim(); ++d) {
    if (target[d] == -1) {
      SL_CHECK(inferred < 0, "reshape: only one size may be -1 (asked for ", shape, " from ", x.shape(), ")");
      inferred = d;
    } else {
      SL_CHECK(target[d] >= 0, "reshape: invalid size ", target[d], " in shape ", shape);
      known *= target[d];
    }
  }
  if (inferred >= 0) {
    SL_CHECK(known != 0 && x.numel() % known == 0, "reshape: cannot reshape a tensor of shape ", x.shape(), " (",
             x.numel(), " elements) into shape ", shape, " (the other sizes multiply to ", known, ")");
    target[inferred] = x.numel() / known;
  }
  SL_CHECK(target.numel() == x.numel(), "reshape: cannot reshape a tensor of shape ", x.shape(), " (", x.numel(),
           " elements) into shape ", shape, " (", target.numel(), " elements)");
  return ReshapeFn::apply(x, target);
}

Tensor permute(const Tensor& x, const std::vector<int>& dims) {
  SL_CHECK(static_cast<int>(dims.size()) == x.dim(), "permute: dims ", dims_str(dims), " are not a permutation of the ",
           x.dim(), " dims of a tensor of shape ", x.shape());
  std::vector<int> perm(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t k = 0; k < dims.size(); ++k) {
    int ndim = x.dim();
    SL_CHECK(dims[k] >= -ndim && dims[k] < ndim && !seen[dims[k] < 0 ? dims[k] + ndim : dims[k]], "permute: dims ",
             dims_str(dims), " are not a permutation of the ", ndim, " dims of a tensor of shape ", x.shape());
    perm[k] = dims[k] < 0 ? dims[k] + ndim : dims[k];
    seen[perm[k]] = true;
  }
  return PermuteFn::apply(x, perm);
}

Tensor transpose(const Tensor& x, int dim0, int dim1) {
  int d0 = normalize_dim(dim0, x.shape(), "transpose"), d1 = normalize_dim(dim1, x.shape(), "transpose");
  std::vector<int> swap(x.dim());
  for (int d = 0; d < x.dim(); ++d) swap[d] = d;
  std::swap(swap[d0], swap[d1]);
  return TransposeFn::apply(x, swap);
}

Tensor narrow(const Tensor& x, int dim, int64_t start, int64_t length) {
  int d = normalize_dim(dim, x.shape(), "narrow");
  int64_t size = x.size(d);
  SL_CHECK(start >= -size && start <= size, "narrow: start ", start, " is out of range for dim ", dim, " of size ",
           size, " (shape ", x.shape(), ")");
  if (start < 0) start += size;
  SL_CHECK(length >= 0 && start + length <= size, "narrow: start ", start, " + length ", length,
           " does not fit in dim ", dim, " of size ", size, " (shape ", x.shape(), ")");
  return NarrowFn::apply(x, d, start, length);
}

Tensor cat(const std::vector<Tensor>& tensors, int dim) {
  SL_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) SL_CHECK(tensors[i].defined(), "cat: tensor ", i, " is undefined");
  const Tensor& first = tensors[0];
  int d = normalize_dim(dim, first.shape(), "cat");
  for (size_t i = 1; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    SL_CHECK(t.dtype() == first.dtype(), "cat: tensor ", i, " has dtype ", dtype_name(t.dtype()),
             " but tensor 0 has dtype ", dtype_name(first.dtype()));
    SL_CHECK(t.device() == first.device(), "cat: tensor ", i, " is on ", t.device(), " but tensor 0 is on ",
             first.device());
    bool match = t.dim() == first.dim();
    for (int k = 0; match && k < first.dim(); ++k) match = k == d || t.shape()[k] == first.shape()[k];
    SL_CHECK(match, "cat: tensor ", i, " has shape ", t.shape(), " but tensor 0 has shape ", first.shape(),
             " (sizes must match except in dim ", dim, ")");
  }
  return CatFn::apply(tensors, d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int dim) {
  int d = normalize_dim(dim, x.shape(), "split");
  int64_t total = 0;
  for (int64_t size : sizes) {
    SL_CHECK(size >= 0, "split: negative size in ", Shape(sizes));
    total += size;
  }
  SL_CHECK(!sizes.empty() && total == x.size(d), "split: sizes ", Shape(sizes), " sum to ", total, " but dim ", dim,
           " of shape ", x.shape(), " has size ", x.size(d));
  return SplitFn::apply(x, sizes, d);
}

std::vector<Tensor> split(const Tensor& x, int64_t size, int dim) {
  int d = normalize_dim(dim, x.shape(), "split");
  SL_CHECK(size > 0, "split: split size must be positive (got ", size, ") for shape ", x.shape());
  int64_t n = x.size(d);
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < n; start += size) sizes.push_back(std::min(size, n - start));
  if (sizes.empty()) sizes.push_back(0);  // an empty dim splits into one empty piece
  return split(x, sizes, d);
}

// Like PyTorch: pieces of ceil(n / chunks), so there may be fewer than `chunks` of them.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int dim) {
  int d = normalize_dim(dim, x.shape(), "chunk");
  SL_CHECK(chunks > 0, "chunk: number of chunks must be positive (got ", chunks, ") for shape ", x.shape());
  int64_t n = x.size(d);
  if (n == 0) return split(x, std::vector<int64_t>(chunks, 0), d);
  return split(x, (n + chunks - 1) / chunks, d);
}

}  // namespace sl
