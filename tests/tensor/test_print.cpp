// Printing (Tensor::str, operator<<) in PyTorch's repr style, and allclose / max_abs_diff.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "autograd/node.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

TEST(Print, TwoDimensionalF32) {
  Tensor x = from_vector({1, -2, 3, 4}, {2, 2});
  EXPECT_EQ(x.str(), "tensor([[ 1.0000, -2.0000],\n        [ 3.0000,  4.0000]])");
  std::ostringstream out;
  out << x;
  EXPECT_EQ(out.str(), x.str());
}

TEST(Print, Scalar) {
  EXPECT_EQ(scalar_tensor(3.5).str(), "tensor(3.5000)");
  EXPECT_EQ(scalar_tensor(-2, TensorOptions{DType::i64}).str(), "tensor(-2)");
}

TEST(Print, IntegersAndDtypeSuffixes) {
  EXPECT_EQ(arange(5).str(), "tensor([0, 1, 2, 3, 4])");  // i64 is the integer default: no suffix
  EXPECT_EQ(from_vector({1, -20, 300}, {3}, TensorOptions{DType::i32}).str(), "tensor([  1, -20, 300], dtype=i32)");
  EXPECT_EQ(from_vector({1.5, 2}, {2}, TensorOptions{DType::f64}).str(), "tensor([1.5000, 2.0000], dtype=f64)");
  EXPECT_EQ(from_vector({0.5, -1}, {2}, TensorOptions{DType::bf16}).str(), "tensor([ 0.5000, -1.0000], dtype=bf16)");
  EXPECT_EQ(from_vector({0.25}, {1}, TensorOptions{DType::f16}).str(), "tensor([0.2500], dtype=f16)");
}

TEST(Print, AutogradSuffixes) {
  Tensor x = from_vector({1, 2}, {2}, TensorOptions{}.with_requires_grad());
  EXPECT_EQ(x.str(), "tensor([1.0000, 2.0000], requires_grad=True)");
  Tensor y = reshape(x, {1, 2});
  EXPECT_EQ(y.str(), "tensor([[1.0000, 2.0000]], grad_fn=<" + y.grad_fn()->name() + ">)");
  EXPECT_NE(y.grad_fn()->name().find("Reshape"), std::string::npos);
  EXPECT_EQ(from_vector({1}, {1}, TensorOptions{DType::f64}.with_requires_grad()).str(),
            "tensor([1.0000], dtype=f64, requires_grad=True)");
}

TEST(Print, DeviceSuffix) {
  Tensor x = zeros({2}, TensorOptions{}.with_device(Device::cpu(1)));
  EXPECT_EQ(x.str(), "tensor([0.0000, 0.0000], device='cpu:1')");
  EXPECT_EQ(zeros({1}, TensorOptions{DType::i32}.with_device(Device::cpu(3))).str(),
            "tensor([0], device='cpu:3', dtype=i32)");
}

TEST(Print, ThreeDimensionsLeaveABlankLineBetweenBlocks) {
  EXPECT_EQ(arange(8).reshape({2, 2, 2}).str(),
            "tensor([[[0, 1],\n"
            "         [2, 3]],\n"
            "\n"
            "        [[4, 5],\n"
            "         [6, 7]]])");
}

TEST(Print, ScientificNotationLikePyTorch) {
  // max / min > 1000 among the nonzero values
  EXPECT_EQ(from_vector({1e-5, 1, 0}, {3}).str(), "tensor([1.0000e-05, 1.0000e+00, 0.0000e+00])");
  EXPECT_EQ(from_vector({1e9}, {1}, TensorOptions{DType::f64}).str(), "tensor([1.0000e+09], dtype=f64)");
  EXPECT_EQ(from_vector({0.001, 0.5}, {2}).str(), "tensor([0.0010, 0.5000])");  // ratio 500: fixed
}

TEST(Print, NonFiniteValuesAndEmptyTensors) {
  EXPECT_EQ(from_vector({NAN, -INFINITY, 1.5}, {3}).str(), "tensor([   nan,   -inf, 1.5000])");
  EXPECT_EQ(zeros({0}).str(), "tensor([])");
  EXPECT_EQ(zeros({2, 0}, TensorOptions{DType::i64}).str(), "tensor([], size=[2, 0], dtype=i64)");
  EXPECT_EQ(Tensor().str(), "tensor(undefined)");
}

TEST(Print, LongRowsWrapAtEightyColumns) {
  std::string s = arange(30.0, 60.0, 1.0).str();
  // 7 columns of "tensor(" leave room for 8 elements of width 7 + ", " per line
  EXPECT_EQ(s.substr(0, s.find('\n')),
            "tensor([30.0000, 31.0000, 32.0000, 33.0000, 34.0000, 35.0000, 36.0000, 37.0000,");
  for (size_t start = 0, end; start < s.size(); start = end + 1) {
    end = std::min(s.find('\n', start), s.size());
    EXPECT_LE(end - start, 80u);
  }
}

TEST(Print, LargeTensorsAreSummarised) {
  std::string s = arange(2000).reshape({2, 1000}).str();
  EXPECT_EQ(s,
            "tensor([[   0,    1,    2,  ...,  997,  998,  999],\n"
            "        [1000, 1001, 1002,  ..., 1997, 1998, 1999]])");
  std::string rows = arange(4000).reshape({1000, 4}).str();
  EXPECT_NE(rows.find("        ...,\n"), std::string::npos) << rows;
  EXPECT_EQ(std::count(rows.begin(), rows.end(), '\n'), 6);  // 3 + ... + 3 rows
  EXPECT_NE(randn({40, 40}).str().find("..."), std::string::npos);
  EXPECT_EQ(zeros({1000}).str().find("..."), std::string::npos);  // 1000 is not more than 1000
}

// ---- comparisons --------------------------------------------------------------------------------

TEST(Compare, AllcloseAndMaxAbsDiff) {
  Tensor a = from_vector({1, 2, 3}, {3});
  Tensor b = from_vector({1, 2.5, 3}, {3}, TensorOptions{DType::f64});
  EXPECT_DOUBLE_EQ(max_abs_diff(a, b), 0.5);
  EXPECT_FALSE(allclose(a, b));
  EXPECT_TRUE(allclose(a, b, 0.0, 0.5));
  EXPECT_TRUE(allclose(a, b, 0.2, 0.0));  // 0.5 <= 0.2 * 2.5
  EXPECT_TRUE(allclose(a, a));
  EXPECT_TRUE(allclose(from_vector({1, 2, 3}, {3}, TensorOptions{DType::i32}), a));  // dtypes may differ
  Tensor with_nan = from_vector({1, NAN, 3}, {3});
  EXPECT_FALSE(allclose(with_nan, with_nan));
  EXPECT_TRUE(std::isnan(max_abs_diff(with_nan, a)));
  Tensor inf = from_vector({INFINITY}, {1});
  EXPECT_TRUE(allclose(inf, inf));
  EXPECT_EQ(max_abs_diff(zeros({0}), zeros({0})), 0.0);
}

TEST(Compare, ShapesMustMatch) {
  std::string message = message_of([] { allclose(zeros({2, 3}), zeros({3, 2})); });
  EXPECT_NE(message.find("allclose: shapes [2, 3] and [3, 2] differ"), std::string::npos) << message;
  message = message_of([] { max_abs_diff(zeros({2}), zeros({2, 1})); });
  EXPECT_NE(message.find("max_abs_diff: shapes [2] and [2, 1] differ"), std::string::npos) << message;
}

}  // namespace
}  // namespace sl
