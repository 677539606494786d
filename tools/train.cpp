// train — trains the tiny GPT: the main job (`make run`).
//
//   build/bin/train                                   # addition, the defaults below (README: "make run")
//   build/bin/train --task text --data input.txt --steps 2000
//   build/bin/train --task bin --data train.bin --vocab-size 50304 --save model.safetensors
//   build/bin/train --config configs/hsdp_cp_tp.toml --steps 100     # a layout from a file; flags win over it
//
// The flags (train --help, by chapter) and the TOML keys are tools/train_cli.h's, bound to the
// library's TrainOptions (parallel/train/train_options.h), which checks them against each other.
// Prints a progress bar on a terminal, plain lines otherwise; --log-jsonl writes one JSON object
// per optimizer step; --profile prints where the serial run's training steps spent their time, per
// op kind: forward, backward and optimizer (clipping and AdamW), held-out evaluations left out.
// A bad flag or value is one line naming the flag, the value and what it takes (exit code 2). Every
// other failure exits 1 with one line naming what failed: an input that cannot be read, an output
// path that cannot be written (checked before step 0: parallel/train/train_files.h), a log write
// or standard output that failed.
//
// Every layout, the serial one (no parallel flag: a world of one) included, runs through parallelize
// and the Trainer (parallel/train/run_layout.h); this file parses, prepares, runs and reports.
// --init-from and --save work with every layout: each rank starts from the serial file's weights,
// and --save writes the serial model's file (full_state_dict(); rank 0 alone under mpirun).
// --micro-batches M accumulates gradients over M backward passes per optimizer step, serial or
// parallel, with the loss weighted so that the step is the M = 1 step (parallel/train/trainer.h).
// --report-json PATH writes the run report (parallel/train/run_report.h; under mpirun, rank 0's only).
// --device cuda with ranks runs DDP, ZeRO, FSDP/HSDP, --pp, --tp and --cp on GPUs: rank r on cuda:r over
// NCCL when every rank has a GPU (and NCCL is built), else thread ranks sharing the GPUs (cuda:(r mod GPUs),
// collectives staged through host memory). The layouts with host code on their path (--naive-dp,
// --links) are refused (parallel/train/train_options.h), and so is --device cuda without a GPU, before any rank starts.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "parallel/comm/launch.h"
#include "parallel/train/run_layout.h"
#include "parallel/train/serial_reference.h"
#include "parallel/train/train_files.h"
#include "parallel/train/train_run.h"
#include "tensor/ops.h"
#include "tools/train_cli.h"
#include "tools/train_report.h"

using namespace sl;

namespace {

std::string format_percent(double fraction) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", 100 * fraction);
  return text;
}

// Before anything is read or trained: every output path can be written. Only the writer checks
// (under mpirun the other ranks write nothing, and their probes of PATH.tmp would race).
// The checkpoint directory too: a run always saves one at its end, and may at step --save-every.
void check_outputs(const Options& o) {
  if (!o.save.empty()) train_files::check_save_path("--save", o.save);
  if (!o.report_json.empty()) train_files::check_save_path("--report-json", o.report_json);
  if (!o.trace.empty()) train_files::check_save_path("--trace", o.trace);
  if (!o.checkpoint_dir.empty()) train_files::check_output_directory("--checkpoint-dir", o.checkpoint_dir);
}

void write_report(const parallel::TrainRun& r) {
  train_files::LogFile report;
  report.open("--report-json", r.o.report_json);
  report.write(parallel::run_report_json(r.plan_name, r.parallelism, r.o.steps, r.reports));
  report.close();
}

// --compare-serial: the serial reference (a plain nn::GPT and nn::AdamW, sharing no code with the
// layout's run) trained from the same weights, and its largest differences printed. Returns the
// reference's accuracy as a note for the addition task's final line ("" otherwise).
std::string compare_with_serial(const parallel::TrainRun& r, const std::vector<double>& losses, nn::GPT& model) {
  std::unique_ptr<nn::GPT> serial = parallel::initial_model(r);
  const std::vector<double> serial_losses =
      parallel::train_serial_reference(*serial, r.stream, r.o, r.precision, r.first_step);
  train_report::print_comparison(losses, serial_losses, model.state_dict(), serial->state_dict());
  if (!r.addition) return "";
  return " (the serial run: " + format_percent(parallel::accuracy(r, *serial)) + ")";
}

