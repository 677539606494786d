// print.cpp — how a tensor looks (Tensor::str, operator<<), and the comparisons tests use
// (allclose, max_abs_diff).
//
//   tensor([[ 1.0000, -2.0000],
//           [ 3.0000,  4.0000]], dtype=f64, requires_grad=True)
//
// The layout is PyTorch's repr:
//   - floating values show 4 decimals, integers none; every element is padded to the widest one
//     and a row wraps before 80 columns;
//   - scientific notation (1.0000e+08) when, over the nonzero finite values shown, max/min > 1000,
//     max > 1e8 or min < 1e-4 (PyTorch's rule);
//   - more than 1000 elements: only the first and last 3 entries of each dim, "..." between;
//   - suffixes: device when not cpu:0, dtype when not f32 or i64 (dtype names are shardlab's:
//     f64, bf16, i32), then grad_fn=<MulBackward> for a result or requires_grad=True for a leaf.
// One difference: PyTorch prints whole-valued floats as "1."; shardlab always shows the decimals
// ("1.0000"), so a float tensor never reads like an integer one.
#include <cmath>
#include <cstdio>

#include "autograd/node.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/ops.h"

namespace sl {

namespace {

constexpr int kPrecision = 4;
constexpr int64_t kEdgeItems = 3;
constexpr int64_t kSummariseAbove = 1000;  // elements
constexpr int kLineWidth = 80;
constexpr int64_t kEllipsis = -1;  // marks "..." in a list of shown indices

class Printer {
 public:
  explicit Printer(const Tensor& t)
      : t_(t),
        strides_(contiguous_strides(t.shape())),
        summarise_(t.numel() > kSummariseAbove),
        floating_(is_floating(t.dtype())) {
    choose_format();
  }

  std::string scalar() const { return text(0); }
  std::string body(int indent) const { return render(0, 0, indent); }

 private:
  // The indices of `dim` that are printed, with kEllipsis where the middle is left out.
  std::vector<int64_t> shown(int dim) const {
    int64_t n = t_.shape()[dim];
    std::vector<int64_t> indices;
    bool cut = summarise_ && n > 2 * kEdgeItems;
    for (int64_t i = 0; i < n; ++i) {
      if (cut && i == kEdgeItems) {
        indices.push_back(kEllipsis);
        i = n - kEdgeItems;
      }
      indices.push_back(i);
    }
    return indices;
  }

  // Calls f(flat index) for every element that is printed.
  template <typename F>
  void for_each_shown(int dim, int64_t offset, F&& f) const {
    if (dim == t_.dim()) return f(offset);
    for (int64_t i : shown(dim))
      if (i != kEllipsis) for_each_shown(dim + 1, offset + i * strides_[dim], f);
  }

  double value(int64_t flat) const {
    return dispatch_all(t_.dtype(), [&](auto tag) {
      using T = decltype(tag);
      return static_cast<double>(static_cast<compute_t<T>>(static_cast<const T*>(t_.raw_data())[flat]));
    });
  }

  int64_t integer(int64_t flat) const {
    return t_.dtype() == DType::i32 ? static_cast<const int32_t*>(t_.raw_data())[flat]
                                    : static_cast<const int64_t*>(t_.raw_data())[flat];
  }

  // PyTorch's rule, over the nonzero finite values that are shown.
  void choose_format() {
    if (floating_ && t_.numel() > 0) {
      double smallest = INFINITY, largest = 0;
      for_each_shown(0, 0, [&](int64_t flat) {
        double magnitude = std::abs(value(flat));
        if (magnitude == 0 || !std::isfinite(magnitude)) return;
        smallest = std::min(smallest, magnitude);
        largest = std::max(largest, magnitude);
      });
      scientific_ = largest > 0 && (largest / smallest > 1000.0 || largest > 1e8 || smallest < 1e-4);
    }
    if (t_.numel() > 0) for_each_shown(0, 0, [&](int64_t flat) { width_ = std::max(width_, text(flat).size()); });
  }

  std::string text(int64_t flat) const {
    if (!floating_) return std::to_string(integer(flat));
    double v = value(flat);
    if (std::isnan(v)) return "nan";  // printf may write "-nan"
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    char buffer[400];  // %.4f of the largest double is ~315 characters
    std::snprintf(buffer, sizeof buffer, scientific_ ? "%.*e" : "%.*f", kPrecision, v);
    return buffer;
  }

  std::string padded(int64_t flat) const {
    std::string s = text(flat);
    return std::string(width_ - std::min(width_, s.size()), ' ') + s;
  }

