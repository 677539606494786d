// optim.h — SGD, AdamW and gradient clipping.
//
// State is per parameter and visible: optimizer.state(i) holds parameter i's buffers by name
// ("momentum_buffer"; "exp_avg", "exp_avg_sq") and its step count, so ZeRO can shard it and
// state_dict() can save it. Buffers are charged to the ledger's "optimizer" category.
//
// AdamW (Loshchilov & Hutter), as PyTorch computes it, for each parameter p with gradient g:
//     m = b1 m + (1 - b1) g                 v = b2 v + (1 - b2) g^2
//     p = p - lr wd p          (decoupled decay; only for tensors of rank >= 2: no biases, no LayerNorm)
//     p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tensor/adamw_math.h"
#include "nn/module.h"

namespace sl::nn {

struct ParamState {
  int64_t step = 0;
  std::map<std::string, Tensor> buffers;
};

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params);
  virtual ~Optimizer() = default;
  virtual void step() = 0;  // parameters without a gradient are skipped
  void zero_grad();         // drops the gradients (set_to_none)

  const std::vector<Tensor>& params() const { return params_; }
  ParamState& state(size_t i) { return state_.at(i); }
  const ParamState& state(size_t i) const { return state_.at(i); }
  // Parameter i's buffer `name`, made (zeros) if it does not exist yet: a checkpoint loads into it.
  Tensor& ensure_buffer(size_t i, const std::string& name) { return buffer(i, name); }
  double lr = 0;

  // "state.{i}.{buffer}" and "state.{i}.step" (an i64 scalar): everything needed to resume.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 protected:
  // The buffer `name` of parameter i, created as zeros the first time.
  Tensor& buffer(size_t i, const std::string& name);
  std::vector<Tensor> params_;
  std::vector<ParamState> state_;
};

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0.0;
  double weight_decay = 0.0;  // L2, added to the gradient as in torch.optim.SGD
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& options = {});
  void step() override;
  SGDOptions options;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // Mixed precision (Micikevicius et al. 2018; ZeRO's 2 + 2 + 12 bytes per parameter): each 16-bit
  // parameter gets an f32 master copy ("master", made from it at construction) beside f32 moments;
  // step() updates the master with the gradient read in f32 and rounds it into the parameter.
  // Without it a 16-bit parameter is refused.
  bool master_weights = false;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  void step() override;  // f32 parameters (16-bit with master_weights); f64 ones on the CPU in double
  AdamWOptions options;

 private:
  void adamw_update_f64(const Tensor& p, const Tensor& g, Tensor& m, Tensor& v, int64_t t) const;
};

// One AdamW update of n contiguous f32 elements: the loop AdamW::step runs over each parameter, and
// the ZeRO optimizers (parallel/zero/zero_adamw.h) over each rank's shard, so both compute the same bits.
// (AdamWStep, the per-element update, is in tensor/adamw_math.h, shared with the CUDA kernel.)
void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamWStep& s);
// The same update on tensors of one device, any device: w, m, v f32, g f32 or 16-bit (read in f32),
// all [n] views. CPU: the loop above (16-bit gradients widened a block at a time, exactly); CUDA: the
// kernels of tensor/cuda/optim.cu. `rounded` (optional, 16-bit, [n]): mixed precision's model weights,
// set to the new w rounded (on CUDA in the same kernel), after w is updated.
//   AdamW on one shard (parallel/zero/sharded_adamw.h) calls it piece by piece.
void adamw_update(const Tensor& w, const Tensor& g, const Tensor& m, const Tensor& v, const AdamWStep& s,
                  const Tensor& rounded = Tensor());

// Linear warm-up from 0 to max_lr over warmup_steps, then cosine decay to min_lr at total_steps
// (nanoGPT's schedule). Past total_steps it stays at min_lr.
double cosine_lr(int64_t step, int64_t total_steps, int64_t warmup_steps, double max_lr, double min_lr);

// Gradient clipping, one rule for every layout. A layout hands in this rank's pieces of the model's
// gradient (whole gradients, or shards of them) and says which of them this rank counts, so that
// every logical element enters the norm once (parallel/comm/grad_norm.h derives this from the
// parameters' placements); `sum_across_ranks` adds the ranks' partial sums of squares (empty: this
// rank holds every element).
//   norm = sqrt( sum_across_ranks( sum over counted pieces, in order, of sum g^2 in double ) )
//   if norm > max_norm: every piece *= max_norm / (norm + 1e-6)            (PyTorch's rule)
// Returns the norm before clipping.
struct GradPiece {
  Tensor grad;          // may be undefined (a parameter without a gradient): skipped
  bool counted = true;  // false: another rank counts these elements (a replica, a tied copy)
};
double clip_grad_norm(const std::vector<GradPiece>& pieces, double max_norm,
                      const std::function<double(double)>& sum_across_ranks = {});
// The serial case: every parameter's .grad, all counted.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

// Σ x² of a tensor in double, in element order (f32 read in place; on the GPU summed there).
double sum_of_squares(const Tensor& t);

}  // namespace sl::nn
