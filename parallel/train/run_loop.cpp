// run_loop.cpp — see run_loop.h.
#include "parallel/train/run_loop.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "autograd/profiler.h"
#include "nn/moe.h"
#include "nn/optim.h"

namespace sl::parallel {

namespace {

void progress(int64_t step, int64_t steps, double loss, double tokens_per_s) {
  const int width = 30;
  int filled = static_cast<int>(width * (step + 1) / std::max<int64_t>(steps, 1));
  std::printf("\r[%s%s] step %lld/%lld  loss %.4f  %.0f tok/s ", std::string(filled, '#').c_str(),
              std::string(width - filled, '.').c_str(), (long long)step + 1, (long long)steps, loss, tokens_per_s);
  std::fflush(stdout);
}

// The reporting rank's part of one step: the log line, the progress, and a held-out evaluation when due.
void report_step(TrainRun& r, int64_t step, double loss, double lr, double ms, const std::function<double()>& eval,
                 nn::Module* model) {
  const TrainOptions& o = r.o;
  double tokens_per_s = static_cast<double>(o.batch_size * o.block_size) / (ms / 1000.0);
  double imbalance = 0;
  const std::string experts = model ? moe_load_json(*model, &imbalance) : "";
  if (r.log.is_open())
    r.log.write("{\"step\": " + std::to_string(step) + ", \"loss\": " + json_number(loss) +
                ", \"ms\": " + json_number(ms) + ", \"tokens_per_s\": " + json_number(tokens_per_s) +
                ", \"lr\": " + json_number(lr) + (experts.empty() ? "" : ", " + experts) + "}\n");
  const std::string load = experts.empty() ? "" : "  experts max/mean " + json_number(std::round(imbalance * 100) / 100);
  if (r.terminal)
    progress(step, o.steps, loss, tokens_per_s);
  else if ((step + 1) % 100 == 0 || step + 1 == o.steps)
    std::printf("step %5lld  loss %.4f  lr %.2e  %6.1f ms  %8.0f tok/s%s\n", (long long)step + 1, loss, lr, ms,
                tokens_per_s, load.c_str());
  if (eval && o.eval_every > 0 && (step + 1) % o.eval_every == 0 && step + 1 < o.steps) {
    if (r.terminal) std::printf("\n");
    ProfilerPause not_training;  // --profile reports the training steps only
    std::printf("step %5lld  held-out accuracy %.1f%%\n", (long long)step + 1, 100 * eval());
  }
}

}  // namespace

std::string moe_load_json(nn::Module& model, double* imbalance) {
  const auto loads = nn::take_moe_loads(model);
  if (loads.empty()) return "";
  auto list = [](const std::vector<int64_t>& v) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
    return out + "]";
  };
  std::string out = "\"experts\": {";
  for (size_t l = 0; l < loads.size(); ++l) {
    const nn::MoEStats& s = loads[l].second;
    int64_t total = 0, most = 0;
    for (int64_t n : s.routed) total += n, most = std::max(most, n);
    if (total > 0) *imbalance = std::max(*imbalance, static_cast<double>(most) * s.routed.size() / total);
    out += (l ? ", \"" : "\"") + loads[l].first + "\": {\"routed\": " + list(s.routed) + ", \"kept\": " +
           list(s.kept) + ", \"tokens\": " + std::to_string(s.tokens) + "}";
  }
  return out + "}";
}

std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  std::ostringstream out;
  out << std::setprecision(9) << value;
  return out.str();
}

std::vector<double> run_steps(TrainRun& r, bool report, const std::function<double(int64_t, double)>& step_fn,
                              const std::function<double()>& eval, const std::function<void(int64_t)>& after_step,
                              nn::Module* model) {
  const TrainOptions& o = r.o;
  std::vector<double> losses;
  for (int64_t step = r.first_step; step < o.steps; ++step) {
    auto start = std::chrono::steady_clock::now();
    double lr = nn::cosine_lr(step, o.steps, o.warmup_steps, o.lr, o.min_lr);
    double loss = step_fn(step, lr);
    losses.push_back(loss);
    if (after_step) after_step(step + 1);
    if (!report) continue;
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    report_step(r, step, loss, lr, ms, eval, model);
  }
  if (report && r.terminal && o.steps > 0) std::printf("\n");
  return losses;
}

}  // namespace sl::parallel
