// formulas.cpp — see formulas.h.
#include "parallel/planner/formulas.h"

#include "parallel/pipeline/simulate.h"
#include "tensor/error.h"

namespace sl::parallel::planner {

double narayanan_parameters(double l, double h, double V, double s) {
  return 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
}

double narayanan_flops(double B, double s, double l, double h, double V, bool recompute) {
  // 24Bslh² per pass for the layers' matmuls (4 passes: 96), 4Bs²lh for attention (s/(6h) of it),
  // and the logit layer's 2BshV forward + 4BshV backward = 6BshV (V/(16lh) of 96Bslh²), not rerun.
  const double layers = 24 * B * s * l * h * h * (1 + s / (6 * h));
  const double logits = 6 * B * s * h * V;
  return layers * (recompute ? 4 : 3) + logits;
}

double narayanan_training_seconds(double tokens, double parameters, double gpus, double flops_per_gpu,
                                  bool recompute) {
  SL_CHECK(gpus > 0 && flops_per_gpu > 0, "narayanan_training_seconds: gpus (", gpus, ") and FLOP/s per GPU (",
           flops_per_gpu, ") must be > 0");
  return (recompute ? 8 : 6) * tokens * parameters / (gpus * flops_per_gpu);
}

double zero_model_state_bytes(double psi, double dp, int stage, double K) {
  SL_CHECK(dp >= 1 && stage >= 0 && stage <= 3, "zero_model_state_bytes: N_d (", dp, ") must be >= 1 and the stage (",
           stage, ") 0..3");
  switch (stage) {
    case 0:
      return (2 + 2 + K) * psi;  // 16-bit weights and gradients, K bytes of Adam state (f32 master, m, v)
    case 1:
      return (2 + 2) * psi + K * psi / dp;
    case 2:
      return 2 * psi + (2 + K) * psi / dp;
    default:
      return (2 + 2 + K) * psi / dp;
  }
}

double korthikanti_activation_bytes(double s, double b, double h, double a, double t, bool sp,
                                    nn::Recompute recompute) {
  SL_CHECK(t >= 1, "korthikanti_activation_bytes: tp (", t, ") must be >= 1");
  const double sbh = s * b * h;
  const double scores = 5 * a * s / (h * t);  // QK^T, softmax, its dropout mask: a·s² per sequence
  switch (recompute) {
    case nn::Recompute::full:
      return 2 * sbh;
    case nn::Recompute::selective:  // the attention core is rerun: its scores are never kept
      return sp ? sbh * 34 / t : sbh * (10 + 24 / t);
    case nn::Recompute::none:
      break;
  }
  return sp ? sbh * (34 / t + scores) : sbh * (10 + 24 / t + scores);
}

double bubble_over_ideal(ScheduleKind kind, int p, int m, int v) {
  SL_CHECK(p >= 1 && m >= 1 && v >= 1, "bubble_over_ideal: stages (", p, "), micro-batches (", m,
           ") and virtual stages (", v, ") must be >= 1");
  switch (kind) {
    case ScheduleKind::naive:
      return p - 1.0;
    case ScheduleKind::interleaved:
      return (p - 1.0) / (static_cast<double>(v) * m);
    case ScheduleKind::zero_bubble:
      return (p - 1.0) / (3.0 * m);  // ZB-H1 with T_F = T_B = T_W
    default:
      return (p - 1.0) / m;
  }
}

double simulated_bubble(ScheduleKind kind, int p, int m, int v) {
  const Schedule schedule = make_schedule(kind, p, m, v);
  const Simulation run = simulate(schedule);  // F = 1, B = 2 (split: B = 1, W = 1)
  SL_CHECK(!run.deadlocked, "simulated_bubble: ", schedule_name(kind), " p ", p, " m ", m, " v ", v, " deadlocks: ",
           run.stuck);
  const double ideal = 3.0 * m * v;  // one rank's F + B of every micro-batch on each of its v chunks
  return (run.timeline.span() - ideal) / ideal;
}

bool cheap_to_simulate(int p, int m, int v) { return p <= 16 && static_cast<int64_t>(p) * m * v <= 2048; }

}  // namespace sl::parallel::planner
