// engine.h — one engine runs every schedule: it walks this rank's action list (schedule.h) and
// does what each action says, over the pp group's point-to-point ops.
//
//   F(m, c)   x = chunk c's part.forward_part(input)   input: the ids (chunk 0) or the received
//             activation [B, T, C] as a leaf that requires grad; the last chunk adds the loss:
//             loss_m = cross_entropy(logits [B, T, V], targets [B, T]) · weight_m
//             (a ChunkParallelizer, stage.h, may run the chunk and its loss otherwise: parallel/nd cuts
//             them over tp and cp, and the activations become [B, T/cp(/tp under SP), C])
//   B(m, c)   output.backward(received gradient [B, T, C])  (the last chunk: loss_m.backward());
//             the input leaf's .grad is what goes to the previous chunk
//             zero-bubble: the same backward under a DeferGradsGuard over the stage's parameters
//             (autograd/deferred_grad.h): only input gradients now; the weights' work is queued
//   W(m, c)   zero-bubble: runs that queue; the parameters' .grad (and DDP's/ZeRO's hooks) fill here
//   send/recv consecutive ones are posted together with batch_isend_irecv, then waited on
//
//   weight_m = counted_m · dp / C: each micro-batch's mean loss weighted by its share of the global
//   batch's counted targets (C), times dp to undo the data-parallel average, so the summed gradient
//   is the serial one — not m times too large (picotron's bug: it backpropagates every mean loss
//   with weight 1).
//
//   Memory: a micro-batch's input and graph are held from its F to its B, then dropped: the number
//   held at once is the schedule's in-flight count (GPipe m, 1F1B min(p-r, m)). Zero-bubble keeps,
//   from B to W, what the weight gradients need (the linears' inputs and output gradients). Its output
//   [B, T, C] is freed as soon as it has been sent (the next stage holds its own copy; backward
//   starts from the output's node, not its bytes), as Megatron's deallocate_output_tensor does.
//
//   The engine records its own timeline (timeline.h): each F/B and each send/recv batch, with the
//   step's start as 0; the gaps are idle.
#pragma once
#include <functional>
#include <vector>

#include "nn/data.h"
#include "parallel/comm/process_group.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage.h"
#include "parallel/pipeline/timeline.h"
#include "parallel/runner/micro_batches.h"

namespace sl::parallel {

struct EngineOptions {
  // Lessons and benchmarks only: sleep this long per layer and per micro-batch row in each F (twice
  // in each B; once in a split B and once in its W) on top of the real compute: a fixed cost per layer, so a schedule's shape shows even
  // when the ranks share fewer cores than there are ranks (bench/pipeline.cpp).
  double sleep_per_layer_row_seconds = 0;
  // Free each sent output's bytes at once (the default). Off: they live until the micro-batch's B
  // (for the test that measures what freeing saves).
  bool free_sent_outputs = true;
};

struct StepResult {
  double loss_share = 0;            // Σ loss_m · counted_m / C over the micro-batches whose loss is here
  std::vector<TimelineEvent> events;  // this rank's timeline of the step
  int peak_in_flight = 0;            // the most micro-batch chunks held between their F and B
};

// Runs this rank's list of `schedule` on `stage`. micros: every micro-batch (the same on every
// rank); weights[m]: the factor loss_m is multiplied by before its backward; loss_factor[m]: its
// weight in the returned loss share. before_backward(last) runs before each action that fills the
// parameters' gradients: each B, or each W when the schedule splits the backward (may be empty).
// cut: how each chunk runs and its loss (null: the plain ChunkParallelizer, parallel/runner/chunk_parallelizer.h).
StepResult run_schedule(const Schedule& schedule, Stage& stage, ProcessGroup& pp,
                        const std::vector<nn::TokenStream::MicroBatch>& micros, const std::vector<double>& weights,
                        const std::vector<double>& loss_factor, const std::function<void(bool last)>& before_backward,
                        const EngineOptions& options = {}, const ChunkParallelizer* cut = nullptr);

}  // namespace sl::parallel
