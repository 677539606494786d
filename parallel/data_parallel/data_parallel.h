// data_parallel.h — the data-parallel chapter: every rank holds the whole model and trains on its
// share of the batch. Two designs, and how the Trainer runs each.
//
//   the global batch of B rows                       rank r of N takes rows [r·B/N, (r+1)·B/N)
//   ┌──────────┬──────────┬──────────┬──────────┐    (data_parallel_rows, parallel/runner)
//   │ rank 0   │ rank 1   │ rank 2   │ rank 3   │     each computes the mean loss of its rows and its
//   └──────────┴──────────┴──────────┴──────────┘     gradient; the average over ranks is the serial
//                                                     gradient of the global mean loss (equal rows)
//
//   NaiveDataParallel (naive_data_parallel.h)       PyTorch's DataParallel, as classically described:
//     rank 0 does the bookkeeping and five exchanges move data every step:
//       1 scatter the batch   2 replicate the model   3 gather the outputs   4 scatter the loss
//       gradient   5 gather the gradients (rank 0 sums them and alone runs the optimizer)
//     rank 0 sends or receives (N-1)/N of the batch and logits and (N-1)·4Ψ of gradients: it is the
//     bottleneck, and every other rank waits for it.
//
//   DistributedDataParallel (ddp.h)                 PyTorch's DDP:
//     parameters are broadcast once at construction; every step a single exchange, the gradient
//     all-reduce (average), cut into buckets launched from backward so they overlap it:
//       2(N-1)/N · 4Ψ bytes sent per rank per step, the same on every rank.
//
//   Memory per rank (f32, AdamW): the whole model's 16Ψ (weights 4Ψ, gradients 4Ψ, AdamW 8Ψ) on
//   every rank under DDP; naive DP holds the optimizer's 8Ψ on rank 0 only.
//
// Read in this order:
//   naive_data_parallel.h   the five exchanges, each on its own group (its own ledger)
//   ddp.h                   buckets, gradient hooks, no_sync, the overlap timeline
//   comm_hook.h             communication hooks: a bucket's average by your own code (two-level all-reduce)
//   data_parallel_strategies.h   both as the Trainer's DataParallelStrategy
//   (flat buffers: parallel/comm/flatten.h; the row split: parallel/runner/micro_batches.h)
//
//   Lesson: lessons/06_data_parallel.cpp   Tests: tests/parallel/data_parallel/test_data_parallel.cpp
#pragma once
#include "parallel/comm/flatten.h"
#include "parallel/data_parallel/comm_hook.h"
#include "parallel/data_parallel/data_parallel_strategies.h"
#include "parallel/data_parallel/ddp.h"
#include "parallel/data_parallel/naive_data_parallel.h"
#include "parallel/runner/micro_batches.h"
