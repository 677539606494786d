// pending.cpp — TEMPORARY weak placeholders so the library links while ops are written.
// Each real definition overrides its weak twin. This file is deleted before the work lands.
#include "tensor/ops.h"
#pragma GCC diagnostic ignored "-Wunused-parameter"
namespace sl {
__attribute__((weak)) Tensor neg(const Tensor& x) { throw Error("neg: not written yet"); }
__attribute__((weak)) Tensor exp(const Tensor& x) { throw Error("exp: not written yet"); }
__attribute__((weak)) Tensor log(const Tensor& x) { throw Error("log: not written yet"); }
__attribute__((weak)) Tensor sqrt(const Tensor& x) { throw Error("sqrt: not written yet"); }
__attribute__((weak)) Tensor rsqrt(const Tensor& x) { throw Error("rsqrt: not written yet"); }
__attribute__((weak)) Tensor tanh(const Tensor& x) { throw Error("tanh: not written yet"); }
__attribute__((weak)) Tensor sigmoid(const Tensor& x) { throw Error("sigmoid: not written yet"); }
__attribute__((weak)) Tensor relu(const Tensor& x) { throw Error("relu: not written yet"); }
__attribute__((weak)) Tensor gelu(const Tensor& x) { throw Error("gelu: not written yet"); }
__attribute__((weak)) Tensor pow(const Tensor& x, double) { throw Error("pow: not written yet"); }
__attribute__((weak)) Tensor add(const Tensor& a, const Tensor& b) { throw Error("add: not written yet"); }
__attribute__((weak)) Tensor sub(const Tensor& a, const Tensor& b) { throw Error("sub: not written yet"); }
__attribute__((weak)) Tensor mul(const Tensor& a, const Tensor& b) { throw Error("mul: not written yet"); }
__attribute__((weak)) Tensor div(const Tensor& a, const Tensor& b) { throw Error("div: not written yet"); }
__attribute__((weak)) Tensor maximum(const Tensor& a, const Tensor& b) { throw Error("maximum: not written yet"); }
__attribute__((weak)) Tensor add(const Tensor& a, double) { throw Error("add: not written yet"); }
__attribute__((weak)) Tensor sub(const Tensor& a, double) { throw Error("sub: not written yet"); }
__attribute__((weak)) Tensor mul(const Tensor& a, double) { throw Error("mul: not written yet"); }
__attribute__((weak)) Tensor div(const Tensor& a, double) { throw Error("div: not written yet"); }
__attribute__((weak)) Tensor maximum(const Tensor& a, double) { throw Error("maximum: not written yet"); }
__attribute__((weak)) Tensor sum_to(const Tensor& x, const Shape&) { throw Error("sum_to: not written yet"); }
__attribute__((weak)) Tensor matmul(const Tensor& a, const Tensor& b, bool, bool) { throw Error("matmul: not written yet"); }
__attribute__((weak)) void set_num_threads(int) { throw Error("set_num_threads: not written yet"); }
__attribute__((weak)) int num_threads() { throw Error("num_threads: not written yet"); }
__attribute__((weak)) Tensor sum(const Tensor& x) { throw Error("sum: not written yet"); }
__attribute__((weak)) Tensor mean(const Tensor& x) { throw Error("mean: not written yet"); }
__attribute__((weak)) Tensor max(const Tensor& x) { throw Error("max: not written yet"); }
__attribute__((weak)) Tensor sum(const Tensor& x, int, bool) { throw Error("sum: not written yet"); }
__attribute__((weak)) Tensor mean(const Tensor& x, int, bool) { throw Error("mean: not written yet"); }
__attribute__((weak)) Tensor max(const Tensor& x, int, bool) { throw Error("max: not written yet"); }
__attribute__((weak)) Tensor argmax(const Tensor& x, int, bool) { throw Error("argmax: not written yet"); }
__attribute__((weak)) Tensor softmax(const Tensor& x) { throw Error("softmax: not written yet"); }
__attribute__((weak)) Tensor log_softmax(const Tensor& x) { throw Error("log_softmax: not written yet"); }
__attribute__((weak)) Tensor layer_norm(const Tensor& x, const Tensor&, const Tensor&, double) { throw Error("layer_norm: not written yet"); }
__attribute__((weak)) Tensor embedding(const Tensor& weight, const Tensor&) { throw Error("embedding: not written yet"); }
__attribute__((weak)) Tensor cross_entropy(const Tensor& logits, const Tensor&, int64_t) { throw Error("cross_entropy: not written yet"); }
__attribute__((weak)) Tensor masked_fill(const Tensor& x, const Tensor&, double) { throw Error("masked_fill: not written yet"); }
__attribute__((weak)) Tensor causal_mask(int64_t, Device) { throw Error("causal_mask: not written yet"); }
__attribute__((weak)) Tensor where(const Tensor&, const Tensor& a, const Tensor& b) { throw Error("where: not written yet"); }
__attribute__((weak)) Tensor dropout(const Tensor& x, double, bool, Generator*) { throw Error("dropout: not written yet"); }
__attribute__((weak)) Tensor reshape(const Tensor& x, const Shape&) { throw Error("reshape: not written yet"); }
__attribute__((weak)) Tensor transpose(const Tensor& x, int, int) { throw Error("transpose: not written yet"); }
__attribute__((weak)) Tensor permute(const Tensor& x, const std::vector<int>&) { throw Error("permute: not written yet"); }
__attribute__((weak)) Tensor narrow(const Tensor& x, int, int64_t, int64_t) { throw Error("narrow: not written yet"); }
__attribute__((weak)) Tensor cat(const std::vector<Tensor>&, int) { throw Error("cat: not written yet"); }
__attribute__((weak)) std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>&, int) { throw Error("split: not written yet"); }
__attribute__((weak)) std::vector<Tensor> split(const Tensor& x, int64_t, int) { throw Error("split: not written yet"); }
__attribute__((weak)) std::vector<Tensor> chunk(const Tensor& x, int64_t, int) { throw Error("chunk: not written yet"); }
__attribute__((weak)) bool allclose(const Tensor& a, const Tensor& b, double, double) { throw Error("allclose: not written yet"); }
__attribute__((weak)) double max_abs_diff(const Tensor& a, const Tensor& b) { throw Error("max_abs_diff: not written yet"); }
__attribute__((weak)) std::string Tensor::str() const { throw Error("Tensor::str: not written yet"); }
__attribute__((weak)) std::ostream& operator<<(std::ostream& out, const Tensor& tensor) { throw Error("operator<<: not written yet"); }
}
