// pipeline.h — the pipeline chapter: cut the model by LAYERS. Each of p ranks holds a consecutive
// range of layers (a stage); micro-batches flow forward stage to stage as activations and back as
// gradients, and a schedule decides who runs what when.
//
//   stage 0: wte, wpe, h.0 h.1 ──act [B, T, C]──▶ stage 1: h.2 h.3, ln_f, head (tied wte), loss
//                              ◀──grad [B, T, C]──
//
//   p = 4, m = 4 micro-batches, 1F1B (F = 0..3, B = a..d), time →
//     rank 0  0123   a b c d
//     rank 1   012 a3b c d
//     rank 2    01a2b3c d
//     rank 3     0a1b2c3d          bubble (idle share) (p-1)/(m+p-1); interleaving v chunks per
//                                  rank: (p-1)/(v·m+p-1); zero-bubble's split backward: ≈ a third
//
//   Bytes per step per stage boundary: 2·m messages of [B/m, T, C] (an activation forward, its
//   gradient back), 4·B·T·C bytes each way in all; plus the tied wte's gradient summed between the
//   first and last stage (V·C). Memory per rank: its layers' 16 bytes per parameter (f32 AdamW),
//   and the activations of the micro-batches in flight (GPipe: m; 1F1B: at most p - r on rank r).
//
// Read in this order:
//   stage.h             which layers each stage (and virtual chunk) holds (parallel/nd/parallelize.cpp
//                       builds the chunks, cut further over tp and cp)
//   schedule.h          schedules as data: naive, GPipe, 1F1B, interleaved, zero-bubble
//   simulate.h          a schedule checked and simulated before it runs (deadlocks found on the page)
//   engine.h            one engine runs every schedule over point-to-point messages
//   timeline.h          what each rank did when: the bubble measured, an SVG/ASCII chart
//   pipeline_runner.h   the stage in the one training step (parallel/runner), the tied wte; each chunk
//                       run by a ChunkParallelizer (parallel/runner/chunk_parallelizer.h)
//
//   Lessons: lessons/08_naive_model_parallel.cpp, lessons/09_pipeline_schedules.cpp,
//            lessons/10_zero_bubble.cpp
//   Tests: tests/parallel/pipeline/test_pipeline_schedule.cpp, tests/parallel/pipeline/test_pipeline.cpp
#pragma once
#include "parallel/pipeline/engine.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/simulate.h"
#include "parallel/pipeline/stage.h"
#include "parallel/pipeline/timeline.h"
