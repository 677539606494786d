#include "nn/layers.h"

namespace sl::nn {

namespace {
Tensor init_normal(const Shape& shape, const InitOptions& init) {
  MemoryScope scope(MemoryCategory::weights);
  return mul(randn(shape, TensorOptions(init.dtype), init.generator), init.std);
}
Tensor init_constant(const Shape& shape, double value, DType dtype) {
  MemoryScope scope(MemoryCategory::weights);
  return full(shape, value, TensorOptions(dtype));
}
}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias, const InitOptions& init) {
  SL_CHECK(in_features > 0 && out_features > 0, "Linear: in_features (", in_features, ") and out_features (",
           out_features, ") must be positive");
  weight = register_parameter("weight", init_normal({out_features, in_features}, init));
  if (with_bias) bias = register_parameter("bias", init_constant({out_features}, 0.0, init.dtype));
}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, const InitOptions& init) {
  SL_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding: sizes must be positive (got ", num_embeddings, " x ",
           embedding_dim, ")");
  weight = register_parameter("weight", init_normal({num_embeddings, embedding_dim}, init));
}

Tensor Embedding::forward(const Tensor& ids) { return embedding(weight, ids); }

LayerNorm::LayerNorm(int64_t C, double eps_, DType dtype) : eps(eps_) {
  weight = register_parameter("weight", init_constant({C}, 1.0, dtype));
  bias = register_parameter("bias", init_constant({C}, 0.0, dtype));
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, weight, bias, eps); }

Dropout::Dropout(double p_, Generator* generator) : p(p_), generator_(generator) {
  SL_CHECK(p >= 0 && p < 1, "Dropout: p must be in [0, 1) (got ", p, ")");
}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p, is_training(), generator_); }

Sequential::Sequential(std::initializer_list<std::shared_ptr<UnaryModule>> modules) {
  for (const auto& module : modules) push_back(module);
}

void Sequential::push_back(std::shared_ptr<UnaryModule> module) {
  register_module(std::to_string(layers_.size()), module);
  layers_.push_back(std::move(module));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& layer : layers_) h = (*layer)(h);
  return h;
}

}  // namespace sl::nn
