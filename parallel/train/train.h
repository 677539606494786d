// train.h — the training chapter: one step for every layout. It is the one folder that knows every
// technique: a TrainPlan (train_plan.h) names a layout, the factory (factory.h) builds this rank's
// ModelRunner and DataParallelStrategy from it, and the Trainer (trainer.h) runs the step.
//
//   TrainPlan ──factory──▶ ModelRunner (runner/, built by a chapter) + DataParallelStrategy
//                  │
//                  ▼
//   Trainer::train_step: split the batch, count targets, zero_grad, forward_backward,
//   synchronize, finish_gradients, clip, step; the global loss, the same on every rank
//
// Read in this order:
//   train_plan.h     the layout, typed, and its rules
//   factory.h        plan -> runner + strategy (a new technique: one line here)
//   trainer.h        the step, the gradients kept for tests, the ledgers
//   run_report.h     what each rank held, sent and waited for (train --report-json)
//
//   Program: tools/train.cpp   Tests: tests/parallel/train/test_trainer.cpp, tests/tools/test_train_cli.cpp
#pragma once
#include "parallel/train/factory.h"
#include "parallel/train/run_report.h"
#include "parallel/train/train_plan.h"
#include "parallel/train/trainer.h"
