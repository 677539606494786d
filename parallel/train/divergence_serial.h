// divergence_serial.h — the serial half of build/bin/diverge (divergence.h): the serial run in the
// layout's dtype beside its f64 twin, stepped one step at a time, each step's values recorded with
// their bounds from the rounding noise measured between the two (divergence_compare.h states the
// bound and why). From the second step on, both start each step from the layout's state
// (divergence_sync.h), so the noise measured is that step's alone.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/train/divergence_compare.h"
#include "parallel/train/divergence_sync.h"
#include "parallel/train/train_run.h"

namespace sl::parallel {

// What the serial run did at one step, and the bounds of its values.
struct SerialStepRecord {
  double loss = 0, loss_bound = 0, lr = 0;
  std::map<std::string, Tensor> outputs;  // module -> the whole batch's output, f32
  NoiseBound output_bound, grad_bound, weight_bound;
  std::map<std::string, std::vector<double>> grads, grad_bounds;      // before the update
  std::map<std::string, std::vector<double>> weights, weight_bounds;  // after it
};

class SerialRecorder {
 public:
  explicit SerialRecorder(const TrainRun& run);  // both runs at the initial weights
  ~SerialRecorder();
  const std::vector<std::string>& parameter_order() const { return parameter_order_; }
  // Room for the layout's state: one buffer per tensor of the serial run's state (weights, AdamW's
  // moments, the f32 masters under mixed precision).
  std::unique_ptr<LayoutState> make_layout_state() const;
  // Sets both runs to the layout's state: `state` (the weights widened into the twin, and its
  // moments; the masters and the moments into the serial run's AdamW) and `run_state`
  // (trainer_run_state: AdamW's step count, the fp16 loss scaler). Throws what load_into throws.
  void load(const LayoutState& state, const nlohmann::json& run_state);
  // One step of both, from where they are; the values and their bounds.
  SerialStepRecord step(int64_t step);

 private:
  struct Twin;
  // After a load: each 16-bit weight equals its f32 master rounded (an internal invariant).
  static void check_masters_round_to_weights(const std::vector<StatePiece>& pieces);
  const TrainRun& run_;
  std::unique_ptr<Twin> serial_, exact_;
  std::vector<std::string> parameter_order_;
};

// The bounds' derivation, printed above the finder's answer.
std::vector<std::string> derivation_of(const TrainRun& run);

std::vector<double> values_f64(const Tensor& t);

}  // namespace sl::parallel
