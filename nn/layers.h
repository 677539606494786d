// layers.h — the building blocks: Linear, Embedding, LayerNorm, GELU, Dropout, Sequential.
//
// Each layer is a Module whose forward is a few ops; the ops carry the autograd. Weights are
// drawn from N(0, std) with a Philox generator (GPT-2's init: std 0.02), biases start at 0.
#pragma once
#include <initializer_list>

#include "nn/module.h"

namespace sl::nn {

// A module with one input and one output (what Sequential chains).
class UnaryModule : public Module {
 public:
  virtual Tensor forward(const Tensor& x) = 0;
  // forward(x) with this module's hooks around it: how a parent calls its children.
  Tensor operator()(const Tensor& x) {
    return call_with_hooks(x, [&] { return forward(x); });
  }
};

struct InitOptions {
  double std = 0.02;
  Generator* generator = nullptr;  // the thread's default generator when null
  DType dtype = DType::f32;
};

// y = x W^T + b.  x [..., in], weight [out, in] (PyTorch's layout), bias [out].
class Linear : public UnaryModule {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, const InitOptions& init = {});
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;  // bias undefined when built without
};

// ids [...] -> weight[ids] [..., C].  weight [V, C].
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, const InitOptions& init = {});
  Tensor forward(const Tensor& ids);
  Tensor operator()(const Tensor& ids) {
    return call_with_hooks(ids, [&] { return forward(ids); });
  }
  Tensor weight;
};

// Normalises the last dim: (x - mean) / sqrt(var + eps) * weight + bias.  weight = 1, bias = 0 at init.
class LayerNorm : public UnaryModule {
 public:
  explicit LayerNorm(int64_t C, double eps = 1e-5, DType dtype = DType::f32);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  double eps;
};

class GELU : public UnaryModule {  // tanh form, as GPT-2
 public:
  Tensor forward(const Tensor& x) override { return gelu(x); }
};

// Zeroes elements with probability p in training mode; the identity in eval mode.
class Dropout : public UnaryModule {
 public:
  explicit Dropout(double p, Generator* generator = nullptr);
  Tensor forward(const Tensor& x) override;
  double p;

 private:
  Generator* generator_;
};

class Sequential : public UnaryModule {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<UnaryModule>> modules);
  void push_back(std::shared_ptr<UnaryModule> module);
  Tensor forward(const Tensor& x) override;

 private:
  std::vector<std::shared_ptr<UnaryModule>> layers_;
};

}  // namespace sl::nn
