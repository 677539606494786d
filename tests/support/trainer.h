// tests/support/trainer.h — what the parity suites share above the communication layer: the small
// GPT, the AdamW settings and the token stream every data-parallel parity suite trains on (one serial
// reference for all), and a Trainer for any plan.
//
//   parity_config(), parity_adamw(), parity_tokens()
//   make_plan_trainer(ctx, plan, config, seed, adamw)
// The serial loop they are compared with: tests/support/serial_run.h; the comparison: compare.h.
#pragma once
#include <memory>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/nd/parallelize.h"
#include "parallel/train/trainer.h"
#include "tests/support/parallel.h"

namespace sl::parallel {

// A GPT small enough that a parity test runs in milliseconds (about 25k parameters).
inline nn::GPTConfig parity_config() {
  return {.vocab_size = 32, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 16};
}

// lr 1e-2 and weight decay 0.1, so decay on a bias, or forgotten on a shard, shows within 5 steps.
// eps 1e-6: the attention key bias has a gradient that is zero in exact arithmetic and ~1e-11 of
// summation noise in floats; Adam turns it into steps of lr·noise/eps, harmless at 1e-6 whatever
// the summation order, but not at 1e-8.
inline nn::AdamWOptions parity_adamw() { return {.lr = 1e-2, .eps = 1e-6, .weight_decay = 0.1}; }

// A fixed, patterned token stream over parity_config()'s vocabulary (600 tokens by default).
inline nn::TokenStream parity_tokens(int count = 600) {
  nn::TokenStream s;
  s.vocab_size = 32;
  for (int i = 0; i < count; ++i) s.tokens.push_back((i * 7 + i / 5 + (i * i) % 11) % 32);
  return s;
}

// A Trainer for any plan: what parallelize (parallel/nd/parallelize.h) builds from `seed`, after the
// plan's checks (which throw before any communication).
inline std::unique_ptr<Trainer> make_plan_trainer(RankContext& ctx, const TrainPlan& plan, const nn::GPTConfig& config,
                                                  uint64_t seed, const nn::AdamWOptions& adamw) {
  plan.validate(ctx.world_size);
  return std::make_unique<Trainer>(ctx, plan, parallelize(config, seed, ctx.world, plan.parallelize_options(adamw)));
}

}  // namespace sl::parallel
