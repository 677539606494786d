// plan.cpp — build/bin/plan: which layout should train a model on a cluster, and why
// (parallel/planner/planner.h). Flags: tools/plan_cli.h (plan --help); what it does with them:
// parallel/planner/plan_request.h.
//
//   build/bin/plan --model gpt3-175b --nodes 128 --gpus-per-node 8 --gpu-memory 80GB --flops 312TFLOP/s
//                  --links "intra=300GB/s,1us;inter=25GB/s,5us" --batch-size 1536 --mixed-precision bf16
//   build/bin/plan --model zero-7.5b --dp 64 --zero 1 --mixed-precision bf16 --json
//
// Bad input (an unknown flag or preset, a layout that does not divide the heads or layers, zero
// memory) is one line on stderr and exit code 2.
#include <cstdio>
#include <exception>

#include "parallel/planner/plan_request.h"
#include "tools/plan_cli.h"

int main(int argc, char** argv) {
  sl::PlanOptions options;
  try {
    bool help = false;
    options = sl::parse_plan(argc, argv, &help);
    if (help) return 0;
  } catch (const sl::UsageError& e) {
    std::fprintf(stderr, "plan: %s (plan --help lists the flags)\n", e.message.c_str());
    return 2;
  }
  try {
    std::fputs(sl::parallel::planner::run_plan(options).c_str(), stdout);
    return std::fflush(stdout) == 0 ? 0 : 1;
  } catch (const sl::Error& e) {  // the input does not fit together: the message names the value
    std::string message = e.what();
    for (char& ch : message)
      if (ch == '\n') ch = ' ';
    std::fprintf(stderr, "plan: %s\n", message.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plan: %s\n", e.what());
    return 1;
  }
}
