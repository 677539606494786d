// debug_probe.h — a rank's window into its part of the model while it trains: the output of every
// named module of the GPT, captured through forward hooks, and faults planted by module or parameter
// name on the ranks at chosen mesh coordinates, so that a test (or a lesson) can break one rank of a
// layout without editing its code. build/bin/diverge (parallel/train/divergence.h) reads the captures;
// its tests plant the faults.
//
//   DebugProbe probe(faults);                    one per rank: it holds that rank's hooks and captures
//   probe.attach(trainer.runner()->module(), &mesh);    hooks on wte, wpe, h.N, h.N.attn, h.N.mlp, ln_f, the part
//   probe.begin_step(s);                         captures cleared; faults for step s armed
//   trainer.train_step(...)                      each hooked module records its output per call
//   probe.outputs().at("h.1.attn")[m]            micro-batch m's output on this rank ([B_m, T_l, C])
//
//   captured name   module                      output on a rank of the layout
//   wte, wpe        the embeddings              [B, T_l, C] / [T_l, C]   (wte: not called under tp, whose
//                                                                        vocab-parallel lookup reads the weight)
//   h.N.attn        attention after c_proj      [B, T_l, C]   (tp: after the all-reduce; SP: T_l / tp rows)
//   h.N.mlp         the MLP                      [B, T_l, C]
//   h.N             the block                    [B, T_l, C]
//   ln_f            the final LayerNorm          [B, T_l, C]
//   lm_head         the part holding the head    [B, T_l, V]  (tp: this rank's vocabulary rows Vp / tp)
//   T_l: the rank's tokens (a cp shard, in its local order: zigzag's two chunks, a hybrid's pieces).
//
// A module's k-th call in a step is micro-batch k: every schedule runs a chunk's forwards in
// micro-batch order. A block rerun by full recomputation in backward does not call its own hooks, and
// the attention and MLP calls inside that rerun are not recorded (they happen outside the block's
// hooked call), so each micro-batch is recorded once.
//
// Faults (each on the ranks whose mesh coordinates match `on`; every rank when `on` is empty):
//   scale_output     module's output × factor (its backward too: the chain rule sees the scaled output)
//   reuse_output     at call `at_call` the module returns the values of its output of call `from_call`
//                    (the same step), its backward still going into this call's graph: a stage handed
//                    another micro-batch's activation
//   scale_gradient   the parameter's .grad × factor after the backward passes, before the chapter's own
//                    sums (tp, cp, the tied wte between stages) and the optimizer; factor 0 drops this
//                    rank's contribution to those sums; target "*": every parameter. Needs the gradient in .grad (DDP, ZeRO-1, a cut
//                    at dp 1); ZeRO-2's and FSDP's live in shards: applying it there throws.
//
// From the command line (build/bin/diverge --inject), one fault in words:
//   scale-grad PARAM [DIM=K ...] [step=N] xF        scale_gradient  ("scale-grad h.0.attn.c_attn.weight tp=1 step=1 x2";
//                                                                    PARAM "*": every parameter)
//   scale-output MODULE [DIM=K ...] [step=N] xF     scale_output    ("scale-output h.1.attn cp=1 step=0 x1.5")
//   reuse-output MODULE [DIM=K ...] [step=N] call=A from=B           ("reuse-output h.1 pp=1 step=1 call=1 from=0")
// DIM is a mesh dimension's name (pp, dp_replicate, dp_shard, cp, tp, dp, ...); without step= every step.
//
// Thread safety: a probe belongs to one rank thread, which alone runs its modules' hooks; nothing is
// shared between ranks and nothing is global. Detach by destroying the modules or the probe's hooks
// (remove()); a probe must outlive the modules' use of its hooks.
//
//   Tests: tests/parallel/train/test_divergence.cpp
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nn/gpt.h"
#include "nn/module.h"
#include "parallel/comm/mesh.h"

namespace sl::parallel {

struct ProbeFault {
  enum class Kind { scale_output, reuse_output, scale_gradient };
  Kind kind = Kind::scale_output;
  std::string target;  // a module ("h.0.attn") or, for scale_gradient, a parameter ("h.0.attn.c_attn.weight")
  double factor = 1;
  int step = -1;                                // the step it acts on; -1: every step
  std::vector<std::pair<MeshDim, int>> on;      // mesh coordinates a rank must have; empty: every rank
  int from_call = 0, at_call = 1;               // reuse_output
  std::string str() const;                      // "scale_gradient h.0.attn.c_attn.weight x2 on tp 1 at step 1"
};

// One fault from its words (above). Throws sl::Error naming the word it could not read and what it expected.
ProbeFault parse_probe_fault(const std::string& text);

class DebugProbe {
 public:
  explicit DebugProbe(std::vector<ProbeFault> faults = {}, bool capture = true);
  ~DebugProbe();
  DebugProbe(const DebugProbe&) = delete;
  DebugProbe& operator=(const DebugProbe&) = delete;

  // Hooks every named module of `root` (a GPT part; serial names). `mesh` null: this rank is every
  // fault's rank (the serial model). Throws sl::Error when a fault names a module this rank should
  // break but does not hold and no other module of that name exists on it.
  void attach(nn::Module& root, const DeviceMesh* mesh = nullptr);
  // A part that holds the head: its output (the logits) recorded as "lm_head". A pipeline's stage
  // module holds its chunks' modules but not the chunks: the runner's parts are attached this way.
  void attach_head(nn::GPT& part);
  void remove();  // the hooks off the modules again

  void begin_step(int step);
  int step() const { return step_; }
  // Captured outputs of this step by module name, one per call (micro-batch), detached copies.
  const std::map<std::string, std::vector<Tensor>>& outputs() const { return outputs_; }
  // scale_gradient faults of this step, on `module`'s .grad (the Trainer's after-backward point).
  void apply_gradient_faults(nn::Module& module) const;
  // Whether any fault acted on this rank so far (a test checks its plant took).
  bool fired() const { return fired_; }

 private:
  bool mine(const ProbeFault& fault) const;  // this rank, this step
  Tensor after_forward(const std::string& name, nn::Module& module, const Tensor& output);

  std::vector<ProbeFault> faults_;
  bool capture_;
  const DeviceMesh* mesh_ = nullptr;
  int step_ = 0;
  mutable bool fired_ = false;
  std::map<std::string, std::vector<Tensor>> outputs_;
  std::map<std::string, std::vector<Tensor>> live_;  // reuse_output: the values of call from_call
  std::map<std::string, int> calls_;
  std::map<const nn::Module*, bool> inside_block_;   // a block's hooked call is running
  std::vector<std::pair<nn::Module*, int>> hooks_;
};

}  // namespace sl::parallel
