// diverge — where a layout leaves the serial run: the first module, parameter, rank and step at which
// it differs from the serial model by more than rounding can explain (parallel/train/divergence.h).
//
//   build/bin/diverge --tp 2 --cp 2 --steps 3                  nothing diverges: exit 0
//   build/bin/diverge --config configs/hsdp_cp_tp.toml --json  the whole table as JSON
//   build/bin/diverge --tp 2 --cp 2 --inject 'scale-grad h.0.attn.c_attn.weight tp=1 step=1 x2'
//                                                             a planted fault (debug_probe.h): named, exit 1
//
// The flags are train's (tools/train_cli.h: task, model, training, layout); diverge's own defaults
// are a short run: --steps 3, --batch-size 16, --warmup-steps 0 (a warm-up would keep the first
// steps' learning rate near 0 and the weights' comparison blind). It prints the bounds and their
// derivation, then the first divergence: step, phase (forward, backward, step), module or
// parameter, every rank that diverged there with its mesh coordinates, its error against the bound,
// and the largest elements by serial index. Exit 0: nothing diverged; 1: something did, or the run
// failed (a layout it cannot compare is refused naming why); 2: a bad flag.
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "parallel/train/divergence.h"
#include "parallel/train/train_run.h"
#include "tensor/ops.h"
#include "tools/train_cli.h"

using namespace sl;

namespace {

// --inject's faults: one or more, separated by ';'.
std::vector<parallel::ProbeFault> faults_of(const std::string& text) {
  std::vector<parallel::ProbeFault> faults;
  std::istringstream in(text);
  for (std::string one; std::getline(in, one, ';');)
    if (one.find_first_not_of(' ') != std::string::npos) faults.push_back(parallel::parse_probe_fault(one));
  return faults;
}

Options parse_diverge(int argc, const char* const* argv, bool& json, bool& help, std::vector<parallel::ProbeFault>& faults) {
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
  add_expert_parallel_flags(cli, o);
  cli.group("Output");
  cli.flag("--json", json, "print the whole table (every module, parameter, rank and step compared) as JSON");
  std::string inject;
  cli.group("Planted faults");
  cli.text("--inject", inject, "FAULT",
           "plant a fault in the layout's ranks (several: separated by ';'): 'scale-grad PARAM [DIM=K ...] [step=N] xF' "
           "scales the parameter's .grad before the chapter's sums; 'scale-output MODULE [DIM=K ...] [step=N] xF' its "
           "output; 'reuse-output MODULE [DIM=K ...] [step=N] call=A from=B' returns micro-batch B's output for A; "
           "inside the chapters: 'scale-contribution PARAM [...] xF' (before ZeRO-2's or FSDP's reduce-scatter), "
           "'add-bias MODULE [...] [+V]' (before the row-parallel sum), 'zigzag-unswapped MODULE [...]', "
           "'ulysses-order MODULE [...]' and 'ring-chunk-index DIM [step=N]' (parallel/runner/debug_probe.h). "
           "DIM: pp, dp_replicate, dp_shard, cp, tp (the ranks at those coordinates; none: every rank)");
  cli.footer("Exit 0: no divergence; 1: a divergence (or a failed run); 2: a bad flag.");
  help = cli.parse(argc, argv);
  if (help) return o;
  o.seed = static_cast<uint64_t>(raw.seed);
  try {
    faults = faults_of(inject);
  } catch (const Error& e) {
    throw UsageError{e.what()};
  }
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
  std::vector<parallel::ProbeFault> faults;
  try {
    options = parse_diverge(argc, argv, json, help, faults);
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
    const parallel::DivergenceReport report = parallel::find_divergence(run, faults);
    if (json) std::printf("%s\n", parallel::divergence_json(report).dump(1).c_str());
    else std::printf("%s", parallel::first_divergence_text(report).c_str());
    return report.first() ? 1 : 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "diverge: %s\n", e.what());
    return 1;
  }
}
