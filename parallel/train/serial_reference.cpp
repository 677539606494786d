// serial_reference.cpp — see serial_reference.h.
#include "parallel/train/serial_reference.h"

#include "nn/grad_scaler.h"
#include "nn/optim.h"
#include "parallel/train/plan_of_options.h"
#include "tensor/ops.h"

namespace sl::parallel {

namespace {

// One optimizer step; returns the batch's mean loss.
double reference_step(nn::GPT& model, nn::AdamW& optimizer, nn::GradScaler& scaler, const nn::TokenStream& data,
                      const TrainOptions& o, const nn::MixedPrecision& precision, int64_t step,
                      const std::function<void()>& before_update) {
  optimizer.lr = nn::cosine_lr(step, o.steps, o.warmup_steps, o.lr, o.min_lr);
  nn::zero_grads(model.parameters(), precision);
  // Each micro-batch's mean loss weighted by its share of the batch's counted targets, so the summed
  // gradients are those of the whole batch's mean (M = 1: weight 1). Under fp16 every micro-batch's
  // loss is also multiplied by the loss scale (unscaled below).
  const std::vector<nn::TokenStream::MicroBatch> micros =
      data.micro_batches(step, o.batch_size, o.block_size, o.micro_batches);
  int64_t counted = 0;
  for (const auto& m : micros) counted += m.counted;
  double loss_value = 0;
  for (const auto& m : micros) {
    if (m.counted == 0 && micros.size() > 1) continue;  // nothing to learn from; its mean is undefined
    Tensor loss = model.loss(m.batch.inputs, m.batch.targets);
    const double weight = micros.size() == 1 ? 1.0 : static_cast<double>(m.counted) / static_cast<double>(counted);
    loss_value += loss.item() * weight;
    const double seed = weight * scaler.scale();
    (seed == 1.0 ? loss : mul(loss, seed)).backward();
  }
  bool found_inf = false;
  if (scaler.enabled()) {
    std::vector<Tensor> grads;
    for (const Tensor& p : model.parameters()) grads.push_back(p.grad());
    found_inf = scaler.unscale(grads);  // before clipping: the norm is the true gradient's
  }
  if (!found_inf) {
    if (before_update) before_update();
    if (o.grad_clip > 0) nn::clip_grad_norm(model.parameters(), o.grad_clip);
    optimizer.step();
  }
  scaler.update(found_inf);
  return loss_value;
}

}  // namespace

struct SerialReference::Impl {
  nn::GPT& model;
  TrainOptions o;
  nn::MixedPrecision precision;
  nn::AdamW optimizer;
  nn::GradScaler scaler;
  Impl(nn::GPT& m, const TrainOptions& options, const nn::MixedPrecision& p)
      : model(m), o(options), precision(p), optimizer(m.parameters(), adamw_of_options(options)), scaler(p.loss_scale) {}
};

SerialReference::SerialReference(nn::GPT& model, const TrainOptions& o, const nn::MixedPrecision& precision)
    : impl_(std::make_unique<Impl>(model, o, precision)) {
  SL_CHECK(o.block_size > 0, "SerialReference: the block size is not resolved (", o.block_size, ")");
}
SerialReference::~SerialReference() = default;

double SerialReference::step(const nn::TokenStream& data, int64_t step, const std::function<void()>& before_update) {
  Impl& i = *impl_;
  return reference_step(i.model, i.optimizer, i.scaler, data, i.o, i.precision, step, before_update);
}

nn::AdamW& SerialReference::optimizer() { return impl_->optimizer; }
nn::GradScaler& SerialReference::scaler() { return impl_->scaler; }

std::vector<double> train_serial_reference(nn::GPT& model, const nn::TokenStream& data, const TrainOptions& o,
                                           const nn::MixedPrecision& precision, int64_t first_step) {
  SL_CHECK(o.block_size > 0, "train_serial_reference: the block size is not resolved (", o.block_size, ")");
  nn::AdamW optimizer(model.parameters(), adamw_of_options(o));
  nn::GradScaler scaler(precision.loss_scale);
  std::vector<double> losses;
  for (int64_t step = first_step; step < o.steps; ++step)
    losses.push_back(reference_step(model, optimizer, scaler, data, o, precision, step, {}));
  return losses;
}

}  // namespace sl::parallel
