// formulas.h — the papers' closed forms, as they print them, so tests can hold the planner to the
// published numbers and the planner can say where shardlab's own model differs.
//
//   Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
//   Megatron-LM"), l layers, h hidden, V vocabulary, s sequence, B global batch in sequences:
//     parameters   P = 12lh² (1 + 13/(12h) + (V + s)/(12lh))
//     FLOPs/step   F = 96Bslh² (1 + s/(6h) + V/(16lh))      with activation recomputation: 4 passes
//                  (forward, its rerun, backward = 2 forwards); without it 3 passes: 72Bslh²(...),
//                  the logit layer's 6BshV (never recomputed) unchanged
//     time         8TP / (nX) for T tokens on n GPUs achieving X FLOP/s each (6TP / (nX) without
//                  recomputation). GPT-3: T = 300e9, P = 175e9, n = 1024, X = 140e12 -> 34 days.
//
//   Rajbhandari et al. 2020 (ZeRO), mixed-precision Adam (K = 12 bytes of optimizer state per
//   parameter), Ψ parameters over N_d data-parallel ranks, bytes per rank (Table 1):
//     stage 0 (DP)    (2 + 2 + K)Ψ            stage 2 (P_os+g)    2Ψ + (2 + K)Ψ/N_d
//     stage 1 (P_os)  (2 + 2)Ψ + KΨ/N_d       stage 3 (P_os+g+p)  (2 + 2 + K)Ψ/N_d
//
//   Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"),
//   Table 2: activation bytes of one transformer layer, s sequence, b micro-batch, h hidden,
//   a heads, t tensor-parallel size (16-bit activations, 1-byte dropout masks, attention scores
//   kept: no FlashAttention):
//     no parallelism                    sbh (34 + 5as/h)
//     tensor parallel                   sbh (10 + 24/t + 5as/(ht))
//     tensor + sequence parallel        sbh (34/t + 5as/(ht))
//     tensor parallel + selective       sbh (10 + 24/t)
//     tensor + sequence + selective     sbh (34/t)
//     full recompute                    2sbh (the layer's input only)
//   shardlab's GPT differs by design: dropout is 0 (no masks, the 2 + 2 + 1 bytes of the three
//   dropouts gone), and attention is FlashAttention's (the 5as/h of scores, softmax and its dropout
//   is never stored; each head keeps its log-sum-exp instead). estimate_memory (cost_model.h) models
//   shardlab's own activations; these functions are the paper's.
//
//   Pipeline bubbles, as bubble time over the ideal (bubble-free) time, p stages, m micro-batches:
//     GPipe, 1F1B       (p - 1) / m                               (Narayanan et al. 2021, §2.2)
//     interleaved       (p - 1) / (v·m), v model chunks per stage
//     ZB-H1             (p - 1)(T_F + T_B - T_W) / (m (T_F + T_B + T_W)) = (p - 1) / (3m) for
//                       T_F = T_B = T_W (Qi et al. 2023: B the input gradient, W the weight gradient)
//     naive             p - 1 (one micro-batch in flight: every stage waits for the others)
//   simulated_bubble runs the actual action lists (schedule.h) through the rendezvous simulator
//   (simulate.h) with F = 1, B = 2 (B = W = 1 when split) and reads the same ratio off the timeline.
#pragma once
#include <cstdint>

#include "nn/gpt.h"
#include "parallel/pipeline/schedule.h"

namespace sl::parallel::planner {

// Narayanan et al. 2021.
double narayanan_parameters(double layers, double hidden, double vocab, double seq);
double narayanan_flops(double batch, double seq, double layers, double hidden, double vocab, bool recompute = true);
// Seconds to train on `tokens` tokens: 8TP/(nX) with recomputation, 6TP/(nX) without.
double narayanan_training_seconds(double tokens, double parameters, double gpus, double flops_per_gpu,
                                  bool recompute = true);

// ZeRO Table 1: model-state bytes per rank, Ψ parameters, N_d ranks, stage 0..3, K = 12.
double zero_model_state_bytes(double parameters, double dp, int stage, double optimizer_bytes_per_param = 12);

// Korthikanti et al. 2022 Table 2: activation bytes of one layer. recompute: "none", "selective",
// "full" as nn::Recompute; tp = 1 and sequence_parallel false is "no parallelism".
double korthikanti_activation_bytes(double seq, double micro_batch, double hidden, double heads, double tp,
                                    bool sequence_parallel, nn::Recompute recompute);

// Bubble time over ideal time from the formulas above (naive: p - 1). Throws naming the values when
// p, m or v is < 1.
double bubble_over_ideal(ScheduleKind kind, int stages, int micro_batches, int virtual_stages = 1);
// The same ratio from the schedule's action lists on the rendezvous simulator: (span - ideal) /
// ideal, where ideal is one rank's compute. Throws (schedule.h's check) when the combination
// cannot run.
double simulated_bubble(ScheduleKind kind, int stages, int micro_batches, int virtual_stages = 1);
// Cheap enough to simulate in a search (p·v·m actions up to a few thousand)?
bool cheap_to_simulate(int stages, int micro_batches, int virtual_stages);

}  // namespace sl::parallel::planner
