// diverge — where a layout leaves the serial run: the first module, parameter, rank and step at which
// it differs from the serial model by more than rounding can explain (parallel/train/divergence.h).
//
//   build/bin/diverge --tp 2 --cp 2 --steps 3                  nothing diverges: exit 0
//   build/bin/diverge --config configs/hsdp_cp_tp.toml --json  the whole table as JSON
//
// The flags are train's (tools/train_cli.h: task, model, training, layout); diverge's own defaults
// are a short run: --steps 3, --batch-size 16, --warmup-steps 0 (a warm-up would keep the first
// steps' learning rate near 0 and the weights' comparison blind). It prints the bounds and their
// derivation, then the first divergence: step, phase (forward, backward, step), module or
// parameter, every rank that diverged there with its mesh coordinates, its error against the bound,
// and the largest elements by serial index. Exit 0: nothing diverged; 1: something did, or the run
// failed (a layout it cannot compare is refused naming why); 2: a bad flag.
#include <cstdio>
#include <string>

#include "parallel/train/divergence.h"
#include "parallel/train/train_run.h"
#include "tensor/ops.h"
#include "tools/train_cli.h"

using namespace sl;

namespace {

Options parse_diverge(int argc, const char* const* argv, bool& json, bool& help) {
  Options o;
  o.steps = 3, o.batch_size = 16, o.warmup_steps = 0;
  train_flags::Raw raw;
  raw.seed = static_cast<int64_t>(o.seed);
  cli::Parser cli("diverge", "diverge: runs a layout beside the serial model and names the first module, parameter, "
                             "rank and step where they differ beyond rounding");
  cli.group("Config file");
  cli.config_file("read flags from a TOML file, as train --config does; flags on the command line win over it");
  add_model_flags(cli, o);
  add_training_flags(cli, o, raw);
  add_layout_flags(cli, o);
  cli.group("Output");
  cli.flag("--json", json, "print the whole table (every module, parameter, rank and step compared) as JSON");
  cli.footer("Exit 0: no divergence; 1: a divergence (or a failed run); 2: a bad flag.");
  help = cli.parse(argc, argv);
  if (help) return o;
  o.seed = static_cast<uint64_t>(raw.seed);
  o.resolve();
  try {
    o.validate();
  } catch (const parallel::OptionError& e) {
    throw UsageError{e.what()};
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  bool json = false, help = false;
  try {
    options = parse_diverge(argc, argv, json, help);
    if (help) return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "diverge: %s\n", e.message.c_str());
    return 2;
  }
  try {
    parallel::check_comparable(options);
    set_num_threads(static_cast<int>(options.threads));
    parallel::TrainRun run;
    parallel::prepare_run(run, options, /*writer=*/false);
    const parallel::DivergenceReport report = parallel::find_divergence(run);
    if (json) std::printf("%s\n", parallel::divergence_json(report).dump(1).c_str());
    else std::printf("%s", parallel::first_divergence_text(report).c_str());
    return report.first() ? 1 : 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "diverge: %s\n", e.what());
    return 1;
  }
}
