// debug_probe.h — a rank's window into its part of the model while it trains: the output of every
// named module of the GPT, captured through forward hooks, and faults planted by module or parameter
// name on the ranks at chosen mesh coordinates, so that a test (or a lesson) can break one rank of a
// layout without editing its code: at the modules' hooks, at the places inside the chapters that
// fault_sites.h names, or in a mesh group's reductions. build/bin/diverge (parallel/train/divergence.h)
// reads the captures; its tests and --inject plant the faults.
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
//                    rank's contribution to those sums; target "*": every parameter. Needs the gradient
//                    in .grad (DDP, ZeRO-1, a cut at dp 1); ZeRO-2's and FSDP's live in shards: applying
//                    it there throws (scale_contribution acts before their reduce)
//   scale_contribution  ZeRO-2 and FSDP (HSDP): this rank's contribution to the parameter's gradient ×
//                    factor, just before the reduce-scatter over dp_shard (× cp under FSDP) that makes the
//                    shards (fault_sites.h); factor 0 drops it; "*": every parameter
//   add_bias         the row-parallel c_proj of module h.N.attn or h.N.mlp adds its bias plus `offset` to
//                    its partial product before the sum over tp, which adds the bias once more: on every
//                    tp rank but one, the offset (tp-1)·b of lesson 11's --break-bias (the biases start
//                    at 0: `offset` shows it from the first step)
//   zigzag_unswapped the ring attention of module h.N.attn masks as if cp rank r held chunks r and cp+r
//                    (zigzag forgetting its swap; lesson 13's --break-zigzag); its data keeps its positions
//   ulysses_arrival_order  Ulysses' sequence -> heads all-to-all in module h.N.attn stacks the received rows
//                    rank by rank, not at their tokens' positions (lesson 13's --break-ulysses-order)
//   ring_chunk_index every all-reduce over the mesh dimension `target` ("dp") sums what lesson 5's ring
//                    sums when it adds each received chunk into the chunk it just sent (--break-chunk-index):
//                    chunk c of the result (the tensor cut as the ring cuts it) holds rank c-1's values
//                    alone. Planted as each rank r's input keeping only its chunk r+1 (the group's
//                    reduction fault, process_group.h); every rank of the group runs it (no DIM=K)
//   local_capacity   the expert-parallel layer h.N.mlp caps each batch rank's tokens on their own, with the
//                    capacity of its N_l tokens (lesson 17's --break-local-capacity); every rank of the MoE
//                    batch must plant it to make the lesson's plan (DIM=K picks no ranks: every rank's plan
//                    is the same, and one rank alone would send rows the others do not expect)
//   detached_weights the expert-parallel layer h.N.mlp's combine multiplies by the router's weights
//                    detached (lesson 17's --break-detached-weights): the router's gradient loses its part
//                    through the outputs, the auxiliary losses' alone is left
//
// From the command line (build/bin/diverge --inject), one fault in words:
//   scale-grad PARAM [DIM=K ...] [step=N] xF        scale_gradient  ("scale-grad h.0.attn.c_attn.weight tp=1 step=1 x2";
//                                                                    PARAM "*": every parameter)
//   scale-output MODULE [DIM=K ...] [step=N] xF     scale_output    ("scale-output h.1.attn cp=1 step=0 x1.5")
//   reuse-output MODULE [DIM=K ...] [step=N] call=A from=B           ("reuse-output h.1 pp=1 step=1 call=1 from=0")
//   scale-contribution PARAM [DIM=K ...] [step=N] xF                 ("scale-contribution h.0.mlp.c_fc.weight cp=1 x0")
//   add-bias MODULE [DIM=K ...] [step=N] [+V]       add_bias        ("add-bias h.0.mlp tp=1 +0.5")
//   zigzag-unswapped MODULE [DIM=K ...] [step=N]    zigzag_unswapped         ("zigzag-unswapped h.1.attn cp=1")
//   ulysses-order MODULE [DIM=K ...] [step=N]       ulysses_arrival_order    ("ulysses-order h.0.attn cp=1 step=0")
//   ring-chunk-index DIM [step=N]                   ring_chunk_index         ("ring-chunk-index dp step=0")
//   local-capacity MODULE [step=N]                  local_capacity           ("local-capacity h.0.mlp step=0")
//   detached-weights MODULE [DIM=K ...] [step=N]    detached_weights         ("detached-weights h.1.mlp ep=1")
// DIM is a mesh dimension's name (pp, dp_replicate, dp_shard, cp, tp, dp, ...); without step= every step.
//
// Thread safety: a probe belongs to one rank thread, which alone runs its modules' hooks and asks its
// fault sites (a thread-local pointer: fault_sites.h); nothing is shared between ranks. A
// ring_chunk_index fault also runs on its group's worker thread (an async all-reduce's): it reads only
// the faults, the mesh and the step (atomic), and marks fired() (atomic). Detach by destroying the
// modules or the probe's hooks (remove()); a probe must outlive the modules' and groups' use of them.
//
//   Tests: tests/parallel/train/test_divergence.cpp, test_divergence_faults.cpp, test_divergence_experts.cpp
#pragma once
#include <atomic>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nn/gpt.h"
#include "nn/module.h"
#include "parallel/comm/mesh.h"
#include "parallel/runner/fault_sites.h"

