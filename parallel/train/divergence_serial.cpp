// divergence_serial.cpp — see divergence_serial.h.
#include "parallel/train/divergence_serial.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "autograd/grad_mode.h"
#include "parallel/runner/debug_probe.h"
#include "parallel/train/checkpointing.h"
#include "parallel/train/serial_reference.h"
#include "tensor/ops.h"

namespace sl::parallel {

namespace {

struct Rounding {
  double unit;
  std::string dtype;
};
Rounding rounding_of(DType dtype) {
  if (dtype == DType::bf16) return {std::ldexp(1.0, -8), "bf16"};
  if (dtype == DType::f16) return {std::ldexp(1.0, -11), "fp16"};
  return {std::ldexp(1.0, -24), "f32"};
}


// A module's output for the whole batch from its calls of one step: the one call's, or the
// micro-batches' row blocks in order (wpe's [T, C] is the same in each).
Tensor whole_output(const std::vector<Tensor>& outs) {
  return outs.size() == 1 || outs.at(0).dim() < 3 ? outs.at(0) : cat(outs, 0);
}

}  // namespace

// One serial model with its optimizer and probe: the run in the layout's dtype, or its f64 twin.
struct SerialRecorder::Twin {
  std::unique_ptr<nn::GPT> model;
  TrainOptions o;
  std::unique_ptr<SerialReference> reference;
  DebugProbe probe;
  std::map<std::string, std::vector<double>> outputs, grads, weights;
  double loss = 0;

