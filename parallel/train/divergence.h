// divergence.h — "where did my layout leave the serial run?": build/bin/diverge's library. It builds
// the layout train's options describe through parallelize (the one composition path) and, beside it,
// an independent serial nn::GPT + nn::AdamW (serial_reference.h) from the same weights and batches,
// runs N steps of both and, at every step, compares:
//
//   forward    every named module's output on every rank (debug_probe.h: wte, wpe, h.N.attn, h.N.mlp,
//              h.N, ln_f, lm_head), placed in the serial batch by the layout's cut (rows of its dp rank
//              and micro-batch, tokens of its cp shard and SP slice, the head's vocabulary rows), and
//              the step's loss
//   backward   every parameter's gradient before the update, as the strategy holds it (.grad, ZeRO's and
//              FSDP's shards: local_gradients), placed by the parameter's boxes (the placements and the
//              serial shapes: checkpointing.h parameter_places)
//   step       the weights after the update, as the checkpoint's state pieces place them
//
// each element against a bound from its dtype and the roundings on its path (divergence_compare.h,
// printed with its derivation). Each step starts from the layout's state: before every step after
// the first the serial run is set to the layout's weights and optimizer state, gathered from the
// ranks' state pieces (divergence_sync.h), so each step is compared on its own roundings. The
// layout's own gathers (full_state_dict, full_gradients) are never used: what a gather would hide, a
// wrong shard, a replica that drifted, is what is compared.
//
// It lives in train/ because it drives the Trainer and reads the checkpoint's placement of pieces,
// both of this layer; the module-level probe it reads is the runner's (parallel/runner/debug_probe.h).
//
//   Tests: tests/parallel/train/test_divergence.cpp, test_divergence_faults.cpp, test_divergence_experts.cpp
//   Program: tools/diverge.cpp
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/runner/debug_probe.h"
#include "parallel/train/divergence_compare.h"
#include "parallel/train/train_run.h"

namespace sl::parallel {

struct DivergenceReport {
  std::vector<Comparison> rows;         // every comparison, first divergence first (see first())
  std::vector<std::string> derivation;  // the bounds, and how they were derived
  std::vector<std::string> uncompared;  // what could not be compared on a rank, and why
  std::vector<std::string> faults;      // faults planted, and whether each acted on some rank
  // The first divergence: the earliest step; in it forward before backward before step; in forward
  // the module nearest the input, in backward the parameter nearest the loss. Null when none.
  const Comparison* first() const;
  std::vector<const Comparison*> at_same_place(const Comparison& row) const;  // every rank's row there
};

// Throws sl::Error naming why, for a layout the finder cannot compare.
void check_comparable(const TrainOptions& o);

// Runs run.o.steps steps of the layout and of the serial reference and compares them. `faults` are
// planted in the layout's ranks (tests, lessons). run: prepare_run()'s, first_step 0.
DivergenceReport find_divergence(const TrainRun& run, const std::vector<ProbeFault>& faults = {});

std::string first_divergence_text(const DivergenceReport& report);  // what build/bin/diverge prints
nlohmann::json divergence_json(const DivergenceReport& report);     // the whole table

}  // namespace sl::parallel
