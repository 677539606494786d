// train.h — the training chapter: one step for every layout. A TrainPlan (train_plan.h) names a
// layout, parallelize (parallel/nd/parallelize.h) builds it on this rank, and the Trainer
// (trainer.h) runs the step on what parallelize returned.
//
//   TrainPlan ──parallelize──▶ mesh + ModelRunner (this rank's part) + DataParallelStrategy
//                  │
//                  ▼
//   Trainer::train_step: split the batch, count targets, zero_grad, forward_backward,
//   synchronize, finish_gradients, clip, step; the global loss, the same on every rank
//
// Read in this order:
//   train_plan.h     the layout, typed (its rules: parallel/nd/parallelize_options.h)
//   trainer.h        the step, the gradients kept for tests, the ledgers
//   checkpointing.h  the run's state in a sharded checkpoint
//   run_report.h     what each rank held, sent and waited for (train --report-json)
//
// build/bin/train's run, on top of them:
//   train_options.h     its flags, checked against each other
//   plan_of_options.h   the flags as a TrainPlan and AdamW (the planner maps them the same way)
//   train_run.h         the data, the model's config, --init-from, --resume, the log
//   run_layout.h        every layout, serial included: parallelize, the Trainer, the reports
//   run_loop.h          the schedule, the log lines, the progress, the held-out evaluations
//   serial_reference.h  the plain nn::GPT + nn::AdamW loop that --compare-serial checks against
//   train_files.h, train_checkpoint.h   its output files; its --checkpoint-dir and --resume
//
//   Program: tools/train.cpp   Tests: tests/parallel/train/test_trainer.cpp, tests/tools/test_train_cli.cpp
#pragma once
#include "parallel/nd/parallelize.h"
#include "parallel/train/run_report.h"
#include "parallel/train/train_plan.h"
#include "parallel/train/trainer.h"
