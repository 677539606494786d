// run_layout.h — build/bin/train's ranks: every layout it accepts, the serial one included, is built
// by parallelize (parallel/nd/parallelize.h) and stepped by the Trainer (trainer.h). The serial run is
// world 1: one thread rank, one chunk, DDP over a mesh of one, whose step is bitwise the plain
// nn::GPT + nn::AdamW loop's (serial_reference.h, which --compare-serial runs beside it).
//
//   options ──plan_of_options──▶ TrainPlan ──validate, check_model_cut──▶ launch(world):
//     each rank: parallelize ─▶ Trainer ─▶ [--resume] ─▶ run_steps (run_loop.h) ─▶ [--trace]
//                ─▶ its RankReport ─▶ full_state_dict (collective) ─▶ rank 0's weights
//
//   --device cuda: ranks on GPUs over NCCL when every rank has one (and NCCL is built), else thread
//   ranks sharing the GPUs, staged through the host. Under mpirun: one process per rank.
//
//   Tests: tests/tools/test_train_cli.cpp, tests/parallel/train/test_run_report.cpp
#pragma once
#include <vector>

#include "parallel/train/train_run.h"

namespace sl::parallel {

// Trains the run's layout from run.first_step to --steps. Rank 0 logs (and, serial, evaluates and
// profiles); run.reports gets this process's ranks' reports, and a parallel run prints their table.
// Returns rank 0's losses, and its full weights in `weights` (the serial model's names and shapes;
// under mpirun only in rank 0's process). Throws sl::Error naming the values before any rank starts
// when the layout cannot run this model.
std::vector<double> train_layout(TrainRun& run, nn::StateDict& weights);

// --device cuda with ranks: a GPU at least (sl::Error saying why not), checked before anything runs.
// Under mpirun each process takes its node's GPU local_rank, and the NCCL bootstrap checks that GPU.
void check_cuda_ranks(const TrainOptions& o);

}  // namespace sl::parallel