namespace sl::parallel {

struct ProbeFault {
  enum class Kind {
    scale_output, reuse_output, scale_gradient, scale_contribution, add_bias, zigzag_unswapped,
    ulysses_arrival_order, ring_chunk_index, local_capacity, detached_weights
  };
  Kind kind = Kind::scale_output;
  // A module ("h.0.attn"), a parameter ("h.0.attn.c_attn.weight": scale_gradient, scale_contribution)
  // or a mesh dimension ("dp": ring_chunk_index).
  std::string target;
  double factor = 1;                            // scale_*
  double offset = 0;                            // add_bias: added with the bias
  int step = -1;                                // the step it acts on; -1: every step
  std::vector<std::pair<MeshDim, int>> on;      // mesh coordinates a rank must have; empty: every rank
  int from_call = 0, at_call = 1;               // reuse_output
  std::string str() const;                      // "scale_gradient h.0.attn.c_attn.weight x2 on tp 1 at step 1"
  bool names_parameter() const { return kind == Kind::scale_gradient || kind == Kind::scale_contribution; }
  bool names_group() const { return kind == Kind::ring_chunk_index; }
  bool acts_at_site() const;  // planted inside a chapter, at fault_sites.h's places
};

// One fault from its words (above). Throws sl::Error naming the word it could not read and what it expected.
ProbeFault parse_probe_fault(const std::string& text);

class DebugProbe : public FaultSites {
 public:
  explicit DebugProbe(std::vector<ProbeFault> faults = {}, bool capture = true);
  ~DebugProbe();
  DebugProbe(const DebugProbe&) = delete;
  DebugProbe& operator=(const DebugProbe&) = delete;

  // Hooks every named module of `root` (a GPT part; serial names). `mesh` null: this rank is every
  // fault's rank (the serial model). Faults at fault_sites.h's places make this probe the calling
  // thread's sites (until remove()); ring_chunk_index sets the reduction fault of the mesh's group.
  void attach(nn::Module& root, const DeviceMesh* mesh = nullptr);
  // A part that holds the head: its output (the logits) recorded as "lm_head". A pipeline's stage
  // module holds its chunks' modules but not the chunks: the runner's parts are attached this way.
  void attach_head(nn::GPT& part);
  void remove();  // the hooks off the modules (and groups) again; no longer the thread's sites

  void begin_step(int step);
  int step() const { return step_; }
  // Captured outputs of this step by module name, one per call (micro-batch), detached copies.
  const std::map<std::string, std::vector<Tensor>>& outputs() const { return outputs_; }
  // scale_gradient faults of this step, on `module`'s .grad (the Trainer's after-backward point).
  void apply_gradient_faults(nn::Module& module) const;
  // Whether any fault acted on this rank so far (a test checks its plant took).
  bool fired() const { return fired_; }

  // fault_sites.h, for the chapters (debug_probe_sites.cpp).
  void before_gradient_reduce(const Tensor& parameter) const override;
  Tensor before_partial_sum(const Tensor& partial, const Tensor& bias) const override;
  bool breaks(Mistake mistake) const override;

 private:
  bool mine(const ProbeFault& fault) const;  // this rank, this step
  Tensor after_forward(const std::string& name, nn::Module& module, const Tensor& output);
  void plant_in_groups();  // ring_chunk_index: the reduction fault on its groups

  std::vector<ProbeFault> faults_;
  bool capture_;
  const DeviceMesh* mesh_ = nullptr;
  std::atomic<int> step_{0};            // read by a group's worker thread too (ring_chunk_index)
  mutable std::atomic<bool> fired_{false};
  std::string running_;                  // h.N.attn or h.N.mlp while its forward runs (the sites' module)
  std::map<const TensorImpl*, std::string> parameter_names_;  // scale_contribution's targets
  std::vector<ProcessGroupPtr> faulty_groups_;                 // ring_chunk_index's
  std::map<std::string, std::vector<Tensor>> outputs_;
  std::map<std::string, std::vector<Tensor>> live_;  // reuse_output: the values of call from_call
  std::map<std::string, int> calls_;
  std::map<const nn::Module*, bool> inside_block_;   // a block's hooked call is running
  std::vector<std::pair<nn::Module*, int>> hooks_;
};

}  // namespace sl::parallel