int train(const Options& options) {
  parallel::check_cuda_ranks(options);  // before any output is probed, any data read or any rank started
  const bool writer = parallel::mpirun_rank() == 0;
  if (writer) check_outputs(options);  // before the data is read or a step is taken
  set_num_threads(static_cast<int>(options.threads));
  DeviceGuard on_device(Device::parse(options.device));
  parallel::TrainRun r;
  parallel::prepare_run(r, options, writer);
  const Options& o = r.o;
  std::unique_ptr<nn::GPT> owned = parallel::initial_model(r);
  std::printf(
      "train: task %s, %lld tokens of data; GPT %lld layers, %lld heads, n_embd %lld, block %lld: %.2fM parameters\n",
      o.task.c_str(), (long long)r.stream.size(), (long long)o.n_layer, (long long)o.n_head, (long long)o.n_embd,
      (long long)o.block_size, owned->num_parameters() / 1e6);
  if (!o.init_from.empty()) std::printf("initial weights from %s\n", o.init_from.c_str());
  if (r.precision.enabled() || r.config.recompute != nn::Recompute::none)
    std::printf("mixed precision %s, recompute %s\n", r.precision.str().c_str(), nn::recompute_name(r.config.recompute));
  auto run_start = std::chrono::steady_clock::now();
  // The ranks build their own parts; this model would only sit in rank 0's ledger (cpu:0).
  owned.reset();
  nn::StateDict weights;
  std::vector<double> losses = parallel::train_layout(r, weights);
  // Under mpirun only rank 0's process holds the trained weights; the others are done.
  if (!r.writer) return 0;
  owned = std::make_unique<nn::GPT>(r.config, o.seed);
  owned->load_state_dict(weights);
  r.log.close();  // checked too: some file systems (NFS, quotas) report a failed write only here
  if (!o.report_json.empty()) write_report(r);
  nn::GPT& model = *owned;
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  if (o.profile)
    std::printf("\nprofile of %lld training steps (inclusive ms per op kind; held-out evaluations not counted):\n%s",
                (long long)o.steps, r.profile.c_str());
  if (o.steps > r.first_step)
    std::printf("trained %lld steps in %.1f s\n", (long long)(o.steps - r.first_step), seconds);
  // --compare-serial on addition: the serial model's accuracy, beside the layout's
  const std::string serial_accuracy = o.compare_serial ? compare_with_serial(r, losses, model) : "";
  double final_accuracy = 1;
  if (r.addition) {
    final_accuracy = parallel::accuracy(r, model);
    std::printf("final held-out accuracy: %.1f%% of %zu unseen %lld-digit sums%s\n", 100 * final_accuracy,
                r.addition->heldout().size(), (long long)o.digits, serial_accuracy.c_str());
  }
  if (!o.save.empty()) {
    train_files::save_weights("--save", o.save, model.state_dict());
    std::printf("saved %s\n", o.save.c_str());
  }
  SL_CHECK(100 * final_accuracy >= o.min_accuracy, "the final held-out accuracy ", format_percent(final_accuracy),
           " is below --min-accuracy ", o.min_accuracy, "%");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    bool help = false;
    options = parse_train(argc, argv, &help);
    if (help) return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "train: %s\n", e.message.c_str());
    return 2;
  }
  try {
    int code = train(options);
    train_files::check_stdout();  // the report is part of the run: lost output is a failed run
    return code;
  } catch (const std::exception& e) {
    std::fflush(stdout);  // what was printed before the error comes first
    std::fprintf(stderr, "\ntrain: %s\n", e.what());
    return 1;
  }
}