  // The sub-tensor at `offset` from `dim` on; `indent` is the column its "[" sits at.
  std::string render(int dim, int64_t offset, int indent) const {
    std::vector<int64_t> indices = shown(dim);
    std::string out = "[";
    if (dim == t_.dim() - 1) {  // a row: elements, wrapped to the line width
      int per_line = std::max(1, (kLineWidth - indent) / static_cast<int>(width_ + 2));
      for (size_t k = 0; k < indices.size(); ++k) {
        if (k > 0) out += k % per_line == 0 ? ",\n" + std::string(indent + 1, ' ') : ", ";
        out += indices[k] == kEllipsis ? " ..." : padded(offset + indices[k]);
      }
    } else {  // slices, one per line, with a blank line between blocks of 3-D and up
      std::string separator = "," + std::string(t_.dim() - dim - 1, '\n') + std::string(indent + 1, ' ');
      for (size_t k = 0; k < indices.size(); ++k) {
        if (k > 0) out += separator;
        out += indices[k] == kEllipsis ? "..." : render(dim + 1, offset + indices[k] * strides_[dim], indent + 1);
      }
    }
    return out + "]";
  }

  const Tensor& t_;
  std::vector<int64_t> strides_;
  bool summarise_, floating_, scientific_ = false;
  size_t width_ = 1;
};

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  const std::string prefix = "tensor(";
  const int indent = static_cast<int>(prefix.size());
  Tensor host = device().is_cuda() ? to_device(detach(), Device::cpu()) : *this;

  std::string body;
  std::vector<std::string> suffixes;
  if (device() != Device::cpu(0)) suffixes.push_back("device='" + device().str() + "'");
  if (numel() == 0) {  // nothing to infer a dtype from, so only f32 goes without saying
    body = "[]";
    if (dim() != 1) suffixes.push_back("size=" + shape().str());
    if (dtype() != DType::f32) suffixes.push_back(std::string("dtype=") + dtype_name(dtype()));
  } else {
    Printer printer(host);
    body = dim() == 0 ? printer.scalar() : printer.body(indent);
    if (dtype() != DType::f32 && dtype() != DType::i64) suffixes.push_back(std::string("dtype=") + dtype_name(dtype()));
  }
  if (grad_fn())
    suffixes.push_back("grad_fn=<" + grad_fn()->name() + ">");
  else if (requires_grad())
    suffixes.push_back("requires_grad=True");

  // Suffixes go on the last line while it stays within the line width (PyTorch's arithmetic).
  std::string out = prefix + body;
  size_t newline = out.rfind('\n');
  int64_t line_length =
      static_cast<int64_t>(out.size()) - (newline == std::string::npos ? -1 : static_cast<int64_t>(newline)) + 1;
  for (const std::string& suffix : suffixes) {
    auto length = static_cast<int64_t>(suffix.size());
    if (line_length + length + 2 > kLineWidth) {
      out += ",\n" + std::string(indent, ' ') + suffix;
      line_length = indent + length;
    } else {
      out += ", " + suffix;
      line_length += length + 2;
    }
  }
  return out + ")";
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) { return out << tensor.str(); }

// ---- comparisons --------------------------------------------------------------------------------------

namespace {

// Calls f(a_i, b_i) for every element pair, as doubles; the dtypes may differ, the shapes may not.
template <typename F>
void for_each_pair(const Tensor& a, const Tensor& b, const char* op, F&& f) {
  SL_CHECK(a.shape() == b.shape(), op, ": shapes ", a.shape(), " and ", b.shape(), " differ");
  Tensor ha = a.device().is_cuda() ? to_device(a.detach(), Device::cpu()) : a;
  Tensor hb = b.device().is_cuda() ? to_device(b.detach(), Device::cpu()) : b;
  dispatch_all(ha.dtype(), [&](auto a_tag) {
    using A = decltype(a_tag);
    dispatch_all(hb.dtype(), [&](auto b_tag) {
      using B = decltype(b_tag);
      const A* pa = static_cast<const A*>(ha.raw_data());
      const B* pb = static_cast<const B*>(hb.raw_data());
      for (int64_t i = 0, n = ha.numel(); i < n; ++i)
        f(static_cast<double>(static_cast<compute_t<A>>(pa[i])), static_cast<double>(static_cast<compute_t<B>>(pb[i])));
    });
  });
}

}  // namespace

// |a - b| <= atol + rtol * |b| everywhere (as torch.allclose); NaN is never close, equal infinities are.
bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  bool close = true;
  for_each_pair(a, b, "allclose",
                [&](double x, double y) { close = close && (x == y || std::abs(x - y) <= atol + rtol * std::abs(y)); });
  return close;
}

// The largest |a - b|: NaN if any element is NaN, 0 when empty.
double max_abs_diff(const Tensor& a, const Tensor& b) {
  double largest = 0;
  for_each_pair(a, b, "max_abs_diff", [&](double x, double y) {
    double diff = x == y ? 0.0 : std::abs(x - y);
    largest = std::isnan(diff) || std::isnan(largest) ? NAN : std::max(largest, diff);
  });
  return largest;
}

}  // namespace sl