  Twin(const TrainRun& run, bool f64) : model(initial_model(run)), o(run.o) {
    if (f64) model->to(DType::f64), o.mixed_precision = "no";  // from the same (rounded) weights
    reference = std::make_unique<SerialReference>(*model, o, f64 ? nn::MixedPrecision{} : run.precision);
    probe.attach(*model);
    probe.attach_head(*model);
  }
  std::vector<StatePiece> state() { return whole_state_pieces(*model, reference->optimizer()); }
  void step(const TrainRun& run, int64_t s) {
    {
      NoGradGuard no_grad;
      probe.begin_step(static_cast<int>(s));
      const Tensor inputs = run.stream.get_batch(s, o.batch_size, o.block_size).inputs;
      // A mixture of experts routes each micro-batch as one batch (its capacity, its drops): its
      // outputs are those of the micro-batches' forwards, row blocks in order. A dense model's rows
      // do not meet, so one forward of the batch gives them.
      const int64_t micros = model->config().moe_experts > 0 ? o.micro_batches : 1, rows = inputs.size(0) / micros;
      for (int64_t m = 0; m < micros; ++m) model->forward(inputs.narrow(0, m * rows, rows));
      for (const auto& [name, outs] : probe.outputs()) outputs[name] = values_f64(whole_output(outs));
    }
    loss = reference->step(run.stream, s, [&] {
      for (const auto& [name, p] : model->named_parameters()) grads[name] = values_f64(p.grad().defined() ? p.grad() : zeros_like(p));
    });
    for (const auto& [name, p] : model->named_parameters()) weights[name] = values_f64(p);
  }
};

namespace {

// r of a phase at a step: the largest over its tensors (divergence_compare.h), so that it is the
// largest of many roundings and a tensor of a few elements does not stand on its own few.
template <class Named>
NoiseBound noise_of(const Named& serial, const Named& exact, const Rounding& r) {
  NoiseBound bound{0, r.unit, r.dtype};
  for (const auto& [name, values] : serial) bound.noise = std::max(bound.noise, measured_noise(values, exact.at(name)));
  return bound;
}

std::vector<double> bounds_of(const std::vector<double>& serial, const NoiseBound& bound) {
  const double scale = rms(serial);
  std::vector<double> out(serial.size());
  for (size_t i = 0; i < serial.size(); ++i) out[i] = bound.at(serial[i], scale);
  return out;
}

}  // namespace

std::vector<double> values_f64(const Tensor& t) { return t.detach().to(DType::f64).to_vector(); }

SerialRecorder::SerialRecorder(const TrainRun& run)
    : run_(run), serial_(std::make_unique<Twin>(run, /*f64=*/false)), exact_(std::make_unique<Twin>(run, /*f64=*/true)) {
  for (const auto& [name, p] : serial_->model->named_parameters()) parameter_order_.push_back(name);
}
SerialRecorder::~SerialRecorder() = default;

std::unique_ptr<LayoutState> SerialRecorder::make_layout_state() const { return std::make_unique<LayoutState>(serial_->state()); }

void SerialRecorder::load(const LayoutState& state, const nlohmann::json& run_state) {
  for (Twin* twin : {serial_.get(), exact_.get()}) {
    state.load_into(twin->state());
    nn::AdamW& adamw = twin->reference->optimizer();
    restore_serial_run_state(adamw, twin->reference->scaler(), run_state);
    size_t i = 0;  // an expert that computed no row in a step lags the others, as in the layout
    for (const auto& [name, p] : twin->model->named_parameters()) {
      SL_ASSERT(adamw.params()[i].is_same(p));
      if (state.steps_behind().count(name)) adamw.state(i).step = state.steps_behind().at(name);
      ++i;
    }
  }
  check_masters_round_to_weights(serial_->state());
}

// Under mixed precision each 16-bit weight is its f32 master rounded: a load that set one and not the
// other would start the serial run from a state no run can be in (and the twin, which has no master,
// would not see it: r would grow and hide it).
void SerialRecorder::check_masters_round_to_weights(const std::vector<StatePiece>& pieces) {
  std::map<std::string, const StatePiece*> by_name;
  for (const StatePiece& piece : pieces) by_name[piece.tensor] = &piece;
  for (const auto& [name, piece] : by_name) {
    if (name.rfind("master.", 0) != 0) continue;
    const StatePiece& weight = *by_name.at(name.substr(7));
    const Tensor rounded = piece->data.to(weight.data.dtype());
    const bool weight_is_master_rounded = max_abs_diff(rounded.to(DType::f64), weight.data.to(DType::f64)) == 0;
    SL_ASSERT(weight_is_master_rounded);
  }
}

SerialStepRecord SerialRecorder::step(int64_t s) {
  const TrainOptions& o = run_.o;
  const Rounding r = rounding_of(run_.config.param_dtype);
  SerialStepRecord rec;
  rec.lr = nn::cosine_lr(s, o.steps, o.warmup_steps, o.lr, o.min_lr);
  serial_->step(run_, s);
  exact_->step(run_, s);
  rec.output_bound = noise_of(serial_->outputs, exact_->outputs, r);
  rec.grad_bound = noise_of(serial_->grads, exact_->grads, r);
  rec.weight_bound = noise_of(serial_->weights, exact_->weights, r);
  for (const auto& [name, outs] : serial_->probe.outputs()) rec.outputs[name] = whole_output(outs).to(DType::f32);
  for (const auto& [name, g] : serial_->grads) rec.grad_bounds[name] = bounds_of(g, rec.grad_bound), rec.grads[name] = g;
  for (const auto& [name, w] : serial_->weights) {
    // AdamW's update of one element moves at most ±lr; a gradient known to δg moves it by at most
    // about lr·2δg/(|g| + eps): this step's alone, both runs having started it from the same state
    const std::vector<double>&g = rec.grads.at(name), &gb = rec.grad_bounds.at(name);
    std::vector<double>& bounds = rec.weight_bounds[name] = bounds_of(w, rec.weight_bound);
    for (size_t i = 0; i < w.size(); ++i) bounds[i] += rec.lr * std::min(2.0, 2 * gb[i] / (std::fabs(g[i]) + o.adam_eps));
    rec.weights[name] = w;
  }
  rec.loss = serial_->loss;
  // the loss through the logits: |Δ cross-entropy| <= 2·max_k |Δz_k| (divergence_compare.h)
  const std::vector<double> logit_bounds = bounds_of(serial_->outputs.at("lm_head"), rec.output_bound);
  rec.loss_bound = 2 * *std::max_element(logit_bounds.begin(), logit_bounds.end()) + 2 * r.unit * std::fabs(rec.loss);
  return rec;
}

std::vector<std::string> derivation_of(const TrainRun& run) {
  const Rounding r = rounding_of(run.config.param_dtype);
  char c[160];
  std::snprintf(c, sizeof c, "u = 2^%d (%s), c = %g", static_cast<int>(std::lround(std::log2(r.unit))), r.dtype.c_str(),
                NoiseBound::kFactor);
  return {"each value of the layout l against the serial run s (" + r.dtype + ") of the same model, weights and batches:",
          std::string("  |l_i - s_i| <= c·r·(|s_i| + rms s) + 2u·|s_i|,  ") + c,
          "  each step starts from the layout's state: before every step after the first, s and e are set to the layout's",
          "      weights, AdamW moments, f32 masters, step count and loss scale (one saved replica per element, placed by the",
          "      checkpoint's state pieces), so the three runs enter the step with the same values and differ by its roundings alone",
          "  r = max_j |s_j - e_j| / (|s_j| + rms s) over the phase's tensors at this step: the serial run's rounding noise in",
          "      this step, measured against e, the same serial step in f64",
          "  c = 2 × 2: |l - s| <= |l - e| + |s - e|, the layout's rounding of the same kind (same dtype, reductions cut into",
          "      no longer partial sums), and 2 for the spread of the largest of a sample of roundings",
          "  2u·|s_i|: each side's last rounding into the dtype",
          "  the weights after the step, also: lr·min(2, 2·bound(g)/(|g| + eps)) (AdamW's update of an element moves at most",
          "      ±lr; a gradient known to δg moves it by about lr·2δg/|g|)",
          "  the loss: 2·max bound(lm_head) + 2u·|loss| (a token's cross-entropy moves at most 2·max_k |Δz_k|)"};
}

}  // namespace sl::parallel
